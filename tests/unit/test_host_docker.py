"""tests/support/host_docker.turn: the turn at this machine's Docker daemon that `make test`'s lanes take, against a
real holder (flock(1) in another process, as tests/unit/test_owner_base_image.py holds it)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support import host_docker

pytestmark = pytest.mark.tool  # a real flock(1) process and real waits


def test_a_held_turn_names_its_holder_gives_up_in_time_and_is_taken_once_free(tmp_path, capsys):
    lock = tmp_path / "docker.lock"
    holder = subprocess.Popen(["flock", str(lock), "sh", "-c", f'echo "pid $$" > {lock}; sleep 4'])
    deadline = time.monotonic() + 10
    while not (lock.is_file() and lock.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    said = lock.read_text().strip()
    assert said.startswith("pid "), said
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"held by {said} after 1 s"), host_docker.turn(wait_s=1, lock=lock):
        pytest.fail("the turn was taken while another process held it")
    assert 1 <= time.monotonic() - t0 < 3
    assert f"is held by {said}" in capsys.readouterr().err
    with host_docker.turn(wait_s=30, lock=lock):  # free once the holder exits
        assert holder.poll() is not None
        assert lock.read_text() == f"pid {os.getpid()}\n"
    assert lock.read_text() == ""
