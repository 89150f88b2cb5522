"""`ds4deploy.operate.nginx_reload`'s process list, run by a real POSIX shell (dash, the front door image's sh) over
this machine's /proc."""

from __future__ import annotations

import os
import subprocess

from ds4deploy.operate import nginx_reload


def test_a_process_that_ends_mid_list_is_left_out_not_an_error():
    """The list's glob can name a process that is gone when its cmdline is read (an old nginx worker finishing, the
    list's own `tr`); a make test redeploy failed on "cannot open /proc/42/cmdline" before. Here a pid that does not
    exist is added to the glob's names: the list still succeeds, silent, and holds this test's own process."""
    # A process whose title is not UTF-8 (CI's machine had one: byte 0x80), started here so the list meets one on
    # every machine; its bytes are read as the product reads docker's output.
    odd = subprocess.Popen([b"sleep\x80odd", "60"], executable="sleep")
    gone = 4_000_000  # above Linux's pid_max limit (2^22, kernel/pid.c PID_MAX_LIMIT): never a live process
    script = nginx_reload._LIST.replace("/proc/[0-9]*", f"/proc/[0-9]* /proc/{gone}", 1)
    try:
        p = subprocess.run(["sh", "-c", script], capture_output=True, check=False, timeout=60, **nginx_reload.DECODE)
    finally:
        odd.kill()
        odd.wait()
    assert (p.returncode, p.stderr) == (0, ""), (p.returncode, p.stderr)
    # (a title may hold a newline of its own: only lines that start with a pid count, as `workers` reads them)
    pids = {int(w) for line in p.stdout.splitlines() if (w := line.split(" ", 1)[0]).isdigit()}
    assert os.getpid() in pids and gone not in pids
    assert f"{odd.pid} sleep\ufffdodd 60" in [line.rstrip() for line in p.stdout.splitlines()]
