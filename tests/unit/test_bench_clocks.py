"""Clock sweep safety (ds4deploy.bench.clocks) against an in-process fake GPU backend whose state lives in a JSON
file, so a real subprocess can drive it, be killed, and the parent can check what the GPU was left at.

Rules under test (docs/bench-harness.md; docs/sources.md#gx10-sweep-safety): journal before any change; wait below
70 C between points; stop above 84 C; restore on normal end, crash, Ctrl-C, SIGTERM and at the next start after a
SIGKILL; never without --yes; no GPU -> one message, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ds4deploy.bench import clocks, plots, report
from ds4deploy.bench.clocks import ClockSweep, GpuState, Journal, SweepInterrupted
from ds4deploy.core.errors import UserError

REPO = Path(__file__).resolve().parents[2]


class FakeBackend:
    """A `ClockBackend` over a JSON state file: per GPU its application clocks, power limit, lock and a queue of
    temperatures (each read pops one, the last one repeats). `log` records every change with whether the GPU's
    journal existed at that moment."""

    name = "fake"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mu = threading.Lock()

    @classmethod
    def create(cls, path: Path, journal_dir: Path, n: int = 2, power: bool = True,
               temps: list[list[int]] | None = None) -> FakeBackend:
        gpus = [{"index": i, "uuid": f"GPU-fake-{i}", "name": "Fake V100", "app": [877, 1290], "def_app": [877, 1290],
                 "power_limit": 250.0 if power else None, "default_power_limit": 300.0 if power else None,
                 "locked": None, "temps": (temps[i] if temps else [40])} for i in range(n)]
        path.write_text(json.dumps({"gpus": gpus, "log": [], "journal_dir": str(journal_dir)}))
        return cls(path)

    @contextmanager
    def _edit(self):
        with self._mu:
            st = json.loads(self.path.read_text())
            yield st
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(st))
            os.replace(tmp, self.path)

    def state(self) -> dict:
        return json.loads(self.path.read_text())

    def _change(self, st: dict, i: int, what: list) -> dict:
        g = st["gpus"][i]
        journal = clocks.journal_path(Path(st["journal_dir"]), g["uuid"]).is_file()
        st["log"].append([*what, i, journal])
        return g

    def gpus(self) -> list[tuple[int, str]]:
        return [(g["index"], g["uuid"]) for g in self.state()["gpus"]]

    def read_state(self, index: int) -> GpuState:
        g = self.state()["gpus"][index]
        return GpuState(index=index, uuid=g["uuid"], name=g["name"], app_memory_mhz=g["app"][0],
                        app_graphics_mhz=g["app"][1], default_app_memory_mhz=g["def_app"][0],
                        default_app_graphics_mhz=g["def_app"][1], power_limit_w=g["power_limit"],
                        default_power_limit_w=g["default_power_limit"])

    def temperature(self, index: int) -> int | None:
        with self._edit() as st:
            t = st["gpus"][index]["temps"]
            return t.pop(0) if len(t) > 1 else t[0]

    def lock_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        with self._edit() as st:
            self._change(st, index, ["lock", min_mhz, max_mhz])["locked"] = [min_mhz, max_mhz]

    def reset_locked_clocks(self, index: int) -> None:
        with self._edit() as st:
            self._change(st, index, ["reset"])["locked"] = None

    def set_power_limit(self, index: int, watts: float) -> None:
        with self._edit() as st:
            self._change(st, index, ["power", watts])["power_limit"] = watts

    def set_app_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        with self._edit() as st:
            self._change(st, index, ["app", memory_mhz, graphics_mhz])["app"] = [memory_mhz, graphics_mhz]

    def set_temps(self, temps: list[int]) -> None:
        with self._edit() as st:
            for g in st["gpus"]:
                g["temps"] = list(temps)


@pytest.fixture
def gpu(tmp_path):
    jdir = tmp_path / "journal"
    return FakeBackend.create(tmp_path / "gpu.json", jdir), jdir


def _restored(b: FakeBackend, power: float | None = 250.0) -> bool:
    return all(g["locked"] is None and g["power_limit"] == power and g["app"] == [877, 1290]
               for g in b.state()["gpus"])


def test_sweep_journals_first_sets_each_cap_and_restores(gpu):
    b, jdir = gpu
    seen = []

    def measure(cap):
        st = b.state()
        seen.append((cap, [g["locked"] for g in st["gpus"]], [g["power_limit"] for g in st["gpus"]]))
        journals = {p.name: Journal.from_json(p.read_text()) for p in jdir.glob("clock-journal-*.json")}
        assert sorted(journals) == ["clock-journal-GPU-fake-0.json", "clock-journal-GPU-fake-1.json"]
        assert all(j.original.power_limit_w == 250.0 and j.changed_clocks for j in journals.values())
        return [{"cell_id": f"p256-c1-prose{clocks.cap_tag(cap)}", "spec": {"prompt_tokens": 256}}]

    said = []
    res = clocks.run_sweep(b, [0, 1], ClockSweep(caps_mhz=[2000, 2400, None], power_limit_w=150), measure, d=jdir,
                           say=said.append, poll_s=0, watch_s=0.01)
    assert seen == [(2000, [[0, 2000]] * 2, [150, 150]), (2400, [[0, 2400]] * 2, [150, 150]),
                    (None, [None, None], [150, 150])]
    assert [r["clock_cap_mhz"] for r in res.records] == [2000, 2400, None]
    assert res.records[0]["cell_id"] == "p256-c1-prose-clk2000" and res.stopped is None
    assert _restored(b) and not list(jdir.glob("clock-journal-*"))
    # Every change happened with the GPU's journal already on disk.
    assert all(entry[-1] for entry in b.state()["log"])
    assert any("power limit 250 W" in line for line in res.restored)


def test_cool_gate_waits_below_70_and_times_out(gpu):
    b, _ = gpu
    b.set_temps([75, 72, 70, 69])
    sleeps = []
    clock = iter(range(100))
    waited = clocks.wait_cool(b, [0], timeout_s=50, poll_s=5, say=lambda _m: None, sleep=sleeps.append,
                              clock=lambda: next(clock))
    assert len(sleeps) == 3  # 75, 72 and 70 are not below 70; 69 is
    assert waited > 0
    b.set_temps([71])
    clock = iter(range(100))
    with pytest.raises(SweepInterrupted, match="did not cool below 70 C within 3 s"):
        clocks.wait_cool(b, [0], timeout_s=3, poll_s=1, say=lambda _m: None, sleep=lambda _s: None,
                         clock=lambda: next(clock))


def test_gpu_without_temperature_does_not_block():
    class NoTemp:
        def temperature(self, _i):
            return None

    assert clocks.wait_cool(NoTemp(), [0], timeout_s=1, poll_s=1, sleep=lambda _s: None) >= 0


def test_sweep_that_never_cools_stops_and_restores(gpu):
    b, jdir = gpu
    b.set_temps([80])
    res = clocks.run_sweep(b, [0, 1], ClockSweep(caps_mhz=[2000], cool_timeout_s=0.01), lambda cap: [], d=jdir,
                           say=lambda _m: None, poll_s=0.001)
    assert res.records == [] and "did not cool below 70 C" in res.stopped
    assert _restored(b) and not list(jdir.glob("clock-journal-*"))


def _hot_measure(b: FakeBackend, hot: list[int], dur: float):
    def measure(cap):
        if cap == 2400:  # the second point heats up
            b.set_temps(hot)
        t0 = time.monotonic()
        while time.monotonic() - t0 < dur:
            time.sleep(0.05)
        return [{"cell_id": f"x{clocks.cap_tag(cap)}", "spec": {"prompt_tokens": 256}}]
    return measure


def test_above_84_c_interrupts_the_point_and_stops(gpu):
    b, jdir = gpu
    t0 = time.monotonic()
    res = clocks.run_sweep(b, [0, 1], ClockSweep(caps_mhz=[2000, 2400, 2800]), _hot_measure(b, [60, 85], 2.0), d=jdir,
                           say=lambda _m: None, poll_s=0, watch_s=0.01)
    assert "reached 85 C, above the sweep's stop limit of 84 C" in res.stopped
    assert [r["clock_cap_mhz"] for r in res.records] == [2000]  # the finished point is kept
    assert time.monotonic() - t0 < 3.5  # the hot point was cut short, the third never ran
    assert _restored(b)


def test_84_c_is_not_above_the_limit(gpu):
    b, jdir = gpu
    res = clocks.run_sweep(b, [0], ClockSweep(caps_mhz=[2000, 2400]), _hot_measure(b, [84], 0.5), d=jdir,
                           say=lambda _m: None, poll_s=0, watch_s=0.01)
    assert res.stopped is None and [r["clock_cap_mhz"] for r in res.records] == [2000, 2400]


@pytest.mark.parametrize("exc", [RuntimeError("engine crashed"), KeyboardInterrupt()])
def test_crash_or_ctrl_c_restores_and_propagates(gpu, exc):
    b, jdir = gpu

    def measure(cap):
        assert b.state()["gpus"][0]["locked"] == [0, 2000]
        raise exc

    with pytest.raises(type(exc)):
        clocks.run_sweep(b, [0, 1], ClockSweep(caps_mhz=[2000], power_limit_w=200), measure, d=jdir,
                         say=lambda _m: None, poll_s=0)
    assert _restored(b) and not list(jdir.glob("clock-journal-*"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers put back


def test_restore_locked_clocks_relocks_instead_of_reset(gpu):
    b, jdir = gpu
    clocks.run_sweep(b, [0], ClockSweep(caps_mhz=[2000]), lambda cap: [], d=jdir, restore_locked=[1522, 1522],
                     say=lambda _m: None, poll_s=0)
    assert b.state()["gpus"][0]["locked"] == [1522, 1522]
    assert clocks.parse_locked("0,2200") == [0, 2200] and clocks.parse_locked(None) is None
    with pytest.raises(UserError, match="MIN,MAX"):
        clocks.parse_locked("2200")
    with pytest.raises(UserError, match="MIN must be <= MAX"):
        clocks.parse_locked("2200,1000")


def test_power_limit_on_a_gpu_without_one_is_refused_before_any_change(tmp_path):
    jdir = tmp_path / "j"
    b = FakeBackend.create(tmp_path / "gb10.json", jdir, n=1, power=False)
    with pytest.raises(UserError, match="reports no power limit"):
        clocks.run_sweep(b, [0], ClockSweep(caps_mhz=[2000], power_limit_w=100), lambda cap: [], d=jdir,
                         say=lambda _m: None, poll_s=0)
    assert [e[0] for e in b.state()["log"]] == ["reset"]  # only the restore ran
    assert not list(jdir.glob("clock-journal-*"))


SWEEP_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ds4deploy.bench import clocks, plots, report
    from tests.unit.test_bench_clocks import FakeBackend

    b = FakeBackend(Path(sys.argv[1]))

    def measure(cap):
        print(f"measuring {cap}", flush=True)
        time.sleep(120)
        return []

    clocks.run_sweep(b, [0, 1], clocks.ClockSweep(caps_mhz=[2000, 2400], power_limit_w=150), measure,
                     d=Path(sys.argv[2]), poll_s=0)
""")


def _start_child(b: FakeBackend, jdir: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SWEEP_CHILD, str(b.path), str(jdir)], cwd=REPO, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    while not (seen and seen[-1].startswith("measuring 2000")):
        line = p.stdout.readline()
        if not line:
            p.kill()
            raise AssertionError("the sweep child ended before measuring: " + "".join(seen))
        seen.append(line)
    assert seen[0].startswith("clock point 2000 MHz"), seen
    return p


def test_sigterm_mid_sweep_restores_the_gpu(gpu):
    b, jdir = gpu
    p = _start_child(b, jdir)
    try:
        st = b.state()
        assert [g["locked"] for g in st["gpus"]] == [[0, 2000]] * 2 and st["gpus"][0]["power_limit"] == 150
        # While the sweep runs, no other benchmark may start on this host.
        with pytest.raises(UserError, match="a clock sweep is running on this host"):
            clocks.recover(lambda: (b, "fake"), jdir, say=lambda _m: None)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=60)[0]
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, out
    assert "SIGTERM received: restoring the GPU clocks" in out
    assert _restored(b) and not list(jdir.glob("clock-journal-*"))


def test_journal_of_a_killed_sweep_is_restored_at_next_start(gpu):
    b, jdir = gpu
    p = _start_child(b, jdir)
    p.kill()  # SIGKILL: no handler, no finally, no atexit
    p.communicate(timeout=60)
    assert [g["locked"] for g in b.state()["gpus"]] == [[0, 2000]] * 2
    assert len(list(jdir.glob("clock-journal-*.json"))) == 2
    said = []
    lines = clocks.recover(lambda: (b, "fake"), jdir, say=said.append)
    assert _restored(b) and not list(jdir.glob("clock-journal-*"))
    assert any(f"a previous clock sweep (pid {p.pid}" in s and "died without restoring GPU 0" in s for s in said)
    assert any("GPU 1 (GPU-fake-1): power limit 250 W" in line for line in lines)
    # Nothing left: the next start is silent.
    assert clocks.recover(lambda: (b, "fake"), jdir, say=said.append) == []


def test_recover_without_journals_opens_no_backend(tmp_path):
    def boom():
        raise AssertionError("backend opened")

    assert clocks.recover(boom, tmp_path / "missing") == []
    (tmp_path / "empty").mkdir()
    assert clocks.recover(boom, tmp_path / "empty") == []


def test_damaged_journal_is_refused_with_the_manual_fix(gpu):
    b, jdir = gpu
    jdir.mkdir()
    (jdir / "clock-journal-GPU-fake-0.json").write_text('{"schema": "ds4deploy-clock-journal/1", "orig')
    with pytest.raises(UserError, match="is damaged") as e:
        clocks.recover(lambda: (b, "fake"), jdir, say=lambda _m: None)
    assert "nvidia-smi -rgc" in e.value.fix


def test_preflight_needs_yes_and_a_gpu():
    assert clocks.preflight(None, yes=False) == (None, [])
    with pytest.raises(UserError, match="changes GPU clocks") as e:
        clocks.preflight(ClockSweep(caps_mhz=[2000]), yes=False)
    assert "--yes" in e.value.fix
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi")
    with pytest.raises(UserError, match="a clock sweep needs an NVIDIA GPU and this host has none"):
        clocks.preflight(ClockSweep(caps_mhz=[2000]), yes=True)


@pytest.mark.parametrize("args", [[], ["--yes"]])
def test_cli_clock_sweep_refused_before_anything(tmp_path, args):
    if args and shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi")
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "bench", "run", "cpu", "--profile", "clock-sweep",
                        "--url", "http://127.0.0.1:9", "--out", str(out), *args], capture_output=True, text=True,
                       cwd=REPO, timeout=120, check=False)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, p.stderr
    assert ("needs an NVIDIA GPU" if args else "changes GPU clocks") in lines[0]
    assert not out.exists()


def _cell(cap, prompt, tok_s, prefill, power=None, temps=(60, 58), valid=True):
    tel = ({"status": "ok", "gpus": [{"graphics_mhz_mean": cap or 2476, "power_w_mean": p, "temperature_c_max": t}
                                     for p, t in zip(power, temps, strict=True)],
            "tok_s_per_w": tok_s / sum(power)} if power else {"status": "unavailable: no NVIDIA GPU"})
    return {"cell_id": f"p{prompt}-c1-prose{clocks.cap_tag(cap)}", "clock_cap_mhz": cap, "valid": valid,
            "spec": {"prompt_tokens": prompt}, "decode_tok_s": tok_s, "aggregate_tok_s": tok_s,
            "prefill_tok_s": prefill, "telemetry": tel}


def test_clock_table_follows_the_seeds_b_layout(tmp_path):
    cells = [_cell(2000, 256, 54.4, 1700, [20.9, 17.7], (67, 62)), _cell(2000, 16384, 50.0, 1794),
             _cell(None, 256, 55.0, 1800, [42.7, 35.7], (75, 72)), _cell(None, 16384, 51.0, 1953, valid=False)]
    lines = report.clock_table(cells)
    assert lines[0] == ("| clock cap MHz | actual MHz | decode t/s | prefill t/s (16,384) | power W | temp C | "
                        "t/s per W |")
    assert lines[2] == "| 2000 | 2000 / 2000 | 54.4 | 1,794 | 20.9 / 17.7 | 67 / 62 | 1.41 |"  # #gx10-clock-caps row 1
    assert lines[3] == "| none | 2476 / 2476 | 55.0 * | 1,953 | 42.7 / 35.7 | 75 / 72 | 0.70 |"
    png, html = plots.write_sweep_plots(cells, tmp_path / "png", tmp_path / "sweep.html", "t")
    assert png.stat().st_size > 10_000 and "per W vs clock cap" in html.read_text()
    no_power = report.clock_table([_cell(1500, 256, 900.0, 30000)])
    assert no_power[2] == "| 1500 | - | 900.0 | 30,000 | - | - | - |"
