"""Fixtures for the test hosts (tests/hosts/testhosts.py): two network namespaces with two veth rails.

Needs root, iproute2, iputils-ping and netplan.io on this machine (`make test-hosts` installs the last two).
Every fixture that creates the hosts removes them again, also when a test fails.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts import testhosts
from tests.unit.conftest import recipe_dir  # noqa: F401 (a fixture: tests/hosts/test_model_role.py edits recipes)

REPO = testhosts.REPO
RECIPE = "gx10x2-ds4-flash-fp8"
BIN = Path(sys.executable).parent


def _need_tools() -> None:
    missing = [t for t in ("ip", "ping", "netplan") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"test hosts need root and {', '.join(missing) or 'nothing else'}: run `make test-hosts` "
                    "(it installs iputils-ping and netplan.io)")


# The test hosts are network namespaces on this machine: only their rails are real. The preflight (ansible/
# preflight.yml, which provision.yml runs first) reads this machine's CPU, RAM and disk, so the GX10's thresholds
# (aarch64, 20 cores, 112 GiB RAM, 200 GiB free, a 166.9 GB model) are replaced by ones this machine meets, and a
# stand-in nvidia-smi answers for one GB10 (its real compute capability, 12.1); the PCI bus, /dev/nvidiactl and
# the RDMA devices stay absent, so the driver, toolkit and tuning roles say they skip, as on a host without them.
STAND_IN = {"ds4_cpu_arch": platform.machine(), "ds4_cpu_flags": [], "ds4_min_cores": 1, "ds4_min_ram_gib": 0.5,
            "ds4_min_free_disk_gib": 0.01, "ds4_model_size_gb": 0.0}
NVIDIA_SMI = """#!/bin/sh
# Stand-in nvidia-smi of the test hosts (tests/hosts/conftest.py): one GB10, for the preflight's query only; node-b
# answers $DS4_STAND_IN_GPUS_NODE_B instead when it is set (a node whose GPUs differ).
case "$*" in
  *--query-gpu=name,compute_cap*)
    if [ "$(ip netns identify)" = provision-node-b ] && [ -n "$DS4_STAND_IN_GPUS_NODE_B" ]; then
      printf '%b\\n' "$DS4_STAND_IN_GPUS_NODE_B"
    else
      echo 'NVIDIA GB10, 12.1'
    fi;;
  *) echo 'stand-in nvidia-smi: no answer to this query' >&2; exit 9;;
esac
"""


def _stand_in_bin() -> Path:
    stub = testhosts.RUN_DIR / "bin" / "nvidia-smi"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(NVIDIA_SMI)
    stub.chmod(0o755)
    return stub.parent


def playbook(inventory: Path, *extra: str, tags: str = "rails,kernel_guard,nvidia_driver,nvidia_toolkit,gpu_tuning",
             check: bool = False, gpus_node_b: str = "") -> subprocess.CompletedProcess:
    """Run ansible/provision.yml for the GX10 recipe against `inventory` (the hardware stood in, `STAND_IN`;
    `gpus_node_b`: what node-b's nvidia-smi answers instead of one GB10, rows separated by \\n); returns the
    finished process."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "ansible" / "provision.yml"),
            "-e", f"recipe={RECIPE}", "-e", json.dumps(STAND_IN), "--tags", tags,
            *(["--check", "--diff"] if check else []), *extra]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0",
           "PATH": f"{_stand_in_bin()}:{BIN}:{os.environ.get('PATH', '')}", "DS4_STAND_IN_GPUS_NODE_B": gpus_node_b}
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
