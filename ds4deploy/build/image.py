"""Prepare an engine image's build context: Dockerfile, local wheelhouse and extra CA bundle.

The build context is a directory of its own (never the repo), so the daemon receives only what the build needs:

    <dest>/Dockerfile       copy of images/<arch>/Dockerfile
    <dest>/wheelhouse/      wheels pip may install from (hard links where possible), including every artifact the
                            build would download, verified against recipes/<name>.lock.json
                            (`ds4deploy.build.artifacts`)
    <dest>/extra-ca.pem     CA certificates appended to the image's system bundle during the build only

Why a wheelhouse: the CPU engine needs ``torch==2.13.0+cpu``, a local version served only by the PyTorch CPU
index, and air-gapped sites need every wheel local. Why a CA file: pip inside the build must trust a
TLS-inspecting proxy the host already trusts. Neither reaches the final image (builder stage only).
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.recipe.schema import Recipe

IMAGES_DIR = REPO_ROOT / "images"
# Tag of the Debian bookworm base built by images/base/build-base.sh when no registry is reachable (the script's
# default is the same tag).
LOCAL_BASE_IMAGE = "ds4deploy/debian:bookworm-local"
# The public Debian bookworm base of the images built here (the recipes' base_image for Debian-based images).
PUBLIC_BASE_IMAGE = "debian:bookworm-slim"
# Seconds: pip's own reads of its config are instant; a torch download (~190 MB) on a slow proxy is not.
PIP_CONFIG_TIMEOUT_S = 60
TORCH_DOWNLOAD_TIMEOUT_S = 1800
# Where PyTorch publishes CPU-only wheels (pytorch.org "Get started", pip --index-url for CPU builds);
# $DS4_TORCH_INDEX points at a mirror.
TORCH_CPU_INDEX = os.environ.get("DS4_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")


def image_exists(ref: str) -> bool:
    """Whether the local Docker daemon has image `ref` (`docker image inspect` answers 0)."""
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False).returncode == 0


def debian_base(public: str = PUBLIC_BASE_IMAGE) -> str:
    """The Debian bookworm base to build a small image from on this machine: the local debootstrap base
    (LOCAL_BASE_IMAGE, images/base/build-base.sh) when the daemon has it, as on a machine without a registry; else
    `public` (a recipe's base_image), which the build pulls."""
    return LOCAL_BASE_IMAGE if image_exists(LOCAL_BASE_IMAGE) else public


def ca_bundle_from_env() -> Path | None:
    """The CA bundle the control host's Python clients trust: $PIP_CERT, $SSL_CERT_FILE or $REQUESTS_CA_BUNDLE."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return Path(os.environ[var])
    return None


def proxy_from_env() -> str | None:
    """The HTTPS proxy of the control host ($https_proxy or $HTTPS_PROXY)."""
    return os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY") or None


def _pip_config_find_links() -> list[str]:
    """find-links entries from pip's configuration files (``pip config list``), e.g. a site wheel mirror."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              check=False, timeout=PIP_CONFIG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return []
    out = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            out += value.strip().strip("'\"").split()
    return out


def default_wheel_dirs() -> list[Path]:
    """Wheel directories to search, in order: $DS4_WHEELHOUSE (colon-separated), pip's find-links ($PIP_FIND_LINKS
    and pip's config files), then the project's own cache (.cache/wheelhouse). URLs are skipped."""
    # DS4_WHEELHOUSE is a PATH-like list; pip separates find-links with white space (URLs contain colons).
    parts: list[str] = os.environ.get("DS4_WHEELHOUSE", "").split(":")
    parts += os.environ.get("PIP_FIND_LINKS", "").split()
    parts += _pip_config_find_links()
    dirs: list[Path] = []
    for part in parts:
        if part and not part.startswith(("http://", "https://")):
            d = Path(part.removeprefix("file://"))
            if d not in dirs:
                dirs.append(d)
    dirs.append(REPO_ROOT / ".cache" / "wheelhouse")
    return [d for d in dirs if d.is_dir()]


def torch_wheel_name_prefix(torch_version: str) -> str:
    """File name prefix of a torch wheel for a version, e.g. ``torch-2.13.0+cpu-cp311-``.

    The container runs Debian bookworm's Python 3.11, hence cp311.
    """
    return f"torch-{torch_version}-cp311-"


def _fetch_torch(version: str, into: Path, arch: str) -> Path | None:
    """Try to download the torch wheel (cp311, manylinux for `arch`) from the PyTorch CPU index.

    Returns its path, or None when the index is unreachable or has no such wheel.
    """
    into.mkdir(parents=True, exist_ok=True)
    # --isolated: only the PyTorch index, not pip's configured find-links (already searched by the caller).
    extra: list[str] = []
    if cert := ca_bundle_from_env():
        extra += ["--cert", str(cert)]
    if proxy := proxy_from_env():
        extra += ["--proxy", proxy]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--isolated", *extra, "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "--platform", f"manylinux_2_28_{arch}", "--index-url", TORCH_CPU_INDEX,
             "-d", str(into), f"torch=={version}"],
            capture_output=True, text=True, timeout=TORCH_DOWNLOAD_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    found = sorted(into.glob(torch_wheel_name_prefix(version) + "*.whl"))
    return found[0] if found else None


def _place(src: Path, dst: Path, link: bool = False) -> bool:
    """Copy src to dst unless an identical file is there. Returns True when dst changed.

    `link=True` hard-links instead (for wheels: immutable by name, and large); a hard link shares its inode, so
    only files that are never edited in place may be linked, or a change would go unnoticed.
    """
    if dst.is_file() and (os.path.samefile(src, dst) or filecmp.cmp(src, dst, shallow=False)):
        return False
    dst.unlink(missing_ok=True)
    if link:
        try:
            os.link(src, dst)
            return True
        except OSError:
            pass
    shutil.copy2(src, dst)
    return True


def prepare_context(
    recipe: Recipe, dest: Path, wheel_dirs: list[Path] | None = None, ca_bundle: Path | None = None
) -> bool:
    """Lay out the build context for `recipe` in `dest`.

    Args:
        recipe: whose ``engine.image`` to build.
        dest: context directory (created).
        wheel_dirs: where to look for wheels; `default_wheel_dirs()` when None.
        ca_bundle: extra CA certificates for pip; $PIP_CERT / $SSL_CERT_FILE / $REQUESTS_CA_BUNDLE when None.
    Returns:
        True when any file in the context changed (the image must be rebuilt).
    Raises:
        UserError: no Dockerfile for the image arch, the torch wheel the build needs is nowhere to be had, a
            downloaded artifact has no lock or differs from it (`ds4deploy.build.artifacts.locked_files`), or an
            owner-supplied base image has no image ID in the lock (`ds4deploy.build.artifacts.locked_base_image`;
            each node compares its own image with that ID before building, ansible/roles/image/tasks/build.yml).
    """
    from ds4deploy.build.artifacts import locked_base_image, locked_files

    src_dir = IMAGES_DIR / recipe.engine.image.arch
    dockerfile = src_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise UserError(f"no Dockerfile at {dockerfile}", f"add images/{recipe.engine.image.arch}/Dockerfile")
    locked_base_image(recipe)  # an owner-supplied base without a locked image ID stops before anything is laid out
    dirs = default_wheel_dirs() if wheel_dirs is None else wheel_dirs
    locked = locked_files(recipe, dirs)  # downloaded artifacts verified against the lock before anything is laid out
    dest.mkdir(parents=True, exist_ok=True)
    wheelhouse = dest / "wheelhouse"
    wheelhouse.mkdir(exist_ok=True)
    changed = False
    for f in sorted(src_dir.iterdir()):  # the Dockerfile and its helper scripts
        if f.is_file():
            changed |= _place(f, dest / f.name)

    wanted: dict[str, Path] = {}
    for d in dirs:
        for whl in sorted(d.glob("*.whl")):
            wanted.setdefault(whl.name, whl)
    # Only the CPU image installs a torch build that PyPI does not serve (+cpu); GPU images take theirs from PyPI,
    # the PyTorch CUDA index or their base image.
    torch_version = recipe.image_build_args.get("TORCH_VERSION") if recipe.engine.image.arch == "cpu" else None
    if torch_version and not any(n.startswith(torch_wheel_name_prefix(torch_version)) for n in wanted):
        got = _fetch_torch(torch_version, REPO_ROOT / ".cache" / "wheelhouse", recipe.hardware.cpu.arch)
        if got is None:
            raise UserError(
                f"the image build needs the wheel torch=={torch_version} (cp311, x86-64) and none was found in "
                f"{', '.join(map(str, dirs)) or 'any wheel directory'}, nor could it be downloaded from "
                f"{TORCH_CPU_INDEX}",
                f"download it where you have network (pip download --no-deps --python-version 3.11 "
                f"--only-binary=:all: --index-url {TORCH_CPU_INDEX} torch=={torch_version} -d DIR) and set "
                "DS4_WHEELHOUSE=DIR",
            )
        wanted[got.name] = got
    wanted.update(locked)
    for name, src in wanted.items():
        changed |= _place(src, wheelhouse / name, link=True)
    for stale in wheelhouse.glob("*.whl"):
        if stale.name not in wanted:
            stale.unlink()
            changed = True

    if ca_bundle is None:
        ca_bundle = ca_bundle_from_env()
    ca_dst = dest / "extra-ca.pem"
    if ca_bundle is not None:
        if not ca_bundle.is_file():
            raise UserError(f"CA bundle {ca_bundle} does not exist", "pass an existing PEM file, or none")
        changed |= _place(ca_bundle, ca_dst)
    elif not ca_dst.is_file() or ca_dst.stat().st_size:
        ca_dst.write_bytes(b"")
        changed = True
    return changed


def context_digest(recipe: Recipe, dest: Path) -> str:
    """sha256 identifying what an image built from `dest` contains: Dockerfile and CA bytes, wheel names and
    sizes (wheels are immutable by name), the recipe's build args, the locked artifact digests (`build_args`) and
    the locked image ID of an owner-supplied base (`ds4deploy.build.artifacts.locked_base_image`: another locked
    image rebuilds the engine image). Stored as the image label ``io.ds4deploy.context-sha256``; the deploy rebuilds
    whenever the label differs."""
    h = hashlib.sha256()
    for f in sorted(p for p in dest.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for whl in sorted((dest / "wheelhouse").glob("*.whl")):
        h.update(f"{whl.name}:{whl.stat().st_size}\0".encode())
    h.update(json.dumps(build_args(recipe), sort_keys=True).encode())
    from ds4deploy.build.artifacts import locked_base_image

    if (base := locked_base_image(recipe)) is not None:
        h.update(f"base:{base['ref']}:{base['id']}\0".encode())
    return h.hexdigest()


def build_args(recipe: Recipe) -> dict[str, str]:
    """The build arguments of the recipe's image: `Recipe.image_build_args` with each locked artifact's
    ``<NAME>_SHA256`` from recipes/<name>.lock.json (`ds4deploy.build.artifacts.locked_build_args`).

    Raises:
        UserError: an artifact of the build has no lock, or the recipe pins another sha256 than the lock.
    """
    from ds4deploy.build.artifacts import locked_build_args

    return {**recipe.image_build_args, **locked_build_args(recipe)}


def generated_chat_template(recipe: Recipe) -> str | None:
    """The chat template a ``generated`` llama.cpp recipe's tiny GGUF embeds (`ds4deploy.model.tiny_gguf`): the
    model's own, read from the llama.cpp source the recipe's image is built from (the sdist artifact locked in
    recipes/<name>.lock.json, obtained and checked by `locked_files`); None for every other recipe (nothing to
    embed).

    Raises:
        UserError: the artifact cannot be obtained or differs from its lock (`locked_files`); it holds no template
            (`ds4deploy.model.tiny_gguf.chat_template_from`).
    """
    if recipe.model.source != "generated" or recipe.model.gguf is None:
        return None
    from ds4deploy.build.artifacts import lock_path, locked_files
    from ds4deploy.model.tiny_gguf import chat_template_from

    sdists = [p for name, p in locked_files(recipe, default_wheel_dirs()).items() if name.endswith(".tar.gz")]
    if len(sdists) != 1:
        raise UserError(f"recipe '{recipe.name}': {lock_path(recipe).name} locks {len(sdists)} source archives; the "
                        "tiny GGUF's chat template is read from the one llama.cpp source of the image",
                        f"lock the image's llama.cpp source: `ds4deploy image lock {recipe.base_name}`")
    return chat_template_from(sdists[0])
