#!/usr/bin/env python3
"""Prototype group supervisor for a two-node vLLM CPU stack (helper "multinode", issue 5; docs/multinode-cpu.md).

Stdlib only, so the lead can lift it into ds4deploy. One process watches the whole group and, on any fault,
restarts the *group* in the proven order: stop head, stop workers, start workers, wait until each worker is
waiting for the head, start head, wait for /health. Docker restart policies stay "no" on every node because
Docker restarts one container alone, which the pair cannot survive (docs/multinode-cpu.md, fault table).

Checks, every --interval seconds:
  1. every container of the group is running (docker inspect .State.Running);
  2. head GET /health == 200 (vLLM returns 503 once its engine client sees a dead engine);
  3. progress: a 1-token chat completion per DP rank must finish within --probe-timeout seconds;
     with data parallel the head load-balances, so the probe is pinned with the `X-data-parallel-rank` header
     (read in vllm/entrypoints/generate/base/serving.py:225 of the 0.32 CPU wheel), so a wedged rank 1 cannot
     hide behind rank 0.

Restart policy: exponential backoff (--backoff-s doubling, capped at --backoff-max-s) and at most --max-restarts
restarts inside --window-s; beyond that the supervisor exits 1 so systemd (Restart=on-failure,
StartLimitBurst) or an operator takes over. Every action is one JSON line on stdout (journald-friendly) with the
reason of the restart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Node:
    """One node of the group: a compose file and the container it runs (role head or worker)."""

    name: str
    compose_file: str
    container: str
    role: str


def log(event: str, **fields: object) -> None:
    """Print one JSON line: {"ts": unix seconds, "event": ..., **fields}."""
    print(json.dumps({"ts": round(time.time(), 1), "event": event, **fields}), flush=True)


def compose(node: Node, *args: str, timeout: float = 120) -> None:
    """Run `docker compose -f <file> <args>` for one node (remote nodes would add DOCKER_HOST=ssh://...)."""
    subprocess.run(
        ["docker", "compose", "-f", node.compose_file, *args],
        check=True,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def running(container: str) -> bool:
    """True when the container exists and .State.Running is true."""
    r = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}}", container], check=False, capture_output=True, text=True
    )
    return r.returncode == 0 and r.stdout.strip() == "true"


def logs_contain(container: str, needle: str) -> bool:
    """True when the container's logs (stdout+stderr) contain needle."""
    r = subprocess.run(["docker", "logs", container], check=False, capture_output=True, text=True)
    return needle in r.stdout or needle in r.stderr


def http(url: str, key: str | None, body: dict | None, timeout: float, headers: dict | None = None) -> int:
    """Return the HTTP status of a GET (body None) or JSON POST; 0 on connection error or timeout."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310 (http(s) checked in main)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (http(s) checked in main)
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
        return 0


class Group:
    """The head and its workers, with the ordered start/stop and the health/progress checks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.head = Node("a", args.head_compose, args.head_container, "head")
        self.workers = [Node("b", args.worker_compose, args.worker_container, "worker")]
        self.key = args.api_key

    def stop(self) -> None:
        """Stop in reverse order: head first (its API goes away), then every worker."""
        for n in [self.head, *self.workers]:
            compose(n, "down", "--timeout", "10")
            log("stopped", node=n.name, role=n.role)

    def start(self) -> bool:
        """Start workers, wait for each to wait for the head, then start the head and wait for /health.

        Returns False when a deadline passes (--worker-ready-s, --head-ready-s)."""
        for n in self.workers:
            compose(n, "up", "-d")
            deadline = time.monotonic() + self.a.worker_ready_s
            while not logs_contain(n.container, self.a.worker_ready_marker):
                if time.monotonic() > deadline or not running(n.container):
                    log("worker_not_ready", node=n.name, waited_s=self.a.worker_ready_s)
                    return False
                time.sleep(1)
            log("worker_waiting_for_head", node=n.name)
        t0 = time.monotonic()
        compose(self.head, "up", "-d")
        while http(self.a.url + "/health", None, None, 5) != 200:
            if time.monotonic() - t0 > self.a.head_ready_s:
                log(
                    "head_not_ready",
                    waited_s=self.a.head_ready_s,
                    hint="head waits for worker forever (no vLLM timeout in wait_for_engine_startup)",
                )
                return False
            if not running(self.head.container):
                log("head_exited_during_start")
                return False
            time.sleep(1)
        log("healthy", head_ready_s=round(time.monotonic() - t0, 1))
        return True

    def fault(self) -> str | None:
        """Return the reason the group is unhealthy, or None when all checks pass."""
        for n in [self.head, *self.workers]:
            if not running(n.container):
                return f"container {n.container} ({n.role}) not running"
        code = http(self.a.url + "/health", None, None, 5)
        if code != 200:
            return f"head /health returned {code or 'no answer'}"
        body = {"model": self.a.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        # TP/PP: one probe exercises every rank. DP: one probe pinned to each rank.
        for rank in range(self.a.dp_size) if self.a.dp_size > 1 else [None]:
            headers = {} if rank is None else {"X-data-parallel-rank": str(rank)}
            code = http(self.a.url + "/v1/chat/completions", self.key, body, self.a.probe_timeout, headers)
            if code != 200:
                where = "" if rank is None else f" on DP rank {rank}"
                return f"progress probe{where} returned {code or 'no answer'} (timeout {self.a.probe_timeout}s)"
        return None


def main() -> int:
    """Parse flags, then loop: check, and on a fault restart the group with backoff and a restart limit."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    p.add_argument("--head-compose", default=str(here / "tp" / "compose.head.yaml"))
    p.add_argument("--worker-compose", default=str(here / "tp" / "compose.worker.yaml"))
    p.add_argument("--head-container", default="multinode-a")
    p.add_argument("--worker-container", default="multinode-b")
    p.add_argument("--url", default="http://127.0.0.1:8200")
    p.add_argument("--api-key", required=True)
    p.add_argument("--model", default="ds4-tiny")
    p.add_argument("--dp-size", type=int, default=1, help="2 for the data-parallel pair (probe each rank)")
    # TP/PP worker: serve.py:224 "Launching vLLM (v...) headless multiproc executor"; DP worker: serve.py:239
    # "Launching 1 data parallel engine(s) in headless mode".
    p.add_argument("--worker-ready-marker", default="headless multiproc executor")
    p.add_argument("--worker-ready-s", type=float, default=120)
    p.add_argument("--head-ready-s", type=float, default=600)
    p.add_argument("--interval", type=float, default=10)
    p.add_argument("--probe-timeout", type=float, default=30)
    p.add_argument("--backoff-s", type=float, default=5)
    p.add_argument("--backoff-max-s", type=float, default=300)
    p.add_argument("--max-restarts", type=int, default=5)
    p.add_argument("--window-s", type=float, default=3600)
    p.add_argument("--start", action="store_true", help="(re)start the group before watching")
    p.add_argument("--exit-after-recovery", action="store_true", help="prototype: stop after one recovery")
    a = p.parse_args()
    if not a.url.startswith(("http://", "https://")):
        p.error(f"--url must be http(s)://, got {a.url!r}")
    g = Group(a)
    restarts: list[float] = []
    backoff = a.backoff_s
    if a.start:
        g.stop()
        if not g.start():
            log("start_failed")
            return 1
    while True:
        reason = g.fault()
        if reason is None:
            backoff = a.backoff_s
            time.sleep(a.interval)
            continue
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < a.window_s] + [now]
        if len(restarts) > a.max_restarts:
            log("giving_up", reason=reason, restarts=len(restarts) - 1, window_s=a.window_s)
            return 1
        log("fault", reason=reason, restart=len(restarts), backoff_s=backoff)
        t0 = time.monotonic()
        g.stop()
        time.sleep(backoff)
        backoff = min(backoff * 2, a.backoff_max_s)
        if g.start():
            log("recovered", reason=reason, recovery_s=round(time.monotonic() - t0, 1))
            if a.exit_after_recovery:
                return 0


if __name__ == "__main__":
    sys.exit(main())
