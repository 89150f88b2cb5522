"""`make status` / `make logs` (ds4deploy.operate.status) on real ansible-playbook JSON output of ansible/status.yml,
captured with the ansible.posix.json callback on this machine: a one-node cpu stack with 3 log lines
(status-cpu-logs.json), and a run the node plan refused (cpu-2node-tp on the one-host inventory,
status-plan-refused.json). What is printed must be docker's own output, line for line, with no Ansible headers."""

from __future__ import annotations

import io
import json
from pathlib import Path

from ds4deploy.operate import playbook, status

FIXTURES = Path(__file__).parent / "fixtures" / "ansible"


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _task(run: dict, name: str, host: str) -> dict:
    return next(t["hosts"][host] for p in run["plays"] for t in p["tasks"] if t["task"]["name"] == name)


def test_prints_docker_output_verbatim_per_node():
    run = _load("status-cpu-logs.json")
    out = io.StringIO()
    status.print_reports(status.reports(run), out)
    text = out.getvalue()
    ps = _task(run, "List this node's containers", "localhost")["stdout"]
    logs = _task(run, "Read this node's last engine log lines", "localhost")["stdout"]
    assert text == f"== localhost (single, rank 0) ==\n{ps}\nGET /health -> 200\n{logs}\n"
    assert ps.startswith("NAME") and len(logs.splitlines()) >= 3
    assert "TASK [" not in text and "PLAY" not in text and '\\"' not in text
    assert playbook.failures(run) == []


def test_a_failed_run_names_the_host_task_and_message():
    run = _load("status-plan-refused.json")
    assert status.reports(run) == []
    (line,) = playbook.failures(run)
    assert line.startswith("localhost: Stop on bad input (nothing was changed on any host): error: no head in the "
                           "inventory")
    assert "fix: add the head node" in line


def test_worker_has_no_health_line():
    out = io.StringIO()
    status.print_reports([{"node": "node-b", "role": "worker", "rank": "1", "containers": "NAME  STATUS\n",
                           "health": "", "logs": ""}], out)
    assert out.getvalue() == "== node-b (worker, rank 1) ==\nNAME  STATUS\n"
