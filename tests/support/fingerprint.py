"""A fingerprint of a node's state, to prove a refused deploy changed nothing: take one before, one after, compare.

What it holds:

- files: every path under `ROOTS` (the host's /etc, which holds netplan's /etc/netplan and each test host's
  /etc/netns/<ns>/netplan; /opt/ds4deploy, the stacks; /var/lib/ds4deploy, models, build contexts, incidents) with
  its type, size, mtime (ns) and mode, from lstat (symlinks are not followed; a symlink's target is recorded; a
  directory by its mode and its entries, not its own mtime); an installed supervisor's venv by its top entries,
  its key file among them (the comment under `ROOTS`);
- containers: every Docker container (``docker ps -a``), name -> (id, state: running, exited, ...);
- images: every Docker image (``docker images -a``), repository:tag -> id (dangling ones by id alone).

Skipped, because they change by themselves while nothing deploys (`VOLATILE`):

- /var/lib/ds4deploy/supervise: a running supervisor's journal and restart log, appended on its own schedule (its
  progress probe), not by a deploy;
- /etc/ld.so.cache, /etc/adjtime: rewritten by ldconfig and hwclock at any time; a deploy touches neither directly;
- a container's health (docker's Status column: "Up 5 minutes (healthy)") and the uptime: only the State is kept.

Which containers or images other users of the same Docker daemon make in the meantime is not filtered: a test that
compares two fingerprints runs while nothing else deploys on the host (`make test` runs tests/e2e and tests/hosts,
the tiers that take them, while no other tier runs).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOTS = ("/etc", "/opt/ds4deploy", "/var/lib/ds4deploy")
# An installed supervisor's venv (/opt/ds4deploy/supervisor/<name>/venv, holding pyvenv.cfg: PEP 405)
# holds ~65,000 files, made whole by `ds4deploy supervisor start` after a deploy's every check has passed (its
# ds4deploy-venv.key names the packages it was made from: ds4deploy.operate.service.venv_key). Its top entries (that
# key file among them) are recorded, not every file below: walking seven of them took 5 s per fingerprint on the
# 2-core CI machine (2026-12-02), and tests/e2e takes two per refusal.
VOLATILE = ("/var/lib/ds4deploy/supervise", "/etc/ld.so.cache", "/etc/adjtime")


@dataclass(frozen=True)
class Fingerprint:
    """The state of one host: files (path -> (kind, size, mtime_ns, mode, link target)), containers (name ->
    (id, state)) and images (reference -> id)."""

    files: dict[str, tuple] = field(default_factory=dict)
    containers: dict[str, tuple[str, str]] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)


def _skipped(path: str, volatile: Iterable[str]) -> bool:
    return any(path == v or path.startswith(v.rstrip("/") + "/") for v in volatile)


def files(roots: Iterable[str] = ROOTS, volatile: Iterable[str] = VOLATILE) -> dict[str, tuple]:
    """Every path under `roots` (the roots included, missing roots left out) that is not `volatile`: path ->
    (kind, size in bytes, mtime in ns, permission bits, symlink target or "")."""
    volatile = tuple(volatile)
    out: dict[str, tuple] = {}

    def record(path: str) -> bool:
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # removed while walking: the walk after the change sees it gone
            return False
        kind = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f"
        target = os.readlink(path) if kind == "l" else ""
        # A directory is recorded by its entries, each one itself: its own size (blocks) and mtime (any entry
        # added, removed or renamed, such as ldconfig's rename of a new /etc/ld.so.cache) add nothing but noise.
        size, mtime = (0, 0) if kind == "d" else (st.st_size, st.st_mtime_ns)
        out[path] = (kind, size, mtime, stat.S_IMODE(st.st_mode), target)
        return kind == "d"

    for root in roots:
        if not os.path.lexists(root) or _skipped(root, volatile):
            continue
        record(root)
        for top, dirs, names in os.walk(root, followlinks=False):
            dirs[:] = [d for d in dirs if not _skipped(os.path.join(top, d), volatile)]
            for name in [*dirs, *names]:
                path = os.path.join(top, name)
                if not _skipped(path, volatile):
                    record(path)
            if "pyvenv.cfg" in names and Path(top).parent.parent.name == "supervisor":  # an installed venv
                dirs[:] = []
    return out


def parse_containers(text: str) -> dict[str, tuple[str, str]]:
    """``docker ps -a --no-trunc --format '{{json .}}'`` output -> container name -> (id, state)."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            c = json.loads(line)
            out[c["Names"]] = (c["ID"], c["State"])
    return out


def parse_images(text: str) -> dict[str, str]:
    """``docker images -a --no-trunc --format '{{json .}}'`` output -> "repository:tag" (or the id of an untagged
    image) -> image id."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            i = json.loads(line)
            ref = i["ID"] if i["Repository"] == "<none>" else f"{i['Repository']}:{i['Tag']}"
            out[ref] = i["ID"]
    return out


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args, "--no-trunc", "--format", "{{json .}}"], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def take(roots: Iterable[str] = ROOTS, docker: bool = True) -> Fingerprint:
    """The fingerprint of this host now (`docker`: with its containers and images)."""
    return Fingerprint(files(roots), parse_containers(_docker("ps", "-a")) if docker else {},
                       parse_images(_docker("images", "-a")) if docker else {})


def _diff_maps(what: str, a: dict, b: dict) -> list[str]:
    out = [f"{what} added: {k} {b[k]}" for k in sorted(b.keys() - a.keys())]
    out += [f"{what} removed: {k} {a[k]}" for k in sorted(a.keys() - b.keys())]
    out += [f"{what} changed: {k} {a[k]} -> {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return out


def diff(before: Fingerprint, after: Fingerprint) -> list[str]:
    """One line per difference (added, removed, changed), files first; empty when nothing changed."""
    return (_diff_maps("file", before.files, after.files) + _diff_maps("container", before.containers,
                                                                      after.containers)
            + _diff_maps("image", before.images, after.images))

