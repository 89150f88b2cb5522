"""Each node's RoCE v2 GID index on two fabric nodes, read on the node by the module ds4_gid_index
(ansible/library): the preflight role's real task file (ansible/roles/preflight/tasks/fabric.yml, which checks it
before anything changes) and the stack role's (ansible/roles/stack/tasks/launch_env.yml, which reads it again and
writes it into the .env; ansible/restart.yml runs only this one), run by ansible-playbook against localhost
(connection local), each node's sysfs root (ds4_sysfs_root) pointed at a GID-table tree, with the real recipe
recipes/gx10x2-ds4-flash-fp8.yaml and each node's own rails and interface names as `ds4deploy vars` derives them
(ds4deploy.plan.node_fabric: ds4_node_rails and the node plan's launch env).

Node A is the published GB10 table (spark-0e68, index 3), cabled as the recipe names it (the f1 port pair); node
B is cabled on its f0 port pair (its inventory overrides the rail netdev and HCA names) and its table is the same
one with the HCAs renamed to their f0 twins and only the slot index moved 3 -> 4 (tests/support/gid_trees.py),
so the peer's GIDs keep spark-0e68's addresses and node B's inventory gives those addresses (only the launch env
runs here; the node plan that refuses one address on two nodes is tested in tests/unit/test_nodes.py). Each
node's .env must get its own index and names; HCAs of one node that disagree, HCA names that do not match the
node's cabling, and a node without an RDMA device, stop the run for every node with the message, before any
node is changed: a task standing in for the model and image roles (which site.yml runs between the GID check
and stack) writes a marker file on each node, and neither it nor any .env may appear.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ds4deploy.plan import node_fabric
from ds4deploy.recipe.load import load_recipe
from tests.support import gid_trees as trees

REPO = trees.REPO
BIN = Path(sys.executable).parent
RECIPE = "gx10x2-ds4-flash-fp8"
PLAYBOOK = """---
- name: Resolve each node's GID index (preflight role), then write its launch facts (stack role)
  hosts: all
  gather_facts: false
  tasks:
    - name: Resolve this node's GID index
      ansible.builtin.include_role:
        name: preflight
        tasks_from: fabric.yml
    - name: Stand-in for the model and image roles (the first change site.yml makes on a node after preflight)
      ansible.builtin.copy:
        dest: "{{ stack_dir }}/../model-and-image-ran"
        content: "yes\n"
        mode: "0644"
    - name: Launch env of this node
      ansible.builtin.include_role:
        name: stack
        tasks_from: launch_env.yml
"""


def _node(tmp: Path, name: str, rank: int, sysfs: Path, recipe: str, port: str) -> dict:
    """One node's inventory entry: cabled on `port` (f1, the recipe's names, or f0: overridden), with the rails and
    launch env `ds4deploy vars` derives from it (ds4deploy.plan.node_fabric, as the node plan does)."""
    stack = tmp / name / "stack"
    stack.mkdir(parents=True, exist_ok=True)
    r = load_recipe(recipe)
    rails = {k: {**v, **(trees.F0_RAILS[k] if port == "f0" and r.fabric else {})} for k, v in trees.GB10_RAILS.items()}
    own = node_fabric.node_rails(r, name, {"ds4_rails": rails})
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "stack_dir": str(stack),
        "ds4_sysfs_root": str(sysfs),
        "ds4_rails": rails,
        "ds4_node_rails": node_fabric.as_ansible(own),
        "ds4_node": {"role": "head" if rank == 0 else "worker", "rank": rank, "launch_env": {
            "DS4_NODE_RANK": str(rank), "DS4_MASTER_ADDR": "10.100.184.1", "DS4_HOST_IP": f"10.100.184.{rank + 1}",
            **node_fabric.launch_env(r, own)}},
    }


def run(tmp: Path, sysfs_b: Path, *, recipe: str = RECIPE, check: bool = False):
    """Run the play for node-a (the published GB10 tree, f1 port) and node-b (`sysfs_b`, f0 port); returns
    (process, env paths)."""
    hosts = {"node-a": _node(tmp, "node-a", 0, trees.GB10, recipe, "f1"),
             "node-b": _node(tmp, "node-b", 1, sysfs_b, recipe, "f0")}
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": {"ds4_recipe": recipe}, "hosts": hosts}}))
    playbook = tmp / "launch-env.yml"
    playbook.write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "ansible" / "roles"), "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_LIBRARY": str(REPO / "ansible" / "library"),
           "ANSIBLE_MODULE_UTILS": str(REPO / "ansible" / "module_utils"),
           "ANSIBLE_NOCOWS": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook),
                           *(["--check"] if check else [])], capture_output=True, text=True, env=env, cwd=tmp,
                          check=False, timeout=300)
    return done, {name: Path(h["stack_dir"]) / ".env" for name, h in hosts.items()}


def _untouched(envs: dict[str, Path]) -> None:
    """No node got a .env, and the stand-in for the model and image roles ran on none."""
    for env in envs.values():
        assert not env.exists() and not (env.parent.parent / "model-and-image-ran").exists(), env


def _task_output(stdout: str, name: str) -> str:
    """The lines ansible-playbook printed for the task called `name` (up to the next task or the recap)."""
    start = stdout.index(f"TASK [{name}]")
    ends = [i for i in (stdout.find("TASK [", start + 1), stdout.find("PLAY RECAP", start)) if i > 0]
    return stdout[start:min(ends)]


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def _f0(tmp: Path, name: str, moved: list[str] | None = None) -> Path:
    """The GB10 tree as node-b sees it on its f0 port, with the slot 3 -> 4 of `moved` HCAs (default: both)."""
    f0 = trees.on_f0_port(trees.GB10, tmp / f"{name}-f0")
    return trees.moved_slot(f0, tmp / name, ["rocep1s0f0", "roceP2p1s0f0"] if moved is None else moved, 3, 4)


def test_each_node_gets_its_own_index_and_names(tmp_path):
    peer = _f0(tmp_path, "peer-sysfs")
    done, envs = run(tmp_path, peer)
    assert done.returncode == 0, done.stdout + done.stderr
    a, b = _env(envs["node-a"]), _env(envs["node-b"])
    assert a == {"DS4_NODE_RANK": "0", "DS4_MASTER_ADDR": "10.100.184.1", "DS4_HOST_IP": "10.100.184.1",
                 "DS4_NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "DS4_SOCKET_IFNAME": "enp1s0f1np1",
                 "DS4_NCCL_IB_GID_INDEX": "3"}
    assert b == {"DS4_NODE_RANK": "1", "DS4_MASTER_ADDR": "10.100.184.1", "DS4_HOST_IP": "10.100.184.2",
                 "DS4_NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0", "DS4_SOCKET_IFNAME": "enp1s0f0np0",
                 "DS4_NCCL_IB_GID_INDEX": "4"}
    assert "rocep1s0f0=4 (rail0 10.100.184.1), roceP2p1s0f0=4 (rail1 10.100.185.1)" in envs["node-b"].read_text()
    # The rendered GX10 worker file takes the index from this .env (docker compose's own interpolation).
    compose = REPO / "compose" / "gx10x2-ds4-flash-fp8"
    config = subprocess.run([str(BIN / "docker-compose"), "--project-directory", str(compose), "-f",
                             str(compose / "compose.worker.yaml"), "--env-file", str(envs["node-b"]), "config"],
                            capture_output=True, text=True, check=False, env={**os.environ,
                                                                             "DS4_SECRETS_ENV": "/dev/null"})
    assert config.returncode == 0, config.stderr
    env = yaml.safe_load(config.stdout)["services"]["engine"]["environment"]
    assert (env["NCCL_IB_GID_INDEX"], env["NCCL_IB_HCA"], env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == (
        "4", "rocep1s0f0,roceP2p1s0f0", "enp1s0f0np0", "enp1s0f0np0")
    # A second run resolves the same indexes and changes nothing.
    again, _ = run(tmp_path, peer)
    assert again.returncode == 0 and again.stdout.count("changed=0") == 2, again.stdout


def test_names_that_do_not_match_the_cabling_stop_every_node(tmp_path):
    # node-b's inventory names its f0 HCAs, but its GID table has only the f1 ones (the names do not match the
    # cabling): the run stops on every node, naming the HCA and the ones there are.
    done, envs = run(tmp_path, trees.GB10)
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert "no GID table for HCA rocep1s0f0" in out and "HCAs with GIDs: roceP2p1s0f1, rocep1s0f1" in out
    _untouched(envs)


def test_hcas_with_different_indexes_stop_every_node(tmp_path):
    odd = _f0(tmp_path, "odd-sysfs", ["roceP2p1s0f0"])
    done, envs = run(tmp_path, odd)
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert "fatal: [node-b]: FAILED!" in out and "fatal: [node-a]" not in out
    assert ("the RoCE v2 GID indexes of its HCAs differ (rocep1s0f0=3 (rail0 10.100.184.1), roceP2p1s0f0=4 "
            "(rail1 10.100.185.1))") in out
    assert "Fix: make the rail netplan identical on every port" in out
    # any_errors_fatal: node-a resolved fine, yet no node was changed.
    _untouched(envs)


def test_no_rdma_device_stops_every_node(tmp_path):
    done, envs = run(tmp_path, tmp_path / "no-rdma-sysfs")
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert "fatal: [node-b]: FAILED!" in out and "no RDMA device: no GID table under" in out
    assert "runs NCCL over RoCE HCAs" in out
    _untouched(envs)


def test_check_mode_resolves_and_writes_nothing(tmp_path):
    odd = _f0(tmp_path, "odd-sysfs", ["roceP2p1s0f0"])
    done, envs = run(tmp_path, odd, check=True)
    assert done.returncode != 0 and "the RoCE v2 GID indexes of its HCAs differ" in done.stdout
    done, envs = run(tmp_path, trees.on_f0_port(trees.GB10, tmp_path / "f0-sysfs"), check=True)
    assert done.returncode == 0, done.stdout
    _untouched(envs)


def test_recipe_without_fabric_writes_the_plan_facts_only(tmp_path):
    done, envs = run(tmp_path, tmp_path / "no-rdma-sysfs", recipe="cpu-2node-tp")
    assert done.returncode == 0, done.stdout
    assert "DS4_NCCL_IB_GID_INDEX" not in envs["node-b"].read_text()
    assert "DS4_NCCL_IB_HCA" not in envs["node-b"].read_text()
    assert _env(envs["node-b"])["DS4_NODE_RANK"] == "1"
    check = _task_output(done.stdout, "preflight : Check this node's RoCE v2 GID index before anything is changed "
                         "(a fabric recipe; a failure stops every node)")
    assert "skipping: [node-a]" in check and "skipping: [node-b]" in check


def test_site_resolves_the_index_before_the_model_and_image_roles():
    # The prepare play of site.yml checks the GID index (preflight role, fabric.yml) before every role that changes
    # a node there, so a bad fabric stops the deploy before the model copy and the image build. It is the one check
    # after a change: the index follows the rail addresses provision-hosts.yml sets.
    plays = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    (prepare,) = [p for p in plays if "roles" in p]
    roles = [r["role"] for r in prepare["roles"]]
    assert {"docker", "model", "image", "stack"} <= set(roles), roles
    pre = [t["ansible.builtin.include_role"] for t in prepare["pre_tasks"] if "ansible.builtin.include_role" in t]
    assert {"name": "preflight", "tasks_from": "fabric.yml"} in pre, pre
    tasks = yaml.safe_load((REPO / "ansible" / "roles" / "preflight" / "tasks" / "main.yml").read_text())
    assert "fabric.yml" not in [t.get("ansible.builtin.import_tasks") for t in tasks]


@pytest.fixture(autouse=True)
def _tools():
    if not (BIN / "ansible-playbook").exists():
        pytest.fail("ansible-playbook is not in this venv: run `make venv`")
