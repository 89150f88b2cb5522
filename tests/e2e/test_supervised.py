"""The supervisor `make deploy` started, on the deployed cpu stack: a SIGSTOP-frozen engine core keeps /health at
200 and the compose healthcheck passing; the supervisor's progress probe sees the wedge and restarts the stack in
order, and the front door serves again, with no one starting the supervisor by hand."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.operate.key_file import parse_env_file
from ds4deploy.operate.progress import read_vllm
from tests.e2e.conftest import REPO, VENV_BIN

DV = yaml.safe_load((REPO / "compose" / "cpu" / "deploy-vars.yml").read_text())
JOURNAL = Path("/var/lib/ds4deploy/supervise/cpu.jsonl")
# Default policy (ds4deploy.operate.supervisor.Policy): a progress probe every 30 s allowed 60 s, then the ordered
# restart
# (~60 s warm on a quiet CI machine, docs/benchmarks.md; 235 s measured while other stacks loaded the 2-core host,
# 2026-11-30): 10 minutes covers detection and recovery with margin.
RECOVERY_TIMEOUT_S = 600


def _events(after: int) -> list[dict]:
    lines = JOURNAL.read_text().splitlines() if JOURNAL.is_file() else []
    return [json.loads(x) for x in lines[after:] if x.strip()]


def test_a_frozen_engine_is_restarted_by_the_deployed_supervisor():
    status = subprocess.run([str(VENV_BIN / "ds4deploy"), "supervisor", "status", "cpu"], capture_output=True,
                            text=True, check=False)
    if "running" not in status.stdout or "NOT running" in status.stdout:
        pytest.fail(f"make deploy did not leave the supervisor running: {status.stdout}{status.stderr}")
    engine = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={DV['ds4_project']}",
                             "--filter", "label=com.docker.compose.service=engine"], capture_output=True, text=True,
                            check=True).stdout.split()[0]
    top = subprocess.run(["docker", "top", engine, "-o", "pid,args"], capture_output=True, text=True,
                         check=True).stdout
    cores = [int(line.split()[0]) for line in top.splitlines() if "EngineCore" in line]
    assert cores, top
    seen = len(_events(0))
    os.kill(cores[0], signal.SIGSTOP)
    try:
        url = f"http://127.0.0.1:{DV['ds4_port']}"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # the wedge /health does not show
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        failure = done = None
        while time.monotonic() < deadline and not done:
            new = _events(seen)
            failure = next((e for e in new if e["event"] == "failure"), failure)
            done = next((e for e in new if e["event"] in ("restarted", "restart-failed", "gave-up")), None)
            time.sleep(3)
    finally:
        try:
            os.kill(cores[0], signal.SIGCONT)
        except ProcessLookupError:
            pass  # the restart removed it
    assert failure is not None and failure["reason"] == "wedged", _events(seen)
    assert done is not None and done["event"] == "restarted", _events(seen)
    key = parse_env_file(Path(DV["ds4_key_file"]).read_text())["VLLM_API_KEY"]
    r = httpx.post(f"{url}/v1/chat/completions", headers={"x-api-key": key}, timeout=120,
                   json={"model": DV["ds4_served_name"], "max_tokens": 4,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text[:300]


# A supervisor of the test's own on the deployed stack, with a probe timeout far below what the load below makes a
# request wait: before the progress counters were read, its probe waited behind the queue and it restarted a stack
# that was only busy.
BUSY_PROBE_TIMEOUT_S = 5
BUSY_CLIENTS = 16  # 4 running (max_num_seqs) and 12 queued at any time
# Checks of the supervisor under test, every one under the load: each reads the busy engine's counters, whose
# /metrics answers late under this queue (seconds each on the 2-core host), and none may probe or restart. Three:
# with --probe-every equal to --interval every check is due to probe, so a supervisor that judged the engine
# anything but busy at any check would probe it behind the queue (journalled "probe-waited" when the counters moved
# meanwhile, else a restart as "wedged").
BUSY_CHECKS = 3


def test_a_busy_engine_is_not_restarted(tmp_path):
    """Keep every sequence of the engine busy with a queue behind it for longer than the probe timeout (a one-token
    request sent meanwhile waits longer than it), with a supervisor that probes every 2 s allowed 5 s: it restarts
    nothing."""
    import threading

    url = f"http://127.0.0.1:{DV['ds4_port']}"
    key = parse_env_file(Path(DV["ds4_key_file"]).read_text())["VLLM_API_KEY"]
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": DV["ds4_served_name"], "prompt": "count", "max_tokens": 1024, "ignore_eos": True}
    stop = threading.Event()  # the load runs until the supervisor under test has finished its checks
    errors: list[str] = []
    seen_deployed = len(_events(0))

    conns: list[http.client.HTTPConnection] = []  # every client's open connection, for `leave`
    held = threading.Lock()

    def client() -> None:
        # Whole (not streamed) answers: a stream's per-token events would load the engine's API server and slow the
        # /metrics readings under test. At the end `leave` shuts each connection, so the clients stop at once rather
        # than waiting for every queued 1,024-token answer (the front door closes its upstream connection when the
        # client goes; that vLLM then drops the request, rather than finishing it, is not asserted here).
        payload = json.dumps(body)
        while not stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", DV["ds4_port"], timeout=300)
            conn.connect()
            with held:
                if stop.is_set():
                    conn.close()
                    return
                conns.append(conn)
            try:
                conn.request("POST", "/v1/completions", payload, {**headers, "Content-Type": "application/json"})
                r = conn.getresponse()
                text = r.read()
            except (OSError, http.client.HTTPException):
                return  # `leave` shut the connection
            finally:
                conn.close()
            if r.status != 200:
                errors.append(f"{r.status} {text[:200]!r}")
                return  # the test fails on it: this client stops loading

    def leave() -> None:
        stop.set()
        with held:
            for conn in conns:
                sock = conn.sock  # None once its client closed it
                if sock is not None:
                    with contextlib.suppress(OSError):  # closed meanwhile
                        sock.shutdown(socket.SHUT_RDWR)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(BUSY_CLIENTS)]
    for t in threads:
        t.start()
    journal = tmp_path / "busy.jsonl"
    try:
        # The queue fills: wait until the engine itself reports every sequence running and work waiting (its own
        # /metrics on the loopback engine port), so the supervisor starts on a busy engine however slow the host.
        engine = f"http://127.0.0.1:{DV['ds4_engine_port']}"
        deadline = time.monotonic() + 120
        while True:
            try:
                now = read_vllm(engine, key, 10)
                if now.running >= 1 and now.waiting >= 1:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, "the load never showed as running and waiting work on the engine"
            time.sleep(1)
        sup = subprocess.Popen([str(VENV_BIN / "ds4deploy"), "supervise", "cpu", "--inventory",
                                str(REPO / "ansible" / "inventories" / "local.yml"), "--interval", "2",
                                "--probe-every", "2", "--probe-timeout", str(BUSY_PROBE_TIMEOUT_S),
                                "--journal", str(journal), "--cycles", str(BUSY_CHECKS)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        waited = httpx.post(f"{url}/v1/completions", headers=headers, timeout=300,
                            json={"model": DV["ds4_served_name"], "prompt": "ping", "max_tokens": 1})
        waited_s = time.monotonic() - t0
        assert waited.status_code == 200
        assert waited_s > BUSY_PROBE_TIMEOUT_S, f"the load made a one-token request wait only {waited_s:.1f} s"
        _out, err = sup.communicate(timeout=240)
    finally:
        leave()
        for t in threads:
            t.join(timeout=300)
    events = [json.loads(x) for x in journal.read_text().splitlines()]
    assert sup.returncode == 0, err[-2000:]
    assert not errors, errors[:3]
    assert [e for e in events if e["event"] in ("failure", "restarted", "restart-failed")] == [], events
    # It judged the engine busy from the engine's own counters at every check, and never probed it behind the queue.
    assert [e["state"] for e in events if e["event"] == "engine"] == ["busy"], events
    assert [e for e in events if e["event"] == "probe-waited"] == [], events
    # The supervisor `make deploy` started watched the same load with the default policy: no restart either.
    deployed = [e for e in _events(seen_deployed) if e["event"] in ("failure", "restarted", "restart-failed")]
    assert deployed == [], deployed
