"""Shared helpers for unit tests: a scratch recipe directory built from the committed cpu recipe, the real CLI in a
subprocess, and a real local HTTP server for the streaming client."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch):
    """A temporary recipes/ holding a copy of cpu.yaml (and its manifest); DS4_RECIPES_DIR points at it."""
    d = tmp_path / "recipes"
    d.mkdir()
    shutil.copy(REPO / "recipes" / "cpu.yaml", d / "cpu.yaml")
    shutil.copy(REPO / "recipes" / "cpu.manifest.json", d / "cpu.manifest.json")
    monkeypatch.setenv("DS4_RECIPES_DIR", str(d))
    monkeypatch.setenv("DS4_COMPOSE_DIR", str(tmp_path / "compose"))
    import ds4deploy.recipe.paths
    import ds4deploy.render.compose

    monkeypatch.setattr(ds4deploy.recipe.paths, "RECIPES_DIR", d)
    monkeypatch.setattr(ds4deploy.render.compose, "COMPOSE_DIR", tmp_path / "compose")
    return d


def write_variant(recipe_dir: Path, name: str, edit) -> Path:
    """Copy cpu.yaml to <name>.yaml with `edit(data)` applied to the parsed YAML."""
    data = yaml.safe_load((recipe_dir / "cpu.yaml").read_text())
    data["name"] = name
    edit(data)
    path = recipe_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(*args: str, env_dir: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `ds4deploy` CLI in a subprocess (what a user sees: exit code, stdout, stderr)."""
    import os

    env = dict(os.environ)
    if env_dir is not None:
        env["DS4_RECIPES_DIR"] = str(env_dir)
        env["DS4_COMPOSE_DIR"] = str(env_dir.parent / "compose")
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                          env=env, check=False, timeout=300)


@asynccontextmanager
async def chat_server(handler) -> AsyncIterator[tuple[str, int]]:
    """A real aiohttp server on 127.0.0.1 (a free port) answering POST /v1/chat/completions with `handler`, while
    the block runs; yields (the endpoint's URL, the port)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", port
    finally:
        await runner.cleanup()


# Fixtures that start the real engine from the engine venv: a bare vLLM CPU server (test_conformance.py `server`)
# or the pinned DeepSeek V4 parsers run inside it (test_conformance_parsers.py `raw`). Minutes each on two cores:
# `make unit` (and so `make test`) runs them; `make check-fast` leaves them out with -m "not engine".
ENGINE_FIXTURES = frozenset({"server", "raw"})
# The fixture of the tests that read the engine venv without starting an engine (vLLM's own argument parser, its
# package files): marked ``engine_venv``, so `make test` runs the rest of the unit tier while the venv is being made.
ENGINE_VENV_FIXTURES = frozenset({"engine_python"})


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's python (.cache/engine-venv/bin/python, `ds4deploy engine-venv --recipe cpu`); fails the
    test, with the fix, while the venv is missing or unfinished (its `.pins` stamp is written after the last
    install): `make check-fast` leaves these tests out (-m "not engine_venv")."""
    from ds4deploy.build.engine_venv import ENGINE_PYTHON, ENGINE_VENV

    if not (ENGINE_PYTHON.is_file() and (ENGINE_VENV / ".pins").is_file()):
        pytest.fail(f"no finished engine venv at {ENGINE_VENV}: `make unit` makes it (ds4deploy engine-venv)")
    return ENGINE_PYTHON


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses an `ENGINE_FIXTURES` fixture ``engine`` and every test that uses an
    `ENGINE_VENV_FIXTURES` fixture ``engine_venv``."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if ENGINE_FIXTURES & used:
            item.add_marker(pytest.mark.engine)
        if ENGINE_VENV_FIXTURES & used:
            item.add_marker(pytest.mark.engine_venv)
