"""The bench's one GPU backend (ds4deploy/bench/gpu.py) through its nvidia-smi fallback: this host has no NVIDIA
driver, so NVML fails to load and an ``nvidia-smi`` on PATH is what telemetry and the clock sweep both get. The
stand-in nvidia-smi answers ``--query-gpu`` in the tool's CSV format for the fields asked, with one GPU whose
readings are ``[N/A]`` (as GB10 reports several), or exits with an error."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from ds4deploy.bench import clocks, telemetry
from ds4deploy.bench.gpu import Smi, open_gpu
from ds4deploy.core.errors import UserError

FAKE = """#!/bin/sh
[ -n "$FAKE_SMI_FAIL" ] && { echo "NVIDIA-SMI has failed because it couldn't communicate with the driver"; exit 9; }
fields=$(printf '%s\\n' "$@" | sed -n 's/^--query-gpu=//p')
echo "$fields" | sed 's/,/, /g'
echo "$fields" | awk -F, '{for (i = 1; i <= NF; i++) {v = "[N/A]"; if ($i == "index") v = 0;
  if ($i == "uuid") v = "GPU-fake"; if ($i == "name") v = "NVIDIA GB10"; printf "%s%s", v, (i < NF ? ", " : "\\n")}}'
"""


@pytest.fixture
def smi_on_path(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return exe


def _nvml_loads() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    return True


def test_telemetry_and_the_clock_sweep_fall_back_to_the_same_nvidia_smi(smi_on_path):
    if _nvml_loads():
        pytest.skip("NVML loads on this host: the fallback is not taken")
    src, desc = telemetry.open_source()
    assert isinstance(src, telemetry.SmiSource) and desc == "nvidia-smi: 1 GPU(s)"
    (s,) = src.sample()
    assert (s.index, s.uuid, s.name) == (0, "GPU-fake", "NVIDIA GB10")
    assert s.power_w is None and s.graphics_mhz is None  # N/A stays None, never 0
    backend, desc = clocks.open_backend()
    assert isinstance(backend, clocks.SmiBackend) and desc == "nvidia-smi: 1 GPU(s)"
    assert backend.gpus() == [(0, "GPU-fake")]
    assert backend.read_state(0).power_limit_w is None


def test_a_failing_nvidia_smi_is_one_message_and_no_gpu(smi_on_path, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_FAIL", "1")
    with pytest.raises(UserError, match=r"nvidia-smi -i 0 -rgc exited 9: NVIDIA-SMI has failed") as e:
        clocks.SmiBackend(str(smi_on_path)).reset_locked_clocks(0)
    assert "run as root" in e.value.fix
    if _nvml_loads():
        pytest.skip("NVML loads on this host")
    assert open_gpu(telemetry.NvmlSource, telemetry.SmiSource) == (
        None, f"{_nvml_why()}; nvidia-smi: nvidia-smi --query-gpu=index --format=csv exited 9: NVIDIA-SMI has failed "
        "because it couldn't communicate with the driver")


def _nvml_why() -> str:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"NVML: {exc}"
    return "NVML sees no GPU"


def test_no_nvidia_smi_on_path(monkeypatch, tmp_path):
    if _nvml_loads():
        pytest.skip("NVML loads on this host")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert Smi.name == "nvidia-smi" and shutil.which("nvidia-smi") is None
    src, why = telemetry.open_source()
    assert src is None and why.endswith("nvidia-smi not on PATH)")
