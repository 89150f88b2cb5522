"""Serve a directory as a hub repository at one commit (tests/support/fakehub.py), in whichever network namespace
this process runs (the rehearsal starts it inside the head node's, where the control host's commands run).

    python -m tests.rehearse.hub <repo_id> <commit> <dir>     prints "endpoint <url>", serves until SIGTERM
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from tests.support.fakehub import FakeHub


def main(argv: list[str]) -> int:
    """Serve `dir`'s files as `repo_id` at `commit` until SIGTERM."""
    repo_id, commit, root = argv
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with FakeHub(repo_id, commit, files) as hub:
        print(f"endpoint {hub.endpoint}", flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
