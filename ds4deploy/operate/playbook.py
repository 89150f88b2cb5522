"""Run one of ansible/*.yml and read what it did through Ansible's JSON stdout callback (``ansible.posix.json``,
https://docs.ansible.com/ansible/latest/collections/ansible/posix/json_callback.html): the one runner of the
commands that report per node (`ds4deploy status`, `ds4deploy preflight --inventory`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.paths import REPO_ROOT

ANSIBLE_DIR = REPO_ROOT / "ansible"


def argv(playbook: str, inventory: str, *extra_vars: str) -> list[str]:
    """``ansible-playbook -i <inventory> ansible/<playbook> -e <var> ...`` with the venv's ansible-playbook.

    Raises:
        UserError: ansible-playbook is not installed next to this Python.
    """
    ansible = Path(sys.executable).parent / "ansible-playbook"
    if not ansible.is_file():
        raise UserError(f"{ansible} not found", "run `make venv` (Ansible is a dependency of the deploy extra)")
    out = [str(ansible), "-i", str(inventory), str(ANSIBLE_DIR / playbook)]
    for var in extra_vars:
        out += ["-e", var]
    return out


def env() -> dict[str, str]:
    """This process's environment with the project's ansible.cfg."""
    return {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg")}


def run_json(playbook: str, inventory: str, *extra_vars: str, fix: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the playbook with the JSON callback; returns (the finished process, the parsed run).

    Args:
        playbook: file name under ansible/.
        inventory: Ansible inventory file.
        extra_vars: ``name=value`` strings, each passed with ``-e``.
        fix: what the user should do when the output is not JSON (e.g. how to see Ansible's whole output).

    Raises:
        UserError: ansible-playbook is missing; a collection it needs (ansible.posix for the JSON callback) is not
            installed (named, with the install command); or its output is not JSON (its stderr is quoted).
    """
    done = subprocess.run(argv(playbook, inventory, *extra_vars),
                          env={**env(), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
                          capture_output=True, text=True, check=False)
    try:
        return done, json.loads(done.stdout)
    except ValueError:
        from ds4deploy.plan.inventory import missing_collection

        missing = missing_collection(done.stderr + done.stdout)
        if missing is not None:
            raise missing from None
        raise UserError(f"ansible-playbook {playbook} failed (exit {done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()[-800:]}", fix) from None


def failures(run: dict[str, Any]) -> list[str]:
    """``<host>: <task>: <message>`` for every failed or unreachable task result (ignored failures left out); a
    looped task's message is each failed item's (Ansible's own for the task is only "One or more items failed").

    Args:
        run: the parsed JSON callback output (``{"plays": [{"tasks": [{"hosts": {host: result}}]}], ...}``).
    """
    out = []
    for play in run.get("plays", []):
        for task in play.get("tasks", []):
            name = task.get("task", {}).get("name", "?")
            for host, result in task.get("hosts", {}).items():
                if (result.get("failed") and not result.get("ignore_errors")) or result.get("unreachable"):
                    items = [str(r.get("msg", "")).strip() for r in result.get("results", []) if r.get("failed")]
                    out.append(f"{host}: {name}: {'; '.join(items) or str(result.get('msg', '')).strip()}")
    return out
