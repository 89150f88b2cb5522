"""The engine's progress reading (ds4deploy.operate.progress) on real /metrics pages captured from the deployed cpu
stack (vLLM 0.32 CPU build), and the busy/idle/stalled judgement on an injected clock."""

from __future__ import annotations

import pytest

from ds4deploy.operate.progress import READERS, ProgressWatch, Reading, parse_vllm_metrics
from tests.unit.conftest import REPO

BENCH = REPO / "tests" / "unit" / "fixtures" / "bench"
IDLE_PAGE = (BENCH / "vllm-0.32-cpu-metrics-idle.txt").read_text()
AFTER_PAGE = (BENCH / "vllm-0.32-cpu-metrics-after-repeat.txt").read_text()


def test_an_idle_page_reads_as_no_load():
    r = parse_vllm_metrics(IDLE_PAGE)
    assert (r.running, r.waiting, r.load) == (0, 0, 0)
    assert dict(r.fingerprint)["vllm:generation_tokens_total"] == 0


def test_work_done_between_two_pages_changes_the_fingerprint():
    before, after = parse_vllm_metrics(IDLE_PAGE), parse_vllm_metrics(AFTER_PAGE)
    assert before.fingerprint != after.fingerprint
    # Summed over labels: request_success_total has one sample per finish reason (2 requests stopped at length).
    assert dict(after.fingerprint)["vllm:request_success_total"] == 2
    assert dict(after.fingerprint)["vllm:prompt_tokens_total"] == 2060


def test_running_and_waiting_gauges_are_read():
    page = IDLE_PAGE.replace('vllm:num_requests_running{engine="0",model_name="ds4-tiny"} 0.0',
                             'vllm:num_requests_running{engine="0",model_name="ds4-tiny"} 1.0')
    page = page.replace('vllm:num_requests_waiting{engine="0",model_name="ds4-tiny"} 0.0',
                        'vllm:num_requests_waiting{engine="0",model_name="ds4-tiny"} 3.0')
    assert page != IDLE_PAGE
    r = parse_vllm_metrics(page)
    assert (r.running, r.waiting) == (1, 3)


def test_a_page_without_the_scheduler_gauges_is_refused():
    with pytest.raises(ValueError, match="num_requests_running"):
        parse_vllm_metrics("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n")


def _r(running: float, tokens: float) -> Reading:
    return Reading(running, 0, (("vllm:generation_tokens_total", tokens), ("vllm:num_requests_running", running)))


def test_idle_busy_and_stalled_on_a_clock():
    w = ProgressWatch(bound_s=100)
    assert w.judge(_r(0, 0), now=0).state == "idle"
    assert w.judge(_r(1, 0), now=10).state == "busy"  # the gauge moved: progress
    assert w.judge(_r(1, 0), now=109).state == "busy"  # 99 s of nothing: within the bound
    v = w.judge(_r(1, 0), now=110)
    assert v.state == "stalled" and "100 s" in v.detail
    assert w.judge(_r(1, 1), now=111).state == "busy"  # one token more: moving again
    assert w.judge(_r(0, 1), now=500).state == "idle"  # nothing to do is never stuck, however long


def test_no_reading_is_unreadable_and_keeps_the_last():
    w = ProgressWatch(bound_s=100)
    assert w.judge(None, now=0, why="GET /metrics: ConnectError").state == "unreadable"  # nothing known yet
    w.judge(_r(0, 5), now=0)
    assert w.judge(None, now=50).state == "unreadable"  # idle at the last reading: the probe may decide
    assert w.moved_since(_r(1, 6)) and not w.moved_since(_r(0, 5)) and not w.moved_since(None)


def test_a_late_reading_after_recent_work_stays_busy_until_the_bound():
    w = ProgressWatch(bound_s=100)
    w.judge(_r(1, 5), now=0)
    late = w.judge(None, now=50, why="GET /metrics: ReadTimeout")
    assert late.state == "busy" and "ReadTimeout" in late.detail and "50 s ago" in late.detail
    assert w.judge(None, now=100).state == "unreadable"  # the bound passed with nothing read: the probe decides


def test_every_vllm_build_reads_the_same_metrics():
    from ds4deploy.recipe.load import all_recipes

    assert {r.engine.family for r in all_recipes() if r.engine.flavor != "llamacpp"} == {"vllm"}
    assert "llamacpp" not in READERS  # no reader yet: the supervisor falls back to its probe
