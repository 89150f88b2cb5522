"""The soak's short variant on the deployed stack (`ds4deploy bench soak`, the 30-minute run is `make soak` and its
figures are in docs/benchmarks.md): 8 streaming sessions with mixed prompt lengths for one minute, in four
15-second windows, with the engine container's memory sampled. Every request must succeed; the report must hold
every window and Docker's memory samples of the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

RECIPE = os.environ.get("DS4_RECIPE", "cpu")


def test_one_minute_of_eight_sessions_fails_no_request(tmp_path, base_url, api_key):
    key = tmp_path / "key.env"
    key.write_text(f"VLLM_API_KEY={api_key}\n" if api_key else "")
    out = tmp_path / "soak"
    cmd = [sys.executable, "-m", "ds4deploy.cli", "bench", "soak", RECIPE, "--minutes", "1", "--window-min", "0.25",
           "--sessions", "8", "--prompt-tokens", "256,1024,4096", "--max-tokens", "64", "--mem-interval", "5",
           "--out", str(out), "--quiet"]
    if os.environ.get("DS4_BASE_URL"):  # a hand-started server; else the recipe's own, whose container is sampled
        cmd += ["--url", base_url]
    if api_key:
        cmd += ["--key-file", str(key)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads((out / "soak.json").read_text())
    assert res["failed"] == 0 and res["requests"] >= 8, res["errors"]
    assert len(res["windows"]) >= 4 and all(w["requests"] > 0 for w in res["windows"][:4])
    assert set(res["prompt_tokens"]) == {256, 1024, 4096}
    if not os.environ.get("DS4_BASE_URL"):
        assert res["container"] and len(res["memory"]["samples"]) >= 5, res["memory"]
    assert "0 failed" in (out / "soak.md").read_text()
