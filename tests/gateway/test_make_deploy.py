"""`make deploy RECIPE=loopback` refusing bad input before anything changes (`make e2e-gateway`; docs/gateway.md,
"Deploy"). The deploy itself, `make status` and `make down` are proven in test_deployed.py, whose gateway is this
recipe deployed by `make deploy`; this module runs after it (the gateway is down again) against the same backends.

Proven here, with the real make target and the local inventory (this host is the gateway host), in one refused run:
backend b down (unreachable), the gateway key refused by a and c (not beside their own key), one person's key given
to another, a port of the gateway held by another process; then, with `ds4deploy gateway vars` (the first command
`make deploy` runs, on the control host): a recipe backend whose recipe is not deployed on its host, and two
backends serving one model name with different models. After each: no gateway container, no copy of the render, no
people maps, and no key in the message.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from ds4deploy.operate.gateway_deploy import STACKS_ROOT
from ds4deploy.render import gateway
from tools import gateway_rig as backends
from tools.gateway_rig import GATEWAY, REPO, docker, gateway_containers, make, write_secret

NAME = GATEWAY


def assert_nothing_changed(gw, out: str, keys: list[str]) -> None:
    """No container, no copy of the render, no people maps, no metrics key generated; no key in the output."""
    assert gateway_containers() == [], out
    assert not Path(f"{STACKS_ROOT}/{NAME}").exists(), out
    assert not gateway.people_dir(gw).exists(), out
    assert not Path(gw.metrics_key_file).exists(), out
    for k in keys:
        assert k not in out


@pytest.fixture(scope="module")
def loopback(office_backends):
    """The loopback gateway's key files on this host (its recipe's paths), the backends running; everything the
    module made is removed at the end."""
    backends.revive(*backends.BACKEND_PORTS)  # an earlier module's last test killed a backend
    gw = gateway.load_gateway(NAME)
    key_file, people_file = Path(gw.key_file), Path(gw.people_key_file)
    made = [key_file, people_file, Path(gw.metrics_key_file)]
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
    squatter = socket.create_server(("127.0.0.1", gw.router_metrics_port))  # another process holds a gateway port
    try:
        p = make("deploy")
    finally:
        squatter.close()
        backends.revive("b")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "cannot be deployed" in out, out
    assert "backend 'b' does not answer at http://127.0.0.1:18122" in out, out
    for b in ("a", "c"):
        assert f"backend '{b}' refuses the gateway key (HTTP 401" in out, out
    assert "line 2 gives 'bob' the key of 'alice' (line 1)" in out, out
    assert f"port(s) {gw.router_metrics_port} on the gateway host are in use by another process" in out, out
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
