"""The trust report's wire figures (tools/benchval/trust.py) from a real capture (fixtures/wire/SOURCES.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from tools.benchval import trust, wire

FIX = Path(__file__).parent / "fixtures" / "wire"
PROBE = json.loads((FIX / "probe-c2-lo.json").read_text())


def overheads() -> dict[str, dict]:
    return wire.client_overhead(PROBE["requests"], wire.parse(FIX / "probe-c2-lo.pcap", 8000), PROBE["run_id"])


def test_wire_summary_ours_against_each_client():
    ov = overheads()
    s = trust.wire_summary(ov, 0)
    w = wire.parse(FIX / "probe-c2-lo.pcap", 8000)
    w_all = statistics.median(w[(PROBE["run_id"], r["index"])].ttft_ms for r in PROBE["requests"])
    assert s["wire_ttft_ms_median_all"] == pytest.approx(w_all)
    assert "diff_ms" not in s["ours"] and "overhead_ms" not in s["ours"] and "pairs" not in s["ours"]
    for t in ("vllm", "vllm_noenv"):
        d = ov["ours"]["overhead_ms_median"] - ov[t]["overhead_ms_median"]
        assert s[t]["diff_ms"] == pytest.approx(d)
        assert s[t]["diff_pct"] == pytest.approx(100 * d / w_all)
        lo, hi = s[t]["diff_ms_ci"]
        assert lo <= d <= hi
        assert s[t]["diff_pct_ci"] == pytest.approx([100 * lo / w_all, 100 * hi / w_all])
        rep = 100 * (ov["ours"]["reported_vs_wire"] - ov[t]["reported_vs_wire"])
        assert s[t]["reported_diff_pct"] == pytest.approx(rep)
        assert s[t]["reported_diff_pct_ci"][0] <= rep <= s[t]["reported_diff_pct_ci"][1]


def test_wire_summary_refuses_a_capture_that_lost_a_clients_requests():
    ov = overheads()
    with pytest.raises(UserError, match="dropped 3 packets"):
        trust.wire_summary(ov, 3)
    ov["vllm"] = {"n": 1, "missing": 1}
    with pytest.raises(UserError, match="too few of the probe's requests of vllm"):
        trust.wire_summary(ov, 0)


def test_probe_lines_render_every_client():
    res = {"send_delay": {"wire": trust.wire_summary(overheads(), 0)}, "interleaved": {}}
    lines = trust._wire_probe_lines(res)
    rows = [ln for ln in lines if ln.startswith("| 1 |")]
    assert [r.split(" | ")[1] for r in rows] == [trust.TOOL_NAMES[t] for t in trust.TOOLS]
    assert rows[0].endswith("| - |")  # ours against itself: no difference
    assert trust._wire_probe_lines({"send_delay": {}, "interleaved": {}}) == []


def test_committed_section_is_the_committed_json(tmp_path):
    """docs/bench-harness.md's measurement section is what docs/results/bench-harness.json renders to: every figure in
    the section comes from the run's raw numbers. (The prose above the section quotes figures by hand.)"""
    docs = Path(__file__).parents[2] / "docs"
    doc = tmp_path / "bench-harness.md"
    doc.write_text((docs / "bench-harness.md").read_text())
    trust.write_doc(json.loads((docs / "results" / "bench-harness.json").read_text()), doc)
    assert doc.read_text() == (docs / "bench-harness.md").read_text()


def test_no_compare_lines_without_the_wire():
    """With a capture the lines are checked whole by the committed section above; without one there are none."""
    no_wire = {"comparison": [{"concurrency": 1, "ttft_ms": {}, "per_session": {}, "aggregate": {}}]}
    assert trust._wire_compare_lines(no_wire) == []


def test_capture_target():
    assert trust.capture_target("http://127.0.0.1:8000") == (8000, "lo")
    assert trust.capture_target("http://[::1]:8100") == (8100, "lo")
    assert trust.capture_target("http://10.0.0.5:9000") == (9000, "any")
    assert trust.capture_target("http://gx10-a") == (80, "any")


def _cell_run(tmp_path, dropped: int | None) -> wire.Capture:
    """The real `ds4deploy bench run` capture (fixtures/wire) as a finished capture (the copy is consumed)."""
    path = tmp_path / "run.pcap"
    path.write_bytes((FIX / "bench-run-c2-any.pcap").read_bytes())
    return wire.Capture(path, 8000, dropped)


def test_against_wire_adds_a_runs_figures(tmp_path):
    cell = json.loads((FIX / "bench-run-c2-any.cell.json").read_text())
    ttfts = {q["index"]: q["ttft_s"] * 1000 for q in cell["requests"]}  # salts #0-#3 in this one-cell run
    decodes = {q["index"]: q["decode_tok_s"] for q in cell["requests"]}
    r = {"ttft_ms": cell["median_ttft_ms"], "aggregate": cell["output_throughput"]}
    cap = _cell_run(tmp_path, 0)
    trust._against_wire(r, cap, cell["run_id"], ttfts, decodes)
    assert not cap.path.exists()  # parsed, then removed
    w = wire.parse(FIX / "bench-run-c2-any.pcap", 8000)
    assert r["wire_ttft_ms"] == pytest.approx(wire.run_ttft_ms(w, cell["run_id"], [0, 1, 2, 3]))
    assert r["ttft_vs_wire"] == pytest.approx(cell["median_ttft_ms"] / r["wire_ttft_ms"] - 1)
    assert r["overhead_ms"] == pytest.approx(statistics.median(wire.paired_overhead(ttfts, w, cell["run_id"])))
    assert abs(r["decode_vs_wire"]) < 0.02 and -0.2 < r["aggregate_vs_wire"] < 0.02
    # A capture that dropped packets, or lacks a request of the run: the run gets no wire figures at all.
    for dropped, got in ((2, ttfts), (0, {**ttfts, 9: 10.0})):
        r2 = {"ttft_ms": cell["median_ttft_ms"], "aggregate": cell["output_throughput"]}
        trust._against_wire(r2, _cell_run(tmp_path, dropped), cell["run_id"], got, decodes)
        assert r2.get("wire_ttft_ms") is None and r2.get("overhead_ms") is None and r2["wire_dropped"] == dropped
    r3: dict = {}
    trust._against_wire(r3, None, cell["run_id"], ttfts, decodes)  # --no-wire
    assert r3 == {}
