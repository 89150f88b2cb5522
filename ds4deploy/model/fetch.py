"""Fetch a hub model into its directory so that only files matching the manifest are ever placed there.

Flow of `fetch_model(recipe, dest, manifest)`:

1. Pin: the manifest must record a full 40-hex commit that starts with the recipe's ``model.revision`` (a 7-40
   hex prefix is allowed in the recipe, `ds4deploy.recipe.schema.Model`), and the hub must resolve the recipe's pin to
   exactly that commit now (`ds4deploy.model.hub.resolve_revision`). Files are downloaded from the full commit, never
   from the prefix.
2. What is already there: files in `dest` that verify (`ds4deploy.model.verify`, sidecar-fast) are kept; the rest are
   fetched. The hub's own metadata of those files at the commit (`ds4deploy.model.hub.file_metadata`) must equal the
   manifest's: a committed manifest that disagrees with the hub stops here, naming each file, before any download.
3. Room: the bytes still to download (manifest sizes of the missing files minus what the staging directory already
   holds) are compared with ``shutil.disk_usage`` of the staging directory's filesystem before any download.
4. Download into the staging directory (`staging_dir`: ``<parent>/.<name>.ds4-staging``, a sibling of `dest` on
   the same filesystem, or ``<dest>/.ds4-staging`` when `dest` is itself a mount point) with huggingface_hub.
5. Hash every staged file against the manifest (in parallel). A file that differs is deleted from staging and
   named in the error with the expected and actual digest; nothing is placed.
6. Only when every file matched: ``os.replace`` each into `dest` (atomic on one filesystem), record them in the
   verification sidecar, remove the staging directory.

Failure states: the model directory only ever gains complete, verified files. An interrupted download (network)
keeps the staging directory: the next run downloads only the files not yet complete there (within a run, a cut
connection is resumed with a Range request; see `ds4deploy.model.hub` for what huggingface_hub can and cannot resume).
A full disk (ENOSPC) removes the staging directory: keeping gigabytes of partial files on a full filesystem would
break other services on that disk, and the message says how much room is needed.

Stall watchdog (`download_watched`): huggingface_hub's read timeout (``HF_HUB_DOWNLOAD_TIMEOUT``, 10 s) restarts with
every byte, so a transfer whose bytes trickle in never ends, and one whose headers arrive without a body waits out
six read timeouts before its message blames the network at large. The download therefore runs in a child process
while this one watches the staging directory grow; when nothing new reaches it for `stall_s` seconds the child is
stopped (by its own process id), its partial ``.incomplete`` files are removed and the download is resumed (complete
files are kept). An attempt that huggingface_hub itself ends on read timeouts counts as a stall too. After
`attempts` stalls a `UserError` names the stall, the files still missing and the fix.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.core.holder_lock import HolderLock
from ds4deploy.recipe.schema import Recipe

GB = 10**9  # decimal gigabyte: what disk vendors, `df -H` and the hub's sizes use
GIB = 2**30  # binary gibibyte: what `df -h` prints
# Stall watchdog defaults (seconds; $DS4_FETCH_STALL_S and $DS4_FETCH_ATTEMPTS override them). huggingface_hub
# writes a download in 10 MiB pieces (huggingface_hub constants.DOWNLOAD_CHUNK_SIZE), so growth is seen per piece:
# 300 s without one means less than 10 MiB / 300 s = 35 KB/s, under which a 167 GB checkpoint would take 55 days.
STALL_S = 300.0
STALL_ATTEMPTS = 3
STALL_POLL_S = 1.0
# The download child imports huggingface_hub before it starts; more than this (seconds) means it is stuck.
CHILD_START_S = 120.0


@dataclass
class FetchResult:
    """What a fetch did.

    Attributes:
        dest: the model directory.
        commit: the full commit fetched.
        fetched: files downloaded, verified and placed now.
        present: files that were already in `dest` and verified.
    """

    dest: Path
    commit: str
    fetched: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)


def staging_dir(dest: Path) -> Path:
    """Where downloads land before they are verified: a hidden sibling of `dest` (same filesystem, so the final
    move is an atomic rename), or a hidden directory inside `dest` when `dest` is a mount point (its parent is
    then another filesystem)."""
    dest = Path(os.path.abspath(dest))
    if dest.is_dir() and os.path.ismount(dest):
        return dest / ".ds4-staging"
    return dest.parent / f".{dest.name}.ds4-staging"


def gb_gib(n: int) -> str:
    """A byte count in both units, e.g. ``"5.38 GB (5.01 GiB)"`` (GB = 10**9 bytes, GiB = 2**30 bytes)."""
    return f"{n / GB:.2f} GB ({n / GIB:.2f} GiB)"


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def check_free_space(where: Path, needed: int, what: str) -> None:
    """Refuse to start when the filesystem holding `where` has fewer than `needed` bytes free.

    Raises:
        UserError: naming both numbers in GB and GiB, and the filesystem's path.
    """
    probe = _existing(where)
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise UserError(
            f"{what} needs {gb_gib(needed)} but the filesystem holding {probe} has {gb_gib(free)} free",
            f"free at least {gb_gib(needed - free)} there, or set model.path to a directory on a larger disk",
        )


def pinned_commit(recipe: Recipe, manifest: dict) -> str:
    """The full commit to download: the manifest's ``revision``, which must be 40 hex and start with the
    recipe's pin.

    Raises:
        UserError: the manifest is not for a hub model, records no full commit, or was built for another pin.
    """
    from ds4deploy.model.manifest import FULL_COMMIT, manifest_path

    m = recipe.model
    rev = str(manifest.get("revision") or "")
    where = manifest_path(recipe).name
    if manifest.get("source") != "hub" or manifest.get("repo_id") != m.repo_id:
        raise UserError(f"{where} is not a manifest of {m.repo_id} (source {manifest.get('source')!r}, repo "
                        f"{manifest.get('repo_id')!r})",
                        f"rebuild it: delete it and run `ds4deploy model lock {recipe.base_name}`")
    if not FULL_COMMIT.match(rev):
        raise UserError(f"{where} does not pin a full 40-hex commit (revision {rev!r})",
                        f"rebuild it: delete it and run `ds4deploy model lock {recipe.base_name}`; it records the "
                        "full commit the recipe's pin resolves to")
    if not rev.startswith(m.revision or ""):
        raise UserError(f"recipe '{recipe.name}' pins {m.repo_id}@{m.revision} but {where} was built for commit "
                        f"{rev}", f"rebuild the manifest (delete it and run `ds4deploy model lock {recipe.base_name}`) "
                        "or restore the recipe's model.revision")
    return rev


def fetch_model(recipe: Recipe, dest: Path, manifest: dict | None = None, *, workers: int = 8,
                progress: bool | None = None, clock: Callable[[], float] | None = None) -> FetchResult:
    """Download the recipe's pinned hub revision into `dest`, placing only files that match `manifest`.

    Args:
        recipe: a recipe with ``model.source: hub``.
        dest: the model directory (created when the first verified file is placed).
        manifest: the committed manifest (default: `ds4deploy.model.manifest.load_manifest`, read after the hub has
            resolved the pin, so an unknown revision or an unreachable hub is reported first).
        workers: files downloaded in parallel (huggingface_hub's default, 8).
        progress: show progress bars (default: when stderr is a terminal).
        clock: the stall watchdog's clock, seconds (default ``time.monotonic``; `download_watched`).
    Returns:
        A `FetchResult`.
    Raises:
        UserError: unpinned or mismatched revision (code 2), no room (code 2), hub errors (code 2), files that
            differ from the manifest after download (code 1, each named with expected and actual digest),
            another fetch into `dest` running (code 2, the holder's pid and command named).
    """
    import sys

    from ds4deploy.model import hub
    from ds4deploy.model.manifest import load_manifest

    if progress is None:
        progress = sys.stderr.isatty()
    resolved = hub.resolve_revision(recipe)
    if manifest is None:
        manifest = load_manifest(recipe)
    commit = _manifest_commit(recipe, manifest, resolved)
    dest = Path(os.path.abspath(dest))
    lock = fetch_lock_path(dest)

    def refused(who: str) -> UserError:
        return UserError(f"another fetch into {dest} is running: {who} (lock {lock})",
                         "wait for it to finish (it places the same verified files), or stop that process by its "
                         "pid; two fetches into one directory would overwrite each other's partial downloads")

    with HolderLock(lock, refused, remove=True):
        return _fetch_locked(recipe, dest, manifest, commit, workers, progress, clock)


def _manifest_commit(recipe: Recipe, manifest: dict, resolved: str) -> str:
    """The manifest's full commit, checked against what the hub resolves the recipe's pin to now (`resolved`).

    Raises:
        UserError: a malformed manifest, one built for another pin (`pinned_commit`), or a pin the hub now resolves
            to another commit.
    """
    from ds4deploy.model.manifest import check_manifest, manifest_path

    check_manifest(manifest, manifest_path(recipe).name)
    commit = pinned_commit(recipe, manifest)
    if resolved != commit:
        raise UserError(
            f"the hub resolves {recipe.model.repo_id}@{recipe.model.revision} to commit {resolved}, but "
            f"{manifest_path(recipe).name} was built for {commit}",
            "pin the full 40-hex commit the manifest records in model.revision, or rebuild the manifest "
            f"(delete it and run `ds4deploy model lock {recipe.base_name}`) after checking the new commit")
    return commit


def check_hub_pin(recipe: Recipe) -> None:
    """The control-host check of a hub model before any node is changed (`ds4deploy.plan.playvars.check_run`, so the
    deploy and `ds4deploy preflight` alike): the hub is reachable and resolves the recipe's pin, and, when a manifest
    is committed, to the manifest's commit, whose every file the hub records with the manifest's size and digest
    (metadata only, nothing downloaded). The model stage asks the hub the same (`fetch_model`), later.

    Raises:
        UserError: the hub is unreachable or does not know the pin (`ds4deploy.model.hub.resolve_revision`); the
            manifest's commit or files disagree with the hub (`_manifest_commit`, `check_against_hub`).
    """
    from ds4deploy.model import hub
    from ds4deploy.model.manifest import load_manifest, manifest_path

    resolved = hub.resolve_revision(recipe)
    if manifest_path(recipe).is_file():
        manifest = load_manifest(recipe)
        commit = _manifest_commit(recipe, manifest, resolved)
        check_against_hub(recipe, commit, manifest["files"])


def fetch_lock_path(dest: Path) -> Path:
    """The lock one fetch into `dest` holds for its whole run (`ds4deploy.core.holder_lock.HolderLock`): beside the
    staging directory (``<parent>/.<name>.ds4-staging.lock``, or ``<dest>/.ds4-staging.lock`` on a mount point)."""
    staging = staging_dir(dest)
    return staging.with_name(staging.name + ".lock")


def _fetch_locked(recipe: Recipe, dest: Path, manifest: dict, commit: str, workers: int,
                  progress: bool, clock: Callable[[], float] | None = None) -> FetchResult:
    """Steps 2-6 of the module docstring, under the fetch lock."""
    from ds4deploy.model import hub, verify
    from ds4deploy.model.manifest import manifest_path

    files = manifest["files"]
    result = FetchResult(dest=dest, commit=commit)
    if dest.is_dir():
        with verify.byte_progress(f"checking {dest.name}", progress) as (on_total, on_bytes):
            report = verify.verify_model(dest, manifest, on_total=on_total, on_bytes=on_bytes)
        result.present = [r.name for r in report.results if r.ok]
    need = sorted(n for n in files if n not in result.present)
    if not need:
        return result
    check_against_hub(recipe, commit, {n: files[n] for n in need})
    staging = staging_dir(dest)
    already = _du(staging) if staging.is_dir() else 0
    to_download = max(0, sum(files[n]["size"] for n in need) - already)
    check_free_space(staging, to_download, f"downloading {len(need)} file(s) of {recipe.model.repo_id}@{commit[:12]}")
    try:
        download_watched(recipe, commit, need, staging, workers=workers, progress=progress, clock=clock)
    except OSError as exc:
        if not hub.is_enospc(exc):
            raise
        free = shutil.disk_usage(_existing(staging)).free
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(
            f"the disk filled up while downloading into {staging} (no space left on device): the download needs "
            f"{gb_gib(to_download)}, {gb_gib(free)} was free when it failed; the partial files were removed and "
            f"{dest} was not changed",
            "free space on that filesystem (or set model.path to a larger disk) and run the fetch again") from None
    absent = [n for n in need if not (staging / n).is_file()]
    if absent:
        raise UserError(f"{len(absent)} file(s) listed in {manifest_path(recipe).name} are not in "
                        f"{recipe.model.repo_id}@{commit}: {', '.join(absent[:5])}",
                        "rebuild the manifest from the hub (delete it and run `ds4deploy model lock "
                        f"{recipe.base_name}`) or pin a revision that has them")
    staged_manifest = {**manifest, "files": {n: files[n] for n in need}}
    with verify.byte_progress("verifying download", progress) as (on_total, on_bytes):
        report = verify.verify_model(staging, staged_manifest, use_sidecar=False, on_total=on_total,
                                     on_bytes=on_bytes)
    bad = [r for r in report.results if not r.ok]
    if bad:
        for r in bad:
            _discard_staged(staging, r.name)
        lines = []
        for r in bad:
            if r.status == "size":
                lines.append(f"{r.name}: {r.size} bytes downloaded, manifest says {r.expected_size}")
            elif r.status == "mismatch":
                lines.append(f"{r.name}: {r.kind} expected {r.expected}, got {r.actual}")
            else:
                lines.append(f"{r.name}: {r.status} {r.detail}".strip())
        raise UserError(
            f"{len(bad)} downloaded file(s) of {recipe.model.repo_id}@{commit[:12]} do not match "
            f"{manifest_path(recipe).name}; they were deleted and not placed in {dest}:\n  " + "\n  ".join(lines),
            "run the fetch again (a corrupted transfer is downloaded afresh); if the hub keeps serving these bytes, "
            "rebuild the manifest and review the change",
            code=1)
    dest.mkdir(parents=True, exist_ok=True)
    for name in need:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, target)
        result.fetched.append(name)
    verify.record(dest, {n: verify.expected_digest(files[n]) for n in need})
    shutil.rmtree(staging, ignore_errors=True)
    return result


def check_against_hub(recipe: Recipe, commit: str, wanted: dict[str, dict]) -> None:
    """Compare manifest entries with the hub's own metadata of those files at `commit` (one paths-info request
    per 100 files, no download).

    Raises:
        UserError: code 1, naming every file the hub does not have at that commit or records with another size or
            digest; the committed manifest wins, so nothing is downloaded.
    """
    from ds4deploy.model import hub
    from ds4deploy.model.lock import differences
    from ds4deploy.model.manifest import manifest_path

    actual = hub.file_metadata(recipe, commit, sorted(wanted))
    lines = [ln.replace("not in the source", f"not in {recipe.model.repo_id}@{commit[:12]}")
             for ln in differences({"files": wanted}, {"files": actual})]
    if lines:
        name = manifest_path(recipe).name
        raise UserError(f"{name} disagrees with the hub's metadata of {recipe.model.repo_id}@{commit}; nothing was "
                        "downloaded:\n  " + "\n  ".join(lines[:20]),
                        f"the committed manifest wins: if the hub is right, delete {name}, run `ds4deploy model lock "
                        f"{recipe.base_name}` and review the diff before committing", code=1)


def _discard_staged(staging: Path, name: str) -> None:
    """Delete a staged file. huggingface_hub only reuses a local file that exists, so the next run downloads it
    afresh (its stale ``.metadata`` record alone does not make it skip the download)."""
    (staging / name).unlink(missing_ok=True)


def _download_child(recipe: Recipe, commit: str, names: list[str], into: str, workers: int, progress: bool,
                    conn) -> None:
    """Child process of `download_watched`: say ``("started",)`` once imported, run `ds4deploy.model.hub.download`, and
    send its outcome through `conn`: ``("ok",)``, ``("user", cause, fix, code)``, ``("enospc",)`` or
    ``("error", text)``."""
    from ds4deploy.model import hub

    conn.send(("started",))
    try:
        hub.download(recipe, commit, names, Path(into), workers=workers, progress=progress)
    except UserError as exc:
        # huggingface_hub gave up after its own read timeouts (headers without a body, or a pause longer than
        # HF_HUB_DOWNLOAD_TIMEOUT): a stall like the watchdog's, resumed the same way.
        if _timed_out(exc):
            conn.send(("stalled", exc.cause))
        else:
            conn.send(("user", exc.cause, exc.fix, exc.code))
    except OSError as exc:
        conn.send(("enospc",) if hub.is_enospc(exc) else ("error", f"{type(exc).__name__}: {exc}"))
    except Exception as exc:  # every failure must reach the parent as a message
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    else:
        conn.send(("ok",))
    finally:
        conn.close()


def _timed_out(exc: BaseException) -> bool:
    """True when a read timeout (httpx ``ReadTimeout``) is in the exception's cause/context chain."""
    seen, e = 0, exc.__cause__ or exc.__context__
    while e is not None and seen < 10:
        if type(e).__name__ == "ReadTimeout":
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _remove_incomplete(staging: Path) -> None:
    """Delete the partial files a stopped download left (huggingface_hub writes ``*.incomplete`` under
    ``<local_dir>/.cache/huggingface/download``; a killed process cannot remove its own)."""
    for part in (staging / ".cache" / "huggingface" / "download").rglob("*.incomplete"):
        part.unlink(missing_ok=True)


def _run_watched(recipe: Recipe, commit: str, names: list[str], staging: Path, workers: int, progress: bool,
                 stall_s: float, poll_s: float, clock: Callable[[], float]) -> str | None:
    """One watched download attempt. Returns None when the child finished, else why it stalled: no new byte for
    `stall_s` seconds (the child was stopped), or huggingface_hub gave up on its own read timeouts.

    Raises:
        UserError: the download failed (the hub's error as `ds4deploy.model.hub.download` words it), or the child died.
        OSError: ENOSPC.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_download_child, args=(recipe, commit, names, str(staging), workers, progress, send),
                        daemon=True)
    started = clock()
    child.start()
    send.close()
    seen, seen_at = _du(staging) if staging.is_dir() else 0, None
    try:
        while True:
            if receive.poll(poll_s):
                try:
                    outcome = receive.recv()
                except EOFError:
                    outcome = ("error", f"the download process exited ({child.exitcode}) without a result")
                if outcome[0] == "started":
                    # The stall window starts with the download, not with the child's imports (seconds on a busy
                    # host).
                    seen_at = clock()
                    continue
                child.join()
                if outcome[0] == "ok":
                    return None
                if outcome[0] == "stalled":
                    return f"huggingface_hub gave up on read timeouts: {outcome[1][:200]}"
                if outcome[0] == "user":
                    raise UserError(outcome[1], outcome[2], outcome[3])
                if outcome[0] == "enospc":
                    import errno

                    raise OSError(errno.ENOSPC, "No space left on device")
                raise UserError(f"downloading {recipe.model.repo_id}@{commit[:12]} failed: {outcome[1]}",
                                "run the fetch again; complete files already staged are kept")
            if not child.is_alive() and not receive.poll(0):
                raise UserError(f"the download process of {recipe.model.repo_id}@{commit[:12]} exited "
                                f"({child.exitcode}) without a result", "run the fetch again")
            now = clock()
            if seen_at is None:
                if now - started > CHILD_START_S:
                    raise UserError(f"the download process did not start within {CHILD_START_S:g} s",
                                    "check the host's load and run the fetch again")
                continue
            size = _du(staging) if staging.is_dir() else 0
            if size != seen:
                seen, seen_at = size, now
            elif now - seen_at >= stall_s:
                return f"no new byte for {stall_s:g} s"
    finally:
        if child.is_alive():
            child.terminate()
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
        receive.close()


def download_watched(recipe: Recipe, commit: str, names: list[str], staging: Path, *, workers: int = 8,
                     progress: bool = False, stall_s: float | None = None, attempts: int | None = None,
                     poll_s: float = STALL_POLL_S, clock: Callable[[], float] | None = None) -> None:
    """`ds4deploy.model.hub.download` under the stall watchdog of the module docstring.

    Args:
        stall_s: seconds without a new byte in `staging` that count as a stall (default $DS4_FETCH_STALL_S or
            `STALL_S`).
        attempts: downloads tried before giving up on stalls (default $DS4_FETCH_ATTEMPTS or `STALL_ATTEMPTS`);
            each after the first resumes: files completed so far are not downloaded again.
        poll_s: how often the staging directory is measured, seconds (real time: the wait for the child).
        clock: where the stall window's seconds are read (default ``time.monotonic``); tests pass one that moves
            on while their hub holds a transfer, so a stall of the production window is seen without waiting it out.

    Raises:
        UserError: every attempt stalled (the message names the stall window, the attempts and the files still
            missing); or a hub error, as `ds4deploy.model.hub.download` raises it.
        OSError: ENOSPC, as `ds4deploy.model.hub.download` raises it.
    """
    stall_s = float(os.environ.get("DS4_FETCH_STALL_S") or STALL_S) if stall_s is None else stall_s
    attempts = int(os.environ.get("DS4_FETCH_ATTEMPTS") or STALL_ATTEMPTS) if attempts is None else attempts
    import sys

    why = ""
    for attempt in range(1, attempts + 1):
        why = _run_watched(recipe, commit, names, staging, workers, progress, stall_s, poll_s,
                           clock or time.monotonic)
        if why is None:
            return
        _remove_incomplete(staging)
        if attempt < attempts:
            print(f"download of {recipe.model.repo_id}@{commit[:12]} stalled ({why}): stopped it and resuming, "
                  f"attempt {attempt + 1} of {attempts}", file=sys.stderr, flush=True)
    missing = [n for n in names if not (staging / n).is_file()]
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    raise UserError(
        f"the download of {recipe.model.repo_id}@{commit[:12]} from {endpoint} into {staging} stalled "
        f"{attempts} time(s) in a row (last: {why}); still missing: {', '.join(missing[:5]) or 'none'}"
        f"{' ...' if len(missing) > 5 else ''}",
        "check the path to the hub (a proxy that holds or throttles the transfer, a captive portal, HF_ENDPOINT) "
        "and run the fetch again: the files completed so far stay staged and only the rest is downloaded "
        "($DS4_FETCH_STALL_S sets the stall window, $DS4_FETCH_ATTEMPTS the attempts)")
