"""Locking a recipe's model: build its manifest once from the model's own source and record it beside the recipe.

`ds4deploy model lock <recipe>` (and the deploy's first `model stage` when no manifest is committed) writes
``recipes/<name>.manifest.json``, which the user commits; from then on the committed manifest wins:
every later fetch, copy and node check is verified against it, and a source that disagrees with it stops.

Where a manifest comes from, per ``model.source``:

- ``hub``: the hub's own per-file metadata at the full commit the pin resolves to (`ds4deploy.model.hub.hub_manifest`):
  the LFS sha256 of large files, the git blob sha1 of small ones, every size. Nothing is downloaded.
- ``local``: a file or a directory the user names (``--from``), e.g. a GGUF split into several ``.gguf`` parts:
  every regular file under it (hidden names left out) is hashed with sha256, in parallel, with a progress bar.
- ``generated``: the deterministic tiny checkpoint's bytes (`ds4deploy.model.generated.generated_files`: the tiny
  safetensors checkpoint, or a llama.cpp recipe's tiny GGUF parts).
"""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.engines.llamacpp import gguf_parts
from ds4deploy.model.manifest import check_manifest, manifest_of_files, manifest_path, split_gguf_problems
from ds4deploy.recipe.schema import Recipe

# How many names a message lists before "and N more": enough to recognise a folder, short enough for one line.
SHOWN = 5


def local_files(src: Path) -> tuple[Path, list[str]]:
    """The model files a local source names: ``(directory, names relative to it)``.

    A file names itself (its directory, ``[its name]``); a directory names every regular file below it whose path
    has no hidden component (``.cache``, a staging directory, ``.git``). Every one must resolve inside that directory:
    a symbolic link out of it (``parts/model.gguf -> /etc/passwd``) would have a file that is not the user's model
    hashed into the committed manifest and copied to the nodes.

    Raises:
        UserError: `src` does not exist, is a directory with no files, or holds (or is) a symbolic link that
            resolves outside the directory.
    """
    src = Path(os.path.abspath(src))
    if src.is_file():
        root, entries = src.parent, [src]
    elif not src.is_dir():
        raise UserError(f"model source {src} does not exist on this host",
                        "pass the GGUF file (or the directory of its parts) as it is on this host")
    else:
        root = src
        entries = sorted(p for p in src.rglob("*")
                         if not any(part.startswith(".") for part in p.relative_to(src).parts))
    # A link to a regular file is followed, wherever it points: a Hugging Face cache snapshot is made of links into
    # ../../blobs/ (huggingface_hub docs, "Understand caching"), and the content is what the manifest hashes. A link
    # that leads nowhere, or to something that is not a regular file (a device, a pipe, a loop of links:
    # os.path.realpath does not raise on a loop), is refused: nothing could be hashed or copied. Links to folders are
    # not followed (rglob).
    broken = [p for p in entries if p.is_symlink() and not p.is_dir() and not os.path.isfile(os.path.realpath(p))]
    if broken:
        links = ", ".join(f"{p.relative_to(root)} -> {os.path.realpath(p)}" for p in broken[:SHOWN])
        more = f" and {len(broken) - SHOWN} more" if len(broken) > SHOWN else ""
        raise UserError(f"model source {src}: {links}{more}: a symbolic link to no regular file; nothing was written",
                        "pass a folder whose links all lead to the model's files (a download that was interrupted "
                        "leaves links to missing blobs: fetch it again)")
    names = sorted(str(p.relative_to(root)) for p in entries if p.is_file())
    if not names:
        raise UserError(f"model source {src} holds no files", "pass the directory that holds the model's files")
    return root, names


def check_model_file(recipe: Recipe, root: Path, names: list[str]) -> None:
    """The files the engine loads (a llama.cpp recipe's ``model.gguf`` parts, else ``model.file``) are among the local
    model's `names`: a manifest without them checks nothing the engine reads, and the deploy would copy a model the
    engine cannot open. Recipes without either (the engine gets the directory) pass.

    Raises:
        UserError: naming the file, the source and the files it holds.
    """
    gg = recipe.model.gguf
    wanted = gguf_parts(gg.file, gg.parts) if gg is not None else [recipe.model.file] if recipe.model.file else []
    missing = [f for f in wanted if f not in names]
    if not missing:
        return
    file = missing[0]
    have = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    raise UserError(f"recipe '{recipe.name}' has the engine load model.file {file} ({recipe.model.path}/{file}), but "
                    f"model source {root} holds no {file} (its files: {have}); the manifest would not record the file "
                    "the engine loads; nothing was written",
                    f"pass the folder (or the file) that holds {file}, or set model.file in the recipe to the name of "
                    "the model's file")


def occupied_by(path: Path) -> str | None:
    """What stands where a file is to be written, when it is not a regular file (or a link to one) that a rename can
    replace: ``"a directory"``, ``"a broken symbolic link"``, ``"not a regular file"``; None when the way is free."""
    if not os.path.lexists(path) or path.is_file():
        return None
    if path.is_dir():
        return "a directory"
    return "a broken symbolic link" if path.is_symlink() else "not a regular file"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file of a unique name beside it, renamed over `path` (never
    half-written; the temporary file is removed whatever fails). The file gets the mode a plain ``open()`` gives
    (0o666 less the umask, as before), not mkstemp's 0o600.

    Raises:
        OSError: the directory is not writable, `path` is a directory, the disk is full.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def local_manifest(recipe: Recipe, src: Path, progress: bool | None = None) -> dict:
    """Manifest of a local model: sha256 and size (bytes) of every file `local_files(src)` names, hashed in
    parallel (`ds4deploy.model.verify.default_workers` threads) with a byte progress bar on stderr.

    Raises:
        UserError: see `local_files`; a split GGUF with a part missing or misnamed; the recipe's ``model.file`` not
            among the files (`check_model_file`); a file that cannot be read.
    """
    from ds4deploy.model.verify import byte_progress, default_workers, hash_path

    root, names = local_files(src)
    split = split_gguf_problems(names)
    if split:  # before hours of hashing
        raise UserError(f"model source {root}: " + "; ".join(split), "pass the directory that holds every part of "
                        "the split GGUF (all <stem>-NNNNN-of-MMMMM.gguf files of one download), each named in lower "
                        "case as gguf-split writes them (rename a part ending in .GGUF to .gguf)")
    check_model_file(recipe, root, names)
    sizes = {n: (root / n).stat().st_size for n in names}
    with byte_progress(f"hashing {root.name}", progress) as (on_total, on_bytes):
        on_total(sum(sizes.values()))
        order = sorted(names, key=lambda n: -sizes[n])  # largest first: the last files do not leave cores idle
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(default_workers(), len(order)))) as pool:
                digests = dict(zip(order, pool.map(lambda n: hash_path(root / n, "sha256", on_bytes), order),
                                   strict=True))
        except OSError as exc:
            raise UserError(f"could not read {exc.filename or root}: {exc.strerror or exc}",
                            "make the model files readable by this user") from None
    return {"recipe": recipe.base_name, "source": "local",
            "files": {n: {"size": sizes[n], "sha256": digests[n]} for n in names}}


def build_manifest(recipe: Recipe, src: Path | None = None, progress: bool | None = None,
                   chat_template: str | None = None) -> dict:
    """The manifest of the recipe's model from its own source (module docstring).

    Args:
        recipe: any recipe.
        src: for ``source: local``, the file or directory holding the model on this host (required there).
        progress: show a progress bar while hashing a local model (default: when stderr is a terminal).
        chat_template: a generated GGUF's embedded template (`ds4deploy.model.generated.generated_files`).
    Raises:
        UserError: a local model without `src`; hub errors (`ds4deploy.model.hub.hub_manifest`); unreadable files;
            a generated GGUF without `chat_template`.
    """
    source = recipe.model.source
    if source == "hub":
        from ds4deploy.model.hub import hub_manifest

        return hub_manifest(recipe)
    if source == "local":
        if src is None:
            raise UserError(f"recipe '{recipe.name}' uses a local model and no manifest records it "
                            f"({manifest_path(recipe)} is missing)",
                            f"run `ds4deploy model lock {recipe.base_name} --from PATH` with the model's file or "
                            "directory on this host (or `make deploy ... MODEL_FROM=PATH`), then commit the manifest")
        return local_manifest(recipe, src, progress)
    from ds4deploy.model.generated import generated_files

    return manifest_of_files(recipe, generated_files(recipe, chat_template))


def differences(committed: dict, built: dict) -> list[str]:
    """One line per way `built` differs from `committed`: the commit, then each file added, removed, resized or
    of another digest. Empty when they describe the same model."""
    lines = []
    if committed.get("revision") != built.get("revision"):
        lines.append(f"commit: manifest {committed.get('revision')}, source {built.get('revision')}")
    old, new = committed.get("files", {}), built.get("files", {})
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None:
            lines.append(f"{name}: not in the manifest")
        elif b is None:
            lines.append(f"{name}: in the manifest, not in the source")
        elif a.get("size") != b.get("size"):
            lines.append(f"{name}: size {b.get('size')} bytes, manifest says {a.get('size')}")
        else:
            kind = next((k for k in ("sha256", "git_sha1") if a.get(k) and b.get(k)), None)
            if kind is None or a[kind] != b[kind]:
                lines.append(f"{name}: {kind or 'digest'} {b.get(kind or 'sha256')}, manifest says "
                             f"{a.get(kind or 'sha256')}")
    return lines


def write_manifest(recipe: Recipe, manifest: dict) -> Path:
    """Write `manifest` to ``recipes/<name>.manifest.json`` (temporary file + rename: never half-written).

    Raises:
        UserError: the manifest is malformed (`check_manifest`), or the recipes directory is not writable.
    """
    path = manifest_path(recipe)
    check_manifest(manifest, path.name)
    _check_way(recipe, path)
    try:
        write_atomic(path, json.dumps(manifest, indent=2) + "\n")
    except OSError as exc:
        raise UserError(f"could not write {path}: {exc.strerror or exc}",
                        f"make {path.parent} writable and run again") from None
    return path


def _check_way(recipe: Recipe, path: Path) -> None:
    """Refuse to lock when something that is not a manifest file stands at `path` (`occupied_by`).

    Raises:
        UserError: naming what is there.
    """
    what = occupied_by(path)
    if what is not None:
        raise UserError(f"{path} is {what}, where the manifest of '{recipe.base_name}' is written; nothing was written",
                        f"move it out of the way (it is no manifest), then run `ds4deploy model lock "
                        f"{recipe.base_name}` again")


def lock_model(recipe: Recipe, src: Path | None = None, progress: bool | None = None,
               chat_template: str | None = None) -> tuple[dict, Path, bool]:
    """Build the manifest from the model's source and record it, unless a committed one already says the same
    (`chat_template`: as `build_manifest`).

    Returns:
        ``(manifest, path, written)``: `written` is False when the committed manifest already matched.
    Raises:
        UserError: code 1 when a committed manifest disagrees with the source (each difference named; the
            committed manifest wins and is left as it is); the errors of `build_manifest`.
    """
    from ds4deploy.model.manifest import load_manifest

    path = manifest_path(recipe)
    _check_way(recipe, path)  # before hours of hashing
    built = build_manifest(recipe, src, progress, chat_template)
    if path.is_file():
        committed = load_manifest(recipe)
        diff = differences(committed, built)
        if diff:
            raise UserError(f"{path} disagrees with the model's source; the committed manifest wins and was left "
                            "as it is:\n  " + "\n  ".join(diff[:20]),
                            f"if the source changed on purpose, delete {path.name}, lock again and review the diff "
                            "before committing; otherwise point the recipe (or --from) at the model it records",
                            code=1)
        return committed, path, False
    return built, write_manifest(recipe, built), True
