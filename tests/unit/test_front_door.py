"""The front door's rendered nginx config, run by the real nginx (Debian's nginx-light, as in the image) in front of
a small local upstream that echoes what reached it: key on every route but the allow-list, both key headers, the
API's error shape, the body limit, unbuffered streaming, logs without keys or bodies. The route sweep against the
real engine is tests/infra/test_front_door.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.recipe.load import all_recipes, load_recipe
from ds4deploy.render import compose as render
from ds4deploy.render import front_door
from tests.support.ports import free_port
from tests.unit.conftest import REPO

KEY = "ds4-TestKey0123456789abcdefABCDEF"
METRICS_KEY = "ds4m-MetricsKey0123456789abcdefABC"
GATEWAY_KEY = "ds4-GatewayKey0123456789abcdefABCD"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
needs_nginx = pytest.mark.skipif(not Path(NGINX).is_file(), reason="nginx not installed (make unit installs it)")



def keyed(conf: str, listen: str, upstream: str, tmp: Path, recipe: str = "cpu") -> str:
    """The rendered template of `recipe` as the entrypoint makes it (the keys substituted: API, metrics and the
    gateway key of a deployment serving behind a gateway), moved to local test ports."""
    out = (conf.replace("${VLLM_API_KEY}", KEY).replace("${DS4_METRICS_KEY}", METRICS_KEY)
           .replace("${DS4_GATEWAY_KEY}", GATEWAY_KEY))
    return localized(out, listen, upstream, tmp, recipe)


def localized(conf: str, listen: str, upstream: str, tmp: Path, recipe: str = "cpu") -> str:
    """`conf` (a rendered template of `recipe`, keyed or not) moved to local test ports, its pid, logs and temp
    paths into `tmp`."""
    out = conf.replace("pid /run/nginx.pid;", f"pid {tmp}/nginx.pid;")
    out = out.replace("access_log /dev/stdout ds4 ", f"access_log {tmp}/access.log ds4 ")
    out = out.replace("error_log stderr warn;", f"error_log {tmp}/error.log warn;")
    for d in ("client_body", "proxy"):
        out = out.replace("http {", f"http {{\n    {d}_temp_path {tmp}/{d};", 1)
    r = load_recipe(recipe)
    out = out.replace(f"listen {front_door.listen(r)};", f"listen {listen};")
    return out.replace(f"server {front_door.upstream(r)};", f"server {upstream};")


class Echo(BaseHTTPRequestHandler):
    """Answers every path with what arrived (path, Authorization, x-api-key, body length); /stream sends three SSE
    events 0.5 s apart."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n)
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(3):
                data = f"data: {i}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")
            return
        out = json.dumps({"path": self.path, "authorization": self.headers.get("authorization"),
                          "x_api_key": self.headers.get("x-api-key"), "body_bytes": len(body)}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def _await_door(url: str, proc: subprocess.Popen, died_ok: bool = True) -> None:
    """Wait up to about 5 s until nginx at `url` answers /health (any status); with `died_ok` False, fail at once
    with the process's output if it exited meanwhile."""
    for _ in range(50):
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.HTTPError:
            assert died_ok or proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.1)


@contextlib.contextmanager
def running_proxy(tmp: Path, recipe: str = "cpu", handler: type[BaseHTTPRequestHandler] | None = None):
    """nginx with `recipe`'s rendered front door in front of `handler` (default `Echo`), logging into `tmp`; yields
    (base URL, nginx's process). Stopped with SIGTERM at the end unless the caller stopped it."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), handler or Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    conf = tmp / "nginx.conf"
    template = render.render(load_recipe(recipe)).files[front_door.TEMPLATE_FILE]
    conf.write_text(keyed(template, f"127.0.0.1:{port}", f"127.0.0.1:{upstream.server_port}", tmp, recipe))
    proc = subprocess.Popen([NGINX, "-e", f"{tmp}/error.log", "-c", str(conf), "-g", "daemon off;"])
    url = f"http://127.0.0.1:{port}"
    try:
        _await_door(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)
        upstream.shutdown()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """`running_proxy` for the module; yields (base URL, log directory)."""
    tmp = tmp_path_factory.mktemp("front-door")
    with running_proxy(tmp) as (url, _):
        yield url, tmp


def access_lines(tmp: Path, until, timeout_s: float = 5.0) -> list[dict]:
    """The access log's JSON lines once `until(lines)` is true (the config buffers the log, flushing each second);
    all it holds after `timeout_s` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = tmp / "access.log"
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        if until(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


@needs_nginx
@pytest.mark.parametrize("recipe", [r for r in all_recipes() if r.serving.front_door is not None],
                         ids=lambda r: r.name)
def test_every_rendered_front_door_parses(recipe, tmp_path):
    conf = tmp_path / "nginx.conf"
    text = render.render(recipe).files[front_door.TEMPLATE_FILE]
    assert KEY not in text and "${VLLM_API_KEY}" in text
    conf.write_text(keyed(text, f"127.0.0.1:{free_port()}", "127.0.0.1:9", tmp_path))
    p = subprocess.run([NGINX, "-e", str(tmp_path / "error.log"), "-t", "-c", str(conf)], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stderr


@needs_nginx
def test_no_key_is_401_in_the_shape_of_the_routes_api(proxy):
    url, _ = proxy
    r = httpx.post(f"{url}/v1/chat/completions", json={})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers["www-authenticate"].startswith("Bearer")
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(f"{url}{path}", json={})
        assert r.status_code == 401
        assert r.json() == {"type": "error", "error": {"type": "authentication_error",
                                                        "message": front_door.ERRORS[401][3]}}
    for path in ("/invocations", "/tokenize", "/detokenize", "/metrics", "/load", "/no/such/route", "/health/"):
        assert httpx.post(f"{url}{path}", json={}).status_code == 401, path


@needs_nginx
@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY},
                                     {"Authorization": f"bearer {KEY}"}, {"Authorization": f"BEARER {KEY}"},
                                     {"Authorization": f"bEaReR {KEY}"}])
def test_either_key_header_passes_and_the_engine_gets_bearer_only(proxy, headers):
    url, _ = proxy
    for path in ("/invocations", "/v1/messages"):
        r = httpx.post(f"{url}{path}", json={}, headers=headers)
        assert r.status_code == 200, path
        assert r.json()["authorization"] == f"Bearer {KEY}"
        assert r.json()["x_api_key"] is None


@needs_nginx
def test_a_refused_key_tells_clients_not_to_retry(proxy):
    """Claude Code and the Anthropic/OpenAI SDKs retry a 401 unless the answer says x-should-retry: false."""
    url, _ = proxy
    for path in ("/v1/messages", "/v1/chat/completions", "/metrics"):
        r = httpx.post(f"{url}{path}", json={}, headers={"x-api-key": "wrong"})
        assert (r.status_code, r.headers.get("x-should-retry")) == (401, "false"), path


def _raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as is on one connection; (status, headers lower-cased, body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x))
    return int(lines[0].split()[1]), headers, body


@needs_nginx
@pytest.mark.parametrize(("name", "extra"), [
    ("duplicate Authorization", f"Authorization: Bearer {KEY}\r\nAuthorization: Bearer {KEY}\r\n"),
    ("bad Host", "Host: bad/host\r\n"),
    ("oversized header", "X-Big: " + "a" * 9000 + "\r\n"),
])
def test_nginxs_own_400s_are_json_in_the_api_shape(proxy, name, extra):
    url, _ = proxy
    host = "" if name == "bad Host" else "Host: localhost\r\n"
    status, headers, body = _raw(url, f"GET /v1/models HTTP/1.1\r\n{host}{extra}Connection: close\r\n\r\n".encode())
    assert status == 400, name
    assert headers["content-type"] == "application/json", (name, body[:200])
    err = json.loads(body)["error"]
    assert err["type"] == "invalid_request_error" and err["code"] in ("bad_request", "request_header_too_large")


@needs_nginx
@pytest.mark.parametrize("key_env", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"])
def test_claude_code_with_a_wrong_key_says_so_at_once(proxy, tmp_path, key_env):
    """The real Claude Code CLI (pinned in tests/support/real_clients.py) against the front door with a wrong key:
    it prints "Invalid API key" and exits non-zero within 10 s, instead of retrying the 401 for minutes. Runs when
    the CLI is installed (the infra tier installs it with npm; the unit tier needs no network)."""
    from tests.support import real_clients

    exe = real_clients.CLAUDE_DIR / "node_modules" / ".bin" / "claude"
    if not exe.exists():
        pytest.skip(f"the Claude Code CLI is not installed in {real_clients.CLAUDE_DIR} (the infra tier installs it)")
    url, _ = proxy
    t0 = time.monotonic()
    try:
        p = real_clients.run_claude(url, "ds4-wrong-key", "ds4-tiny", tmp_path / "home", timeout_s=60,
                                    key_env=key_env)
    except subprocess.TimeoutExpired:
        pytest.fail("Claude Code was still retrying the 401 after 60 s")
    took = time.monotonic() - t0
    assert p.returncode != 0
    # x-api-key refused: "Invalid API key"; a bearer token (ANTHROPIC_AUTH_TOKEN) refused: Claude Code 2.1 takes it
    # for an expired login and says "Not logged in".
    said = "Invalid API key" if key_env == "ANTHROPIC_API_KEY" else "Not logged in"
    assert said in p.stdout + p.stderr, (p.stdout[-500:], p.stderr[-500:])
    assert took < 10, f"Claude Code took {took:.1f} s to report the wrong key"


@needs_nginx
def test_head_on_health_is_200_without_a_body(proxy):
    url, _ = proxy
    r = httpx.head(f"{url}/health")
    assert r.status_code == 200 and r.content == b""
    assert httpx.head(f"{url}/v1/models").status_code == 401  # HEAD elsewhere still needs the key


@needs_nginx
@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEY.upper()}"}, {"x-api-key": KEY + "x"},
                                     {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"},
                                     {"x-api-key": f"Bearer {KEY}"}])
def test_a_wrong_key_is_refused(proxy, headers):
    url, _ = proxy
    assert httpx.post(f"{url}/v1/completions", json={}, headers=headers).status_code == 401


@needs_nginx
def test_the_allow_list_forwards_only_its_own_path(proxy):
    """/health needs no key; a path that nginx normalises to /health reaches the engine as /health, never as the
    client spelled it (so /invocations/../health cannot run /invocations)."""
    url, _ = proxy
    for raw in ("/health", "/invocations/../health", "/%68ealth"):
        r = httpx.get(url + raw)
        assert r.status_code == 200, raw
        assert r.json()["path"] == "/health"


@needs_nginx
def test_a_body_above_the_limit_is_413_in_the_routes_shape(proxy):
    url, _ = proxy
    big = b"x" * (load_recipe("cpu").max_body_mib * 2**20 + 1)
    h = {"x-api-key": KEY, "content-type": "application/json"}
    r = httpx.post(f"{url}/v1/chat/completions", content=big, headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(f"{url}/v1/messages", content=big, headers=h)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert httpx.post(f"{url}/v1/messages", content=b"x" * 1000, headers=h).json()["body_bytes"] == 1000


@needs_nginx
def test_streams_are_not_buffered(proxy):
    """The first event arrives before the upstream has sent the last one (1 s later)."""
    url, _ = proxy
    t0 = time.monotonic()
    arrivals = []
    with httpx.stream("GET", f"{url}/stream", headers={"x-api-key": KEY}, timeout=10) as r:
        for chunk in r.iter_raw():
            if chunk.strip():
                arrivals.append(time.monotonic() - t0)
    assert arrivals and arrivals[0] < 0.4, arrivals
    assert arrivals[-1] > 0.9


@needs_nginx
def test_a_stream_arrives_live_through_an_outer_default_nginx(proxy, tmp_path):
    """Users put their own nginx in front, with its defaults (proxy_buffering on): the front door's
    X-Accel-Buffering: no on a streamed answer keeps that proxy from holding the events until the end."""
    url, _ = proxy
    port = free_port()
    for d in ("client_body", "proxy"):
        (tmp_path / d).mkdir()
    conf = tmp_path / "outer.conf"
    conf.write_text(
        f"worker_processes 1;\npid {tmp_path}/outer.pid;\nevents {{}}\nhttp {{\n"
        f"    client_body_temp_path {tmp_path}/client_body;\n    proxy_temp_path {tmp_path}/proxy;\n"
        f"    access_log off;\n    server {{\n        listen 127.0.0.1:{port};\n"
        f"        location / {{ proxy_pass {url}; }}\n    }}\n}}\n")
    outer = subprocess.Popen([NGINX, "-e", f"{tmp_path}/outer-error.log", "-c", str(conf), "-g", "daemon off;"])
    try:
        for _ in range(50):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        t0 = time.monotonic()
        arrivals = []
        with httpx.stream("GET", f"http://127.0.0.1:{port}/stream", headers={"x-api-key": KEY}, timeout=10) as r:
            assert r.headers.get("x-accel-buffering") is None  # the outer proxy consumed it, as it should
            for chunk in r.iter_raw():
                if chunk.strip():
                    arrivals.append(time.monotonic() - t0)
    finally:
        outer.terminate()
        outer.wait(timeout=10)
    assert arrivals and arrivals[0] < 0.4, arrivals
    assert arrivals[-1] > 0.9


@needs_nginx
def test_only_streams_carry_x_accel_buffering(proxy):
    url, _ = proxy
    with httpx.stream("GET", f"{url}/stream", headers={"x-api-key": KEY}, timeout=10) as r:
        assert r.headers["x-accel-buffering"] == "no"
    assert "x-accel-buffering" not in httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}).headers


@needs_nginx
def test_logs_hold_no_key_and_no_body(proxy):
    url, tmp = proxy
    body_text = "body-text-that-must-not-be-logged"
    path = "/v1/chat/completions/log-check"  # a path no other test of the module logs
    httpx.post(f"{url}{path}?api_key={KEY}", json={"x": body_text}, headers={"x-api-key": KEY})
    httpx.post(f"{url}{path}", json={"x": body_text}, headers={"Authorization": f"Bearer {KEY}x"})
    def statuses(lines: list[dict]) -> list[int]:
        return sorted(x["status"] for x in lines if x["path"] == path)

    assert statuses(access_lines(tmp, lambda lines: statuses(lines) == [200, 401])) == [200, 401], \
        "the two requests were not logged within the flush interval"
    logs = (tmp / "access.log").read_text() + (tmp / "error.log").read_text()
    assert KEY not in logs and body_text not in logs


@needs_nginx
def test_a_graceful_stop_writes_out_the_buffered_log(tmp_path):
    """The access log is buffered (flushed each second); stopped with the image's stop signal (SIGQUIT) at once
    after a request, nginx still writes that request's line, so `docker stop` loses no evidence."""
    with running_proxy(tmp_path) as (url, proc):
        n = len(access_lines(tmp_path, lambda lines: len(lines) >= 1))  # the readiness probe's line, once flushed
        httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}, timeout=10)
        assert len(access_lines(tmp_path, lambda lines: True)) == n, "the line was not buffered"
        proc.send_signal(signal.SIGQUIT)
        proc.wait(timeout=10)
        assert [x["path"] for x in access_lines(tmp_path, lambda lines: True)][n:] == ["/v1/models"]


@pytest.mark.parametrize("status", sorted(front_door.ERRORS))
def test_error_bodies_are_json_and_safe_inside_an_nginx_string(status):
    for api in ("openai", "anthropic"):
        body = front_door.error_body(status, api)
        json.loads(body)
        assert not set("'$\\") & set(body)


def _entrypoint(tmp_path: Path, key: str | None, metrics_key: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "DS4_METRICS_KEY")}
    env["DS4_METRICS_KEY"] = metrics_key if metrics_key is not None else METRICS_KEY
    env["FRONT_DOOR_TEMPLATE"] = str(REPO / "compose" / "cpu" / front_door.TEMPLATE_FILE)
    if key is not None:
        env["VLLM_API_KEY"] = key
    return subprocess.run(["bash", str(REPO / "images" / "proxy" / "entrypoint.sh")], env=env, capture_output=True,
                          text=True, check=False, timeout=30)


@pytest.mark.parametrize(("key", "needle"), [(None, "VLLM_API_KEY is empty or unset"), ("", "is empty"),
                                             ('ds4-x";deny', "holds characters other than"),
                                             ("ds4-x y", "holds characters other than")])
def test_the_entrypoint_refuses_a_missing_or_unsafe_key(tmp_path, key, needle):
    p = _entrypoint(tmp_path, key)
    assert p.returncode == 2
    assert needle in p.stderr and "fix:" in p.stderr


@pytest.mark.parametrize(("metrics_key", "needle"), [("", "DS4_METRICS_KEY is empty or unset"),
                                                     ("ds4m-x;y", "DS4_METRICS_KEY holds characters"),
                                                     (KEY, "DS4_METRICS_KEY is the API key")])
def test_the_entrypoint_refuses_a_missing_unsafe_or_shared_metrics_key(tmp_path, metrics_key, needle):
    p = _entrypoint(tmp_path, KEY, metrics_key)
    assert p.returncode == 2
    assert needle in p.stderr and "fix:" in p.stderr


@pytest.mark.parametrize(("gateway_key", "needle"), [("ds4-gw;deny", "DS4_GATEWAY_KEY holds characters"),
                                                     (KEY, "DS4_GATEWAY_KEY is this deployment's API key"),
                                                     (METRICS_KEY, "DS4_GATEWAY_KEY is this deployment's API key")])
def test_the_entrypoint_refuses_an_unsafe_or_shared_gateway_key(tmp_path, monkeypatch, gateway_key, needle):
    monkeypatch.setenv("DS4_GATEWAY_KEY", gateway_key)
    p = _entrypoint(tmp_path, KEY)
    assert p.returncode == 2
    assert needle in p.stderr and "fix:" in p.stderr and KEY not in p.stderr + p.stdout


@contextlib.contextmanager
def entrypoint_proxy(tmp: Path, gateway_key: str | None, recipe: str = "cpu-llamacpp"):
    """The front door as its container starts it: the real images/proxy/entrypoint.sh on `recipe`'s rendered
    template (moved to local ports and paths, its ${...} placeholders kept), the keys in the environment as the
    compose env_files give them, `gateway_key` None as when no <key file>.gateway.env exists. Yields (base URL,
    the config the entrypoint wrote)."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    template = tmp / "front-door.conf.template"
    text = render.render(load_recipe(recipe)).files[front_door.TEMPLATE_FILE]
    template.write_text(localized(text, f"127.0.0.1:{port}", f"127.0.0.1:{upstream.server_port}", tmp, recipe))
    conf = tmp / "run" / "nginx.conf"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "DS4_METRICS_KEY", "DS4_GATEWAY_KEY")}
    env.update({"VLLM_API_KEY": KEY, "DS4_METRICS_KEY": METRICS_KEY, "FRONT_DOOR_TEMPLATE": str(template),
                "FRONT_DOOR_CONF": str(conf), "PATH": f"{env.get('PATH', '')}:{Path(NGINX).parent}"})
    if gateway_key is not None:
        env["DS4_GATEWAY_KEY"] = gateway_key
    proc = subprocess.Popen(["bash", str(REPO / "images" / "proxy" / "entrypoint.sh")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _await_door(url, proc, died_ok=False)
        yield url, conf
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        upstream.shutdown()


@needs_nginx
def test_a_backend_accepts_the_gateway_key_beside_its_own(tmp_path):
    """Behind a gateway (<key file>.gateway.env present): the gateway's key and the deployment's own key both open
    every keyed route, as Bearer or x-api-key; the engine gets the deployment's own key either way; any other key is
    refused; the written config is the owner's alone and the template's placeholders are all gone."""
    with entrypoint_proxy(tmp_path, GATEWAY_KEY) as (url, conf):
        for key in (KEY, GATEWAY_KEY):
            for headers in ({"Authorization": f"Bearer {key}"}, {"x-api-key": key}):
                for path in ("/v1/chat/completions", "/v1/messages", "/metrics"):
                    r = httpx.post(f"{url}{path}", json={}, headers=headers)
                    assert r.status_code == 200, (path, headers)
                    assert r.json()["authorization"] == f"Bearer {KEY}" and r.json()["x_api_key"] is None
        for bad in ("ds4p-alice-" + "x" * 40, GATEWAY_KEY + "x", GATEWAY_KEY[:-1], "Bearer"):
            assert httpx.post(f"{url}/v1/chat/completions", json={}, headers={"x-api-key": bad}).status_code == 401
            assert httpx.post(f"{url}/v1/chat/completions", json={},
                              headers={"Authorization": f"Bearer {bad}"}).status_code == 401
        assert httpx.post(f"{url}/v1/chat/completions", json={}, headers={"x-api-key": ""}).status_code == 401
        text = conf.read_text()
        assert "${" not in text and text.count(GATEWAY_KEY) == 2
        assert conf.stat().st_mode & 0o077 == 0


@needs_nginx
def test_without_a_gateway_key_file_only_the_own_key_opens(tmp_path):
    """No <key file>.gateway.env (a deployment not behind a gateway): the entrypoint drops the gateway key's lines, so
    neither an empty key nor the placeholder's text opens the door, and the own key still does."""
    with entrypoint_proxy(tmp_path, None) as (url, conf):
        assert httpx.post(f"{url}/v1/chat/completions", json={}, headers={"x-api-key": KEY}).status_code == 200
        for bad in (GATEWAY_KEY, "${DS4_GATEWAY_KEY}", "{DS4_GATEWAY_KEY}"):
            for headers in ({"x-api-key": bad}, {"Authorization": f"Bearer {bad}"}):
                assert httpx.post(f"{url}/v1/chat/completions", json={}, headers=headers).status_code == 401, headers
        assert httpx.post(f"{url}/v1/chat/completions", json={}, headers={"x-api-key": ""}).status_code == 401
        text, template = conf.read_text(), (conf.parent.parent / "front-door.conf.template").read_text()
        # Its two lines gone, not substituted empty (which would leave map entries for an empty key).
        assert "DS4_GATEWAY_KEY" not in text and '"~^$"' not in text and '+$"' not in text
        assert len(text.splitlines()) == len(template.splitlines()) - 2


@needs_nginx
def test_the_metrics_key_reaches_metrics_and_nothing_else(proxy):
    """Prometheus's credential (its own key file) is a bearer token for /metrics alone; the engine still gets the
    API key (vLLM's /metrics checks none, but the proxy presents one form everywhere)."""
    url, _ = proxy
    bearer = {"Authorization": f"Bearer {METRICS_KEY}"}
    r = httpx.get(f"{url}/metrics", headers=bearer)
    assert r.status_code == 200 and r.json()["path"] == "/metrics"
    assert r.json()["authorization"] == f"Bearer {KEY}"
    assert httpx.get(f"{url}/metrics", headers={"x-api-key": KEY}).status_code == 200
    for path in ("/v1/models", "/v1/messages", "/metrics/", "/metrics/../v1/models", "/tokenize", "/invocations"):
        assert httpx.get(f"{url}{path}", headers=bearer).status_code == 401, path
    assert httpx.get(f"{url}/metrics", headers={"x-api-key": METRICS_KEY}).status_code == 401
    assert httpx.get(f"{url}/metrics").status_code == 401


@needs_nginx
def test_llamacpp_metrics_go_through_the_front_door_with_the_engines_key(tmp_path):
    """llama-server checks the API key on /metrics too (only /health and /v1/health are public:
    tools/server/server-http.cpp, middleware_validate_api_key), unlike vLLM. The llama.cpp front door routes /metrics
    as the vLLM one does (the same rendered routes) and presents the engine's key there, whichever credential the
    client used, so Prometheus's metrics credential and the supervisor's API key both reach the engine keyed; the
    engine gets that key as LLAMA_API_KEY from the same key file (test_llamacpp, key shim)."""
    def metrics_route(text: str) -> str:
        start = text.index("        location = /metrics {")
        return text[start:text.index("\n        }\n", start)]

    llama = render.render(load_recipe("cpu-llamacpp")).files[front_door.TEMPLATE_FILE]
    vllm = render.render(load_recipe("cpu")).files[front_door.TEMPLATE_FILE]
    assert metrics_route(llama) == metrics_route(vllm) and "$ds4_metrics_authorized = 0" in metrics_route(llama)
    for r in all_recipes():
        if r.engine.family == "llamacpp" and r.serving.front_door is not None:
            text = render.render(r).files[front_door.TEMPLATE_FILE]
            assert "location = /metrics {" in text and 'proxy_set_header Authorization "Bearer ${VLLM_API_KEY}";' \
                in text, r.name
    with running_proxy(tmp_path, "cpu-llamacpp") as (url, _):
        for headers in ({"Authorization": f"Bearer {METRICS_KEY}"}, {"x-api-key": KEY},
                        {"Authorization": f"bearer {KEY}"}):
            r = httpx.get(f"{url}/metrics", headers=headers)
            assert r.status_code == 200 and r.json()["path"] == "/metrics", headers
            assert r.json()["authorization"] == f"Bearer {KEY}" and not r.json()["x_api_key"], headers
        assert httpx.get(f"{url}/metrics").status_code == 401


PROMETHEUS_EXAMPLE = REPO / "docs" / "monitoring" / "prometheus.yml"


def test_the_documented_scrape_config_passes_promtool(tmp_path):
    """docs/monitoring.md's scrape config, checked by Prometheus's own `promtool check config` (Debian package
    prometheus; `make unit` installs it)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; make unit installs it as root)")
    conf = yaml.safe_load(PROMETHEUS_EXAMPLE.read_text())
    job = conf["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
    key_file = tmp_path / "ds4-cpu.metrics-key"
    key_file.write_text(METRICS_KEY + "\n")
    text = PROMETHEUS_EXAMPLE.read_text().replace(job["authorization"]["credentials_file"], str(key_file))
    (tmp_path / "prometheus.yml").write_text(text)
    p = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (REPO / "docs" / "monitoring.md").read_text().count("docs/monitoring/prometheus.yml") >= 1


class TinyDNS:
    """A DNS server on loopback answering A queries for one name with a switchable address (what Docker's embedded
    DNS does for a compose service whose container was recreated), every other query NXDOMAIN."""

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address, self.queries = name, address, 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                q, peer = self.sock.recvfrom(512)
            except OSError:
                return
            labels, i = [], 12
            while q[i]:
                labels.append(q[i + 1:i + 1 + q[i]].decode())
                i += 1 + q[i]
            question = q[12:i + 5]
            qtype = int.from_bytes(q[i + 1:i + 3], "big")
            hit = ".".join(labels) == self.name and qtype == 1
            self.queries += hit
            flags = b"\x81\x80" if hit else b"\x81\x83"
            out = q[:2] + flags + b"\x00\x01" + (b"\x00\x01" if hit else b"\x00\x00") + b"\x00\x00\x00\x00" + question
            if hit:
                out += b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x01\x00\x04" + socket.inet_aton(self.address)
            self.sock.sendto(out, peer)

    def close(self) -> None:
        self.sock.close()


@needs_nginx
def test_a_bridge_front_door_follows_a_recreated_engine(tmp_path):
    """Bridge networking: the engine is `engine` on the compose network. Recreated alone, it comes back at another
    address; the front door asks DNS again (resolver, variable upstream) and reaches the new one. Two upstreams on
    two loopback addresses stand in for the old and the new container, a small DNS server for Docker's."""
    base = load_recipe("cpu")
    recipe = base.model_copy(update={"serving": base.serving.model_copy(update={"network_mode": "bridge"})})
    text = render.render(recipe).files[front_door.TEMPLATE_FILE]
    assert "resolver 127.0.0.11 valid=10s" in text and "upstream engine" not in text
    olds = ThreadingHTTPServer(("127.0.0.2", 0), Echo)
    port = olds.server_port
    news = ThreadingHTTPServer(("127.0.0.3", port), Echo)
    for s in (olds, news):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    dns = TinyDNS("engine", "127.0.0.2")
    listen = free_port()
    conf = keyed(text, f"127.0.0.1:{listen}", "unused", tmp_path)
    conf = conf.replace(f"listen {front_door.listen(recipe)};", f"listen 127.0.0.1:{listen};")
    conf = conf.replace("resolver 127.0.0.11 valid=10s", f"resolver 127.0.0.1:{dns.port} valid=1s")
    conf = conf.replace(f"set $ds4_engine {front_door.upstream(recipe)};", f"set $ds4_engine engine:{port};")
    (tmp_path / "nginx.conf").write_text(conf)
    proc = subprocess.Popen([NGINX, "-e", f"{tmp_path}/error.log", "-c", str(tmp_path / "nginx.conf"), "-g",
                             "daemon off;"])
    url = f"http://127.0.0.1:{listen}"
    try:
        status = None
        for _ in range(50):
            try:
                status = httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}, timeout=2).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert status == 200 and dns.queries >= 1
        olds.shutdown()
        olds.server_close()  # the old container is gone
        dns.address = "127.0.0.3"  # the recreated one has a new address
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}, timeout=5)
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text[:200]
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        news.shutdown()
        dns.close()


def test_the_committed_renders_are_host_networked_or_resolve_at_request_time():
    """Every front door either shares the host's network with a fixed loopback engine address or resolves the
    engine's name per request: none keeps an address looked up once at start."""
    for recipe in all_recipes():
        if recipe.serving.front_door is None:
            continue
        text = render.render(recipe).files[front_door.TEMPLATE_FILE]
        if recipe.serving.network_mode == "bridge":
            assert "resolver 127.0.0.11" in text and "upstream engine" not in text, recipe.name
        else:
            assert f"server 127.0.0.1:{recipe.engine_port};" in text, recipe.name


class ClosesIdle(Echo):
    """`Echo` that closes a connection idle for the engine's keep-alive (5 s: vLLM's uvicorn, llama-server's
    cpp-httplib) and records, per connection, how it ended: "peer" (the proxy closed it) or "idle" (it timed out),
    when it was accepted and when it ended."""

    timeout = 5
    ended: typing.ClassVar[list[tuple[str, float, float]]] = []

    def handle(self) -> None:
        self.timed_out = False
        accepted = time.monotonic()
        super().handle()
        ClosesIdle.ended.append(("idle" if self.timed_out else "peer", accepted, time.monotonic()))

    def log_error(self, fmt: str, *args) -> None:
        # http.server reports its own idle timeout here ("Request timed out") and then closes the connection.
        self.timed_out = self.timed_out or fmt.startswith("Request timed out")


@needs_nginx
def test_the_proxy_reuses_no_engine_connection(tmp_path):
    """Both engines closed connections that already carried the next request, which nginx answered 502 without
    resending it (docs/sources.md#front-door-no-reuse): the rendered front door asks the engine to close after
    every answer. Two requests reach the engine on two connections, each closed at its answer (HTTP/1.1, so the
    engine would keep it 5 s otherwise), never by the engine's idle timeout."""
    with running_proxy(tmp_path, handler=ClosesIdle) as (url, _):
        start = time.monotonic()  # the start-up wait's own engine connections were accepted before: not counted
        answered = []
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", headers={"x-api-key": KEY}, json={"p": 1})
            assert r.status_code == 200
            answered.append(time.monotonic())
        deadline = answered[-1] + 2

        def ours() -> list[tuple[str, float, float]]:
            return [e for e in ClosesIdle.ended if e[1] >= start]

        while len(ours()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [how for how, _, _ in ours()] == ["peer", "peer"], ClosesIdle.ended
        assert all(when - t < 1 for (_, _, when), t in zip(ours(), answered, strict=True)), (
            ClosesIdle.ended, answered)


def test_a_changed_front_door_config_changes_its_service():
    """nginx reads its config only at start and the config is a bind-mounted file, whose content compose does not
    see: the service carries the config's sha256, so a changed config recreates the container on the next deploy
    (a redeploy once left the old config running, 2026-12-01)."""
    import hashlib

    base = load_recipe("cpu")
    fd = base.serving.front_door.model_copy(update={"allow": [*base.serving.front_door.allow, "/version"]})
    changed = base.model_copy(update={"serving": base.serving.model_copy(update={"front_door": fd})})
    shas = []
    for recipe in (base, changed):
        out = render.render(recipe).files
        svc = yaml.safe_load(out["compose.yaml"])["services"]["front-door"]
        conf_sha = hashlib.sha256(out[front_door.TEMPLATE_FILE].encode()).hexdigest()
        assert svc["environment"]["DS4_FRONT_DOOR_CONF_SHA256"] == conf_sha
        shas.append(svc["labels"]["io.ds4deploy.service-sha256"])
    assert shas[0] != shas[1]
