"""The one way the bench reaches NVIDIA GPUs: NVML through nvidia-ml-py, with nvidia-smi as the fallback.

GPU telemetry (`ds4deploy.bench.telemetry`) and the clock sweep (`ds4deploy.bench.clocks`) both build on these two
backends and on `open_gpu`, which picks NVML when it loads and sees a GPU, else nvidia-smi when it runs and lists
one. A value a device does not report (NVML ``NOT_SUPPORTED``; nvidia-smi ``[N/A]`` / ``[Not Supported]``, several
of them on GB10, see `ds4deploy.bench.telemetry`) is None, never 0.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import TypeVar

from ds4deploy.core.errors import UserError
from ds4deploy.parsers.nvidia_smi import parse_query_gpu

# What to try when a GPU setting is refused: the setters need root, and not every GPU supports every setting.
SETTING_FIX = "run as root; check `nvidia-smi -q -d CLOCK,POWER` for what the GPU supports"


class Nvml:
    """NVML through nvidia-ml-py. `pynvml` is the imported (and initialised) module, injectable for tests.

    `handles` holds one device handle per GPU, in the driver's index order (as `nvidia-smi -i`).
    """

    name = "nvml"

    def __init__(self, pynvml) -> None:
        self.nv = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def get(self, fn, *args):
        """fn(*args) with bytes decoded, or None when NVML reports the value unavailable (NOT_SUPPORTED, N/A)."""
        try:
            v = fn(*args)
        except self.nv.NVMLError:
            return None
        return v.decode() if isinstance(v, bytes) else v

    def do(self, what: str, fn, *args) -> None:
        """Call the NVML setter fn(*args).

        Raises:
            UserError: NVML refused (``could not <what>``).
        """
        try:
            fn(*args)
        except self.nv.NVMLError as exc:
            raise UserError(f"NVML could not {what}: {exc}", SETTING_FIX) from None

    def count(self) -> int:
        """Number of GPUs NVML sees."""
        return len(self.handles)

    def names(self) -> list[str | None]:
        """Each GPU's product name (None: unavailable)."""
        return [self.get(self.nv.nvmlDeviceGetName, h) for h in self.handles]


class Smi:
    """nvidia-smi, one process per call; ``--query-gpu`` output parsed by `ds4deploy.parsers.nvidia_smi`."""

    name = "nvidia-smi"

    def __init__(self, exe: str = "nvidia-smi") -> None:
        self.exe = exe

    def run(self, *args: str, timeout_s: float = 60, fix: str = SETTING_FIX) -> str:
        """``nvidia-smi ARGS``; its stdout.

        Raises:
            UserError: it could not start, timed out or exited non-zero (`fix` is the advice given).
        """
        what = " ".join(args)
        try:
            p = subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UserError(f"nvidia-smi {what} failed: {exc}", "check the NVIDIA driver (`nvidia-smi` by hand)") \
                from None
        if p.returncode != 0:
            raise UserError(f"nvidia-smi {what} exited {p.returncode}: {(p.stdout + p.stderr).strip()[:300]}", fix)
        return p.stdout

    def query(self, fields: Sequence[str], timeout_s: float = 60) -> list[dict]:
        """``nvidia-smi --query-gpu=FIELDS --format=csv``: one dict per GPU (see `parse_query_gpu` for the keys).

        Raises:
            UserError: nvidia-smi failed or printed something that is not its CSV.
        """
        return parse_query_gpu(self.run(f"--query-gpu={','.join(fields)}", "--format=csv", timeout_s=timeout_s,
                                        fix="check the NVIDIA driver (`nvidia-smi` by hand)"), list(fields))

    def count(self) -> int:
        """Number of GPUs nvidia-smi lists."""
        return len(self.query(("index",), timeout_s=20))


N = TypeVar("N", bound=Nvml)
S = TypeVar("S", bound=Smi)


def open_gpu(nvml_cls: Callable[..., N], smi_cls: Callable[..., S]) -> tuple[N | S | None, str]:
    """The first backend that sees a GPU: ``nvml_cls(pynvml)``, else ``smi_cls(path of nvidia-smi)``.

    Returns:
        (backend, "nvml: 2 GPU(s) (NVIDIA GB10, ...)" or "nvidia-smi: 2 GPU(s)"), or (None, why neither works,
        "; "-joined, e.g. "nvidia-ml-py not installed; nvidia-smi not on PATH").
    """
    why = []
    try:
        import pynvml

        pynvml.nvmlInit()
        nv = nvml_cls(pynvml)
        if nv.count():
            return nv, f"nvml: {nv.count()} GPU(s) ({', '.join(n or '?' for n in nv.names())})"
        why.append("NVML sees no GPU")
    except ImportError:
        why.append("nvidia-ml-py not installed")
    except Exception as exc:  # any NVML failure (library not found, driver not loaded) means "no NVML"
        why.append(f"NVML: {exc}")
    exe = shutil.which("nvidia-smi")
    if exe is None:
        why.append("nvidia-smi not on PATH")
    else:
        smi = smi_cls(exe)
        try:
            n = smi.count()
            if n:
                return smi, f"nvidia-smi: {n} GPU(s)"
            why.append("nvidia-smi lists no GPU")
        except UserError as exc:
            why.append(f"nvidia-smi: {exc.cause}")
    return None, "; ".join(why)
