"""GPU telemetry (ds4deploy.bench.telemetry): N/A values stay None (never 0) from real nvidia-smi captures
(fixtures/parsers/SOURCES.md) and from NVML errors; per-cell power, tok/s per W and temperature; a host without a
GPU records "unavailable: no NVIDIA GPU"."""

from __future__ import annotations

import shutil
import threading
import time

import pynvml
import pytest

from ds4deploy.bench import telemetry
from ds4deploy.bench.telemetry import GpuSample, NvmlSource, Sampler, samples_from_rows, summarize_samples
from ds4deploy.parsers.nvidia_smi import parse_query_gpu
from tests.unit.parsers._fixtures import fixture_text
from tests.unit.parsers.test_nvidia_smi import GPU_UTILS_FIELDS


def test_gb10_capture_na_fields_become_none():
    (s,) = samples_from_rows(parse_query_gpu(fixture_text("nvidia_smi-smart-city-gb10.txt")), t=1.0)
    assert (s.index, s.name, s.sm_mhz, s.temperature_c, s.utilization_pct) == (0, "NVIDIA GB10", 2528, 44, 66)
    assert s.memory_mhz is None  # [N/A]: unified memory
    assert s.power_w is None and s.graphics_mhz is None  # not in that query


def test_noheader_nounits_capture_with_power():
    (s,) = samples_from_rows(parse_query_gpu(fixture_text("nvidia_smi-gpu-utils-83-noheader-nounits.txt"),
                                             GPU_UTILS_FIELDS), t=1.0)
    assert (s.power_w, s.temperature_c, s.graphics_mhz, s.sm_mhz, s.memory_mhz) == (176.98, 45, 1965, 1965, 7199)
    assert s.uuid == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"


def test_v100_capture_eight_gpus_keep_their_index():
    ss = samples_from_rows(parse_query_gpu(fixture_text("nvidia_smi-dsh-gpu-v100.txt")), t=1.0)
    assert [s.index for s in ss] == list(range(8))
    assert (ss[6].temperature_c, ss[6].utilization_pct) == (51, 100)
    assert all(s.power_w is None for s in ss)


def _round(t: float, powers: list[float | None], temps: list[int | None]) -> list[GpuSample]:
    return [GpuSample(t=t, index=i, power_w=p, temperature_c=c, graphics_mhz=1500)
            for i, (p, c) in enumerate(zip(powers, temps, strict=True))]


def test_cell_power_is_the_sum_over_gpus_per_round():
    samples = _round(0, [20.0, 18.0], [60, 58]) + _round(1, [26.0, 22.0], [67, 62])
    tel = summarize_samples(samples, aggregate_tok_s=54.4, source="nvml")
    assert tel["status"] == "ok" and tel["rounds"] == 2
    assert tel["power_w_mean"] == pytest.approx(43.0) and tel["power_w_max"] == pytest.approx(48.0)
    assert tel["tok_s_per_w"] == pytest.approx(54.4 / 43.0)
    assert tel["temperature_c_max"] == 67
    assert [g["power_w_mean"] for g in tel["gpus"]] == [pytest.approx(23.0), pytest.approx(20.0)]


def test_na_power_gives_no_power_figures_not_zero():
    samples = _round(0, [None, None], [44, None]) + _round(1, [None, None], [45, None])
    tel = summarize_samples(samples, aggregate_tok_s=70.0, source="nvidia-smi")
    assert tel["power_w_mean"] is None and tel["power_w_max"] is None and tel["tok_s_per_w"] is None
    assert tel["temperature_c_max"] == 45
    assert tel["gpus"][1]["temperature_c_max"] is None
    # A round where one GPU's power is N/A is left out of the totals (a partial sum would understate them).
    mixed = _round(0, [30.0, None], [50, 50]) + _round(1, [30.0, 25.0], [50, 50])
    assert summarize_samples(mixed, 10.0, "nvml")["power_w_mean"] == pytest.approx(55.0)


class FakeNvml:
    """pynvml's functions over a GB10-like device: power, temperature, SM clock; memory clock and utilization
    raise NVML's own NOT_SUPPORTED error (the real pynvml exception classes)."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, \
        pynvml.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    @staticmethod
    def _na():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-gb10"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA GB10"

    def nvmlDeviceGetPowerUsage(self, h):
        return 10800  # mW

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 52

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 2405 if clock != pynvml.NVML_CLOCK_MEM else self._na()

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._na()


def test_nvml_source_maps_not_supported_to_none():
    (s,) = NvmlSource(FakeNvml()).sample()
    assert (s.uuid, s.name, s.power_w, s.temperature_c, s.graphics_mhz, s.sm_mhz) == (
        "GPU-gb10", "NVIDIA GB10", 10.8, 52, 2405, 2405)
    assert s.memory_mhz is None and s.utilization_pct is None


def test_sampler_samples_during_the_cell_and_keeps_a_source_failure():
    class Flaky:
        name = "fake"

        def __init__(self):
            self.n = 0

        def sample(self):
            self.n += 1
            if self.n > 3:
                raise RuntimeError("driver went away")
            return [GpuSample(t=time.monotonic(), index=0, power_w=100.0, temperature_c=60)]

    seen = []
    with Sampler(Flaky(), interval_s=0.01, on_sample=seen.append) as s:
        time.sleep(0.3)
    tel = s.cell_summary(aggregate_tok_s=50.0)
    assert tel["status"] == "ok" and tel["rounds"] == 3 and len(seen) == 3
    assert tel["error"] == "RuntimeError: driver went away"
    assert tel["tok_s_per_w"] == pytest.approx(0.5)
    assert not any(t.name == "gpu-telemetry" for t in threading.enumerate())


def test_no_gpu_records_unavailable_never_zeros():
    tel = Sampler(None, "unavailable: no NVIDIA GPU (NVML: x; nvidia-smi not on PATH)").cell_summary(900.0)
    assert tel == {"status": "unavailable: no NVIDIA GPU",
                   "detail": "unavailable: no NVIDIA GPU (NVML: x; nvidia-smi not on PATH)"}
    lines = telemetry.markdown_lines([{"cell_id": "p256-c1-prose", "telemetry": tel}], tel["detail"])
    assert lines == ["GPU telemetry: unavailable: no NVIDIA GPU (NVML: x; nvidia-smi not on PATH); no power, clock "
                     "or temperature figures."]


def test_this_host_has_no_gpu_and_says_why():
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi")
    src, why = telemetry.open_source()
    assert src is None
    assert why.startswith("unavailable: no NVIDIA GPU (") and "nvidia-smi not on PATH" in why


def test_markdown_table_with_readings_prints_na_as_dash():
    ok = summarize_samples(_round(0, [20.0, None], [60, None]), 10.0, "nvml")
    lines = telemetry.markdown_lines([{"cell_id": "p256-c1-prose", "telemetry": ok}], "nvml: 2 GPU(s)")
    row = lines[-1]
    assert row.startswith("| p256-c1-prose | 1500 / 1500 | - / - | - | 60 |")
