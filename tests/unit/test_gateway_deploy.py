"""The gateway deploy's checks (ds4deploy/operate/gateway_deploy.py) without Docker or Ansible: the gateway host in
the inventory, the key files as the play saw them, each backend's answer to GET /v1/models with the gateway key
(a small HTTP server on loopback answering as a backend's front door would), and one message for every problem.
The deployed path (`make deploy RECIPE=loopback`) is tests/gateway/test_make_deploy.py."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from ds4deploy.core.errors import UserError
from ds4deploy.operate import gateway_deploy as gd
from ds4deploy.operate.status import print_reports
from ds4deploy.plan.inventory import Inventory
from ds4deploy.recipe.paths import REPO_ROOT

GW_KEY = "ds4-" + "k" * 40


class _Backend(BaseHTTPRequestHandler):
    """GET /v1/models: 200 with the server's models for the gateway key, 401 for any other."""

    models: tuple[str, ...] = ()

    def do_GET(self) -> None:
        ok = self.headers.get("authorization") == f"Bearer {GW_KEY}"
        body = json.dumps({"data": [{"id": m} for m in self.models]} if ok else {"error": "no"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def backend():
    """A server answering GET /v1/models with ["office-tiny"] to the gateway key; yields its URL."""
    handler = type("H", (_Backend,), {"models": ("office-tiny",)})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _closed_port_url() -> str:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    port = srv.server_address[1]
    srv.server_close()
    return f"http://127.0.0.1:{port}"


def test_gateway_host_is_the_one_of_group_gateway_or_the_only_host() -> None:
    doc = yaml.safe_load((REPO_ROOT / "recipes" / "gateways" / "loopback.yaml").read_text())
    from ds4deploy.recipe.schema import GatewayRecipe

    gw = GatewayRecipe.model_validate(doc)
    assert gd.gateway_host(gw, Inventory({"h": {}}, {"all": ["h"]})) == "h"
    assert gd.gateway_host(gw, Inventory({"g": {}, "b": {}}, {"all": ["g", "b"], "gateway": ["g"]})) == "g"
    for groups in ({"all": ["g", "b"]}, {"all": ["g", "b"], "gateway": ["g", "b"]}):
        with pytest.raises(UserError, match="gateway host"):
            gd.gateway_host(gw, Inventory({"g": {}, "b": {}}, groups))


def test_probe_names_each_way_a_backend_fails(backend) -> None:
    assert gd.probe(backend, GW_KEY, ["office-tiny"]) is None
    assert "refuses the gateway key (HTTP 401" in gd.probe(backend, "ds4-other-" + "x" * 32, ["office-tiny"])
    assert gd.probe(backend, GW_KEY, ["office-other"]) == "serves office-tiny, not office-other"
    assert "does not answer at" in gd.probe(_closed_port_url(), GW_KEY, ["office-tiny"], timeout_s=2)


def _recipe(tmp_path, urls: list[str]):
    doc = yaml.safe_load((REPO_ROOT / "recipes" / "gateways" / "loopback.yaml").read_text())
    doc["backends"] = [{**b, "url": u} for b, u in zip(doc["backends"], urls, strict=False)][:len(urls)]
    doc["models"] = ["office-tiny"]
    doc.pop("fallback")  # its office-other is not served here
    path = tmp_path / "loopback.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _seen(key_text: str | None, people_text: str | None, mode: str = "0600") -> dict:
    return {"key_file": {"exists": key_text is not None, "mode": mode, "text": key_text or ""},
            "people_key_file": {"exists": people_text is not None, "mode": "0600", "text": people_text or ""}}


def test_good_keys_and_backends_give_the_people_maps(tmp_path, backend) -> None:
    alice, bob = "ds4p-alice-" + "a" * 30, "ds4p-bob-" + "b" * 30
    maps = gd.check_secrets_and_backends(_recipe(tmp_path, [backend]),
                                         _seen(f"VLLM_API_KEY={GW_KEY}\n", f"alice {alice}\nbob {bob}\n"))
    assert sorted(maps) == ["bearer.map", "x-api-key.map"] and alice in maps["x-api-key.map"]


def test_every_problem_in_one_message_and_no_key(tmp_path, backend) -> None:
    alice = "ds4p-alice-" + "a" * 30
    wrong = "ds4-wrong-" + "w" * 32
    path = _recipe(tmp_path, [backend, _closed_port_url()])
    with pytest.raises(UserError) as exc:
        gd.check_secrets_and_backends(path, {**_seen(f"VLLM_API_KEY={wrong}\n", f"alice {alice}\nbob {alice}\n"),
                                             "ports_busy": [18142]})
    text = str(exc.value)
    assert "port(s) 18142 on the gateway host are in use by another process" in text
    assert "backend 'a' refuses the gateway key" in text
    assert "backend 'b' does not answer" in text
    assert "line 2 gives 'bob' the key of 'alice' (line 1)" in text
    assert alice not in text and wrong not in text
    assert text.endswith("Nothing was changed on any host")


def test_key_files_missing_open_or_malformed(tmp_path, backend) -> None:
    path = _recipe(tmp_path, [backend])
    people = "alice ds4p-alice-" + "a" * 30 + "\n"
    cases = {"does not exist on the gateway host": _seen(None, people),
             "has mode 0644": _seen(f"VLLM_API_KEY={GW_KEY}\n", people, mode="0644"),
             "holds no VLLM_API_KEY= line": _seen("VLLM_API_KEY=short\n", people)}
    for message, seen in cases.items():
        with pytest.raises(UserError, match=message) as exc:
            gd.check_secrets_and_backends(path, seen)
        # Without a usable gateway key no backend is probed (each would refuse and the message would mislead).
        assert "backend '" not in str(exc.value)
    with pytest.raises(UserError, match=r"the people key file .* does not exist"):
        gd.check_secrets_and_backends(path, _seen(f"VLLM_API_KEY={GW_KEY}\n", None))


def test_the_gateway_key_given_to_a_person_or_twice_is_refused(tmp_path, backend) -> None:
    """A person holding the gateway key could call every backend directly, unlogged; two VLLM_API_KEY lines leave
    which key the router presents to whoever reads the file. Neither message holds a key."""
    path = _recipe(tmp_path, [backend])
    with pytest.raises(UserError, match="gives alice the gateway key") as exc:
        gd.check_secrets_and_backends(path, _seen(f"VLLM_API_KEY={GW_KEY}\n", f"alice {GW_KEY}\n"))
    assert GW_KEY not in str(exc.value) and "give alice a key of their own" in exc.value.fix
    other = "ds4-" + "o" * 40
    with pytest.raises(UserError, match="has 2 VLLM_API_KEY lines") as exc:
        gd.check_secrets_and_backends(path, _seen(f"VLLM_API_KEY={GW_KEY}\nVLLM_API_KEY={other}\n",
                                                  "alice ds4p-alice-" + "a" * 30 + "\n"))
    assert GW_KEY not in str(exc.value) and other not in str(exc.value)


@pytest.mark.parametrize("seen", [[1], None, "x", {"key_file": {"exists": True, "mode": "rw"}},
                                  {"key_file": {"exists": True, "mode": 384}}, {"key_file": {"text": None}},
                                  {"ports_busy": ["x"]}, {"ports_busy": None}, {"key_fil": {}}])
def test_a_malformed_report_of_the_play_is_one_message(tmp_path, backend, seen) -> None:
    """The preflight's stdin is the play's report; anything else is refused naming it (it raised AttributeError,
    ValueError or TypeError before)."""
    with pytest.raises(UserError, match="the play's report of the gateway host is malformed"):
        gd.check_secrets_and_backends(_recipe(tmp_path, [backend]), seen)


def test_a_kept_metrics_key_file_must_be_0600_and_a_missing_one_is_generated(tmp_path, backend) -> None:
    path = _recipe(tmp_path, [backend])
    good = _seen(f"VLLM_API_KEY={GW_KEY}\n", "alice ds4p-alice-" + "a" * 30 + "\n")
    for mode in ("0644", "0640"):
        with pytest.raises(UserError, match=rf"the metrics key file .* has mode {mode}") as exc:
            gd.check_secrets_and_backends(path, {**good, "metrics_key_file": {"exists": True, "mode": mode}})
        assert "chmod 600" in exc.value.fix
    for fine in ({"exists": True, "mode": "0600"}, {"exists": False, "mode": "0000"}):
        assert gd.check_secrets_and_backends(path, {**good, "metrics_key_file": fine})


def test_status_prints_the_backends_of_a_gateway_report() -> None:
    out = io.StringIO()
    print_reports([{"node": "localhost", "role": "gateway", "rank": "0", "containers": "NAME STATUS\n",
                    "health": "200", "logs": "", "backends": "a http://127.0.0.1:1: ready\n"}], out)
    assert out.getvalue() == ("== localhost (gateway, rank 0) ==\nNAME STATUS\nGET /health -> 200\n"
                              "a http://127.0.0.1:1: ready\n")


@pytest.mark.tool  # runs the CLI in a subprocess on a pseudo-terminal
def test_gateway_preflight_prints_no_people_maps_to_a_terminal():
    """The maps it prints hold every person's key: on a terminal it refuses before reading anything."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "gateway", "preflight", "loopback"],
                           stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, text=True, timeout=120,
                           check=False)
    finally:
        os.close(follower)
        os.close(leader)
    assert p.returncode == 2 and "not to a terminal" in p.stderr and "Traceback" not in p.stderr, p.stderr
