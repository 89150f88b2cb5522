"""Parallel verification of a model directory against its manifest, with a sidecar cache of verified files.

`verify_model` hashes every manifest file (sha256, or the git blob sha1 for small hub files) in a thread pool and
returns one `FileResult` per file. Threads are enough for parallel hashing: CPython's hashlib releases the GIL
while it hashes a buffer larger than 2047 bytes (``HASHLIB_GIL_MINSIZE`` in CPython ``Modules/hashlib.h``) and
file reads release it too, so N threads keep N cores busy without the cost of copying data between processes.

Worker count (`default_workers`): one thread per core this process may run on (``os.sched_getaffinity``, which
honours taskset/cgroup cpusets, else ``os.cpu_count()``), capped by the number of files to hash. One sha256
stream cannot be split across cores and runs at about 1.9 GB/s per core with SHA-NI (measured here: AMD EPYC,
OpenSSL 3.0, see docs/bench-verify.md), so more threads than cores cannot hash faster, while one per core lets
the machine reach ``min(disk read, cores x single-core sha256)``. Files are hashed largest first so the last shards
do not leave cores idle.

Reading (`hash_fd`), measured cold on the 2-core CI machine (docs/bench-verify.md): a thread that reads then
hashes leaves its core idle while it waits for the disk, so each file gets its own reader thread that keeps
`READ_AHEAD` 1 MiB buffers filled ahead of the hashing thread (0.65 -> ~0.88 of the disk-read limit). And a file
that was not in the page cache when verification began is dropped from it as it is hashed
(``POSIX_FADV_DONTNEED`` every `DROP_EVERY` bytes): verifying 166.9 GB (docs/sources.md#gx10-pair) through a 121 GB
node's page cache would otherwise evict everything else on it, and re-using the same freed pages cost here 0.2 instead
of up to 1.1 CPU-seconds of kernel time per 4.3 GB read. A file already cached (probed with an ``RWF_NOWAIT`` read of
its first, middle and last pages) stays cached and is hashed without the reader thread, which only costs when nothing
waits on a disk; where the filesystem cannot tell (no ``RWF_NOWAIT``: NFS, FUSE), files are read ahead and the
cache is left alone.

The sidecar: after a file verifies, its ``size``, ``mtime_ns``, ``ctime_ns``, inode, device and digest are
recorded in a JSON file under the user's cache directory (`sidecar_path`; not inside the model directory, which
the Ansible role copies to every node and the container mounts read-only, so a sidecar there would travel with
the copy and be wrong on the other side). On the next check a file whose size, mtime, ctime, inode and device
all equal the record, and whose recorded digest equals the manifest's, is reported ``cached`` without reading it.

What the sidecar detects: any write through the filesystem (it changes mtime and ctime, and usually size),
truncation, replacement by another file (new inode), a copy or restore (new inode, new ctime), a content change
whose mtime was put back with ``os.utime``/``touch -d`` (utime itself sets ctime to the current time, and user
space cannot set ctime). What it cannot detect: changes that bypass the filesystem's metadata, i.e. silent media
corruption (bit rot), writes to the block device underneath, a filesystem that does not maintain ctime (some
network and FUSE filesystems), or root resetting the clock around a write. ``verify_model(full=True)`` (CLI:
``ds4deploy model verify --full``) ignores the sidecar and re-hashes every byte: it is the way to catch those.

A file that is missing, of the wrong size, of a different hash, or that changed while it was being read is never
reported verified and is removed from the sidecar.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 1 << 20  # bytes per read; 1 MiB reads hash at the same speed as 16 MiB ones here (docs/bench-verify.md)
READ_AHEAD = 8  # buffers the reader thread of one file keeps filled ahead of its hashing thread (8 MiB)
DROP_EVERY = 16 << 20  # bytes between page-cache drops behind the reader (files that were not cached)
SIDECAR_VERSION = 1

OK_STATUSES = ("ok", "cached")


@dataclass
class FileResult:
    """The verdict for one manifest file.

    Attributes:
        name: path relative to the model directory, as in the manifest.
        status: ``ok`` (hashed, matches), ``cached`` (sidecar hit, not read), ``missing``, ``size`` (wrong size,
            not hashed), ``mismatch`` (hash differs), ``changed`` (size/mtime/ctime changed while it was read),
            ``outside`` (a symbolic link, of the file or a directory above it, that leaves the model directory:
            it would dangle in the container, which mounts only that directory; not read), ``error`` (could not
            be read).
        kind: ``sha256`` or ``git_sha1``.
        expected: the manifest's hex digest.
        actual: the computed hex digest (the recorded one for ``cached``; None when not hashed).
        expected_size: bytes, from the manifest.
        size: bytes on disk (None when missing).
        detail: a human-readable reason for a failure.
    """

    name: str
    status: str
    kind: str
    expected: str
    actual: str | None = None
    expected_size: int = 0
    size: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True when the file matches the manifest (hashed now or known from the sidecar)."""
        return self.status in OK_STATUSES

    def problem(self, model_dir: Path) -> str:
        """One line naming the file and what differs (used in error messages)."""
        path = model_dir / self.name
        if self.status == "missing":
            return f"{path}: missing"
        if self.status == "size":
            return f"{path}: size {self.size} bytes, manifest says {self.expected_size}"
        if self.status == "mismatch":
            return f"{path}: {self.kind} {self.actual}, manifest says {self.expected}"
        return f"{path}: {self.detail}"


@dataclass
class Report:
    """All results of one verification, sorted by file name.

    Attributes:
        results: one `FileResult` per manifest file.
        bytes_hashed: bytes read and hashed (sidecar hits excluded).
        seconds: wall time of the whole check.
        workers: threads used.
        sidecar: where the sidecar lives (None when disabled).
    """

    model_dir: Path
    results: list[FileResult] = field(default_factory=list)
    bytes_hashed: int = 0
    seconds: float = 0.0
    workers: int = 1
    sidecar: Path | None = None

    @property
    def ok(self) -> bool:
        """True when every manifest file verified."""
        return all(r.ok for r in self.results)

    def problems(self) -> list[str]:
        """One line per file that did not verify."""
        return [r.problem(self.model_dir) for r in self.results if not r.ok]

    def counts(self) -> dict[str, int]:
        """Number of files per status."""
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out


def default_workers() -> int:
    """Threads for hashing: the cores this process may run on (see the module docstring for why)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def expected_digest(entry: dict) -> tuple[str, str]:
    """``(kind, hex digest)`` of a manifest file entry: sha256 when present, else the git blob sha1."""
    if entry.get("sha256"):
        return "sha256", entry["sha256"]
    return "git_sha1", entry["git_sha1"]


def page_cache_state(fd: int, size: int) -> bool | None:
    """Whether an open file is in the page cache: True when its first, middle and last pages all are (reads with
    ``RWF_NOWAIT`` succeed), False when one is not, None when the filesystem cannot tell (``RWF_NOWAIT``
    unsupported: EOPNOTSUPP on tmpfs, NFS, FUSE, older overlayfs). Three pages, not one: a loader that read only
    a shard's header leaves its first page cached. A probe of an uncached page starts readahead of it, so a
    second call may answer differently."""
    offsets = sorted({0, (size // 2) & ~4095, max(0, size - 1) & ~4095})
    for offset in offsets:
        try:
            os.preadv(fd, [bytearray(4096)], offset, os.RWF_NOWAIT)
        except BlockingIOError:
            return False
        except (AttributeError, OSError):
            return None
    return True


def hash_fd(fd: int, kind: str, size: int, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex digest of an open file read from offset 0 in `CHUNK` reads: by a reader thread `READ_AHEAD` buffers ahead
    of the hashing (calling) thread, dropping what it read from the page cache when the file was not cached
    (`page_cache_state` False; None: read ahead, drop nothing); in the calling thread when it was cached (module
    docstring, "Reading").

    Args:
        fd: an open file descriptor (read from its start; the offset is moved).
        kind: ``sha256``, or ``git_sha1`` (sha1 over ``b"blob <size>\\0"`` + content, as git computes it).
        size: the file's size in bytes (used for the git header).
        on_bytes: called with the byte count of each chunk (progress).
    Raises:
        OSError: a read failed (raised in the calling thread).
    """
    if kind == "sha256":
        h = hashlib.sha256()
    else:
        h = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    with contextlib.suppress(AttributeError, OSError):  # a hint for the kernel's readahead; not on every OS
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    cached = page_cache_state(fd, size)
    drop = cached is False  # unknown: keep whatever cache there is, but still read ahead (network filesystems)
    os.lseek(fd, 0, os.SEEK_SET)
    if cached:
        # Cached: nothing to wait for, so no reader thread (handing buffers between threads cost ~6 % here).
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := os.readv(fd, [view]):
            h.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
        return h.hexdigest()
    free: queue.SimpleQueue = queue.SimpleQueue()
    full: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(READ_AHEAD):
        free.put(bytearray(CHUNK))

    def read_ahead() -> None:
        offset = dropped = 0
        while (buf := free.get()) is not None:
            try:
                n = os.readv(fd, [buf])
            except OSError as exc:
                full.put((None, 0, exc))
                return
            full.put((buf, n, None))
            if n == 0:
                return
            offset += n
            if drop and offset - dropped >= DROP_EVERY:
                with contextlib.suppress(AttributeError, OSError):
                    os.posix_fadvise(fd, dropped, offset - dropped, os.POSIX_FADV_DONTNEED)
                dropped = offset

    reader = threading.Thread(target=read_ahead, name="ds4-verify-read", daemon=True)
    reader.start()
    try:
        while True:
            buf, n, err = full.get()
            if err is not None:
                raise err
            if n == 0:
                break
            h.update(memoryview(buf)[:n])
            if on_bytes is not None:
                on_bytes(n)
            free.put(buf)
    finally:
        free.put(None)  # the reader stops at its next buffer request
        reader.join()
    if drop:
        with contextlib.suppress(AttributeError, OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return h.hexdigest()


def hash_path(path: Path, kind: str = "sha256", on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex digest (`hash_fd`) of a file by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return hash_fd(fd, kind, os.fstat(fd).st_size, on_bytes)
    finally:
        os.close(fd)


# --- sidecar -----------------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """ds4deploy's per-user cache: $DS4_CACHE_DIR, else $XDG_CACHE_HOME/ds4deploy, else ~/.cache/ds4deploy."""
    if os.environ.get("DS4_CACHE_DIR"):
        return Path(os.environ["DS4_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ds4deploy"


def sidecar_path(model_dir: Path) -> Path:
    """The sidecar file of a model directory: ``<cache_dir>/verified/<sha256 of its real path, 32 hex>.json``."""
    real = os.path.realpath(model_dir)
    return cache_dir() / "verified" / f"{hashlib.sha256(real.encode()).hexdigest()[:32]}.json"


def _stat_key(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}


def load_sidecar(path: Path) -> dict[str, dict]:
    """Recorded entries ``{name: {size, mtime_ns, ctime_ns, ino, dev, kind, digest}}``; empty when the file is
    absent, unreadable or of another version (the sidecar is only a cache, never a source of truth)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != SIDECAR_VERSION or not isinstance(doc.get("files"), dict):
        return {}
    return doc["files"]


def save_sidecar(path: Path, model_dir: Path, entries: dict[str, dict]) -> bool:
    """Write the sidecar atomically (temporary file + os.replace). Returns False when it cannot be written (a
    read-only cache is not an error: the next check just hashes again)."""
    doc = {"version": SIDECAR_VERSION, "dir": os.path.realpath(model_dir), "files": dict(sorted(entries.items()))}
    text = json.dumps(doc, indent=1) + "\n"
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def record(model_dir: Path, names_digests: dict[str, tuple[str, str]]) -> None:
    """Add sidecar entries for files just verified by another path (e.g. `ds4deploy.model.fetch` after a move).

    Args:
        names_digests: ``{name: (kind, hex digest)}``; each file is stat'ed now.
    """
    path = sidecar_path(model_dir)
    entries = load_sidecar(path)
    for name, (kind, digest) in names_digests.items():
        st = os.stat(model_dir / name)
        entries[name] = {**_stat_key(st), "kind": kind, "digest": digest}
    save_sidecar(path, model_dir, entries)


# --- verification ------------------------------------------------------------------------------------------------

def resolves_outside(model_dir: Path, name: str) -> str | None:
    """Where ``model_dir/name`` really is when that is outside `model_dir`, else None.

    The file itself or any directory on its path may be a symbolic link; the engine container mounts only
    `model_dir` (read-only, at /model), so a link that leaves it dangles there. Links that stay inside are fine. A
    missing file resolves inside (it is reported ``missing``)."""
    root = os.path.realpath(model_dir)
    real = os.path.realpath(os.path.join(model_dir, name))
    return None if os.path.commonpath([root, real]) == root else real


def _check_one(model_dir: Path, name: str, entry: dict, cached: dict | None,
               on_bytes: Callable[[int], None] | None) -> tuple[FileResult, dict | None]:
    """Verify one file; returns its result and the sidecar entry to record (None: drop any record)."""
    kind, want = expected_digest(entry)
    res = FileResult(name=name, status="error", kind=kind, expected=want, expected_size=int(entry["size"]))
    outside = resolves_outside(model_dir, name)
    if outside is not None:
        res.status = "outside"
        res.detail = (f"resolves to {outside}, outside the model directory (a symbolic link): only {model_dir} is "
                      "mounted into the container, where the link would dangle; replace the link with the file "
                      f"itself (`cp --remove-destination \"$(readlink -f {model_dir / name})\" {model_dir / name}`)")
        return res, None
    try:
        fd = os.open(model_dir / name, os.O_RDONLY)
    except FileNotFoundError:
        res.status = "missing"
        return res, None
    except OSError as exc:
        res.detail = f"cannot be read: {exc.strerror or exc}"
        return res, None
    try:
        before = os.fstat(fd)
        res.size = before.st_size
        if not stat.S_ISREG(before.st_mode):
            res.detail = "not a regular file"
            return res, None
        if before.st_size != res.expected_size:
            res.status = "size"
            return res, None
        key = _stat_key(before)
        if cached is not None and cached.get("kind") == kind and cached.get("digest") == want and all(
                cached.get(k) == v for k, v in key.items()):
            res.status, res.actual = "cached", want
            return res, cached
        try:
            res.actual = hash_fd(fd, kind, before.st_size, on_bytes)
        except OSError as exc:
            res.detail = f"read error: {exc.strerror or exc}"
            return res, None
        if _stat_key(os.fstat(fd)) != key:
            res.status, res.detail = "changed", "changed while it was being verified"
            return res, None
        if res.actual != want:
            res.status = "mismatch"
            return res, None
        res.status = "ok"
        return res, {**key, "kind": kind, "digest": want}
    finally:
        os.close(fd)


def verify_model(model_dir: Path, manifest: dict, *, full: bool = False, workers: int | None = None,
                 use_sidecar: bool = True, on_bytes: Callable[[int], None] | None = None,
                 on_total: Callable[[int], None] | None = None) -> Report:
    """Check every manifest file in `model_dir` in parallel.

    Args:
        model_dir: the model directory.
        manifest: a manifest dict (`ds4deploy.model.manifest`): ``{"files": {name: {"size", "sha256"|"git_sha1"}}}``.
        full: ignore the sidecar's records and re-hash every file (the records are still refreshed).
        workers: threads (default `default_workers`).
        use_sidecar: read and write the sidecar at all.
        on_bytes: progress callback, called from worker threads with each chunk's byte count.
        on_total: called once with the total bytes that will be hashed (an upper bound: sidecar hits and size
            mismatches are not read).
    Returns:
        A `Report`; ``report.ok`` is True only when every file verified. Files not in the manifest are ignored.
    """
    t0 = time.perf_counter()
    files: dict[str, dict] = manifest["files"]
    side = sidecar_path(model_dir) if use_sidecar else None
    recorded = load_sidecar(side) if side is not None else {}
    previous = dict(recorded)
    if full:
        recorded = {}
    workers = workers or default_workers()
    order = sorted(files, key=lambda n: (-int(files[n]["size"]), n))  # largest first: no idle cores at the end
    if on_total is not None:
        on_total(sum(int(files[n]["size"]) for n in order if n not in recorded))
    hashed = 0
    lock = threading.Lock()

    def count(n: int) -> None:
        nonlocal hashed
        with lock:
            hashed += n
        if on_bytes is not None:
            on_bytes(n)

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(order) or 1)), thread_name_prefix="ds4-verify") as ex:
        done = list(ex.map(lambda n: _check_one(model_dir, n, files[n], recorded.get(n), count), order))
    results = sorted((r for r, _ in done), key=lambda r: r.name)
    if side is not None:
        entries = {n: e for n, e in previous.items() if n not in files}  # other manifests' files: keep
        entries.update({r.name: e for r, e in done if e is not None})
        save_sidecar(side, model_dir, entries)
    return Report(model_dir=model_dir, results=results, bytes_hashed=hashed, seconds=time.perf_counter() - t0,
                  workers=min(workers, len(order) or 1), sidecar=side)


# --- presentation ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def byte_progress(description: str, enabled: bool | None = None):
    """A rich progress bar (bytes, speed, time left) on stderr, as ``(on_total, on_bytes)`` callbacks for
    `verify_model`. Shown only when stderr is a terminal unless `enabled` says otherwise (Ansible and CI capture
    stderr; a bar there is noise in the error message)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    if enabled is None:
        enabled = console.is_terminal
    if not enabled:
        yield (lambda total: None), (lambda n: None)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task(description, total=None)
        yield (lambda total: progress.update(task, total=total)), (lambda n: progress.advance(task, n))


def human_bytes(n: int | None) -> str:
    """Bytes in decimal units (kB, MB, GB = 10**3, 10**6, 10**9 bytes), as disk vendors and the hub count."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def results_table(report: Report, title: str):
    """A rich Table with one row per file: name, size, check, result, detail."""
    from rich.table import Table

    style = {"ok": "green", "cached": "green", "missing": "bold red", "size": "bold red", "mismatch": "bold red",
             "changed": "bold red", "error": "bold red"}
    label = {"ok": "ok", "cached": "ok (sidecar)", "missing": "MISSING", "size": "WRONG SIZE",
             "mismatch": "MISMATCH", "changed": "CHANGED", "error": "ERROR"}
    table = Table(title=title, expand=False)
    for col in ("file", "size", "check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for r in report.results:
        if r.status == "size":
            detail = f"{r.size} bytes, manifest says {r.expected_size}"
        elif r.status == "mismatch":
            detail = f"got {r.actual}, manifest says {r.expected}"
        else:
            detail = r.detail
        table.add_row(r.name, human_bytes(r.expected_size), r.kind, f"[{style[r.status]}]{label[r.status]}[/]",
                      detail)
    return table
