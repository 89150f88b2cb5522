"""Model manifests: the exact files a recipe's model consists of, and verification of a model directory.

A manifest is JSON committed next to the recipe (``recipes/<name>.manifest.json``)::

    {"recipe": "cpu", "source": "generated", "files": {"config.json": {"size": 843, "sha256": "..."}, ...}}

Sizes are bytes. Each file carries ``sha256`` or, for small files of a hub repository whose metadata records only
their git object id, ``git_sha1`` (sha1 of ``b"blob <size>\0" + content``, as git computes it).
Hub manifests also record ``repo_id`` and ``revision``, the full 40-hex commit the recipe's pin resolves to
(`ds4deploy.model.hub.hub_manifest`); `ds4deploy.model.fetch` downloads exactly that commit. ``source: local``
manifests list the
sha256 of the user's own files. `ds4deploy.model.lock` builds and records manifests (`ds4deploy model lock`).
`verify_dir` re-hashes every listed file (in parallel, `ds4deploy.model.verify`); any missing, wrong-size or different
file fails. `check_manifest` refuses a manifest whose shape or file names are unsafe before anything is written.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath

from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_json
from ds4deploy.engines.llamacpp import SPLIT_RE
from ds4deploy.recipe import paths as recipe_paths
from ds4deploy.recipe.schema import Recipe


def manifest_path(recipe: Recipe) -> Path:
    """Where the recipe's committed manifest lives."""
    return recipe_paths.RECIPES_DIR / f"{recipe.base_name}.manifest.json"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    from ds4deploy.model.verify import hash_path

    return hash_path(path, "sha256")


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
            f"create it with `ds4deploy model lock {recipe.base_name}` (local models: add --from PATH) and commit it",
        )
    fix = f"rebuild it: delete it and run `ds4deploy model lock {recipe.base_name}`"
    manifest = load_json(path, fix)
    check_manifest(manifest, str(path))
    named = str(manifest.get("recipe", ""))
    if named.split("--", 1)[0] != recipe.base_name:
        raise UserError(f"{path} records the model of recipe {named!r}, not of '{recipe.base_name}': a manifest copied "
                        "from another recipe (or edited) says nothing about this one's model", fix)
    return manifest


# The largest file size a manifest records, in bytes: 2**53 - 1, the largest integer RFC 8259 (section 6) says JSON
# readers agree on (IEEE 754 doubles hold every integer up to it exactly); 8 PiB, past any model file.
MAX_FILE_BYTES = 2**53 - 1

_HEX = {"sha256": re.compile(r"^[0-9a-f]{64}$"), "git_sha1": re.compile(r"^[0-9a-f]{40}$")}
FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")


# A GGUF split in parts by llama.cpp's gguf-split (`ds4deploy.engines.llamacpp.SPLIT_RE`): the engine is given
# part 1 and opens the others itself, so every part 1..count must be there and no other. When split.count > 1 the
# engine derives every part's name from part 1's with the lower-case "-%05d-of-%05d.gguf" and compares byte for byte
# (llama.cpp src/llama.cpp llama_split_path / llama_split_prefix; src/llama-model-loader.cpp llama_get_list_splits
# stops with "invalid split file name" otherwise), so a part is recognised here in any case (M-00001-of-00003.GGUF
# is a part too, and its missing siblings are named) and one not named exactly as gguf-split names it is refused.
_SPLIT_ANY_CASE = re.compile(SPLIT_RE.pattern, re.IGNORECASE)


def split_gguf_problems(names: list[str]) -> list[str]:
    """What is wrong with the split GGUF parts among `names` (file paths), one line each: a part missing, a part
    numbered past its count or 0, parts of one model that disagree on the count, a part whose ``-of-`` or ``.gguf``
    is not in lower case (found in any case, so its missing siblings are named too). Empty when every split model
    has all its parts (or there is none)."""
    groups: dict[str, dict[int, set[int]]] = {}
    miscased: dict[str, list[str]] = {}
    for name in names:
        m = _SPLIT_ANY_CASE.match(name)
        if m:
            groups.setdefault(m["stem"], {}).setdefault(int(m["count"]), set()).add(int(m["no"]))
            if not SPLIT_RE.match(name) and int(m["count"]) > 1:  # a 1-part "split" is loaded as one file
                miscased.setdefault(m["stem"], []).append(PurePosixPath(name).name)
    out = []
    for stem, wrong in sorted(miscased.items()):
        out.append(f"split GGUF {stem}: part(s) " + ", ".join(sorted(wrong)) + " are not named as gguf-split names "
                   "parts (<stem>-NNNNN-of-MMMMM.gguf, in lower case); the engine derives each part's name from part "
                   "1's in lower case and stops with 'invalid split file name'")
    for stem, by_count in sorted(groups.items()):
        if len(by_count) > 1:
            out.append(f"split GGUF {stem}: its parts disagree on the count (" + ", ".join(
                f"{len(parts)} part(s) of {n:05d}" for n, parts in sorted(by_count.items())) + ")")
            continue
        (n, parts), = by_count.items()
        bad = sorted(i for i in parts if not 1 <= i <= n)
        missing = [i for i in range(1, n + 1) if i not in parts]
        out += [f"split GGUF {stem}: part {i:05d}-of-{n:05d} is numbered past its count (a dangling part)" for i in bad]
        if missing:
            out.append(f"split GGUF {stem}: part(s) " + ", ".join(f"{i:05d}-of-{n:05d}" for i in missing)
                       + f" missing ({len(parts)} of {n} present); the engine opens part 1 and reads every other part")
    return out


def check_manifest(manifest: dict, where: str = "the manifest") -> None:
    """Refuse a manifest that cannot be trusted to name files: a JSON object whose ``files`` maps each name to an
    object with an integer ``size`` from 0 to `MAX_FILE_BYTES` (not a bool, not a string) and a ``sha256`` (64 hex) or
    ``git_sha1`` (40 hex), and every name must be a plain relative POSIX path (no ``..``, no absolute path, no
    backslash), since fetch writes each name under the model directory. A split GGUF must have all its parts
    (`split_gguf_problems`). Every reader of a manifest goes through here (`load_manifest`), the estimator too.

    Raises:
        UserError: naming the first bad entry.
    """
    rebuild = "rebuild it: delete it and run `ds4deploy model lock <recipe>`"
    if not isinstance(manifest, dict):
        raise UserError(f"{where} is not a JSON object ({{\"recipe\", \"source\", \"files\"}}) but a "
                        f"{type(manifest).__name__}", rebuild)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise UserError(f"{where} lists no files", rebuild)
    for name, entry in files.items():
        parts = PurePosixPath(name).parts
        if (not name or name.startswith("/") or "\\" in name or any(p in ("..", ".") for p in parts)
                or name != str(PurePosixPath(name))):
            raise UserError(f"{where} names an unsafe path {name!r}",
                            "file names must be relative paths inside the model directory")
        if not isinstance(entry, dict):
            raise UserError(f"{where}: {name} is {entry!r:.60}, not an object with size and sha256", rebuild)
        size = entry.get("size")
        if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
            raise UserError(f"{where}: {name} has size {size!r:.60}, not an integer number of bytes from 0 to "
                            f"{MAX_FILE_BYTES:,} (2**53 - 1, the largest integer JSON readers agree on)", rebuild)
        kinds = [k for k in ("sha256", "git_sha1") if entry.get(k)]
        if not kinds or not _HEX[kinds[0]].match(str(entry[kinds[0]])):
            raise UserError(f"{where}: {name} has no valid sha256 (64 hex) or git_sha1 (40 hex)",
                            "rebuild the manifest")
    split = split_gguf_problems(list(files))
    if split:
        raise UserError(f"{where}: " + "; ".join(split), "lock the model with every part of the split GGUF "
                        "(all <stem>-NNNNN-of-MMMMM.gguf files of one download, named in lower case as gguf-split "
                        "writes them, in one directory)")


def verify_dir(model_dir: Path, manifest: dict) -> list[str]:
    """Compare a model directory with a manifest, re-hashing every file (no sidecar), in parallel.

    Returns:
        One line per problem (missing file, wrong size, wrong sha256/git sha1 with both digests); empty when the
        directory matches.
    """
    from ds4deploy.model.verify import verify_model

    return verify_model(model_dir, manifest, full=True, use_sidecar=False).problems()


def sha256_map(model_dir: Path, manifest: dict) -> dict[str, str]:
    """sha256 of every manifest file in a verified directory: what each node's copy is checked against."""
    return {name: (want.get("sha256") or sha256_file(model_dir / name)) for name, want in manifest["files"].items()}
