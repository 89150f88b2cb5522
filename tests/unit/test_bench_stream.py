"""Per-request timing from a real vLLM 0.32 SSE stream (fixtures/bench/README.md), replayed with chosen arrival
times so every timing rule is checked exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4deploy.bench.stream import RequestResult, StreamParser, error_text
from tests.unit.conftest import chat_server

FIX = Path(__file__).parent / "fixtures" / "bench"


def replay(name: str, max_tokens: int | None, drop=lambda line: False) -> RequestResult:
    """Feed the captured stream's lines; the k-th data line arrives at 0.1 + 0.01*k s."""
    p = StreamParser(RequestResult(index=0), max_tokens)
    k = 0
    for line in (FIX / name).read_text().splitlines():
        if drop(line):
            continue
        if line.startswith("data:"):
            k += 1
        p.feed(line, 0.1 + 0.01 * k)
    return p.finish(0.1 + 0.01 * (k + 1))


def stream_from(handler) -> RequestResult:
    """One request through `feed_stream` against a real aiohttp server on 127.0.0.1 answering with `handler`."""
    import asyncio

    import aiohttp

    from ds4deploy.bench.stream import feed_stream

    async def main() -> RequestResult:
        async with chat_server(handler) as (url, _port), aiohttp.ClientSession() as session:
            result = RequestResult(index=0)
            parser = StreamParser(result, 12)
            return parser.finish(await feed_stream(session, url, {"stream": True}, result, parser))

    return asyncio.run(main())


def test_role_only_frame_is_not_the_first_token():
    r = replay("vllm-0.32-cpu-chat-stream.sse", 12)
    assert r.ok, r.error
    # Line 1 is the role-only frame (content ""), line 2 the first token.
    assert r.ttft_s == pytest.approx(0.12)
    assert r.prompt_tokens == 1030 and r.completion_tokens == 12
    assert r.finish_reason == "length"
    assert r.token_chunks == 12
    # Last token chunk is data line 13 (the finish chunk also carries a token); usage (14) and [DONE] are not tokens.
    assert r.last_token_s == pytest.approx(0.23)
    assert r.e2e_s == pytest.approx(0.23)
    assert r.decode_tok_s == pytest.approx(11 / 0.11)
    assert r.prefill_tok_s == pytest.approx(1030 / 0.12)


def test_reasoning_tokens_count_for_ttft():
    r = replay("vllm-0.32-cpu-reasoning-stream.sse", 16)
    assert r.ok, r.error
    assert r.reasoning_chars > 0 and r.content_chars == 0
    assert r.ttft_s == pytest.approx(0.12)
    # ngram drafts packed 16 tokens into fewer chunks: decode counts usage tokens, not chunks.
    assert r.completion_tokens == 16 and r.token_chunks < 16
    assert r.decode_tok_s == pytest.approx(15 / (r.last_token_s - r.ttft_s))


def test_completion_longer_than_max_tokens_fails():
    r = replay("vllm-0.32-cpu-chat-stream.sse", 8)
    assert not r.ok and "ignored max_tokens" in r.error


def test_stream_without_usage_fails():
    r = replay("vllm-0.32-cpu-chat-stream.sse", 12, drop=lambda line: '"usage"' in line)
    assert not r.ok and "no usage" in r.error


def test_stream_of_only_the_role_frame_fails():
    r = replay("vllm-0.32-cpu-chat-stream.sse", 12, drop=lambda line: '"content":"\\n"' in line)
    assert not r.ok and "no reasoning or content token" in r.error
    assert r.decode_tok_s is None


def test_error_body_message_is_extracted():
    body = (FIX / "vllm-0.32-cpu-max-tokens-rejected.json").read_bytes()
    msg = error_text(body, 400)
    assert msg.startswith("HTTP 400: ")
    assert "max_tokens=4096 cannot be greater than max_model_len=2048" in msg
    assert error_text(b"<html>bad gateway</html>", 502) == "HTTP 502: <html>bad gateway</html>"


def test_stream_split_at_any_byte_over_real_http_gives_the_same_record():
    """feed_stream against a real aiohttp server that writes the captured stream in 7-byte pieces (lines, JSON and
    multi-byte UTF-8 split across reads), then a pause and a final event without tokens: every field matches the
    line-by-line replay, and the pause does not move the last token's time."""
    import asyncio

    from aiohttp import web


    body = (FIX / "vllm-0.32-cpu-chat-stream.sse").read_bytes() + "data: {\"choices\": [], \"x\": \"é\"}\n\n".encode()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(body), 7):
            if i + 7 >= len(body):
                await asyncio.sleep(0.2)
            await resp.write(body[i:i + 7])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    got = stream_from(handler)
    want = replay("vllm-0.32-cpu-chat-stream.sse", 12)
    assert got.ok, got.error
    for field in ("prompt_tokens", "completion_tokens", "token_chunks", "content_chars", "reasoning_chars",
                  "finish_reason", "output_sha256"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.http_status == 200 and got.ttft_s < got.last_token_s < 0.2


def test_a_chunk_that_is_json_but_not_an_object_fails_the_request_cleanly():
    for line in ("data: 5", "data: [1, 2]", 'data: "x"'):
        p = StreamParser(RequestResult(index=0), 12)
        p.feed(line, 0.1)
        r = p.finish(0.2)
        assert not r.ok and r.error.startswith("stream chunk is not a JSON object"), line


def test_tokens_are_timed_when_they_arrive_not_when_the_stream_ends():
    """A real aiohttp server sends the captured stream one SSE event at a time, 20 ms apart: the client's first and
    last token times are at least the server's pacing apart (a client that buffered the body, or timed tokens
    at parse time after the fact, would see them together), and each token frame is its own chunk."""
    import asyncio

    from aiohttp import web


    events = [e + b"\n\n" for e in (FIX / "vllm-0.32-cpu-chat-stream.sse").read_bytes().split(b"\n\n") if e.strip()]
    gap = 0.02

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
            await asyncio.sleep(gap)
        await resp.write_eof()
        return resp

    got = stream_from(handler)
    assert got.ok, got.error
    # Token frames are events 2..13 (event 1 is the role-only frame): 11 gaps between the first and last token.
    assert got.token_chunks == 12 and got.completion_tokens == 12
    assert got.last_token_s - got.ttft_s >= 11 * gap * 0.9
    assert got.ttft_s >= gap * 0.9  # the role-only frame came first, one gap earlier


def test_llama_server_stream_usage_and_its_own_timings():
    """A real llama-server stream (llama.cpp 0c1e570, the cpu-llamacpp image, 8 tokens): usage from its trailing
    chunk, and its own ``timings`` (prompt and decode rates as it reported them) kept beside the client's."""
    r = replay("llamacpp-0c1e570-cpu-chat-stream.sse", 8)
    assert r.ok, r.error
    assert r.prompt_tokens == 15 and r.completion_tokens == 8
    assert r.server_timings["prompt_n"] == 15 and r.server_timings["predicted_n"] == 8
    assert r.server_prefill_tok_s == pytest.approx(285.90488897360143)
    assert r.server_decode_tok_s == pytest.approx(190.91776898949954)
    d = r.as_dict()
    assert d["server_decode_tok_s"] == r.server_decode_tok_s and d["server_timings"]["prompt_ms"] == 52.465


def test_vllm_stream_has_no_server_timings():
    r = replay("vllm-0.32-cpu-chat-stream.sse", 12)
    assert r.server_timings is None and r.server_decode_tok_s is None and r.server_prefill_tok_s is None
