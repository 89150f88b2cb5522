"""The trust report's wire figures (ds4deploy/bench/trust.py) from a real capture (fixtures/wire/SOURCES.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ds4deploy.bench import trust, wire
from ds4deploy.errors import UserError

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
    x = res["send_delay"]["wire"]["vllm"]
    assert f"{x['diff_pct']:+.2f} %" in rows[1] and f"{x['stalls']} / {x['n']}" in rows[1]
    assert f"| {x['reported_diff_pct']:+.2f} (" in rows[1] and f"{100 * x['reported_vs_wire']:+.1f} %" in rows[1]
    assert trust._wire_probe_lines({"send_delay": {}, "interleaved": {}}) == []


def test_committed_section_is_the_committed_json(tmp_path):
    """docs/bench-harness.md's measurement section is what docs/bench-harness.json renders to: every figure in the
    section comes from the run's raw numbers. (The prose above the section quotes figures by hand.)"""
    docs = Path(__file__).parents[2] / "docs"
    doc = tmp_path / "bench-harness.md"
    doc.write_text((docs / "bench-harness.md").read_text())
    trust.write_doc(json.loads((docs / "bench-harness.json").read_text()), doc)
    assert doc.read_text() == (docs / "bench-harness.md").read_text()


def test_compare_lines_against_the_wire():
    res = json.loads((Path(__file__).parents[2] / "docs" / "bench-harness.json").read_text())
    lines = trust._wire_compare_lines(res)
    for row in res["comparison"]:
        c = row["concurrency"]
        x = row["ttft_ms"]["vs_wire"]
        (ttft,) = [ln for ln in lines if ln.startswith(f"| {c} | TTFT (client time")]
        assert f"| {x['diff_pct']:+.2f} % |" in ttft and f"| {x['diff_pct_noenv']:+.2f} % |" in ttft
        assert f"{100 * x['overhead_ms']['ours'] / x['wire_ttft_ms']:+.2f} %" in ttft
        for m, label in (("per_session", "per-session"), ("aggregate", "aggregate")):
            (ln,) = [ln for ln in lines if ln.startswith(f"| {c} | {label} output tok/s")]
            assert f"| {row[m]['vs_wire']['diff_pct']:+.2f} % |" in ln
    no_wire = {"comparison": [{"concurrency": 1, "ttft_ms": {}, "per_session": {}, "aggregate": {}}]}
    assert trust._wire_compare_lines(no_wire) == []
