"""`ds4deploy nodes wait` (ds4deploy.operate.group_wait.wait_for_group) on a scripted group and a fake clock: the head's
start succeeds once /health answers with every container running, and fails at once, naming the node, when a
node's containers stop while the head waits (the worker that died after its ready line: before, the head waited out
its distributed timeout)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.operate.group_wait import wait_for_group


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

    def health(self, timeout_s: float = 5) -> tuple[bool, str]:
        ok = self.healthy[min(self.checks, len(self.healthy)) - 1]
        return ok, "GET /health -> 200" if ok else "GET /health: ConnectError"

    def sleep(self, s: float) -> None:
        self.now += s


def _wait(group: Scripted, timeout_s: float = 60) -> str:
    return wait_for_group(group, timeout_s, interval_s=2, sleep=group.sleep, clock=lambda: group.now)


def test_the_head_is_waited_for_until_healthy_with_every_node_running():
    group = Scripted(states=[{"node-a": "created", "node-b": "running"}] * 2 + [{"node-a": "running",
                                                                                   "node-b": "running"}],
                     healthy=[False, False, False, False, True])
    assert _wait(group) == "GET /health -> 200"
    assert group.checks == 5 and group.now == 8


def test_a_worker_that_dies_while_the_head_waits_fails_at_once_naming_it():
    group = Scripted(states=[{"node-a": "running", "node-b": "running"}] * 3 + [{"node-a": "running",
                                                                                   "node-b": "exited"}],
                     healthy=[False])
    with pytest.raises(UserError) as err:
        _wait(group, timeout_s=3600)
    assert "node-b: exited while the head waited for its peer node(s)" in str(err.value)
    assert group.now == 6  # the fourth check, not the hour


def test_a_worker_never_started_is_named_missing():
    with pytest.raises(UserError, match="node-b: missing while the head"):
        _wait(Scripted(states=[{"node-a": "running", "node-b": "missing"}], healthy=[False]))


def test_a_daemon_that_does_not_answer_is_waited_for_then_the_timeout_names_it():
    group = Scripted(states=[{"node-a": "running", "node-b": "unknown (Cannot connect to the Docker daemon)"}],
                     healthy=[False])
    with pytest.raises(UserError) as err:
        _wait(group, timeout_s=10)
    assert "within 10 s" in str(err.value) and "node-b: unknown" in str(err.value)
    assert group.now >= 10
