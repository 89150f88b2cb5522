"""The cpu-llamacpp stack as `make deploy RECIPE=cpu-llamacpp` leaves it (run by `make e2e-llamacpp`, which deploys
first and tears down after): llama-server behind the front door, the supervisor, `make status`, an incident folder,
and the client conformance matrix judged for this engine and the tiny random-weight model.

Every expectation comes from the recipe's render (compose/cpu-llamacpp/deploy-vars.yml) and the key from the node's
0600 key file, as tests/infra does for the cpu recipe. Outside `make e2e-llamacpp` (DS4_LLAMACPP_DEPLOYED unset) the
module is skipped, so `make llamacpp` (the engine check, no deploy) does not run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.conformance import cases, engine_rules
from ds4deploy.core.net import base_url as url_for
from ds4deploy.operate.key_file import parse_env_file
from ds4deploy.recipe.paths import REPO_ROOT

RECIPE = "cpu-llamacpp"
INVENTORY = "ansible/inventories/local.yml"
pytestmark = pytest.mark.skipif(os.environ.get("DS4_LLAMACPP_DEPLOYED") != "1",
                                reason="runs from `make e2e-llamacpp`, against the cpu-llamacpp stack it deploys")
PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]


@pytest.fixture(scope="module")
def dv() -> dict:
    """The recipe's rendered deploy variables (ds4_* keys)."""
    return yaml.safe_load((REPO_ROOT / "compose" / RECIPE / "deploy-vars.yml").read_text())


@pytest.fixture(scope="module")
def key(dv) -> str:
    """The deployed API key, from the key file the deploy wrote (root only)."""
    k = parse_env_file(Path(dv["ds4_key_file"]).read_text()).get("VLLM_API_KEY")
    assert k, f"{dv['ds4_key_file']} has no VLLM_API_KEY= line"
    return k


@pytest.fixture(scope="module")
def url(dv) -> str:
    """The front door: http://<bind address>:<serving.port>."""
    return url_for(dv["ds4_bind_address"], dv["ds4_port"])


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=REPO_ROOT)


def test_health_answers_through_the_front_door_and_from_llama_server_behind_it(url, dv):
    """/health is the one keyless route of the front door; behind it llama-server's own /health says the model is
    loaded (200 {"status": "ok"}; 503 while loading: tools/server/README.md "GET /health")."""
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    r = httpx.get(url_for("127.0.0.1", dv["ds4_engine_port"]) + "/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text


def test_models_lists_the_served_name_with_the_key_only(url, key, dv):
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert dv["ds4_served_name"] in [m["id"] for m in r.json()["data"]]


def test_a_chat_completion_through_the_front_door(url, key, dv):
    body = {"model": dv["ds4_served_name"], "messages": PROMPT, "max_tokens": 8, "temperature": 0}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 401
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == dv["ds4_served_name"] and out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    assert 0 < out["usage"]["completion_tokens"] <= 8 and out["usage"]["prompt_tokens"] > 0


def test_an_anthropic_message_with_x_api_key(url, key, dv):
    """What the README tells Claude Code users: ANTHROPIC_BASE_URL at the front door, the key as x-api-key; no key
    gets Anthropic's error shape from the front door."""
    body = {"model": dv["ds4_served_name"], "max_tokens": 8, "messages": PROMPT}
    hdr = {"anthropic-version": "2023-06-01"}
    none = httpx.post(f"{url}/v1/messages", json=body, headers=hdr, timeout=60)
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error", none.text
    r = httpx.post(f"{url}/v1/messages", json=body, headers={**hdr, "x-api-key": key}, timeout=120)
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"][0]["type"] == "text" and msg["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < msg["usage"]["output_tokens"] <= 8



def test_streamed_answers_back_to_back_are_all_answered(url, key, dv):
    """300 short streamed chat completions in a row on one client connection, through the front door: every one is
    answered 200. llama-server closes a kept-alive connection after some streamed answers without saying so; while
    the front door reused its connections to it, 10 of 200 such requests were answered 502
    (docs/sources.md#front-door-no-reuse)."""
    statuses = []
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as client:
        for i in range(300):
            body = {"model": dv["ds4_served_name"], "messages": [{"role": "user", "content": f"hi {i}"}],
                    "max_tokens": 4, "stream": True}
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                for _ in r.iter_lines():
                    pass
                statuses.append(r.status_code)
    assert statuses.count(200) == 300, {s: statuses.count(s) for s in set(statuses)}

def test_status_shows_both_containers_healthy_and_the_supervisor_running():
    """`make status RECIPE=cpu-llamacpp` (ds4deploy status, then the supervisor's)."""
    p = _cli("status", RECIPE, "--inventory", INVENTORY)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"ds4-cpu-llamacpp-engine-1\s+Up .*\(healthy\)", p.stdout), p.stdout
    assert re.search(r"ds4-cpu-llamacpp-front-door-1\s+Up .*\(healthy\)", p.stdout), p.stdout
    assert "GET /health -> 200" in p.stdout, p.stdout
    s = _cli("supervisor", "status", RECIPE)
    assert s.returncode == 0 and "running" in s.stdout, s.stdout + s.stderr


def test_the_supervisor_reads_llama_server_progress(dv):
    """The supervisor judges the engine from llama-server's /metrics (ds4deploy.operate.progress READERS
    ["llamacpp"]): its journal records engine readings, none of them unreadable."""
    journal = Path("/opt/ds4deploy/stacks") / dv["ds4_stack_name"] / "supervise.log"
    events = [json.loads(line) for line in journal.read_text().splitlines() if line.startswith("{")]
    start = max(i for i, e in enumerate(events) if e["event"] == "start")
    engine = [e for e in events[start:] if e["event"] == "engine"]
    assert engine, f"no engine reading since the supervisor started: {events[start:][-5:]}"
    assert {e["state"] for e in engine} <= {"idle", "busy"}, engine[-5:]


def test_an_incident_folder_holds_llama_server_logs(tmp_path):
    """What the stack role saves before removing a stack that did not become healthy (`ds4deploy incident
    collect`), taken here from the running stack: the engine's log is llama-server's."""
    p = _cli("incident", "collect", RECIPE, "--inventory", INVENTORY, "--reason", "e2e-llamacpp probe",
             "--root", str(tmp_path))
    assert p.returncode == 0, p.stderr
    folder = Path(json.loads(p.stdout)["dir"])
    logs = "\n".join(f.read_text(errors="replace") for f in folder.rglob("*") if f.is_file())
    assert "llama-server" in logs or "llama_model_loader" in logs or "srv " in logs, sorted(folder.rglob("*"))



def test_a_gguf_part_missing_on_the_node_stops_the_deploy_before_any_change(tmp_path):
    """A local llama.cpp model (model.source local: placed on the nodes by hand) whose node copy lacks part 2 of its
    gguf-split parts: the real `make deploy` reads the node (ansible/roles/model/tasks/verify.yml, before the first
    play that changes a node) and stops with one message naming the part and the fix; no container, no key file,
    the model directory as it was. A scratch variant of cpu-llamacpp (its own name and ports) in scratch recipes/
    and compose/ directories; the committed recipes are not touched."""
    from tests.e2e.conftest import containers_of

    name, models = "e2e-llamacpp-part", tmp_path / "models"
    recipes, compose = tmp_path / "recipes", tmp_path / "compose"
    recipes.mkdir()
    env = dict(os.environ, DS4_RECIPES_DIR=str(recipes), DS4_COMPOSE_DIR=str(compose), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1")
    data = yaml.safe_load((REPO_ROOT / "recipes" / f"{RECIPE}.yaml").read_text())
    data["name"] = name
    data["model"].update(source="local", path=str(models))
    data["serving"]["port"], data["serving"]["front_door"]["engine_port"] = 8094, 8095
    (recipes / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for kind, extra in (("manifest", {"source": "local"}), ("lock", {})):
        body = json.loads((REPO_ROOT / "recipes" / f"{RECIPE}.{kind}.json").read_text())
        (recipes / f"{name}.{kind}.json").write_text(json.dumps({**body, **extra, "recipe": name}, indent=2))
    subprocess.run([sys.executable, "-m", "ds4deploy.cli", "render", name], env=env, check=True,
                   capture_output=True)
    gen = _cli("model", "generate", RECIPE, "--dest", str(tmp_path / "gen"))
    assert gen.returncode == 0, gen.stderr
    models.mkdir()
    first, second = sorted(json.loads(gen.stdout)["files"])
    (tmp_path / "gen" / first).rename(models / first)
    key_file = Path(f"/etc/ds4deploy/secrets/{name}.env")
    p = subprocess.run(["make", "--no-print-directory", "deploy", f"RECIPE={name}"], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=900, check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert f"does not match recipes/{name}.manifest.json (nothing was changed on any node)" in out, out[-3000:]
    assert second in out.split("missing or differing files:")[1][:300], out[-3000:]
    assert "Fix: put the files" in out and "MODEL_FROM=" in out and "Traceback" not in out
    assert "PLAY [Provision GPU" not in out, "a node was changed after the refusal"
    assert containers_of(f"ds4-{name}") == [] and not key_file.exists()
    assert sorted(x.name for x in models.iterdir()) == [first]


# ---- the conformance matrix (`ds4deploy conformance`), judged by the product for llama.cpp ----
#
# The CLI judges the matrix by the engine family's own rules (ds4deploy.conformance.engine_rules.LLAMACPP: what
# llama.cpp's grammar forces, which calls are the model's choice on it, its named differences from vLLM, each with
# its source at the pinned commit): these tests hold the CLI's own exit code and report, they judge nothing
# themselves. tests/unit/test_conformance_engine_rules.py holds the rules on this stack's captured rows.
_RUN: dict[str, tuple[int, dict, str]] = {}


@pytest.fixture(scope="module")
def matrix(url, key, tmp_path_factory) -> tuple[int, dict, str]:
    """The whole matrix against the front door, once: (exit code, JSON report, stdout + stderr)."""
    if not _RUN:
        d = tmp_path_factory.mktemp("conformance")
        key_file = d / "key.env"
        key_file.touch(mode=0o600)
        key_file.write_text(f"VLLM_API_KEY={key}\n")
        p = _cli("conformance", RECIPE, "--url", url, "--key-file", str(key_file), "--out", str(d / "report"),
                 timeout=1200)
        report = d / "report" / "conformance.json"
        _RUN["r"] = (p.returncode, json.loads(report.read_text()) if report.is_file() else {}, p.stdout + p.stderr)
    return _RUN["r"]


def test_conformance_cli_passes_the_llamacpp_stack_by_llamacpp_rules(matrix):
    """`ds4deploy conformance cpu-llamacpp` exits 0 with no failed row, judged by the llama.cpp family's rules; the
    rows llama.cpp's grammar forces (a JSON response format with thinking off) passed."""
    code, report, out = matrix
    assert report, f"no report written (exit {code}): {out[-2000:]}"
    assert report["recipe"] == RECIPE and report["engine_family"] == "llamacpp", report.get("engine_family")
    failed = [(r["case"], r["mode"], r["evidence"][:200]) for r in report["results"] if r["verdict"] == "fail"]
    assert code == 0 and report["counts"]["fail"] == 0 and not failed, (code, failed, out[-1500:])
    forced = [r for r in report["results"] if (r["case"], r["mode"]) in engine_rules.LLAMACPP.forced]
    assert len(forced) == 2 and {r["verdict"] for r in forced} == {"pass"}, forced


def test_every_engine_error_is_an_unparsed_model_output(matrix, dv):
    """The 500s the product's rule `unparsed-model-output` calls the model's choice are each matched by
    llama-server's own log line for an output its parser could not read, and the engine container never
    restarted: no crash hides among them."""
    _code, report, _out = matrix
    errors = [r for r in report.get("results", []) if r.get("rule") == "unparsed-model-output"]
    ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={dv['ds4_project']}",
                          "--filter", "label=com.docker.compose.service=engine"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert len(ids) == 1, ids
    state = json.loads(subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True,
                                      check=True).stdout)[0]
    assert state["RestartCount"] == 0 and state["State"]["Running"], state["State"]
    log = subprocess.run(["docker", "logs", ids[0]], capture_output=True, text=True, check=True)
    unparsed = (log.stdout + log.stderr).count("common_chat_peg_parse: unparsed peg-native output")
    assert unparsed >= len(errors), (unparsed, [(r["case"], r["mode"], r["evidence"][:120]) for r in errors])


@pytest.mark.parametrize("case", [c.name for c in cases.CASES])
def test_case(matrix, case):
    """Every mode of the case ran, and the CLI failed none of them; a row the llama.cpp rules re-judged names its
    rule and keeps the case's own verdict and evidence."""
    _code, report, out = matrix
    rows = [r for r in report.get("results", []) if r["case"] == case]
    assert rows, f"case {case} did not run: {out[-1000:]}"
    bad = [f"[{r['mode']}] {r['evidence']}" for r in rows if r["verdict"] == "fail"]
    assert not bad, f"{case}: " + "; ".join(bad)
    for r in rows:
        if "rule" in r:
            assert r["raw_verdict"] and r["raw_evidence"] in r["evidence"], r


# ---- a bench smoke run (`ds4deploy bench run`) against llama-server ----
SMOKE_PROFILE = {
    "name": "llamacpp-smoke", "description": "one short cell against the deployed llama-server",
    "source": "tests/llamacpp/test_deployed.py: usage and timings read from llama-server's answers",
    "layout": "cells", "max_tokens": 16, "temperature": 0.0, "ignore_eos": True, "requests_per_session": 1,
    "warmup_requests": 0, "cells": [{"prompt_tokens": 256, "concurrency": 2, "content": "prose"}],
}


def test_bench_reads_usage_and_timings_from_llama_server(tmp_path):
    """`ds4deploy bench run cpu-llamacpp` with one short cell (2 concurrent requests, a 256-token prompt, 16 tokens
    out): every cell valid, each request's token counts from llama-server's usage (the prompt fitted to 256 tokens by
    one-token completions, its /tokenize reading no chat messages) and its own ``timings`` kept beside the client's
    figures (predicted_n = completion tokens, prompt_n + cache_n = prompt tokens, rates > 0)."""
    prof = tmp_path / "llamacpp-smoke.yaml"
    prof.write_text(yaml.safe_dump(SMOKE_PROFILE, sort_keys=False))
    p = _cli("bench", "run", RECIPE, "--profile", str(prof), "--out", str(tmp_path / "out"), "--no-plots",
             "--quiet", timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cells = sorted((tmp_path / "out" / "llamacpp-smoke" / "cells").glob("*.json"))
    assert len(cells) == 1, cells
    cell = json.loads(cells[0].read_text())
    assert cell["valid"] and cell["completed"] == 2 and cell["failed"] == 0, cell["flags"]
    for r in cell["requests"]:
        t = r["server_timings"]
        assert t, r
        assert r["completion_tokens"] == 16 == t["predicted_n"], r
        assert t["prompt_n"] + t["cache_n"] == r["prompt_tokens"], r
        assert r["server_decode_tok_s"] == t["predicted_per_second"] > 0 and r["server_prefill_tok_s"] > 0, r
    summary = cell["server_timings"]
    assert summary["requests"] == 2 and summary["decode_tok_s_median"] > 0, summary
