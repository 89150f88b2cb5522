"""`ds4deploy bench run` against the real server: the smoke profile end to end, the salt guard, and a server that
rejects the run's max_tokens. Runs in `make e2e` against the deployed stack; against a hand-started engine with
DS4_BASE_URL and DS4_KEY_FILE (see conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RECIPE = os.environ.get("DS4_RECIPE", "cpu")
CLI = REPO / ".venv" / "bin" / "ds4deploy"


# The supervisor's probe would count as other traffic in every cell (conftest.supervisor_paused).
pytestmark = pytest.mark.usefixtures("supervisor_paused")


@pytest.fixture
def bench(tmp_path, base_url, api_key):
    """Run `ds4deploy bench run` on the server under test; returns (process, output dir)."""
    key = tmp_path / "key.env"
    key.write_text(f"VLLM_API_KEY={api_key}\n" if api_key else "")
    out = tmp_path / "out"

    def run(*args: str, env: dict | None = None, recipe: str = RECIPE) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "ds4deploy.cli", "bench", "run", recipe, "--url", base_url, "--out", str(out),
               "--quiet", *args]
        if api_key:
            cmd += ["--key-file", str(key)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False,
                               env={**os.environ, **(env or {})})

    run.out = out
    return run


def cells(out: Path, profile: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / profile / "cells").glob("*.json"))]


def timing_only(c: dict) -> bool:
    return bool(c["flags"]) and all(f.startswith("stream timing off") for f in c["flags"])


def test_smoke_profile_measures_every_cell_honestly(bench):
    p = bench("--profile", "smoke")
    got = cells(bench.out, "smoke")
    if p.returncode == 1 and any(timing_only(c) for c in got) and all(c["valid"] or timing_only(c) for c in got):
        # On the 2-core host the engine's threads, its API server and this client share the cores; about one run in
        # six here, and both runs of one CI job, had streams delivered in bursts (measured: TTFT = last token for
        # all 64 tokens). The harness must say so (checked below); one rerun usually gives clean timing.
        p = bench("--profile", "smoke")
        got = cells(bench.out, "smoke")
    # A busy host is not a harness failure: a cell whose only flag is the stream-timing one still has to be right
    # in everything else, and its flag has to match what the cell recorded. Exit 1 then, 0 when all are valid.
    assert p.returncode == (0 if all(c["valid"] for c in got) else 1), p.stderr
    assert len(got) == 8
    for c in got:
        assert c["valid"] or timing_only(c), c["flags"]
        assert c["completed"] == c["num_prompts"] == 2 * c["spec"]["concurrency"]
        assert c["output_lens"] == [64] * c["num_prompts"]  # ignore_eos, max_tokens 64 from the profile
        assert all(0 < n <= 64 for n in c["token_chunks"])
        # The prompts are real tokens: the server counted what the cell asked for.
        assert abs(c["prompt_tokens_median"] - c["prompt_tokens_target"]) <= 16
        # Salted: the prefix cache served nothing beyond template heads.
        assert c["server_counters"]["prefix_cache_hits"] <= 32 * c["num_prompts"]
        assert c["ttft_s"] > 0 and c["aggregate_tok_s"] > 0
        assert c["harness_cpu_ms_per_1k_tokens"] > 0
        server = c["server_counters"]["server_decode_tok_s"]
        assert server is not None
        if c["valid"]:
            # The table's median request is the same order as the server's own decode rate (inter-token latency).
            assert c["decode_tok_s"] > 0 and 0.5 < c["decode_tok_s"] / server < 2
        else:
            (flag,) = c["flags"]
            chunks = sum(c["token_chunks"])
            assert f"the server's own counters {server:,.0f} tok/s" in flag
            assert f"{sum(c['output_lens']):,} tokens came in {chunks:,} chunks" in flag
            # The flag is earned: recomputed from the cell's own per-request record (first and last token times),
            # one of the guard's two checks fails against the server's rate.
            windows = [last - first for first, last in zip(c["ttfts"], c["latencies"], strict=True)]
            steps = [n - 1 for n in c["output_lens"]]
            weighted = sum(steps) / sum(windows) if sum(windows) > 0 else float("inf")
            off = sum(1 for n, w in zip(steps, windows, strict=True) if w <= 0 or not 0.5 <= n / w / server <= 2)
            assert abs(weighted / server - 1) > 0.2 or off > 0.25 * len(windows), (weighted, off, server)
    md = (bench.out / "smoke.md").read_text()
    assert "| cell | prompt tok (measured) | conc. |" in md
    assert (bench.out / "smoke.html").is_file() and (bench.out / "smoke" / "ttft_vs_prompt.png").is_file()
    # Each cell measured against what `ds4deploy estimate` predicted for it.
    assert "measured vs predicted" in p.stdout
    assert all(f"  {c['cell_id']}: ttft_s " in p.stdout for c in got)
    # The calibration loop on this run: the hardware constants fitted to the measured cells, written where the
    # estimator reads them (a recipe directory of its own), and used by the next estimate.
    recipes = bench.out.parent / "recipes"
    recipes.mkdir(exist_ok=True)
    shutil.copy(REPO / "recipes" / f"{RECIPE}.yaml", recipes)
    shutil.copy(REPO / "recipes" / f"{RECIPE}.manifest.json", recipes)
    env = {**os.environ, "DS4_RECIPES_DIR": str(recipes)}
    run_json = str(bench.out / "smoke" / "run.json")
    cal = subprocess.run([str(CLI), "estimate", RECIPE, "--calibrate", run_json, "--write"],
                         capture_output=True, text=True, timeout=300, check=False, env=env)
    assert cal.returncode == 0, cal.stderr
    assert "calibration of hardware class cpu-x86" in cal.stdout and "t_round_s " in cal.stdout
    fitted = json.loads((recipes / f"{RECIPE}.calibration.json").read_text())["constants"]
    assert fitted["t_round_s"] > 0 and fitted["tflops"] > 0
    again = subprocess.run([str(CLI), "estimate", RECIPE], capture_output=True, text=True, timeout=300, check=False,
                           env=env)
    assert again.returncode == 0 and f"{RECIPE}.calibration.json" in again.stdout, again.stderr


def test_unsalted_prompts_are_served_by_the_cache_and_flagged(bench, tmp_path):
    profile = tmp_path / "repeat.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "repeat", "description": "one 1,024-token cell, twice", "source": "test", "max_tokens": 8,
        "ignore_eos": True, "requests_per_session": 2, "warmup_requests": 0,
        "cells": [{"prompt_tokens": 1024, "concurrency": 1, "content": "legal"}]}))
    p = bench("--profile", str(profile), "--no-salt", "--no-plots")
    assert p.returncode == 1, p.stderr
    (c,) = cells(bench.out, "repeat")
    assert not c["valid"]
    assert any(f.startswith("cache hit: the prefix cache served") for f in c["flags"]), c["flags"]
    assert not any(f.startswith("prompt length off") for f in c["flags"])  # fitted without the salt
    assert c["server_counters"]["prefix_cache_hits"] >= 512  # the second request reused the first's blocks
    # Same cell salted: valid.
    p = bench("--profile", str(profile), "--no-plots")
    assert p.returncode == 0, p.stderr
    (c,) = cells(bench.out, "repeat")
    assert c["valid"] and c["server_counters"]["prefix_cache_hits"] <= 64


def test_server_rejecting_max_tokens_stops_the_run_with_its_message(bench, tmp_path):
    if RECIPE != "cpu":
        pytest.skip("uses a copy of the cpu recipe")
    # A recipe that believes the server takes twice the context it serves (e.g. a stale deploy).
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    data = yaml.safe_load((REPO / "recipes" / "cpu.yaml").read_text())
    served = data["serving"]["max_model_len"]
    data["serving"]["max_model_len"] = 2 * served
    data["model"]["generator"]["max_position_embeddings"] = 2 * served
    (recipes / "cpu.yaml").write_text(yaml.safe_dump(data))
    shutil.copy(REPO / "recipes" / "cpu.manifest.json", recipes / "cpu.manifest.json")
    profile = tmp_path / "long.yaml"
    too_long = served + 4096
    profile.write_text(yaml.safe_dump({
        "name": "long", "description": "more output tokens than the server's context", "source": "test",
        "max_tokens": too_long, "cells": [{"prompt_tokens": 256}]}))
    p = bench("--profile", str(profile), env={"DS4_RECIPES_DIR": str(recipes)})
    assert p.returncode == 2, p.stderr
    assert f"error: the server rejected a benchmark request (max_tokens={too_long}" in p.stderr
    assert "cannot be greater than max_model_len" in p.stderr and "\nfix: lower the profile's max_tokens" in p.stderr
    assert not bench.out.exists()


def test_thinking_switch_reaches_the_chat_template(bench, tmp_path, base_url, api_key):
    """Thinking on/off cells: the switch goes to the template of the real server, both when the harness sizes the
    prompt (/tokenize) and in the benchmark requests. The cpu model's template is Qwen3's (thinking off pre-fills
    an empty <think></think> block, ds4deploy/model/tiny.py), so the off cell's prompt is sized with that block
    and each of its requests must count the block too: without the switch in the request it would be 4+ tokens
    short of the fitted length."""
    import httpx

    from ds4deploy.bench.prompts import TokenCounter

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=headers) as client:
        model = client.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]
        counter = TokenCounter(client, base_url, model)
        plain = counter.count("hello", None)
        assert counter.count("hello", {"enable_thinking": True, "thinking": True}) == plain
        block = counter.count("hello", {"enable_thinking": False, "thinking": False}) - plain
    assert block >= 4, block  # <think>, \n\n, </think>, \n\n
    profile = tmp_path / "think.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "think", "description": "thinking on and off", "source": "test", "max_tokens": 8,
        "ignore_eos": True, "requests_per_session": 2, "warmup_requests": 0,
        "cells": [{"prompt_tokens": 256, "content": "chat", "thinking": t} for t in (True, False)]}))
    p = bench("--profile", str(profile), "--no-plots")
    assert p.returncode in (0, 1), p.stderr
    by_id = {c["cell_id"]: c for c in cells(bench.out, "think")}
    assert set(by_id) == {"p256-c1-chat-think", "p256-c1-chat-nothink"}
    for c in by_id.values():
        assert not c["flags"] or timing_only(c), c["flags"]  # a busy host may deliver tokens in bursts
        # Fitted with a representative salt: the request's own salt digits may tokenize one token apart.
        assert all(abs(q["prompt_tokens"] - c["prompt_tokens_fitted"]) <= 1 for q in c["requests"]), c["requests"]
