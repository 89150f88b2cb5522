"""Hub models: resolve a recipe's pinned revision, build its manifest from the hub's metadata, download files.

`hub_manifest` lists every file of the pinned revision with its size, the sha256 the hub records for large (LFS)
files and the git blob sha1 for small ones, and records the full 40-hex commit the hub resolved the pin to.
`resolve_revision` asks the hub which commit the recipe's pin names now; `download` fetches named files of one
full commit into a directory with huggingface_hub. Placing verified files into the model directory is
`ds4deploy.fetch`'s job. $HF_ENDPOINT points at a mirror; $HF_TOKEN authenticates.

Resuming, as huggingface_hub (2.4 here) does it: within one run, a dropped connection is retried with an HTTP
Range request from the last 10 MiB piece written (``http_get``: up to 5 retries without new data,
``constants.DOWNLOAD_CHUNK_SIZE``). Across runs, complete files already in the directory whose recorded commit
matches are not downloaded again, but a partial file is not continued: since huggingface_hub 1.18 each attempt
writes a process-unique ``<etag>.<nonce>.incomplete`` and deletes it on failure (huggingface/huggingface_hub PRs
#4228 and #4306, open issue #4196 "No resuming of downloads"; unsloth PR #8350 bisected the change to 1.18.0).

Pins: recipes may pin a 7-40 hex prefix (the hub resolves commit prefixes server-side, huggingface_hub issue
#197, fixed on the hub in 2023); the manifest always records the full commit, and fetch downloads that commit
and refuses when the hub now resolves the recipe's pin to a different one.
"""

from __future__ import annotations

import errno
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
        if any(type(c).__name__ in ("ConnectError", "ConnectTimeout", "TimeoutException", "OfflineModeIsEnabled",
                                    "ReadTimeout", "RemoteProtocolError", "ReadError")
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
    sha = check_resolved(recipe, info.sha)
    files = {}
    for s in sorted(info.siblings or [], key=lambda s: s.rfilename):
        if s.lfs is not None:
            files[s.rfilename] = {"size": s.lfs.size, "sha256": s.lfs.sha256}
        else:
            files[s.rfilename] = {"size": s.size, "git_sha1": s.blob_id}
    return {"recipe": recipe.name, "source": "hub", "repo_id": repo_id, "revision": sha, "files": files}


def check_resolved(recipe: Recipe, sha: str | None) -> str:
    """The hub's answer for the recipe's pin must be a full commit that starts with the pin.

    A 7-hex pin could also be the name of a branch or tag (e.g. a branch called ``deadbee``) that points elsewhere;
    this check refuses that.

    Raises:
        UserError: the hub returned no full commit, or one that does not start with the pinned prefix.
    """
    m = recipe.model
    if not sha or len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
        raise UserError(f"the hub did not resolve {m.repo_id}@{m.revision} to a full commit (got {sha!r})",
                        "pin the full 40-hex commit in model.revision")
    if not sha.startswith(m.revision or ""):
        raise UserError(f"the hub resolves {m.repo_id}@{m.revision} to commit {sha}, which does not start with the "
                        f"pinned {m.revision} (a branch or tag of that name?)",
                        f"pin the full 40-hex commit in recipes/{recipe.name}.yaml (model.revision)")
    return sha


def resolve_revision(recipe: Recipe) -> str:
    """The full commit the hub resolves the recipe's pinned revision (a prefix or a full commit) to, now.

    Raises:
        UserError: unknown repository or revision, gated repository, hub unreachable, pin that resolves to a commit
            not starting with it.
    """
    from huggingface_hub import HfApi

    repo_id, revision = _require_hub(recipe)
    try:
        info = HfApi().model_info(repo_id, revision=revision)
    except Exception as exc:
        raise _hub_error(recipe, exc) from None
    return check_resolved(recipe, info.sha)


def is_enospc(exc: BaseException) -> bool:
    """True when `exc` or an exception in its cause/context chain is "no space left on device" (ENOSPC)."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def download(recipe: Recipe, commit: str, names: list[str], into: Path, workers: int = 8,
             progress: bool = True) -> None:
    """Download `names` of `recipe.model.repo_id` at full commit `commit` into `into` (created if needed).

    Resumable as the module docstring says: a cut connection is continued with a Range request within the run;
    complete files already in `into` are not downloaded again by a later run. `workers` files are fetched in
    parallel (huggingface_hub's default is 8). The progress bar is huggingface_hub's (tqdm, stderr).

    Raises:
        OSError: with errno ENOSPC when the disk fills (the caller cleans up and explains).
        UserError: unknown repository or revision, gated repository, a file missing upstream, hub unreachable.
    """
    import glob

    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    repo_id, _ = _require_hub(recipe)
    (disable_progress_bars if not progress else enable_progress_bars)()
    try:
        into.mkdir(parents=True, exist_ok=True)
        snapshot_download(repo_id, revision=commit, local_dir=into, max_workers=workers,
                          allow_patterns=[glob.escape(n) for n in names])
    except Exception as exc:
        if is_enospc(exc):
            raise OSError(errno.ENOSPC, "No space left on device") from exc
        if isinstance(exc, OSError) and not exc.__class__.__module__.startswith(("huggingface_hub", "httpx")) \
                and exc.errno is not None:
            raise UserError(f"could not write {into}: {exc.strerror or exc}",
                            "make the model directory's parent writable or choose another model.path") from None
        raise _hub_error(recipe, exc) from None


def fetch(recipe: Recipe, dest: Path, workers: int = 8) -> Path:
    """Fetch the recipe's pinned model into `dest`, hash-checked against its committed manifest
    (`ds4deploy.fetch.fetch_model`). Kept for callers of the former API; returns `dest`."""
    from ds4deploy.fetch import fetch_model
    from ds4deploy.manifest import load_manifest

    fetch_model(recipe, dest, load_manifest(recipe), workers=workers)
    return dest
