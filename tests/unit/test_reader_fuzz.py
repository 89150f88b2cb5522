"""Random and hostile YAML/JSON into every reader of user files: each one returns or refuses with `UserError`, never
another exception, and within a time bound (hypothesis' per-example deadline).

Readers: recipes (with extends and variants: `load_recipe`), bench profiles (`load_profile`), inventories and any
other YAML (`load_strict`, what `read_inventory` reads the file with before Ansible does), model manifests
(`load_manifest`), image locks (`load_lock`) and the recipe index (`check_inputs`, through manifests and locks).
Hostile inputs: alias chains (billion laughs), deep nesting in block and flow style, wrong types where mappings are
expected, huge scalars, duplicate and odd keys, random text.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4deploy.bench.profiles import load_profile
from ds4deploy.build.artifacts import load_lock
from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import MAX_BYTES, load_strict
from ds4deploy.model.manifest import load_manifest
from ds4deploy.recipe.load import load_recipe
from tests.unit.conftest import REPO

CASES = Path(__file__).parent / "fixtures" / "bad_input_3"

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20),
                    st.sampled_from(["0x1f", "2026-07-31", "12:30:00", "no", "~", "1e5", "&a", "*a", "<<"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=20)


def alias_bomb(width: int, levels: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nvariants: *a{levels - 1}\n"


hostile = st.one_of(
    st.builds(lambda d: yaml.safe_dump(d), values),
    st.builds(lambda d: json.dumps(d), values),
    st.builds(alias_bomb, st.integers(2, 12), st.integers(2, 12)),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(1, 3000)),
    st.builds(lambda n: "".join(f"{' ' * i}k{i}:\n" for i in range(n)) + " " * n + "v: 1\n", st.integers(1, 300)),
    st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(1, 3000)),
    st.builds(lambda k, v: f"{k}: 1\n{k}: {v}\n", st.sampled_from(["1", "true", "name", "'x'"]),
              st.sampled_from(["2", "false", "[]"])),
    st.builds(lambda key: f"name: x\nvariants:\n  fast: {key}\n", st.sampled_from(["3", "[a]", "'s'", "null",
                                                                                    "{1: 2}", "{a..b: 1}"])),
    st.builds(lambda n: "x: " + "a" * n + "\n", st.sampled_from([10, MAX_BYTES + 1])),
    st.text(max_size=200),
)

# The time bound is a guard against hangs (the alias bomb ran past 60 s before the bounded reader), generous for a
# loaded 2-core CI machine; every reader answers these inputs in milliseconds.
FUZZ = settings(max_examples=30, deadline=timedelta(seconds=10), derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def clean(read) -> None:
    """`read()` returns or raises UserError; anything else fails the test (hypothesis shows the input)."""
    refusal = None
    try:
        read()
    except UserError as exc:
        refusal = exc
    assert refusal is None or (refusal.cause and refusal.fix)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A recipes directory with the i05 recipe (a recipe with an image lock) and cpu (with a manifest)."""
    d = tmp_path / "recipes"
    d.mkdir()
    shutil.copy(CASES / "i05-lock-entry-is-string" / "i05.yaml", d / "i05.yaml")
    shutil.copy(REPO / "recipes" / "cpu.yaml", d / "cpu.yaml")
    from ds4deploy.recipe import paths

    monkeypatch.setattr(paths, "RECIPES_DIR", d)
    return d, load_recipe("i05"), load_recipe("cpu")


@FUZZ
@given(text=hostile)
def test_recipe_reader(scratch, text):
    path = scratch[0] / "fz.yaml"
    path.write_text(text)
    clean(lambda: load_recipe(str(path)))
    path.write_text("extends: cpu\nname: fz\n" + text if not text.startswith(("[", "{")) else text)
    clean(lambda: load_recipe(str(path)))


@FUZZ
@given(text=hostile)
def test_yaml_reader_of_inventories_and_profiles(scratch, text):
    path = scratch[0] / "fz.yml"
    path.write_text(text)
    clean(lambda: load_strict(path))
    profile = scratch[0] / "profile.yaml"
    profile.write_text(text)
    clean(lambda: load_profile(str(profile)))


@FUZZ
@given(text=hostile)
def test_manifest_and_lock_readers(scratch, text):
    d, i05, cpu = scratch
    (d / "cpu.manifest.json").write_text(text)
    clean(lambda: load_manifest(cpu))
    (d / "i05.lock.json").write_text(text)
    clean(lambda: load_lock(i05))
