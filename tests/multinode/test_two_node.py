"""Two real nodes: the cpu-2node-tp recipe (tensor parallel across nodes, headless worker: the GX10 flag set) deployed
by the same playbooks as the GPU recipes, as two containers on one Docker network
(ansible/inventories/two-node-local.yml). Then each fault the supervisor must repair, for real: the worker's engine
killed, the worker's engine process frozen (API up, no progress), both engines down at once (what a reboot leaves,
and the head's death with it: the supervisor starts the worker first, then the head), and a real Docker daemon
restart (in CI, whose machine runs nothing else on that daemon but the rehearsal beside, which takes turns at it:
tests/support/host_docker.py; opt-in elsewhere): the supervisor waits out the outage unbudgeted, then
starts them in order; after each, a request succeeds and an incident folder holds every node's log. Then the head
started alone: a clear "waiting for its peer" failure at once (the deploy watches every node while the head waits),
and nothing left running; then a worker that fails at start: the deploy's message quotes the worker's own first
error. Runs in `make test` after the single-node checks (tests/multinode).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.operate.key_file import parse_env_file
from tests.support import host_docker

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
RECIPE = "cpu-2node-tp"
INVENTORY = REPO / "ansible" / "inventories" / "two-node-local.yml"
DV = yaml.safe_load((REPO / "compose" / RECIPE / "deploy-vars.yml").read_text())
URL = f"http://127.0.0.1:{DV['ds4_port']}"
HEAD, WORKER = f"ds4-{RECIPE}-node0-engine-1", f"ds4-{RECIPE}-node1-engine-1"
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
INCIDENTS = Path("/var/lib/ds4deploy/incidents") / RECIPE
RECOVERY_TIMEOUT_S = 420  # detection + ordered restart (~60-110 s measured) with a loaded 2-core CI machine


def run(cmd, timeout=1800, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def make(*args: str, timeout=1800) -> subprocess.CompletedProcess:
    return run(["make", *args, f"RECIPE={RECIPE}", f"INVENTORY={INVENTORY}"], timeout=timeout)


def containers() -> dict[str, str]:
    out = run(["docker", "ps", "--all", "--filter", f"label=io.ds4deploy.recipe={RECIPE}",
               "--format", "{{.Names}} {{.State}}"]).stdout.split("\n")
    return dict(line.split() for line in out if line.strip())


def chat() -> httpx.Response:
    key = parse_env_file(Path(DV["ds4_key_file"]).read_text())["VLLM_API_KEY"]
    return httpx.post(f"{URL}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      json={"model": DV["ds4_served_name"], "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hello"}]})


@pytest.fixture(scope="module")
def pair():
    """The two-node stack, deployed by `make deploy`; torn down by `make down` at the end."""
    proc = make("deploy")
    try:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        yield
    finally:
        down = make("down")
        assert down.returncode == 0, down.stdout[-2000:]
        assert containers() == {}
        # `make down` of a running pair saves the evidence first; of a stopped one it has nothing to save.
        assert "saved in" in down.stdout or "nothing to save" in down.stdout, down.stdout[-2000:]


def start_supervisor(journal: Path, *extra: str) -> subprocess.Popen:
    """`ds4deploy supervise` in the background with a fast policy (and `extra` options), writing `journal`; returns
    once it journals."""
    proc = subprocess.Popen([str(BIN / "ds4deploy"), "supervise", RECIPE, "--inventory", str(INVENTORY),
                             "--interval", "2", "--probe-every", "10", "--probe-timeout", "15", "--journal",
                             str(journal), *extra],
                            cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not journal.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    if not journal.exists():
        stop_supervisor(proc)
        pytest.fail(proc.stderr.read().decode() if proc.poll() is not None else "no journal")
    return proc


def stop_supervisor(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def supervisor(pair, tmp_path_factory):
    """The fault tests' supervisor; yields (journal, process). The supervisor `make deploy` started (default policy)
    is stopped first: two would both restart the pair on one fault."""
    stopped = run([str(BIN / "ds4deploy"), "supervisor", "stop", RECIPE])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    journal = tmp_path_factory.mktemp("supervise") / f"{RECIPE}.jsonl"
    proc = start_supervisor(journal)
    try:
        yield journal, proc
    finally:
        stop_supervisor(proc)


def events(journal: Path) -> list[dict]:
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def wait_for_restart(journal: Path, after: int) -> tuple[dict, dict]:
    """The failure event and the restart outcome that follow the first `after` journal lines."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        new = events(journal)[after:]
        failure = next((e for e in new if e["event"] == "failure"), None)
        done = next((e for e in new if e["event"] in ("restarted", "restart-failed", "gave-up")), None)
        if failure and done:
            return failure, done
        time.sleep(2)
    pytest.fail(f"no restart within {RECOVERY_TIMEOUT_S} s; journal: {events(journal)[after:]}")


def incident(path: str | Path) -> dict:
    """An incident folder's record; asserts every node's engine log and state were saved in it."""
    folder = Path(path)
    assert folder.parent == INCIDENTS, folder
    rec = json.loads((folder / "incident.json").read_text())
    for node, ctr in (("node-a", HEAD), ("node-b", WORKER)):
        assert (folder / f"{node}.{ctr}.log").stat().st_size > 0, (folder, rec)
        assert "Status" in json.loads((folder / f"{node}.{ctr}.state.json").read_text())  # docker inspect .State
    return rec


def saved_in(out: str) -> Path:
    """The incident folder a playbook's output names."""
    m = re.search(r"logs and states of every node saved in (\S+?);", out)
    assert m, out[-3000:]
    return Path(m.group(1))


def test_two_nodes_serve_one_model(pair):
    """Both nodes run, each on its own inventory address, the worker holds TP rank 1, and the head answers."""
    assert containers() == {HEAD: "running", WORKER: "running"}
    hosts = yaml.safe_load(INVENTORY.read_text())["all"]["hosts"]
    for name, node in ((HEAD, "node-a"), (WORKER, "node-b")):
        nets = json.loads(run(["docker", "inspect", "--format", "{{json .NetworkSettings.Networks}}", name]).stdout)
        assert nets[DV["ds4_node_network"]["name"]]["IPAddress"] == hosts[node]["ds4_host_ip"]
    assert "TP rank 1" in run(["docker", "logs", WORKER]).stderr + run(["docker", "logs", WORKER]).stdout
    r = chat()
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    status = make("status")
    assert status.returncode == 0, status.stdout[-2000:]
    assert "GET /health -> 200" in status.stdout and "node-b (worker, rank 1)" in status.stdout


def _freeze_worker_engine() -> None:
    """SIGSTOP the worker's tensor-parallel process: its container stays 'running', the head's /health stays 200,
    and every request hangs (docs/sources.md#nccl-timeout-wedge)."""
    top = run(["docker", "top", WORKER, "-o", "pid,args"]).stdout
    pids = [line.split()[0] for line in top.splitlines() if "Worker_TP1" in line]
    assert pids, top
    os.kill(int(pids[0]), signal.SIGSTOP)


@pytest.mark.parametrize(("fault", "reason", "detail"), [
    ("kill-worker", "engine-down", "node-b: exited"),
    # The head's death is what `test_engines_down_at_once_come_back_in_order` and the daemon restart leave too:
    # named ("node-a: exited") and repaired in order there (stopped with the worker, not SIGKILLed alone under a
    # running worker: that variant is not run), so it has no case of its own here.
    ("wedge-worker", "wedged", "GET /health -> 200, but no completion"),
])
def test_supervisor_restarts_the_group_in_order(supervisor, fault, reason, detail):
    journal, _ = supervisor
    before = len(events(journal))
    if fault == "kill-worker":
        run(["docker", "kill", WORKER])
    else:
        _freeze_worker_engine()
    failure, done = wait_for_restart(journal, before)
    assert failure["reason"] == reason and detail in failure["detail"], failure
    assert done["event"] == "restarted", done
    # The evidence was saved before the restart removed the containers, and the journal names it.
    rec = incident(failure["incident"])
    assert done["incident"] == failure["incident"]
    if fault == "kill-worker":
        state = json.loads((Path(failure["incident"]) / f"node-b.{WORKER}.state.json").read_text())
        assert state["ExitCode"] == 137 and not state["Running"], state
        # The worker died first (SIGKILL, no log line); what the head printed afterwards is not the cause.
        assert rec["fatal"]["node"] == "node-b", rec["fatal"]
        assert "node-b" in failure["fatal"], failure
    r = chat()
    assert r.status_code == 200, r.text
    assert containers() == {HEAD: "running", WORKER: "running"}


def started_at(name: str) -> str:
    """The container's State.StartedAt (RFC 3339, nanoseconds) as sortable text."""
    from ds4deploy.operate.incidents import split_stamp

    raw = run(["docker", "inspect", "--format", "{{.State.StartedAt}}", name]).stdout.strip()
    stamped = split_stamp(f"{raw} x")
    assert stamped, raw
    return stamped[0]


# The daemon restart below leaves the same (both engines exited, started again worker first) and asserts the same;
# where it runs (CI), this case would only repeat it, one ordered restart of the pair (about 100 s) more.
DOCKERD_RESTART = bool(os.environ.get("CI") or os.environ.get("DS4_TEST_DOCKERD_RESTART") == "1")


def _restart_policies_are_no() -> None:
    """Both engines' restart policy is "no": the daemon starts neither, the supervisor orders them."""
    for name in (HEAD, WORKER):
        policy = run(["docker", "inspect", "--format", "{{.HostConfig.RestartPolicy.Name}}", name]).stdout.strip()
        assert policy == "no", (name, policy)


@pytest.mark.skipif(DOCKERD_RESTART, reason="the Docker daemon restart case runs here and proves the same")
def test_engines_down_at_once_come_back_in_order(supervisor):
    """What a reboot or a Docker daemon restart leaves behind: both engines stopped at once. Their restart policy is
    "no", so the daemon starts neither; the supervisor starts the worker first, then the head (timestamps)."""
    _restart_policies_are_no()
    journal, _ = supervisor
    before = len(events(journal))
    t0 = time.time()
    procs = [subprocess.Popen(["docker", "stop", "--timeout", "5", name], stdout=subprocess.DEVNULL)
             for name in (HEAD, WORKER)]
    for p in procs:
        p.wait(timeout=120)
    failure, done = wait_for_restart(journal, before)
    assert failure["reason"] == "engine-down" and "node-a: exited" in failure["detail"], failure
    assert done["event"] == "restarted", done
    incident(failure["incident"])
    worker_t, head_t = started_at(WORKER), started_at(HEAD)
    assert worker_t < head_t, (worker_t, head_t)
    assert time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)) <= worker_t[:19], (t0, worker_t)
    assert chat().status_code == 200


# Runs in CI, whose machine runs only make test's tiers (the rehearsal beside takes turns at the daemon:
# tests/support/host_docker.py); elsewhere opt-in: it restarts every container of the host's daemon.
@pytest.mark.skipif(not DOCKERD_RESTART,
                    reason="restarts the host's Docker daemon, and with it every container on the host: set "
                           "DS4_TEST_DOCKERD_RESTART=1 on a host of its own")
def test_docker_daemon_restart_leaves_the_order_to_the_supervisor(supervisor, tmp_path):
    """A real daemon restart: the daemon brings neither engine back (restart "no"); the supervisor waits for the
    daemon without spending its restart budget, then starts the worker first, then the head. A supervisor of its
    own with a budget of 1 restart: the outage must not count (before, it gave up here). Both engines stopped at
    once, as `test_engines_down_at_once_come_back_in_order` (skipped where this runs) leaves them: the head's death
    is named too."""
    _restart_policies_are_no()
    stop_supervisor(supervisor[1])  # one supervisor at a time; the later tests stop theirs again, harmlessly
    journal = tmp_path / f"{RECIPE}.jsonl"
    proc = start_supervisor(journal, "--max-restarts", "1")
    try:
        t0 = time.time()
        with host_docker.turn():  # the rehearsal beside (make test) uses this daemon while it sets up its nodes
            if Path("/run/systemd/system").is_dir():
                assert run(["systemctl", "restart", "docker"], timeout=300).returncode == 0
            else:
                # No systemd: dockerd runs as the docker role started it (ansible/roles/docker, nohup dockerd).
                pid = int(Path("/var/run/docker.pid").read_text())
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 120
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(1)
                time.sleep(6)  # the supervisor (2 s interval) sees the daemon gone
                subprocess.Popen("nohup dockerd >> /var/log/ds4deploy-dockerd.log 2>&1 &", shell=True)  # noqa: S602
            deadline = time.monotonic() + 120
            while run(["docker", "info"]).returncode != 0 and time.monotonic() < deadline:
                time.sleep(1)
        assert set(containers().values()) <= {"exited"}, containers()  # the daemon started neither engine
        failure, done = wait_for_restart(journal, 0)
        kinds = [e["event"] for e in events(journal)]
        assert "gave-up" not in kinds and done["event"] == "restarted", events(journal)
        assert failure["reason"] == "engine-down" and "node-a: exited" in failure["detail"], failure
        incident(failure["incident"])
        if "unreachable" in kinds:  # seen whenever a check fell inside the outage (not with systemd's quick restart)
            assert kinds.index("unreachable") < kinds.index("reachable") < kinds.index("failure"), kinds
        worker_t, head_t = started_at(WORKER), started_at(HEAD)
        assert time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)) <= worker_t[:19], (t0, worker_t)
        assert worker_t < head_t, (worker_t, head_t)
        assert chat().status_code == 200
    finally:
        stop_supervisor(proc)


def test_head_alone_fails_clearly_and_leaves_nothing(pair, supervisor):
    """Stop the group, then start only the head: it must fail at once (the deploy watches every node while the head
    waits; before, it waited out the recipe's distributed timeout) with a message saying it waited for its worker,
    which was never started, and remove what it started."""
    # The supervisor must not repair this on purpose: stop it first.
    _, proc = supervisor
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert make("down").returncode == 0
    proc = run([str(BIN / "ansible-playbook"), "-i", str(INVENTORY), "ansible/site.yml", "-e", f"recipe={RECIPE}",
                "--limit", "node-a,localhost"], timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "still waiting for its peer node(s)" in out and "node-b: missing" in out, out[-3000:]
    assert "Traceback" not in out.split("Last engine log lines")[0]
    folder = saved_in(out)
    rec = json.loads((folder / "incident.json").read_text())
    assert rec["reason"] == "failed start of head node-a" and (folder / f"node-a.{HEAD}.log").exists(), rec
    assert containers() == {}
    # Leave the pair deployed for the module teardown's `make down` (it must succeed on a stopped stack too).


def test_worker_failing_at_start_is_named(pair, tmp_path):
    """A bad launch fact (the worker's CPU bind is not a core list; vLLM parses it only in the running engine): the
    worker's engine dies at start. The deploy saves every node's log before removing anything, and its message quotes
    the worker's own first error."""
    inv = yaml.safe_load(INVENTORY.read_text())
    inv["all"]["hosts"]["node-b"]["ds4_cpu_bind"] = "x"
    path = tmp_path / "bad-bind.yml"
    path.write_text(yaml.safe_dump(inv))
    proc = run(["make", "deploy", f"RECIPE={RECIPE}", f"INVENTORY={path}"], timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    folder = saved_in(out)
    rec = json.loads((folder / "incident.json").read_text())
    assert (folder / f"node-b.{WORKER}.log").stat().st_size > 0, rec
    assert rec["fatal"]["node"] == "node-b", rec["fatal"]
    assert rec["fatal"]["line"].startswith("ValueError: invalid literal for int()"), rec["fatal"]
    assert "earliest fatal line: node-b" in out and "ValueError: invalid literal for int()" in out, out[-3000:]
    assert containers() == {}


def test_bad_inventories_stop_before_any_host_is_touched(tmp_path):
    """Two nodes on one rank, a missing head, one address twice, an address outside the node network, a worker
    that cannot be reached: one message each, nothing started."""
    base = yaml.safe_load(INVENTORY.read_text())
    cases = {
        "rank twice": ({"node-b": {"ds4_node_rank": 0}}, "both have ds4_node_rank 0"),
        "no head": ({"node-a": None}, "no head in the inventory"),
        "address twice": ({"node-b": {"ds4_host_ip": "172.31.251.10"}}, "both have address 172.31.251.10"),
        "outside the node network": ({"node-b": {"ds4_host_ip": "10.9.9.9"}}, "outside the node network"),
        # A worker Ansible cannot reach (TEST-NET-1 answers "connection refused" here): preflight.yml's reachability
        # check stops every host before anything changes; the head must not start alone.
        "unreachable worker": ({"node-b": {"ansible_connection": "ssh", "ansible_host": "192.0.2.1",
                                           "ansible_ssh_common_args": "-o ConnectTimeout=5"}},
                               "unreachable: node-b"),
    }
    for name, (patch, message) in cases.items():
        inv = json.loads(json.dumps(base))
        for host, hv in patch.items():
            if hv is None:
                del inv["all"]["hosts"][host]
            else:
                inv["all"]["hosts"][host].update(hv)
        path = tmp_path / f"{name.replace(' ', '-')}.yml"
        path.write_text(yaml.safe_dump(inv))
        proc = run(["make", "deploy", f"RECIPE={RECIPE}", f"INVENTORY={path}"], timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, name
        assert message in out and "fix:" in out.lower(), (name, out[-2000:])
        assert "Traceback" not in out, name
        assert containers() == {}, name
