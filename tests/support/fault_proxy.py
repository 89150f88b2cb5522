"""A real HTTP proxy in front of a server that plants one fault in tool-call arguments, for the tests that prove the
conformance matrix catches it.

Faults (`FAULTS`):
- ``drop``: a streamed answer loses its second argument fragment (OpenAI ``delta.tool_calls[].function.arguments``,
  Anthropic ``input_json_delta``);
- ``dup``: that fragment is sent twice;
- ``wrap``: a non-streamed answer's first object or array argument becomes a JSON string holding it (the
  re-encoding a broken chat encoder does: ``{"config": {...}}`` -> ``{"config": "{...}"}``).

Everything else passes unchanged. The proxy runs in a thread of its own on a free loopback port.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import ClientSession, web

FAULTS = ("drop", "dup", "wrap")


def _is_fragment(data: bytes) -> bool:
    """Whether an SSE ``data:`` line carries a non-empty argument fragment."""
    try:
        ev = json.loads(data)
    except ValueError:
        return False
    if ev.get("type") == "content_block_delta":
        return ev.get("delta", {}).get("type") == "input_json_delta" and bool(ev["delta"].get("partial_json"))
    for ch in ev.get("choices") or []:
        for tc in (ch.get("delta") or {}).get("tool_calls") or []:
            if (tc.get("function") or {}).get("arguments"):
                return True
    return False


def _wrap_first_container(args: dict) -> bool:
    for k, v in args.items():
        if isinstance(v, dict | list):
            args[k] = json.dumps(v)
            return True
    return False


def wrap_arguments(body: dict) -> dict:
    """`body` (a chat completion or a Messages answer) with its first object/array argument turned into a string."""
    for ch in body.get("choices") or []:
        for tc in (ch.get("message") or {}).get("tool_calls") or []:
            args = json.loads(tc["function"]["arguments"])
            if isinstance(args, dict) and _wrap_first_container(args):
                tc["function"]["arguments"] = json.dumps(args)
                return body
    for block in body.get("content") or []:
        if block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
            if _wrap_first_container(block["input"]):
                return body
    return body


@contextmanager
def fault_proxy(upstream: str, fault: str) -> Iterator[str]:
    """The proxy in front of `upstream` planting `fault` (one of `FAULTS`); yields its base URL."""
    assert fault in FAULTS, fault

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("authorization", "content-type", "x-api-key", "anthropic-version")}
        async with ClientSession() as s, s.request(request.method, upstream + request.path_qs, headers=headers,
                                                   data=await request.read()) as up:
            kind = up.headers.get("Content-Type", "application/json")
            if not kind.startswith("text/event-stream"):
                raw = await up.read()
                if fault == "wrap" and up.status == 200 and kind.startswith("application/json"):
                    raw = json.dumps(wrap_arguments(json.loads(raw))).encode()
                return web.Response(status=up.status, body=raw, headers={"Content-Type": kind})
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
            await resp.prepare(request)
            seen = 0
            async for line in up.content:
                if line.startswith(b"data:") and _is_fragment(line[5:].strip()):
                    seen += 1
                    if seen == 2 and fault == "drop":
                        await resp.write(b"\n")  # keep the event framing; the event itself is gone
                        continue
                    if seen == 2 and fault == "dup":
                        await resp.write(line + b"\n")
                await resp.write(line)
            await resp.write_eof()
            return resp

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", forward)
    with serve_in_thread(app) as url:
        yield url


@contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Serve the aiohttp `app` on a free loopback port from its own event loop in a daemon thread; yields its base
    URL (``http://127.0.0.1:<port>``) and cleans the app up and stops the loop on exit."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(timeout=30)
