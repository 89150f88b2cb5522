"""`ds4deploy bench run <recipe> --profile <name>`: measure a profile's cells on a running server.

Order of a run:

1. Resolve the server (``--url``, default the recipe's serving address), the key (``--key-file``, default the
   recipe's deployed key file) and the profile's cells for the recipe (cells longer than the recipe's context are
   refused before anything is sent).
2. Take the server's benchmark lock (`ds4deploy.bench.lock`): one benchmark per server.
3. Check the server: reachable, key accepted, model served, and a probe request with the profile's real
   ``max_tokens`` and sampling is accepted (a server that rejects them stops the run with the server's message).
4. Warm-up requests (not recorded), then per cell: fit the prompt to the target length with the server's
   tokenizer, scrape ``/metrics``, send the cell's requests (closed loop, `concurrency` sessions), scrape again,
   summarise, flag, write the cell's JSON atomically.
5. Write the markdown table, the comparison with the recipe's expected figures and the plots.

A cell is invalid (kept, flagged, drawn hollow) when: any request failed; the prefix cache served more than
`CACHE_HIT_LIMIT` of its prompt tokens (beyond `CACHE_HIT_FREE_TOKENS` per request); the server finished more
requests during the cell than the cell sent (someone else's traffic); the server was busy when the cell started; or
a request's prompt length was off its target (`prompt_tokens_ok`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from ds4deploy.bench import clocks, telemetry
from ds4deploy.bench import metrics as prom
from ds4deploy.bench.aggregate import summarize
from ds4deploy.bench.docs_section import RESULTS_DIR
from ds4deploy.bench.expected import compare
from ds4deploy.bench.lock import ServerLock
from ds4deploy.bench.profiles import CellSpec, Profile, effective_max_tokens, expand, load_profile
from ds4deploy.bench.prompts import (
    TokenCounter,
    fit_context,
    load_prompt_set,
    message_text,
    prompt_tokens_ok,
    salt,
)
from ds4deploy.bench.report import atomic_write_text, markdown, write_cell
from ds4deploy.bench.stream import error_text, open_session, run_closed_loop
from ds4deploy.core.errors import UserError
from ds4deploy.core.net import base_url
from ds4deploy.operate.key_file import parse_env_file, read_api_key
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.schema import Recipe

# A cell is a cache hit when more than 1 % of its prompt tokens came from the prefix cache, beyond 32 tokens per
# request: a chat template's fixed head before the salt may fill one or two KV blocks (16-token blocks on GPU
# builds; the CPU build's 128-token blocks cannot fill before the salt). The cache hit of
# docs/sources.md#gx10-benchmark-method was a whole prompt.
CACHE_HIT_LIMIT = 0.01
CACHE_HIT_FREE_TOKENS = 32
# A cell's stream timing is not trusted when the client's decode rate, token-weighted like the server's
# (`client_decode_window`), is more than 20 % away from the server's own (`CounterDelta.server_decode_tok_s`).
# Measured here (docs/bench-harness.md): both agree within a few % when the host is quiet; when the 2-core host was
# busy, some requests arrived in one burst at the end (TTFT ~= end-to-end latency, e.g. 445 of 447 ms), which
# turns their decode rate into hundreds of thousands of tok/s (or none: all 64 tokens in one read, TTFT 62 ms where
# 8-20 ms is usual). Only checked over >= 64 decoded tokens and >= 50 ms of decoding at the server's rate, where
# timer resolution and one slow step cannot move the rate by 20 %.
STREAM_DISAGREE_LIMIT = 0.20
STREAM_CHECK_MIN_TOKENS = 64
STREAM_CHECK_MIN_S = 0.05
# ... and only when the median answer has >= 16 tokens: an answer that ends on EOS has one engine step the client
# never sees (no text), which alone moves a short answer's client rate by (n - 1) / (n - 2): 20 % at 7 tokens.
STREAM_CHECK_MIN_LENGTH = 16
# ... and when more than a quarter of its requests are implausible one by one: every token in one read, or a client
# rate outside 0.5-2x the server's. On the quiet 2-core host (5 smoke runs, 40 cells:
# docs/results/bench-harness-runs/2026-11-30-smoke-quiet.txt) single requests ranged 0.67-1.38x, none outside the
# band and none in one read; with the host loaded, most requests of a flagged cell were
# (tests/infra/test_bench_live.py).
STREAM_REQUEST_BAND = (0.5, 2.0)
STREAM_OFF_SHARE = 0.25
# Seconds to wait for a response chunk: must exceed the longest TTFT (docs/sources.md#gx10-context-table: 555.55 s at
# 524,288).
DEFAULT_TIMEOUT_S = 3600.0
# Request numbers reserved per clock-sweep point (salts stay 6 digits wide for up to 49 points; ClockSweep caps it).
REQS_PER_POINT = 20000


def read_key(recipe: Recipe, key_file: str | None) -> str | None:
    """The API key: from `key_file` (``VLLM_API_KEY=...`` env file, or a file holding only the key), else the
    recipe's deployed key file (None when the recipe serves without auth).

    Raises:
        UserError: the key file is missing, unreadable or empty.
    """
    if key_file is None:
        return read_api_key(recipe)
    path = Path(key_file)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"cannot read the key file {path}: {exc.strerror}",
                        "pass --key-file with a readable file holding VLLM_API_KEY=<key>") from None
    key = parse_env_file(text).get("VLLM_API_KEY") or (text.strip() if "=" not in text else "")
    if not key:
        raise UserError(f"{path} holds no key", "write VLLM_API_KEY=<key> into it")
    return key


def build_payload(model: str, profile: Profile, recipe: Recipe, max_tokens: int, cell: CellSpec,
                  text: str) -> dict:
    """The chat-completions request body of one benchmark request. `max_tokens` is always set
    (docs/sources.md#gx10-benchmark-method)."""
    body: dict = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": profile.temperature,
        "top_p": profile.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if profile.ignore_eos:
        body["ignore_eos"] = True
    kwargs = template_kwargs(recipe, cell)
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def template_kwargs(recipe: Recipe, cell: CellSpec) -> dict | None:
    """``chat_template_kwargs`` switching thinking per the cell (None: leave the server's default)."""
    if cell.thinking is None:
        return None
    return {name: cell.thinking for name in recipe.benchmark.thinking_kwargs}


def check_server(client: httpx.Client, url: str, model: str) -> None:
    """Reachable, key accepted, `model` served.

    Raises:
        UserError: connection refused/timeout, HTTP 401/403, or the model is not listed.
    """
    try:
        r = client.get(f"{url}/v1/models", timeout=30)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach the server at {url}: {type(exc).__name__}: {exc}",
                        "check --url (default: the recipe's serving address and port) and that the server is up "
                        "(`make status`)") from None
    if r.status_code in (401, 403):
        raise UserError(f"{url} refused the API key (HTTP {r.status_code})",
                        "pass --key-file with the server's key file (VLLM_API_KEY=<key>)")
    if r.status_code != 200:
        raise UserError(f"{url}/v1/models answered {error_text(r.content, r.status_code)}",
                        "point --url at an OpenAI-compatible server (vLLM)")
    served = [m.get("id") for m in r.json().get("data", [])]
    if model not in served:
        raise UserError(f"{url} does not serve model '{model}' (it serves: {', '.join(map(str, served)) or 'none'})",
                        "pass --model with one of those, or point --url at the recipe's server")


async def probe(url: str, headers: dict, payload: dict, timeout: float) -> None:
    """Send one request with the run's real max_tokens and sampling; stop reading at the first chunk (the server
    aborts the rest). Validation errors arrive before the stream starts.

    Raises:
        UserError: the server rejected the request (its message included).
    """
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout, connect=30)) as client:
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as resp:
                if resp.status_code != 200:
                    msg = error_text(await resp.aread(), resp.status_code)
                    raise UserError(
                        f"the server rejected a benchmark request (max_tokens={payload['max_tokens']}, temperature="
                        f"{payload['temperature']}, top_p={payload['top_p']}): {msg}",
                        "lower the profile's max_tokens (or the recipe's benchmark.max_tokens) to what the server "
                        "accepts; the harness never sends a request without max_tokens")
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        break
        except httpx.HTTPError as exc:
            raise UserError(f"the probe request to {url} failed: {type(exc).__name__}: {exc}",
                            "check the server log") from None


def client_decode_window(cell_results: list) -> tuple[float, float]:
    """(decoded tokens, seconds) of the cell as the client saw it: sums over the successful requests of (completion
    tokens - 1) and (last - first token arrival), the client's side of the server's inter-token latency sum."""
    tokens = window = 0.0
    for r in cell_results:
        if r.ok and r.completion_tokens and r.ttft_s is not None and r.last_token_s is not None:
            tokens += r.completion_tokens - 1
            window += max(0.0, r.last_token_s - r.ttft_s)
    return tokens, window


def stream_timing_flag(cell_results: list, delta: prom.CounterDelta | None) -> str | None:
    """The "stream timing off" reason, or None when the client's timing can be trusted.

    Judged against the server's own per-session decode rate (`CounterDelta.server_decode_tok_s`), two ways, either
    of which flags the cell:

    - the client's rate token-weighted over the cell (`client_decode_window`) is more than `STREAM_DISAGREE_LIMIT`
      away (the like-for-like comparison: the server's figure is token-weighted too);
    - more than `STREAM_OFF_SHARE` of the requests are implausible one by one: every token in one read, or a rate
      outside `STREAM_REQUEST_BAND` times the server's.

    The second is needed because on a busy host requests that arrive in one read and requests that trickle in late
    cancel out in the token-weighted sum (measured: 5 of 8 requests in one read, 3 at 0.34x the server's rate,
    token-weighted 0.90x). The median request (the table's ``decode_tok_s``) is not compared with the server's
    rate: the two are different averages and part ways when the server itself is faster for one request than for
    the next (measured on the quiet host: requests at 0.69x and 1.84x, token-weighted 1.01x, median 1.27x). No
    verdict (None) when there is too little decoding to judge: fewer than `STREAM_CHECK_MIN_TOKENS` tokens, less
    than `STREAM_CHECK_MIN_S` of decoding at the server's rate, or a median answer under `STREAM_CHECK_MIN_LENGTH`
    tokens."""
    server = delta.server_decode_tok_s if delta is not None else None
    tokens, window = client_decode_window(cell_results)
    if server is None or tokens < STREAM_CHECK_MIN_TOKENS or tokens / server < STREAM_CHECK_MIN_S:
        return None
    ok = [r for r in cell_results if r.ok and r.completion_tokens]
    lengths = sorted(r.completion_tokens for r in ok)
    if not lengths or lengths[len(lengths) // 2] < STREAM_CHECK_MIN_LENGTH:
        return None
    low, high = STREAM_REQUEST_BAND
    rates = [r.decode_tok_s for r in ok]
    at_once = sum(1 for d in rates if d is None)
    off = sum(1 for d in rates if d is None or not low <= d / server <= high)
    if window > 0 and abs(tokens / window / server - 1) <= STREAM_DISAGREE_LIMIT and off <= STREAM_OFF_SHARE * len(ok):
        return None
    if window == 0:
        seen = "every token of each request at once"
    else:
        seen = (f"{tokens / window:,.0f} tok/s decode over the cell, {off} of {len(ok)} requests outside "
                f"{low:g}-{high:g}x the server's rate ({at_once} with every token in one read)")
    sent, chunks = sum(r.completion_tokens for r in ok), sum(r.token_chunks for r in ok)
    # Evidence of where it went wrong, not a verdict: vLLM's frontend merges the outputs a lagging stream has not
    # yet sent into one chunk (vllm/v1/engine/output_processor.py, RequestOutputCollector), so several tokens per
    # chunk point at its API server falling behind - unless speculative decoding packed them; one chunk per token
    # means they were held up between the server's socket and this client's reads.
    where = (f"{sent:,} tokens came in {chunks:,} chunks, several per chunk (vLLM's frontend falling behind, or "
             "speculative decoding)" if chunks < sent / 2
             else f"{sent:,} tokens came in {chunks:,} chunks, held up on the way to this client")
    return (f"stream timing off: the client saw {seen}, the server's own counters {server:,.0f} tok/s "
            f"(inter-token latency); tokens did not reach the client at the pace the server made them ({where}; "
            "the server's frontend or this client was short of CPU): rerun on a quieter host or from another "
            "machine")


def server_timings_summary(cell_results: list) -> dict | None:
    """What the server itself reported per request (llama-server's ``timings``, `RequestResult.server_timings`):
    the median prompt and decode rates in tok/s and the prompt tokens its cache served, over the successful
    requests that carried timings; None when none did (vLLM sends no timings)."""
    timed = [r for r in cell_results if r.ok and r.server_timings]
    if not timed:
        return None
    pre = [r.server_prefill_tok_s for r in timed if r.server_prefill_tok_s is not None]
    dec = [r.server_decode_tok_s for r in timed if r.server_decode_tok_s is not None]
    return {"requests": len(timed), "prefill_tok_s_median": statistics.median(pre) if pre else None,
            "decode_tok_s_median": statistics.median(dec) if dec else None,
            "cache_tokens": sum(r.server_timings.get("cache_n") or 0 for r in timed)}


def judge(cell_results: list, delta: prom.CounterDelta | None, before: prom.Counters | None,
          target: int) -> list[str]:
    """The reasons a cell is invalid (empty list = valid)."""
    flags = []
    failed = [r for r in cell_results if not r.ok]
    if failed:
        flags.append(f"{len(failed)} of {len(cell_results)} requests failed: {failed[0].error}")
    if delta is not None and delta.prefix_cache_hits is not None and delta.prefix_cache_queries:
        free = CACHE_HIT_FREE_TOKENS * len(cell_results)
        if delta.prefix_cache_hits > max(free, CACHE_HIT_LIMIT * delta.prefix_cache_queries):
            flags.append(f"cache hit: the prefix cache served {delta.prefix_cache_hits:,.0f} of "
                         f"{delta.prefix_cache_queries:,.0f} prompt tokens ({delta.prefix_cache_hit_rate:.0%})")
    if delta is not None and delta.requests_finished is not None and delta.requests_finished > len(cell_results):
        flags.append(f"other traffic: the server finished {delta.requests_finished:.0f} requests during the cell, "
                     f"the cell sent {len(cell_results)}")
    if before is not None and (before.requests_running or 0) + (before.requests_waiting or 0) > 0:
        flags.append(f"server busy at cell start: {before.requests_running or 0:.0f} running, "
                     f"{before.requests_waiting or 0:.0f} waiting")
    timing = stream_timing_flag(cell_results, delta)
    if timing:
        flags.append(timing)
    off = [r.prompt_tokens for r in cell_results if r.ok and r.prompt_tokens is not None
           and not prompt_tokens_ok(r.prompt_tokens, target)]
    if off:
        flags.append(f"prompt length off: server counted {off[0]} tokens for a {target}-token cell")
    return flags


def _prepare_out(out_dir: Path, profile: str) -> None:
    """Move the previous run's cells aside (``cells.prev``) so this run's table holds only its own cells."""
    cells = out_dir / profile / "cells"
    if cells.is_dir() and any(cells.iterdir()):
        prev = out_dir / profile / "cells.prev"
        shutil.rmtree(prev, ignore_errors=True)
        cells.rename(prev)


def run_bench(ns: argparse.Namespace) -> int:
    """Entry point of `ds4deploy bench run`. Returns 0 when every cell is valid, 1 when a cell is invalid."""
    recipe = load_recipe(ns.recipe)
    profile = load_profile(ns.profile)
    # Clock sweep: refused without --yes or without a GPU, before anything is sent or written.
    sweep_backend, sweep_gpus = clocks.preflight(profile.clock_sweep, getattr(ns, "yes", False))
    restore_locked = clocks.parse_locked(getattr(ns, "restore_locked_clocks", None))
    clocks.recover(clocks.open_backend)  # a sweep that died without restoring: restore first (and say so)
    cells = expand(profile, recipe)
    url = (ns.url or base_url(recipe.serving.bind_address, recipe.serving.port)).rstrip("/")
    key = read_key(recipe, ns.key_file)
    model = ns.model or recipe.model.served_name
    max_tokens = effective_max_tokens(profile, recipe)
    out_dir = Path(ns.out) if ns.out else RESULTS_DIR / "bench" / recipe.name
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    run_id = secrets.token_hex(4)
    salted = not ns.no_salt

    with ServerLock(url), httpx.Client(headers=headers, timeout=httpx.Timeout(ns.timeout, connect=30)) as client:
        check_server(client, url, model)
        counter = TokenCounter(client, url, model)
        first = cells[0]
        asyncio.run(probe(url, headers, build_payload(model, profile, recipe, max_tokens, first,
                                                      message_text(salt(run_id, 999999), "probe", "Say hi.")),
                          ns.timeout))
        _prepare_out(out_dir, profile.name)
        meta = {
            "profile": profile.name, "description": profile.description, "source": profile.source,
            "layout": profile.layout, "recipe": recipe.name, "run_id": run_id,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "server": url, "model": model,
            "host": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, Python "
                    f"{platform.python_version()})",
            "max_tokens": max_tokens, "temperature": profile.temperature, "top_p": profile.top_p,
            "ignore_eos": profile.ignore_eos, "requests_per_session": profile.requests_per_session,
            "salted": salted, "cells": [c.cell_id for c in cells],
        }
        gpu = telemetry.open_source()
        meta["telemetry"] = gpu[1]
        if sweep_backend is not None:
            meta["clock_sweep"] = profile.clock_sweep.model_dump()
        atomic_write_text(out_dir / profile.name / "run.json", json.dumps(meta, indent=1) + "\n")
        points: list[str] = []

        def measure(tag: str = "") -> list[dict]:
            points.append(tag)  # each clock point numbers its requests from its own block: no salt repeats
            return _measure(ns, profile, recipe, cells, client, counter, url, headers, model, max_tokens, run_id,
                            salted, out_dir, gpu=gpu, tag=tag, first_req=(len(points) - 1) * REQS_PER_POINT)

        stopped = None
        if sweep_backend is not None:
            if restore_locked is None:
                print("note: NVML cannot read a standing `nvidia-smi -lgc` lock; after the sweep the clocks are reset "
                      "to the driver default (pass --restore-locked-clocks MIN,MAX to restore a lock instead)")
            sweep = clocks.run_sweep(sweep_backend, sweep_gpus, profile.clock_sweep,
                                     lambda cap: measure(clocks.cap_tag(cap)), restore_locked=restore_locked)
            records, stopped = sweep.records, sweep.stopped
            meta["sweep_stopped"] = stopped
            atomic_write_text(out_dir / profile.name / "run.json", json.dumps(meta, indent=1) + "\n")
        else:
            records = measure()
    verdicts = compare(records, profile.name, recipe.expected)
    md = markdown(meta, records, verdicts)
    atomic_write_text(out_dir / f"{profile.name}.md", md)
    if not ns.no_plots:
        from ds4deploy.bench.plots import write_html, write_png, write_sweep_plots

        title = f"{recipe.name} / {profile.name}"
        if profile.clock_sweep is not None:
            write_sweep_plots(records, out_dir / profile.name, out_dir / f"{profile.name}.html", title)
        else:
            write_png(records, out_dir / profile.name, title)
            write_html(records, out_dir / f"{profile.name}.html", title)
    bad = [r for r in records if not r["valid"]]
    print(f"wrote {out_dir / (profile.name + '.md')} ({len(records)} cells, {len(bad)} invalid)")
    # What `ds4deploy estimate` predicted for each cell (docs/estimator.md); `estimate --calibrate` fits it to this run.
    from ds4deploy.plan.estimate import bench_lines

    print("\n".join(bench_lines(recipe, records, meta)))
    for r in bad:
        print(f"invalid: {r['cell_id']}: {'; '.join(r['flags'])}", file=sys.stderr)
    if stopped:
        print(f"the clock sweep stopped early: {stopped}", file=sys.stderr)
    return 1 if bad or stopped else 0


def _measure(ns, profile: Profile, recipe: Recipe, cells: list[CellSpec], client: httpx.Client,
             counter: TokenCounter, url: str, headers: dict, model: str, max_tokens: int, run_id: str,
             salted: bool, out_dir: Path, gpu: tuple = (None, telemetry.NO_GPU), tag: str = "",
             first_req: int = 0) -> list[dict]:
    """Warm up, then measure every cell with a progress bar; returns the cell records (also written to disk).
    `gpu` is `telemetry.open_source()`'s (source, description), sampled during each cell; `tag` is appended to
    every cell id (a clock-sweep point: ``-clk2000``); request numbers (the salt) start at `first_req`."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    per_cell = [c.concurrency * profile.requests_per_session for c in cells]
    fitted: dict[tuple, tuple[str, int]] = {}
    records: list[dict] = []
    req_no = first_req

    def text_for(cell: CellSpec, index: int) -> tuple[str, int]:
        k = (cell.content, cell.prompt_tokens, cell.thinking)
        if k not in fitted:
            fitted[k] = fit_context(counter, cell.content, cell.prompt_tokens, template_kwargs(recipe, cell), run_id,
                                    salted)
        ctx, n = fitted[k]
        ps = load_prompt_set(cell.content)
        return message_text(salt(run_id, index) if salted else None, ctx, ps.instruction), n

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), disable=ns.quiet)
    with progress:
        task = progress.add_task("warm-up", total=sum(per_cell) + profile.warmup_requests)
        timeout = ns.timeout
        for _ in range(profile.warmup_requests):
            text, _n = text_for(cells[0], req_no)
            req_no += 1
            body = build_payload(model, profile, recipe, max_tokens, cells[0], text)
            asyncio.run(_run(url, headers, timeout, [body], 1, None))
            progress.advance(task)
        for cell, n_req in zip(cells, per_cell, strict=True):
            progress.update(task, description=f"{cell.cell_id} (fitting prompt)")
            payloads = []
            first_salt = req_no  # request i of the cell carries salt index first_salt + i
            for _ in range(n_req):
                text, fitted_n = text_for(cell, req_no)
                req_no += 1
                payloads.append(build_payload(model, profile, recipe, max_tokens, cell, text))
            progress.update(task, description=cell.cell_id)
            before = prom.scrape(client, url)
            cpu0 = time.process_time()
            with telemetry.Sampler(*gpu) as tel:
                results, duration = asyncio.run(_run(url, headers, timeout, payloads, cell.concurrency,
                                                     lambda _r: progress.advance(task)))
            cpu = time.process_time() - cpu0
            after = prom.scrape(client, url)
            delta = prom.diff(before, after) if before is not None and after is not None else None
            summary = summarize(results, duration)
            flags = judge(results, delta, before, cell.prompt_tokens)
            tokens = summary["total_output_tokens"]
            record = {
                "schema": "ds4deploy-bench-cell/1",
                "cell_id": cell.cell_id + tag, "profile": profile.name, "recipe": recipe.name, "run_id": run_id,
                "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"), "backend": "openai-chat",
                "model_id": model, "server": url, "num_prompts": n_req, "max_concurrency": cell.concurrency,
                "request_rate": "inf",
                "spec": cell.model_dump(),
                "sampling": {"max_tokens": max_tokens, "temperature": profile.temperature, "top_p": profile.top_p,
                             "ignore_eos": profile.ignore_eos, "salted": salted},
                "prompt_tokens_target": cell.prompt_tokens, "prompt_tokens_fitted": fitted_n,
                **summary,
                "server_counters": delta.as_dict() if delta is not None else None,
                "server_timings": server_timings_summary(results),
                "telemetry": tel.cell_summary(summary["aggregate_tok_s"]),
                "harness_cpu_s": cpu,
                "harness_cpu_ms_per_1k_tokens": cpu * 1000 / (tokens / 1000) if tokens else None,
                "flags": flags, "valid": not flags,
                # salt_index: the "#NNNNNN" of the request's salt, so a packet capture can find it
                # (tools.benchval.wire); None when the run is unsalted
                "requests": [r.as_dict() | {"salt_index": first_salt + r.index if salted else None}
                             for r in results],
            }
            write_cell(out_dir, profile.name, record)
            records.append(record)
    return records


async def _run(url: str, headers: dict, timeout_s: float, payloads: list[dict], concurrency: int, on_done):
    """Send `payloads` with `concurrency` sessions over one aiohttp connection pool; (results, wall seconds)."""
    async with open_session(headers, timeout_s, concurrency) as session:
        return await run_closed_loop(payloads, concurrency, session, f"{url}/v1/chat/completions", on_done)


def list_profiles(_ns: argparse.Namespace) -> int:
    """Print the bundled profiles with their description and source."""
    from ds4deploy.bench.profiles import profile_names

    for name in profile_names():
        p = load_profile(name)
        print(f"{name:18s} {p.description} [{p.source}]")
    return 0
