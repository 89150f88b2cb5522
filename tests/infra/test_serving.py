"""Serving checks against the deployed server: the client conformance matrix (`ds4deploy conformance`: the OpenAI
and Anthropic SDKs and raw HTTP, every case in every stream x thinking mode) run once, one test per case, plus the
real clients (`llm` and the Claude Code CLI) for one turn. The served model, port, address and auth policy come
from the recipe's render."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ds4deploy.conformance import cases
from ds4deploy.conformance.record import Recorder
from tests.support.real_clients import CLAUDE_RUN, recording, run_claude, run_llm

# Cases whose output a grammar forces: they pass on every model.
FORCED = ("tools.required_one", "tools.required_several", "tools.named", "chat.guided_json", "messages.tool_named",
          "messages.tool_any", "args.", "messages.args.", "replay.openai.args_string", "replay.anthropic")
_RUNS: dict[str, tuple[int, dict, str]] = {}


@pytest.fixture
def matrix(base_url, api_key, dv, tmp_path_factory) -> tuple[int, dict, str]:
    """The whole matrix against the deployed server, run once per URL: (exit code, JSON report, stderr)."""
    if base_url not in _RUNS:
        d = tmp_path_factory.mktemp("conformance")
        key_file = d / "key.env"
        key_file.touch(mode=0o600)
        key_file.write_text(f"VLLM_API_KEY={api_key}\n" if api_key else "")
        # `make test` hands this one run to the unit tier's engine tests (tests/unit/test_conformance.py `matrix`),
        # which judge the same report instead of running the matrix on the same engine again.
        out = Path(os.environ.get("DS4_CONFORMANCE_SHARED") or d / "report")
        args = ["--url", base_url, "--out", str(out)] + (["--key-file", str(key_file)] if api_key else [])
        p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "conformance", dv["ds4_recipe"], *args],
                           capture_output=True, text=True, timeout=900, check=False)
        (out / "exit-code").write_text(f"{p.returncode}\n")
        report = out / "conformance.json"
        _RUNS[base_url] = (p.returncode, json.loads(report.read_text()) if report.is_file() else {}, p.stderr)
    return _RUNS[base_url]


def test_health_is_200(base_url):
    assert httpx.get(f"{base_url}/health", timeout=10).status_code == 200


def test_models_lists_the_served_name(base_url, api_key, dv):
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=10)
    assert r.status_code == 200
    assert dv["ds4_served_name"] in [m["id"] for m in r.json()["data"]]


def test_conformance_matrix_exits_0(matrix):
    code, report, stderr = matrix
    assert report, f"no report written: {stderr[-2000:]}"
    assert code == 0, [r for r in report["results"] if r["verdict"] == "fail"]


@pytest.mark.parametrize("case", [c.name for c in cases.CASES])
def test_case(matrix, case):
    """Every mode of the case: no fail; forced cases pass outright."""
    _code, report, stderr = matrix
    rows = [r for r in report.get("results", []) if r["case"] == case]
    assert rows, f"case {case} did not run: {stderr[-1000:]}"
    for r in rows:
        assert r["verdict"] != "fail", f"{case} [{r['mode']}]: {r['evidence']}"
        if case.startswith(FORCED):
            assert r["verdict"] == "pass", f"{case} [{r['mode']}]: {r['evidence']}"


def test_llm_client_one_turn(base_url, api_key, dv, tmp_path):
    p = run_llm(base_url, api_key or "none", dv["ds4_served_name"], tmp_path / "llm")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()


# Claude Code's first turn: max_tokens 32000 plus ~40,000 characters of system prompt and tools (about 20,000 tokens
# of the cpu recipe's byte-level vocabulary); a context of 65,536 tokens holds it (recipes/cpu.yaml).
AGENT_TURN_TOKENS = 65536


def test_claude_code_one_turn(base_url, api_key, dv, tmp_path):
    """Claude Code 2.1.332 in print mode, one turn, with the README's variables (through the recording proxy). On a
    recipe whose context holds the agent's turn (the cpu recipe) it must answer; on a smaller one the server may
    refuse with a 4xx that Claude Code prints ("API Error: 400 max_completion_tokens=32000 cannot be greater than
    max_model_len=2048" on a 2,048-token context), never a 5xx or a dropped connection."""
    import re

    # Through the recording proxy (it passes every request and answer on unchanged): `make test` hands the recording
    # and the result to the unit tier's recorder test (tests/unit/test_conformance.py), which judges Claude Code's
    # request shapes from it instead of a second turn on the same engine.
    shared = os.environ.get("DS4_CONFORMANCE_SHARED")
    rec_dir = Path(shared) / "claude-code" if shared else tmp_path / "rec"
    rec_dir.mkdir(parents=True, exist_ok=True)
    with recording(Recorder(base_url, rec_dir)) as proxy:
        p = run_claude(proxy, api_key or "none", dv["ds4_served_name"], tmp_path / "home")
    if shared:
        (Path(shared) / CLAUDE_RUN).write_text(json.dumps({"returncode": p.returncode, "stdout": p.stdout,
                                                           "stderr": p.stderr}))
    out = p.stdout + p.stderr
    if dv["ds4_max_model_len"] >= AGENT_TURN_TOKENS:
        assert p.returncode == 0 and p.stdout.strip(), out
    elif p.returncode == 0:
        assert p.stdout.strip()
    else:
        assert re.search(r"API Error: 4\d\d", out), out


PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]


def _auth(api_key):
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def test_anthropic_route_takes_the_key_as_the_readme_says(base_url, api_key, dv):
    """What the README tells Claude Code users. Through the front door: ANTHROPIC_API_KEY (x-api-key) and
    ANTHROPIC_AUTH_TOKEN (bearer) both work, and a missing key gets Anthropic's error shape. Straight to vLLM (no
    front door): bearer only."""
    if dv["ds4_auth_mode"] != "api_key":
        pytest.skip("recipe serves without an API key (loopback only)")
    body = {"model": dv["ds4_served_name"], "max_tokens": 4, "messages": PROMPT}
    hdr = {"anthropic-version": "2023-06-01"}
    x_key = httpx.post(f"{base_url}/v1/messages", json=body, headers={**hdr, "x-api-key": api_key}, timeout=60)
    if dv.get("ds4_front_door"):
        assert x_key.status_code == 200
        none = httpx.post(f"{base_url}/v1/messages", json=body, headers=hdr, timeout=60)
        assert none.status_code == 401
        assert none.json()["type"] == "error" and none.json()["error"]["type"] == "authentication_error"
    else:
        assert x_key.status_code == 401
    ok = httpx.post(f"{base_url}/v1/messages", json=body, headers={**hdr, **_auth(api_key)}, timeout=60)
    assert ok.status_code == 200
    assert ok.json()["type"] == "message"
