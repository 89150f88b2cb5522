"""`ds4deploy bench ab`: identity detection and paired-ratio statistics on real captured A/B outputs
(fixtures/bench/README.md), and the refusals that need no second server."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ds4deploy.bench.ab import analyse, exit_status, first_difference, markdown, ratio_stats
from ds4deploy.bench.lock import ServerLock

FIX = Path(__file__).parent / "fixtures" / "bench"
REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def test_scheduling_flag_keeps_greedy_output_identical():
    cap = load("vllm-0.32-cpu-ab-identical.json")
    st = analyse(cap["pairs"])
    assert (st["pairs"], st["identical"], st["different"], st["failed"]) == (10, 10, 0, 0)
    assert st["differences"] == []
    # Identity by text agrees with the stream's own sha256 of the same bytes.
    assert all(p["a"]["output_sha256"] == p["b"]["output_sha256"] for p in cap["pairs"])


def test_dtype_change_is_detected_with_the_first_differing_byte():
    cap = load("vllm-0.32-cpu-ab-dtype.json")
    st = analyse(cap["pairs"])
    assert (st["identical"], st["different"]) == (cap["stats_at_capture"]["identical"],
                                                   cap["stats_at_capture"]["different"]) == (1, 9)
    by_pair = {p["index"]: p for p in cap["pairs"]}
    for d in st["differences"]:
        a, b = by_pair[d["pair"]]["a"]["text"].encode(), by_pair[d["pair"]]["b"]["text"].encode()
        assert a != b and by_pair[d["pair"]]["a"]["output_sha256"] != by_pair[d["pair"]]["b"]["output_sha256"]
        n = d["byte"]
        assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])  # equal before it, differ at it
    identical = [p for p in cap["pairs"] if p["identical"]]
    assert len(identical) == 1 and identical[0]["a"]["text"] == identical[0]["b"]["text"]
    md = markdown({**cap, "name": "t", "ignore_eos": False, "stats": st})
    assert "NOT identical: 9 of 10 pairs differ" in md
    rows = [ln for ln in md.splitlines() if re.match(r"\| \d+ \| \d+ \|", ln)]
    assert len(rows) == 9
    assert all(len(re.split(r"(?<!\\)\|", r)) == 8 for r in rows)  # 6 cells: a pipe in the text is escaped


def test_first_difference_on_bytes_not_characters():
    assert first_difference("same", "same") is None
    assert first_difference("héllo", "hèllo") == 2  # é and è share the UTF-8 lead byte 0xC3
    assert first_difference("abc", "abcd") == 3  # a prefix differs at its end


def test_paired_ratios_median_and_spread_on_captured_pairs():
    cap = load("vllm-0.32-cpu-ab-identical.json")
    st = analyse(cap["pairs"])
    tok = [p["b"]["output_tok_s"] / p["a"]["output_tok_s"] for p in cap["pairs"]]
    ttft = [p["b"]["ttft_s"] / p["a"]["ttft_s"] for p in cap["pairs"]]
    assert st["tok_s_ratio"]["median"] == pytest.approx(statistics.median(tok))
    assert st["ttft_ratio"]["median"] == pytest.approx(statistics.median(ttft))
    assert (st["tok_s_ratio"]["min"], st["tok_s_ratio"]["max"]) == (pytest.approx(min(tok)), pytest.approx(max(tok)))
    lo, hi = st["tok_s_ratio"]["ci95"]
    assert min(tok) <= lo <= st["tok_s_ratio"]["median"] <= hi <= max(tok)
    assert "bootstrap" in st["tok_s_ratio"]["ci_method"]


def test_ratio_stats_edges():
    assert ratio_stats([])["median"] is None
    two = ratio_stats([1.0, 3.0])
    assert two["median"] == 2.0 and two["ci95"] is None  # too few pairs for an interval
    same = ratio_stats([1.02] * 9)
    assert same["ci95"] == [pytest.approx(1.02), pytest.approx(1.02)]
    a, b = ratio_stats([0.9, 1.0, 1.1, 1.3, 0.8]), ratio_stats([0.9, 1.0, 1.1, 1.3, 0.8])
    assert a == b  # seeded bootstrap: the same pairs give the same interval


def test_failed_pair_is_counted_and_left_out_of_the_ratios():
    pairs = load("vllm-0.32-cpu-ab-identical.json")["pairs"][:4]
    pairs[1] = {**pairs[1], "b": {**pairs[1]["b"], "ok": False, "error": "HTTP 500: boom", "output_tok_s": None}}
    st = analyse(pairs)
    assert st["failed"] == 1 and st["identical"] == 3 and st["tok_s_ratio"]["n"] == 3


def _ab(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", "bench", "ab", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout, check=False)


@pytest.mark.parametrize(("args", "message"), [
    (["http://127.0.0.1:9", "http://127.0.0.1:10", "--temperature", "0.7"], "bench ab compares greedy output"),
    (["http://127.0.0.1:9", "http://127.0.0.1:9/"], "A and B are the same server"),
    (["http://127.0.0.1:9", "http://127.0.0.1:10"], "cannot reach A at http://127.0.0.1:9"),
])
def test_cli_refusals(tmp_path, args, message):
    p = _ab(*args, "--out", str(tmp_path / "out"))
    assert p.returncode == 2, p.stderr
    assert f"error: {message}" in p.stderr
    assert not (tmp_path / "out").exists()


def test_cli_refuses_while_another_benchmark_holds_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_BENCH_LOCK_DIR", str(tmp_path / "locks"))
    with ServerLock("http://127.0.0.1:10", what="test holder"):
        p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "bench", "ab", "http://127.0.0.1:9",
                            "http://127.0.0.1:10", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                           cwd=REPO, timeout=120, check=False, env={**os.environ})
    assert p.returncode == 2
    assert "another benchmark is running against http://127.0.0.1:10" in p.stderr and "test holder" in p.stderr


def test_cross_family_reports_agreement_not_a_verdict():
    """Across engine families the report gives identical pairs and the shared-prefix share, apart from speed."""
    cap = load("vllm-0.32-cpu-ab-dtype.json")
    st = analyse(cap["pairs"])
    by_pair = {p["index"]: p for p in cap["pairs"]}
    shares = []
    for p in cap["pairs"]:
        a, b = p["a"]["text"].encode(), p["b"]["text"].encode()
        off = first_difference(p["a"]["text"], p["b"]["text"])
        shares.append(1.0 if off is None else off / max(len(a), len(b)))
    assert st["shared_prefix"]["median"] == pytest.approx(statistics.median(shares))
    assert st["shared_prefix"]["max"] == 1.0  # the one identical pair
    assert len(by_pair) == st["pairs"]
    md = markdown({**cap, "name": "t", "ignore_eos": False, "stats": st, "cross_family": True})
    assert "agreement across engine families" in md and "1 of 10 pairs identical" in md
    assert "NOT identical" not in md


def test_a_real_cross_family_run_reports_agreement_apart_from_speed():
    """A real A/B of llama-server (A, cpu-llamacpp) against vLLM CPU (B), families read from the recipe and from
    B's /v1/models: agreement is counted (no pair identical, shared prefix 0) and never fails the run; the speed
    table gives the ratios and each side on its own, prompt tokens as each server counted them."""
    cap = load("ab-cross-family-llamacpp-vllm-cpu.json")
    assert cap["cross_family"] and (cap["a"]["family"], cap["b"]["family"]) == ("llamacpp", "vllm")
    st = analyse(cap["pairs"])
    assert (st["pairs"], st["failed"], st["identical"], st["different"]) == (6, 0, 0, 6)
    assert st["shared_prefix"]["max"] == 0.0
    a_tps = sorted(p["a"]["output_tok_s"] for p in cap["pairs"])
    assert st["a"]["output_tok_s_median"] == pytest.approx((a_tps[2] + a_tps[3]) / 2)
    assert st["b"]["prompt_tokens_median"] and st["a"]["prompt_tokens_median"]
    assert exit_status(st, cross=True) == 0 and exit_status(st, cross=False) == 1
    failed = [{**cap["pairs"][0], "b": {**cap["pairs"][0]["b"], "ok": False}}, *cap["pairs"][1:]]
    assert exit_status(analyse(failed), cross=True) == 1
    md = markdown({**cap, "stats": st})
    assert "0 of 6 pairs identical, 0 failed" in md and "NOT identical" not in md
    assert "engine family llamacpp" in md and "engine family vllm" in md
    assert "| A (llamacpp) |" in md and "| B (vllm) |" in md
