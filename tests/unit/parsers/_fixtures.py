"""Fixture paths for the parser tests (real captured output; provenance in fixtures/parsers/SOURCES.md)."""

from __future__ import annotations

import errno
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PARSERS = FIXTURES / "parsers"
SYSFS = FIXTURES / "sysfs"
EINVAL_MARKER = "#EINVAL"


def fixture_text(name: str) -> str:
    """Text of tests/unit/fixtures/parsers/<name>."""
    return (PARSERS / name).read_text()


def einval_reader(path: Path) -> str:
    """Read a sysfs fixture file; a file holding only ``#EINVAL`` stands for a kernel read failing with EINVAL.

    The convention is documented in tests/unit/fixtures/sysfs/README.md (a plain file cannot fail a read).
    """
    text = path.read_text()
    if text.strip() == EINVAL_MARKER:
        raise OSError(errno.EINVAL, "Invalid argument", str(path))
    return text

