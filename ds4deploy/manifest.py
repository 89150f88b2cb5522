"""Model manifests: the exact files a recipe's model consists of, and verification of a model directory.

A manifest is JSON committed next to the recipe (``recipes/<name>.manifest.json``)::

    {"recipe": "cpu", "source": "generated", "files": {"config.json": {"size": 843, "sha256": "..."}, ...}}

Sizes are bytes. Each file carries ``sha256`` or, for small files of a hub repository whose metadata records only
their git object id, ``git_sha1`` (sha1 of ``b"blob <size>\0" + content``, as git computes it).
`verify_dir` re-hashes every listed file; any missing, wrong-size or different file fails.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ds4deploy import recipe as recipe_mod
from ds4deploy.errors import UserError
from ds4deploy.recipe import Recipe

CHUNK = 1 << 20  # 1 MiB reads


def manifest_path(recipe: Recipe) -> Path:
    """Where the recipe's committed manifest lives."""
    return recipe_mod.RECIPES_DIR / f"{recipe.base_name}.manifest.json"


def _hash_file(path: Path, h) -> str:
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    return _hash_file(path, hashlib.sha256())


def git_sha1_file(path: Path) -> str:
    """Git blob object id of a file: sha1 over ``b"blob <size>\0"`` followed by the content."""
    return _hash_file(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False))


def manifest_of_files(recipe: Recipe, files: dict[str, bytes]) -> dict:
    """Manifest dict for in-memory file contents (used for the deterministic generated model)."""
    return {
        "recipe": recipe.name,
        "source": recipe.model.source,
        "files": {
            name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in sorted(files.items())
        },
    }


def load_manifest(recipe: Recipe) -> dict:
    """Read the committed manifest.

    Raises:
        UserError: no manifest is committed for the recipe.
    """
    path = manifest_path(recipe)
    if not path.is_file():
        raise UserError(
            f"no model manifest for recipe '{recipe.name}' ({path} is missing)",
            f"create it with `ds4deploy model manifest {recipe.name} --write` and commit it",
        )
    return json.loads(path.read_text(encoding="utf-8"))


def verify_dir(model_dir: Path, manifest: dict) -> list[str]:
    """Compare a model directory with a manifest.

    Returns:
        One line per problem (missing file, wrong size, wrong sha256); empty when the directory matches.
    """
    problems = []
    for name, want in sorted(manifest["files"].items()):
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{path}: size {size} bytes, manifest says {want['size']}")
            continue
        kind = "sha256" if "sha256" in want else "git_sha1"
        digest = sha256_file(path) if kind == "sha256" else git_sha1_file(path)
        if digest != want[kind]:
            problems.append(f"{path}: {kind} {digest[:16]}..., manifest says {want[kind][:16]}...")
    return problems


def sha256_map(model_dir: Path, manifest: dict) -> dict[str, str]:
    """sha256 of every manifest file in a verified directory: what each node's copy is checked against."""
    return {name: (want.get("sha256") or sha256_file(model_dir / name)) for name, want in manifest["files"].items()}
