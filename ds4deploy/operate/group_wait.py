"""Wait for a starting multi-node group: the head's GET /health, while every node's containers keep running.

The deploy starts the workers first and the head last; the head then waits at the rendezvous for every worker. A
worker that passed its own start check (its ready line) and died right after leaves the head waiting out its
distributed timeout (torch.distributed's default store timeout is 30 minutes: docs/multinode-cpu.md, section 4;
`--distributed-timeout-seconds` shortens it) and the deploy waiting out the head's health timeout (about an hour on
the GX10 pair). Watching every node's containers while the head starts turns that into a failure within a few
seconds that names the node; the deploy then saves every node's logs (the incident names the worker's first error).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ds4deploy.core.errors import UserError
from ds4deploy.operate.supervisor import UNKNOWN

# Docker container states (`docker ps --format {{.State}}`) of a node that is still starting: a container not yet
# started ("created": the front door waits for the engine's healthcheck) or running. Any other state (exited, dead,
# restarting after an exit, paused, removing) or no container at all ("missing") means the group cannot come up.
STARTING = ("running", "created")


class Group(Protocol):
    """What the wait reads (`ds4deploy.operate.supervisor.Target` has both)."""

    def container_states(self) -> dict[str, str]: ...

    def health(self, timeout_s: float = 5) -> tuple[bool, str]: ...


def wait_for_group(group: Group, timeout_s: float, interval_s: float = 2.0,
                   sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> str:
    """Poll until the head's /health answers 200 with every node's containers running.

    Args:
        group: the node group (`ds4deploy.operate.supervisor.make_target`).
        timeout_s: seconds to wait in all (the deploy passes the head's health timeout, ds4_health_timeout_s).
        interval_s: seconds between checks (each is one `docker ps` per node and one GET /health).

    Returns:
        The last health detail ("GET /health -> 200").

    Raises:
        UserError: a node's containers stopped (or were never started) while the head waited: names the node and
            its state; or no healthy answer within `timeout_s`. A node whose Docker daemon does not answer is
            waited for (until the timeout), as the supervisor does.
    """
    deadline = clock() + timeout_s
    last = "no check yet"
    while True:
        states = group.container_states()
        stopped = {n: st for n, st in states.items() if st not in STARTING and not st.startswith(UNKNOWN)}
        if stopped:
            raise UserError(
                "the group cannot come up: " + ", ".join(f"{n}: {st}" for n, st in sorted(stopped.items()))
                + f" while the head waited for its peer node(s) (head: {last})",
                "read the first error of that node in the incident folder the deploy saves; fix it and deploy again "
                "(the deploy starts every worker before the head)")
        if all(st == "running" for st in states.values()):
            ok, last = group.health()
            if ok:
                return last
        if clock() >= deadline:
            raise UserError(f"the head did not answer /health with 200 within {timeout_s:g} s (last: {last}; "
                            f"containers: {', '.join(f'{n}: {st}' for n, st in sorted(states.items()))})",
                            "read the incident folder the deploy saves: every node's log, the earliest fatal line")
        sleep(interval_s)
