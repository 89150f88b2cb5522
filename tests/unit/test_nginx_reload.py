"""`ds4deploy.operate.nginx_reload`'s process list, run by a real POSIX shell (dash, the front door image's sh) over
this machine's /proc, read through the module's own `workers` (a `docker` on PATH that runs `docker exec`'s command
here)."""

from __future__ import annotations

import os
import subprocess

from ds4deploy.operate import nginx_reload


def test_a_process_that_ends_mid_list_or_has_a_title_that_is_not_utf8_is_no_error(tmp_path, monkeypatch):
    """The list's glob can name a process that is gone when its cmdline is read (an old nginx worker finishing, the
    list's own `tr`); a make test redeploy failed on "cannot open /proc/42/cmdline" before. A title can hold any
    bytes (CI's machine had one with 0x80, which failed the read as UTF-8). Here a pid that does not exist is added
    to the glob's names and a worker-titled process with such a byte runs: `workers` lists it, U+FFFD in place of
    the byte, and nothing fails."""
    docker = tmp_path / "docker"  # `docker exec <container> sh -c <list>` -> `sh -c <list>` on this machine
    docker.write_text('#!/bin/sh\nshift 2\nexec "$@"\n')
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    gone = 4_000_000  # above Linux's pid_max limit (2^22, kernel/pid.c PID_MAX_LIMIT): never a live process
    monkeypatch.setattr(nginx_reload, "_LIST", nginx_reload._LIST.replace("/proc/[0-9]*", f"/proc/[0-9]* /proc/{gone}",
                                                                          1))
    odd = subprocess.Popen([b"nginx: worker process\x80", "60"], executable="sleep")
    try:
        found = nginx_reload.workers("front-door")
    finally:
        odd.kill()
        odd.wait()
    assert found.get(odd.pid) == "nginx: worker process\ufffd 60", found
    assert gone not in found
