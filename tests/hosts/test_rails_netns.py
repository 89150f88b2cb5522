"""The rails role and the rail checks, for real, on two network namespaces joined by two veth rails.

Converges the test hosts with ansible/provision.yml (GX10 recipe: two rails, MTU 9000), proves the second run
changes nothing and `--check --diff` stays clean, validates the written netplan with the real `netplan generate`,
then breaks one thing at a time (same subnet on both rails, MTU 1500 on one end, rail down) and asserts the
check names it - and that the playbook repairs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from ds4deploy.checks import report, runner
from ds4deploy.plan.inventory import read_inventory
from ds4deploy.recipe.load import load_recipe
from tests.hosts import testhosts
from tests.hosts.conftest import BIN, RECIPE, ds4, playbook


def _recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    rows = re.findall(r"^(\S+)\s+:\s+(.*)$", out.split("PLAY RECAP", 1)[-1], flags=re.M)
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)} for host, rest in rows}


@pytest.fixture(scope="module")
def hosts(fresh_hosts):
    """The test hosts after one converging run of provision.yml; yields (inventory path, first run's output)."""
    done = playbook(fresh_hosts)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return fresh_hosts, done.stdout


def _rows(inventory: Path, groups=("rails",)) -> list[report.Row]:
    return runner.run_checks(load_recipe(RECIPE), read_inventory(inventory).hosts, groups)


def _row(rows, host, check) -> report.Row:
    return next(r for r in rows if r.host == host and r.check == check)


def test_first_run_configures_and_says_what_it_skipped(hosts):
    _inventory, out = hosts
    recap = _recap(out)
    assert recap["node-a"]["changed"] >= 2 and recap["node-b"]["changed"] >= 2
    # No GPU here: every GPU role says so instead of passing silently.
    assert "skipped: no NVIDIA GPU on node-a" in out
    assert "skipped: no NVIDIA GPU (no /dev/nvidiactl) on node-b" in out
    state = testhosts.sh("node-a", "ip -o -4 addr show dev enP2p1s0f1np1; cat /sys/class/net/enP2p1s0f1np1/mtu").stdout
    assert "10.100.185.1/24" in state and state.strip().endswith("9000")


def test_rail_checks_pass_and_hardware_checks_skip(hosts):
    inventory, _ = hosts
    rows = _rows(inventory, ("host", "rails", "fabric"))
    rails = [r for r in rows if r.group == "rails"]
    assert rails and all(r.verdict in (report.PASS, report.SKIP) for r in rails), [r for r in rails if
                                                                                   r.verdict != report.PASS]
    assert {r.check for r in rails if r.verdict == report.PASS} >= {
        "rails.address.rail0", "rails.address.rail1", "rails.mtu.rail0", "rails.mtu.rail1",
        "rails.jumbo.rail0.node-b", "rails.jumbo.rail1.node-b", "rails.route.rail1.node-b"}
    # veth has no physical speed; GPU and RDMA rows are skips with the reason, never passes.
    assert all(r.verdict == report.SKIP and "virtual netdev" in r.measured for r in rails if ".speed." in r.check)
    hw = [r for r in rows if r.group in ("gpu", "fabric")]
    assert hw and all(r.verdict == report.SKIP for r in hw), [r for r in hw if r.verdict != report.SKIP]
    assert {r.measured for r in hw if r.group == "gpu"} == {"skipped: no NVIDIA GPU"}
    assert all("no RDMA device" in r.measured for r in hw if r.group == "fabric")


def test_make_check_exit_code_on_the_rails(hosts):
    inventory, _ = hosts
    done = ds4("check", "run", "--recipe", RECIPE, "--inventory", str(inventory), "--groups", "rails,fabric")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "check gx10x2-ds4-flash-fp8: node-a" in done.stdout and "0 failed" in done.stdout
    strict = ds4("check", "run", "--recipe", RECIPE, "--inventory", str(inventory), "--groups", "fabric",
                 "--require-hardware")
    assert strict.returncode == 1


def test_testinfra_runs_the_same_checks_per_host_group(hosts):
    inventory, _ = hosts
    env = {**os.environ, "DS4_RECIPE": RECIPE, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", "-rs", "tests/infra/test_rails.py",
                           "tests/infra/test_fabric.py", "--hosts=ansible://fabric_nodes",
                           f"--ansible-inventory={inventory}"], capture_output=True, text=True, env=env,
                          cwd=testhosts.REPO, check=False, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout and "skipped: no RDMA device" in done.stdout


def test_second_run_changes_nothing_and_check_mode_is_clean(hosts):
    inventory, _ = hosts
    again = playbook(inventory)
    assert again.returncode == 0, again.stdout[-3000:]
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in _recap(again.stdout).values()), again.stdout[-3000:]
    dry = playbook(inventory, check=True)
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert all(c["changed"] == 0 for c in _recap(dry.stdout).values()), dry.stdout[-3000:]


def test_written_netplan_passes_real_netplan_generate(hosts):
    for node in testhosts.NODES:
        written = testhosts.NETNS_ETC / testhosts.netns(node) / "netplan" / "60-ds4deploy-rails.yaml"
        text = written.read_text()
        network = yaml.safe_load(text)["network"]
        assert set(network) == {"version", "ethernets"}  # no bonds, no vlans
        for dev in network["ethernets"].values():
            assert dev["dhcp4"] is False and dev["dhcp6"] is False and dev["link-local"] == [] and dev["mtu"] == 9000
        assert oct(written.stat().st_mode & 0o777) == "0o600"
        with tempfile.TemporaryDirectory() as root:
            (Path(root) / "etc" / "netplan").mkdir(parents=True)
            (Path(root) / "etc" / "netplan" / written.name).write_text(text)
            (Path(root) / "etc" / "netplan" / written.name).chmod(0o600)
            gen = subprocess.run(["netplan", "generate", "--root-dir", root], capture_output=True, text=True,
                                 check=False)
            assert gen.returncode == 0, gen.stderr
            network = sorted(p.name for p in (Path(root) / "run" / "systemd" / "network").glob("*.network"))
            # Each node's own netdevs: node-a the recipe's f1 port pair, node-b its f0 pair (inventory override).
            assert network == sorted(f"10-netplan-{d}.network" for d in testhosts.netdevs(RECIPE)[node]), node
            unit = (Path(root) / "run" / "systemd" / "network" / network[0]).read_text()
            assert "MTUBytes=9000" in unit and "Address=10.100.185." in unit and "LinkLocalAddressing=no" in unit
    # The same validator refuses a broken file (so the role's `validate:` can fail).
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "etc" / "netplan").mkdir(parents=True)
        bad = Path(root) / "etc" / "netplan" / "60-bad.yaml"
        bad.write_text("network:\n  version: 2\n  ethernets:\n    eth0:\n      mtu: jumbo\n")
        bad.chmod(0o600)
        gen = subprocess.run(["netplan", "generate", "--root-dir", root], capture_output=True, text=True, check=False)
        assert gen.returncode != 0


FAULTS = {
    # node, command, (host, check) that must fail, text its measured/remediation column must contain
    "same subnet on both rails": (
        "node-a", "ip addr flush dev enP2p1s0f1np1 && ip addr add 10.100.184.11/24 dev enP2p1s0f1np1",
        [("node-a", "rails.address.rail1", "in rail0's subnet 10.100.184.0/24"),
         ("node-a", "rails.route.rail1.node-b", "no route"),
         ("node-b", "rails.jumbo.rail1.node-a", "does not answer")]),
    "MTU 1500 on one end": (
        "node-b", "ip link set dev enp1s0f0np0 mtu 1500",
        [("node-b", "rails.mtu.rail0", "1500"),
         ("node-a", "rails.jumbo.rail0.node-b", "small pings reply, 8972-byte DF pings do not")]),
    "rail down": (
        "node-b", "ip link set dev enP2p1s0f0np0 down",
        [("node-b", "rails.link.rail1", "operstate down"),
         ("node-a", "rails.jumbo.rail1.node-b", "")]),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_injected_fault_is_diagnosed_and_repaired(hosts, fault):
    inventory, _ = hosts
    node, cmd, expect = FAULTS[fault]
    testhosts.sh(node, cmd)
    rows = _rows(inventory)
    for host, check, text in expect:
        row = _row(rows, host, check)
        assert row.verdict == report.FAIL, row
        assert text in row.measured + " " + row.remediation, row
        assert row.remediation
    assert report.exit_code(rows) == 1
    # The playbook puts the rail back; then every rail check passes again.
    fixed = playbook(inventory, tags="rails")
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert _recap(fixed.stdout)[node]["changed"] >= 1
    after = _rows(inventory)
    assert all(r.verdict in (report.PASS, report.SKIP) for r in after), [r for r in after if r.verdict == report.FAIL]
