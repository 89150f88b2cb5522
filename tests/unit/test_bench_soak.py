"""The soak's arithmetic (ds4deploy.bench.soak): Docker's memory figure, the memory trend and its flat/rising verdict,
the per-window rows, and the refusals before anything is sent. The live run is tests/infra/test_soak.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4deploy.bench.soak import FLAT_RISE_MIB, check_plan, memory_trend, parse_mem_usage, window_rows
from ds4deploy.bench.stream import RequestResult
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.load import load_recipe

FIXTURES = Path(__file__).parent / "fixtures" / "soak"


def test_reads_dockers_own_mem_usage():
    # Captured from `docker stats --no-stream --format '{{json .}}'` (Docker 20.10) on the cpu recipe's engine.
    row = json.loads((FIXTURES / "docker-20.10-stats-engine-starting.json").read_text())
    assert parse_mem_usage(row["MemUsage"]) == pytest.approx(291.3)
    assert parse_mem_usage("2.41GiB / 23.4GiB") == pytest.approx(2.41 * 1024)
    assert parse_mem_usage("512KiB / 1GiB") == pytest.approx(0.5)
    for bad in ("", "--", "12 / 3", "1.2GB / 3GB"):  # decimal units are not what docker stats prints
        with pytest.raises(ValueError, match="not a docker stats MemUsage"):
            parse_mem_usage(bad)


def _series(start_mib: float, per_min: float, minutes: int, every_s: int = 15) -> list[tuple[float, float]]:
    return [(t, start_mib + per_min * t / 60) for t in range(0, minutes * 60 + 1, every_s)]


def test_a_steady_engine_is_flat_and_a_leaking_one_is_not():
    flat = memory_trend(_series(2500, 0.5, 30), after_s=300)  # +12.5 MiB over 25 min: allocator noise
    assert flat["flat"] and flat["slope_mib_per_min"] == pytest.approx(0.5)
    leak = memory_trend(_series(2500, 4.0, 30), after_s=300)  # +100 MiB over 25 min: 4 % of 2.5 GiB
    assert not leak["flat"] and leak["rise_mib"] == pytest.approx(100, rel=0.01)


def test_the_warm_up_window_is_not_part_of_the_trend():
    # 500 MiB allocated in the first 5 minutes (KV cache blocks, caches), flat after: flat.
    samples = [(t, 2000 + min(t, 300) * 500 / 300) for t in range(0, 1801, 15)]
    assert memory_trend(samples, after_s=300)["flat"]
    assert not memory_trend(samples, after_s=0)["flat"]


def test_a_small_engine_gets_the_floor_not_two_percent():
    trend = memory_trend(_series(200, 2.0, 30), after_s=300)  # +50 MiB on 200 MiB: under the 64 MiB floor
    assert trend["limit_mib"] == FLAT_RISE_MIB and trend["flat"]


def test_too_few_samples_give_no_trend():
    assert memory_trend([(400.0, 1.0), (410.0, 1.0)], after_s=300) is None


def _ok(i: int, ttft: float) -> RequestResult:
    return RequestResult(index=i, ok=True, ttft_s=ttft, last_token_s=ttft + 1.0, e2e_s=ttft + 1.0,
                         prompt_tokens=256, completion_tokens=101, finish_reason="length")


def test_requests_fall_into_the_window_they_started_in():
    results = [(10.0, _ok(0, 0.1)), (70.0, _ok(1, 0.2)), (75.0, RequestResult(index=2, error="HTTP 500: boom")),
               (130.0, _ok(3, 0.3))]
    rows = window_rows(results, [(5.0, 100.0), (65.0, 110.0), (125.0, 90.0)], window_s=60, total_s=150)
    assert [(r["requests"], r["failed"]) for r in rows] == [(1, 0), (2, 1), (1, 0)]
    assert rows[1]["p50_ttft_ms"] == pytest.approx(200)
    assert rows[1]["decode_tok_s"] == pytest.approx(100)
    assert (rows[2]["from_s"], rows[2]["to_s"]) == (120, 150)
    assert [(r["mem_min_mib"], r["mem_max_mib"]) for r in rows] == [(100, 100), (110, 110), (90, 90)]


def test_lengths_the_server_cannot_serve_are_refused_before_sending():
    cpu = load_recipe("cpu")
    check_plan(cpu, [256, 1024, 4096], 256)
    with pytest.raises(UserError, match="context"):
        check_plan(cpu, [cpu.serving.max_model_len], 256)
    with pytest.raises(UserError, match="default_max_tokens"):
        check_plan(cpu, [256], cpu.serving.default_max_tokens + 1)
