"""The supervisor as a service of a deployed recipe: the key file rule, the detached process's record, and a
supervisor that cannot run stopping `start` with its own message. The running service is proven live by
`make deploy` / `make status` / `make down` (tests/infra, tests/multinode)."""

from __future__ import annotations

import json
import os
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


def test_a_supervisor_that_cannot_run_stops_start_with_its_message(stacks, tmp_path, monkeypatch):
    """`start` runs the real `ds4deploy supervise`; here its inventory is not YAML, so it exits at once, and `start`
    says so instead of recording a dead process."""
    inv = tmp_path / "inv.yml"
    inv.write_text("all: [\n")
    monkeypatch.setattr(supervisor_service, "command",
                        lambda recipe, inventory: [str(REPO / ".venv" / "bin" / "ds4deploy"), "supervise",
                                                   recipe.name, "--inventory", str(inventory)])
    with pytest.raises(UserError, match="did not start"):
        supervisor_service.start(load_recipe("cpu"), inv)
    assert not supervisor_service.Service(load_recipe("cpu")).record.exists()
    with pytest.raises(UserError, match="does not exist"):
        supervisor_service.start(load_recipe("cpu"), tmp_path / "missing.yml")


def test_the_systemd_unit_runs_the_supervisor_and_stops_after_giving_up(tmp_path):
    from ds4deploy.operate.supervisor import GAVE_UP_EXIT

    unit = supervisor_service.unit_text(load_recipe("cpu"), tmp_path / "inv.yml")
    assert f"supervise cpu --inventory {tmp_path / 'inv.yml'}" in unit
    assert "Restart=on-failure" in unit and f"RestartPreventExitStatus={GAVE_UP_EXIT}" in unit
    assert os.path.basename(unit.split("ExecStart=")[1].split()[0]) == "ds4deploy"
