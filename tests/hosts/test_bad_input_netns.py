"""Bad input stops provision.yml with one clear message before any host is changed.

Runs against freshly created test hosts (rails down, MTU 1500, no address) and proves after each refusal that
they are still exactly that, and that this machine's state (tests/support/fingerprint.py: /etc with each test
host's netplan directory, /opt/ds4deploy, /var/lib/ds4deploy, Docker's containers and images) is the same as
before: nothing was changed on any host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ds4deploy.checks import report, runner
from ds4deploy.plan.inventory import read_inventory
from ds4deploy.recipe.load import load_recipe
from tests.hosts import testhosts
from tests.hosts.conftest import RECIPE, ds4, playbook
from tests.support import fingerprint


def _untouched(before: fingerprint.Fingerprint) -> None:
    changes = fingerprint.diff(before, fingerprint.take())
    assert changes == [], "the refused run changed a host:\n" + "\n".join(changes[:40])
    for node, devs in testhosts.netdevs(RECIPE).items():
        for dev in devs:
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
    # Only the address goes: node-b keeps naming its own rail1 netdev (its f0 port), which the message names.
    inv = _inventory(tmp_path, lambda hosts: hosts["node-b"]["ds4_rails"]["rail1"].pop("address"))
    before = fingerprint.take()
    done = playbook(inv)
    assert done.returncode != 0
    assert "node-b: ds4_rails.rail1.address is missing (rail rail1 on enP2p1s0f0np0, subnet 10.100.185.0/24)" in \
        done.stdout
    assert "nothing was changed" in done.stdout
    _untouched(before)


def test_same_address_on_two_nodes(fresh_hosts, tmp_path):
    def same(hosts):
        hosts["node-b"]["ds4_rails"]["rail0"]["address"] = "10.100.184.1"

    inv = _inventory(tmp_path, same)
    before = fingerprint.take()
    done = playbook(inv)
    assert done.returncode != 0
    assert "node-b: ds4_rails.rail0.address = 10.100.184.1 is also given to node-a (rail0)" in done.stdout
    _untouched(before)
    cli = ds4("vars", RECIPE, "--inventory", str(inv), "--scope", "provision")
    assert cli.returncode == 2 and "\nerror: 1 problem(s)" in cli.stderr and "\nfix: " in cli.stderr


@pytest.mark.parametrize(("edit", "message"), [
    (lambda rails: rails["rail0"].update(hcas=["rocep1s0f0", "roceP2p1s0f0"]),
     "node-b: ds4_rails.rail0.hcas lists 2 HCA(s) (rocep1s0f0, roceP2p1s0f0), but the recipe's rail rail0 has 1"),
    (lambda rails: rails.update(rail2={"netdev": "enp1s0f0np0"}),
     "node-b: ds4_rails.rail2: recipe gx10x2-ds4-flash-fp8 has no rail 'rail2'"),
    (lambda rails: [rails["rail1"].pop(k) for k in ("netdev", "hcas")],
     "node-b: ds4_rails gives netdev for 1 of the recipe's 2 rails (rail0; not rail1)"),
])
def test_wrong_rail_name_override(fresh_hosts, tmp_path, edit, message):
    inv = _inventory(tmp_path, lambda hosts: edit(hosts["node-b"]["ds4_rails"]))
    before = fingerprint.take()
    done = playbook(inv)
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert message in out and "nothing was changed on any host" in out and "fix: give each rail the node's own" in out
    _untouched(before)


def test_unreachable_host(fresh_hosts, tmp_path):
    def third(hosts):
        # Nothing listens on 127.0.0.1:1, so ssh is refused at once: an unreachable host, on loopback only.
        hosts["node-c"] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
                           "ansible_python_interpreter": "/usr/bin/python3",
                           "ds4_rails": {"rail0": {"address": "10.100.184.3"}, "rail1": {"address": "10.100.185.3"}}}

    inv = _inventory(tmp_path, third)
    before = fingerprint.take()
    done = playbook(inv)
    assert done.returncode != 0
    assert "unreachable: node-c" in done.stdout and "Nothing was changed on any host" in done.stdout
    _untouched(before)
    rows = runner.run_checks(load_recipe(RECIPE), read_inventory(inv).hosts, ("rails",))
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


def test_one_node_with_other_gpus_stops_both_before_any_rail_changes(fresh_hosts):
    """node-b's nvidia-smi answers two RTX 3090s (compute capability 8.6) where the recipe needs one GB10: the
    preflight stops the run on every node (any_errors_fatal), so node-a's rails are not set up either."""
    before = fingerprint.take()
    done = playbook(fresh_hosts, gpus_node_b="NVIDIA GeForce RTX 3090, 8.6\\nNVIDIA GeForce RTX 3090, 8.6")
    assert done.returncode != 0
    assert "node-b has 2 NVIDIA GPU(s) (NVIDIA GeForce RTX 3090 compute 8.6; NVIDIA GeForce RTX 3090 compute 8.6)" \
        in done.stdout, done.stdout[-3000:]
    assert "needs 1 sm121 GPU(s) (compute capability 12.1) per node" in done.stdout
    assert "PLAY [Provision GPU and RoCE hosts" not in done.stdout
    _untouched(before)
