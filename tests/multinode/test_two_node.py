"""Two real nodes: the cpu-2node-tp recipe (tensor parallel across nodes, headless worker: the GX10 flag set)
deployed by the same playbooks as the GPU recipes, as two containers on one Docker network
(ansible/inventories/two-node-local.yml). Then each fault the supervisor must repair, for real: the worker's engine
killed, the head killed, the worker's engine process frozen (API up, no progress); after each, a request succeeds.
Then the head started alone: a clear "waiting for its peer" failure within the recipe's distributed timeout, and
nothing left running. Runs in `make test` after the single-node checks (tests/multinode).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.secrets import parse_env_file

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
RECIPE = "cpu-2node-tp"
INVENTORY = REPO / "ansible" / "inventories" / "two-node-local.yml"
DV = yaml.safe_load((REPO / "compose" / RECIPE / "deploy-vars.yml").read_text())
URL = f"http://127.0.0.1:{DV['ds4_port']}"
HEAD, WORKER = f"ds4-{RECIPE}-node0-engine-1", f"ds4-{RECIPE}-node1-engine-1"
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
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


@pytest.fixture(scope="module")
def supervisor(pair, tmp_path_factory):
    """`ds4deploy supervise` in the background with a fast policy; yields (journal, process)."""
    journal = tmp_path_factory.mktemp("supervise") / f"{RECIPE}.jsonl"
    proc = subprocess.Popen([str(BIN / "ds4deploy"), "supervise", RECIPE, "--inventory", str(INVENTORY),
                             "--interval", "2", "--probe-every", "10", "--probe-timeout", "15", "--journal",
                             str(journal)], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not journal.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert journal.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no journal"
        yield journal, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)


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
    and every request hangs (the wedge of SEEDS.md's GX10 pair)."""
    top = run(["docker", "top", WORKER, "-o", "pid,args"]).stdout
    pids = [line.split()[0] for line in top.splitlines() if "Worker_TP1" in line]
    assert pids, top
    os.kill(int(pids[0]), signal.SIGSTOP)


@pytest.mark.parametrize(("fault", "reason", "detail"), [
    ("kill-worker", "engine-down", "node-b: exited"),
    ("kill-head", "engine-down", "node-a: exited"),
    ("wedge-worker", "wedged", "GET /health -> 200, but no completion"),
])
def test_supervisor_restarts_the_group_in_order(supervisor, fault, reason, detail):
    journal, _ = supervisor
    before = len(events(journal))
    if fault == "kill-worker":
        run(["docker", "kill", WORKER])
    elif fault == "kill-head":
        run(["docker", "kill", HEAD])
    else:
        _freeze_worker_engine()
    failure, done = wait_for_restart(journal, before)
    assert failure["reason"] == reason and detail in failure["detail"], failure
    assert done["event"] == "restarted", done
    r = chat()
    assert r.status_code == 200, r.text
    assert containers() == {HEAD: "running", WORKER: "running"}


def test_head_alone_fails_clearly_and_leaves_nothing(pair, supervisor):
    """Stop the group, then start only the head: it must fail within the recipe's distributed timeout with a
    message saying it waited for its worker, and remove what it started."""
    # The supervisor must not repair this on purpose: stop it first.
    _, proc = supervisor
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert make("down").returncode == 0
    proc = run([str(BIN / "ansible-playbook"), "-i", str(INVENTORY), "ansible/site.yml", "-e", f"recipe={RECIPE}",
                "--limit", "node-a,localhost"], timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "still waiting for its peer node(s)" in out and "node-b" in out, out[-3000:]
    assert "Traceback" not in out.split("Last engine log lines")[0]
    assert containers() == {}
    # Leave the pair deployed for the module teardown's `make down` (it must succeed on a stopped stack too).


def test_bad_inventories_stop_before_any_host_is_touched(tmp_path):
    """Two nodes on one rank, a missing head, one address twice, an address outside the node network, a worker
    that cannot be reached: one message each, nothing started."""
    base = yaml.safe_load(INVENTORY.read_text())
    cases = {
        "rank twice": ({"node-b": {"ds4_node_rank": 0}}, "both have ds4_node_rank 0"),
        "no head": ({"node-a": None}, "no head in the inventory"),
        "address twice": ({"node-b": {"ds4_host_ip": "172.31.251.10"}}, "both have address 172.31.251.10"),
        "outside the node network": ({"node-b": {"ds4_host_ip": "10.9.9.9"}}, "outside the node network"),
        # A worker Ansible cannot reach (TEST-NET-1 answers "connection refused" here): provision.yml's reachability
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
