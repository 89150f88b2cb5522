"""The capacity and speed estimator (ds4deploy/plan/estimate): the KV layout and the engine's accounting against the
published figures they come from, the back-test page regenerated and compared, the held-out reference cells within
the target, the calibration loop on the cpu stack's real bench run, and each bad input refused with one message."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.plan import estimate as est
from ds4deploy.plan.estimate import backtest, calibrate
from ds4deploy.plan.estimate import constants as C
from ds4deploy.plan.estimate import model as M
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from tests.unit.conftest import run_cli
from tests.unit.test_preflight import mutate

GX10, V100, SM86 = "gx10x2-ds4-flash-fp8", "v100x8-ds41-flash-iq2", "rtx3090x2-xeon-ds4-flash"
CPU_RUN = REPO_ROOT / "docs" / "results" / "bench" / "cpu" / "smoke" / "run.json"


def test_backtest_page_is_what_the_constants_give():
    assert (REPO_ROOT / "docs" / "estimator.md").read_text(encoding="utf-8") == backtest.markdown(), \
        "docs/estimator.md is stale: run `make estimate-backtest`"


def test_every_held_out_a_and_b_cell_is_within_the_target_but_the_named_misses():
    table = backtest.rows()
    misses = {r["cell"].key for r in backtest.held_out_misses(table)}
    assert misses == set(backtest.KNOWN_MISSES)
    held = [r for r in table if r["cell"].system in "AB" and r["cell"].check and not r["fitted"]]
    assert len(held) >= 60  # most published cells are predictions, not fits
    # Every fitted cell is a real published cell of its class.
    keys = {r["cell"].key for r in table}
    for cls in ("sm70-v100", "sm121-gb10", "sm86-rtx3090-xeon"):
        assert set(C.HARDWARE[cls]["fitted_on"]) <= keys


def test_dsv4_kv_layout_and_the_engine_accounting_reproduce_the_published_needs():
    card = M.load_card(load_recipe(GX10))
    per_ctx, per_flight, _ = M.dsv4_physical(card, "fp8_ds_mla")
    # 21 ratio-4 layers x (584 + 132) / 4 + 20 ratio-128 layers x 584 / 128 (vLLM's DeepSeek V4 spec).
    assert per_ctx == pytest.approx(21 * 716 / 4 + 20 * 584 / 128)
    fl, fb = M.engine_kv_factors()
    for length, batched, gib in C.ENGINE_KV_ACCOUNTING["vllm-dsv4"]["published"]:
        assert (per_ctx * fl * length + per_flight * fb * batched) / 2**30 == pytest.approx(gib)
    assert 1.0 < fl < 1.3 and fb > 1.0  # the engine accounts more than the physical rows, never less


def test_gx10_holds_one_full_length_session_of_six():
    cap = est.capacity(load_recipe(GX10))
    assert cap.kv.sessions == 1 and cap.kv.need < cap.kv.available
    assert 1_000_000 < cap.kv.pool_tokens < 1_900_000
    # Shorter requests need less, but the engine also reserves max_num_batched_tokens in-flight rows per request.
    short = est.capacity(load_recipe(GX10), context=131072).kv
    assert short.need < cap.kv.need and short.sessions >= cap.kv.sessions
    assert short.need > short.per_flight * 8192


def test_weights_per_gpu_follow_quantisation_and_placement():
    gx = est.capacity(load_recipe(GX10)).weights
    assert gx.experts == pytest.approx(43 * 256 * 3 * 4096 * 2048 * 4.25 / 8)
    assert gx.gpu == pytest.approx((gx.experts + gx.rest - gx.replicated) / 2 + gx.replicated)
    sm86 = est.capacity(load_recipe(SM86)).weights
    assert sm86.experts_gpu == 0 and sm86.host == pytest.approx(sm86.experts)  # lk_moe: experts in host RAM
    assert sm86.gpu < 5 * 2**30
    v100 = est.capacity(load_recipe(V100)).weights
    assert v100.gpu == pytest.approx((v100.total - v100.replicated) / 8 + v100.replicated / 2)


def test_gguf_offload_keeps_the_other_layers_in_host_ram():
    full = est.capacity(mutate(SM86, "engine.capabilities", ["dspark"])).weights
    r = mutate(SM86, "engine.capabilities", ["dspark"])
    part = est.capacity(mutate_extra(r, "n-gpu-layers", 20)).weights
    assert part.gpu == pytest.approx(full.gpu * 20 / 43)
    assert part.host == pytest.approx((full.experts + full.rest) * 23 / 43)


def mutate_extra(r, key, value):
    data = r.model_dump(mode="python")
    data["serving"]["extra_args"][key] = value
    return type(r).model_validate(data)


def test_unified_memory_says_what_the_node_keeps():
    lines = est.capacity_lines(est.capacity(load_recipe(GX10)))
    assert any("unified memory: the GPU's 121.69 GiB is the node's RAM; the engine may take 94.92 GiB" in x
               for x in lines)


def test_v41_official_fp4_experts_do_not_fit_eight_32gb_gpus():
    card = M.load_card(load_recipe(V100))
    e = card.get("num_hidden_layers") * card.get("n_routed_experts") * 3 * card.get("hidden_size") * \
        card.get("moe_intermediate_size") * C.QUANT_BITS["mxfp4"] / 8
    assert 280e9 < e < 300e9 and e > 8 * 32e9


def test_speed_reacts_to_context_sessions_and_acceptance():
    r = load_recipe(GX10)
    one, _ = est.speed(r, 256, 1)
    six, _ = est.speed(r, 256, 6)
    deep, _ = est.speed(r, 524288, 1)
    low, _ = est.speed(r, 256, 1, acceptance=0.5)
    assert six.per_session_tok_s < one.per_session_tok_s < 6 * one.per_session_tok_s < six.aggregate_tok_s * 6
    assert six.aggregate_tok_s > one.aggregate_tok_s
    assert deep.per_session_tok_s < one.per_session_tok_s and deep.ttft_s > 100 * one.ttft_s
    assert low.tokens_per_round < one.tokens_per_round and low.per_session_tok_s < one.per_session_tok_s
    assert M.tokens_per_round(5, 0.85) == pytest.approx(sum(0.85**i for i in range(6)))


def test_calibration_on_the_cpu_stacks_bench_run_gives_the_committed_cpu_constants(recipe_dir):
    # The real captured run of the cpu stack (docs/results/bench/cpu/smoke/), fitted through the CLI and written where
    # the estimator reads an owner's calibration.
    p = run_cli("estimate", "cpu", "--calibrate", str(CPU_RUN), "--write", env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    assert "calibration of hardware class cpu-x86 on 16 measured cells" in p.stdout  # TTFT, aggregate x 8 cells
    assert p.stdout.count(", before ") == 16 and "constants: " in p.stdout
    data = json.loads((recipe_dir / "cpu.calibration.json").read_text())
    assert data["hardware_class"] == "cpu-x86"
    fitted = data["constants"]
    for k, v in C.HARDWARE["cpu-x86"]["fitted"].items():
        assert fitted[k] == pytest.approx(v, rel=0.05, abs=1e-9), k
    # The fit is a minimum: moving a constant away from it makes the summed squared log error grow.
    r = load_recipe("cpu")
    card = M.load_card(r)
    w = M.weights(r, card)
    cells = calibrate.run_cells(CPU_RUN, "cpu")

    def loss(hw):
        return sum(math.log(calibrate.predict(r, card, w, "cpu-x86", hw, c) / c.value) ** 2 for c in cells)

    assert loss(fitted) < loss({**fitted, "t_round_s": fitted["t_round_s"] * 2})
    assert loss(fitted) < loss({**fitted, "tflops": fitted["tflops"] / 2})
    # The next estimate uses the owner's constants.
    p = run_cli("estimate", "cpu", env_dir=recipe_dir)
    assert p.returncode == 0 and "cpu.calibration.json" in p.stdout


def test_estimate_cli_prints_capacity_and_speed_and_refuses_what_cannot_fit(recipe_dir):
    shutil.copy(REPO_ROOT / "recipes" / f"{GX10}.yaml", recipe_dir)
    p = run_cli("estimate", GX10, "--sessions", "6", "--prompt", "32768")
    assert p.returncode == 0, p.stderr
    assert "full-length sessions resident: 1" in p.stdout
    assert "6 session(s), 32,768-token prompts" in p.stdout and "TTFT" in p.stdout
    path = recipe_dir / "cpu.yaml"
    path.write_text(path.read_text().replace('VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "0.05"'))
    p = run_cli("estimate", "cpu", env_dir=recipe_dir)
    assert p.returncode == 1 and "does not fit: one 65,536-token request" in p.stdout
    assert "at least 1" in _cli_error(run_cli("estimate", "cpu", "--sessions", "0"))


# --- bad input: one message naming what is missing, exit 2, no number guessed ---------------------------------


def _cli_error(p) -> str:
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith("error: ") and "\nfix: " in p.stderr
    return p.stderr


def _sm86_copy(recipe_dir: Path) -> Path:
    path = recipe_dir / f"{SM86}.yaml"
    shutil.copy(REPO_ROOT / "recipes" / f"{SM86}.yaml", path)
    return path


def test_unreadable_model_config_is_refused(recipe_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    path = _sm86_copy(recipe_dir)
    path.write_text(path.read_text().replace("/var/lib/ds4deploy/models/DeepSeek-V4-Flash-0731", str(model)))
    err = _cli_error(run_cli("estimate", SM86, env_dir=recipe_dir))
    assert str(model / "config.json") in err and "is not valid JSON" in err
    with pytest.raises(UserError, match="is not valid JSON"):
        est.capacity(load_recipe(path))


def test_missing_model_config_is_refused(recipe_dir):
    path = _sm86_copy(recipe_dir)
    path.write_text(path.read_text().replace("deepseek-ai/DeepSeek-V4-Flash-0731", "someone/Other-Model"))
    err = _cli_error(run_cli("estimate", SM86, env_dir=recipe_dir))
    assert "no model config to read" in err and "someone/Other-Model" in err


def test_unknown_quantisation_is_refused(tmp_path):
    src = M.MODELS_DIR / "model-card-deepseek-ai__DeepSeek-V4-Flash-0731.json"
    card = json.loads(src.read_text())
    card["experts_quant"] = "iq1_m"
    (tmp_path / src.name).write_text(json.dumps(card))
    r = load_recipe(SM86)
    with pytest.raises(UserError, match="unknown quantisation 'iq1_m' for the routed experts"):
        M.weights(r, M.load_card(r, tmp_path))


def test_hardware_class_without_constants_is_refused():
    r = mutate(SM86, "engine.capabilities", ["dspark"])
    with pytest.raises(UserError, match=r"hardware class .sm86 .*. has no constants"):
        est.speed(r, 1024, 1)
    # Capacity needs no hardware constants and is still given.
    assert est.capacity(r).kv.sessions is not None


def test_kv_dtype_without_a_layout_is_refused():
    r = mutate(SM86, "serving.kv_cache_dtype", "int4_ds_mla")
    with pytest.raises(UserError, match="KV cache dtype 'int4_ds_mla' has no DeepSeek V4 layout"):
        est.capacity(r)


def test_calibrating_on_a_file_that_is_no_bench_run_is_refused(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text('{"profile": "smoke"}')
    err = _cli_error(run_cli("estimate", "cpu", "--calibrate", str(bad)))
    assert "is not a bench run" in err
    empty = tmp_path / "empty" / "run.json"
    shutil.copytree(CPU_RUN.parent, empty.parent)
    shutil.rmtree(empty.parent / "cells")
    assert "has no valid cell" in _cli_error(run_cli("estimate", "cpu", "--calibrate", str(empty)))


def test_index_cell_shows_prediction_and_residency():
    assert est.index_cell(load_recipe(GX10)).endswith("; 1 of 6 resident")
    assert est.index_cell(load_recipe("cpu")).endswith("; all 4 resident")
    assert "resident sessions unknown" in est.index_cell(load_recipe(V100))


def test_bench_lines_compare_each_measured_cell():
    run = json.loads(CPU_RUN.read_text())
    records = [json.loads((CPU_RUN.parent / "cells" / f"{c}.json").read_text()) for c in run["cells"]]
    lines = est.bench_lines(load_recipe("cpu"), records, run)
    assert lines[0].startswith("measured vs predicted")
    assert len(lines) == 1 + len(records) and all(" vs " in x for x in lines[1:])
    assert "not available" in est.bench_lines(mutate(SM86, "engine.capabilities", ["dspark"]), records, run)[0]
