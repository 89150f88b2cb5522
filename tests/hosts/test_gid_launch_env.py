"""Each node's RoCE v2 GID index on two fabric nodes: the preflight role's real task file
(ansible/roles/preflight/tasks/fabric.yml, which resolves it) and the stack role's (ansible/roles/stack/tasks/
launch_env.yml, which writes it into the .env), run by ansible-playbook against localhost (connection local), each
node's sysfs root pointed at a GID-table tree, with the real recipe recipes/gx10x2-ds4-flash-fp8.yaml.

Node A is the published GB10 table (spark-0e68, index 3); node B is the same table with only the slot index
moved 3 -> 4 (tests/support/gid_trees.py), so the peer's GIDs keep spark-0e68's addresses and node B's inventory
gives those addresses (only the launch env runs here; the node plan that refuses one address on two nodes is
tested in tests/unit/test_nodes.py). Each node's .env must get its own index; HCAs of one node that disagree, and
a node without an RDMA device, stop the run for every node with the message, before any node is changed: a task
standing in for the model and image roles (which site.yml runs between preflight and stack) writes a marker file on
each node, and neither it nor any .env may appear.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def _node(tmp: Path, name: str, rank: int, sysfs: Path) -> dict:
    stack = tmp / name / "stack"
    stack.mkdir(parents=True, exist_ok=True)
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "stack_dir": str(stack),
        "preflight_sysfs_root": str(sysfs),
        "ds4_rails": trees.GB10_RAILS,
        "ds4_node": {"role": "head" if rank == 0 else "worker", "rank": rank, "launch_env": {
            "DS4_NODE_RANK": str(rank), "DS4_MASTER_ADDR": "10.100.184.1", "DS4_HOST_IP": f"10.100.184.{rank + 1}"}},
    }


def run(tmp: Path, sysfs_b: Path, *, recipe: str = RECIPE, check: bool = False):
    """Run the play for node-a (the published GB10 tree) and node-b (`sysfs_b`); returns (process, env paths)."""
    hosts = {"node-a": _node(tmp, "node-a", 0, trees.GB10), "node-b": _node(tmp, "node-b", 1, sysfs_b)}
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": {"ds4_recipe": recipe}, "hosts": hosts}}))
    playbook = tmp / "launch-env.yml"
    playbook.write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "ansible" / "roles"), "ANSIBLE_FORCE_COLOR": "0",
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


def test_each_node_gets_its_own_index(tmp_path):
    peer = trees.moved_slot(trees.GB10, tmp_path / "peer-sysfs", ["rocep1s0f1", "roceP2p1s0f1"], 3, 4)
    done, envs = run(tmp_path, peer)
    assert done.returncode == 0, done.stdout + done.stderr
    a, b = _env(envs["node-a"]), _env(envs["node-b"])
    assert a == {"DS4_NODE_RANK": "0", "DS4_MASTER_ADDR": "10.100.184.1", "DS4_HOST_IP": "10.100.184.1",
                 "DS4_NCCL_IB_GID_INDEX": "3"}
    assert b == {"DS4_NODE_RANK": "1", "DS4_MASTER_ADDR": "10.100.184.1", "DS4_HOST_IP": "10.100.184.2",
                 "DS4_NCCL_IB_GID_INDEX": "4"}
    assert "rocep1s0f1=4 (rail0 10.100.184.1), roceP2p1s0f1=4 (rail1 10.100.185.1)" in envs["node-b"].read_text()
    # The rendered GX10 worker file takes the index from this .env (docker compose's own interpolation).
    compose = REPO / "compose" / "gx10x2-ds4-flash-fp8"
    config = subprocess.run([str(BIN / "docker-compose"), "--project-directory", str(compose), "-f",
                             str(compose / "compose.worker.yaml"), "--env-file", str(envs["node-b"]), "config"],
                            capture_output=True, text=True, check=False, env={**os.environ,
                                                                             "DS4_SECRETS_ENV": "/dev/null"})
    assert config.returncode == 0, config.stderr
    assert yaml.safe_load(config.stdout)["services"]["engine"]["environment"]["NCCL_IB_GID_INDEX"] == "4"
    # A second run resolves the same indexes and changes nothing.
    again, _ = run(tmp_path, peer)
    assert again.returncode == 0 and again.stdout.count("changed=0") == 2, again.stdout


def test_hcas_with_different_indexes_stop_every_node(tmp_path):
    odd = trees.moved_slot(trees.GB10, tmp_path / "odd-sysfs", ["roceP2p1s0f1"], 3, 4)
    done, envs = run(tmp_path, odd)
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert ("node-b: the RoCE v2 GID indexes of its HCAs differ (rocep1s0f1=3 (rail0 10.100.184.1), "
            "roceP2p1s0f1=4 (rail1 10.100.185.1))") in out
    assert "make the rail netplan identical on every port" in out and "Nothing was started on any node." in out
    # any_errors_fatal: node-a resolved fine, yet no node was changed.
    _untouched(envs)


def test_no_rdma_device_stops_every_node(tmp_path):
    done, envs = run(tmp_path, tmp_path / "no-rdma-sysfs")
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert "node-b: no RDMA device: no GID table under" in out and "runs NCCL over RoCE HCAs" in out
    _untouched(envs)


def test_check_mode_resolves_and_writes_nothing(tmp_path):
    odd = trees.moved_slot(trees.GB10, tmp_path / "odd-sysfs", ["roceP2p1s0f1"], 3, 4)
    done, envs = run(tmp_path, odd, check=True)
    assert done.returncode != 0 and "the RoCE v2 GID indexes of its HCAs differ" in done.stdout
    done, envs = run(tmp_path, trees.GB10, check=True)
    assert done.returncode == 0, done.stdout
    _untouched(envs)


def test_recipe_without_fabric_writes_the_plan_facts_only(tmp_path):
    done, envs = run(tmp_path, tmp_path / "no-rdma-sysfs", recipe="cpu-2node-tp")
    assert done.returncode == 0, done.stdout
    assert "DS4_NCCL_IB_GID_INDEX" not in envs["node-b"].read_text()
    assert _env(envs["node-b"])["DS4_NODE_RANK"] == "1"
    dump_task = _task_output(done.stdout, "preflight : Read this node's GID table (read-only)")
    assert "skipping: [node-a]" in dump_task and "skipping: [node-b]" in dump_task


def test_site_resolves_the_index_before_the_model_and_image_roles():
    # The prepare play of site.yml runs the preflight role (which imports fabric.yml) before every role that changes
    # a node, so a bad fabric stops the deploy before the model copy and the image build.
    plays = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    (prepare,) = [p for p in plays if "roles" in p]
    roles = [r["role"] for r in prepare["roles"]]
    assert roles[0] == "preflight" and {"docker", "model", "image", "stack"} <= set(roles[1:]), roles
    tasks = yaml.safe_load((REPO / "ansible" / "roles" / "preflight" / "tasks" / "main.yml").read_text())
    assert [t["ansible.builtin.import_tasks"] for t in tasks if "ansible.builtin.import_tasks" in t] == ["fabric.yml"]


@pytest.fixture(autouse=True)
def _tools():
    if not (BIN / "ansible-playbook").exists():
        pytest.fail("ansible-playbook is not in this venv: run `make venv`")
