"""One benchmark per server at a time: an exclusive ``flock`` on a per-server lock file.

docs/sources.md#gx10-benchmark-method: a stray clock-sweep script kept running under another benchmark (92.5 vs 139.3
tok/s for the same case); the fix there was one serial run under an flock lock. The lock file is named after the
server's URL, lives in ``$DS4_BENCH_LOCK_DIR`` (default ``/tmp/ds4deploy-bench``, shared by every user of the control
host), and holds the holder's pid, command line and start time as JSON, so a second run can say who holds it. The kernel
drops an flock when its holder dies, so a killed run never leaves a stale lock; the JSON is only a description.

Scope: benchmarks started from the same control host. Traffic from elsewhere is caught per cell instead, by the
server's finished-request counter (see `ds4deploy.bench.metrics`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.core.holder_lock import HolderLock


def lock_dir() -> Path:
    """Where lock files live: $DS4_BENCH_LOCK_DIR, else <tmp>/ds4deploy-bench."""
    return Path(os.environ.get("DS4_BENCH_LOCK_DIR") or Path(tempfile.gettempdir()) / "ds4deploy-bench")


def lock_path(base_url: str) -> Path:
    """The lock file of the server at `base_url` (scheme dropped, other characters made file-name safe)."""
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", base_url.split("://", 1)[-1]).strip("_")
    return lock_dir() / f"{name}.lock"


class ServerLock(HolderLock):
    """Context manager holding the server's benchmark lock (`ds4deploy.core.holder_lock.HolderLock`).

    Raises (on enter):
        UserError: another process holds the lock; the message names its pid, command and start time.
    """

    def __init__(self, base_url: str, what: str | None = None) -> None:
        self.base_url = base_url
        path = lock_path(base_url)

        def refused(who: str) -> UserError:
            return UserError(f"another benchmark is running against {base_url}: {who} (lock {path})",
                             "wait for it to finish, or stop that process by its pid; two benchmarks on one "
                             "server measure each other")

        super().__init__(path, refused, what, {"server": base_url})

    def __enter__(self) -> ServerLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.path.parent, 0o1777)  # noqa: S103 - shared by every user and sticky, like /tmp
        except PermissionError:
            pass
        super().__enter__()
        return self
