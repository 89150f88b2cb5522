"""The one channel from recipe to Ansible, through ansible-playbook on localhost: ansible/nodes-plan.yml runs
`ds4deploy vars` once per run (a second import in the same run, as site.yml imports provision.yml, reuses the file),
loads the file on every node, and each node sees its own entry of the node plan (ds4_node, its stack directory and
its role group). `make deploy` passes the file it wrote (ds4_vars_file) and the command does not run at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TWO = REPO / "ansible" / "inventories" / "two-node-local.yml"


def _run(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    plan = str(REPO / "ansible" / "nodes-plan.yml")
    playbook = tmp / "vars.yml"
    # Beside the playbook, as for the playbooks in ansible/: ds4_node_stack_dir and the other control-host paths.
    if not (tmp / "group_vars").exists():
        (tmp / "group_vars").symlink_to(REPO / "ansible" / "group_vars")
    playbook.write_text(yaml.safe_dump([
        {"name": "First import", "ansible.builtin.import_playbook": plan, "vars": {"ds4_vars_scope": "operate"}},
        {"name": "Second import (reuses the file)", "ansible.builtin.import_playbook": plan},
        {"name": "Show", "hosts": "all", "gather_facts": False, "tasks": [{
            "name": "Show what this node sees", "ansible.builtin.debug": {"msg": (
                "SEEN {{ inventory_hostname }} {{ ds4_node.role }} {{ ds4_node.rank }} {{ ds4_node_stack_dir }} "
                "{{ group_names | sort | join(',') }} {{ ds4_port }} {{ ds4_fabric_rails | length }}")}}]},
    ], sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(TWO), str(playbook), "-e", "recipe=cpu-2node-tp",
                           *extra], capture_output=True, text=True, env=env, cwd=tmp, check=False, timeout=300)


def test_each_node_sees_its_own_plan_entry_and_the_command_runs_once(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SEEN node-a head 0 /opt/ds4deploy/stacks/cpu-2node-tp/node0 ds4_role_head 8010 0" in done.stdout
    assert "SEEN node-b worker 1 /opt/ds4deploy/stacks/cpu-2node-tp/node1 ds4_role_worker 8010 0" in done.stdout
    write = "TASK [Write every variable of this run from the recipe and the inventory]"
    assert done.stdout.count(write) == 2
    second = done.stdout.split(write)[2].split("TASK [")[0]
    assert "skipping: [localhost]" in second


def test_a_file_given_by_make_is_loaded_without_running_the_command(tmp_path):
    given = tmp_path / "given.yml"
    text = (REPO / ".cache" / "vars" / "cpu-2node-tp.operate.yml")
    subprocess.run([str(BIN / "ds4deploy"), "vars", "cpu-2node-tp", "--inventory", str(TWO), "--scope", "operate"],
                   check=True, capture_output=True, cwd=REPO)
    given.write_text(text.read_text().replace("ds4_port: 8010", "ds4_port: 9999"))
    done = _run(tmp_path, "-e", f"ds4_vars_file={given}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SEEN node-b worker 1 /opt/ds4deploy/stacks/cpu-2node-tp/node1 ds4_role_worker 9999 0" in done.stdout
    first = done.stdout.split("TASK [Write every variable of this run from the recipe and the inventory]")[1]
    assert "skipping: [localhost]" in first.split("TASK [")[0]
