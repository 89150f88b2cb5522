"""`make bench-gateway`: the TTFT a gateway adds and the memory of its containers.

Starts one real backend (tools/gateway_rig.py, the start-up the deployed gateway tests use: llama-server with the
cpu-llamacpp recipe's image, tiny GGUF and argv, behind that recipe's rendered front door) and two gateway recipes
with that backend alone behind them (the product's render): SMG (router container and the gateway's front door) and
the nginx router (the front door alone). Then sends the same streamed request in rounds, one request at a time:
straight to the backend's front door, through the SMG gateway, through the nginx gateway, the order rotated by one
each round, so drift on the host hits every side alike.

Per request: TTFT = send -> first byte of generated text, i.e. the first server-sent event whose ``delta.content``
is not empty (read with httpx as the bytes arrive); the rest of the stream is read to its end before the next
request. The added TTFT of a gateway is its TTFT minus the straight one of the same round; median and p90 (nearest
rank) of each side and of each difference are reported.

Memory: ``docker stats`` (the container's cgroup usage less inactive page cache, as `make soak` reads it) of the
SMG router, both gateways' front doors and the backend's front door, sampled every `MEM_INTERVAL_S` from before the
first request to after a concurrent phase (12 streams at once through each gateway, many rounds, each stream a new
session) that shows what a busy office adds.

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
PORT, ROUTER_PORT, METRICS_PORT, NGINX_PORT = 18230, 18231, 18232, 18233
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


# The sides of a round, in the order of round 0 (each later round rotates it by one).
SIDES = ("direct", "smg", "nginx")


def interleaved(sides: dict[str, tuple[str, str]], rounds: int, max_tokens: int) -> dict:
    """`rounds` rounds of the same request to each side (name -> (URL, key)) one at a time, the order rotated by one
    each round (so each side goes first, second and last alike; 4 unrecorded rounds first warm every path).

    Returns:
        {side: [TTFT s per round]} and, per gateway side, ``added_<side>``: its TTFT minus the direct one of the
        same round (s).
    """
    names = [s for s in SIDES if s in sides]
    ttft: dict[str, list[float]] = {s: [] for s in names}
    with httpx.Client(timeout=120) as client:
        for i in range(-4, rounds):
            order = names[i % len(names):] + names[:i % len(names)]
            got = {s: first_content_s(client, *sides[s], max_tokens, f"bench-{s}") for s in order}
            if i >= 0:
                for s in order:
                    ttft[s].append(got[s])
    return ttft | {f"added_{s}": [g - d for g, d in zip(ttft[s], ttft["direct"], strict=True)]
                   for s in names if s != "direct"}


def concurrent_phase(through: str, person_key: str, rounds: int, max_tokens: int) -> float:
    """`rounds` rounds of `CONCURRENT_SESSIONS` streams at once through a gateway, each stream a new session (so
    SMG's sticky-session table grows by `CONCURRENT_SESSIONS` a round). Returns its seconds."""
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


def _recipe(router: str) -> dict:
    """The benchmark's gateway recipe over backend ``a`` alone: SMG (`NAME`) or the nginx router (`NAME`-nginx)."""
    base = {"kind": "gateway", "description": f"gateway benchmark over one backend, router {router}",
            "models": [MODEL], "backends": [gateway_rig.backend_doc("a", BENCH_RIG)], "people": [{"name": "bench"}]}
    if router == "smg":
        return base | {"name": NAME, "port": PORT, "router_port": ROUTER_PORT, "router_metrics_port": METRICS_PORT}
    return base | {"name": f"{NAME}-nginx", "port": NGINX_PORT, "routing": {"router": "nginx"}}


def run(ns: argparse.Namespace) -> dict:
    """Start the backend and both gateways, measure, take them down. Returns the results (see `write_report`).

    Raises:
        UserError: the rig cannot start here (`gateway_rig.missing`), or a request failed.
    """
    why = gateway_rig.missing()
    if why:
        raise UserError(why, "see `make e2e-gateway`'s needs in the Makefile")
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ds4-bench-gateway-") as tmp_s, contextlib.ExitStack() as stack:
        tmp = Path(tmp_s)
        (tmp / "backend").mkdir()
        started = {"names": list(gateway_rig.containers("a", BENCH_RIG))}
        stack.callback(lambda: gateway_rig.docker("rm", "-f", *started["names"], check=False))
        started = gateway_rig.start(tmp / "backend", ("a",), BENCH_RIG)
        gws = {}
        for router in ("smg", "nginx"):
            (tmp / router).mkdir()
            gws[router] = stack.enter_context(gateway_rig.gateway_up(tmp / router, _recipe(router),
                                                                     started["gw_key"]))
        t0 = time.monotonic()
        containers = {"router": f"ds4-gw-{NAME}-router", "front_door": f"ds4-gw-{NAME}-front-door",
                      "nginx_router_door": f"ds4-gw-{NAME}-nginx-front-door",
                      "backend_front_door": gateway_rig.containers("a", BENCH_RIG)[1]}
        samplers = {k: stack.enter_context(MemorySampler(c, MEM_INTERVAL_S, t0)) for k, c in containers.items()}
        time.sleep(2 * MEM_INTERVAL_S)  # the idle memory, before any request
        sides = {"direct": (started["backend_url"]["a"], started["own_keys"]["a"])}
        sides |= {r: (gw["url"], gw["keys"]["bench"]) for r, gw in gws.items()}
        ttft = interleaved(sides, ns.rounds, ns.max_tokens)
        split = time.monotonic() - t0
        conc_s = {r: concurrent_phase(gw["url"], gw["keys"]["bench"], ns.concurrent_rounds, ns.max_tokens)
                  for r, gw in gws.items()}
        time.sleep(MEM_INTERVAL_S)
    argv = json.loads((REPO_ROOT / "compose" / "cpu-llamacpp" / "engine-args.json").read_text())
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "host": f"{platform.machine()}, {os.cpu_count()} cores, shared with other work (1-minute load average "
                    f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)",
            "router_image": gateway_image.image_ref(),
            "engine": "llama-server with the cpu-llamacpp recipe's argv: tiny GGUF, "
                      f"{argv[argv.index('-t') + 1]} thread",
            "rounds": ns.rounds, "max_tokens": ns.max_tokens, "prompt": PROMPT,
            "ttft": {k: _stats(v) for k, v in ttft.items()}, "ttft_s": ttft,
            "concurrent": {"sessions": CONCURRENT_SESSIONS, "rounds": ns.concurrent_rounds, "seconds": conc_s},
            "memory": {k: _mem(s, split) for k, s in samplers.items()}}


def _f(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else format(v, fmt)


def write_report(res: dict, md_path: Path) -> None:
    """Write the raw JSON beside `md_path` and replace the bench-gateway section of the markdown."""
    results_beside(md_path, "bench-gateway.json").write_text(json.dumps(res, indent=2) + "\n")
    tt, mem, conc = res["ttft"], res["memory"], res["concurrent"]
    lines = [
        MARK_BEGIN,
        "## The gateway's cost: added TTFT and memory (`make bench-gateway`)",
        "",
        f"{res['date']}, host {res['host']}. One backend ({res['engine']}; behind the cpu-llamacpp recipe's front "
        "door) and two gateways over it alone, all on loopback: SMG (the router container, "
        f"`{res['router_image']}`, behind the gateway's front door) and the nginx router (`routing.router: nginx`, "
        f"the front door alone). {res['rounds']} rounds of the same streamed chat request ({res['max_tokens']} "
        "output tokens, temperature 0), one request at a time: straight to the backend's front door with its key, "
        "through each gateway with a person's key, the order rotated each round. TTFT: send to the first event "
        "carrying generated text; added: a gateway's TTFT minus the straight one of the same round.",
        "",
        "| TTFT ms | median | p90 | min-max |",
        "|---|---|---|---|",
    ]
    for label, key in (("straight to the backend", "direct"), ("through the gateway, SMG", "smg"),
                       ("through the gateway, nginx router", "nginx"), ("added by the gateway, SMG", "added_smg"),
                       ("added by the gateway, nginx router", "added_nginx")):
        s = tt[key]
        lines.append(f"| {label} | {s['median_ms']:.1f} | {s['p90_ms']:.1f} | {s['min_ms']:.1f} to "
                     f"{s['max_ms']:.1f} |")
    lines += [
        "",
        "Memory (docker stats, MiB): before the first request, the most over the run, and the most during the "
        f"concurrent phase: {conc['rounds']} rounds of {conc['sessions']} streams at once through each gateway, each "
        f"stream a new session (SMG {conc['seconds']['smg']:.0f} s, nginx {conc['seconds']['nginx']:.0f} s). Each "
        f"container sampled {min(m['samples'] for m in mem.values())}-{max(m['samples'] for m in mem.values())} "
        f"times ({MEM_INTERVAL_S:.0f} s apart, plus what `docker stats` takes to answer).",
        "",
        "| container | before | most | most, concurrent phase |",
        "|---|---|---|---|",
    ]
    for label, key in (("router (SMG)", "router"), ("gateway front door before SMG (nginx)", "front_door"),
                       ("gateway front door routing itself (nginx router)", "nginx_router_door"),
                       ("backend front door (nginx), for comparison", "backend_front_door")):
        m = mem[key]
        lines.append(f"| {label} | {_f(m['before_mib'], '.1f')} | {_f(m['max_mib'], '.1f')} | "
                     f"{_f(m['concurrent_max_mib'], '.1f')} |")
    lines += [
        "",
        "What it does not show: a backend on another host (the office network's round trip comes on top, once per "
        "hop), a real model's TTFT (the tiny model answers in milliseconds, so the added time is visible; on "
        "DeepSeek V4 Flash it is a small share of a prefill), TTFT under concurrent load, routing between several "
        "backends (one backend here: the policy has one choice), and memory after days of sessions (SMG keeps a "
        "sticky-session entry per session key for `sticky_idle_s`).",
        "",
        "Raw per-request numbers: `docs/results/bench-gateway.json`.",
        MARK_END,
    ]
    write_section(md_path, MARK_BEGIN, MARK_END, "\n".join(lines), "Benchmarks")


def main(argv: list[str] | None = None) -> int:
    """`make bench-gateway`. Exit 0 with the report written; 2 with one message on a problem."""
    ap = argparse.ArgumentParser(prog="bench-gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200,
                    help="recorded rounds, one request to each side (default 200)")
    ap.add_argument("--max-tokens", type=int, default=16, help="output tokens per request (default 16)")
    ap.add_argument("--concurrent-rounds", type=int, default=40,
                    help="rounds of the concurrent phase, per gateway (default 40)")
    ap.add_argument("--out", default="docs/benchmarks.md", help="markdown file to write the section into")
    ns = ap.parse_args(argv)
    try:
        res = run(ns)
    except UserError as exc:
        print(f"error: {exc.cause}\nfix: {exc.fix}", file=sys.stderr)
        return exc.code
    write_report(res, REPO_ROOT / ns.out)
    tt, mem = res["ttft"], res["memory"]
    print(f"added TTFT median (p90): SMG {tt['added_smg']['median_ms']:.1f} ({tt['added_smg']['p90_ms']:.1f}) ms, "
          f"nginx router {tt['added_nginx']['median_ms']:.1f} ({tt['added_nginx']['p90_ms']:.1f}) ms; SMG router "
          f"{mem['router']['max_mib']:.1f} MiB at most, its door {mem['front_door']['max_mib']:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
