"""`make deploy / status / down RECIPE=loopback`: the committed gateway recipe deployed through Ansible in front of
the three running backends of tests/gateway/backends.py (`make e2e-gateway`; docs/gateway.md, "Deploy").

Proven here, with the real make targets and the local inventory (this host is the gateway host):

- bad input refused before anything changes, in one run: backend b down (unreachable), the gateway key refused by
  a and c (not beside their own key), one person's key given to another; then, with `ds4deploy gateway vars` (the
  first command `make deploy` runs, on the control host): a recipe backend whose recipe is not deployed on its
  host, and two backends serving one model name with different models. After each: no gateway container, no copy
  of the render, no people maps, and no key in the message;
- the deploy: the committed render on the gateway host byte for byte, the people maps, both containers healthy, a
  request with a person's key answered through it;
- `make status`: the front door's /health and each backend ready in the router's pool;
- `make down`: the router's and the front door's logs saved in an incident folder first (the request's log line
  in it), then nothing of the gateway running.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.operate.gateway_deploy import STACKS_ROOT
from ds4deploy.operate.incidents import INCIDENTS_ROOT
from ds4deploy.render import gateway
from tests.gateway import backends
from tests.gateway.backends import REPO, docker, write_secret

NAME = "loopback"
INVENTORY = "ansible/inventories/local.yml"


def make(target: str, **variables: str) -> subprocess.CompletedProcess:
    """`make <target> RECIPE=loopback INVENTORY=<local>` in the repository (no colours), output captured."""
    args = [f"{k}={v}" for k, v in {"RECIPE": NAME, "INVENTORY": INVENTORY, **variables}.items()]
    return subprocess.run(["make", "--no-print-directory", target, *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "CI": "1", "ANSIBLE_NOCOLOR": "1"}, timeout=600, check=False)


def gateway_containers() -> list[str]:
    """Every container of the gateway's compose project, running or not."""
    return docker("ps", "--all", "--filter", f"label=com.docker.compose.project=ds4-gw-{NAME}",
                  "--format", "{{.Names}}").stdout.split()


def assert_nothing_changed(gw, out: str, keys: list[str]) -> None:
    """No container, no copy of the render, no people maps; no key in the output."""
    assert gateway_containers() == [], out
    assert not Path(f"{STACKS_ROOT}/{NAME}").exists(), out
    assert not gateway.people_dir(gw).exists(), out
    for k in keys:
        assert k not in out


@pytest.fixture(scope="module")
def loopback(office_backends):
    """The loopback gateway's key files on this host (its recipe's paths), the backends running; everything the
    module made is removed at the end (the incident folders are kept: evidence)."""
    backends.revive(*backends.BACKEND_PORTS)  # an earlier module's last test killed a backend
    gw = gateway.load_gateway(NAME)
    key_file, people_file = Path(gw.key_file), Path(gw.people_key_file)
    made = [key_file, people_file, Path(gateway.metrics_key_file(gw))]
    if any(p.exists() for p in made) or gateway_containers():
        pytest.skip(f"{key_file} or the {NAME} gateway exists already: not this test's to replace")
    key_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    people = {p.name: f"ds4p-{p.name}-" + secrets.token_urlsafe(30) for p in gw.people}
    try:
        yield {"gw": gw, "key_file": key_file, "people_file": people_file, "people": people,
               "gw_key": office_backends["gw_key"]}
    finally:
        subprocess.run(["docker", "compose", "-p", f"ds4-gw-{NAME}", "down", "--timeout", "10"], capture_output=True,
                       check=False)
        for p in made:
            p.unlink(missing_ok=True)
        shutil.rmtree(gateway.people_dir(gw), ignore_errors=True)
        shutil.rmtree(f"{STACKS_ROOT}/{NAME}", ignore_errors=True)


def test_bad_input_is_refused_before_anything_changes(loopback, tmp_path) -> None:
    gw = loopback["gw"]
    wrong_key = "ds4-" + secrets.token_hex(20)
    write_secret(loopback["key_file"], f"VLLM_API_KEY={wrong_key}\n")
    alice = loopback["people"]["alice"]
    write_secret(loopback["people_file"], f"alice {alice}\nbob {alice}\n")
    docker("stop", backends.containers("b")[1])  # backend b's front door: b does not answer
    try:
        p = make("deploy")
    finally:
        backends.revive("b")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "cannot be deployed" in out, out
    assert "backend 'b' does not answer at http://127.0.0.1:18122" in out, out
    for b in ("a", "c"):
        assert f"backend '{b}' refuses the gateway key (HTTP 401" in out, out
    assert "line 2 gives 'bob' the key of 'alice' (line 1)" in out, out
    assert "Nothing was changed on any host" in out, out
    assert_nothing_changed(gw, out, [wrong_key, alice])

    # The control-host checks `make deploy` runs first (`ds4deploy gateway vars`), on recipes that cannot be
    # committed: a recipe backend whose recipe is not running on its host, two backends of one name, two models.
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "children": {"gateway": {"hosts": {"localhost": {"ansible_connection": "local"}}}},
        "hosts": {"box-a.office.lan": {"ansible_connection": "local"}}}}))
    doc = yaml.safe_load((REPO / "recipes" / "gateways" / f"{NAME}.yaml").read_text())
    cases = {
        "not-deployed": ({"name": "x", "recipe": "gx10x2-ds4-flash-fp8", "host": "box-a.office.lan"},
                         "backend 'x': recipe 'gx10x2-ds4-flash-fp8' is not deployed on box-a.office.lan (no running "
                         "container of compose project ds4-gx10x2-ds4-flash-fp8-node0)"),
        "two-models": ({"name": "x", "url": "http://127.0.0.1:18129", "models": ["office-tiny"],
                        "manifest_sha256": "0" * 64},
                       "model name 'office-tiny' is served by backends with different models"),
    }
    for case, (backend, message) in cases.items():
        path = tmp_path / case / f"{NAME}.yaml"
        path.parent.mkdir()
        path.write_text(yaml.safe_dump({**doc, "backends": [*doc["backends"], backend]}, sort_keys=False))
        p = subprocess.run([str(REPO / ".venv" / "bin" / "ds4deploy"), "gateway", "vars", str(path), "--inventory",
                            str(inventory), "--scope", "deploy"], cwd=REPO, capture_output=True, text=True,
                           check=False)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, (case, p.stderr)
        assert_nothing_changed(gw, p.stdout + p.stderr, [])


def test_deploy_status_request_and_down(loopback) -> None:
    gw = loopback["gw"]
    write_secret(loopback["key_file"], f"VLLM_API_KEY={loopback['gw_key']}\n")
    write_secret(loopback["people_file"], "".join(f"{p} {k}\n" for p, k in loopback["people"].items()))
    p = make("deploy")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert loopback["gw_key"] not in out and loopback["people"]["alice"] not in out
    here = REPO / "compose" / "gateways" / NAME
    there = Path(f"{STACKS_ROOT}/{NAME}")
    assert sorted(f.name for f in there.iterdir()) == sorted(f.name for f in here.iterdir())
    for f in here.iterdir():
        assert (there / f.name).read_bytes() == f.read_bytes(), f.name
    metrics = Path(gateway.metrics_key_file(gw))  # generated on first deploy, as a stack's
    assert metrics.stat().st_mode & 0o777 == 0o600 and metrics.read_text().startswith("DS4_METRICS_KEY=ds4m-")

    url = f"http://{gw.bind_address}:{gw.port}"
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   headers={"authorization": f"Bearer {loopback['people']['alice']}"},
                   json={"model": "office-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{url}/v1/models", headers={"x-api-key": "ds4p-nobody-" + "x" * 30},
                     timeout=30).status_code == 401

    p = make("status")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "GET /health -> 200" in out, out
    for b, port in backends.BACKEND_PORTS.items():
        assert f"{b} http://127.0.0.1:{port}: ready" in out, out
    assert f"ds4-gw-{NAME}-router" in out and f"ds4-gw-{NAME}-front-door" in out, out
    assert loopback["gw_key"] not in out

    before = set((INCIDENTS_ROOT / f"gateway-{NAME}").glob("*"))
    p = make("down")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert gateway_containers() == [], out
    new = sorted(set((INCIDENTS_ROOT / f"gateway-{NAME}").glob("*")) - before)
    assert len(new) == 1, out
    saved = {f.name for f in new[0].iterdir()}
    door_log = f"localhost.ds4-gw-{NAME}-front-door.log"
    assert {door_log, f"localhost.ds4-gw-{NAME}-router.log", "incident.json"} <= saved, saved
    lines = [json.loads(ln.split(" ", 1)[1]) for ln in (new[0] / door_log).read_text().splitlines()
             if '"person"' in ln]
    assert any(ln["person"] == "alice" and ln["path"] == "/v1/chat/completions" and ln["status"] == 200
               for ln in lines), lines
    assert loopback["gw_key"] not in (new[0] / door_log).read_text()
