"""Fail the image build when nvcc, the CUDA runtime headers and cudart are not one toolkit.

Why: TileLang JIT-compiles kernels at run time with the nvcc it finds; pip's CUDA packages can disagree (nvcc 13.2
next to runtime headers 13.0) and the first JIT compile then dies with CCCL "compiler and toolkit headers are
incompatible" (docs/sources.md#cuda-toolkit-match). Checking at build time turns a run-time crash into a build error.

Usage (inside the image): python3 check_cuda_toolkit.py <CUDA_HOME>
Exit 0 when all three agree on major.minor, 1 (with the three versions) otherwise, 2 when one cannot be read.
Pure parsing functions are unit-tested in tests/unit/test_images.py on real tool output.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def nvcc_release(text: str) -> str:
    """'Cuda compilation tools, release 13.2, V13.2.86' -> '13.2.86' (the V field), from `nvcc --version`."""
    m = re.search(r"release \d+\.\d+, V(\d+\.\d+\.\d+)", text)
    if not m:
        raise ValueError("no 'release X.Y, VX.Y.Z' line in nvcc --version output")
    return m.group(1)


def header_version(text: str) -> str:
    """'#define CUDART_VERSION 13020' in cuda_runtime_api.h -> '13.2' (major*1000 + minor*10)."""
    m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    if not m:
        raise ValueError("no CUDART_VERSION define in cuda_runtime_api.h")
    v = int(m.group(1))
    return f"{v // 1000}.{(v % 1000) // 10}"


def agree(nvcc: str, headers: str, cudart: str) -> bool:
    """True when the three versions share major.minor."""
    return len({".".join(v.split(".")[:2]) for v in (nvcc, headers, cudart)}) == 1


def main(cuda_home: str) -> int:
    home = Path(cuda_home)
    try:
        nvcc = nvcc_release(subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True,
                                           text=True, check=True).stdout)
        headers = header_version((home / "include" / "cuda_runtime_api.h").read_text())
        cudart = metadata.version("nvidia-cuda-runtime")
    except (OSError, ValueError, subprocess.CalledProcessError, metadata.PackageNotFoundError) as exc:
        print(f"error: cannot read the CUDA toolkit versions under {home}: {exc}", file=sys.stderr)
        return 2
    line = f"nvcc {nvcc}, headers {headers}, cudart {cudart}"
    if agree(nvcc, headers, cudart):
        print(f"one CUDA toolkit: {line}")
        return 0
    print(f"error: CUDA toolkit versions disagree: {line}\nfix: pin nvidia-cuda-runtime and nvidia-cuda-nvrtc to "
          "the nvcc version (CUDA_PIP_VERSION)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/opt/venv/lib/python3.12/site-packages/nvidia/cu13"))
