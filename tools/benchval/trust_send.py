"""Request by request in one process: each client's TTFT, decode rate, and time from starting its TTFT clock to
having the request on the wire.

Run by `tools.benchval.trust` with the engine venv's python (it needs ``vllm.benchmarks``), ``PYTHONPATH`` at the
repository::

    python -m tools.benchval.trust_send URL N PROMPT_FILE MODEL OUTPUT_TOKENS [CONCURRENCY]
    (API key in OPENAI_API_KEY; prints one JSON object: per client the medians, plus "run_id" and "requests",
    every measured request as {"client", "index", "ttft_ms"}; its salt is "[bench <run_id> #<index:06d>]", so a
    packet capture (`tools.benchval.wire`) can time the same request on the wire)

One process, one server, three clients taking turns request by request (one at a time, or in CONCURRENCY
sessions that each rotate over the clients, so every batch holds requests of all three): vLLM's own chat request
function (``vllm.benchmarks.lib.endpoint_request_func.async_request_openai_chat_completions``) in a session built
as ``vllm bench serve`` builds it (``trust_env=True``); the same function in the same session with
``trust_env=False``; and ``ds4deploy.bench.stream.stream_request`` in the harness's own session. An aiohttp trace
hook stamps the moment the request body is sent (one session only, where stamps pair with requests); each
client's own start stamp (vLLM's
``RequestFuncOutput.start_time``, our ``RequestResult.start_s``) is where its TTFT clock starts. The difference is
client time inside TTFT. Because the clients take turns request by request on the same server, the server's
drift between runs (the largest error of the whole-tool comparison on a shared host) cancels out.

Why it exists (docs/bench-harness.md): with ``trust_env=True`` aiohttp reads the proxy variables and looks for a
``.netrc`` file on every request (aiohttp 3.14 ``ClientSession._request``: ``netrc_from_env``,
``get_env_proxy_for_url``, each a hop through a thread pool), which vLLM's TTFT then includes: on the 2-core CI
host its send delay was 0.79-0.93 ms per request with them and 0.29-0.31 ms without (docs/bench-harness.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import sys
import time

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

from ds4deploy.bench.aggregate import vllm_decode_tok_s
from ds4deploy.bench.prompts import salt
from ds4deploy.bench.stream import open_session, stream_request

CLIENTS = ("vllm", "vllm_noenv", "ours")


def _session(kind: str, key: str, sent: list[float], concurrency: int) -> aiohttp.ClientSession:
    """The session each client uses: vLLM's as `vllm bench serve` makes it (serve.py, 0.32), ours the harness's own
    (`ds4deploy.bench.stream.open_session`); every one stamps the start of each request body's write into `sent`."""

    async def on_sent(_session, _ctx, _params) -> None:
        sent.append(time.perf_counter())

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(on_sent)
    if kind == "ours":
        return open_session({"Authorization": f"Bearer {key}"}, 3600.0, concurrency, trace_configs=[trace])
    conn = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, ttl_dns_cache=300, use_dns_cache=True,
                                keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
    return aiohttp.ClientSession(connector=conn, trust_env=kind == "vllm",
                                 timeout=aiohttp.ClientTimeout(total=6 * 60 * 60), trace_configs=[trace])


async def _one(kind: str, session: aiohttp.ClientSession, api: str, prompt: str, model: str,
               output_tokens: int) -> tuple[float, float, float | None]:
    """One request by client `kind`: (its clock start, perf_counter s; TTFT s; decode tok/s or None)."""
    if kind == "ours":
        payload = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": output_tokens,
                   "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        r = await stream_request(session, api, payload, 0)
        ok, start, ttft, decode = r.ok, r.start_s, r.ttft_s, r.decode_tok_s
    else:
        inp = RequestFuncInput(prompt=prompt, api_url=api, prompt_len=0, output_len=output_tokens, model=model,
                               ignore_eos=True, extra_body={"temperature": 0.0})
        out = await async_request_openai_chat_completions(inp, session)
        ok, start, ttft = out.success, out.start_time, out.ttft
        decode = vllm_decode_tok_s(out.output_tokens, out.latency, out.ttft)
    if not ok:
        raise SystemExit(f"a {kind} request failed")
    return start, ttft, decode


def _summary(got: dict[str, dict[str, list[float]]]) -> dict:
    out = {}
    for k, v in got.items():
        out[k] = {"n": len(v["ttft_ms"]), "ttft_ms_median": statistics.median(v["ttft_ms"]),
                  "decode_tok_s_median": statistics.median(v["decode"]) if v["decode"] else None}
        if v.get("send_ms"):
            out[k] |= {"send_ms_median": statistics.median(v["send_ms"]),
                       "send_ms_p90": statistics.quantiles(v["send_ms"], n=10)[-1]}
    return out


async def measure(url: str, key: str, n: int, text: str, model: str, output_tokens: int,
                  concurrency: int = 1) -> dict:
    """`n` requests per client, `output_tokens` each (ignore_eos); per client the median TTFT (ms) and median
    per-request decode rate (tok/s), and at one session also the median and p90 send delay (ms).

    One session: the clients take turns, one request at a time, after one unmeasured request each. `concurrency`
    sessions: each session rotates over the three clients request by request, starting at a different client, so
    every batch the server runs holds requests of all three (after one unmeasured round)."""
    api = f"{url}/v1/chat/completions"
    run = secrets.token_hex(4)
    sent: list[float] = []
    sessions = {k: _session(k, key, sent, concurrency) for k in CLIENTS}
    got: dict[str, dict[str, list[float]]] = {k: {"send_ms": [], "ttft_ms": [], "decode": []} for k in CLIENTS}
    records: list[dict] = []
    try:
        if concurrency == 1:
            for i in range(-1, n):
                for j, kind in enumerate(CLIENTS[i % 3:] + CLIENTS[:i % 3]):
                    count = (i + 1) * 3 + j + 1
                    start, ttft, decode = await _one(kind, sessions[kind], api, f"{salt(run, count)} {text}",
                                                     model, output_tokens)
                    # One stamp per request (aiohttp 3.14 sends a JSON body in one write; the hook fires at its
                    # start): anything else would pair this request with another one's stamp.
                    if len(sent) != count:
                        raise SystemExit(f"the send trace hook fired {len(sent)} times for {count} requests")
                    if i >= 0:
                        got[kind]["send_ms"].append((sent[-1] - start) * 1000)
                        got[kind]["ttft_ms"].append(ttft * 1000)
                        records.append({"client": kind, "index": count, "ttft_ms": ttft * 1000})
                        if decode is not None:
                            got[kind]["decode"].append(decode)
        else:
            rounds = -(-3 * n // concurrency)  # every client gets >= n measured requests over all sessions

            async def one_session(k: int) -> None:
                for i in range(-1, rounds):
                    kind = CLIENTS[(i + k) % 3]
                    index = k * 10000 + i + 1
                    _start, ttft, decode = await _one(kind, sessions[kind], api, f"{salt(run, index)} {text}",
                                                      model, output_tokens)
                    if i >= 0:
                        got[kind]["ttft_ms"].append(ttft * 1000)
                        records.append({"client": kind, "index": index, "ttft_ms": ttft * 1000})
                        if decode is not None:
                            got[kind]["decode"].append(decode)

            await asyncio.gather(*(one_session(k) for k in range(concurrency)))
    finally:
        for s in sessions.values():
            await s.close()
    return {**_summary(got), "run_id": run, "requests": records}


if __name__ == "__main__":
    url, n, prompt_file, model, out_tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    conc = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    if n < 2 or out_tokens < 2 or not 1 <= conc < 100:
        # below 100 sessions: the salt index (session * 10000 + request) keeps its 6 digits
        raise SystemExit("need at least 2 requests per client, 2 output tokens and 1-99 sessions")
    with open(prompt_file, encoding="utf-8") as f:
        res = asyncio.run(measure(url, os.environ.get("OPENAI_API_KEY", ""), n, f.read(), model, out_tokens, conc))
    print(json.dumps(res))
