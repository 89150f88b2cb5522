"""Run `ds4deploy supervise` as a service of a deployed recipe: `make deploy` starts it, `make status` shows it,
`make down` stops it first (and `make deploy` stops it before it changes the stack, so the supervisor never sees a
deploy's own restarts as failures).

Where systemd runs (``/run/systemd/system`` exists, systemd's own test in sd_booted(3)), the supervisor is the unit
``ds4deploy-supervise-<recipe>.service`` (Restart=on-failure); elsewhere (containers, CI) it is a detached process
in its own session, whose pid and command line are recorded in ``<stack dir>/supervise.json`` so `stop` signals
exactly that process and no other. The record's directory is the control host's ``/opt/ds4deploy/stacks/<recipe>``
(for a base recipe the directory its stack's files have on a node that is also the control host: ansible/group_vars/
all.yml ds4_node_stack_dir); the supervisor's own output goes to ``supervise.log`` beside it, its journal to
/var/lib/ds4deploy/supervise/<recipe>.jsonl (ds4deploy.operate.supervisor). Each is named after the recipe as
deployed, a variant (``<recipe>--<variant>``) included: one control host can deploy a recipe here and its variant on
other hosts, each with its own supervisor; on one host two variants of a recipe never run together (they share one
compose project: the deploy's preflight refuses, ansible/roles/preflight/tasks/serving.yml).

A gateway (recipes/gateways/<name>.yaml) has its supervisor the same way, named after the gateway: unit
``ds4deploy-supervise-<gateway>.service``, record ``<STACKS_DIR>/<gateway>/supervise.json``, journal
``/var/lib/ds4deploy/supervise/<gateway>.jsonl``, install ``/opt/ds4deploy/supervisor/<gateway>/`` (a gateway's name
is never a stack recipe's: `ds4deploy.render.gateway.load_gateway` refuses it, so the two never share these).

The stack is host-wide, so its supervisor must not depend on the checkout that deployed it: `start` first installs
what the supervisor runs and reads under ``/opt/ds4deploy/supervisor/<recipe>/`` (`install`): a copy of this venv
(``venv/``; hardlinked where /opt shares the checkout's filesystem, its scripts pointed at the copy's own python),
the code, recipes, renders, playbooks and image build files it reads (``root/``) and the inventory
(``inventory.yml``). Deleting or moving the checkout afterwards leaves supervision, restarts included, working.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import VARIANT_SEP, GatewayRecipe, Recipe

STACKS_DIR = Path(os.environ.get("DS4_STACKS_DIR", "/opt/ds4deploy/stacks"))
# Where each stack's supervisor is installed, apart from any checkout (`install`).
INSTALL_DIR = Path(os.environ.get("DS4_SUPERVISOR_DIR", "/opt/ds4deploy/supervisor"))
# What the supervisor reads from the repository: its code, the recipes, their committed renders (restart.yml starts
# compose/<recipe>/ as rendered), the playbooks it runs, and the image build files (a gateway's play variables name
# the router image by the hash of images/gateway/: ds4deploy.build.gateway_image.image_ref; 128 KB in all).
INSTALLED_TREES = ("ds4deploy", "recipes", "compose", "ansible", "images")
SYSTEMD_RUNTIME = Path("/run/systemd/system")
UNIT_DIR = Path("/etc/systemd/system")
# Seconds a stopped supervisor may take to exit after SIGTERM before it gets SIGKILL: it sleeps between checks and
# may be in the middle of an HTTP probe (5 s timeout, ds4deploy.operate.supervisor.Target.health).
STOP_TIMEOUT_S = 15
# Seconds a starting supervisor may take to record its start (imports and the inventory read: ~2 s on an idle
# 2-core host, several times that while an image builds beside it).
START_TIMEOUT_S = 60


def unit_name(recipe: Recipe | GatewayRecipe) -> str:
    """systemd unit of the recipe's supervisor."""
    return f"ds4deploy-supervise-{recipe.name}.service"


def _link_or_copy(src: str, dst: str) -> None:
    """Hardlink `src` to `dst` (instant, no space; the link outlives the checkout's file), else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# Records, in an installed venv, which packages it was copied from (`venv_key`).
VENV_KEY_FILE = "ds4deploy-venv.key"
# The .pth file that puts an installed copy's root/ on its import path (`_copy_venv`).
ROOT_PTH = "ds4deploy-supervisor-root.pth"
# Bump when `_copy_venv` changes what a copy holds: copies made the old way are then made again.
COPY_FORMAT = 1


def venv_key(venv: Path, final: Path) -> str:
    """sha256 (hex) of what a copy of `venv` installed at `final` holds: the copy's format (`COPY_FORMAT`), `final`
    (its scripts' ``#!`` line and ``.pth`` name paths under it), the Python version and every installed
    distribution's RECORD (name, version and each file's sha256, written by pip: PEP 376/627). An installed copy
    whose key file holds the same key is kept (`install`)."""
    h = hashlib.sha256(f"{COPY_FORMAT}\0{final}\0{sys.version}".encode())
    for record in sorted(venv.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        h.update(b"\0" + record.parent.name.encode() + b"\0" + record.read_bytes())
    return h.hexdigest()


def _copy_venv(src: Path, out: Path, final: Path, root: Path) -> None:
    """Copy the venv `src` to `out` (to be renamed to `final`): library files hardlinked, scripts rewritten to run
    `final`'s python, the checkout's editable ds4deploy left out and a ``.pth`` naming `root` instead."""
    # A source that is itself an installed copy has a .pth and a key file of its own: hardlinked, writing the
    # copy's would rewrite the source's.
    shutil.copytree(src, out, symlinks=True, copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns("__pycache__", "__editable__*ds4deploy*", "bin", ROOT_PTH,
                                                  VENV_KEY_FILE))
    (out / "bin").mkdir()
    for f in sorted((src / "bin").iterdir()):
        script = out / "bin" / f.name
        if f.is_symlink():
            script.symlink_to(os.readlink(f))  # python -> the system interpreter
            continue
        if not f.is_file():
            continue
        data = f.read_bytes()
        if data.startswith(b"#!") and str(src).encode() in data.split(b"\n", 1)[0]:
            data = data.replace(str(src).encode(), str(final).encode(), 1)
        script.write_bytes(data)
        script.chmod(f.stat().st_mode)
    site = next(out.glob("lib/python*/site-packages"))
    (site / ROOT_PTH).write_text(f"{root}\n")


def install(recipe: Recipe | GatewayRecipe, inventory: Path) -> tuple[list[str], Path]:
    """Install the recipe's supervisor under INSTALL_DIR/<recipe>/ (a variant has its own), independent of this
    checkout; returns (argv of the installed supervisor, its working directory). The previous install is replaced
    whole.

    - ``venv/``: this venv (`sys.prefix`), its library files hardlinked (copied across filesystems), its scripts
      copied with their ``#!`` line pointed at the copy's python; the checkout's editable install of ds4deploy is
      left out and a ``.pth`` names ``root/`` instead. The stack's previous copy is kept when it was made from the
      same packages (`venv_key`, recorded in ``venv/ds4deploy-venv.key``): copying the 1.2 GB, ~65,000-file venv
      took about 10 s of every `make deploy` on the 2-core CI machine (2026-12-02);
    - ``root/``: copies of `INSTALLED_TREES` (ds4deploy resolves REPO_ROOT there, so the playbooks, renders and
      recipes it reads are these copies);
    - ``inventory.yml``: the inventory, with ``group_vars/`` and ``host_vars/`` beside it when there are any.

    Raises:
        UserError: the inventory does not exist, or INSTALL_DIR cannot be written (run as root).
    """
    from ds4deploy.recipe.paths import REPO_ROOT

    if not inventory.is_file():
        raise UserError(f"inventory {inventory} does not exist", "pass the inventory the recipe was deployed with")
    dest = INSTALL_DIR / recipe.name
    new = dest.with_name(dest.name + ".new")
    src_venv = Path(sys.prefix)
    key = venv_key(src_venv, dest / "venv")
    kept = dest / "venv" / VENV_KEY_FILE
    try:
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        for tree in INSTALLED_TREES:
            shutil.copytree(REPO_ROOT / tree, new / "root" / tree, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy2(inventory, new / "inventory.yml")
        for side in ("group_vars", "host_vars"):
            if (inventory.parent / side).is_dir():
                shutil.copytree(inventory.parent / side, new / side)
        keep = kept.is_file() and kept.read_bytes() == key.encode()
        if not keep:
            _copy_venv(src_venv, new / "venv", dest / "venv", dest / "root")
            (new / "venv" / VENV_KEY_FILE).write_text(key)
        old = dest.with_name(dest.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if dest.exists():
            dest.rename(old)
        try:
            if keep:  # the previous install's venv moves into the new one; the swap is two renames
                (old / "venv").rename(new / "venv")
            new.rename(dest)
        except BaseException:
            if keep and (new / "venv").is_dir():
                (new / "venv").rename(old / "venv")
            if not dest.exists():
                old.rename(dest)  # the previous install stays whole
            raise
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise UserError(f"cannot install the supervisor under {INSTALL_DIR}: {exc}",
                        "run `ds4deploy supervisor start` as root (make deploy does)") from None
    argv = [str(dest / "venv" / "bin" / "ds4deploy"), "supervise", recipe.name, "--inventory",
            str(dest / "inventory.yml")]
    return argv, dest / "root"


def unit_text(recipe: Recipe | GatewayRecipe, argv: list[str], cwd: Path) -> str:
    """The systemd unit of the recipe's supervisor (`argv` run in `cwd`, as `install` returns them): restarted when
    it fails, except after it gave up (exit 3, ds4deploy.operate.supervisor.GAVE_UP_EXIT), which asks for a
    human."""
    from ds4deploy.operate.supervisor import GAVE_UP_EXIT

    return (f"[Unit]\nDescription=ds4deploy supervisor of {recipe.name}\nAfter=docker.service\n\n"
            f"[Service]\nWorkingDirectory={cwd}\nExecStart={' '.join(argv)}\nRestart=on-failure\nRestartSec=10\n"
            f"RestartPreventExitStatus={GAVE_UP_EXIT}\n\n[Install]\nWantedBy=multi-user.target\n")


@dataclass(frozen=True)
class Service:
    """Where a recipe's supervisor is recorded on the control host."""

    recipe: Recipe | GatewayRecipe

    @property
    def dir(self) -> Path:
        return STACKS_DIR / self.recipe.name

    @property
    def record(self) -> Path:
        return self.dir / "supervise.json"

    @property
    def log(self) -> Path:
        return self.dir / "supervise.log"


def _supervised(record: Path) -> str | None:
    """The recipe a record's supervisor watches (the word after ``supervise`` in its argv), or None."""
    try:
        argv = json.loads(record.read_text())["argv"]
        return argv[argv.index("supervise") + 1]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _move_older_variant_record(recipe: Recipe | GatewayRecipe) -> None:
    """Before 2026-12-03 a variant's record was kept in its base recipe's directory (named after `base_name`): one
    found there that supervises a variant is moved to that variant's own directory (unless it has one), so that
    the variant's `make down` still finds and stops it and the base recipe's never takes it for its own."""
    old = STACKS_DIR / recipe.base_name / "supervise.json"
    owner = _supervised(old)
    if owner and owner.startswith(f"{recipe.base_name}{VARIANT_SEP}"):
        new = STACKS_DIR / owner / "supervise.json"
        if not new.exists():
            new.parent.mkdir(parents=True, exist_ok=True)
            old.rename(new)


def _systemd() -> bool:
    return SYSTEMD_RUNTIME.is_dir()


def _systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False, timeout=60)


def _alive(rec: dict) -> bool:
    """True when the recorded pid runs the recorded command line (a reused pid runs something else; the console
    script runs as ``python3 <script> ...``, so the command line ends with the recorded argv; a reused pid's title may
    be any bytes, not UTF-8)."""
    try:
        raw = Path(f"/proc/{rec['pid']}/cmdline").read_bytes()
        cmdline = [c.decode(errors="replace") for c in raw.split(b"\0") if c]
    except OSError:
        return False
    return cmdline[-len(rec["argv"]):] == rec["argv"]


def status(recipe: Recipe | GatewayRecipe) -> dict:
    """{"mode": "systemd"|"process", "running": bool, "pid"?, "unit"?, "since"?}."""
    if _systemd():
        p = _systemctl("is-active", unit_name(recipe))
        return {"mode": "systemd", "unit": unit_name(recipe), "running": p.stdout.strip() == "active"}
    _move_older_variant_record(recipe)
    svc = Service(recipe)
    if not svc.record.is_file():
        return {"mode": "process", "running": False}
    rec = json.loads(svc.record.read_text())
    return {"mode": "process", "running": _alive(rec), "pid": rec["pid"], "since": rec["started"],
            "log": str(svc.log)}


def stop(recipe: Recipe | GatewayRecipe) -> dict:
    """Stop the recipe's supervisor if it runs. Returns what was stopped ({"stopped": bool, ...})."""
    if _systemd():
        unit = unit_name(recipe)
        if not (UNIT_DIR / unit).is_file():
            return {"stopped": False, "unit": unit}
        _systemctl("disable", "--now", unit)
        return {"stopped": True, "unit": unit}
    _move_older_variant_record(recipe)
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


def start(recipe: Recipe | GatewayRecipe, inventory: Path) -> dict:
    """Start the recipe's supervisor (stopping a running one first, so it runs this checkout's code and recipe),
    installed apart from this checkout (`install`).

    Raises:
        UserError: the inventory does not exist, or the supervisor exits before it records its start (its log tail
            is shown).
    """
    if not inventory.is_file():
        raise UserError(f"inventory {inventory} does not exist", "pass the inventory the recipe was deployed with")
    stop(recipe)
    argv, cwd = install(recipe, inventory)
    if _systemd():
        unit = unit_name(recipe)
        (UNIT_DIR / unit).write_text(unit_text(recipe, argv, cwd))
        for args in (("daemon-reload",), ("enable", "--now", unit)):
            p = _systemctl(*args)
            if p.returncode != 0:
                raise UserError(f"systemctl {' '.join(args)} failed: {p.stderr.strip()}",
                                f"read `journalctl -u {unit}`")
        return {"mode": "systemd", "unit": unit}
    svc = Service(recipe)
    svc.dir.mkdir(parents=True, exist_ok=True)
    offset = svc.log.stat().st_size if svc.log.is_file() else 0
    with svc.log.open("a", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=cwd, start_new_session=True)
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
