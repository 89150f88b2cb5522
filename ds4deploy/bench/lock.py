"""One benchmark per server at a time: an exclusive ``flock`` on a per-server lock file.

SEEDS B: a stray clock-sweep script kept running under another benchmark (92.5 vs 139.3 tok/s for the same case);
the fix there was one serial run under an flock lock. The lock file is named after the server's URL, lives in
``$DS4_BENCH_LOCK_DIR`` (default ``/tmp/ds4deploy-bench``, shared by every user of the control host), and holds the
holder's pid, command line and start time as JSON, so a second run can say who holds it. The kernel drops an
flock when its holder dies, so a killed run never leaves a stale lock; the JSON is only a description.

Scope: benchmarks started from the same control host. Traffic from elsewhere is caught per cell instead, by the
server's finished-request counter (see `ds4deploy.bench.metrics`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from ds4deploy.errors import UserError


def lock_dir() -> Path:
    """Where lock files live: $DS4_BENCH_LOCK_DIR, else <tmp>/ds4deploy-bench."""
    return Path(os.environ.get("DS4_BENCH_LOCK_DIR") or Path(tempfile.gettempdir()) / "ds4deploy-bench")


def lock_path(base_url: str) -> Path:
    """The lock file of the server at `base_url` (scheme dropped, other characters made file-name safe)."""
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", base_url.split("://", 1)[-1]).strip("_")
    return lock_dir() / f"{name}.lock"


class ServerLock:
    """Context manager holding the server's benchmark lock.

    Raises (on enter):
        UserError: another process holds the lock; the message names its pid, command and start time.
    """

    def __init__(self, base_url: str, what: str | None = None) -> None:
        self.base_url = base_url
        self.path = lock_path(base_url)
        self.what = what or " ".join(sys.argv)
        self.fd: int | None = None

    def __enter__(self) -> ServerLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.path.parent, 0o1777)  # noqa: S103 - shared by every user and sticky, like /tmp
        except PermissionError:
            pass
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            try:
                h = json.loads(holder)
                who = f"pid {h['pid']} ({h['command']}), started {h['started']}"
            except (ValueError, KeyError, TypeError):
                who = "a process that has not written its details yet"
            raise UserError(f"another benchmark is running against {self.base_url}: {who} (lock {self.path})",
                            "wait for it to finish, or stop that process by its pid; two benchmarks on one "
                            "server measure each other") from None
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "command": self.what,
                "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), "server": self.base_url}
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
