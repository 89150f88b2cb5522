"""The multi-node plan (ds4deploy.plan.nodes) and the workers' rendezvous-port probe, on real inventories and
sockets."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.plan.nodes import plan, plan_from_inventory
from ds4deploy.recipe.load import load_recipe

REPO = Path(__file__).resolve().parents[2]


def _hosts(**over):
    hosts = {"node-a": {"ansible_connection": "local", "ds4_node_rank": 0, "ds4_host_ip": "172.31.251.10"},
             "node-b": {"ansible_connection": "local", "ds4_node_rank": 1, "ds4_host_ip": "172.31.251.11"}}
    for name, hv in over.items():
        if hv is None:
            hosts.pop(name)
        else:
            hosts[name] = {**hosts.get(name, {}), **hv}
    return hosts


def test_committed_two_node_inventory_plans_head_and_worker():
    nodes = plan_from_inventory(load_recipe("cpu-2node-tp"), REPO / "ansible/inventories/two-node-local.yml")
    assert [(n.name, n.role, n.rank, n.compose_file) for n in nodes] == [
        ("node-a", "head", 0, "compose.head.yaml"), ("node-b", "worker", 1, "compose.worker.yaml")]
    assert nodes[1].launch_env() == {"DS4_NODE_RANK": "1", "DS4_MASTER_ADDR": "172.31.251.10",
                                     "DS4_HOST_IP": "172.31.251.11", "DS4_CPU_BIND": "1"}


def test_one_node_recipe_is_a_single_stack_per_host():
    nodes = plan(load_recipe("cpu"), {"localhost": {"ansible_connection": "local"}})
    assert [(n.role, n.compose_file, n.launch_env()) for n in nodes] == [("single", "compose.yaml", {})]


@pytest.mark.parametrize(("over", "message"), [
    ({"node-b": {"ds4_node_rank": 0}}, "both have ds4_node_rank 0"),
    ({"node-a": None}, "no head in the inventory"),
    ({"node-c": {"ds4_node_rank": 2, "ds4_host_ip": "172.31.251.12"}}, "runs on 2 nodes but the inventory has 3"),
    ({"node-b": {"ds4_node_rank": 5}}, "needs 0..1"),
    ({"node-b": {"ds4_host_ip": "172.31.251.10"}}, "both have address 172.31.251.10"),
    ({"node-b": {"ds4_host_ip": None}}, "is not an IP address"),
    ({"node-b": {"ds4_host_ip": "10.9.9.9"}}, "outside the node network"),
])
def test_bad_inventories_are_refused_with_the_cause(over, message):
    hosts = _hosts(**over)
    if "node-b" in hosts and hosts["node-b"].get("ds4_host_ip", "") is None:
        hosts["node-b"]["ds4_host_ip"] = "not-an-ip"
    with pytest.raises(UserError, match=message) as exc:
        plan(load_recipe("cpu-2node-tp"), hosts)
    assert exc.value.fix


def test_gx10_nodes_take_their_address_from_the_first_rail_and_may_not_share_a_machine():
    recipe = load_recipe("gx10x2-ds4-flash-fp8")
    hosts = {"spark-a": {"ansible_host": "10.0.0.1", "ds4_node_rank": 0,
                         "ds4_rails": {"rail0": {"address": "10.100.184.1"}, "rail1": {"address": "10.100.185.1"}}},
             "spark-b": {"ansible_host": "10.0.0.2", "ds4_node_rank": 1,
                         "ds4_rails": {"rail0": {"address": "10.100.184.2"}, "rail1": {"address": "10.100.185.2"}}}}
    nodes = plan(recipe, hosts)
    assert [n.host_ip for n in nodes] == ["10.100.184.1", "10.100.184.2"]
    assert {n.master_addr for n in nodes} == {"10.100.184.1"}
    # The recipe's first rail (where the socket ifnames point), whatever order the inventory lists the rails in.
    hosts["spark-b"]["ds4_rails"] = dict(reversed(hosts["spark-b"]["ds4_rails"].items()))
    assert [n.host_ip for n in plan(recipe, hosts)] == ["10.100.184.1", "10.100.184.2"]
    hosts["spark-b"]["ansible_host"] = "10.0.0.1"
    with pytest.raises(UserError, match="are the same machine"):
        plan(recipe, hosts)
    del hosts["spark-b"]["ds4_rails"]
    hosts["spark-b"]["ansible_host"] = "10.0.0.2"
    with pytest.raises(UserError, match="has no ds4_host_ip"):
        plan(recipe, hosts)


def _probe_module():
    path = REPO / "ansible/roles/stack/files/port_probe.py"
    spec = importlib.util.spec_from_file_location("port_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_port_probe_needs_a_listener(tmp_path):
    """The head listens (the real script, as the deploy starts it), a worker's probe connects: open. A closed port
    is not enough (a firewall REJECT looks the same), nor is an address nobody answers for."""
    import subprocess
    import sys
    import time

    script = REPO / "ansible/roles/stack/files/port_probe.py"
    probe = _probe_module().probe
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert probe("127.0.0.1", port)["verdict"] == "refused"
    listener = subprocess.Popen([sys.executable, str(script), "listen", str(port), "20"], stdout=subprocess.PIPE,
                                text=True)
    try:
        assert '"listening"' in listener.stdout.readline()
        worker = subprocess.run([sys.executable, str(script), "127.0.0.1", str(port), "5"], capture_output=True,
                                text=True, check=False)
        assert worker.returncode == 0 and '"open"' in worker.stdout
        # A second head on the same port: the deploy must say the port is taken.
        second = subprocess.run([sys.executable, str(script), "listen", str(port), "1"], capture_output=True,
                                text=True, check=False)
        assert second.returncode == 2 and '"in-use"' in second.stdout
    finally:
        listener.kill()
        listener.wait()
    t0 = time.monotonic()
    assert probe("192.0.2.1", 29501, timeout_s=1)["verdict"] != "open"
    assert time.monotonic() - t0 < 10


def test_the_head_listener_frees_the_port_once_every_worker_has_probed():
    """With the worker count given, the listener exits after that many probes, long before its time limit, and the
    port is free for the head's engine (a listener that kept it made the head fail to bind: found by the
    rehearsal)."""
    import subprocess
    import sys

    script = REPO / "ansible/roles/stack/files/port_probe.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listener = subprocess.Popen([sys.executable, str(script), "listen", str(port), "120", "2"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert '"listening"' in listener.stdout.readline()
        for _ in range(2):
            worker = subprocess.run([sys.executable, str(script), "127.0.0.1", str(port), "5"],
                                    capture_output=True, text=True, check=False)
            assert worker.returncode == 0, worker.stdout
        assert listener.wait(timeout=30) == 0  # left after the second probe, not after 120 s
    finally:
        listener.kill()
        listener.wait()
    with socket.socket() as s:  # the engine can bind the master port now
        # As torch's TCPStore does (SO_REUSEADDR, c10d socket.cpp): the probes' closed connections may sit in
        # TIME_WAIT on this port, which only a bind without the option refuses.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
