"""The engine's progress reading (ds4deploy.operate.progress) on real /metrics pages: vLLM's captured from the
deployed cpu stack (vLLM 0.32 CPU build), llama-server's captured on the H200 (the pinned llama.cpp; see
tests/unit/fixtures/bench/README.md for which lines are verbatim), and the busy/idle/stalled judgement on an injected
clock."""

from __future__ import annotations

import json

import pytest

from ds4deploy.operate.progress import (
    READERS,
    ProgressWatch,
    Reading,
    parse_llamacpp_metrics,
    parse_vllm_metrics,
    read_llamacpp,
)
from tests.unit.conftest import REPO

BENCH = REPO / "tests" / "unit" / "fixtures" / "bench"
IDLE_PAGE = (BENCH / "vllm-0.32-cpu-metrics-idle.txt").read_text()
AFTER_PAGE = (BENCH / "vllm-0.32-cpu-metrics-after-repeat.txt").read_text()
# llama-server's page after the H200 run's requests finished: sample lines verbatim from the capture, HELP/TYPE lines
# from the pinned source (fixtures/bench/README.md).
LLAMACPP_PAGE = (BENCH / "llamacpp-0c1e570-h200-metrics.txt").read_text()
H200_CAPTURE = REPO / "docs" / "results" / "llamacpp-h200-2026-12-01" / "llamacpp-h200.json"


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


def test_tokens_served_between_two_idle_readings_are_busy():
    """0 running, 0 waiting at both readings but tokens served in between: busy; only the gauges changing (a
    request finished, no token since) is not work."""
    w = ProgressWatch(bound_s=100)
    assert w.judge(_r(0, 5), now=0).state == "idle"
    v = w.judge(_r(0, 9), now=10)
    assert v.state == "busy" and "moved since the last" in v.detail
    assert w.judge(_r(0, 9), now=20).state == "idle"  # nothing served since
    w.judge(_r(1, 9), now=30)
    assert w.judge(_r(0, 9), now=40).state == "idle"  # the running gauge fell, no token was served
    assert w.judge(_r(0, 12), now=50).state == "busy"
    # No reading after such work: the probe decides (a wedge shows as /metrics not answering on llama-server)
    assert w.judge(None, now=60).state == "unreadable"


def test_a_reading_taken_after_the_probe_is_a_start_to_judge_from():
    """`rebase` on a watch that judged nothing yet (no reading at start, none at the check, then the probe answered
    and a reading came): the next, unchanged reading is judged idle."""
    w = ProgressWatch(bound_s=100)
    assert w.judge(None, now=0).state == "unreadable"
    w.rebase(_r(0, 7), now=5)
    assert w.judge(_r(0, 7), now=15).state == "idle"
    w.rebase(None, now=20)  # no reading: nothing changes
    assert w.judge(_r(0, 8), now=25).state == "busy"


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


def test_every_engine_family_has_a_reader():
    from ds4deploy.recipe.load import all_recipes

    assert {r.engine.family for r in all_recipes() if r.engine.flavor != "llamacpp"} == {"vllm"}
    # Every family a recipe can name reads its own counters: the supervisor never needs its probe to judge work.
    assert {r.engine.family for r in all_recipes()} <= set(READERS)
    assert READERS["llamacpp"] is read_llamacpp


# llama.cpp (llama-server --metrics) -------------------------------------------------------------------------------


def _set(page: str, name: str, old: str, new: str) -> str:
    """`page` with the sample line `llamacpp:<name> <old>` changed to `<new>` (the line must be there)."""
    line = f"llamacpp:{name} {old}\n"
    assert line in page, line
    return page.replace(line, f"llamacpp:{name} {new}\n")


def test_an_idle_llamacpp_page_reads_idle():
    r = parse_llamacpp_metrics(LLAMACPP_PAGE)
    assert (r.running, r.waiting, r.load) == (0, 0, 0)
    fp = dict(r.fingerprint)
    assert (fp["llamacpp:n_decode_total"], fp["llamacpp:prompt_tokens_total"],
            fp["llamacpp:tokens_predicted_total"]) == (551, 3502, 544)
    assert ProgressWatch(bound_s=100).judge(r, now=0).state == "idle"


def test_the_capture_as_stored_without_help_and_type_reads_the_same():
    """The H200 capture kept only the sample lines: they parse to the same reading as the page with HELP/TYPE."""
    lines = json.loads(H200_CAPTURE.read_text())["runs"][0]["metrics"]
    assert parse_llamacpp_metrics("\n".join(lines) + "\n") == parse_llamacpp_metrics(LLAMACPP_PAGE)


def test_a_llamacpp_page_with_requests_processing_reads_busy():
    page = _set(LLAMACPP_PAGE, "requests_processing", "0", "1")
    page = _set(page, "requests_deferred", "0", "2")
    r = parse_llamacpp_metrics(page)
    assert (r.running, r.waiting) == (1, 2)
    assert ProgressWatch(bound_s=100).judge(r, now=0).state == "busy"


def test_moved_llamacpp_counters_are_progress_and_still_ones_are_not():
    """One slot busy on a long prefill: each batch is one llama_decode() call (n_decode_total + 1), while
    prompt_tokens_total waits for the batch with output. The averaged rates change with every scrape (their window
    is reset), so they alone are no progress."""
    busy = _set(LLAMACPP_PAGE, "requests_processing", "0", "1")
    one_batch_later = _set(busy, "n_decode_total", "551", "552")
    rates_only = _set(_set(busy, "prompt_tokens_seconds", "10372.1", "0"), "predicted_tokens_seconds", "1130.56", "0")
    w = ProgressWatch(bound_s=100)
    assert w.judge(parse_llamacpp_metrics(busy), now=0).state == "busy"
    assert w.judge(parse_llamacpp_metrics(rates_only), now=60).state == "busy"  # within the bound
    assert w.judge(parse_llamacpp_metrics(one_batch_later), now=150).state == "busy"  # moved: progress
    assert w.judge(parse_llamacpp_metrics(one_batch_later), now=249).state == "busy"
    stalled = w.judge(parse_llamacpp_metrics(rates_only.replace(" 551\n", " 552\n")), now=250)
    assert stalled.state == "stalled" and "100 s" in stalled.detail


def test_a_page_without_the_llamacpp_gauges_is_one_error_naming_them():
    page = "".join(line for line in LLAMACPP_PAGE.splitlines(keepends=True)
                   if "requests_processing" not in line and "requests_deferred" not in line)
    assert "llamacpp:n_decode_total 551" in page
    with pytest.raises(ValueError, match="llamacpp:requests_processing / llamacpp:requests_deferred") as e:
        parse_llamacpp_metrics(page)
    assert "--metrics" in str(e.value)
    with pytest.raises(ValueError, match="requests_processing"):
        parse_llamacpp_metrics(IDLE_PAGE)  # a vLLM page is not a llama-server page


def test_the_supervisor_reads_a_llamacpp_head_with_the_key(tmp_path):
    """`Target.reading` of a llama.cpp recipe goes through `read_llamacpp` (no probe fallback) and presents the key:
    llama-server checks it on /metrics (only /health and /v1/health are public: tools/server/server-http.cpp,
    middleware_validate_api_key). The real llama-server does not run in the unit tier; this stand-in answers /metrics
    by the same rule, with the captured page, and 401 in llama-server's error body otherwise."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ds4deploy.operate.supervisor import Target
    from ds4deploy.recipe.load import load_recipe

    key = "ds4-TestKey0123456789abcdefABCDEF"

    class LlamaServerMetrics(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/metrics" and self.headers.get("authorization") == f"Bearer {key}"
            body = (LLAMACPP_PAGE if ok else json.dumps(
                {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})).encode()
            self.send_response(200 if ok else 401)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), LlamaServerMetrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        recipe = load_recipe("cpu-llamacpp")
        reading, why = Target(recipe, tmp_path / "inventory.yml", [], url, key).reading()
        assert why == "" and reading == parse_llamacpp_metrics(LLAMACPP_PAGE)
        reading, why = Target(recipe, tmp_path / "inventory.yml", [], url, None).reading()
        assert reading is None and why == "GET /metrics: HTTPStatusError"
    finally:
        server.shutdown()
