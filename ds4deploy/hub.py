"""Hub models: fetch a pinned revision with huggingface_hub and build its manifest from the hub's metadata.

`fetch` downloads ``model.repo_id`` at ``model.revision`` into a directory (parallel, resumable: huggingface_hub
keeps ``.incomplete`` files and resumes them). `hub_manifest` lists every file of that revision with its size,
the sha256 the hub records for large (LFS) files and the git blob sha1 for small ones; `ds4deploy.manifest`
checks a directory against it. $HF_ENDPOINT points at a mirror; $HF_TOKEN authenticates.
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.errors import UserError
from ds4deploy.recipe import Recipe


def _hub_error(recipe: Recipe, exc: Exception) -> UserError:
    from huggingface_hub.errors import (
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    m = recipe.model
    # huggingface_hub wraps the real cause (e.g. LocalEntryNotFoundError around a connection error): use the
    # most specific exception in the chain.
    chain = []
    e: BaseException | None = exc
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for cand in chain:
        if isinstance(cand, (RevisionNotFoundError, RepositoryNotFoundError, RemoteEntryNotFoundError)):
            exc = cand
            break
    else:
        if any(type(c).__name__ in ("ConnectError", "ConnectTimeout", "TimeoutException", "OfflineModeIsEnabled")
               for c in chain):
            exc = ConnectionError(str(chain[-1]))
    if isinstance(exc, RevisionNotFoundError):
        return UserError(f"revision {m.revision} does not exist in {m.repo_id}",
                         f"pin an existing commit in recipes/{recipe.name}.yaml (model.revision)")
    if isinstance(exc, GatedRepoError):
        return UserError(f"{m.repo_id} is gated", "accept its terms on the hub and set HF_TOKEN")
    if isinstance(exc, RepositoryNotFoundError):
        return UserError(f"model repository {m.repo_id} does not exist (or is private)",
                         "check model.repo_id, or set HF_TOKEN for a private repository")
    if isinstance(exc, RemoteEntryNotFoundError):
        return UserError(f"a file of {m.repo_id}@{m.revision} is missing upstream: {exc}",
                         "pin a revision whose files are all present")
    detail = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    return UserError(f"could not reach the model hub for {m.repo_id}@{m.revision}: {detail}",
                     "check network access (or set HF_ENDPOINT to a reachable mirror), or copy the model into "
                     "model.path yourself")


def _require_hub(recipe: Recipe) -> tuple[str, str]:
    m = recipe.model
    if m.source != "hub" or not m.repo_id or not m.revision:
        raise UserError(f"recipe '{recipe.name}' has no hub model (model.source is '{m.source}')",
                        "set model.source: hub with model.repo_id and a pinned model.revision")
    return m.repo_id, m.revision


def hub_manifest(recipe: Recipe) -> dict:
    """Manifest of the pinned revision from the hub's file metadata.

    Returns:
        ``{"recipe", "source": "hub", "repo_id", "revision", "files": {name: {"size", "sha256"|"git_sha1"}}}``.
    Raises:
        UserError: unknown repository or revision, gated repository, hub unreachable.
    """
    from huggingface_hub import HfApi

    repo_id, revision = _require_hub(recipe)
    try:
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:
        raise _hub_error(recipe, exc) from None
    files = {}
    for s in sorted(info.siblings or [], key=lambda s: s.rfilename):
        if s.lfs is not None:
            files[s.rfilename] = {"size": s.lfs.size, "sha256": s.lfs.sha256}
        else:
            files[s.rfilename] = {"size": s.size, "git_sha1": s.blob_id}
    return {"recipe": recipe.name, "source": "hub", "repo_id": repo_id, "revision": info.sha or revision,
            "files": files}


def fetch(recipe: Recipe, dest: Path, workers: int = 8) -> Path:
    """Download the recipe's pinned hub revision into `dest` (resumable, `workers` files in parallel).

    Raises:
        UserError: unknown repository or revision, a file missing upstream, hub unreachable, disk errors.
    """
    from huggingface_hub import snapshot_download

    repo_id, revision = _require_hub(recipe)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        snapshot_download(repo_id, revision=revision, local_dir=dest, max_workers=workers)
    except OSError as exc:
        if exc.__class__.__module__.startswith("huggingface_hub"):
            raise _hub_error(recipe, exc) from None
        raise UserError(f"could not write {dest}: {exc.strerror or exc}",
                        "free disk space or choose another model.path") from None
    except Exception as exc:
        raise _hub_error(recipe, exc) from None
    return dest
