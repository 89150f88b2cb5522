"""`ds4deploy gateway usage <gateway>` read back by the deployed gateway tests (tests/gateway, tests/office)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def usage_table(recipe: str) -> dict[str, dict[str, int]]:
    """`ds4deploy gateway usage <recipe>` parsed back from its table: person -> {"requests", "bytes_out",
    "tokens_in", "tokens_out", "fell_back"} (counts; bytes as nginx's $body_bytes_sent)."""
    p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "gateway", "usage", recipe],
                       capture_output=True, text=True, cwd=REPO, check=True)
    header = p.stdout.splitlines()[0]
    assert "tokens in" in header and "tokens out" in header and "fell back" in header, header
    out = {}
    for row in p.stdout.splitlines()[1:]:
        cols = row.split()
        if len(cols) >= 9 and cols[1].isdigit():
            out[cols[0]] = {"requests": int(cols[1]), "bytes_out": int(cols[4]), "tokens_in": int(cols[5]),
                            "tokens_out": int(cols[6]), "fell_back": int(cols[8])}
    return out
