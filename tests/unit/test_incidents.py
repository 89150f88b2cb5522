"""The incident parser (ds4deploy.operate.incidents): the earliest fatal line across nodes, on real `docker logs
--timestamps`
output of the two-node CPU stack (tests/unit/fixtures/incidents/, incident folders saved by the deploy and the
supervisor in tests/multinode), and the vLLM lines of docs/multinode-cpu.md. Collecting for real (docker) is
tested in tests/multinode."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ds4deploy.operate import incidents
from ds4deploy.operate.incidents import Fatal, death, earliest, fatal_text, first_fatal, prune, split_stamp

FIXTURES = Path(__file__).parent / "fixtures" / "incidents"


def _folder(name: str) -> tuple[dict, dict]:
    """(node, container) -> log text, and -> state, read from a saved incident folder."""
    logs, states = {}, {}
    for f in sorted((FIXTURES / name).iterdir()):
        if f.name == "incident.json":
            continue
        node, rest = f.name.split(".", 1)
        if rest.endswith(".state.json"):
            states[(node, rest.removesuffix(".state.json"))] = json.loads(f.read_text())
        else:
            logs[(node, rest.removesuffix(".log"))] = f.read_text()
    return logs, states


def test_docker_timestamps_are_normalised_to_nanoseconds():
    # docker cuts trailing zeros of RFC 3339 nano times: .5Z and .500000000Z are the same instant.
    assert split_stamp("2026-11-30T21:07:01.5Z hello") == ("2026-11-30T21:07:01.500000000Z", "hello")
    assert split_stamp("2026-11-30T21:07:01Z x")[0] == "2026-11-30T21:07:01.000000000Z"
    assert split_stamp("2026-11-30T21:07:01.123456789Z ")[0] < split_stamp("2026-11-30T21:07:01.5Z ")[0]
    assert split_stamp("no stamp here") is None


@pytest.mark.parametrize(("line", "fatal"), [
    # docs/multinode-cpu.md section 2 (c): the worker started without the headless path.
    ("(EngineCore pid=19) ERROR ... [core.py:1510] AssertionError: collective_rpc should not be called on follower "
     "node", "AssertionError: collective_rpc should not be called on follower node"),
    ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
     "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
    # docs/multinode-cpu.md section 4: the head alone, and the head after its worker was killed.
    ("torch.distributed.DistStoreError: Timed out after 91 seconds waiting for clients. 1/2 clients joined.",
     "torch.distributed.DistStoreError: Timed out after 91 seconds waiting for clients. 1/2 clients joined."),
    ("OSError: [Errno 98] Address already in use", "OSError: [Errno 98] Address already in use"),
    ("[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29501 (errno: 98 - Address already in "
     "use).", "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29501 (errno: 98 - Address "
     "already in use)."),
    # torch's report of a failed NCCL call (the format of public reports, e.g. pytorch/pytorch#118743).
    ("(Worker_TP1 pid=88) ERROR 11-30 21:07:01 [multiproc_executor.py:700] torch.distributed.DistBackendError: NCCL "
     "error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled system error",
     "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
     "unhandled system error"),
    ("gx10-b:1200:1388 [0] transport/net_ib.cc:1695 NCCL WARN NET/IB: Got completion from peer with status=12, "
     "ncclRemoteError", "gx10-b:1200:1388 [0] transport/net_ib.cc:1695 NCCL WARN NET/IB: Got completion from peer "
     "with status=12, ncclRemoteError"),
    ("python3: /src/x.cpp:10: void f(): Assertion `n > 0' failed.",
     "python3: /src/x.cpp:10: void f(): Assertion `n > 0' failed."),
    # llama-server at the llama.cpp pin (captured on the H200, docs/results/llamacpp-h200-2026-12-01, wrong_path).
    ("0.00.111.793 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
     "/nonexistent/model-00001-of-00005.gguf", "llama_model_load: error loading model: llama_model_loader: failed to "
     "load model from /nonexistent/model-00001-of-00005.gguf"),
    ("0.00.112.559 E srv  llama_server: exiting due to model loading error",
     "srv  llama_server: exiting due to model loading error"),
    # Not fatal: llama-server's per-request errors and warnings (captured from the cpu-llamacpp stack, 2026-12-01).
    ("5.20.700.256 E srv    send_error: task id = 60432, error: request (22297 tokens) exceeds the available context "
     "size (8192 tokens), try increasing it", None),
    ("1.25.368.538 W srv    operator(): got exception: {\"error\":{\"code\":500,\"message\":\"The model produced "
     "output that does not match the expected peg-native format\",\"type\":\"server_error\"}}", None),
    # Not fatal: a traceback frame, INFO/WARNING lines that mention errors, a warning class.
    ("(EngineCore pid=19) ERROR ... [core.py:1510]   File \".../vllm/v1/executor/abstract.py\", line 166, in "
     "get_kv_cache_specs", None),
    ("(EngineCore pid=19) ERROR ... [core.py:1510] Traceback (most recent call last):", None),
    ("INFO 11-30 21:07:01 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, errors: 0", None),
    ("UserWarning: TypedStorage is deprecated.", None),
    ("", None),
])
def test_fatal_lines_are_recognised_and_the_rest_is_not(line, fatal):
    assert fatal_text(line) == fatal


def test_a_llama_server_that_cannot_load_its_model_is_named_by_its_first_fatal_line():
    """The tail llama-server printed for a wrong model path (captured on the H200 at the llama.cpp pin,
    docs/results/llamacpp-h200-2026-12-01/llamacpp-h200.json, wrong_path), as `docker logs --timestamps` gives it:
    the loader's error is the earliest fatal line, not the server's exit that follows."""
    tail = json.loads((Path(__file__).parents[2] / "docs" / "results" / "llamacpp-h200-2026-12-01"
                       / "llamacpp-h200.json").read_text())["wrong_path"]["tail"]
    lines = [ln for ln in tail.splitlines() if re.match(r"^\d+\.\d{2}\.\d{3}\.\d{3} ", ln)]
    log = "\n".join(f"2026-12-01T20:00:{i:02d}.000000001Z {ln}" for i, ln in enumerate(lines))
    found = first_fatal("localhost", "engine", log)
    assert found is not None and found.line.startswith("llama_model_load: error loading model: "), found


def test_the_earliest_fatal_line_wins_across_containers():
    logs = {("node-a", "head"): "2026-11-30T21:07:05.1Z torch.distributed.DistStoreError: 1/2 clients joined.\n",
            ("node-b", "worker"): "2026-11-30T21:07:01.9Z INFO 11-30 21:07:01 [a.py:1] ok\n"
                                  "2026-11-30T21:07:02.25Z AssertionError: bad bind list\n"
                                  "2026-11-30T21:07:02.3Z RuntimeError: follow-up\n"}
    assert earliest(logs) == Fatal("2026-11-30T21:07:02.250000000Z", "node-b", "worker",
                                   "AssertionError: bad bind list")
    assert earliest({("node-a", "head"): "2026-11-30T21:07:05Z INFO fine\n"}) is None


def test_a_silent_death_counts_at_its_finish_time():
    killed = {"Running": False, "ExitCode": 137, "OOMKilled": False, "FinishedAt": "2026-11-30T21:07:00.5Z"}
    assert death("node-b", "w", killed).line == "container exited (killed by signal 9)"
    assert death("node-b", "w", {**killed, "OOMKilled": True}).line == "container exited (killed by the OOM killer)"
    assert death("node-b", "w", {**killed, "ExitCode": 1}).line == "container exited (exit code 1)"
    assert death("node-b", "w", {**killed, "ExitCode": 0}) is None  # a clean stop is not a fault
    assert death("node-b", "w", {**killed, "Running": True}) is None
    assert death("node-b", "w", {**killed, "FinishedAt": "0001-01-01T00:00:00Z"}) is None  # never ran
    logs = {("node-a", "h"): "2026-11-30T21:07:01Z RuntimeError: Connection closed by peer\n"}
    assert earliest(logs, {("node-b", "w"): killed}).node == "node-b"


def test_only_the_newest_incidents_are_kept(tmp_path):
    for name in ("20261130T210000Z", "20261130T210500Z", "20261130T210500Z-2", "20261130T211000Z"):
        (tmp_path / name).mkdir()
    gone = prune(tmp_path, 2)
    assert sorted(p.name for p in gone) == ["20261130T210000Z", "20261130T210500Z"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261130T210500Z-2", "20261130T211000Z"]


def test_remote_nodes_are_reached_over_docker_ssh():
    assert "DOCKER_HOST" not in incidents.docker_env("node-a", {"ansible_connection": "local"})
    assert incidents.docker_env("gx10-b", {"ansible_host": "10.0.0.2", "ansible_user": "ops"})[
        "DOCKER_HOST"] == "ssh://ops@10.0.0.2"


def test_a_nodes_own_docker_endpoint_wins():
    # ds4_docker_host: the node's daemon at another endpoint (rootless Docker, a rehearsal stand-in node).
    sock = "unix:///run/user/1000/docker.sock"
    assert incidents.docker_env("node-a", {"ansible_connection": "local", "ds4_docker_host": sock})[
        "DOCKER_HOST"] == sock
    assert incidents.docker_env("gx10-b", {"ansible_host": "10.0.0.2", "ds4_docker_host": sock})[
        "DOCKER_HOST"] == sock



def test_the_workers_rendezvous_timeout_is_named_on_a_real_incident():
    """tests/unit/fixtures/incidents/worker-rendezvous-timeout: the worker's WorkerProc died on its TCPStore connect
    (the head was still starting); c10d's own retry lines before it ("[E... socket.cpp] ... timed out", "retrying")
    are not the fatal line, the traceback's last line is; the head, still running, printed nothing fatal."""
    logs, states = _folder("worker-rendezvous-timeout")
    hit = earliest(logs, states)
    assert hit == Fatal("2026-11-30T21:37:28.081132073Z", "node-b", "ds4-cpu-2node-tp-node1-engine-1",
                        "torch.distributed.DistNetworkError: The client socket has timed out after 120000ms while "
                        "trying to connect to (172.31.251.10, 29501).")
    assert first_fatal("node-a", "ds4-cpu-2node-tp-node0-engine-1",
                       logs[("node-a", "ds4-cpu-2node-tp-node0-engine-1")]) is None
    # The worker container's exit (code 1, 17 s later) is a fatal event too, but a later one.
    worker = ("node-b", "ds4-cpu-2node-tp-node1-engine-1")
    assert death(*worker, states[worker]).line == "container exited (exit code 1)"
    assert death(*worker, states[worker]).time > hit.time
    # What `ds4deploy incident collect` recorded with the folder is the same.
    recorded = json.loads((FIXTURES / "worker-rendezvous-timeout" / "incident.json").read_text())
    assert recorded["fatal"]["line"] == hit.line and recorded["reason"] == "failed start of head node-a"


def test_a_killed_worker_is_named_before_the_heads_errors_on_a_real_incident():
    """tests/unit/fixtures/incidents/worker-killed: the worker died silently (SIGKILL); the head printed gloo's
    Read error and EngineDeadError 0.3 s later. The cause named is the worker's death."""
    logs, states = _folder("worker-killed")
    head, worker = ("node-a", "ds4-cpu-2node-tp-node0-engine-1"), ("node-b", "ds4-cpu-2node-tp-node1-engine-1")
    hit = earliest(logs, states)
    assert (hit.node, hit.container, hit.line) == (*worker, "container exited (killed by signal 9)")
    head_first = first_fatal(*head, logs[head])
    assert head_first.line.startswith("RuntimeError: [") and "Read error [172.31.251.11]" in head_first.line
    assert hit.time < head_first.time
    assert first_fatal(*worker, logs[worker]) is None
    assert earliest({head: logs[head]}) == head_first  # without the worker's state, the head's error would be named


def test_a_worker_that_died_at_start_is_named_not_the_heads_timeout_on_a_real_incident():
    """tests/unit/fixtures/incidents/worker-bad-bind: the worker's ValueError (a CPU bind vLLM cannot parse) came
    three minutes before the head's DistStoreError; the head's error is its consequence."""
    logs, states = _folder("worker-bad-bind")
    head, worker = ("node-a", "ds4-cpu-2node-tp-node0-engine-1"), ("node-b", "ds4-cpu-2node-tp-node1-engine-1")
    hit = earliest(logs, states)
    assert (hit.node, hit.line) == ("node-b", "ValueError: invalid literal for int() with base 10: 'x'"), hit
    assert first_fatal(*head, logs[head]).line == ("torch.distributed.DistStoreError: Timed out after 121 seconds "
                                                   "waiting for clients. 1/2 clients joined.")
    assert death(*worker, states[worker]).line == "container exited (exit code 1)"
    assert hit.describe() == ("node-b (ds4-cpu-2node-tp-node1-engine-1) at 22:03:50.330Z: ValueError: invalid "
                              "literal for int() with base 10: 'x'")
