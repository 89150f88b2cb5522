"""Turns at this machine's Docker daemon for the tiers `make test` runs side by side: tests/multinode beside
tests/rehearse (Makefile `multinode-beside-rehearse`), where tests/multinode's daemon restart case stops and starts
the daemon, and the rehearsal builds its stand-in image in it and streams images out of it (`docker save`) while it
sets up each recipe's nodes, so neither meets the daemon half-way through a restart; and tests/office beside
tests/offline (Makefile `last-lanes`), where the office streams the engine-cpu image into its stand-in hosts and
tests/offline removes that image and loads it again from its bundle. Each holds `turn()` around those steps. It is
the one Docker lock of this machine's tests (tests/unit/test_owner_base_image.py takes it with flock(1) around each
Docker change); it lives under /tmp (no host fingerprint reads it: tests/support/fingerprint.py ROOTS) and is
released when its holder exits, however it exits (flock(2))."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK = Path("/tmp/ds4-docker.lock")
# Seconds a tier waits for its turn before it gives up: the longest turn is the rehearsal's per recipe (build the
# stand-in, stream the images into each node: under 5 minutes on the 2-core machine, 2026-12-02) or the daemon
# restart (its own bound is 120 s to stop plus 120 s to answer again); twice the longest seen, with room.
WAIT_S = 900
# Seconds tests/offline's offline deploy may take, while it holds its turn (the engine image removed until that deploy
# has loaded it again from the bundle): the venv, Docker check and image load on a busy 2-core machine, 515-771 s for
# the whole of tests/offline in make test's last phase (2026-12-03), three times that and more. tests/office waits as
# long for its turn beside it.
OFFLINE_DEPLOY_S = 2400


@contextlib.contextmanager
def turn(wait_s: float = WAIT_S, lock: Path | None = None) -> Iterator[None]:
    """Hold this machine's Docker daemon for the steps inside. While another tier holds it: says so once on stderr
    (naming the holder's pid, which the holder writes into the lock file) and waits, up to `wait_s` seconds.

    Raises:
        TimeoutError: the turn was not free within `wait_s` seconds (the message names the lock file and holder).
    """
    path = lock or LOCK
    with path.open("a+") as fh:
        deadline, holder = time.monotonic() + wait_s, None
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if holder is None:
                    fh.seek(0)
                    holder = fh.read().strip() or "a process that did not say (flock(1))"
                    print(f"waiting up to {wait_s:.0f} s for this machine's Docker daemon: {path} is held by {holder}",
                          file=sys.stderr, flush=True)
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{path} still held by {holder} after {wait_s:.0f} s: a tier beside this one "
                                       "kept this machine's Docker daemon; see that tier's output") from None
                time.sleep(1)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)
