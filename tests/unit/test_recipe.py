"""Recipe schema: the committed recipes validate; every kind of bad input gives one clear message."""

from __future__ import annotations

import pytest

from ds4deploy.errors import UserError
from ds4deploy.recipe import all_recipes, load_recipe
from tests.unit.conftest import run_cli, write_variant


def test_every_committed_recipe_validates():
    names = [r.name for r in all_recipes()]
    assert "cpu" in names


def test_cpu_recipe_facts():
    r = load_recipe("cpu")
    assert r.serving.bind_address == "127.0.0.1"
    assert r.model.generator.head_dim == 64
    assert r.engine.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert r.image_ref.startswith("ds4deploy/engine-cpu:")


def test_misspelled_key_names_file_path_value_and_fix(recipe_dir):
    path = write_variant(recipe_dir, "typo", lambda d: d["serving"].update(max_num_seq=4))
    with pytest.raises(UserError) as e:
        load_recipe("typo")
    msg = str(e.value)
    assert str(path) in msg
    assert "serving.max_num_seq = 4" in msg
    assert "Extra inputs are not permitted" in msg
    assert "check the spelling" in msg


def test_wrong_type_is_rejected_not_coerced(recipe_dir):
    write_variant(recipe_dir, "wrongtype", lambda d: d["serving"].update(port="8000"))
    with pytest.raises(UserError) as e:
        load_recipe("wrongtype")
    assert "serving.port = '8000'" in str(e.value)


def test_unknown_name_lists_allowed_values(recipe_dir):
    write_variant(recipe_dir, "badarch", lambda d: d["engine"]["image"].update(arch="sm75"))
    with pytest.raises(UserError) as e:
        load_recipe("badarch")
    assert "engine.image.arch = 'sm75'" in str(e.value)
    assert "'cpu', 'sm70', 'sm86' or 'sm121'" in str(e.value)


def test_exposed_port_without_api_key_is_refused(recipe_dir):
    def edit(d):
        d["serving"]["bind_address"] = "0.0.0.0"
        d["serving"]["auth"] = {"mode": "none"}

    write_variant(recipe_dir, "open", edit)
    with pytest.raises(UserError) as e:
        load_recipe("open")
    assert "serving.auth.mode must be 'api_key'" in str(e.value)


def test_exposed_port_with_api_key_is_allowed(recipe_dir):
    write_variant(recipe_dir, "lan", lambda d: d["serving"].update(bind_address="0.0.0.0"))
    assert load_recipe("lan").serving.auth.mode == "api_key"


def test_unknown_recipe_lists_known_ones(recipe_dir):
    with pytest.raises(UserError) as e:
        load_recipe("nope")
    assert "no recipe named 'nope'" in e.value.cause
    assert "cpu" in e.value.fix


def test_yaml_syntax_error_names_line(recipe_dir):
    (recipe_dir / "broken.yaml").write_text("name: broken\nserving: [\n")
    with pytest.raises(UserError) as e:
        load_recipe("broken")
    assert "not valid YAML at line" in str(e.value)


def test_name_must_match_file(recipe_dir):
    path = write_variant(recipe_dir, "other", lambda d: None)
    path.rename(recipe_dir / "renamed.yaml")
    with pytest.raises(UserError, match="differs from its file name"):
        load_recipe("renamed")


def test_cli_bad_recipe_exits_2_with_cause_and_fix_and_no_traceback(recipe_dir):
    write_variant(recipe_dir, "typo", lambda d: d["model"].update(servd_name="x"))
    p = run_cli("recipe", "validate", "typo", env_dir=recipe_dir)
    assert p.returncode == 2
    assert p.stderr.startswith("error: ")
    assert "model.servd_name" in p.stderr
    assert "\nfix: " in p.stderr
    assert "Traceback" not in p.stderr


def test_variant_applies_its_overrides_and_keeps_the_base_file():
    base, many = load_recipe("gx10x2-ds4-flash-fp8"), load_recipe("gx10x2-ds4-flash-fp8--many-users")
    assert (base.serving.max_num_seqs, many.serving.max_num_seqs) == (6, 12)
    assert many.serving.extra_args["max-cudagraph-capture-size"] == 72
    assert many.base_name == "gx10x2-ds4-flash-fp8"
    assert many.source_path == base.source_path
    assert many.variants == {}
    assert "gx10x2-ds4-flash-fp8--many-users" in [r.name for r in all_recipes()]


def test_unknown_variant_and_bad_override_path_are_named(recipe_dir):
    with pytest.raises(UserError) as e:
        load_recipe("cpu--nope")
    assert "has no variant 'nope'" in e.value.cause
    write_variant(recipe_dir, "vv", lambda d: d.update(variants={"x": {"servng.max_num_seqs": 2}}))
    with pytest.raises(UserError, match="servng is not a section"):
        load_recipe("vv--x")
    write_variant(recipe_dir, "vw", lambda d: d.update(variants={"y": {"serving.max_num_seqs": "two"}}))
    with pytest.raises(UserError, match=r"serving\.max_num_seqs = 'two'"):
        load_recipe("vw--y")
