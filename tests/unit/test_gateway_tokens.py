"""The gateway front door's token counts (images/proxy/usage.js), in the real nginx with the real njs module and the
committed office gateway's rendered config: its router upstream is a local server that answers with real captured
vLLM answers (tests/unit/fixtures/conformance), cut into 7-byte pieces so that field names and counts arrive split
across the body filter's buffers. The access log's tokens_in / tokens_out must be the answers' own usage, and
`ds4deploy.operate.gateway_usage` must sum them per person. The same path against real backends is
tests/gateway/test_deployed.py::test_log_and_usage_add_up.
"""

from __future__ import annotations

import http.server
import json
import time
from pathlib import Path

import httpx
import pytest

from ds4deploy.operate.gateway_usage import usage
from ds4deploy.render import gateway
from tests.support.gateway_door import door_before

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "unit" / "fixtures" / "conformance"
KEY = "ds4p-" + "t" * 40

# A whole chat answer (vLLM 0.32, usage 474 prompt / 117 generated tokens).
WHOLE = (FIXTURES / "chat-args-nested.json").read_bytes()
# A streamed Messages answer (vLLM 0.32): message_start says 357 input tokens, message_delta 13 output tokens.
STREAM = b"".join(f"event: {json.loads(x)['type']}\ndata: {x}\n\n".encode()
                  for x in (FIXTURES / "messages-tool-use-stream.jsonl").read_text().splitlines())
# The whole answer with a usage field's name where it is no count: in generated text (JSON escapes its quotes) and
# as the key of an object outside "usage" (as a tool call's input object in a whole Anthropic answer).
QUOTED = WHOLE.replace(b'"content": ""', b'"content": "{\\"completion_tokens\\": 99999}", '
                                       b'"input": {"completion_tokens": 99999, "usage": {"prompt_tokens": 99999}}', 1)
# path -> (answer, tokens_in and tokens_out the log must show, bytes per piece: 3 cuts "usage" over three buffers)
ANSWERS = {
    "/v1/chat/completions": (WHOLE, "474", "117", 3),
    "/v1/messages": (STREAM, "357", "13", 7),
    "/v1/messages/count_tokens": (b'{"input_tokens":357}', "", "", 7),  # a prompt counted, nothing served
    "/v1/completions": (QUOTED, "474", "117", 7),
}
# The streamed answer sent in two parts 1.5 s apart, to see that the door passes the first part on at once.
PAUSE_S = 1.5


class Router(http.server.BaseHTTPRequestHandler):
    """Answers POST <path> with `ANSWERS[path]`'s body, 7 bytes at a time (HTTP/1.0: the body ends at close)."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        body, _, _, piece = ANSWERS[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if body is STREAM else "application/json")
        self.end_headers()
        if request.get("pause"):
            first = body.index(b"\n\n") + 2
            self.wfile.write(body[:first])
            self.wfile.flush()
            time.sleep(PAUSE_S)
            self.wfile.write(body[first:])
            return
        for i in range(0, len(body), piece):
            self.wfile.write(body[i:i + piece])
            self.wfile.flush()
            time.sleep(0.003)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def door(tmp_path: Path):
    """The office gateway's front door in the host's nginx, its router upstream the `Router` above: (URL, log)."""
    with door_before(gateway.load_gateway("office"), Router, {"alice": KEY}, tmp_path) as (url, log, _):
        yield url, log


def test_the_log_carries_the_answers_token_counts(door) -> None:
    url, log = door
    for path, (body, _, _, _) in ANSWERS.items():
        r = httpx.post(f"{url}{path}", json={"model": "ds4-tiny"}, headers={"x-api-key": KEY}, timeout=30)
        assert r.status_code == 200 and r.content == body  # passed on unchanged
    assert QUOTED.count(b"99999") == 3
    deadline = time.monotonic() + 10
    while len(log.read_text().splitlines()) < len(ANSWERS) and time.monotonic() < deadline:
        time.sleep(0.2)  # the log is flushed every second (flush=1s)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    got = {x["path"]: (x["tokens_in"], x["tokens_out"]) for x in lines}
    assert got == {path: (tin, tout) for path, (_, tin, tout, _) in ANSWERS.items()}, lines
    alice = usage(log.read_text().splitlines()).people["alice"]
    assert (alice.tokens_in, alice.tokens_out, alice.without_tokens) == (474 + 357 + 474, 117 + 13 + 117, 1)


def test_a_stream_is_passed_on_as_it_comes(door) -> None:
    """The body filter holds nothing back: the first event of a stream reaches the client while the router is still
    pausing before the rest, and the counts are read all the same."""
    url, log = door
    t0 = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/messages", json={"pause": True}, headers={"x-api-key": KEY},
                      timeout=30) as r:
        chunks = r.iter_bytes()
        first = next(chunks)
        first_s = time.monotonic() - t0
        rest = b"".join(chunks)
    assert first_s < PAUSE_S / 2 and (first + rest) == STREAM, first_s
    deadline = time.monotonic() + 10
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    line = json.loads(log.read_text().splitlines()[-1])
    assert (line["tokens_in"], line["tokens_out"]) == ("357", "13"), line
