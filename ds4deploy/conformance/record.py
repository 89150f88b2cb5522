"""`ds4deploy conformance record`: a recording proxy that captures the requests a real client sends.

Point an agent (Claude Code, an OpenAI-API coding client) at the proxy instead of the server; every request is
forwarded to the server unchanged and its answer streamed back unchanged, and each request is saved as one JSON
file (a `Shape`): method, path with query, the headers that shape the request (``anthropic-beta``,
``anthropic-version``, ...) and the body. Credentials never reach the file: every header that carries one
(`SECRET_HEADERS`, or any name containing key, token, secret, auth or cookie) is dropped. With ``--strip-text``
every prose string (system prompt, message text, tool descriptions) is replaced by filler text of the same length,
so a shape can be shared without its content while keeping its size.

The matrix replays saved shapes (`load_shapes`): the bundled ones under ds4deploy/data/agent_shapes/ and an
owner's own (``ds4deploy conformance <recipe> --shapes <dir>``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ds4deploy.core.errors import UserError

# The proxy's client session to the server, stored on the aiohttp application.
SERVER_SESSION = web.AppKey("server_session", aiohttp.ClientSession)
SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie"}
SECRET_WORDS = ("key", "token", "secret", "auth", "cookie")
# Headers kept in a shape: the ones that change how a server reads the request. Transport headers (host, length,
# encoding, connection) and client fingerprints (user-agent, x-stainless-*) are left out.
KEPT_HEADERS = re.compile(r"^(anthropic-(beta|version)|openai-beta|content-type)$")
# Hop-by-hop and length/encoding headers the proxy must not copy between its two connections (RFC 9110 7.6.1;
# aiohttp re-frames and decompresses the body).
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "content-length", "content-encoding", "host"}
# Body keys whose string values are prose or identify the user (Claude Code's metadata.user_id holds a device id and
# a session id): replaced by filler under --strip-text. Everything else (types, names, ids, schemas' structure,
# numbers) is kept.
PROSE_KEYS = {"text", "content", "description", "system", "thinking", "user_id"}


@dataclass
class Shape:
    """One recorded request.

    Attributes:
        name: file stem (for the report).
        path: request path with its query, e.g. ``/v1/messages?beta=true``.
        headers: the request headers kept (`KEPT_HEADERS`), never a credential.
        body: the JSON body.
    """

    name: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    method: str = "POST"

    def to_json(self) -> str:
        """The shape as the JSON text saved to disk."""
        return json.dumps({"method": self.method, "path": self.path, "headers": self.headers, "body": self.body},
                          indent=1, ensure_ascii=False) + "\n"


def is_secret_header(name: str) -> bool:
    """True for a header that may carry a credential (never saved)."""
    n = name.lower()
    return n in SECRET_HEADERS or any(w in n for w in SECRET_WORDS)


def kept_headers(headers: dict[str, str]) -> dict[str, str]:
    """The headers a shape keeps: `KEPT_HEADERS` minus anything secret, names lower-cased."""
    return {k.lower(): v for k, v in headers.items() if KEPT_HEADERS.match(k.lower()) and not is_secret_header(k)}


def _filler() -> str:
    return resources.files("ds4deploy.data").joinpath("corpus.txt").read_text(encoding="utf-8").replace("\n", " ")


def strip_text(body: Any, filler: str | None = None) -> Any:
    """`body` with every prose string (values under `PROSE_KEYS`, and strings in lists under them) replaced by
    filler of the same length, taken from the bundled corpus. Structure, names, ids and numbers stay."""
    filler = filler or _filler()
    cursor = itertools.count()

    def fill(n: int) -> str:
        start = (next(cursor) * 997) % len(filler)
        return (filler[start:] + filler)[:n] if n <= len(filler) else (filler * (n // len(filler) + 1))[:n]

    def walk(v: Any, prose: bool) -> Any:
        if isinstance(v, dict):
            return {k: walk(x, k in PROSE_KEYS and k != "type") for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, prose) for x in v]
        if isinstance(v, str) and prose:
            return fill(len(v))
        return v

    return walk(body, False)


def load_shape(path: Path) -> Shape:
    """Read one saved shape.

    Raises:
        UserError: the file is not a saved shape (unreadable, not JSON, no path or body).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Shape(path.stem, data["path"], data.get("headers", {}), data["body"], data.get("method", "POST"))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{path} is not a recorded request shape ({type(exc).__name__}: {exc})",
                        "pass --shapes a directory written by `ds4deploy conformance record`") from None


def load_shapes(extra: Path | None = None) -> list[Shape]:
    """The bundled coding-agent shapes (ds4deploy/data/agent_shapes/*.json), then the Messages-API shapes in
    `extra` (a directory of saved shapes; others, e.g. GET /v1/models, are not replayed)."""
    bundled = resources.files("ds4deploy.data").joinpath("agent_shapes")
    out = [load_shape(Path(str(p))) for p in sorted(bundled.iterdir(), key=lambda p: p.name)
           if p.name.endswith(".json")]
    if extra is not None:
        if not extra.is_dir():
            raise UserError(f"--shapes {extra} is not a directory", "pass the directory given to `record --out`")
        out += [s for s in map(load_shape, sorted(extra.glob("*.json")))
                if s.method == "POST" and s.path.split("?")[0] == "/v1/messages"]
    return out


class Recorder:
    """The proxy: forwards every request to `upstream`, streams the answer back, saves each request as a shape.

    Args:
        upstream: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        out_dir: where shapes are written, ``NNNN-<method>-<path>.json`` in arrival order.
        strip: replace prose by filler (`strip_text`) before saving.
    """

    def __init__(self, upstream: str, out_dir: Path, strip: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.out_dir = out_dir
        self.strip = strip
        self.count = 0
        self.saved: list[Path] = []

    def save(self, method: str, path_qs: str, headers: dict[str, str], raw: bytes) -> Path:
        """Write one request as a shape file; returns its path. A body that is not JSON is kept as text."""
        try:
            body: Any = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {"_raw": raw.decode(errors="replace")}
        if self.strip:
            body = strip_text(body)
        self.count += 1
        slug = re.sub(r"[^a-z0-9]+", "-", path_qs.split("?")[0].lower()).strip("-")
        path = self.out_dir / f"{self.count:04d}-{method.lower()}-{slug}.json"
        path.write_text(Shape(path.stem, path_qs, kept_headers(headers), body, method).to_json(), encoding="utf-8")
        self.saved.append(path)
        return path

    def app(self):
        """The aiohttp application (one catch-all route)."""

        async def on_startup(app):
            app[SERVER_SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=3600),
                                                  auto_decompress=False)

        async def on_cleanup(app):
            await app[SERVER_SESSION].close()

        async def forward(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            self.save(request.method, request.path_qs, dict(request.headers), raw)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            try:
                async with request.app[SERVER_SESSION].request(request.method, self.upstream + request.path_qs,
                                                         headers=headers, data=raw) as up:
                    resp = web.StreamResponse(status=up.status, headers={
                        k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS - {"content-encoding"}})
                    await resp.prepare(request)
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                    await resp.write_eof()
                    return resp
            except aiohttp.ClientError as exc:
                return web.json_response({"error": {"message": f"recorder: upstream {self.upstream} failed: {exc}"}},
                                         status=502)

        app = web.Application(client_max_size=64 * 1024**2)
        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        app.router.add_route("*", "/{tail:.*}", forward)
        return app


async def serve(recorder: Recorder, host: str, port: int, ready=None, stop: asyncio.Event | None = None) -> None:
    """Run the proxy on host:port until `stop` is set (forever when None). `ready(port)` is called once it
    listens (port 0 picks a free one).

    Raises:
        UserError: the address is taken or not available on this host.
    """
    runner = web.AppRunner(recorder.app())
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}",
                        "pick a free --listen port (e.g. 127.0.0.1:8099)") from None
    try:
        if ready is not None:
            ready(site._server.sockets[0].getsockname()[1])
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await runner.cleanup()


def run_record(ns) -> int:
    """Entry point of `ds4deploy conformance record`: the proxy on ``--listen`` in front of ``--url`` (default:
    the recipe's server), shapes written to ``--out``, until Ctrl-C. Returns 0.

    Raises:
        UserError: no upstream named, a bad --listen, or an --out that cannot be created.
    """
    from ds4deploy.core.net import base_url
    from ds4deploy.recipe.load import load_recipe

    if not ns.url and not ns.recipe_for_record:
        raise UserError("no server to forward to", "pass --url http://host:port (or --recipe <name>)")
    upstream = ns.url or None
    if upstream is None:
        r = load_recipe(ns.recipe_for_record)
        upstream = base_url(r.serving.bind_address, r.serving.port)
    host, _, port = (ns.listen or "").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--listen {ns.listen!r} is not host:port", "pass e.g. --listen 127.0.0.1:8099")
    out = Path(ns.out or "recorded")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {out}: {exc.strerror}", "pass --out a writable directory") from None
    rec = Recorder(upstream, out, strip=ns.strip_text)

    def ready(p: int) -> None:
        print(f"recording: http://{host}:{p} -> {upstream}; requests saved in {out}/ (credentials left out"
              f"{', text replaced by filler' if ns.strip_text else ''}); Ctrl-C stops", flush=True)

    try:
        asyncio.run(serve(rec, host, int(port), ready))
    except KeyboardInterrupt:
        pass
    print(f"{rec.count} request(s) saved in {out}/")
    return 0
