"""The nginx router (``routing.router: nginx``) in front of real backends (`make e2e-gateway`; not in `make test`).

Backends ``a`` and ``b`` of tools/gateway_rig.py (llama-server behind the cpu-llamacpp recipe's rendered front
door, each accepting its own key and the gateway's) serve ``office-tiny``. A gateway recipe with router nginx names
them by URL; its render (the stacks' front door image alone, routing by itself) is started with `docker compose`
(`tools.gateway_rig.gateway_up`).

Proven here: every turn of a session on one backend with both backends used (consistent hashing on the session
header), the gateway key presented to the backends (a person's key would be refused there), streams delivered as
events, a killed backend's sessions answered by the other with no failed request, the same sessions back on their
first backend once it returns, and the recipe's one-model rule at render time.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tools import gateway_rig as backends
from tools.gateway_rig import BACKEND_PORTS, docker

PORT = 18140
NAME = "gwnginx"
PEOPLE = ("alice", "bob")


def recipe_doc() -> dict:
    """The test's nginx-router gateway recipe over backends a and b (office-tiny)."""
    return {
        "kind": "gateway", "name": NAME, "description": "nginx-router test gateway over two llama-server backends",
        "port": PORT, "models": ["office-tiny"],
        "backends": [backends.backend_doc(b) for b in ("a", "b")],
        "people": [{"name": p} for p in PEOPLE],
        "routing": {"router": "nginx"},
    }


@pytest.fixture(scope="module")
def nginx_office(tmp_path_factory, office_backends):
    """The running nginx-router gateway: yields its URL, the people's keys and the backends' addresses."""
    backends.revive("a", "b")  # an earlier module's last test killed a backend
    with backends.gateway_up(tmp_path_factory.mktemp("gwnginx"), recipe_doc(), office_backends["gw_key"],
                             wait_s=60) as gw:
        assert sorted(p.name for p in gw["compose"].parent.iterdir()) == ["compose.yaml", "front-door.conf.template"]
        yield gw | {"addr": {b: f"127.0.0.1:{BACKEND_PORTS[b]}" for b in ("a", "b")}}


def chat(gw, session: str | None, person: str = "alice", **extra) -> httpx.Response:
    headers = {"authorization": f"Bearer {gw['keys'][person]}"}
    if session:
        headers["x-claude-code-session-id"] = session
    body = {"model": "office-tiny", "messages": [{"role": "user", "content": f"turn of {session}"}],
            "max_tokens": 4, **extra}
    return httpx.post(f"{gw['url']}/v1/chat/completions", json=body, headers=headers, timeout=120)


def answered_by(r: httpx.Response) -> str:
    """The backend that answered: the last address of nginx's $upstream_addr (the ones tried, in order)."""
    return r.headers["x-ds4-backend"].split(",")[-1].strip()


def test_sessions_stay_on_one_backend_and_use_both(nginx_office) -> None:
    """12 sessions x 3 turns, the 12 of a turn at once: every turn of a session on the backend of its first turn
    (which answers with the gateway key: a person's key is refused there), both backends used."""
    seen: dict[str, set[str]] = {}
    for turn in range(3):
        with ThreadPoolExecutor(max_workers=12) as pool:
            rs = list(pool.map(lambda s: (s, chat(nginx_office, f"ng-{s}", PEOPLE[s % 2])), range(12)))
        for s, r in rs:
            assert r.status_code == 200, (turn, s, r.text)
            seen.setdefault(f"ng-{s}", set()).add(answered_by(r))
    split = {s: b for s, b in seen.items() if len(b) != 1}
    assert not split, f"sessions answered by two backends: {split}"
    used = Counter(next(iter(b)) for b in seen.values())
    print(f"sessions per backend: {dict(used)}")
    assert set(used) == set(nginx_office["addr"].values()), used


def test_a_client_without_the_session_header_stays_on_one_backend(nginx_office) -> None:
    """An OpenAI-API agent sends no session header: its turns are hashed on the person, so they stay on one backend
    (with an empty hash key nginx would spread them round robin, a cold prefill every turn)."""
    for person in PEOPLE:
        backends = {answered_by(chat(nginx_office, None, person)) for _ in range(6)}
        assert len(backends) == 1, (person, backends)


def test_keys_at_the_nginx_door(nginx_office) -> None:
    url = f"{nginx_office['url']}/v1/chat/completions"
    assert httpx.post(url, json={}, timeout=30).status_code == 401
    assert httpx.post(url, json={}, headers={"x-api-key": "ds4p-nobody-" + "x" * 40}, timeout=30).status_code == 401
    r = httpx.get(f"{nginx_office['url']}/v1/models", headers={"x-api-key": nginx_office["keys"]["bob"]}, timeout=30)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["office-tiny"], r.text
    assert httpx.get(f"{nginx_office['url']}/health", timeout=30).status_code == 200


def test_a_stream_arrives_as_events(nginx_office) -> None:
    headers = {"authorization": f"Bearer {nginx_office['keys']['alice']}", "x-claude-code-session-id": "ng-stream"}
    body = {"model": "office-tiny", "messages": [{"role": "user", "content": "count"}], "max_tokens": 8,
            "stream": True}
    with httpx.stream("POST", f"{nginx_office['url']}/v1/chat/completions", json=body, headers=headers,
                      timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream") and r.headers["x-accel-buffering"] == "no"
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 3 and events[-1] == "data: [DONE]", events


def test_a_dead_backends_sessions_move_on_and_come_back(nginx_office) -> None:
    """Runs last in this module: backend a (front door and engine) killed, the next turn of each of 12 sessions is
    answered by b with no failed request (nginx tries b when a refuses the connection, before anything was sent);
    once a is back and its fail_timeout (10 s) has passed, a's sessions hash to a again."""
    a, b = nginx_office["addr"]["a"], nginx_office["addr"]["b"]
    pins = {}
    for s in range(12):
        r = chat(nginx_office, f"hand-{s}")
        assert r.status_code == 200
        pins[s] = answered_by(r)
    assert set(pins.values()) == {a, b}, pins
    docker("kill", *backends.containers("a"))
    t0 = time.monotonic()
    for s, first in pins.items():
        r = chat(nginx_office, f"hand-{s}")
        assert r.status_code == 200, (s, r.status_code, r.text)
        assert answered_by(r) == b, (s, first, r.headers["x-ds4-backend"])
    print(f"12 next turns after backend a died: {time.monotonic() - t0:.1f} s")
    backends.revive("a")
    on_a = [s for s, first in pins.items() if first == a]
    deadline = time.monotonic() + 30
    while True:
        r = chat(nginx_office, f"hand-{on_a[0]}")
        assert r.status_code == 200, r.text
        if answered_by(r) == a or time.monotonic() > deadline:
            break
        time.sleep(1)
    for s, first in pins.items():
        r = chat(nginx_office, f"hand-{s}")
        assert r.status_code == 200 and answered_by(r) == first, (s, first, r.headers["x-ds4-backend"])
