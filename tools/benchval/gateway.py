"""`make bench-gateway`: the TTFT the gateway adds and the memory of its two containers.

Starts one real backend (tools/gateway_rig.py, the start-up the deployed gateway tests use: llama-server with the
cpu-llamacpp recipe's image, tiny GGUF and argv, behind that recipe's rendered front door) and a gateway recipe with
that backend alone in front of it (SMG router and the gateway's front door, the product's render), then sends the
same streamed request alternately straight to the backend's front door and through the gateway (pairs, the first
side alternating by pair, so drift on the host hits both sides alike), one at a time.

Per request: TTFT = send -> first byte of generated text, i.e. the first server-sent event whose ``delta.content``
is not empty (read with httpx as the bytes arrive); the rest of the stream is read to its end before the next
request. The added TTFT is the paired difference (through the gateway minus straight, per pair); median and p90
(nearest rank) of each side and of the difference are reported.

Memory: ``docker stats`` (the container's cgroup usage less inactive page cache, as `make soak` reads it) of the
router and the gateway's front door, sampled every `MEM_INTERVAL_S` from before the first request to after a
concurrent phase (12 streams at once through the gateway, several rounds) that shows what a busy office adds.

Writes ``docs/results/bench-gateway.json`` and the ``bench-gateway`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

from ds4deploy.bench.docs_section import results_beside, write_section
from ds4deploy.bench.soak import MemorySampler
from ds4deploy.build import gateway_image
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.paths import REPO_ROOT
from tools import gateway_rig
from tools.gateway_rig import BENCH_RIG

MARK_BEGIN = "<!-- bench-gateway:begin -->"
MARK_END = "<!-- bench-gateway:end -->"
NAME = "gwbench"
PORT, ROUTER_PORT, METRICS_PORT = 18230, 18231, 18232
MODEL = "office-tiny"
PROMPT = "Write a short story about a river, a bridge and three children who watch the leaves on the water."
# docker stats takes about 1-2 s per call on this host; a sample every 2 s resolves the concurrent phase.
MEM_INTERVAL_S = 2.0
# Sessions at once in the concurrent phase: issue 30's office of 12 Claude Code sessions.
CONCURRENT_SESSIONS = 12


def p90(values: list[float]) -> float:
    """The 90th percentile by nearest rank (the smallest value with at least 90 % of the values at or below it)."""
    s = sorted(values)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def first_content_s(client: httpx.Client, url: str, key: str, max_tokens: int, session: str) -> float:
    """One streamed chat request to `url`; seconds from send to the first event carrying generated text.

    Raises:
        UserError: the answer is not 200 or streams no text.
    """
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    headers = {"authorization": f"Bearer {key}", "x-claude-code-session-id": session}
    first = None
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise UserError(f"{url} answered {r.status_code}: {r.read()[:300]!r}", "see the containers' logs")
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - t0
    if first is None:
        raise UserError(f"{url} streamed no text", "raise --max-tokens (the first tokens may be partial characters)")
    return first


def interleaved(direct: str, direct_key: str, through: str, person_key: str, pairs: int, max_tokens: int) -> dict:
    """`pairs` pairs of the same request straight to the backend and through the gateway (order alternating by pair;
    4 unrecorded pairs first warm both paths). Returns per-side TTFT lists (s) and the paired differences (s)."""
    sides = {"direct": (direct, direct_key), "gateway": (through, person_key)}
    ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
    with httpx.Client(timeout=120) as client:
        for i in range(-4, pairs):
            order = ("direct", "gateway") if i % 2 else ("gateway", "direct")
            got = {s: first_content_s(client, *sides[s], max_tokens, f"bench-{s}") for s in order}
            if i >= 0:
                for s in order:
                    ttft[s].append(got[s])
    return ttft | {"added": [g - d for g, d in zip(ttft["gateway"], ttft["direct"], strict=True)]}


def concurrent_phase(through: str, person_key: str, rounds: int, max_tokens: int) -> float:
    """`rounds` rounds of `CONCURRENT_SESSIONS` streams at once through the gateway, each stream a new session (so
    the router's sticky-session table grows by `CONCURRENT_SESSIONS` a round). Returns its seconds."""
    t0 = time.monotonic()
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=CONCURRENT_SESSIONS)) as client, \
            ThreadPoolExecutor(CONCURRENT_SESSIONS) as pool:
        for r in range(rounds):
            list(pool.map(lambda s, r=r: first_content_s(client, through, person_key, max_tokens, f"office-{r}-{s}"),
                          range(CONCURRENT_SESSIONS)))
    return time.monotonic() - t0


def _stats(values: list[float]) -> dict:
    return {"median_ms": statistics.median(values) * 1000, "p90_ms": p90(values) * 1000,
            "min_ms": min(values) * 1000, "max_ms": max(values) * 1000}


def _mem(sampler: MemorySampler, split_s: float) -> dict:
    idle = [m for t, m in sampler.samples if t < split_s]
    busy = [m for t, m in sampler.samples if t >= split_s]
    return {"container": sampler.container, "samples": len(sampler.samples), "misses": sampler.misses,
            "before_mib": idle[0] if idle else None, "max_mib": max(m for _, m in sampler.samples),
            "concurrent_max_mib": max(busy) if busy else None}


def run(ns: argparse.Namespace) -> dict:
    """Start the backend and the gateway, measure, take both down. Returns the results (see `write_report`).

    Raises:
        UserError: the rig cannot start here (`gateway_rig.missing`), or a request failed.
    """
    why = gateway_rig.missing()
    if why:
        raise UserError(why, "see `make e2e-gateway`'s needs in the Makefile")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ds4-bench-gateway-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "backend").mkdir()
        started = {"names": list(gateway_rig.containers("a", BENCH_RIG))}
        try:
            started = gateway_rig.start(tmp / "backend", ("a",), BENCH_RIG)
            recipe = {"kind": "gateway", "name": NAME, "description": "gateway benchmark over one backend",
                      "port": PORT, "router_port": ROUTER_PORT, "router_metrics_port": METRICS_PORT,
                      "models": [MODEL], "backends": [gateway_rig.backend_doc("a", BENCH_RIG)],
                      "people": [{"name": "bench"}]}
            (tmp / "gateway").mkdir()
            with gateway_rig.gateway_up(tmp / "gateway", recipe, started["gw_key"]) as gw:
                project = f"ds4-gw-{NAME}"
                t0 = time.monotonic()
                samplers = [MemorySampler(c, MEM_INTERVAL_S, t0) for c in
                            (f"{project}-router", f"{project}-front-door", gateway_rig.containers("a", BENCH_RIG)[1])]
                with contextlib.ExitStack() as stack:
                    for s in samplers:
                        stack.enter_context(s)
                    time.sleep(2 * MEM_INTERVAL_S)  # the idle memory, before any request
                    ttft = interleaved(started["backend_url"]["a"], started["own_keys"]["a"], gw["url"],
                                       gw["keys"]["bench"], ns.pairs, ns.max_tokens)
                    split = time.monotonic() - t0
                    conc_s = concurrent_phase(gw["url"], gw["keys"]["bench"], ns.rounds, ns.max_tokens)
                    time.sleep(MEM_INTERVAL_S)
        finally:
            gateway_rig.docker("rm", "-f", *started["names"], check=False)
    argv = json.loads((REPO_ROOT / "compose" / "cpu-llamacpp" / "engine-args.json").read_text())
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "host": f"{platform.machine()}, {os.cpu_count()} cores, shared with other work (1-minute load average "
                    f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)",
            "router": "smg", "router_image": gateway_image.image_ref(),
            "engine": "llama-server with the cpu-llamacpp recipe's argv: tiny GGUF, "
                      f"{argv[argv.index('-t') + 1]} thread",
            "pairs": ns.pairs, "max_tokens": ns.max_tokens, "prompt": PROMPT,
            "direct": _stats(ttft["direct"]), "gateway": _stats(ttft["gateway"]), "added": _stats(ttft["added"]),
            "ttft_s": ttft, "concurrent": {"sessions": CONCURRENT_SESSIONS, "rounds": ns.rounds, "seconds": conc_s},
            "memory": {"router": _mem(samplers[0], split), "front_door": _mem(samplers[1], split),
                       "backend_front_door": _mem(samplers[2], split)}}


def _f(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else format(v, fmt)


def write_report(res: dict, md_path: Path) -> None:
    """Write the raw JSON beside `md_path` and replace the bench-gateway section of the markdown."""
    results_beside(md_path, "bench-gateway.json").write_text(json.dumps(res, indent=2) + "\n")
    d, g, a = res["direct"], res["gateway"], res["added"]
    mem = res["memory"]
    lines = [
        MARK_BEGIN,
        "## The gateway's cost: added TTFT and memory (`make bench-gateway`)",
        "",
        f"{res['date']}, host {res['host']}. One backend ({res['engine']}; behind the cpu-llamacpp recipe's front "
        f"door) and a gateway over it alone (router {res['router']}, `{res['router_image']}`, and the gateway's "
        f"front door), all on loopback. {res['pairs']} pairs of the same streamed chat request "
        f"({res['max_tokens']} output tokens, temperature 0), one at a time, alternately straight to the backend's "
        "front door with its key and through the gateway with a person's key, the first side alternating by pair. "
        "TTFT: send to the first event carrying generated text.",
        "",
        "| TTFT ms | median | p90 | min-max |",
        "|---|---|---|---|",
        f"| straight to the backend | {d['median_ms']:.1f} | {d['p90_ms']:.1f} | {d['min_ms']:.1f}-{d['max_ms']:.1f} |",
        f"| through the gateway | {g['median_ms']:.1f} | {g['p90_ms']:.1f} | {g['min_ms']:.1f}-{g['max_ms']:.1f} |",
        f"| added (gateway minus straight, per pair) | {a['median_ms']:.1f} | {a['p90_ms']:.1f} | "
        f"{a['min_ms']:.1f}-{a['max_ms']:.1f} |",
        "",
        f"Memory (docker stats, MiB): before the first request, the most while the pairs ran or after, and the most "
        f"during {res['concurrent']['rounds']} rounds of {res['concurrent']['sessions']} streams at once through the "
        f"gateway, each stream a new session ({res['concurrent']['seconds']:.0f} s; sampled every "
        f"{MEM_INTERVAL_S:.0f} s).",
        "",
        "| container | before | most | most, concurrent phase |",
        "|---|---|---|---|",
    ]
    for label, key in (("router (SMG)", "router"), ("gateway front door (nginx)", "front_door"),
                       ("backend front door (nginx), for comparison", "backend_front_door")):
        m = mem[key]
        lines.append(f"| {label} | {_f(m['before_mib'], '.1f')} | {_f(m['max_mib'], '.1f')} | "
                     f"{_f(m['concurrent_max_mib'], '.1f')} |")
    lines += [
        "",
        "What it does not show: a backend on another host (the office network's round trip comes on top of the "
        "router's and door's own cost, once per request), a real model's TTFT (the tiny model answers in "
        "milliseconds, so the added time is visible; on DeepSeek V4 Flash it is a small share of a prefill), the "
        "nginx router (`routing.router: nginx`), memory after days of sessions (SMG keeps a sticky-session entry "
        "per session key for `sticky_idle_s`), and TTFT under concurrent load.",
        "",
        "Raw per-request numbers: `docs/results/bench-gateway.json`.",
        MARK_END,
    ]
    write_section(md_path, MARK_BEGIN, MARK_END, "\n".join(lines), "Benchmarks")


def main(argv: list[str] | None = None) -> int:
    """`make bench-gateway`. Exit 0 with the report written; 2 with one message on a problem."""
    ap = argparse.ArgumentParser(prog="bench-gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=200, help="recorded request pairs (default 200)")
    ap.add_argument("--max-tokens", type=int, default=16, help="output tokens per request (default 16)")
    ap.add_argument("--rounds", type=int, default=40, help="rounds of the concurrent phase (default 40)")
    ap.add_argument("--out", default="docs/benchmarks.md", help="markdown file to write the section into")
    ns = ap.parse_args(argv)
    try:
        res = run(ns)
    except UserError as exc:
        print(f"error: {exc.cause}\nfix: {exc.fix}", file=sys.stderr)
        return exc.code
    write_report(res, REPO_ROOT / ns.out)
    print(f"added TTFT median {res['added']['median_ms']:.1f} ms, p90 {res['added']['p90_ms']:.1f} ms; router "
          f"{res['memory']['router']['max_mib']:.1f} MiB, front door {res['memory']['front_door']['max_mib']:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
