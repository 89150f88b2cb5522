"""GPU telemetry during a benchmark cell: clocks, power, temperature and utilization per GPU (docs/bench-harness.md).

Sources, in order of preference (both through the bench's one GPU backend, `ds4deploy.bench.gpu`):

1. NVML through nvidia-ml-py (``pynvml``): graphics/SM/memory clock (MHz), power draw (``nvmlDeviceGetPowerUsage``,
   milliwatts -> W), GPU temperature (C), GPU utilization (%). Each value is read on its own: a value the device
   does not report (GB10 reports several as N/A, docs/sources.md#nvml-gb10) is None, never 0.
2. ``nvidia-smi --query-gpu=<TELEMETRY_FIELDS> --format=csv`` parsed with `ds4deploy.parsers.nvidia_smi`
   (``[N/A]`` / ``[Not Supported]`` -> None), when NVML cannot be loaded but the tool runs.
3. Neither: the cell records ``{"status": "unavailable: no NVIDIA GPU", ...}``: never zeros, so a CPU host's table
   shows no power figure rather than a false one.

A `Sampler` polls the source in a background thread every `SAMPLE_INTERVAL_S` while a cell runs; `cell_summary`
reduces the samples to per-GPU means and maxima plus the cell totals the reference table uses
(docs/sources.md#gx10-clock-caps): mean and max power (W, summed over the GPUs of a sampling round), tok/s per W (the
cell's aggregate output tok/s / mean total power), max temperature (C).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from ds4deploy.bench.gpu import Nvml, Smi, open_gpu

# Fields asked of nvidia-smi (names from `nvidia-smi --help-query-gpu`).
TELEMETRY_FIELDS = ("index", "uuid", "name", "clocks.current.graphics", "clocks.current.sm", "clocks.current.memory",
                    "power.draw", "temperature.gpu", "utilization.gpu")
# Seconds between samples: NVML's power reading is itself a 1 s average on most boards (NVML API reference,
# nvmlDeviceGetPowerUsage), so sampling faster adds nothing; nvidia-smi takes ~0.1-0.3 s per call.
SAMPLE_INTERVAL_S = 1.0
NO_GPU = "unavailable: no NVIDIA GPU"


@dataclass
class GpuSample:
    """One reading of one GPU. Clocks in MHz, power in W, temperature in degrees C, utilization in %; None where the
    device reports N/A or the source does not provide the value. `t` is time.monotonic() seconds."""

    t: float
    index: int
    uuid: str | None = None
    name: str | None = None
    graphics_mhz: int | None = None
    sm_mhz: int | None = None
    memory_mhz: int | None = None
    power_w: float | None = None
    temperature_c: int | None = None
    utilization_pct: int | None = None


class TelemetrySource(Protocol):
    """Anything that reads every GPU once."""

    name: str

    def sample(self) -> list[GpuSample]:
        """One reading per GPU (may raise UserError if the source broke mid-run)."""
        ...


def samples_from_rows(rows: list[dict], t: float) -> list[GpuSample]:
    """`GpuSample`s from `parse_query_gpu` rows (any subset of `TELEMETRY_FIELDS`; missing keys become None; a row
    without ``index`` gets its position)."""
    out = []
    for pos, r in enumerate(rows):
        out.append(GpuSample(
            t=t, index=r["index"] if r.get("index") is not None else pos, uuid=r.get("uuid"), name=r.get("name"),
            graphics_mhz=r.get("clocks_current_graphics_mhz"), sm_mhz=r.get("clocks_current_sm_mhz"),
            memory_mhz=r.get("clocks_current_memory_mhz"), power_w=r.get("power_draw_w"),
            temperature_c=r.get("temperature_gpu_c"), utilization_pct=r.get("utilization_gpu_pct")))
    return out


class SmiSource(Smi):
    """nvidia-smi fallback (one process per sample)."""

    def sample(self) -> list[GpuSample]:
        """Run ``nvidia-smi --query-gpu=<TELEMETRY_FIELDS>`` once.

        Raises:
            UserError: nvidia-smi failed or printed something that is not its CSV.
        """
        t = time.monotonic()
        return samples_from_rows(self.query(TELEMETRY_FIELDS, timeout_s=20), t)


class NvmlSource(Nvml):
    """NVML through nvidia-ml-py. `pynvml` is the imported module (injectable for tests)."""

    def __init__(self, pynvml) -> None:
        super().__init__(pynvml)
        self.uuids = [self.get(pynvml.nvmlDeviceGetUUID, h) for h in self.handles]
        self.gpu_names = self.names()

    def sample(self) -> list[GpuSample]:
        """Read every GPU once; unavailable values are None."""
        nv = self.nv
        t = time.monotonic()
        out = []
        for i, h in enumerate(self.handles):
            mw = self.get(nv.nvmlDeviceGetPowerUsage, h)
            util = self.get(nv.nvmlDeviceGetUtilizationRates, h)
            out.append(GpuSample(
                t=t, index=i, uuid=self.uuids[i], name=self.gpu_names[i],
                graphics_mhz=self.get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_GRAPHICS),
                sm_mhz=self.get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                memory_mhz=self.get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                power_w=mw / 1000.0 if mw is not None else None,
                temperature_c=self.get(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                utilization_pct=util.gpu if util is not None else None))
        return out


def open_source() -> tuple[TelemetrySource | None, str]:
    """The best available source and a description (`ds4deploy.bench.gpu.open_gpu`): (NvmlSource, "nvml: N GPU(s)
    (names)"), (SmiSource, "nvidia-smi: N GPU(s)"), or (None, "unavailable: no NVIDIA GPU (<why NVML and nvidia-smi
    failed>)")."""
    src, desc = open_gpu(NvmlSource, SmiSource)
    return (src, desc) if src is not None else (None, f"{NO_GPU} ({desc})")


class Sampler:
    """Context manager sampling `source` every `interval_s` in a daemon thread while a cell runs.

    `on_sample` (optional) is called with every round of samples from the sampler thread (the clock sweep's
    over-temperature guard uses it). A source that fails mid-cell stops sampling; the failure is kept in `error`
    and reported in the cell's telemetry, it does not fail the cell.
    """

    def __init__(self, source: TelemetrySource | None, reason: str = NO_GPU, interval_s: float = SAMPLE_INTERVAL_S,
                 on_sample=None) -> None:
        self.source = source
        self.reason = reason
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.samples: list[GpuSample] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        assert self.source is not None
        while True:
            try:
                got = self.source.sample()
            except Exception as exc:  # keep the cell, say why telemetry stopped
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.samples.extend(got)
            if self.on_sample is not None:
                self.on_sample(got)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Sampler:
        if self.source is not None:
            self._thread = threading.Thread(target=self._loop, name="gpu-telemetry", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self.source is not None and self.error is None:
                try:  # one last reading so a short cell still has its end state
                    self.samples.extend(self.source.sample())
                except Exception as e:
                    self.error = f"{type(e).__name__}: {e}"

    def cell_summary(self, aggregate_tok_s: float | None) -> dict:
        """The cell's ``telemetry`` record (see `summarize_samples`)."""
        if self.source is None:
            return {"status": self.reason.split(" (")[0], "detail": self.reason}
        return summarize_samples(self.samples, aggregate_tok_s, self.source.name, self.interval_s, self.error)


def _mean(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def _max(vals: list):
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def summarize_samples(samples: list[GpuSample], aggregate_tok_s: float | None, source: str,
                      interval_s: float = SAMPLE_INTERVAL_S, error: str | None = None) -> dict:
    """Reduce one cell's samples.

    Returns a JSON-ready dict: ``status`` ("ok", or "no samples"), ``source``, ``interval_s``, ``rounds``, ``gpus``
    (per GPU: index, uuid, name, mean graphics/SM/memory MHz, mean and max power W, max temperature C, mean
    utilization %), ``power_w_mean`` / ``power_w_max`` (W, the sum over GPUs per sampling round, then the mean / max
    over rounds; None if any GPU's power is N/A in every round), ``tok_s_per_w`` (aggregate output tok/s /
    power_w_mean; None without power), ``temperature_c_max``, ``error`` (why sampling stopped early, or None).
    """
    if not samples:
        return {"status": "no samples", "source": source, "interval_s": interval_s, "rounds": 0, "gpus": [],
                "power_w_mean": None, "power_w_max": None, "tok_s_per_w": None, "temperature_c_max": None,
                "error": error}
    by_gpu: dict[int, list[GpuSample]] = {}
    rounds: dict[float, list[GpuSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.index, []).append(s)
        rounds.setdefault(s.t, []).append(s)
    gpus = []
    for idx in sorted(by_gpu):
        ss = by_gpu[idx]
        gpus.append({
            "index": idx, "uuid": ss[0].uuid, "name": ss[0].name,
            "graphics_mhz_mean": _mean([s.graphics_mhz for s in ss]), "sm_mhz_mean": _mean([s.sm_mhz for s in ss]),
            "memory_mhz_mean": _mean([s.memory_mhz for s in ss]),
            "power_w_mean": _mean([s.power_w for s in ss]), "power_w_max": _max([s.power_w for s in ss]),
            "temperature_c_max": _max([s.temperature_c for s in ss]),
            "utilization_pct_mean": _mean([s.utilization_pct for s in ss]),
        })
    # Total power per round only where every GPU of the round reported power (a partial sum would understate it).
    totals = [sum(s.power_w for s in rs) for rs in rounds.values()
              if len(rs) == len(by_gpu) and all(s.power_w is not None for s in rs)]
    p_mean = statistics.fmean(totals) if totals else None
    return {
        "status": "ok", "source": source, "interval_s": interval_s, "rounds": len(rounds), "gpus": gpus,
        "power_w_mean": p_mean, "power_w_max": max(totals) if totals else None,
        "tok_s_per_w": aggregate_tok_s / p_mean if p_mean and aggregate_tok_s is not None else None,
        "temperature_c_max": _max([s.temperature_c for s in samples]),
        "error": error,
    }


def markdown_lines(cells: list[dict], source: str | None) -> list[str]:
    """The markdown section on GPU telemetry: one line when no cell has readings (saying why), else a table per
    cell: mean graphics clock per GPU (MHz), mean and max total power (W), tok/s per W, max temperature (C), mean
    utilization per GPU (%). N/A values print as '-'."""
    tels = [(c, c.get("telemetry") or {}) for c in cells]
    if not any(t.get("status") == "ok" for _c, t in tels):
        why = source or next((t.get("detail") or t.get("status") for _c, t in tels if t), None) or NO_GPU
        return [f"GPU telemetry: {why}; no power, clock or temperature figures."]

    def per_gpu(t: dict, key: str, fmt: str) -> str:
        return " / ".join("-" if g.get(key) is None else format(g[key], fmt) for g in t.get("gpus") or []) or "-"

    def num(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"GPU telemetry ({source or 'sampled'}; every {SAMPLE_INTERVAL_S:g} s during each cell, per GPU "
             "values separated by /):", "",
             "| cell | graphics MHz | power W mean / max (all GPUs) | tok/s per W | max temp C | util % |",
             "|---" * 6 + "|"]
    for c, t in tels:
        if t.get("status") != "ok":
            lines.append(f"| {c['cell_id']} | {t.get('status', '-')} | | | | |")
            continue
        lines.append(f"| {c['cell_id']} | {per_gpu(t, 'graphics_mhz_mean', '.0f')} | {num(t['power_w_mean'], '.1f')} / "
                     f"{num(t['power_w_max'], '.1f')} | {num(t['tok_s_per_w'], '.2f')} | "
                     f"{num(t['temperature_c_max'], 'd')} | {per_gpu(t, 'utilization_pct_mean', '.0f')} |")
    return lines
