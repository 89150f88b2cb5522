"""`make bench-multinode`: time to healthy for one and two nodes, and time to recover from a killed worker.

Measured on whatever machine runs it, with the engine image already built (warm deploys: the figure is the
orchestration plus engine start, not an image build):

- ``deploy_to_healthy_s``: wall time of ``make deploy`` (it returns once the head's /health answers) for the one-node
  ``cpu`` recipe and the two-node ``cpu-2node-tp`` recipe (two containers on one Docker network,
  ansible/inventories/two-node-local.yml), each followed by ``make down``;
- ``recovery``: with ``ds4deploy supervise`` running (2 s checks), the worker's engine container is killed; detection
  is the supervisor's failure event minus the kill time, recovery is the kill time to the first 200 of a chat request
  after the group restart (stop head, stop worker, start worker, start head).

Results go to docs/results/bench-multinode.json and the "Multi-node" section of docs/benchmarks.md (replaced between its
markers). Each figure is one run per repeat; the machine's other load is recorded (os.getloadavg) because on the
2-core CI machine two engines share the cores.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from ds4deploy.bench.docs_section import RESULTS_DIR, write_section
from ds4deploy.operate.key_file import parse_env_file
from ds4deploy.recipe.paths import REPO_ROOT

TWO = ("cpu-2node-tp", "ansible/inventories/two-node-local.yml")
ONE = ("cpu", "ansible/inventories/local.yml")
BEGIN, END = "<!-- bench-multinode:begin -->", "<!-- bench-multinode:end -->"


def _make(target: str, recipe: str, inventory: str) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(["make", target, f"RECIPE={recipe}", f"INVENTORY={inventory}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"make {target} RECIPE={recipe} failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return time.monotonic() - t0


def _chat_ok(recipe: str) -> bool:
    dv = yaml.safe_load((REPO_ROOT / "compose" / recipe / "deploy-vars.yml").read_text())
    key = parse_env_file(Path(dv["ds4_key_file"]).read_text())["VLLM_API_KEY"]
    try:
        r = httpx.post(f"http://127.0.0.1:{dv['ds4_port']}/v1/chat/completions", timeout=10,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": dv["ds4_served_name"], "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hi"}]})
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _recovery(recipe: str, inventory: str) -> dict:
    journal = Path(tempfile.mkdtemp(prefix="ds4-bench-mn-")) / "supervise.jsonl"
    sup = subprocess.Popen([str(REPO_ROOT / ".venv/bin/ds4deploy"), "supervise", recipe, "--inventory", inventory,
                            "--interval", "2", "--journal", str(journal)], cwd=REPO_ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(6)
        t_kill = time.time()
        subprocess.run(["docker", "kill", f"ds4-{recipe}-node1-engine-1"], check=True, capture_output=True)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            events = [json.loads(x) for x in journal.read_text().splitlines()] if journal.exists() else []
            if any(e["event"] == "restarted" for e in events) and _chat_ok(recipe):
                t_ok = time.time()
                failure = next(e for e in events if e["event"] == "failure")
                restarted = next(e for e in events if e["event"] == "restarted")
                return {"detected_after_s": round(failure["t"] - t_kill, 1),
                        "group_restart_s": restarted["seconds"],
                        "kill_to_first_200_s": round(t_ok - t_kill, 1)}
            time.sleep(1)
        raise RuntimeError(f"no recovery within 900 s; journal {journal}")
    finally:
        sup.send_signal(signal.SIGINT)
        sup.wait(timeout=60)


def run(repeats: int = 2, out_json: Path | None = None, out_md: Path | None = None) -> dict:
    """Run the measurements `repeats` times; write the JSON and the markdown section. Returns the results."""
    out_json = out_json or RESULTS_DIR / "bench-multinode.json"
    out_md = out_md or REPO_ROOT / "docs" / "benchmarks.md"
    res: dict = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "runs": []}
    for _ in range(repeats):
        row = {"load_avg_1m_before": round(os.getloadavg()[0], 2)}
        row["one_node_deploy_s"] = round(_make("deploy", *ONE), 1)
        _make("down", *ONE)
        row["two_node_deploy_s"] = round(_make("deploy", *TWO), 1)
        row |= _recovery(*TWO)
        _make("down", *TWO)
        res["runs"].append(row)
    keys = ("one_node_deploy_s", "two_node_deploy_s", "detected_after_s", "group_restart_s", "kill_to_first_200_s")
    res["median"] = {k: round(statistics.median(r[k] for r in res["runs"]), 1) for k in keys}
    out_json.write_text(json.dumps(res, indent=1) + "\n")
    rows = "\n".join(f"| {k} | {res['median'][k]} | {', '.join(str(r[k]) for r in res['runs'])} |" for k in keys)
    section = (f"{BEGIN}\n## Multi-node: time to healthy and recovery (`make bench-multinode`, {res['date']})\n\n"
               f"Warm deploys (image built) on a {res['cores']}-core machine; the two nodes are containers sharing "
               "its cores. Raw: docs/results/bench-multinode.json.\n\n| figure (s) | median | runs |\n|---|---|---|\n"
               f"{rows}\n\nDetection is the supervisor's 2 s container check; the group restart is "
               "ansible/restart.yml (stop head, stop worker, start worker, wait for its headless marker, start head, "
               f"wait for /health).\n{END}")
    write_section(out_md, BEGIN, END, section, "Benchmarks")
    return res


if __name__ == "__main__":
    print(json.dumps(run(int(os.environ.get("REPEATS", "2"))), indent=1))
