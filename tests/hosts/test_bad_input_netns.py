"""Bad input stops provision.yml with one clear message before any host is changed.

Runs against freshly created test hosts (rails down, MTU 1500, no address) and proves after each refusal that
they are still exactly that: nothing was changed on any host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ds4deploy import preflight
from ds4deploy.checks import report, runner
from ds4deploy.recipe import load_recipe
from tests.hosts import testhosts
from tests.hosts.conftest import RECIPE, ds4, playbook


def _untouched() -> None:
    for node in testhosts.NODES:
        for dev in ("enp1s0f1np1", "enP2p1s0f1np1"):
            state = testhosts.sh(node, f"cat /sys/class/net/{dev}/mtu; ip -o -4 addr show dev {dev}").stdout
            assert state.strip() == "1500", f"{node} {dev} was changed: {state}"
        netplan = testhosts.NETNS_ETC / testhosts.netns(node) / "netplan" / "60-ds4deploy-rails.yaml"
        assert not netplan.exists()


def _inventory(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(testhosts.INVENTORY.read_text())
    edit(data["all"]["children"]["fabric_nodes"]["hosts"])
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_missing_rail_address(fresh_hosts, tmp_path):
    inv = _inventory(tmp_path, lambda hosts: hosts["node-b"]["ds4_rails"].pop("rail1"))
    done = playbook(inv)
    assert done.returncode != 0
    assert "node-b: ds4_rails.rail1.address is missing (rail rail1 on enP2p1s0f1np1, subnet 10.100.185.0/24)" in \
        done.stdout
    assert "nothing was changed" in done.stdout
    _untouched()


def test_same_address_on_two_nodes(fresh_hosts, tmp_path):
    def same(hosts):
        hosts["node-b"]["ds4_rails"]["rail0"]["address"] = "10.100.184.1"

    inv = _inventory(tmp_path, same)
    done = playbook(inv)
    assert done.returncode != 0
    assert "node-b: ds4_rails.rail0.address = 10.100.184.1 is also given to node-a (rail0)" in done.stdout
    _untouched()
    cli = ds4("check", "inputs", RECIPE, "--inventory", str(inv))
    assert cli.returncode == 2 and cli.stderr.startswith("error: 1 problem(s)") and "\nfix: " in cli.stderr


def test_unreachable_host(fresh_hosts, tmp_path):
    def third(hosts):
        # Nothing listens on 127.0.0.1:1, so ssh is refused at once: an unreachable host, on loopback only.
        hosts["node-c"] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
                           "ansible_python_interpreter": "/usr/bin/python3",
                           "ds4_rails": {"rail0": {"address": "10.100.184.3"}, "rail1": {"address": "10.100.185.3"}}}

    inv = _inventory(tmp_path, third)
    done = playbook(inv)
    assert done.returncode != 0
    assert "unreachable: node-c" in done.stdout and "Nothing was changed on any host" in done.stdout
    _untouched()
    rows = runner.run_checks(load_recipe(RECIPE), preflight.load_inventory(inv), ("rails",))
    reach = next(r for r in rows if r.host == "node-c")
    assert reach.check == "reach" and reach.verdict == report.ERROR
    assert not [r for r in rows if r.host == "node-c" and r.check != "reach"]
    cli = ds4("check", "run", "--recipe", RECIPE, "--inventory", str(inv), "--limit", "node-c")
    assert cli.returncode == 2, cli.stdout


@pytest.mark.parametrize("limit", ["node-a", "fabric_nodes"])
def test_limit_selects_hosts_and_groups(fresh_hosts, limit):
    done = ds4("check", "run", "--recipe", RECIPE, "--inventory", str(fresh_hosts), "--limit", limit,
               "--groups", "rails")
    assert "check gx10x2-ds4-flash-fp8: node-a" in done.stdout
    assert ("check gx10x2-ds4-flash-fp8: node-b" in done.stdout) == (limit == "fabric_nodes")
    assert done.returncode == 1  # fresh hosts: rails not configured yet
