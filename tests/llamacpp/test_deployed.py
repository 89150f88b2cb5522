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

from ds4deploy.conformance import cases
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


# ---- the conformance matrix (`ds4deploy conformance`), judged as tests/infra/test_serving.py judges vLLM's ----
#
# tests/infra/test_serving.py: no case may fail, and the cases a grammar forces must pass on every model. llama.cpp
# forces less than vLLM with this model's chat template: its DeepSeek V3.2/V4 handler (common/chat.cpp selects it
# for a template with `dsml_token`; common/parsers/deepseek.cpp at the pinned commit) builds the tool-call grammar
# as `content_before_tools + tool_calls`, where the content before the DSML block is free text, and lets a
# reasoning block run free with thinking on. A random-weight model then writes text until max_tokens and never opens
# the block: under tool_choice required the call is the model's choice here, as under auto; a named tool_choice (an
# object) is not read at all (the engine logs "Wrong type supplied for parameter 'tool_choice', using default
# value"). Only a response_format with thinking off is forced from the first token (`reasoning + response_format +
# end`).
FORCED_HERE = {("chat.guided_json", "no-stream+no-think"), ("chat.guided_json", "stream+no-think")}
# Cases whose outcome is the model's choice on llama.cpp (above), and what their evidence says when the tiny model
# made none: no call, no tool_use block, a JSON answer left empty at max_tokens, or llama-server's 500 when its
# DeepSeek parser cannot parse the text (an unclosed <think> block at max_tokens): "does not match the expected
# peg-native format". `test_every_engine_error_is_an_unparsed_model_output` holds each such 500 to a
# "common_chat_peg_parse: unparsed peg-native output" line in the engine's log and no engine restart. A 502 (no
# answer from the engine) is no such case: it fails (it came from reused connections,
# docs/sources.md#front-door-no-reuse).
MODEL_CHOICE = ("tools.required_one", "tools.required_several", "tools.named", "tools.parallel",
                "messages.tool_named", "messages.tool_any", "args.", "messages.args.", "replay.openai.args_",
                "replay.anthropic", "chat.guided_json")
ENGINE_ERROR = re.compile(r"expected peg-native format")
NO_CALL = re.compile(r"gave no call|gave no tool_use|0 tool calls|0 tool_use blocks|calls \[\]|tool_use blocks \[\]"
                     r"|is not schema-valid JSON|" + ENGINE_ERROR.pattern)
# Where llama-server answers differently from vLLM by design, each named with its cause; the case's evidence must
# match, so any other failure of these cases still fails.
ENGINE_DIFFERENCES = {
    # vLLM refuses max_tokens above the context with a 400; llama-server caps the generation at the slot's context
    # instead (tools/server: n_predict is bounded by n_ctx_slot) and answers 200.
    "chat.max_tokens_over_context": re.compile(r"above the \d+-token context: HTTP 200"),
    # The recipe turns llama-server's reasoning extraction off (engine.llamacpp.reasoning: "off", -rea off: the
    # random model never closes a think block), so with the template's thinking switch on, <think> stays in content.
    "reasoning.field": re.compile(r"think tags in content"),
    # The check reads the rendered prompt with vLLM's chat /tokenize (messages in, tokens out); llama-server's
    # /tokenize takes a "content" string and tokenizes nothing else, so the prompt it returns lacks the results.
    "replay.openai.prompt": re.compile(r"is not in the prompt"),
}
_RUN: dict[str, tuple[int, dict, str]] = {}


@pytest.fixture(scope="module")
def matrix(url, key, tmp_path_factory) -> tuple[int, dict, str]:
    """The whole matrix against the front door, once: (exit code, JSON report, stderr)."""
    if not _RUN:
        d = tmp_path_factory.mktemp("conformance")
        key_file = d / "key.env"
        key_file.touch(mode=0o600)
        key_file.write_text(f"VLLM_API_KEY={key}\n")
        p = _cli("conformance", RECIPE, "--url", url, "--key-file", str(key_file), "--out", str(d / "report"),
                 timeout=1200)
        report = d / "report" / "conformance.json"
        _RUN["r"] = (p.returncode, json.loads(report.read_text()) if report.is_file() else {}, p.stderr)
    return _RUN["r"]


def judge(case: str, mode: str, verdict: str, evidence: str) -> str | None:
    """Why this row fails the test, or None: a forced row must pass; a fail must be the model's choice with no call
    made (`MODEL_CHOICE`, `NO_CALL`) or a named engine difference (`ENGINE_DIFFERENCES`)."""
    if (case, mode) in FORCED_HERE:
        return None if verdict == "pass" else f"forced by llama.cpp's grammar, must pass: {evidence}"
    if verdict != "fail":
        return None
    if case.startswith(MODEL_CHOICE) and NO_CALL.search(evidence):
        return None
    if case in ENGINE_DIFFERENCES and ENGINE_DIFFERENCES[case].search(evidence):
        return None
    return evidence


def test_judge_fails_what_it_must():
    """The judgement itself: a forced row that did not pass, a contract failure inside a model-choice case and an
    engine difference with other evidence all fail."""
    assert judge("chat.guided_json", "no-stream+no-think", "model-dependent", "x")
    assert judge("tools.named", "stream+think", "fail", "HTTP 500: Internal Server Error")
    assert judge("chat.max_tokens_over_context", "no-stream", "fail", "HTTP 500")
    assert judge("chat.basic", "stream+think", "fail", "usage chunk missing")
    assert judge("tools.named", "stream+think", "fail", "tool_choice named gave no call (finish=length)") is None
    assert judge("messages.args.nested", "no-stream", "fail", "HTTP 502: the engine behind the front door is not "
                 "answering")


def test_every_engine_error_is_an_unparsed_model_output(matrix, dv):
    """The engine errors `judge` lets pass (`ENGINE_ERROR`) are each matched by llama-server's own log line for an
    output its parser could not read, and the engine container never restarted: no crash hides among them."""
    _code, report, _stderr = matrix
    errors = [r for r in report.get("results", []) if r["verdict"] == "fail" and ENGINE_ERROR.search(r["evidence"])]
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


def test_conformance_matrix_ran_every_case(matrix):
    code, report, stderr = matrix
    assert report, f"no report written (exit {code}): {stderr[-2000:]}"
    assert report["recipe"] == RECIPE


@pytest.mark.parametrize("case", [c.name for c in cases.CASES])
def test_case(matrix, case):
    """Every mode of the case ran; each row passes `judge`."""
    _code, report, stderr = matrix
    rows = [r for r in report.get("results", []) if r["case"] == case]
    assert rows, f"case {case} did not run: {stderr[-1000:]}"
    bad = [f"[{r['mode']}] {why}" for r in rows if (why := judge(case, r["mode"], r["verdict"], r["evidence"]))]
    assert not bad, f"{case}: " + "; ".join(bad)
