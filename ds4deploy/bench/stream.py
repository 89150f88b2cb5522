"""One benchmark request, timed from the server-sent event (SSE) stream of ``/v1/chat/completions``.

Timing rules (per request, from the SSE stream; docs/bench-harness.md):

- TTFT: send -> first chunk that carries reasoning or content text. vLLM first sends a role-only frame
  (``{"delta": {"role": "assistant", "content": ""}}``, see tests/unit/fixtures/bench/vllm-0.32-cpu-chat-stream.sse);
  it carries no token and is never the first token. Reasoning models stream ``reasoning`` (vLLM >= 0.3x) or
  ``reasoning_content`` (older builds and forks) before ``content``; either counts (docs/sources.md#reasoning-stream).
- prefill tok/s: server-reported prompt tokens / TTFT.
- decode tok/s (one session): (completion tokens - 1) / (last token time - first token time), with the token count
  from the server's ``usage`` (``stream_options.include_usage``), never from counting chunks: a server may pack
  several tokens in one chunk (speculative decoding, a fast CPU model).
- end-to-end latency: send -> last token chunk (the trailing usage chunk carries no token; as in vLLM's bench).
- the server's own timings, where it sends them: llama-server puts a ``timings`` object (``prompt_n``,
  ``prompt_ms``, ``predicted_n``, ``predicted_ms``, ``cache_n``, rates per second; tools/server/server-common.cpp
  ``server_slot_stats::to_json`` at the pinned commit) on its last streamed chunk; kept per request as
  ``server_timings`` beside the client's figures. vLLM sends none (None).
- a request whose completion is longer than its ``max_tokens`` fails: the server ignored the limit
  (docs/sources.md#gx10-benchmark-method: one request reasoned for 2 h 45 min without it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import aiohttp


@dataclass
class RequestResult:
    """One request's measurements. Times in seconds (relative to the request's send time unless named otherwise),
    rates in tokens per second. `ok` False means `error` says why; timing fields may then be None."""

    index: int
    ok: bool = False
    error: str | None = None
    http_status: int | None = None
    start_s: float = 0.0  # time.perf_counter() at send
    ttft_s: float | None = None
    last_token_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_chars: int = 0
    content_chars: int = 0
    token_chunks: int = 0
    finish_reason: str | None = None
    output_sha256: str | None = None
    server_timings: dict | None = None  # llama-server's ``timings`` (ms, tokens, tok/s); None from vLLM

    @property
    def server_prefill_tok_s(self) -> float | None:
        """The server's own prompt rate in tok/s, as it reported it (llama-server: ``timings.prompt_per_second``,
        prompt tokens it processed, the cached ones not counted, over its prompt time); None without timings."""
        return (self.server_timings or {}).get("prompt_per_second")

    @property
    def server_decode_tok_s(self) -> float | None:
        """The server's own decode rate in tok/s, as it reported it (llama-server: ``timings.predicted_per_second``,
        1000 / ``predicted_per_token_ms``); None without timings."""
        return (self.server_timings or {}).get("predicted_per_second")

    @property
    def prefill_tok_s(self) -> float | None:
        """Prompt tokens / TTFT."""
        if self.prompt_tokens is None or not self.ttft_s:
            return None
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tok_s(self) -> float | None:
        """(completion tokens - 1) / (last - first token time); None for fewer than 2 tokens or one chunk."""
        if (self.completion_tokens is None or self.completion_tokens < 2 or self.ttft_s is None
                or self.last_token_s is None or self.last_token_s <= self.ttft_s):
            return None
        return (self.completion_tokens - 1) / (self.last_token_s - self.ttft_s)

    def as_dict(self) -> dict:
        """JSON-ready record, with the derived rates."""
        d = asdict(self)
        d.update(prefill_tok_s=self.prefill_tok_s, decode_tok_s=self.decode_tok_s,
                 server_prefill_tok_s=self.server_prefill_tok_s, server_decode_tok_s=self.server_decode_tok_s)
        return d


class StreamParser:
    """Feeds SSE lines with their arrival time into a `RequestResult`. Pure: no I/O, so it is tested on a captured
    stream. `now` is seconds since the request was sent."""

    def __init__(self, result: RequestResult, max_tokens: int | None) -> None:
        self.r = result
        self.max_tokens = max_tokens
        self.done = False
        self.digest = hashlib.sha256()

    def feed(self, line: str, now: float) -> None:
        """Consume one line of the stream (``data: {...}``, ``data: [DONE]``, blank, or an SSE comment)."""
        if not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            self.r.error = f"undecodable stream chunk: {payload[:200]}"
            return
        if not isinstance(data, dict):
            self.r.error = f"stream chunk is not a JSON object: {payload[:200]}"
            return
        if "error" in data and not data.get("choices"):
            err = data["error"]
            self.r.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
            content = delta.get("content") or ""
            if reasoning or content:
                if self.r.ttft_s is None:
                    self.r.ttft_s = now
                self.r.last_token_s = now
                self.r.token_chunks += 1
                self.r.reasoning_chars += len(reasoning)
                self.r.content_chars += len(content)
                self.digest.update((reasoning + content).encode())
            if choice.get("finish_reason"):
                self.r.finish_reason = choice["finish_reason"]
        timings = data.get("timings")
        if isinstance(timings, dict):
            self.r.server_timings = timings
        usage = data.get("usage")
        if usage:
            self.r.prompt_tokens = usage.get("prompt_tokens")
            self.r.completion_tokens = usage.get("completion_tokens")

    def finish(self, now: float) -> RequestResult:
        """Close the record: decide ok/error and set e2e latency (to the last token chunk, else to `now`)."""
        r = self.r
        r.e2e_s = r.last_token_s if r.last_token_s is not None else now
        r.output_sha256 = self.digest.hexdigest()
        if r.error is None:
            if r.ttft_s is None:
                r.error = "the stream carried no reasoning or content token"
            elif r.completion_tokens is None:
                r.error = "the stream carried no usage (stream_options.include_usage ignored by the server)"
            elif self.max_tokens is not None and r.completion_tokens > self.max_tokens:
                r.error = (f"the server ignored max_tokens: {r.completion_tokens} completion tokens for "
                           f"max_tokens={self.max_tokens}")
        r.ok = r.error is None
        return r


def error_text(resp_body: bytes, status: int) -> str:
    """The server's error message from a non-200 body (OpenAI ``{"error": {"message"}}`` or vLLM
    ``{"message"}``), else the body's start."""
    try:
        data = json.loads(resp_body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"HTTP {status}: {resp_body[:300].decode(errors='replace')}"
    if isinstance(data, dict):
        err = data.get("error", data)
        msg = err.get("message") if isinstance(err, dict) else str(err)
        if msg:
            return f"HTTP {status}: {msg}"
    return f"HTTP {status}: {str(data)[:300]}"


async def stream_request(session: aiohttp.ClientSession, url: str, payload: dict, index: int) -> RequestResult:
    """POST `payload` (``stream: true``) to `url` and time the stream. Never raises for server or network
    failures: they come back as ``ok=False`` with the error text.

    aiohttp, as in vLLM's own benchmark: its C HTTP parser costs the client 8-9 us of CPU per streamed token where
    httpx took 21 us (12 streams x 512 tokens on the 2-core CI host, docs/bench-harness.md); on a host where the
    client shares cores with the engine, that is throughput taken from the server under test."""
    result = RequestResult(index=index)
    parser = StreamParser(result, payload.get("max_tokens"))
    return parser.finish(await feed_stream(session, url, payload, result, parser))


async def feed_stream(session: aiohttp.ClientSession, url: str, payload: dict, result: RequestResult,
                      parser: StreamParser) -> float:
    """POST `payload` to `url` and feed every streamed line to `parser` with its time since the send.

    Sets ``result.start_s`` (perf_counter at the send) and ``result.http_status``; a non-200 answer or a broken
    stream lands in ``result.error``. Returns seconds since the send.

    The body is read as it arrives (``iter_any``) and split into lines here, every line of one read stamped with
    that read's arrival time (as ``vllm bench serve`` does): tokens that reached the client together get the same
    time instead of microseconds apart, so a burst shows as such (`ds4deploy.bench.run.stream_timing_flag`). One
    await per read instead of one per line did not measurably change the client's CPU per 1,000 tokens (41 vs 47
    ms, within the spread of runs; docs/bench-harness.md). A line may be any length and split across reads."""
    t0 = time.perf_counter()
    result.start_s = t0
    try:
        async with session.post(url, json=payload) as resp:
            result.http_status = resp.status
            if resp.status != 200:
                result.error = error_text(await resp.read(), resp.status)
            else:
                pending = b""
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter() - t0
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        parser.feed(line.decode("utf-8", errors="replace"), now)
                if pending:
                    parser.feed(pending.decode("utf-8", errors="replace"), time.perf_counter() - t0)
    except (aiohttp.ClientError, TimeoutError) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return time.perf_counter() - t0


def open_session(headers: dict, timeout_s: float, concurrency: int, **kw) -> aiohttp.ClientSession:
    """The harness's HTTP client: one keep-alive connection pool sized for `concurrency` sessions (+4 for probes),
    a `timeout_s` limit on each wait for the next response bytes (must exceed the longest TTFT), 30 s to connect,
    no total limit. `kw` goes to ``aiohttp.ClientSession`` (e.g. trace_configs)."""
    return aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=concurrency + 4),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s), **kw)


async def run_closed_loop(payloads: list[dict], concurrency: int, session: aiohttp.ClientSession, url: str,
                          on_done: Callable[[RequestResult], Awaitable[None] | None] | None = None,
                          ) -> tuple[list[RequestResult], float]:
    """Send `payloads` with at most `concurrency` in flight (each session sends its next request when the previous
    finishes, like ``vllm bench serve --max-concurrency``). Returns the results in payload order and the wall time
    from the first send to the last finish, seconds."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(payloads)):
        queue.put_nowait(i)
    results: list[RequestResult | None] = [None] * len(payloads)

    async def one_session() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            r = await stream_request(session, url, payloads[i], i)
            results[i] = r
            if on_done is not None:
                maybe = on_done(r)
                if asyncio.iscoroutine(maybe):
                    await maybe

    t0 = time.perf_counter()
    await asyncio.gather(*(one_session() for _ in range(max(1, min(concurrency, len(payloads))))))
    return [r for r in results if r is not None], time.perf_counter() - t0
