"""The front door of the deployed stack (docs/front-door.md), against the real engine behind it.

Route sweep: every path the running vLLM registers (its route table as the server publishes it, /openapi.json,
plus the routes it mounts outside the schema), every method it registers there, without a key and with it, through
the front door: 401 for everything outside the allow-list, and not one generated token without the key (the
engine's own generation counter in /metrics does not move during the keyless sweep).
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

# Routes the server answers outside its OpenAPI schema, read from vLLM 0.32's source: the Prometheus app mounted at
# /metrics (entrypoints/serve/instrumentator/metrics.py), FastAPI's own /openapi.json, /docs, /docs/oauth2-redirect
# and /redoc; and routes the cases found open, in case a build leaves them out of the schema (/ping, /invocations,
# /load, /server_info).
UNLISTED = {"/metrics": ["GET"], "/openapi.json": ["GET"], "/docs": ["GET"], "/docs/oauth2-redirect": ["GET"],
            "/redoc": ["GET"], "/ping": ["GET", "POST"], "/invocations": ["POST"], "/load": ["GET"],
            "/server_info": ["GET"]}
# The front door's allow-list of the rendered recipe is read from its template (one source: the recipe).
GENERATED = re.compile(r"^vllm:generation_tokens_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


@pytest.fixture
def front(dv, base_url, api_key):
    if not dv.get("ds4_front_door"):
        pytest.skip("recipe has no front door")
    return base_url, {"Authorization": f"Bearer {api_key}"}


def _allow_list(dv) -> set[str]:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    conf = (repo / "compose" / dv["ds4_recipe"] / "front-door.conf.template").read_text()
    # Exact locations that forward without a key check (/metrics is an exact location too, but behind its own).
    return {path for path, block in re.findall(r"^\s*location = (\S+) \{(.*?)^\s*\}", conf, re.M | re.S)
            if "return 401" not in block}


def _routes(url: str, key: dict) -> dict[str, list[str]]:
    """Path -> methods of the running engine, read through the front door with the key."""
    spec = httpx.get(f"{url}/openapi.json", headers=key, timeout=30)
    assert spec.status_code == 200, spec.text[:300]
    routes = {path: sorted(m.upper() for m in ops) for path, ops in spec.json()["paths"].items()}
    for path, methods in UNLISTED.items():
        routes.setdefault(path, methods)
    return routes


def _generated(url: str, key: dict) -> float:
    text = httpx.get(f"{url}/metrics", headers=key, timeout=30).text
    values = GENERATED.findall(text)
    assert values, "vllm:generation_tokens_total not in /metrics"
    return sum(float(v) for v in values)


def test_route_sweep_no_route_answers_without_the_key(front, dv, supervisor_paused):
    """Every route of the engine, with no key and with wrong keys: 401 unless on the allow-list, and no token
    generated meanwhile (the supervisor's one-token probe is paused: it once landed inside the sweep)."""
    url, key = front
    allow = _allow_list(dv)
    routes = _routes(url, key)
    assert {"/v1/chat/completions", "/v1/messages", "/tokenize", "/invocations", "/metrics"} <= set(routes)
    body = {"model": dv["ds4_served_name"], "prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}
    before = _generated(url, key)
    open_routes, results = [], {}
    for path, methods in sorted(routes.items()):
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in methods:
            for hdr in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
                r = httpx.request(method, url + concrete, json=body if method in ("POST", "PUT") else None,
                                  headers=hdr, timeout=60)
                results[(method, path, tuple(hdr))] = r.status_code
                if path not in allow and r.status_code != 401:
                    open_routes.append(f"{method} {path} {list(hdr)} -> {r.status_code}")
    assert open_routes == [], "routes answering without the key:\n" + "\n".join(open_routes)
    assert _generated(url, key) == before, "tokens were generated during the keyless sweep"
    for path in allow & set(routes):
        assert results[("GET", path, ())] == 200, path
    print(json.dumps({"routes": len(routes), "requests_without_key": len(results)}))


def test_route_sweep_with_the_key_reaches_the_engine(front, dv, api_key):
    """With the key (either header) no route is refused by the front door: what comes back is the engine's own
    answer (200, or its 4xx for a body that does not fit the route)."""
    url, key = front
    routes = _routes(url, key)
    refused = []
    for path, methods in sorted(routes.items()):
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in methods:
            if method != "GET" or path in ("/invocations",):
                continue
            for hdr in (key, {"x-api-key": api_key}):
                r = httpx.request(method, url + concrete, headers=hdr, timeout=60)
                if r.status_code == 401:
                    refused.append(f"{method} {path} {list(hdr)}")
    assert refused == []


def test_invocations_generates_only_with_the_key(front, dv, api_key):
    url, _ = front
    body = {"model": dv["ds4_served_name"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    refused = httpx.post(f"{url}/invocations", json=body, timeout=60)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    ok = httpx.post(f"{url}/invocations", json=body, headers={"x-api-key": api_key}, timeout=120)
    assert ok.status_code == 200, ok.text[:300]


def test_the_engine_publishes_no_port_of_its_own(host, front, engine_container, front_door_container, dv):
    """Only the front door is reachable from outside the stack: on host networking the engine listens on loopback
    only (its port on every address would let the network skip the key check of the other routes)."""
    engine_ports = engine_container["HostConfig"].get("PortBindings") or {}
    assert engine_ports == {}
    if dv["ds4_network_mode"] == "host":
        port = dv["ds4_engine_port"]
        assert host.socket(f"tcp://127.0.0.1:{port}").is_listening
        assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening
        assert not host.socket(f"tcp://:::{port}").is_listening
    if dv["ds4_network_mode"] == "bridge":
        bound = front_door_container["HostConfig"]["PortBindings"]
        assert bound == {f"{dv['ds4_port']}/tcp": [{"HostIp": dv["ds4_bind_address"], "HostPort": str(dv["ds4_port"])}]}


def test_the_front_door_logs_no_key(host, front, front_door_container, api_key):
    url, _ = front
    httpx.get(f"{url}/v1/models", headers={"x-api-key": api_key}, timeout=30)
    deadline = time.monotonic() + 10  # the access log is flushed each second (front-door.conf.template)
    while True:
        logs = host.run(f"docker logs {front_door_container['Id']}")
        text = logs.stdout + logs.stderr
        if '"path":"/v1/models"' in text or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert '"path":"/v1/models"' in text
    assert api_key not in text, "API key found in the front door's logs"
    args = json.dumps(front_door_container["Config"]["Cmd"]) + json.dumps(front_door_container["Args"])
    assert api_key not in args


def test_a_request_without_max_tokens_stops_at_the_server_side_cap(front, dv):
    """serving.default_max_tokens (vLLM's generation-config override) caps a request that sets no max_tokens; the
    greedy request ignores EOS, so it would otherwise run to the end of the context."""
    from ds4deploy.recipe.load import load_recipe

    url, key = front
    cap = load_recipe(dv["ds4_recipe"]).serving.default_max_tokens
    if cap is None:
        pytest.skip("recipe sets no default_max_tokens")
    body = {"model": dv["ds4_served_name"], "messages": [{"role": "user", "content": "Count to ten."}],
            "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=key, timeout=300)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == cap


def test_a_system_message_inside_messages_reaches_the_model(front, dv):
    """The shape coding agents send: a system entry mid-conversation is counted, not dropped by the template."""
    url, key = front
    hdr = {**key, "anthropic-version": "2023-06-01"}
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "and now?"}]
    with_system = [*turns[:2], {"role": "system", "content": "Answer in French from now on."}, turns[2]]
    counts = []
    for messages in (turns, with_system):
        r = httpx.post(f"{url}/v1/messages/count_tokens", json={"model": dv["ds4_served_name"], "messages": messages},
                       headers=hdr, timeout=60)
        assert r.status_code == 200, r.text[:300]
        counts.append(r.json()["input_tokens"])
    assert counts[1] > counts[0]


def test_the_metrics_credential_reaches_metrics_only(front, dv):
    """Prometheus's own credential (docs/monitoring.md) scrapes the real engine's /metrics and is refused elsewhere."""
    from pathlib import Path

    from ds4deploy.operate.key_file import parse_env_file

    url, _ = front
    mkey = parse_env_file(Path(dv["ds4_metrics_key_file"]).read_text())["DS4_METRICS_KEY"]
    bearer = {"Authorization": f"Bearer {mkey}"}
    r = httpx.get(f"{url}/metrics", headers=bearer, timeout=30)
    assert r.status_code == 200 and GENERATED.search(r.text), r.text[:300]
    for path in ("/v1/models", "/tokenize", "/invocations", "/openapi.json"):
        assert httpx.get(f"{url}{path}", headers=bearer, timeout=30).status_code == 401, path


def test_monitors_and_clients_get_answers_they_understand(front, dv):
    """HEAD /health is 200 (vLLM alone answers 405); a wrong key is 401 with x-should-retry: false; BEARER in
    capitals is the same scheme; a streamed answer carries X-Accel-Buffering: no."""
    url, key = front
    assert httpx.head(f"{url}/health", timeout=30).status_code == 200
    r = httpx.post(f"{url}/v1/messages", headers={"x-api-key": "wrong"}, json={}, timeout=30)
    assert (r.status_code, r.headers.get("x-should-retry")) == (401, "false")
    token = key["Authorization"].split()[1]
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"BEARER {token}"}, timeout=30).status_code == 200
    body = {"model": dv["ds4_served_name"], "prompt": "hi", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", headers=key, json=body, timeout=60) as s:
        assert s.status_code == 200 and s.headers.get("x-accel-buffering") == "no"
        s.read()
