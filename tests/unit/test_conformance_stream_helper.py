"""A streamed Anthropic answer without ``message_start`` (as llama-server at the pinned commit sometimes sends, seen
on the gateway's backends: the stream opens with content_block_start) is the case's fail with evidence, not a
traceback that ends the whole `ds4deploy conformance` run: the SDK's MessageStream asserts on it."""

from __future__ import annotations

import threading

from ds4deploy.conformance import cases
from ds4deploy.conformance.runner import run_case

# The event sequence llama-server sent in the failing streams (tests/gateway, 2026-12-02), without its message_start.
EVENTS = [
    ("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
    ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}'),
    ("content_block_stop", '{"type":"content_block_stop","index":0}'),
    ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
                      '"usage":{"output_tokens":1}}'),
    ("message_stop", '{"type":"message_stop"}'),
]


def _serve() -> tuple[str, callable]:
    """A real HTTP server on 127.0.0.1 answering POST /v1/messages with `EVENTS` as SSE; returns (base URL, stop)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            body = "".join(f"event: {e}\ndata: {d}\n\n" for e, d in EVENTS).encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv.shutdown


def test_a_stream_without_message_start_is_a_failed_row():
    url, stop = _serve()
    ctx = cases.Context(url=url, key="k" * 32, model="m", max_model_len=None, thinking_kwargs=[], bind_loopback=None,
                        bind_source="test", timeout_s=10)
    try:
        case = next(c for c in cases.CASES if c.name == "messages.text")
        mode = next(m for m in case.modes if m.stream)
        row = run_case(ctx, case, mode)
    finally:
        ctx.close()
        stop()
    assert row["verdict"] == cases.FAIL and "no message_start" in row["evidence"], row
