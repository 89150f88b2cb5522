"""Drain a backend out of a running gateway and let it rejoin, through SMG's control plane (docs/gateway.md).

The router (SMG, 127.0.0.1:<router_port> on the gateway host) keeps its pool of workers behind its worker API
(SMG's docs/reference/api/admin.md, "Worker Management"; the request and answer shapes are SMG's
``crates/protocols/src/worker.rs``, ``WorkerSpec`` and ``WorkerInfo``):

- ``GET /workers``: ``{"workers": [{"id", "url", "status", "is_healthy", "load", ...}], ...}``;
- ``DELETE /workers/<id>``: 202; the worker turns ``draining`` (no new request is routed to it, the requests it
  is answering go on) and leaves the pool a few seconds later (``drain_settle_secs``, 5 s by default);
- ``POST /workers`` with ``{"url", "api_key"}``: 202; SMG runs the same registration as for a worker named at
  start (probe, model discovery with that key, then ``ready``). Without ``api_key`` the worker is registered
  keyless and a backend that requires a key never becomes ready: the gateway key goes in the body.

Each call carries the gateway key as ``Authorization: Bearer`` (the control plane takes the router's own
``--api-key`` when no control-plane key is configured). The key is read from the gateway's key file
(`GatewayRecipe.key_file`) and never printed. Sessions pinned to a drained backend have their next turn routed to
another ready backend of the same model (sticky sessions re-pin on a worker that is gone); sessions moved off it
stay where they are after it rejoins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ds4deploy.core.errors import UserError
from ds4deploy.operate.key_file import read_key_line
from ds4deploy.recipe.schema import GatewayRecipe
from ds4deploy.render.gateway import Backend, project_name, render_root, resolve_backends

# Seconds to wait for one answer of the router's control plane or of a backend (all are on a LAN or loopback).
HTTP_TIMEOUT_S = 10.0
# Seconds `drain` waits for the worker to leave the ready set: SMG applies a removal as a background job, which
# flips the worker to draining within a poll or two.
DRAIN_WAIT_S = 15.0
# Seconds `rejoin` waits for a draining worker to leave the pool before adding it again (SMG's drain_settle_secs
# default is 5 s, crates/protocols/src/worker.rs) and then for the registration to make it ready (probe, model
# discovery and activation: about a second on a LAN; SMG gives up after max_connection_attempts, 20 by default).
REJOIN_WAIT_S = 60.0
POLL_S = 0.25


@dataclass(frozen=True)
class Worker:
    """One worker of the router's pool (`GET /workers`): its id, URL and status (``ready``, ``pending``,
    ``not_ready``, ``failed``, ``draining``)."""

    id: str
    url: str
    status: str


def read_gateway_key(gw: GatewayRecipe) -> str:
    """The gateway key (``VLLM_API_KEY=`` of `GatewayRecipe.key_file`, mode 0600) the router holds.

    Raises:
        UserError: the file is missing, unreadable, readable by others, or has no VLLM_API_KEY line.
    """
    return read_key_line(Path(gw.key_file), "the gateway key file",
                         "run on the gateway host as the key file's owner (sudo)",
                         "the gateway key file holds one VLLM_API_KEY=<key> line: the key the router started with")


def find_backend(gw: GatewayRecipe, name: str) -> Backend:
    """The backend `name` of the gateway recipe (its URL as the router knows it, its model names).

    Raises:
        UserError: the gateway does not route with SMG; no backend of that name (the message lists the recipe's
            backends).
    """
    if gw.routing.router != "smg":
        raise UserError(f"gateway '{gw.name}' routes with {gw.routing.router}, which has no control plane to drain "
                        "a backend from", "stop the backend (its sessions move to the others and come back when it "
                        "returns: docs/gateway.md), or route with smg")
    backends = resolve_backends(gw)
    for b in backends:
        if b.name == name:
            return b
    where = gw._source or f"recipes/gateways/{gw.name}.yaml"
    raise UserError(f"gateway '{gw.name}' has no backend '{name}' (its backends: "
                    f"{', '.join(b.name for b in backends)})",
                    f"name one of the backends of {where}")


class Router:
    """The router's control plane on this host, with the gateway key.

    Raises (every method):
        UserError: the router does not answer (the gateway is not running here), refuses the key, or answers
            something else than the worker API (its status and the start of its answer).
    """

    def __init__(self, gw: GatewayRecipe, key: str, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.gw = gw
        self.url = f"http://127.0.0.1:{gw.router_port}"
        self._headers = {"authorization": f"Bearer {key}"}
        self._timeout = timeout_s

    def _call(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        compose = render_root() / self.gw.name / "compose.yaml"
        try:
            r = httpx.request(method, self.url + path, json=body, headers=self._headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise UserError(f"the router of gateway '{self.gw.name}' does not answer at {self.url} "
                            f"({type(exc).__name__}: {exc}); is the gateway running on this host?",
                            f"run this on the gateway host while the gateway runs (`docker compose -f {compose} "
                            f"ps` lists {project_name(self.gw)}-router; `docker compose -f {compose} up -d` "
                            "starts it)") from None
        if r.status_code in (401, 403):
            raise UserError(f"the router of gateway '{self.gw.name}' refuses the key of {self.gw.key_file} "
                            f"(HTTP {r.status_code})",
                            "the key file must hold the key the router started with: restore it, or restart the "
                            "gateway so that the router reads the file again")
        return r

    def workers(self) -> list[Worker]:
        """The router's pool (`GET /workers`)."""
        r = self._call("GET", "/workers")
        try:
            items = r.json()["workers"] if r.status_code == 200 else None
            return [Worker(str(w["id"]), str(w["url"]).rstrip("/"), str(w.get("status") or
                                                                       ("ready" if w.get("is_healthy") else
                                                                        "not_ready")))
                    for w in items]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"the router at {self.url} answered GET /workers with HTTP {r.status_code}: "
                            f"{r.text[:200]!r}, not SMG's worker list",
                            f"is {self.url} the router of gateway '{self.gw.name}' (router_port)?") from None

    def worker(self, url: str) -> Worker | None:
        """The worker of `url` in the pool, or None."""
        return next((w for w in self.workers() if w.url == url.rstrip("/")), None)

    def remove(self, worker: Worker) -> None:
        """``DELETE /workers/<id>`` (202: the removal is queued; the worker drains first)."""
        r = self._call("DELETE", f"/workers/{worker.id}")
        if r.status_code not in (200, 202, 204):
            raise UserError(f"the router refused to remove worker {worker.url}: HTTP {r.status_code} "
                            f"{r.text[:200]!r}", "check `GET /workers` on the router; nothing was changed")

    def add(self, url: str, key: str) -> None:
        """``POST /workers`` with the URL and the gateway key (202: registration queued).

        Raises:
            UserError: the router refuses (409: a worker of that URL is still in the pool).
        """
        r = self._call("POST", "/workers", {"url": url, "api_key": key})
        if r.status_code not in (200, 201, 202):
            raise UserError(f"the router refused to add worker {url}: HTTP {r.status_code} {r.text[:200]!r}",
                            "wait a few seconds (a drained worker stays in the pool while it drains) and run "
                            "rejoin again")


def _wait(done, timeout_s: float) -> bool:
    """Poll `done()` every POLL_S until it is true or `timeout_s` passed. Returns whether it became true."""
    end = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(POLL_S)


def drain(gw: GatewayRecipe, name: str, force: bool = False) -> str:
    """Take backend `name` out of the running gateway's pool: no new request and no session's next turn goes to
    it; the requests it is answering finish.

    Returns:
        A one-line report.
    Raises:
        UserError: unknown backend; no key or a refused one; the router not running; the backend not in the pool
            (drained already); the backend the last ready one of a model it serves that has no fallback (the
            recipe's ``fallback``), or whose fallback has no other ready backend (unless `force`), checked before
            anything changes.
    """
    backend = find_backend(gw, name)
    router = Router(gw, read_gateway_key(gw))
    pool = router.workers()
    mine = next((w for w in pool if w.url == backend.url), None)
    if mine is None or mine.status == "draining":
        why = ("draining out of it now" if mine else
               "drained already, or removed by the router after failing its health checks")
        raise UserError(f"backend '{name}' ({backend.url}) is not in the router's pool of gateway '{gw.name}' "
                        f"({why})",
                        f"`ds4deploy gateway rejoin {gw._source or gw.name} {name}` adds it back")
    ready_after = {w.url for w in pool if w.status == "ready" and w.url != backend.url}
    backends = resolve_backends(gw)

    def served(model: str) -> bool:
        return any(model in b.models and b.url in ready_after for b in backends)

    alone = sorted(m for m in backend.models if not served(m))
    # A model left without a backend whose fallback is served: its requests are answered under the fallback name.
    fallen = {m: gw.fallback[m] for m in alone if m in gw.fallback and served(gw.fallback[m])}
    unserved = [m for m in alone if m not in fallen]
    if unserved and not force:
        raise UserError(f"backend '{name}' is the only ready backend of {', '.join(unserved)}: draining it would "
                        "fail every request for that model; nothing was changed",
                        f"rejoin or start another backend of {', '.join(unserved)} first, or pass --force to "
                        "drain it anyway")
    router.remove(mine)
    if not _wait(lambda: (w := router.worker(backend.url)) is None or w.status != "ready", DRAIN_WAIT_S):
        raise UserError(f"the router accepted the removal of '{name}' ({backend.url}) but still lists it as ready "
                        f"after {DRAIN_WAIT_S:g} s", "check the router's log (`docker logs "
                        f"{project_name(gw)}-router`) and `GET /workers`")
    others = [b.name for b in backends if b.url in ready_after and set(b.models) & set(backend.models)]
    fallback = "".join(f"; {m} is answered as its fallback {f}" for m, f in sorted(fallen.items()))
    return (f"drained '{name}' ({backend.url}) from gateway '{gw.name}': no new request goes to it, its sessions' "
            f"next turns go to {', '.join(others) or 'no other backend'}{fallback}, requests it is answering finish; "
            f"`ds4deploy gateway rejoin {gw._source or gw.name} {name}` brings it back")


def _check_backend(backend: Backend, key: str) -> None:
    """The backend answers ``GET /v1/models`` with the gateway key and lists its model names, before the router
    is asked to add it (the router would retry in the background and say nothing).

    Raises:
        UserError: it does not answer, refuses the key, or does not serve its model names.
    """
    try:
        r = httpx.get(f"{backend.url}/v1/models", headers={"authorization": f"Bearer {key}"},
                      timeout=HTTP_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise UserError(f"backend '{backend.name}' does not answer at {backend.url} ({type(exc).__name__}: {exc}); "
                        "nothing was changed", "start it (or wait until it is healthy), then run rejoin again"
                        ) from None
    if r.status_code in (401, 403):
        raise UserError(f"backend '{backend.name}' ({backend.url}) refuses the gateway key (HTTP {r.status_code}); "
                        "nothing was changed", "its front door must accept the gateway key (docs/gateway.md, Keys)")
    try:
        served = {m["id"] for m in r.json()["data"]}
    except (ValueError, KeyError, TypeError):
        raise UserError(f"backend '{backend.name}' answered GET {backend.url}/v1/models with HTTP {r.status_code}, "
                        "not a model list; nothing was changed",
                        "check the backend serves the OpenAI API at that address") from None
    missing = sorted(set(backend.models) - served)
    if missing:
        raise UserError(f"backend '{backend.name}' ({backend.url}) does not serve {', '.join(missing)} (it serves "
                        f"{', '.join(sorted(served)) or 'nothing'}); nothing was changed",
                        "deploy the recipe the gateway recipe names on that host, or correct the gateway recipe")


def rejoin(gw: GatewayRecipe, name: str) -> str:
    """Add backend `name` back to the running gateway's pool and wait until the router routes to it.

    Returns:
        A one-line report.
    Raises:
        UserError: unknown backend; no key or a refused one; the router not running; the backend already ready in
            the pool; the backend not answering, refusing the gateway key or not serving its models (checked before
            the router is asked); the router not making it ready within REJOIN_WAIT_S.
    """
    backend = find_backend(gw, name)
    key = read_gateway_key(gw)
    router = Router(gw, key)
    mine = router.worker(backend.url)
    if mine is not None and mine.status != "draining":
        drain_cmd = f"`ds4deploy gateway drain {gw._source or gw.name} {name}`"
        raise UserError(f"backend '{name}' ({backend.url}) is in the router's pool already ({mine.status}); "
                        "nothing was changed",
                        f"to take it out: {drain_cmd}" if mine.status == "ready" else
                        f"the router keeps probing a backend that failed its health checks; to add it back now: "
                        f"{drain_cmd}, then rejoin")
    _check_backend(backend, key)
    t0 = time.monotonic()
    if mine is not None and not _wait(lambda: router.worker(backend.url) is None, REJOIN_WAIT_S):
        raise UserError(f"backend '{name}' is still draining out of the router's pool after {REJOIN_WAIT_S:g} s",
                        "wait, then run rejoin again")
    router.add(backend.url, key)
    state: list[Worker | None] = [None]

    def ready() -> bool:
        state[0] = router.worker(backend.url)
        return state[0] is not None and state[0].status == "ready"

    if not _wait(ready, REJOIN_WAIT_S):
        seen = state[0].status if state[0] else "not in the pool (its registration failed)"
        raise UserError(f"the router did not make backend '{name}' ({backend.url}) ready within {REJOIN_WAIT_S:g} s: "
                        f"{seen}", f"check the router's log (`docker logs {project_name(gw)}-router`), then run "
                        "rejoin again")
    return (f"rejoined '{name}' ({backend.url}) to gateway '{gw.name}' in {time.monotonic() - t0:.1f} s: new "
            "sessions may go to it (sessions moved off it stay on their new backend)")
