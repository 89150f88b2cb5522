"""`ds4deploy bench soak <recipe>`: endurance under steady load, the check an owner runs before handing a server to
a team of coding agents.

`sessions` closed-loop streaming sessions (each sends its next request when the previous finished, like
``vllm bench serve --max-concurrency``) run for `minutes`, cycling over mixed prompt lengths (`prompt_tokens`,
fitted with the server's own tokenizer, salted so the prefix cache serves none of them) and content types. While
they run, the engine container's memory is sampled every `mem_interval_s` seconds.

Reported, per window of `window_min` minutes (by request start time) and for the whole run: requests completed and
failed (with the first distinct error texts), p50/p99 TTFT (ms), median per-request decode rate (tok/s), aggregate
output tok/s, and the engine container's memory (min/max, MiB). The memory trend is a least-squares line over the
samples after the first window (the first window holds the warm-up: first allocations of KV cache blocks and
caches): its slope (MiB/min) and the rise it predicts over that span. "Flat" means a predicted rise of at most
`FLAT_RISE_FRACTION` of the mean usage or `FLAT_RISE_MIB`, whichever is larger; see those constants for why.

Memory is Docker's figure (``docker stats``: the container's cgroup usage minus inactive page cache), the number an
owner sees in ``docker stats``; it is sampled only when the engine container runs on this host (the recipe's
deployed container, or ``--container``), else the report says it was not measured.

Exit codes: 0 no request failed (and, with ``require_flat``, memory flat), 1 otherwise, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from ds4deploy.bench.aggregate import summarize
from ds4deploy.bench.docs_section import RESULTS_DIR, write_section
from ds4deploy.bench.lock import ServerLock
from ds4deploy.bench.prompts import CONTENT_TYPES, TokenCounter, fit_context, load_prompt_set, message_text, salt
from ds4deploy.bench.report import atomic_write_text
from ds4deploy.bench.run import check_server, read_key
from ds4deploy.bench.stream import RequestResult, open_session, stream_request
from ds4deploy.core.errors import UserError
from ds4deploy.core.net import base_url
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.schema import Recipe

# A rise the run can resolve: docker stats reports MiB with 3 significant digits, and an engine's usage moves by tens
# of MiB as requests of different lengths come and go (measured on the cpu recipe: ~2.5 GiB resident, +-20 MiB).
# 2 % of the mean (50 MiB of 2.5 GiB) over 25 minutes is a leak that doubles usage in about a day: worth stopping
# for, and above the run's own noise. 64 MiB floor: below it, allocator noise on a small engine.
FLAT_RISE_FRACTION = 0.02
FLAT_RISE_MIB = 64.0
# docker stats MemUsage units (go-units BytesSize: binary prefixes).
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
MARK_BEGIN = "<!-- bench-soak:begin -->"
MARK_END = "<!-- bench-soak:end -->"


def parse_mem_usage(text: str) -> float:
    """MiB used from ``docker stats`` MemUsage (``"2.41GiB / 23.4GiB"``, the part before the slash).

    Raises:
        ValueError: not in that form.
    """
    m = re.match(r"\s*([0-9.]+)\s*([KMGT]?i?B)\s*/", text)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"not a docker stats MemUsage: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)] / 2**20


@dataclass
class MemorySampler:
    """Samples one container's memory (MiB) every `interval_s` seconds in a thread: ``samples`` is a list of
    (seconds since `t0`, MiB). A failed sample is skipped and counted in ``misses``."""

    container: str
    interval_s: float
    t0: float
    samples: list[tuple[float, float]] = field(default_factory=list)
    misses: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        while not self._stop.is_set():
            p = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", self.container],
                               capture_output=True, text=True, timeout=60, check=False)
            try:
                self.samples.append((time.monotonic() - self.t0, parse_mem_usage(p.stdout)))
            except ValueError:
                self.misses += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


def engine_container(recipe: Recipe) -> str | None:
    """Name of the recipe's running engine container on this host (the single node's, or the head's), or None."""
    p = subprocess.run(["docker", "ps", "--filter", f"label=io.ds4deploy.recipe={recipe.name}",
                        "--format", '{{.Names}} {{.Label "io.ds4deploy.role"}}'],
                       capture_output=True, text=True, check=False)
    for line in p.stdout.splitlines():
        name, _, role = line.partition(" ")
        if role in ("single", "head"):
            return name
    return None


def memory_trend(samples: list[tuple[float, float]], after_s: float) -> dict | None:
    """The least-squares line over the samples taken after `after_s` seconds.

    Returns: ``slope_mib_per_min``, ``rise_mib`` (slope x the span of those samples), ``mean_mib``, ``flat`` (rise
    at most max(FLAT_RISE_FRACTION x mean, FLAT_RISE_MIB)), ``span_min``, ``samples``; None with fewer than 3.
    """
    pts = [(t, m) for t, m in samples if t >= after_s]
    if len(pts) < 3:
        return None
    xs, ys = [t / 60 for t, _ in pts], [m for _, m in pts]
    slope = statistics.linear_regression(xs, ys).slope
    span = xs[-1] - xs[0]
    mean = statistics.fmean(ys)
    rise = slope * span
    return {"slope_mib_per_min": slope, "rise_mib": rise, "mean_mib": mean, "span_min": span, "samples": len(pts),
            "flat": rise <= max(FLAT_RISE_FRACTION * mean, FLAT_RISE_MIB),
            "limit_mib": max(FLAT_RISE_FRACTION * mean, FLAT_RISE_MIB)}


def window_rows(results: list[tuple[float, RequestResult]], memory: list[tuple[float, float]], window_s: float,
                total_s: float) -> list[dict]:
    """One row per window of `window_s` seconds: requests by start time (`results` holds (start second, result)),
    their summary (ds4deploy.bench.aggregate.summarize over the window's length) and the memory samples in it."""
    rows = []
    n = max(1, int(-(-total_s // window_s)))
    for w in range(n):
        lo, hi = w * window_s, min((w + 1) * window_s, total_s)
        rs = [r for t, r in results if lo <= t < hi]
        mem = [m for t, m in memory if lo <= t < hi]
        s = summarize(rs, hi - lo) if rs else None
        rows.append({
            "window": w, "from_s": lo, "to_s": hi, "requests": len(rs),
            "failed": s["failed"] if s else 0,
            "p50_ttft_ms": s["median_ttft_ms"] if s else None, "p99_ttft_ms": s["p99_ttft_ms"] if s else None,
            "decode_tok_s": s["decode_tok_s"] if s else None,
            "output_tok_s": s["output_throughput"] if s else None,
            "mem_min_mib": min(mem) if mem else None, "mem_max_mib": max(mem) if mem else None,
        })
    return rows


@dataclass
class SoakPlan:
    """What one soak sends. Times in seconds, lengths in tokens."""

    url: str
    headers: dict
    model: str
    sessions: int
    duration_s: float
    window_s: float
    prompt_tokens: list[int]
    max_tokens: int
    timeout_s: float


def check_plan(recipe: Recipe, prompt_tokens: list[int], max_tokens: int) -> None:
    """Refuse lengths the recipe's server cannot serve, before anything is sent.

    Raises:
        UserError: a prompt plus max_tokens exceeds ``serving.max_model_len``, or max_tokens exceeds the recipe's
            output cap (``serving.default_max_tokens``: in vLLM 0.32 also the most a request may generate).
    """
    ctx = recipe.serving.max_model_len
    if ctx and max(prompt_tokens) + max_tokens > ctx:
        raise UserError(f"a {max(prompt_tokens)}-token prompt plus max_tokens {max_tokens} exceeds the recipe's "
                        f"context of {ctx} tokens", "pass shorter --prompt-tokens or a smaller --max-tokens")
    cap = recipe.serving.default_max_tokens
    if cap and max_tokens > cap:
        raise UserError(f"--max-tokens {max_tokens} is above the recipe's output cap serving.default_max_tokens "
                        f"({cap}), which the server enforces", f"pass --max-tokens {cap} or less")


async def _sessions(plan: SoakPlan, prompts: list[tuple[str, str]], run_id: str,
                    on_done) -> list[tuple[float, RequestResult]]:
    """Run `plan.sessions` closed-loop sessions until `plan.duration_s` has passed; a request started before the end
    runs to completion. Request i sends prompt i mod len(prompts) ((context, instruction)) under its own salt.
    Returns (start second, result) per request."""
    out: list[tuple[float, RequestResult]] = []
    t0 = time.monotonic()
    counter = iter(range(10**9))
    url = f"{plan.url}/v1/chat/completions"

    async def session(http) -> None:
        while time.monotonic() - t0 < plan.duration_s:
            i = next(counter)
            ctx, instruction = prompts[i % len(prompts)]
            body = {"model": plan.model, "messages": [{"role": "user",
                                                       "content": message_text(salt(run_id, i), ctx, instruction)}],
                    "max_tokens": plan.max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True}
            start = time.monotonic() - t0
            r = await stream_request(http, url, body, i)
            out.append((start, r))
            on_done(start, r)

    async with open_session(plan.headers, plan.timeout_s, plan.sessions) as http:
        await asyncio.gather(*(session(http) for _ in range(plan.sessions)))
    return out


def run_soak(ns: argparse.Namespace) -> int:
    """Entry point of `ds4deploy bench soak` (arguments in ds4deploy.cli). Writes ``<out>/soak.json`` and
    ``<out>/soak.md`` (and the soak section of ``--section``); returns the exit code (module docstring)."""
    recipe = load_recipe(ns.recipe)
    lengths = [int(x) for x in str(ns.prompt_tokens).split(",") if x.strip()]
    if not lengths or min(lengths) < 256:
        raise UserError(f"--prompt-tokens {ns.prompt_tokens!r}: each length must be 256 tokens or more",
                        "pass comma-separated lengths, e.g. 256,1024,4096")
    if ns.minutes <= 0 or ns.sessions < 1 or ns.window_min <= 0:
        raise UserError("--minutes and --window-min must be above 0 and --sessions at least 1",
                        "e.g. --minutes 30 --sessions 8 --window-min 5")
    check_plan(recipe, lengths, ns.max_tokens)
    url = (ns.url or base_url(recipe.serving.bind_address, recipe.serving.port)).rstrip("/")
    key = read_key(recipe, ns.key_file)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    model = ns.model or recipe.model.served_name
    plan = SoakPlan(url, headers, model, ns.sessions, ns.minutes * 60, ns.window_min * 60, lengths, ns.max_tokens,
                    ns.timeout)
    container = ns.container or (engine_container(recipe) if ns.url is None else None)
    run_id = secrets.token_hex(4)
    out_dir = Path(ns.out) if ns.out else RESULTS_DIR / "bench" / recipe.name
    with ServerLock(url), httpx.Client(headers=headers, timeout=httpx.Timeout(600, connect=30)) as client:
        check_server(client, url, model)
        counter = TokenCounter(client, url, model)
        prompts = []
        for i, n in enumerate(lengths):
            content = CONTENT_TYPES[i % len(CONTENT_TYPES)]
            ctx, _ = fit_context(counter, content, n, None, run_id)
            prompts.append((ctx, load_prompt_set(content).instruction))
        started = datetime.now(UTC)
        t0 = time.monotonic()
        progress = {"n": 0, "failed": 0, "next": plan.window_s}

        def on_done(start: float, r: RequestResult) -> None:
            progress["n"] += 1
            progress["failed"] += 0 if r.ok else 1
            if time.monotonic() - t0 >= progress["next"] and not ns.quiet:
                print(f"{progress['next'] / 60:5.1f} min: {progress['n']} requests, {progress['failed']} failed",
                      flush=True)
                progress["next"] += plan.window_s

        if container:
            with MemorySampler(container, ns.mem_interval, t0) as mem:
                results = asyncio.run(_sessions(plan, prompts, run_id, on_done))
            memory, misses = mem.samples, mem.misses
        else:
            results = asyncio.run(_sessions(plan, prompts, run_id, on_done))
            memory, misses = [], 0
        total_s = time.monotonic() - t0
    results.sort(key=lambda x: x[0])
    overall = summarize([r for _, r in results], total_s)
    errors = sorted({r.error or "" for _, r in results if not r.ok})
    trend = memory_trend(memory, plan.window_s)
    res = {
        "recipe": recipe.name, "server": url, "model": model, "run_id": run_id,
        "date": started.strftime("%Y-%m-%d %H:%M UTC"), "minutes": ns.minutes, "sessions": ns.sessions,
        "prompt_tokens": lengths, "max_tokens": ns.max_tokens, "window_min": ns.window_min,
        "container": container, "memory_misses": misses,
        "requests": len(results), "failed": overall["failed"], "errors": errors[:10],
        "p50_ttft_ms": overall["median_ttft_ms"], "p99_ttft_ms": overall["p99_ttft_ms"],
        "decode_tok_s": overall["decode_tok_s"], "output_tok_s": overall["output_throughput"],
        "windows": window_rows(results, memory, plan.window_s, total_s),
        "memory": {"samples": memory, "min_mib": min((m for _, m in memory), default=None),
                   "max_mib": max((m for _, m in memory), default=None), "trend": trend},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "soak.json", json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    atomic_write_text(out_dir / "soak.md", md + "\n")
    if ns.section:
        write_section(Path(ns.section), MARK_BEGIN, MARK_END, f"{MARK_BEGIN}\n{md}\n{MARK_END}", "Benchmarks")
    print(md)
    bad = res["failed"] > 0 or (ns.require_flat and not (trend and trend["flat"]))
    return 1 if bad else 0


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def markdown(res: dict) -> str:
    """The soak report as markdown: the run, the verdicts, one row per window."""
    tr = res["memory"]["trend"]
    if res["container"] is None:
        mem_line = "Memory: not measured (the engine container is not on this host; pass --container)."
    elif tr is None:
        mem_line = (f"Memory of `{res['container']}`: {len(res['memory']['samples'])} samples, too few after the "
                    "first window for a trend (run longer).")
    else:
        mem_line = (f"Memory of `{res['container']}` (docker stats): {_f(res['memory']['min_mib'], '.0f')}-"
                    f"{_f(res['memory']['max_mib'], '.0f')} MiB over the run; after the first window "
                    f"{tr['slope_mib_per_min']:+.2f} MiB/min over {tr['span_min']:.1f} min = "
                    f"{tr['rise_mib']:+.0f} MiB predicted rise (limit {tr['limit_mib']:.0f} MiB): "
                    f"**{'flat' if tr['flat'] else 'RISING'}**.")
    lines = [
        "## Soak: steady load on the deployed stack (`make soak`)",
        "",
        f"Recipe `{res['recipe']}` at {res['server']}, {res['date']}: {res['minutes']:g} min, {res['sessions']} "
        f"closed-loop streaming sessions, prompts of {', '.join(map(str, res['prompt_tokens']))} tokens in turn "
        f"(salted, greedy, {res['max_tokens']} output tokens each, ignore_eos).",
        "",
        f"**{res['requests']} requests, {res['failed']} failed.** p50/p99 TTFT {_f(res['p50_ttft_ms'])}/"
        f"{_f(res['p99_ttft_ms'])} ms, median decode {_f(res['decode_tok_s'])} tok/s per request, "
        f"{_f(res['output_tok_s'])} output tok/s aggregate.",
        "",
        mem_line,
    ]
    if res["errors"]:
        lines += ["", "Errors (distinct): " + "; ".join(f"`{e[:200]}`" for e in res["errors"])]
    lines += ["", "| window (min) | requests | failed | p50 TTFT ms | p99 TTFT ms | decode tok/s | output tok/s | "
              "memory MiB (min-max) |", "|---|---|---|---|---|---|---|---|"]
    for w in res["windows"]:
        mem = "-" if w["mem_min_mib"] is None else f"{w['mem_min_mib']:.0f}-{w['mem_max_mib']:.0f}"
        lines.append(f"| {w['from_s'] / 60:.1f}-{w['to_s'] / 60:.1f} | {w['requests']} | {w['failed']} | "
                     f"{_f(w['p50_ttft_ms'])} | {_f(w['p99_ttft_ms'])} | {_f(w['decode_tok_s'])} | "
                     f"{_f(w['output_tok_s'])} | {mem} |")
    lines += ["", "Requests are put in the window in which they started; the last window is the run's remainder. "
              "Raw numbers: soak.json beside the report."]
    return "\n".join(lines)
