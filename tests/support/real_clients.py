"""Real coding clients for one turn against a server: `llm` (PyPI, an OpenAI-API client, pinned in the dev extra)
and the Claude Code CLI (npm, pinned here, installed into .cache/claude-code on first use)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ds4deploy.conformance.record import Recorder, serve

REPO = Path(__file__).resolve().parents[2]
# The Claude Code release these tests run (npm view @anthropic-ai/claude-code version, 2026-11-30).
CLAUDE_CODE_VERSION = "2.1.332"
CLAUDE_DIR = REPO / ".cache" / "claude-code"
# In `make test`, tests/infra records Claude Code's turn on the deployed stack into DS4_CONFORMANCE_SHARED/claude-code/
# and leaves the CLI's result here ({"returncode", "stdout", "stderr"}) for the unit tier's recorder test.
CLAUDE_RUN = "claude-code-run.json"


def claude_binary() -> Path:
    """The pinned Claude Code CLI, installed with npm into .cache/claude-code when missing (skips without npm)."""
    exe = CLAUDE_DIR / "node_modules" / ".bin" / "claude"
    pkg = CLAUDE_DIR / "node_modules" / "@anthropic-ai" / "claude-code" / "package.json"
    if exe.exists() and f'"version": "{CLAUDE_CODE_VERSION}"' in (pkg.read_text() if pkg.is_file() else ""):
        return exe
    if not shutil.which("npm"):
        pytest.skip("npm is not installed: cannot install the Claude Code CLI")
    CLAUDE_DIR.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CLAUDE_DIR),
                        f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"], capture_output=True, text=True,
                       timeout=900, check=False)
    if p.returncode != 0:
        pytest.fail(f"npm install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION} failed:\n{p.stderr[-2000:]}")
    return exe


def run_claude(url: str, key: str, model: str, home: Path, prompt: str = "Say hello.",
               timeout_s: float = 300, key_env: str = "ANTHROPIC_AUTH_TOKEN") -> subprocess.CompletedProcess:
    """One print-mode turn (`claude -p`) against `url`, the key as bearer (ANTHROPIC_AUTH_TOKEN, as the README
    says; `key_env` ANTHROPIC_API_KEY sends it as x-api-key), every model alias mapped to `model`, telemetry and
    non-essential traffic off, a scratch HOME."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update({key_env: key})
    env.update(HOME=str(home), ANTHROPIC_BASE_URL=url, ANTHROPIC_MODEL=model,
               ANTHROPIC_SMALL_FAST_MODEL=model, ANTHROPIC_DEFAULT_HAIKU_MODEL=model,
               ANTHROPIC_DEFAULT_SONNET_MODEL=model, ANTHROPIC_DEFAULT_OPUS_MODEL=model, DISABLE_TELEMETRY="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
    return subprocess.run([str(claude_binary()), "-p", prompt, "--model", model], cwd=home, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def run_llm(url: str, key: str, model: str, home: Path, prompt: str = "Say hello.") -> subprocess.CompletedProcess:
    """One turn of `llm` (its OpenAI-compatible model registered in a scratch LLM_USER_PATH) against `url`."""
    llm = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "llm"
    if not llm.is_file():
        llm = REPO / ".venv" / "bin" / "llm"
    if not llm.is_file():
        pytest.skip("llm is not installed: `make venv` installs the dev extra")
    home.mkdir(parents=True, exist_ok=True)
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: {model}\n  model_name: {model}\n  api_base: {url}/v1\n  api_key_name: ds4\n")
    (home / "keys.json").write_text(f'{{"ds4": "{key}"}}\n')
    env = dict(os.environ, LLM_USER_PATH=str(home))
    return subprocess.run([str(llm), "-m", model, "--no-log", "-o", "max_tokens", "16", prompt], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@contextmanager
def recording(rec: Recorder):
    """The recording proxy on a free loopback port in a thread of its own, while the block runs; yields its URL."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    port: list[int] = []
    t = threading.Thread(target=lambda: loop.run_until_complete(serve(rec, "127.0.0.1", 0, port.append, stop)),
                         daemon=True)
    t.start()
    for _ in range(200):
        if port:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(timeout=30)
