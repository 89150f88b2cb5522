"""Turns at this machine's Docker daemon for the tiers `make test` runs side by side (tests/multinode beside
tests/rehearse, Makefile `multinode-beside-rehearse`): tests/multinode's daemon restart case stops and starts the
daemon, and the rehearsal builds its stand-in image in it and streams images out of it (`docker save`) while it
sets up each recipe's nodes. Each holds `turn()` around those steps, so neither meets the daemon half-way through a
restart. It is the one Docker lock of this machine's tests (tests/unit/test_owner_base_image.py takes it with
flock(1) around each Docker change); it lives under /tmp (no host fingerprint reads it: tests/support/fingerprint.py
ROOTS) and is released when its holder exits, however it exits (flock(2))."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

LOCK = Path("/tmp/ds4-docker.lock")


@contextlib.contextmanager
def turn() -> Iterator[None]:
    """Hold this machine's Docker daemon for the steps inside (waits while another tier holds it)."""
    with LOCK.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
