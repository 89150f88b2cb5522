"""The gateway's router image (images/gateway/): its derived tag and its build from pinned wheels.

The build context is images/gateway/ plus ``wheelhouse/``, filled by ``pip download`` of requirements.txt in
hash-checking mode (every wheel's sha256 is pinned there), so the Dockerfile installs with ``--no-index`` and needs
no network and no CA bundle. The tag carries the SMG version and the hash of the files the image is built from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ds4deploy.build.image import debian_base, image_exists
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.paths import REPO_ROOT

IMAGE_DIR = REPO_ROOT / "images" / "gateway"
# The files the image is built from; an edit of any gives a new tag.
IMAGE_FILES = ("Dockerfile", "requirements.txt", "router-launch.py")
# The SMG release requirements.txt pins (https://pypi.org/project/smg/1.13.0/).
SMG_VERSION = "1.13.0"
# Debian bookworm's python3 is 3.11 and the image is x86_64: the wheels pip downloads must fit that.
WHEEL_TARGET = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--platform",
                "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64",
                "--platform", "manylinux_2_5_x86_64", "--platform", "manylinux1_x86_64"]


def image_ref() -> str:
    """``repository:tag`` of the gateway image: the SMG version and the sha256 (12 hex) of `IMAGE_FILES`."""
    h = hashlib.sha256()
    for name in IMAGE_FILES:
        h.update((IMAGE_DIR / name).read_bytes())
    return f"ds4deploy/gateway-smg:smg-{SMG_VERSION}-{h.hexdigest()[:12]}"


def prepare_context(dest: Path) -> Path:
    """Copy images/gateway/ into `dest` and download the pinned wheels into ``dest/wheelhouse`` (pip checks each
    against requirements.txt's sha256). Returns `dest`.

    Raises:
        UserError: pip could not download a wheel or a hash differs (pip's message).
    """
    dest.mkdir(parents=True, exist_ok=True)
    for name in IMAGE_FILES:
        shutil.copy2(IMAGE_DIR / name, dest / name)
    wheels = dest / "wheelhouse"
    wheels.mkdir(exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        *WHEEL_TARGET, "-d", str(wheels), "-r", str(dest / "requirements.txt")],
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise UserError(f"could not download the gateway image's wheels: {(p.stderr or p.stdout).strip()[-600:]}",
                        "check PyPI is reachable (or PIP_INDEX_URL); a hash mismatch means the index serves another "
                        "file than the one images/gateway/requirements.txt pins")
    return dest


def build(base_image: str | None = None) -> str:
    """Build the gateway image unless it exists (its tag names its inputs). Returns its reference.

    Args:
        base_image: the Debian bookworm base; default the local debootstrap base when present, else
            debian:bookworm-slim.
    Raises:
        UserError: the wheels cannot be downloaded, or docker build fails (its last lines).
    """
    ref = image_ref()
    if image_exists(ref):
        return ref
    base = base_image or debian_base()
    ctx = prepare_context(REPO_ROOT / ".cache" / "build" / "gateway")
    p = subprocess.run(["docker", "build", "-t", ref, "--build-arg", f"BASE_IMAGE={base}", str(ctx)],
                       capture_output=True, text=True, check=False, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    if p.returncode != 0:
        raise UserError(f"docker build of {ref} failed: {(p.stdout + p.stderr).strip()[-800:]}",
                        "read the build output above; images/gateway/Dockerfile")
    return ref
