"""An exclusive ``flock`` on a file that also says who holds it.

The package's one flock helper. Used where two runs of one operation on one target spoil each other: one
benchmark per server (`ds4deploy.bench.lock`, docs/sources.md#gx10-benchmark-method: a stray clock-sweep
script), one clock sweep per host
(`ds4deploy.bench.clocks.sweep_lock`) and one fetch per model directory (`ds4deploy.model.fetch`:
two fetches into one staging directory overwrite each other's partial files and the second one's final move can
place a file the first is still writing). The file holds the holder's pid, command line and start time as JSON so
the refused run can name it. The kernel drops an flock when its holder dies, so a killed run never leaves a stale
lock; the JSON is only a description and is emptied on release.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ds4deploy.core.errors import UserError


class HolderLock:
    """Context manager holding an exclusive, non-blocking flock on `path`.

    Args:
        path: the lock file (its directory is created; the file is left in place, empty, after release).
        refused: builds the error for a refused attempt from the holder's description (``"pid 123 (ds4deploy
            model fetch ...), started 2026-11-29 22:40:00 UTC"``).
        what: the command line recorded for this holder (default: ``sys.argv``).
        extra: more fields recorded in the JSON (e.g. the server URL).
        remove: delete the lock file on release (while still holding it), so a finished run leaves nothing behind.
            An acquirer then re-checks that the path still names the file it locked (same inode) and retries
            otherwise, so a run that opened the file just before it was deleted cannot hold a lock nobody sees.

    Raises (on enter):
        UserError: another process holds the lock (the error `refused` builds).
    """

    def __init__(self, path: Path, refused: Callable[[str], UserError], what: str | None = None,
                 extra: dict | None = None, remove: bool = False) -> None:
        self.path = Path(path)
        self.refused = refused
        self.what = what or " ".join(sys.argv)
        self.extra = extra or {}
        self.remove = remove
        self.fd: int | None = None

    def __enter__(self) -> HolderLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
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
                raise self.refused(who) from None
            if self._still_named(fd):
                break
            os.close(fd)  # the previous holder deleted the file between our open and our flock: take the new one
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "command": self.what,
                "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), **self.extra}
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def _still_named(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            if self.remove:
                self.path.unlink(missing_ok=True)
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
