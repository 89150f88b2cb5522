"""`make status` / `make logs`: each node's containers, /health and engine log lines as docker printed them.

`status` runs ansible/status.yml with Ansible's JSON stdout callback (``ansible.posix.json``,
https://docs.ansible.com/ansible/latest/collections/ansible/posix/json_callback.html) and prints, per node, the
report its last task returns (``status_report``): a heading, ``docker compose ps`` and ``docker compose logs``
output verbatim, and the head's ``GET /health`` status. Ansible's own play and task lines are shown only when the
run fails (then the failed tasks with their messages, and Ansible's stderr) or with ``verbose`` (the playbook runs
with the normal output, as `make status V=1` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from ds4deploy.errors import UserError
from ds4deploy.recipe import REPO_ROOT

PLAYBOOK = REPO_ROOT / "ansible" / "status.yml"
REPORT_VAR = "status_report"


def reports(run: dict[str, Any]) -> list[dict[str, str]]:
    """The ``status_report`` of every node in an ``ansible.posix.json`` result, in inventory order.

    Args:
        run: the parsed JSON callback output (``{"plays": [{"tasks": [{"hosts": {host: result}}]}], ...}``).

    Returns:
        One ``{node, role, rank, containers, health, logs}`` per node that reached the report task.
    """
    out = []
    for play in run.get("plays", []):
        for task in play.get("tasks", []):
            for result in task.get("hosts", {}).values():
                if isinstance(result.get(REPORT_VAR), dict):
                    out.append(result[REPORT_VAR])
    return out


def failures(run: dict[str, Any]) -> list[str]:
    """``<host>: <task>: <message>`` for every failed or unreachable task result (ignored failures left out); a
    looped task's message is each failed item's (Ansible's own for the task is only "One or more items failed")."""
    out = []
    for play in run.get("plays", []):
        for task in play.get("tasks", []):
            name = task.get("task", {}).get("name", "?")
            for host, result in task.get("hosts", {}).items():
                if (result.get("failed") and not result.get("ignore_errors")) or result.get("unreachable"):
                    items = [str(r.get("msg", "")).strip() for r in result.get("results", []) if r.get("failed")]
                    out.append(f"{host}: {name}: {'; '.join(items) or str(result.get('msg', '')).strip()}")
    return out


def print_reports(nodes: list[dict[str, str]], stream: TextIO) -> None:
    """Each node's heading, then docker's output as docker printed it."""
    for i, node in enumerate(nodes):
        if i:
            stream.write("\n")
        stream.write(f"== {node['node']} ({node['role']}, rank {node['rank']}) ==\n")
        stream.write(node["containers"].rstrip("\n") + "\n")
        if node.get("health"):
            stream.write(f"GET /health -> {node['health']}\n")
        if node.get("logs"):
            stream.write(node["logs"].rstrip("\n") + "\n")


def status(recipe: str, inventory: str, log_lines: int = 0, verbose: bool = False,
           stream: TextIO = sys.stdout) -> int:
    """Run ansible/status.yml for `recipe` on `inventory` and print each node's report.

    Args:
        recipe: recipe name.
        inventory: Ansible inventory file.
        log_lines: engine log lines per node (0: none, `make status`; `make logs` passes 200).
        verbose: run the playbook with Ansible's normal output instead (nothing is parsed).
        stream: where the reports go.

    Returns:
        The playbook's exit code.

    Raises:
        UserError: ansible-playbook is missing, or its JSON output cannot be read (its stderr is quoted).
    """
    ansible = Path(sys.executable).parent / "ansible-playbook"
    if not ansible.is_file():
        raise UserError(f"{ansible} not found", "run `make venv` (Ansible is a dependency of the deploy extra)")
    argv = [str(ansible), "-i", inventory, str(PLAYBOOK), "-e", f"recipe={recipe}", "-e", f"stack_logs={log_lines}"]
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOK.parent / "ansible.cfg")}
    if verbose:
        return subprocess.run(argv, env=env, check=False).returncode
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    try:
        run = json.loads(done.stdout)
    except ValueError:
        raise UserError(f"ansible-playbook {PLAYBOOK.name} failed (exit {done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()[-800:]}",
                        "run `make status V=1` for Ansible's whole output") from None
    print_reports(reports(run), stream)
    if done.returncode != 0:
        for line in failures(run):
            print(f"failed: {line}", file=sys.stderr)
        if done.stderr.strip():
            print(done.stderr.rstrip(), file=sys.stderr)
    return done.returncode
