"""Run `ds4deploy supervise` as a service of a deployed recipe: `make deploy` starts it, `make status` shows it,
`make down` stops it first (and `make deploy` stops it before it changes the stack, so the supervisor never sees a
deploy's own restarts as failures).

Where systemd runs (``/run/systemd/system`` exists, systemd's own test in sd_booted(3)), the supervisor is the unit
``ds4deploy-supervise-<recipe>.service`` (Restart=on-failure); elsewhere (containers, CI) it is a detached process
in its own session, whose pid and command line are recorded in ``<stack dir>/supervise.json`` so `stop` signals
exactly that process and no other. The stack directory is the control host's ``/opt/ds4deploy/stacks/<stack>``
(ansible/group_vars/all.yml ds4_node_stack_dir); the supervisor's own output goes to ``supervise.log`` beside it,
its journal to /var/lib/ds4deploy/supervise/<recipe>.jsonl (ds4deploy.operate.supervisor).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import Recipe

STACKS_DIR = Path(os.environ.get("DS4_STACKS_DIR", "/opt/ds4deploy/stacks"))
SYSTEMD_RUNTIME = Path("/run/systemd/system")
UNIT_DIR = Path("/etc/systemd/system")
# Seconds a stopped supervisor may take to exit after SIGTERM before it gets SIGKILL: it sleeps between checks and
# may be in the middle of an HTTP probe (5 s timeout, ds4deploy.operate.supervisor.Target.health).
STOP_TIMEOUT_S = 15
# Seconds a starting supervisor may take to record its start (imports and the inventory read: ~2 s on an idle
# 2-core host, several times that while an image builds beside it).
START_TIMEOUT_S = 60


def unit_name(recipe: Recipe) -> str:
    """systemd unit of the recipe's supervisor."""
    return f"ds4deploy-supervise-{recipe.name}.service"


def command(recipe: Recipe, inventory: Path) -> list[str]:
    """The supervisor's argv: this venv's ds4deploy, the recipe, the inventory (absolute)."""
    return [str(Path(sys.executable).parent / "ds4deploy"), "supervise", recipe.name,
            "--inventory", str(inventory.resolve())]


def unit_text(recipe: Recipe, inventory: Path) -> str:
    """The systemd unit of the recipe's supervisor: restarted when it fails, except after it gave up (exit 3,
    ds4deploy.operate.supervisor.GAVE_UP_EXIT), which asks for a human."""
    from ds4deploy.operate.supervisor import GAVE_UP_EXIT
    from ds4deploy.render.compose import REPO_ROOT

    argv = " ".join(command(recipe, inventory))
    return (f"[Unit]\nDescription=ds4deploy supervisor of {recipe.name}\nAfter=docker.service\n\n"
            f"[Service]\nWorkingDirectory={REPO_ROOT}\nExecStart={argv}\nRestart=on-failure\nRestartSec=10\n"
            f"RestartPreventExitStatus={GAVE_UP_EXIT}\n\n[Install]\nWantedBy=multi-user.target\n")


@dataclass(frozen=True)
class Service:
    """Where a recipe's supervisor is recorded on the control host."""

    recipe: Recipe

    @property
    def dir(self) -> Path:
        return STACKS_DIR / self.recipe.base_name

    @property
    def record(self) -> Path:
        return self.dir / "supervise.json"

    @property
    def log(self) -> Path:
        return self.dir / "supervise.log"


def _systemd() -> bool:
    return SYSTEMD_RUNTIME.is_dir()


def _systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False, timeout=60)


def _alive(rec: dict) -> bool:
    """True when the recorded pid runs the recorded command line (a reused pid runs something else; the console
    script runs as ``python3 <script> ...``, so the command line ends with the recorded argv)."""
    try:
        cmdline = [c.decode() for c in Path(f"/proc/{rec['pid']}/cmdline").read_bytes().split(b"\0") if c]
    except OSError:
        return False
    return cmdline[-len(rec["argv"]):] == rec["argv"]


def status(recipe: Recipe) -> dict:
    """{"mode": "systemd"|"process", "running": bool, "pid"?, "unit"?, "since"?}."""
    if _systemd():
        p = _systemctl("is-active", unit_name(recipe))
        return {"mode": "systemd", "unit": unit_name(recipe), "running": p.stdout.strip() == "active"}
    svc = Service(recipe)
    if not svc.record.is_file():
        return {"mode": "process", "running": False}
    rec = json.loads(svc.record.read_text())
    return {"mode": "process", "running": _alive(rec), "pid": rec["pid"], "since": rec["started"],
            "log": str(svc.log)}


def stop(recipe: Recipe) -> dict:
    """Stop the recipe's supervisor if it runs. Returns what was stopped ({"stopped": bool, ...})."""
    if _systemd():
        unit = unit_name(recipe)
        if not (UNIT_DIR / unit).is_file():
            return {"stopped": False, "unit": unit}
        _systemctl("disable", "--now", unit)
        return {"stopped": True, "unit": unit}
    svc = Service(recipe)
    if not svc.record.is_file():
        return {"stopped": False}
    rec = json.loads(svc.record.read_text())
    stopped = False
    if _alive(rec):
        os.killpg(rec["pid"], signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(rec) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(rec):
            os.killpg(rec["pid"], signal.SIGKILL)
        stopped = True
    svc.record.unlink()
    return {"stopped": stopped, "pid": rec["pid"]}


def start(recipe: Recipe, inventory: Path) -> dict:
    """Start the recipe's supervisor (stopping a running one first, so it runs this checkout's code and recipe).

    Raises:
        UserError: the inventory does not exist, or the supervisor exits before it records its start (its log tail
            is shown).
    """
    if not inventory.is_file():
        raise UserError(f"inventory {inventory} does not exist", "pass the inventory the recipe was deployed with")
    stop(recipe)
    argv = command(recipe, inventory)
    if _systemd():
        unit = unit_name(recipe)
        (UNIT_DIR / unit).write_text(unit_text(recipe, inventory))
        for args in (("daemon-reload",), ("enable", "--now", unit)):
            p = _systemctl(*args)
            if p.returncode != 0:
                raise UserError(f"systemctl {' '.join(args)} failed: {p.stderr.strip()}",
                                f"read `journalctl -u {unit}`")
        return {"mode": "systemd", "unit": unit}
    svc = Service(recipe)
    svc.dir.mkdir(parents=True, exist_ok=True)
    from ds4deploy.render.compose import REPO_ROOT

    offset = svc.log.stat().st_size if svc.log.is_file() else 0
    with svc.log.open("a", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=REPO_ROOT, start_new_session=True)
    rec = {"pid": proc.pid, "argv": argv, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # Running means its journal's "start" event (it has read the recipe, inventory and key); a bad one of those
    # makes it exit first.
    deadline = time.monotonic() + START_TIMEOUT_S
    new = ""
    while proc.poll() is None and '"event": "start"' not in new and time.monotonic() < deadline:
        time.sleep(0.2)
        with svc.log.open(encoding="utf-8", errors="replace") as fh:
            fh.seek(offset)
            new = fh.read()
    if proc.poll() is not None or '"event": "start"' not in new:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        tail = new.strip().splitlines()[-4:]
        raise UserError(f"the supervisor of {recipe.name} did not start (exit code {proc.poll()}): "
                        + " | ".join(tail), f"run `ds4deploy supervise {recipe.name}` by hand and fix what it reports")
    svc.record.write_text(json.dumps(rec) + "\n")
    return {"mode": "process", **rec, "log": str(svc.log)}
