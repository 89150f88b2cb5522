"""Wait for a starting multi-node group: the head's engine healthcheck, while every node's containers keep running.

The deploy starts the workers first and the head last; the head then waits at the rendezvous for every worker. A
worker that passed its own start check (its ready line) and died right after leaves the head waiting out its
distributed timeout (torch.distributed's default store timeout is 30 minutes: docs/multinode-cpu.md, section 4;
`--distributed-timeout-seconds` shortens it) and the deploy waiting out the head's health timeout (about an hour on
the GX10 pair). Watching every node's containers while the head's engine starts turns that into a failure within
seconds that names the node; the deploy then saves every node's logs (the incident names the worker's first error).

Everything is read through each node's Docker daemon, the way the supervisor and the incident collector reach them
(`ds4deploy.operate.incidents.docker_env`): the container states, and the head engine's own Docker healthcheck
(the compose file's, the one `docker compose up --wait` waits for), so no API key and no HTTP route from the
control host to the head are needed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Protocol

from ds4deploy.core.errors import UserError
from ds4deploy.operate.incidents import docker_env, node_project
from ds4deploy.operate.supervisor import UNKNOWN, Target, describe_states
from ds4deploy.plan.nodes import head_of

# Docker container states (`docker ps --format {{.State}}`) of a node that is still starting: created (not started
# yet) or running. Any other state (exited, dead, restarting after an exit, paused, removing) or no container at all
# ("missing") means the group cannot come up.
STARTING = ("running", "created")
# Seconds between checks: a stopped node is named within this, for one `docker ps` per node and one
# `docker inspect` of the head per check.
INTERVAL_S = 2.0
WAITED = "while the head waited for its peer node(s)"  # the deploy's rescue keys its advice on this phrase


class Group(Protocol):
    """What the wait reads (`GroupDocker`; tests pass a scripted fake)."""

    def container_states(self) -> dict[str, str]: ...

    def engine_health(self) -> tuple[bool, str]: ...


class GroupDocker(Target):
    """A deployed recipe's nodes read through their Docker daemons (`Target.container_states`), plus the head
    engine's healthcheck. Built with `group`."""

    def engine_health(self) -> tuple[bool, str]:
        """(every engine container of the head is "healthy", "<name>: <health status>, ..."); the front door does
        not count (it starts after the engine is healthy)."""
        head = head_of(self.nodes)
        env = docker_env(head.name, self.hosts.get(head.name, {}))
        project = node_project(self.recipe, head)
        try:
            p = subprocess.run(["docker", "ps", "--all", "--filter", f"label=com.docker.compose.project={project}",
                                "--format", '{{.Names}} {{.Label "io.ds4deploy.role"}}'],
                               capture_output=True, text=True, env=env, timeout=30, check=False)
            names = [ln.split()[0] for ln in p.stdout.splitlines() if ln.split()[1:] != ["front-door"]]
            health = {}
            for name in names:
                st = subprocess.run(["docker", "inspect", "--format",
                                     "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}", name],
                                    capture_output=True, text=True, env=env, timeout=30, check=False)
                health[name] = st.stdout.strip() or "unknown"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{head.name}: docker: {exc}"
        detail = describe_states(health) or f"{head.name}: no engine container"
        return bool(health) and all(h == "healthy" for h in health.values()), detail


def group(recipe, inventory) -> GroupDocker:
    """The node group of a deployed `recipe` as the `inventory` plans it (no API key, no URL: Docker only).

    Raises:
        UserError: the inventory does not fit the recipe (`ds4deploy.plan.inventory`, `ds4deploy.plan.nodes`).
    """
    from ds4deploy.plan.inventory import read_inventory
    from ds4deploy.plan.nodes import plan

    hosts = read_inventory(inventory).hosts
    return GroupDocker(recipe, inventory, plan(recipe, hosts), url="", key=None, hosts=hosts)


def wait_for_group(grp: Group, timeout_s: float, interval_s: float = INTERVAL_S,
                   sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> str:
    """Poll until the head's engine healthcheck says healthy, failing as soon as a node's containers stop.

    Args:
        grp: the node group (`group`).
        timeout_s: seconds to wait in all (the deploy passes the head's health timeout, ds4_health_timeout_s).
        interval_s: seconds between checks (`INTERVAL_S`).

    Returns:
        The head engine's health detail ("<container>: healthy").

    Raises:
        UserError (exit 1): a node's containers stopped, or were never started, while the head waited (names the
            node and its state); or the head's engine was not healthy within `timeout_s`. A node whose Docker
            daemon does not answer is waited for, as the supervisor does; a healthy head ends the wait whatever
            the others read, since the head only turns healthy once every worker joined.
    """
    deadline = clock() + timeout_s
    while True:
        states = grp.container_states()
        stopped = {n: st for n, st in states.items() if st not in STARTING and not st.startswith(UNKNOWN)}
        ok, health = grp.engine_health()
        if stopped:
            raise UserError(
                f"the group cannot come up: {describe_states(stopped)} {WAITED} (head engine: {health})",
                "read that node's first error in the deploy's incident folder (or `docker logs` on it), fix it and "
                "deploy again: the deploy starts every worker before the head", code=1)
        if ok:
            return health
        if clock() >= deadline:
            raise UserError(f"the head's engine was not healthy within {timeout_s:g} s ({health}; containers: "
                            f"{describe_states(states)})",
                            "read every node's log (`make logs`, or the deploy's incident folder)", code=1)
        sleep(interval_s)
