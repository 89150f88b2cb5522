"""Converge twice: `ansible/site.yml` run again on the deployed cpu stack changes nothing (every task reports ok or
skipped, the play recap says changed=0). Runs after the main deploy of `make test`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_second_site_run_changes_nothing():
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_NOCOLOR": "1"}
    p = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i",
                        str(REPO / "ansible" / "inventories" / "local.yml"), str(REPO / "ansible" / "site.yml"),
                        "-e", "recipe=cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
                       check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    recap = re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", p.stdout, re.M)
    assert recap, p.stdout[-2000:]
    changed, task = [], ""
    for line in p.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed:"):
            changed.append(task)
    assert all(int(n) == 0 for _, n in recap), "tasks that changed on the second run:\n" + "\n".join(changed)
