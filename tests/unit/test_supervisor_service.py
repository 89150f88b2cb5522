"""The supervisor as a service of a deployed recipe: the key file rule, the detached process's record, and a
supervisor that cannot run stopping `start` with its own message. The running service is proven live by
`make deploy` / `make status` / `make down` (tests/infra, tests/multinode)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.operate import key_file as secrets
from ds4deploy.operate import service as supervisor_service
from ds4deploy.recipe.load import load_recipe
from tests.unit.conftest import REPO

pytestmark = pytest.mark.tool  # runs a real tool or waits in real time: not in `make check-fast`


@pytest.mark.parametrize(("mode", "ok"), [(0o600, True), (0o400, True), (0o640, False), (0o604, False),
                                          (0o620, False)])
def test_a_key_file_readable_by_others_is_refused(tmp_path, mode, ok):
    f = tmp_path / "k.env"
    f.write_text("VLLM_API_KEY=ds4-x\n")
    f.chmod(mode)
    if ok:
        secrets.check_key_file(f)
    else:
        with pytest.raises(UserError, match=f"has mode {mode:04o}") as e:
            secrets.check_key_file(f)
        assert f"chmod 0600 {f}" in e.value.fix


def test_a_missing_key_file_is_refused_with_the_fix(tmp_path):
    with pytest.raises(UserError, match="does not exist") as e:
        secrets.check_key_file(tmp_path / "none.env")
    assert "make deploy" in e.value.fix


@pytest.fixture
def stacks(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor_service, "STACKS_DIR", tmp_path / "stacks")
    monkeypatch.setattr(supervisor_service, "SYSTEMD_RUNTIME", tmp_path / "no-systemd")
    monkeypatch.setattr(supervisor_service, "INSTALL_DIR", tmp_path / "supervisor")
    return tmp_path / "stacks"


def test_status_and_stop_of_a_recorded_process(stacks):
    """A recorded supervisor is running while its pid runs its argv; stop signals that process group only."""
    recipe = load_recipe("cpu")
    svc = supervisor_service.Service(recipe)
    svc.dir.mkdir(parents=True)
    assert supervisor_service.status(recipe) == {"mode": "process", "running": False}
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "supervise", "cpu"]
    proc = subprocess.Popen(argv, start_new_session=True)
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 30  # until the child has exec'd: before that it still runs the parent's argv
    while b"supervise" not in cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        svc.record.write_text(json.dumps({"pid": proc.pid, "argv": argv, "started": "now"}))
        assert supervisor_service.status(recipe)["running"] is True
        # A reused pid running something else is not ours.
        svc.record.write_text(json.dumps({"pid": proc.pid, "argv": ["other"], "started": "now"}))
        assert supervisor_service.status(recipe)["running"] is False
        svc.record.write_text(json.dumps({"pid": proc.pid, "argv": argv, "started": "now"}))
        out = supervisor_service.stop(recipe)
        assert out == {"stopped": True, "pid": proc.pid}
        assert proc.wait(timeout=20) != 0
        assert not svc.record.exists()
        assert supervisor_service.stop(recipe) == {"stopped": False}
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_variants_record_kept_under_its_base_recipe_moves_to_the_variant(stacks):
    """A variant deployed before records were named after it left its record in the base recipe's directory: the
    base recipe does not take it for its own (its deploy would have stopped the variant's supervisor), and the
    variant's `make down` finds and stops it."""
    base, lan = load_recipe("cpu-llamacpp"), load_recipe("cpu-llamacpp--lan")
    old = stacks / "cpu-llamacpp" / "supervise.json"
    old.parent.mkdir(parents=True)
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "supervise", lan.name]
    proc = subprocess.Popen(argv, start_new_session=True)
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 30
    while b"supervise" not in cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        old.write_text(json.dumps({"pid": proc.pid, "argv": argv, "started": "now"}))
        assert supervisor_service.status(base) == {"mode": "process", "running": False}
        assert supervisor_service.stop(base) == {"stopped": False}
        assert proc.poll() is None and not old.exists()
        assert supervisor_service.status(lan)["running"] is True
        assert supervisor_service.stop(lan) == {"stopped": True, "pid": proc.pid}
        assert proc.wait(timeout=20) != 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_reused_pid_with_a_title_that_is_not_utf8_is_not_ours(stacks):
    """A recorded pid reused by a process whose title is not UTF-8 (any bytes a program writes into its argv) reads
    as not running, not as a UnicodeDecodeError out of `make status`."""
    recipe = load_recipe("cpu")
    svc = supervisor_service.Service(recipe)
    svc.dir.mkdir(parents=True)
    odd = subprocess.Popen([b"sleep\x80odd", "60"], executable="sleep")
    try:
        svc.record.write_text(json.dumps({"pid": odd.pid, "argv": ["supervise", "cpu"], "started": "now"}))
        assert supervisor_service.status(recipe)["running"] is False
    finally:
        odd.kill()
        odd.wait()


def test_a_supervisor_that_cannot_run_stops_start_with_its_message(stacks, tmp_path, monkeypatch):
    """`start` runs the real `ds4deploy supervise`; here its inventory is not YAML, so it exits at once, and `start`
    says so instead of recording a dead process."""
    inv = tmp_path / "inv.yml"
    inv.write_text("all: [\n")
    with pytest.raises(UserError, match="did not start"):
        supervisor_service.start(load_recipe("cpu"), inv)
    assert not supervisor_service.Service(load_recipe("cpu")).record.exists()
    with pytest.raises(UserError, match="does not exist"):
        supervisor_service.start(load_recipe("cpu"), tmp_path / "missing.yml")


def test_the_systemd_unit_runs_the_supervisor_and_stops_after_giving_up(tmp_path):
    from ds4deploy.operate.supervisor import GAVE_UP_EXIT

    argv = [str(tmp_path / "venv" / "bin" / "ds4deploy"), "supervise", "cpu", "--inventory", str(tmp_path / "inv.yml")]
    unit = supervisor_service.unit_text(load_recipe("cpu"), argv, tmp_path / "root")
    assert f"supervise cpu --inventory {tmp_path / 'inv.yml'}" in unit
    assert f"WorkingDirectory={tmp_path / 'root'}" in unit
    assert "Restart=on-failure" in unit and f"RestartPreventExitStatus={GAVE_UP_EXIT}" in unit
    assert os.path.basename(unit.split("ExecStart=")[1].split()[0]) == "ds4deploy"


def test_a_redeploy_keeps_the_installed_venv_made_from_the_same_packages(tmp_path, monkeypatch):
    """The venv copy (~65,000 files) is made once per set of installed packages: a second install of the stack keeps
    it (same files, same inodes) and replaces the rest; a copy recorded for other packages is made again."""
    inv = REPO / "ansible" / "inventories" / "local.yml"
    monkeypatch.setattr(supervisor_service, "INSTALL_DIR", tmp_path / "opt")
    venv = tmp_path / "opt" / "cpu" / "venv"
    supervisor_service.install(load_recipe("cpu"), inv)
    script = (venv / "bin" / "ds4deploy").stat().st_ino
    key = (venv / supervisor_service.VENV_KEY_FILE).read_text()
    assert key == supervisor_service.venv_key(Path(sys.prefix), venv)
    (tmp_path / "opt" / "cpu" / "root" / "recipes" / "cpu.yaml").unlink()  # the rest is replaced whole
    supervisor_service.install(load_recipe("cpu"), inv)
    assert (venv / "bin" / "ds4deploy").stat().st_ino == script
    assert (tmp_path / "opt" / "cpu" / "root" / "recipes" / "cpu.yaml").is_file()
    (venv / supervisor_service.VENV_KEY_FILE).write_text("made from other packages")
    supervisor_service.install(load_recipe("cpu"), inv)
    assert (venv / "bin" / "ds4deploy").stat().st_ino != script
    assert (venv / supervisor_service.VENV_KEY_FILE).read_text() == key


def test_the_installed_supervisor_works_after_the_checkout_is_deleted(tmp_path, monkeypatch):
    """`supervisor start` installs the supervisor apart from the checkout (/opt/ds4deploy/supervisor/<stack>/). Here
    a first install stands in for a deploying clone: a second install made from it, the clone deleted, still loads
    its code, recipe, renders and playbooks from its own copy and plans the restart's variables (a stack's and a
    gateway's), with no path into the deleted tree left in its scripts or import paths."""
    inv = REPO / "ansible" / "inventories" / "local.yml"
    monkeypatch.setattr(supervisor_service, "INSTALL_DIR", tmp_path / "clone")
    (clone_argv, clone_root) = supervisor_service.install(load_recipe("cpu"), inv)
    clone = tmp_path / "clone" / "cpu"
    assert clone_root == clone / "root" and clone_argv[0] == str(clone / "venv" / "bin" / "ds4deploy")
    code = ("import sys; from pathlib import Path; from ds4deploy.operate import service; "
            "from ds4deploy.recipe.load import load_recipe; service.INSTALL_DIR = Path(sys.argv[1]); "
            "print(service.install(load_recipe('cpu'), Path(sys.argv[2]))[0][0])")
    p = subprocess.run([str(clone / "venv" / "bin" / "python"), "-c", code, str(tmp_path / "opt"),
                        str(clone / "inventory.yml")], capture_output=True, text=True, check=True, cwd=tmp_path)
    dest = tmp_path / "opt" / "cpu"
    assert p.stdout.strip() == str(dest / "venv" / "bin" / "ds4deploy")
    shutil.rmtree(tmp_path / "clone")  # the deploying checkout is gone

    for script in ("ds4deploy", "ansible-playbook"):
        assert (dest / "venv" / "bin" / script).read_text().splitlines()[0] == f"#!{dest / 'venv' / 'bin' / 'python3'}"
    where = subprocess.run([str(dest / "venv" / "bin" / "python"), "-c", "import sys, ds4deploy; "
                            "from ds4deploy.recipe.paths import REPO_ROOT; print(ds4deploy.__file__, REPO_ROOT)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert where == [str(dest / "root" / "ds4deploy" / "__init__.py"), str(dest / "root")]
    # What restart.yml's first play runs on the control host: the plan from the installed recipe and inventory.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "DS4_RECIPES_DIR")}
    vars_run = subprocess.run([str(dest / "venv" / "bin" / "ds4deploy"), "vars", "cpu", "--inventory",
                               str(dest / "inventory.yml"), "--scope", "operate"], capture_output=True, text=True,
                              check=False, cwd=tmp_path, env=env)
    assert vars_run.returncode == 0, vars_run.stderr[-2000:]
    syntax = subprocess.run([str(dest / "venv" / "bin" / "ansible-playbook"), "--syntax-check", "-i",
                             str(dest / "inventory.yml"), str(dest / "root" / "ansible" / "restart.yml")],
                            capture_output=True, text=True, check=False, cwd=tmp_path,
                            env={**env, "ANSIBLE_CONFIG": str(dest / "root" / "ansible" / "ansible.cfg")})
    assert syntax.returncode == 0, syntax.stdout[-2000:] + syntax.stderr[-2000:]
    # A gateway's supervisor is installed the same way: what gateway-restart.yml's first play runs (the gateway's
    # variables, which name the router image by the hash of images/gateway/), and the playbook itself.
    gw_vars = subprocess.run([str(dest / "venv" / "bin" / "ds4deploy"), "gateway", "vars", "loopback", "--inventory",
                              str(dest / "inventory.yml"), "--scope", "operate"], capture_output=True, text=True,
                             check=False, cwd=tmp_path, env=env)
    assert gw_vars.returncode == 0, gw_vars.stderr[-2000:]
    syntax = subprocess.run([str(dest / "venv" / "bin" / "ansible-playbook"), "--syntax-check", "-i",
                             str(dest / "inventory.yml"), str(dest / "root" / "ansible" / "gateway-restart.yml"),
                             "-e", "gateway=loopback"], capture_output=True, text=True, check=False, cwd=tmp_path,
                            env={**env, "ANSIBLE_CONFIG": str(dest / "root" / "ansible" / "ansible.cfg")})
    assert syntax.returncode == 0, syntax.stdout[-2000:] + syntax.stderr[-2000:]
