"""GPU clock-cap sweep with its safety rules (the reference table is docs/sources.md#gx10-clock-caps).

Rules, each from the project's requirements for the sweep ("Clock sweep: record the original state first; between points
wait until the GPU is below 70 C; stop the sweep above 84 C; always restore the original clocks, also on Ctrl-C, SIGTERM
or a crash, and at the next start if a previous run died without restoring (a journal file). Never touches clocks unless
the profile asks and the user confirms (`--yes`).") and the reference pair's practice
(docs/sources.md#gx10-sweep-safety: cool each point below 70 C, stop the sweep above 84 C, always restore the original
cap; a stray sweep there kept changing clocks under another benchmark: 92.5 vs 139.3 tok/s for the same case):

1. Before anything changes, each GPU's original state (application clocks, default application clocks, power
   limit, default power limit) is read and written to a journal, ``<journal dir>/clock-journal-<gpu uuid>.json``
   (atomic: temporary file + fsync + rename). The journal dir is ``$DS4_CLOCK_JOURNAL_DIR``, default
   ``/var/lib/ds4deploy/bench``. NVML and nvidia-smi cannot read back an applied ``-lgc`` lock (there is no
   getter); a host that runs with a standing lock (docs/sources.md#v100x8: V100 graphics clock locked at 1522 MHz; GB10
   owners cap at ``-lgc 0,2200`` against overheating) must name it with ``--restore-locked-clocks MIN,MAX``, else the
   sweep ends with the driver default (``-rgc``) and says so before it starts.
2. Before each point: wait until every GPU is below `COOL_BELOW_C`; a GPU that does not cool within the profile's
   ``cool_timeout_s`` stops the sweep.
3. During each point a watcher thread reads the temperatures every `WATCH_INTERVAL_S`; above `STOP_ABOVE_C` it
   interrupts the measurement (a signal to the main thread), the sweep stops and the clocks are restored. Cells
   finished before that are kept.
4. The original state is restored in a ``finally`` (normal end, exception, Ctrl-C), from SIGTERM/SIGHUP handlers
   (they raise into the main thread so the same ``finally`` runs), and from ``atexit``; restoring is idempotent.
   A journal is deleted only after its GPU was restored. A run killed with SIGKILL (or a power cut) leaves the
   journal: the next ``ds4deploy bench run`` restores from it first and says so.
5. One sweep per host: an ``flock`` on ``<journal dir>/clock-sweep.lock``. While it is held, every other
   ``bench run`` on the host is refused (its numbers would move with the other run's clocks).

Control goes through a `ClockBackend`: `NvmlBackend` (nvmlDeviceSetGpuLockedClocks / ResetGpuLockedClocks,
SetPowerManagementLimit, SetApplicationsClocks) or `SmiBackend` (``nvidia-smi -i N -lgc MIN,MAX`` / ``-rgc`` /
``-pl W`` / ``-ac MEM,GR``), built on the bench's one GPU backend (`ds4deploy.bench.gpu`, shared with telemetry).
Both need root. Tests use an in-process fake with the same interface. The sweep's table is
`ds4deploy.bench.report.clock_table`, its plots `ds4deploy.bench.plots.write_sweep_plots`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from ds4deploy.bench.gpu import Nvml, Smi, open_gpu
from ds4deploy.bench.report import atomic_write_text
from ds4deploy.core.errors import UserError
from ds4deploy.core.holder_lock import HolderLock

# docs/sources.md#gx10-sweep-safety (cool each point below 70 C, stop the sweep above 84 C). Throttling started at
# 82 C on that system, so 84 C is already past where the numbers stop meaning what the cap says.
COOL_BELOW_C = 70
STOP_ABOVE_C = 84
# Seconds between temperature reads while measuring / while cooling: the GPU heats by a few C per second at most.
WATCH_INTERVAL_S = 1.0
COOL_POLL_S = 5.0
DEFAULT_JOURNAL_DIR = "/var/lib/ds4deploy/bench"
JOURNAL_SCHEMA = "ds4deploy-clock-journal/1"


class ClockSweep(BaseModel):
    """A profile's clock sweep: one point per entry of `caps_mhz` (None = no cap, the driver default; the
    "none" row of docs/sources.md#gx10-clock-caps). At each point the graphics clock is locked to ``[floor_mhz, cap]``
    (``nvidia-smi -lgc 0,<cap>`` is the usual form and on GB10 the only clock lever, docs/sources.md#nvml-gb10) and the
    profile's cells are measured. `power_limit_w` (optional) is set for the whole sweep (docs/sources.md#v100x8 ran at
    150 W per card); GB10 reports no power limit and refuses it."""

    model_config = ConfigDict(extra="forbid")

    caps_mhz: list[int | None] = Field(min_length=1, max_length=40)  # run.REQS_PER_POINT keeps salts unique
    floor_mhz: int = Field(default=0, ge=0)
    power_limit_w: float | None = Field(default=None, gt=0)
    cool_timeout_s: float = Field(default=900.0, gt=0, description="seconds to wait for < 70 C before a point")


@dataclass
class GpuState:
    """What a sweep may change on one GPU, read before the change. MHz and W; None = the device reports N/A."""

    index: int
    uuid: str
    name: str | None = None
    app_graphics_mhz: int | None = None
    app_memory_mhz: int | None = None
    default_app_graphics_mhz: int | None = None
    default_app_memory_mhz: int | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None


class ClockBackend(Protocol):
    """Reads and changes GPU clocks. Indexes are the driver's GPU indexes (as `nvidia-smi -i`)."""

    name: str

    def gpus(self) -> list[tuple[int, str]]:
        """(index, uuid) of every GPU."""
        ...

    def read_state(self, index: int) -> GpuState:
        """The GPU's current application clocks and power limit."""
        ...

    def temperature(self, index: int) -> int | None:
        """GPU temperature, degrees C (None: N/A)."""
        ...

    def lock_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """Lock the graphics clock to [min_mhz, max_mhz]."""
        ...

    def reset_locked_clocks(self, index: int) -> None:
        """Remove a graphics clock lock (driver default)."""
        ...

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set the power limit, W."""
        ...

    def set_app_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        """Set the application clocks."""
        ...


class NvmlBackend(Nvml):
    """NVML through nvidia-ml-py (needs root for the setters)."""

    def gpus(self) -> list[tuple[int, str]]:
        """(index, uuid) of every GPU."""
        return [(i, self.get(self.nv.nvmlDeviceGetUUID, h)) for i, h in enumerate(self.handles)]

    def read_state(self, index: int) -> GpuState:
        """Application clocks (NVML_CLOCK_GRAPHICS/MEM) and power limit (mW -> W)."""
        nv, h = self.nv, self.handles[index]
        pl = self.get(nv.nvmlDeviceGetPowerManagementLimit, h)
        dpl = self.get(nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
        return GpuState(
            index=index, uuid=self.get(nv.nvmlDeviceGetUUID, h), name=self.get(nv.nvmlDeviceGetName, h),
            app_graphics_mhz=self.get(nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_GRAPHICS),
            app_memory_mhz=self.get(nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_MEM),
            default_app_graphics_mhz=self.get(nv.nvmlDeviceGetDefaultApplicationsClock, h, nv.NVML_CLOCK_GRAPHICS),
            default_app_memory_mhz=self.get(nv.nvmlDeviceGetDefaultApplicationsClock, h, nv.NVML_CLOCK_MEM),
            power_limit_w=pl / 1000.0 if pl is not None else None,
            default_power_limit_w=dpl / 1000.0 if dpl is not None else None)

    def temperature(self, index: int) -> int | None:
        """GPU temperature, C."""
        return self.get(self.nv.nvmlDeviceGetTemperature, self.handles[index], self.nv.NVML_TEMPERATURE_GPU)

    def lock_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """nvmlDeviceSetGpuLockedClocks."""
        self.do(f"lock GPU {index} clocks to {min_mhz}-{max_mhz} MHz", self.nv.nvmlDeviceSetGpuLockedClocks,
                self.handles[index], min_mhz, max_mhz)

    def reset_locked_clocks(self, index: int) -> None:
        """nvmlDeviceResetGpuLockedClocks."""
        self.do(f"reset GPU {index} locked clocks", self.nv.nvmlDeviceResetGpuLockedClocks, self.handles[index])

    def set_power_limit(self, index: int, watts: float) -> None:
        """nvmlDeviceSetPowerManagementLimit (mW)."""
        self.do(f"set GPU {index} power limit to {watts} W", self.nv.nvmlDeviceSetPowerManagementLimit,
                self.handles[index], round(watts * 1000))

    def set_app_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        """nvmlDeviceSetApplicationsClocks."""
        self.do(f"set GPU {index} application clocks", self.nv.nvmlDeviceSetApplicationsClocks,
                self.handles[index], memory_mhz, graphics_mhz)


class SmiBackend(Smi):
    """nvidia-smi: ``--query-gpu`` to read, ``-lgc``/``-rgc``/``-pl``/``-ac`` to change."""

    FIELDS = ("index", "uuid", "name", "clocks.applications.graphics", "clocks.applications.memory",
              "clocks.default_applications.graphics", "clocks.default_applications.memory", "power.limit",
              "power.default_limit", "temperature.gpu")

    def gpus(self) -> list[tuple[int, str]]:
        """(index, uuid) of every GPU."""
        return [(r["index"], r["uuid"]) for r in self.query(self.FIELDS)]

    def read_state(self, index: int) -> GpuState:
        """One ``--query-gpu`` row."""
        r = next(r for r in self.query(self.FIELDS) if r["index"] == index)
        return GpuState(index=index, uuid=r["uuid"], name=r.get("name"),
                        app_graphics_mhz=r.get("clocks_applications_graphics_mhz"),
                        app_memory_mhz=r.get("clocks_applications_memory_mhz"),
                        default_app_graphics_mhz=r.get("clocks_default_applications_graphics_mhz"),
                        default_app_memory_mhz=r.get("clocks_default_applications_memory_mhz"),
                        power_limit_w=r.get("power_limit_w"), default_power_limit_w=r.get("power_default_limit_w"))

    def temperature(self, index: int) -> int | None:
        """``temperature.gpu``, C."""
        return next(r for r in self.query(self.FIELDS) if r["index"] == index).get("temperature_gpu_c")

    def lock_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """``nvidia-smi -i N -lgc MIN,MAX``."""
        self.run("-i", str(index), "-lgc", f"{min_mhz},{max_mhz}")

    def reset_locked_clocks(self, index: int) -> None:
        """``nvidia-smi -i N -rgc``."""
        self.run("-i", str(index), "-rgc")

    def set_power_limit(self, index: int, watts: float) -> None:
        """``nvidia-smi -i N -pl W``."""
        self.run("-i", str(index), "-pl", f"{watts:g}")

    def set_app_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        """``nvidia-smi -i N -ac MEM,GR``."""
        self.run("-i", str(index), "-ac", f"{memory_mhz},{graphics_mhz}")


def open_backend() -> tuple[ClockBackend | None, str]:
    """NVML if it loads and sees a GPU, else nvidia-smi if it runs (`ds4deploy.bench.gpu.open_gpu`): (backend,
    description), or (None, why neither works)."""
    return open_gpu(NvmlBackend, SmiBackend)


# ---------------------------------------------------------------------------------------------------- journal


def journal_dir() -> Path:
    """$DS4_CLOCK_JOURNAL_DIR, else /var/lib/ds4deploy/bench (survives reboots and /tmp cleaners)."""
    return Path(os.environ.get("DS4_CLOCK_JOURNAL_DIR") or DEFAULT_JOURNAL_DIR)


def journal_path(d: Path, uuid: str) -> Path:
    """``<d>/clock-journal-<uuid>.json``."""
    return d / f"clock-journal-{uuid}.json"


def _atomic_write(path: Path, text: str) -> None:
    atomic_write_text(path, text)
    dfd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable (a power cut right after a change)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@dataclass
class Journal:
    """One GPU's journal: its original state and what the sweep has changed. Written before every change."""

    original: GpuState
    restore_locked_clocks_mhz: list[int] | None = None  # None: restore = reset (-rgc)
    pid: int = field(default_factory=os.getpid)
    command: str = field(default_factory=lambda: " ".join(sys.argv))
    started: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
    backend: str = ""
    changed_clocks: bool = False
    changed_power_limit: bool = False

    def to_json(self) -> str:
        """JSON text with the schema tag."""
        d = asdict(self)
        d["schema"] = JOURNAL_SCHEMA
        return json.dumps(d, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Journal:
        """Parse a journal file's text (raises ValueError/KeyError/TypeError on a damaged file)."""
        d = json.loads(text)
        if d.pop("schema", None) != JOURNAL_SCHEMA:
            raise ValueError("not a ds4deploy clock journal")
        d["original"] = GpuState(**d["original"])
        return cls(**d)


def restore_gpu(backend: ClockBackend, j: Journal) -> list[str]:
    """Put one GPU back to its journal's original state; returns what was done (one line each).

    The GPU is found by uuid (indexes may change across reboots). Every step is tried even if one fails.

    Raises:
        UserError: the GPU is gone, or a step failed (after trying the others); the journal stays for a retry.
    """
    idx = {u: i for i, u in backend.gpus()}.get(j.original.uuid)
    if idx is None:
        raise UserError(f"GPU {j.original.uuid} of the clock journal is not on this host",
                        "restore it by hand on its host (`nvidia-smi -rgc`), then delete the journal")
    done, failed = [], []
    o = j.original
    steps: list[tuple[str, Callable[[], None]]] = []
    if j.restore_locked_clocks_mhz:
        lo, hi = j.restore_locked_clocks_mhz
        steps.append((f"locked clocks {lo}-{hi} MHz (as given by --restore-locked-clocks)",
                      lambda: backend.lock_clocks(idx, lo, hi)))
    else:
        steps.append(("locked clocks reset (driver default)", lambda: backend.reset_locked_clocks(idx)))
    if j.changed_power_limit and o.power_limit_w is not None:
        steps.append((f"power limit {o.power_limit_w:g} W", lambda: backend.set_power_limit(idx, o.power_limit_w)))
    if o.app_graphics_mhz is not None and o.app_memory_mhz is not None and j.changed_clocks:
        cur = backend.read_state(idx)
        if (cur.app_graphics_mhz, cur.app_memory_mhz) != (o.app_graphics_mhz, o.app_memory_mhz):
            steps.append((f"application clocks {o.app_memory_mhz},{o.app_graphics_mhz} MHz",
                          lambda: backend.set_app_clocks(idx, o.app_memory_mhz, o.app_graphics_mhz)))
    for what, fn in steps:
        try:
            fn()
            done.append(what)
        except Exception as exc:  # try every step, report all failures
            failed.append(f"{what}: {exc}")
    if failed:
        raise UserError(f"could not restore GPU {o.index} ({o.uuid}): {'; '.join(failed)}",
                        "restore by hand (`nvidia-smi -i N -rgc`, `-pl W`), then delete the journal")
    return [f"GPU {idx} ({o.uuid}): {w}" for w in done]


def sweep_lock(d: Path, refused: Callable[[str], UserError]) -> HolderLock:
    """The host's clock-sweep flock, ``<d>/clock-sweep.lock`` (`ds4deploy.core.holder_lock.HolderLock`); `refused`
    builds the error from the holder's description."""
    return HolderLock(d / "clock-sweep.lock", refused)


def recover(backend_factory: Callable[[], tuple[ClockBackend | None, str]], d: Path | None = None,
            say: Callable[[str], None] = print) -> list[str]:
    """Before any benchmark: restore GPUs a dead sweep left changed, and refuse to run beside a live sweep.

    Does nothing (and opens no backend) when the journal dir has no journal and no sweep lock is held.

    Returns:
        The restore lines said (empty when nothing was stale).
    Raises:
        UserError: a clock sweep is running on this host (its lock is held); a journal is damaged; a GPU could
            not be restored.
    """
    d = d or journal_dir()
    if not d.is_dir():
        return []

    def refused(who: str) -> UserError:
        return UserError(f"a clock sweep is running on this host ({who}, lock {d / 'clock-sweep.lock'}): it changes "
                         "GPU clocks under any other benchmark",
                         "wait for it to finish (docs/sources.md#gx10-benchmark-method: a stray sweep gave "
                         "92.5 instead of 139.3 tok/s for the same case)")

    with sweep_lock(d, refused):
        journals = sorted(d.glob("clock-journal-*.json"))
        if not journals:
            return []
        backend, why = backend_factory()
        if backend is None:
            raise UserError(f"clock journals of a sweep that did not restore are in {d}, but no GPU is reachable "
                            f"({why})", "restore the clocks on the GPU's host, then delete the journals")
        out = []
        for p in journals:
            try:
                j = Journal.from_json(p.read_text())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UserError(f"clock journal {p} is damaged: {exc}",
                                "restore by hand (`nvidia-smi -rgc`, `-pl <W>`), then delete the file") from None
            say(f"a previous clock sweep (pid {j.pid}, started {j.started}: {j.command}) died without restoring "
                f"GPU {j.original.index} ({j.original.uuid}); restoring its original clocks first")
            lines = restore_gpu(backend, j)
            p.unlink()
            for line in lines:
                say(f"restored {line}")
            out += lines
        return out


# ---------------------------------------------------------------------------------------------------- the sweep


class SweepInterrupted(BaseException):  # like KeyboardInterrupt: `except Exception` does not catch it
    """Raised in the main thread by a signal (SIGTERM/SIGHUP) or by the over-temperature watcher."""

    def __init__(self, reason: str, signum: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.signum = signum


class Guard:
    """Holds the sweep lock, writes the journals, installs the signal handlers and atexit hook, and restores.

    Use as a context manager around the sweep; `restore()` is idempotent and also runs from atexit.
    """

    HANDLED = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, backend: ClockBackend, indexes: list[int], d: Path, restore_locked: list[int] | None,
                 say: Callable[[str], None] = print) -> None:
        self.backend = backend
        self.indexes = indexes
        self.dir = d
        self.restore_locked = restore_locked
        self.say = say
        self.journals: dict[int, Journal] = {}
        self.lock = sweep_lock(d, lambda who: UserError(f"another clock sweep is running on this host ({who})",
                                                        "wait for it to finish"))
        self._old_handlers: dict[int, object] = {}
        self._restored = False
        self.restored: list[str] = []
        self.overheat: str | None = None

    def _write(self, j: Journal) -> None:
        _atomic_write(journal_path(self.dir, j.original.uuid), j.to_json())

    def __enter__(self) -> Guard:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the clock journal dir {self.dir}: {exc.strerror}",
                            "run as root (clock changes need root anyway) or set DS4_CLOCK_JOURNAL_DIR") from None
        self.lock.__enter__()
        try:
            for i in self.indexes:
                j = Journal(original=self.backend.read_state(i), restore_locked_clocks_mhz=self.restore_locked,
                            backend=self.backend.name)
                self._write(j)  # before anything is changed
                self.journals[i] = j
        except BaseException:
            self.lock.release()
            raise
        for s in self.HANDLED:
            self._old_handlers[s] = signal.signal(s, self._on_signal)
        self._old_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_overheat)
        atexit.register(self.restore)
        return self

    def _on_signal(self, signum, _frame) -> None:
        raise SweepInterrupted(f"{signal.Signals(signum).name} received", signum)

    def _on_overheat(self, _signum, _frame) -> None:
        raise SweepInterrupted(self.overheat or "over temperature")

    def mark(self, i: int, clocks: bool = False, power: bool = False) -> None:
        """Record in the journal (durably) that GPU `i`'s clocks / power limit are about to change."""
        j = self.journals[i]
        j.changed_clocks |= clocks
        j.changed_power_limit |= power
        self._write(j)

    def restore(self) -> list[str]:
        """Restore every journalled GPU (once); journals of restored GPUs are deleted. Returns what was done."""
        if self._restored:
            return []
        self._restored = True
        lines, errors = [], []
        for _i, j in self.journals.items():
            try:
                lines += restore_gpu(self.backend, j)
                journal_path(self.dir, j.original.uuid).unlink(missing_ok=True)
            except UserError as exc:
                errors.append(exc.cause)
        self.restored = lines
        for line in lines:
            self.say(f"restored {line}")
        for e in errors:
            self.say(f"error: {e} (journal kept in {self.dir}; the next `ds4deploy bench run` retries)")
        return lines

    def __exit__(self, *exc: object) -> None:
        try:
            self.restore()
        finally:
            for s, h in self._old_handlers.items():
                signal.signal(s, h)
            atexit.unregister(self.restore)
            self.lock.__exit__(None, None, None)


class Watcher:
    """Thread reading GPU temperatures every `interval_s` while a point is measured; above `STOP_ABOVE_C` it stores
    the reason in the guard and sends SIGUSR1 to this process's main thread (the guard's handler raises
    `SweepInterrupted` there, interrupting blocking I/O)."""

    def __init__(self, guard: Guard, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.guard = guard
        self.interval_s = interval_s
        self.max_c: dict[int, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="clock-sweep-watch", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for i in self.guard.indexes:
                t = self.guard.backend.temperature(i)
                if t is None:
                    continue
                self.max_c[i] = max(t, self.max_c.get(i, t))
                if t > STOP_ABOVE_C:
                    self.guard.overheat = (f"GPU {i} reached {t} C, above the sweep's stop limit of {STOP_ABOVE_C} C "
                                           "(docs/sources.md#gx10-sweep-safety)")
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                    return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Watcher:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=10)


def wait_cool(backend: ClockBackend, indexes: list[int], timeout_s: float, poll_s: float = COOL_POLL_S,
              say: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> float:
    """Wait until every GPU is below `COOL_BELOW_C`; returns seconds waited. A GPU reporting no temperature counts
    as cool (nothing to wait for) and is said once.

    Raises:
        SweepInterrupted: still too hot after `timeout_s`.
    """
    t0 = clock()
    while True:
        temps = {i: backend.temperature(i) for i in indexes}
        hot = {i: t for i, t in temps.items() if t is not None and t >= COOL_BELOW_C}
        if not hot:
            return clock() - t0
        if clock() - t0 >= timeout_s:
            raise SweepInterrupted(f"GPU(s) {', '.join(f'{i} at {t} C' for i, t in hot.items())} did not cool below "
                                   f"{COOL_BELOW_C} C within {timeout_s:.0f} s")
        say(f"cooling: {', '.join(f'GPU {i} {t} C' for i, t in hot.items())} (waiting for < {COOL_BELOW_C} C)")
        sleep(poll_s)


@dataclass
class SweepResult:
    """Records of every measured point (each with ``clock_cap_mhz``) and why the sweep stopped early (None: it
    completed), plus the restore lines."""

    records: list[dict]
    stopped: str | None
    restored: list[str]


def cap_tag(cap: int | None) -> str:
    """Cell-id suffix of a sweep point: ``-clk2000`` / ``-clknone``."""
    return f"-clk{cap if cap is not None else 'none'}"


def run_sweep(backend: ClockBackend, indexes: list[int], sweep: ClockSweep,
              measure_point: Callable[[int | None], list[dict]], d: Path | None = None,
              restore_locked: list[int] | None = None, say: Callable[[str], None] = print,
              poll_s: float = COOL_POLL_S, watch_s: float = WATCH_INTERVAL_S) -> SweepResult:
    """Measure `measure_point(cap)` at every cap of `sweep`, with the safety rules of the module docstring.

    Returns:
        The records (``clock_cap_mhz`` and the watcher's max temperature added to each) and why the sweep stopped
        early (over temperature, cooling timeout), or None.
    Raises:
        SystemExit(128 + signal): SIGTERM/SIGHUP arrived (after restoring). KeyboardInterrupt is re-raised after
        restoring. Any other exception is re-raised after restoring.
        UserError: the journal dir cannot be created, another sweep runs, a clock change was refused.
    """
    d = d or journal_dir()
    records: list[dict] = []
    stopped = None
    guard = Guard(backend, indexes, d, restore_locked, say)
    with guard:
        try:
            if sweep.power_limit_w is not None:
                for i in indexes:
                    if guard.journals[i].original.power_limit_w is None:
                        raise UserError(f"GPU {i} reports no power limit (N/A), so the profile's power_limit_w "
                                        f"{sweep.power_limit_w:g} W cannot be set or restored",
                                        "drop power_limit_w from the profile (GB10 has no settable power limit)")
                    guard.mark(i, power=True)
                    backend.set_power_limit(i, sweep.power_limit_w)
            for cap in sweep.caps_mhz:
                waited = wait_cool(backend, indexes, sweep.cool_timeout_s, poll_s, say)
                for i in indexes:
                    guard.mark(i, clocks=True)
                    if cap is None:
                        backend.reset_locked_clocks(i)
                    else:
                        backend.lock_clocks(i, sweep.floor_mhz, cap)
                say(f"clock point {'none' if cap is None else f'{cap} MHz'} (cooled {waited:.0f} s)")
                with Watcher(guard, watch_s) as w:
                    recs = measure_point(cap)
                for r in recs:
                    r["clock_cap_mhz"] = cap
                    r["clock_sweep"] = {"floor_mhz": sweep.floor_mhz, "power_limit_w": sweep.power_limit_w,
                                        "cooled_s": waited, "max_temperature_c": w.max_c}
                records += recs
        except SweepInterrupted as exc:
            if exc.signum is not None:
                say(f"{exc.reason}: restoring the GPU clocks before exiting")
                guard.restore()
                raise SystemExit(128 + exc.signum) from None
            stopped = exc.reason
            say(f"sweep stopped: {exc.reason}")
        except BaseException as exc:
            say(f"the sweep ended early ({type(exc).__name__}): restoring the GPU clocks")
            raise
    return SweepResult(records=records, stopped=stopped, restored=guard.restored)


def preflight(sweep: ClockSweep | None, yes: bool) -> tuple[ClockBackend | None, list[int]]:
    """Before a run that asks for a sweep: refuse without ``--yes`` or without a GPU.

    Returns:
        (backend, GPU indexes), or (None, []) for a profile without a sweep.
    Raises:
        UserError: the profile sweeps clocks and ``--yes`` is missing; no NVIDIA GPU (NVML and nvidia-smi both
            unavailable, with why).
    """
    if sweep is None:
        return None, []
    caps = ", ".join("none" if c is None else str(c) for c in sweep.caps_mhz)
    if not yes:
        raise UserError(f"this profile changes GPU clocks (caps {caps} MHz"
                        f"{f', power limit {sweep.power_limit_w:g} W' if sweep.power_limit_w else ''}); "
                        "nothing was changed", "rerun with --yes to confirm (the original clocks are journalled and "
                        "restored afterwards, also on Ctrl-C, SIGTERM or a crash)")
    backend, why = open_backend()
    if backend is None:
        raise UserError(f"a clock sweep needs an NVIDIA GPU and this host has none ({why})",
                        "run the clock-sweep profile on the GPU host; other profiles run without a GPU")
    return backend, [i for i, _u in backend.gpus()]


def parse_locked(text: str | None) -> list[int] | None:
    """``--restore-locked-clocks MIN,MAX`` -> [min, max] (None when not given).

    Raises:
        UserError: not two integers with MIN <= MAX.
    """
    if text is None:
        return None
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--restore-locked-clocks {text!r} is not MIN,MAX in MHz", "e.g. --restore-locked-clocks "
                        "0,2200") from None
    if lo > hi or lo < 0:
        raise UserError(f"--restore-locked-clocks {text!r}: MIN must be <= MAX and >= 0", "e.g. 1522,1522")
    return [lo, hi]
