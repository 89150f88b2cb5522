"""The supervisor watching a gateway (ds4deploy.operate.gateway_supervise): the committed loopback gateway's real
target, built from recipes/gateways/loopback.yaml and the local inventory, with its Docker, HTTP, incident and
playbook calls scripted, judged by the real `supervise` on a fake clock (as tests/unit/test_supervise.py does).
The CLI's parsing of a gateway name, and the refusal of a name that is both a gateway and a stack recipe, run the
real CLI. A real restart is proven by tests/gateway/test_deployed.py (docker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.operate import gateway_supervise, service
from ds4deploy.operate.incidents import Incident
from ds4deploy.operate.supervisor import Journal, Policy, supervise
from ds4deploy.render import gateway
from tests.unit.conftest import REPO, run_cli
from tests.unit.test_supervise import FakeClock

LOCAL = REPO / "ansible" / "inventories" / "local.yml"


class Scripted:
    """The gateway host's answers: `health[i]` is the door's /health at check i (True = 200; healthy after the
    script), `states[i]` the project's container state at check i ("running" after the script). Records every
    project asked about, every incident and every playbook run; a restart takes `restart_s` on the clock."""

    def __init__(self, clock: FakeClock, health: list[bool] = (), states: list[str] = (), restart_s: float = 40):
        self.clock, self.health, self.states, self.restart_s = clock, list(health), list(states), restart_s
        self.checks = self.ps = 0
        self.projects: list[tuple[str, str]] = []
        self.urls: list[str] = []
        self.incidents: list[tuple[str, list, str]] = []
        self.playbooks: list[tuple[str, list[str], float]] = []

    def project_state(self, node: str, hostvars: dict, project: str) -> str:
        self.projects.append((node, project))
        self.ps += 1
        return self.states[self.ps - 1] if self.ps <= len(self.states) else "running"

    def get_health(self, url: str, timeout_s: float) -> tuple[bool, str]:
        self.urls.append(url)
        self.checks += 1
        ok = self.health[self.checks - 1] if self.checks <= len(self.health) else True
        return (True, "GET /health -> 200") if ok else (False, "GET /health: ReadTimeout")

    def collect_projects(self, name, targets, hosts, reason, *a, **kw) -> Incident:
        self.incidents.append((name, targets, reason))
        return Incident(Path(f"/incidents/{name}/{len(self.incidents)}"))

    def run_playbook(self, playbook, inventory, extra, timeout_s, log) -> tuple[bool, float]:
        self.playbooks.append((playbook, extra, self.clock.now))
        self.clock.now += self.restart_s
        return True, self.restart_s


@pytest.fixture
def loopback(monkeypatch):
    """The loopback gateway's real target on the local inventory, its outside calls answered by a `Scripted`."""
    clock = FakeClock()
    host = Scripted(clock)
    for name in ("project_state", "get_health", "collect_projects", "run_playbook"):
        monkeypatch.setattr(gateway_supervise, name, getattr(host, name))
    target = gateway_supervise.make_gateway_target(gateway.load_gateway("loopback"), LOCAL)
    return target, host, clock


def _run(tmp_path, target, clock, cycles: int) -> list[dict]:
    journal = Journal(tmp_path / "loopback.jsonl")
    assert supervise(target, Policy(), journal, max_cycles=cycles, sleep=clock.sleep, clock=clock) == 0
    return [json.loads(ln) for ln in journal.path.read_text().splitlines()]


def test_an_unhealthy_door_is_restarted_after_the_policy_s_misses_its_incident_first(tmp_path, loopback):
    """The door answers /health no more while both containers run (the case Docker's restart policy leaves alone):
    one miss is not a restart, the second (Policy.failures_to_restart) is; the router's and the door's evidence is
    saved as gateway-loopback first, then ansible/gateway-restart.yml runs for this gateway; then it is healthy."""
    target, host, clock = loopback
    host.health = [True, False, False]
    events = _run(tmp_path, target, clock, cycles=6)
    assert Policy().failures_to_restart == 2
    # "engine" again after the restart: a new gateway, judged afresh.
    assert [e["event"] for e in events] == ["start", "engine", "failure", "restarted", "engine"]
    start, engine, failure, restarted, _ = events
    assert start["recipe"] == "loopback" and start["url"] == "http://127.0.0.1:18140"
    assert start["nodes"] == {"localhost": "gateway"}
    assert engine["state"] == "unreadable" and "a gateway has no engine counters" in engine["detail"]
    assert failure["reason"] == "unhealthy" and failure["detail"] == "GET /health: ReadTimeout"
    assert failure["incident"] == "/incidents/gateway-loopback/1"
    assert host.incidents == [("gateway-loopback", [("localhost", "gateway", "ds4-gw-loopback")],
                               "supervisor: unhealthy (GET /health: ReadTimeout)")]
    assert [(p, e) for p, e, _ in host.playbooks] == [("gateway-restart.yml", ["gateway=loopback"])]
    assert host.playbooks[0][2] == 2 * Policy().interval_s  # checks at 0, 10 (miss), 20 (miss, restart)
    assert restarted["reason"] == "unhealthy" and restarted["incident"] == failure["incident"]
    assert set(host.urls) == {"http://127.0.0.1:18140"}
    assert set(host.projects) == {("localhost", "ds4-gw-loopback")}


def test_a_stopped_gateway_container_is_restarted_at_once(tmp_path, loopback):
    """A router that exited (or a door paused) with the door still answering: restarted at the first look."""
    target, host, clock = loopback
    host.states = ["exited"]
    events = _run(tmp_path, target, clock, cycles=3)
    assert [e["event"] for e in events][:3] == ["start", "failure", "restarted"]
    assert events[1]["reason"] == "engine-down" and events[1]["states"] == {"localhost": "exited"}
    assert [p for p, _, _ in host.playbooks] == ["gateway-restart.yml"] and host.playbooks[0][2] == 0
    assert len(host.incidents) == 1


def test_a_healthy_gateway_is_left_alone(tmp_path, loopback):
    """Running containers and a door answering 200: never restarted and never probed with a key (no engine to
    freeze behind the door), over longer than a probe period."""
    target, host, clock = loopback
    events = _run(tmp_path, target, clock, cycles=12)
    assert [e["event"] for e in events] == ["start", "engine"]
    assert host.playbooks == [] and host.incidents == [] and host.checks == 12


def test_a_loopback_door_on_another_host_is_refused(tmp_path):
    """The supervisor on this control host could never reach 127.0.0.1 of another host: one message with the fix."""
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    gw1:\n      ansible_host: 10.0.0.9\n")
    with pytest.raises(UserError) as e:
        gateway_supervise.make_gateway_target(gateway.load_gateway("loopback"), inv)
    assert "listens on 127.0.0.1 of gw1" in e.value.cause and "bind_address" in e.value.fix


def test_the_deploy_refuses_that_door_before_any_change(tmp_path):
    """The same refusal comes from `ds4deploy gateway vars --scope deploy`, the deploy's first command, so a deploy
    never ends with the gateway up and unsupervised; status and down (scope operate) still plan."""
    from ds4deploy.operate import gateway_deploy
    from ds4deploy.plan.inventory import read_inventory

    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    gw1:\n      ansible_host: 10.0.0.9\n")
    with pytest.raises(UserError) as e:
        gateway_deploy.plan_vars("loopback", inv, read_inventory(inv), scope="deploy")
    assert "listens on 127.0.0.1 of gw1, which its supervisor on this control host cannot reach" in e.value.cause
    assert gateway_deploy.plan_vars("loopback", inv, read_inventory(inv), scope="operate")["ds4_gw_name"] == "loopback"


def test_gateway_names_parse_and_the_service_is_named_after_the_gateway(tmp_path, monkeypatch):
    """`supervise` / `supervisor` take a gateway's name: the gateway recipe is loaded (not a stack recipe), its
    service, record, journal and install are named after it; an unknown name is one message, no traceback."""
    assert gateway_supervise.is_gateway("loopback") and not gateway_supervise.is_gateway("cpu")
    gw = gateway.load_gateway("loopback")
    monkeypatch.setattr(service, "STACKS_DIR", tmp_path / "stacks")
    monkeypatch.setattr(service, "SYSTEMD_RUNTIME", tmp_path / "no-systemd")
    assert service.unit_name(gw) == "ds4deploy-supervise-loopback.service"
    assert service.Service(gw).record == tmp_path / "stacks" / "loopback" / "supervise.json"
    assert service.status(gw) == {"mode": "process", "running": False}
    p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "supervisor", "status", "loopback"], capture_output=True,
                       text=True, env={**os.environ, "DS4_STACKS_DIR": str(tmp_path / "stacks")}, timeout=300,
                       check=False)
    assert p.returncode == 1 and "supervisor of loopback: NOT running" in p.stdout, p.stdout + p.stderr
    p = run_cli("supervise", "no-such-gateway-or-recipe", "--cycles", "1")
    assert p.returncode != 0 and "Traceback" not in p.stderr and "no-such-gateway-or-recipe" in p.stderr


def test_a_name_that_is_both_a_gateway_and_a_stack_recipe_is_refused(tmp_path, monkeypatch):
    """A gateway named as a stack recipe: `supervisor` refuses it with load_gateway's message (the deploy refuses it
    too), rather than supervising one of the two."""
    from ds4deploy import cli
    from ds4deploy.recipe import paths

    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    shutil.copy(recipes / "gateways" / "loopback.yaml", recipes / "gateways" / "cpu.yaml")
    text = (recipes / "gateways" / "cpu.yaml").read_text().replace("name: loopback", "name: cpu")
    (recipes / "gateways" / "cpu.yaml").write_text(text)
    monkeypatch.setattr(paths, "RECIPES_DIR", recipes)
    with pytest.raises(UserError, match="is also the name of the stack recipe"):
        cli._supervised("cpu")
