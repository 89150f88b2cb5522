"""One benchmark per server: a second process is refused with the holder's pid, command and start time; the lock
goes away with its holder."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ds4deploy.bench.lock import ServerLock, lock_path
from ds4deploy.core.errors import UserError

HOLDER = """
import sys, time
from ds4deploy.bench.lock import ServerLock
with ServerLock(sys.argv[1], what="bench run cpu --profile smoke"):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_BENCH_LOCK_DIR", str(tmp_path))
    return tmp_path


def hold(url: str, lock_dir) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, url], stdout=subprocess.PIPE, text=True,
                         env={"DS4_BENCH_LOCK_DIR": str(lock_dir), "PATH": "/usr/bin:/bin"})
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_process_is_refused_with_the_holders_details(lock_dir):
    url = "http://127.0.0.1:8000"
    holder = hold(url, lock_dir)
    try:
        with pytest.raises(UserError) as exc, ServerLock(url):
            pass
        msg = exc.value.cause
        assert f"pid {holder.pid}" in msg and "bench run cpu --profile smoke" in msg and "UTC" in msg
        assert str(lock_path(url)) in msg
    finally:
        holder.kill()
        holder.wait()
    with ServerLock(url):  # the kernel dropped the dead holder's flock
        pass


def test_other_server_is_not_blocked(lock_dir):
    holder = hold("http://127.0.0.1:8000", lock_dir)
    try:
        with ServerLock("http://127.0.0.1:8100"):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_lock_is_free_again_after_release_and_names_the_server(lock_dir):
    with ServerLock("http://[::1]:8000") as a:
        assert a.path == lock_dir / "1_8000.lock"
        assert '"server": "http://[::1]:8000"' in a.path.read_text()
    assert a.path.read_text() == ""  # released: no holder described
    with ServerLock("http://[::1]:8000"):
        pass
