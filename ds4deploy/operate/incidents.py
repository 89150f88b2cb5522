"""Incidents: every node's engine logs and container states saved before anything stops, and the first fatal line.

Before a node's stack is stopped or removed (a failed start, `make down`, ansible/restart.yml, the supervisor) the
control host saves, for every node of the recipe and every container of the node's compose project:

- ``<node>.<container>.log``: ``docker logs --timestamps`` (stdout and stderr merged in time order);
- ``<node>.<container>.state.json``: ``docker inspect`` ``.State`` (status, exit code, OOM kill, start/finish times);

into ``/var/lib/ds4deploy/incidents/<recipe>/<UTC time>/`` with ``incident.json`` (why, when, the earliest fatal
line, what could not be read). Only the `keep` most recent incidents of a recipe are kept.

Why the earliest fatal line across all nodes: in a vLLM multi-node start the first error is often only in a worker's
log (a bind error, an NCCL error, an assertion), and what the head prints afterwards is its consequence
(``DistStoreError ... clients joined``, ``Connection closed by peer``, ``EngineDeadError``; docs/multinode-cpu.md
lists the head's side of each fault). Docker stamps every log line with the daemon's receive time (RFC 3339 with
nanoseconds, https://docs.docker.com/reference/cli/docker/container/logs/), so lines of different containers on one
host compare directly; across machines they compare as well as the nodes' clocks agree (the rails check holds the
nodes to NTP). A container that died without a word (``docker kill``, the OOM killer) counts as a fatal event at
its ``State.FinishedAt``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ds4deploy.plan.nodes import Node
from ds4deploy.recipe.schema import Recipe
from ds4deploy.render.compose import node_project_name, project_name

INCIDENTS_ROOT = Path("/var/lib/ds4deploy/incidents")
# Incidents kept per recipe: a restart loop of the supervisor (at most 5 restarts an hour by default) leaves a day of
# evidence (less when several replicas of the recipe fail, each with its own restart budget and one folder); each
# incident is the nodes' logs (json-file driver, at most log_max_size x log_max_files per container).
KEEP = 20
DOCKER_TIMEOUT_S = 60

# `docker logs --timestamps`: "2026-11-30T21:07:01.123456789Z <line>" (RFC 3339, nanoseconds, trailing zeros cut).
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z (.*)$")
# vLLM's process prefix and log prefix, e.g. "(EngineCore_DP0 pid=19) ERROR 11-30 21:07:01 [core.py:1510] "
# (vllm/logger.py format "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"; the process prefix
# is added by vllm/utils for child processes).
_PREFIX = re.compile(r"^(?:\(\S+ pid=\d+\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [^\[]*\[[^\]]*\]\s+)?")
# The line that ends a Python traceback: "<module.>Name(Error|Exception|...)[: message]" at the start of the line.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")
# Fatal lines that are not an exception line: a bind that failed (errno 98, EADDRINUSE), NCCL's own error report
# (ncclResult_t names, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html#ncclresult-t), a C
# assertion ("file:line: func: Assertion `x' failed.", glibc assert.h), a CUDA error report.
_FATAL = re.compile(r"Address already in use|EADDRINUSE|NCCL error|nccl(?:Unhandled\w+|System|Internal|InvalidArgument"
                    r"|InvalidUsage|Remote)Error|Assertion [`'].*' failed|CUDA error:")


@dataclass(frozen=True, order=True)
class Fatal:
    """One fatal event: a log line (or a container's death) with its time.

    Attributes:
        time: UTC time, RFC 3339 with nanoseconds (``2026-11-30T21:07:01.123456789Z``); sorts as text.
        node: inventory host name.
        container: container name.
        line: the line without its timestamp and vLLM's log prefix.
    """

    time: str
    node: str
    container: str
    line: str

    def describe(self) -> str:
        """One line for a message: ``node-b (container) at 21:07:01.123Z: <line>``."""
        return f"{self.node} ({self.container}) at {self.time[11:23]}Z: {self.line}"


def _norm_stamp(date: str, frac: str | None) -> str:
    return f"{date}.{(frac or '').ljust(9, '0')}Z"


def split_stamp(line: str) -> tuple[str, str] | None:
    """``docker logs --timestamps`` line -> (normalised RFC 3339 time with 9 fraction digits, text); None if the
    line carries no timestamp."""
    m = _STAMP.match(line)
    return (_norm_stamp(m.group(1), m.group(2)), m.group(3)) if m else None


def fatal_text(text: str) -> str | None:
    """The fatal part of one log line without its timestamp, or None when the line is not fatal.

    Fatal: the exception line that ends a Python traceback (``AssertionError: ...``, ``RuntimeError: ...``,
    ``torch.distributed.DistStoreError: ...``), a failed bind, an NCCL error, a C assertion, a CUDA error, and
    llama-server's own fatal lines (`ds4deploy.engines.llamacpp.FATAL_LOG`: a model that does not load, a ggml
    assertion). vLLM's process and log prefixes and llama.cpp's (`ds4deploy.engines.llamacpp.LOG_PREFIX`) are
    stripped.
    """
    from ds4deploy.engines.llamacpp import FATAL_LOG, LOG_PREFIX

    body = _PREFIX.sub("", text.rstrip(), count=1).strip()
    body = LOG_PREFIX.sub("", body, count=1).strip()
    if not body:
        return None
    if _EXCEPTION.match(body) or _FATAL.search(body) or FATAL_LOG.search(body):
        return body
    return None


def first_fatal(node: str, container: str, log: str) -> Fatal | None:
    """The earliest fatal line of one container's ``docker logs --timestamps`` output (None: none found)."""
    found = None
    for raw in log.splitlines():
        stamped = split_stamp(raw)
        if stamped is None:
            continue
        hit = fatal_text(stamped[1])
        if hit is not None and (found is None or stamped[0] < found.time):
            found = Fatal(stamped[0], node, container, hit)
    return found


def death(node: str, container: str, state: dict) -> Fatal | None:
    """A container that exited non-zero or was OOM-killed, as a fatal event at its ``FinishedAt``."""
    code = state.get("ExitCode", 0)
    if state.get("Running") or not state.get("FinishedAt") or (code == 0 and not state.get("OOMKilled")):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$", state["FinishedAt"])
    if not m or m.group(1).startswith("0001"):
        return None
    # 128 + n: killed by signal n (POSIX shell convention, which Docker follows for the exit code).
    how = ("killed by the OOM killer" if state.get("OOMKilled") else
           f"killed by signal {code - 128}" if code > 128 else f"exit code {code}")
    return Fatal(_norm_stamp(m.group(1), m.group(2)), node, container, f"container exited ({how})")


def earliest(logs: dict[tuple[str, str], str], states: dict[tuple[str, str], dict] | None = None) -> Fatal | None:
    """The earliest fatal event across containers.

    Args:
        logs: (node, container) -> that container's ``docker logs --timestamps`` text.
        states: (node, container) -> its ``docker inspect`` ``.State`` (a silent death counts at ``FinishedAt``).
    """
    hits = [f for (node, ctr), text in logs.items() if (f := first_fatal(node, ctr, text)) is not None]
    hits += [f for (node, ctr), st in (states or {}).items() if (f := death(node, ctr, st)) is not None]
    return min(hits) if hits else None


def docker_env(node: str, hostvars: dict) -> dict[str, str]:
    """Environment for the docker CLI that reaches `node`'s daemon: the inventory's ``ds4_docker_host`` when given
    (the node's daemon is not at the default endpoint, e.g. a rootless Docker's ``unix:///run/user/<uid>/docker.sock``
    or a rehearsal stand-in node's own daemon), else the local one for ``ansible_connection: local`` (and
    localhost), else ``DOCKER_HOST=ssh://[user@]<ansible_host>`` (Docker's own ssh transport; needs the control
    host's ssh access)."""
    env = dict(os.environ)
    if hostvars.get("ds4_docker_host"):
        env["DOCKER_HOST"] = str(hostvars["ds4_docker_host"])
        return env
    if hostvars.get("ansible_connection") != "local" and node not in ("localhost", "127.0.0.1"):
        user = f"{hostvars['ansible_user']}@" if hostvars.get("ansible_user") else ""
        env["DOCKER_HOST"] = f"ssh://{user}{hostvars.get('ansible_host', node)}"
    return env


def node_project(recipe: Recipe, node: Node) -> str:
    """The compose project of `node`'s stack."""
    return project_name(recipe) if node.role == "single" else node_project_name(recipe, node.rank)


def _docker(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, env=env, timeout=DOCKER_TIMEOUT_S,
                          check=False, errors="replace")


def _merged_log(out: str, err: str) -> str:
    """stdout and stderr of ``docker logs --timestamps`` in one text, lines in time order (stable)."""
    lines = out.splitlines() + err.splitlines()
    return "".join(f"{ln}\n" for ln in sorted(lines, key=lambda ln: (split_stamp(ln) or ("",))[0]))


@dataclass
class Incident:
    """What `collect` saved.

    Attributes:
        dir: the incident folder (None when no node had a container to save).
        fatal: the earliest fatal event across all nodes, if any.
        files: file names written (``<node>.<container>.log`` / ``.state.json``).
        errors: nodes or containers that could not be read, with the reason.
        stopped: node -> Docker status (``exited``, ``dead``, ...) of its first container whose saved state is not
            running: the latest look at the containers, read after their logs.
    """

    dir: Path | None
    fatal: Fatal | None = None
    files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)

    def message(self) -> str:
        """One line for Ansible, the supervisor and the user."""
        if self.dir is None:
            return "no engine container on any node: nothing to save"
        cause = f"earliest fatal line: {self.fatal.describe()}" if self.fatal else "no fatal line in any log"
        unread = f"; not saved: {'; '.join(self.errors)}" if self.errors else ""
        return f"logs and states of every node saved in {self.dir}; {cause}{unread}"

    def as_json(self) -> dict:
        """JSON-ready form (what ``ds4deploy incident collect`` prints)."""
        return {"dir": str(self.dir) if self.dir else None, "fatal": asdict(self.fatal) if self.fatal else None,
                "files": self.files, "errors": self.errors, "stopped": self.stopped, "message": self.message()}


def _new_dir(base: Path, now: float) -> Path:
    """A new folder ``<base>/<UTC stamp>[-n]``: made, not only looked for, so two replicas' watches failing in the
    same second (`ds4deploy.operate.supervisor.supervise_all`) each get their own."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    base.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


def prune(base: Path, keep: int) -> list[Path]:
    """Remove all but the `keep` newest incident folders under `base` (names sort by time). Returns the removed."""
    dirs = sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.name) if base.is_dir() else []
    gone = dirs[:-keep] if keep > 0 else dirs
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def collect(recipe: Recipe, nodes: list[Node], hosts: dict[str, dict], reason: str,
            root: Path = INCIDENTS_ROOT, keep: int = KEEP, now: float | None = None) -> Incident:
    """Save every node's container logs and states into a new incident folder; find the earliest fatal line.

    Args:
        nodes: the recipe's node plan (`ds4deploy.plan.nodes.plan`); hosts: inventory host vars (how to reach each
            node's Docker daemon, `docker_env`).
        reason: why (``failed start of node-b``, ``make down``, ``supervisor: engine-down``), kept in incident.json.
        root: incidents root; the folder is ``<root>/<recipe>/<UTC YYYYmmddTHHMMSSZ>``.
        keep: incident folders kept per recipe (older ones removed after this one is written).

    A node whose daemon cannot be reached, or a container whose log cannot be read, is listed in ``errors``; the
    other nodes are still saved. No folder is made when no node has a container (nothing to lose).
    """
    return collect_projects(recipe.name, [(n.name, n.role, node_project(recipe, n)) for n in nodes], hosts, reason,
                            root, keep, now)


def collect_projects(name: str, targets: list[tuple[str, str, str]], hosts: dict[str, dict], reason: str,
                     root: Path = INCIDENTS_ROOT, keep: int = KEEP, now: float | None = None) -> Incident:
    """`collect` for any deployment: `targets` are (node, role, compose project) triples; the folder is
    ``<root>/<name>/<UTC time>`` (a gateway: its name and its one project on the gateway host)."""
    found: dict[str, tuple[dict[str, str], list[str]]] = {}
    errors: list[str] = []
    for node, _role, project in targets:
        env = docker_env(node, hosts.get(node, {}))
        try:
            ps = _docker(["ps", "--all", "--filter", f"label=com.docker.compose.project={project}",
                          "--format", "{{.Names}}"], env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{node}: docker ps: {exc}")
            continue
        if ps.returncode != 0:
            errors.append(f"{node}: docker ps: {ps.stderr.strip()[:200]}")
            continue
        found[node] = (env, sorted(ps.stdout.split()))
    if not any(names for _, names in found.values()):
        return Incident(None, errors=errors)
    base = root / name
    folder = _new_dir(base, time.time() if now is None else now)
    logs: dict[tuple[str, str], str] = {}
    states: dict[tuple[str, str], dict] = {}
    files: list[str] = []
    for node_name, (env, names) in found.items():
        for ctr in names:
            try:
                lg = _docker(["logs", "--timestamps", ctr], env)
                st = _docker(["inspect", "--format", "{{json .State}}", ctr], env)
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{node_name}/{ctr}: {exc}")
                continue
            if lg.returncode == 0:
                logs[(node_name, ctr)] = _merged_log(lg.stdout, lg.stderr)
                (folder / f"{node_name}.{ctr}.log").write_text(logs[(node_name, ctr)], encoding="utf-8")
                files.append(f"{node_name}.{ctr}.log")
            else:
                errors.append(f"{node_name}/{ctr}: docker logs: {lg.stderr.strip()[:200]}")
            if st.returncode == 0 and st.stdout.strip():
                states[(node_name, ctr)] = json.loads(st.stdout)
                (folder / f"{node_name}.{ctr}.state.json").write_text(
                    json.dumps(states[(node_name, ctr)], indent=2) + "\n", encoding="utf-8")
                files.append(f"{node_name}.{ctr}.state.json")
            else:
                errors.append(f"{node_name}/{ctr}: docker inspect: {st.stderr.strip()[:200]}")
    stopped: dict[str, str] = {}
    for (node_name, _ctr), st in states.items():
        if not st.get("Running"):
            stopped.setdefault(node_name, st.get("Status") or "not running")
    incident = Incident(folder, earliest(logs, states), files, errors, stopped)
    (folder / "incident.json").write_text(json.dumps(
        {"recipe": name, "reason": reason, "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "nodes": {node: role for node, role, _ in targets}, **incident.as_json()}, indent=2) + "\n", encoding="utf-8")
    prune(base, keep)
    return incident
