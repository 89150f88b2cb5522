"""Hub models: resolve a recipe's pinned revision, build its manifest from the hub's metadata, download files.

`hub_manifest` lists every file of the pinned revision with its size, the sha256 the hub records for large (LFS)
files and the git blob sha1 for small ones, and records the full 40-hex commit the hub resolved the pin to.
`resolve_revision` asks the hub which commit the recipe's pin names now; `download` fetches named files of one
full commit into a directory with huggingface_hub. Placing verified files into the model directory is
`ds4deploy.model.fetch`'s job. $HF_ENDPOINT points at a mirror; $HF_TOKEN authenticates.

Resuming, as huggingface_hub (2.4 here) does it: within one run, a dropped connection is retried with an HTTP
Range request from the last 10 MiB piece written (``http_get``: up to 5 retries without new data,
``constants.DOWNLOAD_CHUNK_SIZE``). Across runs, complete files already in the directory whose recorded commit
matches are not downloaded again, but a partial file is not continued: since huggingface_hub 1.18 each attempt
writes a process-unique ``<etag>.<nonce>.incomplete`` and deletes it on failure (huggingface/huggingface_hub PRs
#4228 and #4306, open issue #4196 "No resuming of downloads"; unsloth PR #8350 bisected the change to 1.18.0).

Pins: recipes may pin a 7-40 hex prefix. `resolve_revision` resolves a prefix against the repository's own commit
list (every branch's history: ``HfApi.list_repo_refs`` + ``HfApi.list_repo_commits``,
https://huggingface.co/docs/huggingface_hub/package_reference/hf_api#huggingface_hub.HfApi.list_repo_commits),
never by asking the hub to guess: a prefix that names no commit, or more than one, stops with the candidates. The
manifest always records the full commit; fetch downloads that commit and refuses when the prefix now resolves to
a different one. Before downloading, `file_metadata` reads the hub's per-file metadata of the files still needed
(``HfApi.get_paths_info``, the ``paths-info`` endpoint) so a committed manifest that disagrees with the hub stops
before the first byte, naming each file.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import Recipe


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
                         f"pin an existing commit in recipes/{recipe.base_name}.yaml (model.revision)")
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
    """Manifest of the pinned revision from the hub's file metadata, at the full commit the pin resolves to
    (`resolve_revision`).

    Returns:
        ``{"recipe", "source": "hub", "repo_id", "revision", "files": {name: {"size", "sha256"|"git_sha1"}}}``,
        sizes in bytes; ``revision`` is the full 40-hex commit.
    Raises:
        UserError: unknown repository, unknown or ambiguous revision prefix, gated repository, hub unreachable.
    """
    from huggingface_hub import HfApi

    repo_id, _ = _require_hub(recipe)
    commit = resolve_revision(recipe)
    try:
        info = HfApi().model_info(repo_id, revision=commit, files_metadata=True)
    except Exception as exc:
        raise _hub_error(recipe, exc) from None
    sha = check_resolved(recipe, info.sha)
    files = {}
    for s in sorted(info.siblings or [], key=lambda s: s.rfilename):
        if s.lfs is not None:
            files[s.rfilename] = {"size": s.lfs.size, "sha256": s.lfs.sha256}
        else:
            files[s.rfilename] = {"size": s.size, "git_sha1": s.blob_id}
    return {"recipe": recipe.base_name, "source": "hub", "repo_id": repo_id, "revision": sha, "files": files}


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
                        f"pin the full 40-hex commit in recipes/{recipe.base_name}.yaml (model.revision)")
    return sha


# Commits shown when a prefix matches none: the newest of the repository (huggingface_hub lists newest first).
SHOWN_CANDIDATES = 5


def _commit_line(c) -> str:
    when = c.created_at.strftime("%Y-%m-%d") if getattr(c, "created_at", None) else "?"
    return f"{c.commit_id} ({when}, {c.title!r})"


def resolve_revision(recipe: Recipe) -> str:
    """The full 40-hex commit the recipe's pinned revision names.

    A full commit is checked to exist (``model_info`` at that revision). A 7-39 hex prefix is matched against
    every commit of every branch of the repository (``list_repo_refs``, then ``list_repo_commits`` per branch):
    exactly one match is the answer.

    Returns:
        The full commit (40 lowercase hex).
    Raises:
        UserError: unknown repository or full commit, a prefix matching no commit (the newest commits are listed)
            or several (each listed with its date and title), gated repository, hub unreachable.
    """
    from huggingface_hub import HfApi

    repo_id, revision = _require_hub(recipe)
    api = HfApi()
    if len(revision) == 40:
        try:
            info = api.model_info(repo_id, revision=revision)
        except Exception as exc:
            raise _hub_error(recipe, exc) from None
        return check_resolved(recipe, info.sha)
    try:
        branches = api.list_repo_refs(repo_id).branches
        commits: dict[str, object] = {}
        for branch in branches:
            for c in api.list_repo_commits(repo_id, revision=branch.target_commit):
                commits.setdefault(c.commit_id, c)
    except Exception as exc:
        raise _hub_error(recipe, exc) from None
    matches = [c for cid, c in commits.items() if cid.startswith(revision)]
    where = f"recipes/{recipe.base_name}.yaml (model.revision)"
    if len(matches) == 1:
        return check_resolved(recipe, matches[0].commit_id)
    if not matches:
        newest = [_commit_line(c) for c in list(commits.values())[:SHOWN_CANDIDATES]]
        raise UserError(f"revision {revision} matches no commit of {repo_id} ({len(commits)} commits on "
                        f"{len(branches)} branch(es)); the newest are:\n  " + "\n  ".join(newest or ["(none)"]),
                        f"pin an existing commit, in full (40 hex), in {where}")
    raise UserError(f"revision {revision} matches {len(matches)} commits of {repo_id}:\n  "
                    + "\n  ".join(_commit_line(c) for c in matches),
                    f"pin the one you mean in full (40 hex) in {where}")


def file_metadata(recipe: Recipe, commit: str, names: list[str]) -> dict[str, dict]:
    """The hub's own metadata of `names` at full commit `commit` (``HfApi.get_paths_info``): for each file that
    exists there, ``{"size", "sha256"}`` (LFS files) or ``{"size", "git_sha1"}`` (small files), as in a manifest.
    Files the hub does not have are absent from the result.

    Raises:
        UserError: unknown repository or commit, gated repository, hub unreachable.
    """
    from huggingface_hub import HfApi

    repo_id, _ = _require_hub(recipe)
    out: dict[str, dict] = {}
    try:
        for i in range(0, len(names), PATHS_PER_REQUEST):
            for f in HfApi().get_paths_info(repo_id, names[i:i + PATHS_PER_REQUEST], revision=commit):
                if not hasattr(f, "blob_id"):
                    continue  # a folder
                if f.lfs is not None:
                    out[f.path] = {"size": f.lfs.size, "sha256": f.lfs.sha256}
                else:
                    out[f.path] = {"size": f.size, "git_sha1": f.blob_id}
    except Exception as exc:
        raise _hub_error(recipe, exc) from None
    return out


# Paths per paths-info request: the hub pages its own listings at 1,000 entries (huggingface_hub's `get_paths_info`
# docstring, "only 50 results are returned per page (instead of 1000)" with expand); 100 keeps each form small.
PATHS_PER_REQUEST = 100


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
