"""`make status` / `make logs`: each node's containers, /health and engine log lines as docker printed them.

`status` runs ansible/status.yml with Ansible's JSON stdout callback (``ansible.posix.json``,
https://docs.ansible.com/ansible/latest/collections/ansible/posix/json_callback.html) and prints, per node, the
report its last task returns (``status_report``): a heading, ``docker compose ps`` and ``docker compose logs``
output verbatim, and the head's ``GET /health`` status. Ansible's own play and task lines are shown only when the
run fails (then the failed tasks with their messages, and Ansible's stderr) or with ``verbose`` (the playbook runs
with the normal output, as `make status V=1` does).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, TextIO

from ds4deploy.operate import playbook

PLAYBOOK = "status.yml"
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


def print_reports(nodes: list[dict[str, str]], stream: TextIO) -> None:
    """Each node's heading, then docker's output as docker printed it."""
    for i, node in enumerate(nodes):
        if i:
            stream.write("\n")
        stream.write(f"== {node['node']} ({node['role']}, rank {node['rank']}) ==\n")
        stream.write(node["containers"].rstrip("\n") + "\n")
        if node.get("health"):
            stream.write(f"GET /health -> {node['health']}\n")
        if node.get("backends"):
            stream.write(node["backends"].rstrip("\n") + "\n")
        if node.get("logs"):
            stream.write(node["logs"].rstrip("\n") + "\n")


def status(recipe: str, inventory: str, log_lines: int = 0, verbose: bool = False,
           stream: TextIO = sys.stdout, playbook_name: str = PLAYBOOK, extra: tuple[str, ...] = ()) -> int:
    """Run ansible/status.yml for `recipe` on `inventory` and print each node's report.

    Args:
        recipe: recipe name.
        inventory: Ansible inventory file.
        log_lines: engine log lines per node (0: none, `make status`; `make logs` passes 200).
        verbose: run the playbook with Ansible's normal output instead (nothing is parsed).
        stream: where the reports go.
        playbook_name: the playbook (ansible/gateway-status.yml for a gateway: its report adds ``backends``).
        extra: more ``name=value`` variables for it.

    Returns:
        The playbook's exit code.

    Raises:
        UserError: ansible-playbook is missing, or its JSON output cannot be read (its stderr is quoted).
    """
    extra = (f"recipe={recipe}", f"stack_logs={log_lines}", *extra)
    if verbose:
        return subprocess.run(playbook.argv(playbook_name, inventory, *extra), env=playbook.env(),
                              check=False).returncode
    done, run = playbook.run_json(playbook_name, inventory, *extra,
                                  fix="run `make status V=1` for Ansible's whole output")
    print_reports(reports(run), stream)
    if done.returncode != 0:
        for line in playbook.failures(run):
            print(f"failed: {line}", file=sys.stderr)
        if done.stderr.strip():
            print(done.stderr.rstrip(), file=sys.stderr)
    return done.returncode
