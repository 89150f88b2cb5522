"""The supervisor's decisions (ds4deploy.operate.supervisor.supervise) on a scripted fake group and a fake clock:
when it
restarts, how its backoff doubles and resets after a stable period, and when it gives up (exit 3). Nothing sleeps:
the injected `sleep` advances the injected clock."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ds4deploy.core.errors import UserError
from ds4deploy.operate.incidents import Incident
from ds4deploy.operate.progress import Reading
from ds4deploy.operate.supervisor import (
    GAVE_UP_EXIT,
    HEALTH_LATE,
    Journal,
    Policy,
    make_targets,
    supervise,
    supervise_all,
)
from ds4deploy.plan.nodes import Node
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT

IDLE = Reading(0, 0, (("vllm:generation_tokens_total", 0.0),))


class FakeClock:
    """Monotonic seconds that only move when the supervisor sleeps or the fake restart takes time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class FakeGroup:
    """A node group whose health follows a script: `script[i]` is the head's health at check i (True = 200 and a
    completion answers); after the script ends the group stays healthy. `restart_ok[j]` is the outcome of restart j
    (missing entries succeed); each restart takes `restart_s` on the clock."""

    clock: FakeClock
    script: list[bool]
    restart_ok: list[bool] = field(default_factory=list)
    restart_s: float = 5.0
    recipe: object = None
    url: str = "http://127.0.0.1:8010"
    nodes: list = field(default_factory=lambda: [Node("a", 0, "head", "10.0.0.1", "10.0.0.1", "compose.head.yaml",
                                                       "a:22")])
    checks: int = 0
    restarts: list[float] = field(default_factory=list)
    incidents: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.recipe = load_recipe("cpu")

    def _now_ok(self) -> bool:
        return self.script[self.checks - 1] if self.checks <= len(self.script) else True

    def container_states(self) -> dict[str, str]:
        return {"a": "running"}

    def health(self, timeout_s: float = 5) -> tuple[bool, str]:
        self.checks += 1
        return (True, "GET /health -> 200") if self._now_ok() else (False, "GET /health: ConnectError")

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        return IDLE, ""  # an idle engine: the probe decides, as before the progress counters were read

    def progress(self, timeout_s: float) -> tuple[bool, str]:
        return True, "one-token completion in 0.01 s"

    def collect(self, reason: str) -> Incident:
        self.incidents.append(reason)
        return Incident(Path(f"/incidents/{len(self.incidents)}"))

    def restart(self, timeout_s: float, log, incident=None) -> tuple[bool, float]:
        assert incident == Path(f"/incidents/{len(self.incidents)}"), "the restart follows its own incident"
        self.restarts.append(self.clock.now)
        ok = self.restart_ok[len(self.restarts) - 1] if len(self.restarts) <= len(self.restart_ok) else True
        self.clock.now += self.restart_s
        return ok, self.restart_s


def _events(journal: Journal) -> list[dict]:
    return [json.loads(line) for line in journal.path.read_text().splitlines()]


def _run(tmp_path, group: FakeGroup, policy: Policy, cycles: int) -> tuple[int, list[dict]]:
    journal = Journal(tmp_path / "sup.jsonl")
    rc = supervise(group, policy, journal, max_cycles=cycles, sleep=group.clock.sleep, clock=group.clock)
    return rc, _events(journal)


POLICY = dict(interval_s=10, failures_to_restart=1, probe_every_s=30, probe_timeout_s=60, backoff_s=10,
              backoff_max_s=80, restart_timeout_s=600)


def test_failed_restarts_back_off_doubling_up_to_the_cap(tmp_path):
    clock = FakeClock()
    group = FakeGroup(clock, script=[False] * 6, restart_ok=[False] * 6)
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=10, window_s=3600), cycles=6)
    assert rc == 0
    assert [e["seconds"] for e in events if e["event"] == "backoff"] == [10, 20, 40, 80, 80, 80]
    assert clock.sleeps == [10, 20, 40, 80, 80, 80]
    assert len(group.restarts) == 6
    # Every restart is preceded by its own incident, named in the journal's failure and outcome events.
    assert [e["incident"] for e in events if e["event"] == "failure"] == [f"/incidents/{i}" for i in range(1, 7)]
    assert [e["incident"] for e in events if e["event"] == "restart-failed"] == [f"/incidents/{i}"
                                                                                for i in range(1, 7)]


def test_gives_up_with_exit_3_after_the_restart_budget(tmp_path):
    clock = FakeClock()
    group = FakeGroup(clock, script=[False] * 10)
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=3, window_s=3600), cycles=10)
    assert rc == GAVE_UP_EXIT
    assert len(group.restarts) == 3  # the 4th failure inside the window is not restarted
    assert events[-1]["event"] == "gave-up"
    assert events[-1]["restarts_in_window"] == 3
    assert [e["event"] for e in events].count("restarted") == 3


def test_restarts_older_than_the_window_do_not_count(tmp_path):
    clock = FakeClock()
    # One failure, then a long healthy run (60 checks x 10 s = 600 s > window), repeated: never more than one
    # restart inside any 300 s window, so a budget of 1 is never exhausted.
    script = ([False] + [True] * 60) * 3
    group = FakeGroup(clock, script=script)
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=1, window_s=300), cycles=len(script))
    assert rc == 0
    assert len(group.restarts) == 3
    assert "gave-up" not in [e["event"] for e in events]


def test_backoff_resets_after_a_stable_period(tmp_path):
    clock = FakeClock()
    # Three failed restarts (backoff 10, 20, 40), a successful one, then healthy for 8 checks x 10 s = 80 s
    # (= backoff_max_s, the stable period), then a failure whose restart fails: its backoff starts at 10 again.
    script = [False] * 4 + [True] * 9 + [False]
    group = FakeGroup(clock, script=script, restart_ok=[False, False, False, True, False])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=10, window_s=3600), cycles=len(script))
    assert rc == 0
    assert [e["seconds"] for e in events if e["event"] == "backoff"] == [10, 20, 40, 10]


def test_backoff_is_kept_when_the_group_was_not_stable_long_enough(tmp_path):
    clock = FakeClock()
    # Same as above but healthy for only 3 checks (30 s < 80 s): the next failed restart waits 80 s (40 doubled).
    script = [False] * 4 + [True] * 3 + [False]
    group = FakeGroup(clock, script=script, restart_ok=[False, False, False, True, False])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=10, window_s=3600), cycles=len(script))
    assert rc == 0
    assert [e["seconds"] for e in events if e["event"] == "backoff"] == [10, 20, 40, 80]


def test_one_miss_is_not_a_restart_when_two_are_needed(tmp_path):
    clock = FakeClock()
    group = FakeGroup(clock, script=[True, False, True, False, False, True])
    policy = Policy(**{**POLICY, "failures_to_restart": 2}, max_restarts=5, window_s=3600)
    rc, events = _run(tmp_path, group, policy, cycles=6)
    assert rc == 0
    assert len(group.restarts) == 1  # only the two misses in a row (checks 4 and 5)
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["reason"] == "unhealthy"


@dataclass
class WorkerDiesDuringProbe(FakeGroup):
    """Two nodes; the worker's container dies while the progress probe waits, so the probe times out while the
    head still answers /health (the race CI hit: a killed worker was first reported as "wedged")."""

    nodes: list = field(default_factory=lambda: [
        Node("a", 0, "head", "10.0.0.1", "10.0.0.1", "compose.head.yaml", "a:22"),
        Node("b", 1, "worker", "10.0.0.2", "10.0.0.1", "compose.worker.yaml", "b:22")])
    worker: str = "running"

    def container_states(self) -> dict[str, str]:
        return {"a": "running", "b": self.worker}

    def progress(self, timeout_s: float) -> tuple[bool, str]:
        if self.restarts:
            return True, "one-token completion in 0.01 s"
        self.worker = "exited"
        return False, f"no completion in {timeout_s} s"

    def restart(self, timeout_s: float, log, incident=None) -> tuple[bool, float]:
        self.worker = "running"
        return super().restart(timeout_s, log, incident)


def test_a_container_that_died_during_the_probe_is_named_not_called_wedged(tmp_path):
    group = WorkerDiesDuringProbe(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=3)
    assert rc == 0 and len(group.restarts) == 1
    failure = next(e for e in events if e["event"] == "failure")
    assert (failure["reason"], failure["detail"], failure["states"]) == (
        "engine-down", "b: exited", {"a": "running", "b": "exited"})


def test_a_kill_docker_ps_has_not_seen_yet_is_named_from_the_saved_states(tmp_path):
    """`docker ps` still says running (both reads), but the states saved with the logs show the worker exited:
    the failure is the dead worker, not a wedge."""
    group = WorkerDiesDuringProbe(FakeClock(), script=[])
    group.container_states = lambda: {"a": "running", "b": "running"}
    group.collect = lambda reason: (group.incidents.append(reason),
                                    Incident(Path(f"/incidents/{len(group.incidents)}"), stopped={"b": "exited"}))[1]
    _rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=3)
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["reason"] == "engine-down", failure
    assert failure["detail"].startswith("b: exited (first seen as wedged: ") and failure["states"]["b"] == "exited"


def test_a_wedge_with_every_container_running_stays_wedged(tmp_path):
    group = WorkerDiesDuringProbe(FakeClock(), script=[])
    group.container_states = lambda: {"a": "running", "b": "running"}  # the probe fails, nothing died
    _rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=3)
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["reason"] == "wedged" and "no completion" in failure["detail"]


@dataclass
class DaemonRestarts(FakeGroup):
    """Two nodes through a Docker daemon restart: `states[i]` is what check i sees (after the script ends, or after
    a restart, both run). While the daemon is down `docker ps` fails, so the node reads "unknown (...)"; when it is
    back, the engines are "exited" (restart policy "no")."""

    nodes: list = field(default_factory=lambda: [
        Node("a", 0, "head", "10.0.0.1", "10.0.0.1", "compose.head.yaml", "a:22"),
        Node("b", 1, "worker", "10.0.0.2", "10.0.0.1", "compose.worker.yaml", "b:22")])
    states: list = field(default_factory=list)
    seen: int = 0

    def container_states(self) -> dict[str, str]:
        self.seen += 1
        if self.restarts or self.seen > len(self.states):
            return {"a": "running", "b": "running"}
        return dict(self.states[self.seen - 1])


DOWN = "unknown (Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?)"


def test_a_daemon_that_does_not_answer_is_waited_for_not_restarted(tmp_path):
    # 30 checks (300 s) without a daemon, then both engines exited: one restart, and a budget of 1 is not spent
    # by the wait (before, every check of the outage was a failed restart and the supervisor gave up).
    states = [{"a": DOWN, "b": DOWN}] * 30 + [{"a": "exited", "b": "exited"}]
    group = DaemonRestarts(FakeClock(), script=[], states=states)
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=1, window_s=3600), cycles=40)
    assert rc == 0
    assert len(group.restarts) == 1
    kinds = [e["event"] for e in events]
    assert kinds.count("unreachable") == 1 and kinds.count("reachable") == 1, kinds
    assert kinds.index("unreachable") < kinds.index("reachable") < kinds.index("failure"), kinds
    assert next(e for e in events if e["event"] == "reachable")["seconds"] == 300
    failure = next(e for e in events if e["event"] == "failure")
    assert (failure["reason"], failure["detail"]) == ("engine-down", "a: exited, b: exited")
    assert group.incidents == ["supervisor: engine-down (a: exited, b: exited)"]


def test_one_node_unreachable_is_waited_for_too(tmp_path):
    # The worker's host reboots (ssh to its daemon fails) while the head still runs: no restart can reach it.
    states = [{"a": "running", "b": "unknown (ssh: connect to host 10.0.0.2 port 22: No route to host)"}] * 50
    group = DaemonRestarts(FakeClock(), script=[], states=states)
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=1, window_s=3600), cycles=50)
    assert rc == 0 and group.restarts == [] and group.incidents == []
    assert [e["event"] for e in events] == ["start", "unreachable"]
    assert "b: unknown (ssh: connect" in events[1]["detail"]


@dataclass
class BusyEngine(FakeGroup):
    """A one-sequence engine (max_num_seqs 1) working through a long request: one running, `waiting` queued, its
    generated-token counter moving by `step` tokens per check (0 = frozen, as a SIGSTOPped engine core). Its probe
    would wait behind the request and time out, as the probe did before the counters were read."""

    step: float = 100.0
    waiting: float = 1.0
    tokens: float = 0.0
    probes: int = 0

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        self.tokens += self.step
        return Reading(1, self.waiting, (("vllm:generation_tokens_total", self.tokens),)), ""

    def progress(self, timeout_s: float) -> tuple[bool, str]:
        self.probes += 1
        self.clock.now += timeout_s
        return False, f"no completion within {timeout_s:g} s"


def test_a_busy_engine_is_never_probed_nor_restarted(tmp_path):
    # 100 checks x 10 s = 1,000 s of one long request with a queue behind it: far past the probe timeout (60 s)
    # and the progress bound (120 s), but its counters move every check.
    group = BusyEngine(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600, progress_bound_s=120),
                      cycles=100)
    assert rc == 0
    assert group.restarts == [] and group.probes == 0
    assert [e["state"] for e in events if e["event"] == "engine"] == ["busy"]


def test_a_busy_engine_that_stops_moving_is_restarted_after_the_bound(tmp_path):
    group = BusyEngine(FakeClock(), script=[], step=0.0)  # running and queued, no counter moves: frozen
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600, progress_bound_s=120),
                      cycles=14)
    assert rc == 0 and group.probes == 0
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["reason"] == "wedged" and "no progress counter moved for 120 s" in failure["detail"]
    assert group.restarts == [120.0]  # the first reading at 0 s, the bound reached at the 13th check


@dataclass
class LateMetricsUnderLoad(BusyEngine):
    """A busy engine whose API server answers /metrics late under the queue: every other reading times out (as the
    5 s readings of before did under the e2e load, 2026-12-01); a probe sent then would wait behind the queue."""

    calls: int = 0

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        self.calls += 1
        if self.calls % 2 == 0:
            self.clock.now += timeout_s
            return None, "GET /metrics: ReadTimeout"
        return super().reading(timeout_s)


def test_a_late_metrics_answer_under_load_is_not_a_wedge(tmp_path):
    group = LateMetricsUnderLoad(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600, progress_bound_s=120),
                      cycles=40)
    assert rc == 0 and group.restarts == [] and group.probes == 0
    assert {e["state"] for e in events if e["event"] == "engine"} == {"busy"}


@dataclass
class LateHealthUnderLoad(BusyEngine):
    """A busy engine whose API server answers /health late under its queue (as vLLM's did past 5 s on the 2-core CI
    host, 2026-12-03, and the group was restarted under the load): from the second check on, /health times out."""

    def health(self, timeout_s: float = 5) -> tuple[bool, str]:
        self.checks += 1
        if self.checks == 1:
            return True, "GET /health -> 200"
        self.clock.now += timeout_s
        return False, f"{HEALTH_LATE} {timeout_s:g} s"


# Five restarts an hour allowed, and a work in progress judged stuck after 120 s without a counter moving.
LATE_POLICY = Policy(**POLICY, max_restarts=5, window_s=3600, progress_bound_s=120)


def test_a_late_health_answer_while_the_engine_works_is_not_a_failure(tmp_path):
    group = LateHealthUnderLoad(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, LATE_POLICY,
                      cycles=40)
    assert rc == 0 and group.restarts == [] and group.probes == 0
    late = [e for e in events if e["event"] == "health-late"]
    assert len(late) == 1 and late[0]["detail"].startswith(f"{HEALTH_LATE} 5 s, while the engine works"), late


def test_a_late_health_answer_is_a_failure_when_the_counters_stop(tmp_path):
    # Running and queued but frozen: once no counter moved for the bound, late /health answers are misses again.
    group = LateHealthUnderLoad(FakeClock(), script=[], step=0.0)
    rc, events = _run(tmp_path, group, LATE_POLICY,
                      cycles=40)
    assert rc == 0
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["reason"] == "unhealthy" and failure["detail"].startswith(HEALTH_LATE), failure
    assert group.restarts


def test_a_late_health_answer_of_an_idle_engine_is_a_failure(tmp_path):
    group = LateHealthUnderLoad(FakeClock(), script=[], step=0.0, waiting=0.0)
    group.reading = lambda timeout_s=5: (IDLE, "")  # nothing running or queued: nothing explains the late answer
    group.progress = lambda timeout_s: (True, "one-token completion in 0.01 s")  # its first, healthy check
    rc, events = _run(tmp_path, group, LATE_POLICY,
                      cycles=3)
    assert rc == 0
    assert [e["reason"] for e in events if e["event"] == "failure"][:1] == ["unhealthy"]
    assert not [e for e in events if e["event"] == "health-late"]


@dataclass
class MetricsGoneAfterBusy(BusyEngine):
    """Busy at the first reading, then /metrics never answers again (nor does the probe): a hung API server."""

    calls: int = 0

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        self.calls += 1
        if self.calls == 1:
            return super().reading(timeout_s)
        self.clock.now += timeout_s
        return None, "GET /metrics: ReadTimeout"


def test_metrics_unreadable_past_the_bound_falls_back_to_the_probe(tmp_path):
    group = MetricsGoneAfterBusy(FakeClock(), script=[])
    _rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=1, window_s=3600, progress_bound_s=120),
                       cycles=20)
    assert group.probes >= 1 and len(group.restarts) == 1
    assert [e["state"] for e in events if e["event"] == "engine"][:2] == ["busy", "unreadable"]


@dataclass
class FrozenWhileIdle(FakeGroup):
    """An idle engine whose core is frozen (SIGSTOP): its counters never move and the probe never answers."""

    probes: int = 0

    def progress(self, timeout_s: float) -> tuple[bool, str]:
        self.probes += 1
        self.clock.now += timeout_s
        if self.restarts:
            return True, "one-token completion in 0.01 s"
        return False, f"no completion within {timeout_s:g} s"


def test_an_idle_engine_that_does_not_answer_its_probe_is_wedged(tmp_path):
    group = FrozenWhileIdle(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=3)
    assert rc == 0 and group.probes >= 1 and len(group.restarts) == 1
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["reason"] == "wedged" and "no completion within 60 s" in failure["detail"]


@dataclass
class BusyAfterTheReading(FrozenWhileIdle):
    """Idle at the reading (the supervisor's first reading at its start and its first check's), then a user's long
    request arrives first: the probe waits behind it and times out, but the engine's counters moved meanwhile."""

    readings: int = 0

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        self.readings += 1
        return (IDLE if self.readings <= 2 else Reading(1, 1, (("vllm:generation_tokens_total", 5.0 *
                                                                self.readings),))), ""


def test_a_probe_that_waited_behind_new_work_is_not_a_wedge(tmp_path):
    group = BusyAfterTheReading(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=5)
    assert rc == 0 and group.restarts == [] and group.probes == 1
    assert [e["event"] for e in events].count("probe-waited") == 1


@dataclass
class NoCounters(FrozenWhileIdle):
    """An engine whose /metrics does not answer: the probe decides, as before."""

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        return None, "GET /metrics: ReadTimeout"


def test_without_counters_the_probe_decides(tmp_path):
    group = NoCounters(FakeClock(), script=[])
    _rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=3)
    assert len(group.restarts) == 1
    assert next(e for e in events if e["event"] == "engine")["state"] == "unreadable"


def test_the_journal_never_records_a_secret_and_keeps_paths(tmp_path, capsys):
    """A detail that carries a URL password or an Authorization header (an HTTP error text, say) is written and
    printed masked; an incident folder's path (a timestamped name the entropy rule would take for a token) is kept."""
    journal = Journal(tmp_path / "sup.jsonl")
    token = "sk-" + "Q7fz9KpL2mXw4RtY8vBn6cHj3dGs5aEu"
    folder = "/var/lib/ds4deploy/incidents/cpu-2node-tp/20261201T161530Z-engine-down"
    rec = journal.write("failure", detail=f"GET https://ops:hunter2pass@mirror.example/health: 401; "
                                          f"Authorization: Bearer {token}", incident=folder, seconds=3.5)
    written = (tmp_path / "sup.jsonl").read_text() + capsys.readouterr().out
    assert "hunter2pass" not in written and token not in written
    assert rec["incident"] == folder and rec["seconds"] == 3.5 and "mirror.example/health: 401" in rec["detail"]


@dataclass
class ComeAndGo(FrozenWhileIdle):
    """Short requests that come and go between readings: the scheduler's gauges read 0 running, 0 waiting at every
    reading while the token counters rise (the cpu stack under 16 clients, 2026-12-03). A probe would wait behind
    them and time out."""

    tokens: float = 0

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        self.tokens += 1024
        return Reading(0, 0, (("vllm:generation_tokens_total", self.tokens), ("vllm:num_requests_running", 0.0))), ""


def test_work_between_readings_is_busy_from_the_first_check(tmp_path):
    group = ComeAndGo(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=5)
    assert rc == 0 and group.restarts == [] and group.probes == 0
    assert [e["state"] for e in events if e["event"] == "engine"] == ["busy"], events


@dataclass
class ProbeCounts(FrozenWhileIdle):
    """An idle engine whose counters move only by the supervisor's own probes (one token each)."""

    tokens: float = 0

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        return Reading(0, 0, (("vllm:generation_tokens_total", self.tokens),)), ""

    def progress(self, timeout_s: float) -> tuple[bool, str]:
        self.probes += 1
        self.tokens += 1
        return True, "one-token completion in 0.01 s"


def test_the_probe_s_own_token_is_not_work(tmp_path):
    group = ProbeCounts(FakeClock(), script=[])
    rc, events = _run(tmp_path, group, Policy(**POLICY, max_restarts=5, window_s=3600), cycles=12)
    assert rc == 0 and group.probes >= 3
    assert [e["state"] for e in events if e["event"] == "engine"] == ["idle"], events


@dataclass
class Replica(FakeGroup):
    """One replica of a one-node recipe on its own host (`make_targets`). `checked` is set once it has answered
    `wait_checks` health checks; a restart waits (up to 10 s) for `restart_waits_for`, recording whether it came."""

    replica: str = ""
    wait_checks: int = 0
    checked: threading.Event = field(default_factory=threading.Event)
    restart_waits_for: threading.Event | None = None
    waited: list[bool] = field(default_factory=list)

    def health(self, timeout_s: float = 5) -> tuple[bool, str]:
        out = super().health(timeout_s)
        if self.checks >= self.wait_checks:
            self.checked.set()
        return out

    def restart(self, timeout_s: float, log, incident=None) -> tuple[bool, float]:
        if self.restart_waits_for is not None:
            self.waited.append(self.restart_waits_for.wait(10))
        return super().restart(timeout_s, log, incident)


def _replica(name: str, script: list[bool], **kw) -> Replica:
    return Replica(FakeClock(), script=script, url=f"http://{name}:8020", replica=name,
                   nodes=[Node(name, 0, "single", "", "", "compose.yaml", name)], **kw)


def test_replicas_are_watched_and_restarted_each_alone(tmp_path):
    """Two replicas of a one-node recipe (`supervise_all`, real threads and short real intervals): box-a fails its
    health twice and is restarted, its restart going on while box-b is being checked (box-a's restart waits for
    box-b's third check: watched one after the other, it would wait in vain); box-b, healthy, is never restarted;
    every record names its host, the failure and the restart box-a's."""
    b = _replica("box-b", [], wait_checks=3)
    a = _replica("box-a", [False, False], restart_waits_for=b.checked)
    journal = Journal(tmp_path / "sup.jsonl")
    fast = Policy(**{**POLICY, "interval_s": 0.01, "backoff_s": 0.01, "backoff_max_s": 0.01}, max_restarts=5,
                  window_s=3600)
    assert supervise_all([a, b], fast, journal, max_cycles=6) == 0
    assert len(a.restarts) >= 1 and all(a.waited) and b.restarts == []
    events = _events(journal)
    assert {e["host"] for e in events} == {"box-a", "box-b"}
    assert {e["host"] for e in events if e["event"] in ("failure", "restarted")} == {"box-a"}


def test_a_replica_whose_watch_crashes_is_journaled_and_the_others_go_on(tmp_path):
    class Broken(Replica):
        def container_states(self) -> dict[str, str]:
            raise RuntimeError("docker CLI missing")

    broken = Broken(FakeClock(), script=[], url="http://box-a:8020", replica="box-a",
                    nodes=[Node("box-a", 0, "single", "", "", "compose.yaml", "box-a")])
    journal = Journal(tmp_path / "sup.jsonl")
    fast = Policy(**{**POLICY, "interval_s": 0.01}, max_restarts=5, window_s=3600)
    assert supervise_all([broken, _replica("box-b", [])], fast, journal, max_cycles=3) == 1
    events = _events(journal)
    assert [e for e in events if e["event"] == "crashed"] == [
        {**e, "host": "box-a", "detail": "RuntimeError: docker CLI missing"} for e in events if e["event"] == "crashed"]
    assert len([e for e in events if e["event"] == "crashed"]) == 1
    assert any(e["host"] == "box-b" and e["event"] == "start" for e in events)


@pytest.mark.tool
def test_one_node_recipe_on_two_hosts_is_two_targets_each_restarted_alone(tmp_path):
    """`make_targets` (ansible-inventory reads the inventory): the lan variant of cpu-llamacpp on box-a and box-b is a
    target per host at its own address, whose restart play is limited to it (ds4_replica) and which holds the one
    lock of the recipe's replicas; one host is one target restarting the group; --url is refused for replicas. The
    key comes from this host's key file here (no stack runs on these hosts)."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "office.env").write_text("VLLM_API_KEY=ds4-" + "k" * 40 + "\n")
    base = yaml.safe_load((REPO_ROOT / "recipes" / "cpu-llamacpp.yaml").read_text())
    base.pop("variants")
    base["serving"]["bind_address"] = "0.0.0.0"
    base["serving"]["auth"]["key_file"] = str(secrets / "office.env")
    path = tmp_path / "cpu-llamacpp.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    recipe = load_recipe(str(path))
    # No Docker daemon answers at these addresses: the keys come from the key file.
    hosts = {"box-a": {"ansible_host": "10.0.0.11", "ds4_docker_host": f"unix://{tmp_path}/none-a.sock"},
             "box-b": {"ansible_host": "10.0.0.12", "ds4_docker_host": f"unix://{tmp_path}/none-b.sock"}}
    inv = tmp_path / "office.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    targets = make_targets(recipe, inv)
    assert [(t.url, [n.name for n in t.nodes], t.replica) for t in targets] == [
        ("http://10.0.0.11:8020", ["box-a"], "box-a"), ("http://10.0.0.12:8020", ["box-b"], "box-b")]
    assert all(t.inventory == inv and t.key == "ds4-" + "k" * 40 for t in targets)
    assert targets[0].restart_lock is targets[1].restart_lock is not None
    with pytest.raises(UserError, match="runs a replica on each of 2 hosts"):
        make_targets(recipe, inv, url="http://10.0.0.11:8020")
    (secrets / "office.env").unlink()
    with pytest.raises(UserError, match="cpu-llamacpp on box-a: its stack is not running and this host has no"):
        make_targets(recipe, inv)
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"box-a": hosts["box-a"]}}}))
    with pytest.raises(UserError, match="cpu-llamacpp on box-a: its stack is not running and this host has no"):
        make_targets(recipe, inv)  # one host: its head's key is read the same way
    (secrets / "office.env").write_text("VLLM_API_KEY=ds4-" + "k" * 40 + "\n")
    (only,) = make_targets(recipe, inv)
    assert only.replica is None and only.restart_lock is None and only.url == "http://10.0.0.11:8020"
    assert only.key == "ds4-" + "k" * 40
