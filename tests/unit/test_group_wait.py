"""`ds4deploy nodes wait` (ds4deploy.operate.group_wait.wait_for_group) on a scripted group and a fake clock: the head's
start succeeds once its engine's healthcheck says healthy, and fails at once, naming the node, when a node's
containers stop (or were never started) while the head waits: the worker that died after its ready line, which
before left the head waiting out its distributed timeout. The Docker reads themselves run for real in the two-node
tier (tests/multinode) and the rehearsal."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.operate.group_wait import WAITED, wait_for_group

RUNNING = {"node-a": "running", "node-b": "running"}


@dataclass
class Scripted:
    """`states[i]` / `healthy[i]`: what check i sees (the last entry repeats)."""

    states: list[dict[str, str]]
    healthy: list[bool] = field(default_factory=lambda: [True])
    checks: int = 0
    now: float = 0.0

    def container_states(self) -> dict[str, str]:
        self.checks += 1
        return self.states[min(self.checks, len(self.states)) - 1]

    def engine_health(self) -> tuple[bool, str]:
        ok = self.healthy[min(self.checks, len(self.healthy)) - 1]
        return ok, "engine-1: healthy" if ok else "engine-1: starting"

    def sleep(self, s: float) -> None:
        self.now += s


def _wait(grp: Scripted, timeout_s: float = 60) -> str:
    return wait_for_group(grp, timeout_s, interval_s=2, sleep=grp.sleep, clock=lambda: grp.now)


def test_the_head_is_waited_for_until_its_engine_is_healthy():
    grp = Scripted(states=[{"node-a": "created", "node-b": "running"}, RUNNING], healthy=[False] * 4 + [True])
    assert _wait(grp) == "engine-1: healthy"
    assert grp.checks == 5 and grp.now == 8


def test_a_worker_that_dies_while_the_head_waits_fails_at_once_naming_it():
    grp = Scripted(states=[RUNNING] * 3 + [{"node-a": "running", "node-b": "exited"}], healthy=[False])
    with pytest.raises(UserError) as err:
        _wait(grp, timeout_s=3600)
    assert f"node-b: exited {WAITED}" in str(err.value) and err.value.code == 1
    assert grp.now == 6  # the fourth check, not the hour


def test_a_worker_never_started_is_named_missing():
    with pytest.raises(UserError, match=re.escape(f"node-b: missing {WAITED}")):
        _wait(Scripted(states=[{"node-a": "running", "node-b": "missing"}], healthy=[False]))


def test_a_daemon_that_does_not_answer_is_waited_for_and_a_healthy_head_still_ends_the_wait():
    unknown = {"node-a": "running", "node-b": "unknown (Cannot connect to the Docker daemon)"}
    assert _wait(Scripted(states=[unknown], healthy=[False, False, True])) == "engine-1: healthy"
    grp = Scripted(states=[unknown], healthy=[False])
    with pytest.raises(UserError) as err:
        _wait(grp, timeout_s=10)
    assert "within 10 s" in str(err.value) and "node-b: unknown" in str(err.value)
    assert grp.now >= 10
