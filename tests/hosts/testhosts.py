"""Two test hosts without hardware: network namespaces node-a and node-b joined by two veth pairs (the rails).

Each namespace stands for one node of a two-node recipe. The veth ends carry that node's own rail netdev names
inside their namespace (the recipe's, e.g. ``enp1s0f1np1`` on node-a, or the inventory's override: node-b is
cabled on the GX10's f0 port pair, ``enp1s0f0np0``), start down with MTU 1500 and no address, so the rails role
has everything to do. Ansible reaches a namespace with ``ansible_connection: local`` and a Python wrapper that runs
``ip netns exec <ns> python3`` (the inventory's ``ansible_python_interpreter``); the checks reach it with
``ds4_netns``. ``ip netns exec`` bind-mounts ``/etc/netns/<ns>/netplan`` over ``/etc/netplan``, so each test
host has its own netplan directory on this one machine.

    python -m tests.hosts.testhosts up gx10x2-ds4-flash-fp8    # create (idempotent: recreates)
    python -m tests.hosts.testhosts down                         # remove everything created here

Every name created here starts with ``provision-``: namespaces ``provision-node-a``/``-b``, transient veth names
``provision-<node><rail>``, /etc/netns/provision-*, /run/provision-test-hosts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from ds4deploy.plan.node_fabric import node_rails
from ds4deploy.recipe.load import load_recipe

NODES = ("node-a", "node-b")
PREFIX = "provision-"
RUN_DIR = Path("/run/provision-test-hosts")
NETNS_ETC = Path("/etc/netns")
REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "ansible" / "inventories" / "test-hosts.yml"


def host_vars() -> dict[str, dict]:
    """Each test host's variables as written in `INVENTORY` (group fabric_nodes)."""
    return yaml.safe_load(INVENTORY.read_text())["all"]["children"]["fabric_nodes"]["hosts"]


def netdevs(recipe_name: str) -> dict[str, list[str]]:
    """Test host -> its own rail netdev names, rail by rail (`ds4deploy.plan.node_fabric.node_rails`)."""
    recipe = load_recipe(recipe_name)
    return {node: [r.netdev for r in node_rails(recipe, node, hv)] for node, hv in host_vars().items()}


def netns(node: str) -> str:
    """The namespace name of test host `node`."""
    return f"{PREFIX}{node}"


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def sh(node: str, cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `cmd` with sh inside test host `node`'s namespace."""
    return subprocess.run(["ip", "netns", "exec", netns(node), "sh", "-c", cmd], check=check, capture_output=True,
                          text=True)


def down() -> None:
    """Remove the namespaces (their veth ends go with them), the per-namespace /etc and the wrappers."""
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for node in NODES:
        if netns(node) in existing.split():
            _ip("netns", "del", netns(node), check=False)
        shutil.rmtree(NETNS_ETC / netns(node), ignore_errors=True)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    if NETNS_ETC.is_dir() and not any(NETNS_ETC.iterdir()):
        NETNS_ETC.rmdir()  # created by up() when it did not exist; ip netns does not need it


def up(recipe_name: str) -> None:
    """Create both test hosts with one veth pair per rail of `recipe_name`'s fabric (recreated from scratch).

    Raises:
        SystemExit: the recipe has no fabric section.
    """
    recipe = load_recipe(recipe_name)
    if recipe.fabric is None:
        raise SystemExit(f"recipe {recipe_name} has no fabric: nothing to wire")
    down()
    Path("/etc/netplan").mkdir(exist_ok=True)  # the bind-mount target of /etc/netns/<ns>/netplan
    for node in NODES:
        _ip("netns", "add", netns(node))
        _ip("link", "set", "lo", "up", ns=netns(node))
        (NETNS_ETC / netns(node) / "netplan").mkdir(parents=True, exist_ok=True)
        wrapper = RUN_DIR / node / "python"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {netns(node)} /usr/bin/python3 "$@"\n')
        wrapper.chmod(0o755)
    names = netdevs(recipe_name)
    for i, _rail in enumerate(recipe.fabric.rails):
        a, b = f"{PREFIX}a{i}", f"{PREFIX}b{i}"
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        for end, node in ((a, NODES[0]), (b, NODES[1])):
            _ip("link", "set", end, "netns", netns(node))
            _ip("link", "set", end, "name", names[node][i], ns=netns(node))


def main(argv: list[str]) -> int:
    """``up <recipe>`` or ``down``."""
    if argv[:1] == ["up"] and len(argv) == 2:
        up(argv[1])
    elif argv == ["down"]:
        down()
    else:
        print("usage: testhosts.py up <recipe> | down", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
