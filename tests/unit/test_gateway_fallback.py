"""The gateway front door's fallback model (images/proxy/fallback.js, templates/gateway-front-door.conf.j2), in the
real nginx with the real njs module and the committed loopback gateway's rendered config (fallback office-other ->
office-tiny): its router upstream is a local server standing in for SMG's answers as they were seen from SMG 1.13.0
(docs/gateway.md, "Fallback model": 404 model_not_found, 500 call_upstream_connection_failed, a backend door's 502).
`ds4deploy gateway usage` counts the resent requests per person. The same path against the real router and
backends: tests/gateway/test_deployed.py::test_fallback_model_answers_while_its_backend_is_away.
"""

from __future__ import annotations

import http.server
import json
import time
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from ds4deploy.operate.gateway_usage import usage
from ds4deploy.render import gateway
from tests.support.gateway_door import door_before

KEY = "ds4p-" + "f" * 40
# What the stand-in router answers for office-other, by the request's x-test-answer header: SMG's own bodies.
FAILURES = {
    "404": (404, {"error": {"type": "invalid_request_error", "code": "model_not_found",
                            "message": "No worker available for model 'office-other'", "param": None}}),
    "500": (500, {"error": {"type": "server_error", "code": "call_upstream_connection_failed",
                            "message": "error sending request for url (http://127.0.0.1:18123/v1/chat/completions)",
                            "param": None}}),
    "502": (502, {"error": {"message": "the engine behind the front door is not answering", "type": "server_error",
                            "param": None, "code": "engine_unavailable"}}),
    "503": (503, {"error": {"type": "server_error", "code": "service_unavailable", "message": "unavailable",
                            "param": None}}),
    "504": (504, {"error": {"message": "the engine did not answer in time", "type": "server_error", "param": None,
                            "code": "engine_timeout"}}),
    "400": (400, {"error": {"message": "max_tokens is too large", "type": "invalid_request_error", "param": None,
                            "code": 400}}),
}


class Router(http.server.BaseHTTPRequestHandler):
    """office-tiny: 200 with the request's model and body echoed (as `echo`; an event stream when the request asks
    for one); office-other: the FAILURES answer its x-test-answer header names, else 200; any other model: SMG's
    404; a body that is not JSON: 400."""

    seen: ClassVar[list[dict]] = []  # the requests it got, in order
    keys: ClassVar[list[tuple]] = []  # (Authorization, X-Api-Key) of each
    server: ClassVar[http.server.ThreadingHTTPServer]  # set by the fixture

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            request = json.loads(raw)
        except ValueError:
            request = {}
        request = request if isinstance(request, dict) else {}
        Router.seen.append(request)
        Router.keys.append((self.headers.get("Authorization"), self.headers.get("X-Api-Key")))
        model = request.get("model")
        status, body = 200, {"model": model, "echo": request, "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
        if not request:
            status, body = 400, {"error": {"type": "invalid_request_error", "code": "invalid_json",
                                           "message": "Failed to parse the request body as JSON", "param": None}}
        elif model == "office-other" and self.headers.get("x-test-answer") in FAILURES:
            status, body = FAILURES[self.headers["x-test-answer"]]
        elif model not in ("office-tiny", "office-other"):
            status, body = 404, {"error": {"type": "invalid_request_error", "code": "model_not_found",
                                           "message": f"No worker available for model '{model}'", "param": None}}
        data = json.dumps(body).encode()
        stream = status == 200 and request.get("stream")
        if stream:
            data = b"data: " + data + b"\n\ndata: [DONE]\n\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def door(tmp_path: Path):
    """The loopback gateway's front door in the host's nginx, its router upstream the `Router` above: (URL, log)."""
    gw = gateway.load_gateway("loopback")
    assert gw.fallback == {"office-other": "office-tiny"}
    Router.seen.clear()
    Router.keys.clear()
    with door_before(gw, Router, {"alice": KEY}, tmp_path) as (url, log, server):
        Router.server = server
        yield url, log


def _post(url: str, path: str, body: dict, answer: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"} | ({"x-test-answer": answer} if answer else {})
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=30)


def _log(log: Path, n: int) -> list[dict]:
    deadline = time.monotonic() + 10
    while len(log.read_text().splitlines()) < n and time.monotonic() < deadline:
        time.sleep(0.2)  # the log is flushed every second (flush=1s)
    return [json.loads(x) for x in log.read_text().splitlines()]


@pytest.mark.parametrize("answer", ["404", "500", "502", "503", "504"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_failed_request_is_resent_under_the_fallback_name(door, answer, path) -> None:
    url, log = door
    body = {"model": "office-other", "max_tokens": 3, "seed": 7, "messages": [{"role": "user", "content": "é \"x\""}]}
    r = _post(url, path, body, answer)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "office-tiny"
    assert r.json()["echo"] == body | {"model": "office-tiny"}  # the rest of the body as it was sent
    assert [s["model"] for s in Router.seen] == ["office-other", "office-tiny"]
    # Both tries carry the gateway key (the door's), never the person's, in either header.
    assert Router.keys == [("Bearer ds4-" + "g" * 40, None)] * 2, Router.keys
    line = _log(log, 1)[-1]
    assert (line["status"], line["fallback"], line["person"], line["tokens_in"]) == (200, "office-tiny", "alice", "5")
    alice = usage(log.read_text().splitlines()).people["alice"]
    assert (alice.requests, alice.fell_back, alice.tokens_in) == (1, 1, 5)


def test_an_answer_of_the_first_model_is_passed_on(door) -> None:
    url, log = door
    r = _post(url, "/v1/completions", {"model": "office-other", "prompt": "hi"})
    assert r.status_code == 200 and r.json()["model"] == "office-other"
    bad = _post(url, "/v1/chat/completions", {"model": "office-other", "messages": []}, "400")
    assert (bad.status_code, bad.json()) == (400, FAILURES["400"][1])  # the engine's own error, not resent
    assert [s["model"] for s in Router.seen] == ["office-other", "office-other"]
    assert [x["fallback"] for x in _log(log, 2)] == ["", ""]
    assert usage(log.read_text().splitlines()).people["alice"].fell_back == 0


def test_a_model_without_fallback_gets_the_routers_answer(door) -> None:
    url, _ = door
    for model in ("nosuch", "office-tiny"):
        r = _post(url, "/v1/chat/completions", {"model": model, "messages": []}, "404")
        assert r.status_code == (404 if model == "nosuch" else 200), r.text
    assert _post(url, "/v1/chat/completions", {"model": "nosuch"}).json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{url}/v1/chat/completions", content=b"not json", headers={"Authorization": f"Bearer {KEY}"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")  # the router's answer, passed on
    assert [s.get("model") for s in Router.seen] == ["nosuch", "office-tiny", "nosuch", None]


def test_a_large_body_falls_back_whole_and_odd_bodies_go_as_they_are(door) -> None:
    """A body above the server's 1 MiB buffer is read in memory on the fallback routes and resent whole; bodies
    that name no model with a fallback (empty, a JSON array, null) reach the router as sent, once."""
    url, _ = door
    long = {"model": "office-other", "messages": [{"role": "user", "content": "x" * (3 << 20)}]}
    r = _post(url, "/v1/chat/completions", long, "404")
    assert r.status_code == 200 and r.json()["echo"] == long | {"model": "office-tiny"}
    Router.seen.clear()
    for raw in (b"", b"[1]", b"null", b'["office-other"]'):
        r = httpx.post(f"{url}/v1/chat/completions", content=raw, timeout=30,
                       headers={"Authorization": f"Bearer {KEY}", "x-test-answer": "404"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json"), (raw, r.text)
    assert Router.seen == [{}] * 4


def test_a_stream_of_the_fallback_is_passed_on(door) -> None:
    url, log = door
    with httpx.stream("POST", f"{url}/v1/messages", json={"model": "office-other", "stream": True},
                      headers={"x-api-key": KEY, "x-test-answer": "500"}, timeout=30) as r:
        events = r.read().split(b"\n\n")
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream", r.headers
    assert json.loads(events[0].removeprefix(b"data: "))["model"] == "office-tiny" and events[1] == b"data: [DONE]"
    assert _log(log, 1)[-1]["fallback"] == "office-tiny"


def test_the_router_down_is_the_doors_own_502(door) -> None:
    """No router at all: the first try and the resend both fail at the door, whose 502 is the gateway's JSON error
    of the route's API (not nginx's HTML page), as for a model without fallback."""
    url, _ = door
    Router.server.shutdown()
    Router.server.server_close()
    for path, model in (("/v1/chat/completions", "office-other"), ("/v1/chat/completions", "office-tiny"),
                        ("/v1/messages", "office-other")):
        r = _post(url, path, {"model": model})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["type"] == ("api_error" if path == "/v1/messages" else "server_error"), r.text
