"""apt tasks wait for the dpkg lock with a bound and name its holder (ansible/roles/apt_lock): every apt task of
every role sets lock_timeout and is rescued by the role; the holder script names a real process holding a real
fcntl lock, the way dpkg and apt hold theirs."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.conftest import REPO

ANSIBLE = REPO / "ansible"
HOLDER = ANSIBLE / "roles" / "apt_lock" / "files" / "lock-holder.sh"


def _apt_tasks(tasks: list, rescued: bool = False):
    """(task, rescued by the apt_lock role) for every ansible.builtin.apt task, blocks included."""
    for t in tasks or []:
        if "block" in t:
            rescue = t.get("rescue") or []
            has = any(r.get("ansible.builtin.include_role", {}).get("name") == "apt_lock" for r in rescue)
            yield from _apt_tasks(t["block"], rescued or has)
            yield from _apt_tasks(rescue, rescued)
        elif "ansible.builtin.apt" in t or "apt" in t:
            yield t, rescued


def test_every_apt_task_waits_for_the_lock_and_names_its_holder():
    found = []
    for f in sorted(ANSIBLE.glob("roles/*/tasks/*.yml")):
        for task, rescued in _apt_tasks(yaml.safe_load(f.read_text())):
            args = task.get("ansible.builtin.apt") or task.get("apt")
            found.append(f"{f.relative_to(ANSIBLE)}: {task['name']}")
            assert args.get("lock_timeout") == "{{ ds4_apt_lock_timeout_s }}", found[-1]
            assert rescued, f"{found[-1]} is not rescued by the apt_lock role"
    assert len(found) >= 7, found
    bound = yaml.safe_load((ANSIBLE / "group_vars" / "all.yml").read_text())["ds4_apt_lock_timeout_s"]
    assert bound > 60  # longer than the apt module's own default


def test_the_holder_script_names_the_process_holding_the_lock(tmp_path):
    lock = tmp_path / "lock-frontend"
    lock.write_text("")
    # A separate process takes an fcntl write lock as dpkg does (F_SETLK on the whole file) and keeps it.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'w')\n"
         "fcntl.lockf(f, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        out = subprocess.run(["sh", str(HOLDER), str(lock), str(tmp_path / "absent")], capture_output=True,
                             text=True, check=True).stdout
        assert out.count("\n") == 1 and out.startswith(f"pid {holder.pid} ({sys.executable} -c import fcntl"), out
        assert "time.sleep(60)" in out and out.rstrip().endswith(f"{lock}) holds {lock}"), out
    finally:
        holder.kill()
        holder.wait()


def test_the_holder_script_says_nothing_when_no_one_holds_the_lock(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    with lock.open("w") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        fcntl.lockf(f, fcntl.LOCK_UN)
    out = subprocess.run(["sh", str(HOLDER), str(lock)], capture_output=True, text=True, check=True).stdout
    assert out == ""


def test_the_holder_role_has_the_script_it_runs():
    tasks = yaml.safe_load((ANSIBLE / "roles" / "apt_lock" / "tasks" / "main.yml").read_text())
    assert tasks[0]["ansible.builtin.script"]["cmd"].split()[0] == HOLDER.name
    assert Path(HOLDER).stat().st_mode & 0o111
