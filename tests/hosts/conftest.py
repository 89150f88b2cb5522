"""Fixtures for the test hosts (tests/hosts/testhosts.py): two network namespaces with two veth rails.

Needs root, iproute2, iputils-ping and netplan.io on this machine (`make test-hosts` installs the last two).
Every fixture that creates the hosts removes them again, also when a test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts import testhosts

REPO = testhosts.REPO
RECIPE = "gx10x2-ds4-flash-fp8"
BIN = Path(sys.executable).parent


def _need_tools() -> None:
    missing = [t for t in ("ip", "ping", "netplan") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"test hosts need root and {', '.join(missing) or 'nothing else'}: run `make test-hosts` "
                    "(it installs iputils-ping and netplan.io)")


def playbook(inventory: Path, *extra: str, tags: str = "rails,kernel_guard,nvidia_driver,nvidia_toolkit,gpu_tuning",
             check: bool = False) -> subprocess.CompletedProcess:
    """Run ansible/provision.yml for the GX10 recipe against `inventory`; returns the finished process."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "ansible" / "provision.yml"),
            "-e", f"recipe={RECIPE}", "--tags", tags, *(["--check", "--diff"] if check else []), *extra]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
           "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=600)


def ds4(*args: str) -> subprocess.CompletedProcess:
    """Run the ds4deploy CLI of this venv."""
    return subprocess.run([str(BIN / "ds4deploy"), *args], capture_output=True, text=True, cwd=REPO, check=False,
                          timeout=300)


@pytest.fixture(scope="module")
def fresh_hosts():
    """Both test hosts, as created: rails down, MTU 1500, no address. Removed after the module."""
    _need_tools()
    testhosts.up(RECIPE)
    try:
        yield testhosts.INVENTORY
    finally:
        testhosts.down()
