"""`ds4deploy bench run` bad input that needs no server: clear two-line errors, exit 2, nothing written.
(A server that rejects max_tokens is tested live: tests/infra/test_bench_live.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.conftest import run_cli

CLOSED = "http://127.0.0.1:9"  # discard port: nothing listens on it here


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_BENCH_LOCK_DIR", str(tmp_path / "locks"))
    key = tmp_path / "key.env"
    key.write_text("VLLM_API_KEY=abc\n")
    return {"key": str(key), "out": tmp_path / "out"}


def bench(env, *extra):
    return run_cli("bench", "run", "cpu", "--key-file", env["key"], "--out", str(env["out"]), "--quiet", *extra)


def test_unreachable_server(env):
    p = bench(env, "--profile", "smoke", "--url", CLOSED)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"error: cannot reach the server at {CLOSED}")
    assert "\nfix: check --url" in p.stderr and "Traceback" not in p.stderr
    assert not env["out"].exists()


def test_profile_longer_than_the_recipe(env):
    p = bench(env, "--profile", "v100-content", "--url", CLOSED)
    assert p.returncode == 2
    from ds4deploy.recipe.load import load_recipe

    limit = load_recipe("cpu").serving.max_model_len
    assert "error: profile 'v100-content' asks for" in p.stderr and f"max_model_len {limit}" in p.stderr
    assert not env["out"].exists()


def test_unreadable_key_file(env):
    p = run_cli("bench", "run", "cpu", "--profile", "smoke", "--url", CLOSED, "--key-file", "/nonexistent/k.env")
    assert p.returncode == 2 and "error: cannot read the key file /nonexistent/k.env" in p.stderr


def test_lock_held_by_another_run(env):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time\nfrom ds4deploy.bench.lock import ServerLock\n"
         f"with ServerLock({CLOSED!r}, what='other bench'):\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert holder.stdout.readline().strip() == "held"
        p = bench(env, "--profile", "smoke", "--url", CLOSED)
        assert p.returncode == 2
        assert f"error: another benchmark is running against {CLOSED}: pid {holder.pid} (other bench)" in p.stderr
        assert not env["out"].exists()
    finally:
        holder.kill()
        holder.wait()


def test_unknown_profile(env):
    p = bench(env, "--profile", "nope", "--url", CLOSED)
    assert p.returncode == 2 and "no benchmark profile named 'nope'" in p.stderr and "smoke" in p.stderr
