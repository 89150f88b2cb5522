"""The render contract inside a real container: a recipe with `$` in an env value and in a JSON argument, rendered
and created by the real `docker compose` from the deployed engine image; Docker's own record of the container holds
the argv and environment it starts with. Runs after the main deploy of `make test` (the image exists then)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ds4deploy.recipe.load import load_recipe
from ds4deploy.render.compose import compose_binary, render, write_all

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "unit" / "fixtures" / "render_contract" / "33-dollar-in-json-arg" / "cpu.yaml"


def test_the_container_gets_the_literal_strings(tmp_path):
    """`docker compose create` makes the engine container from the render; `docker inspect` shows the argv and
    environment Docker will start it with."""
    docker = shutil.which("docker")
    if docker is None or compose_binary() is None:
        pytest.skip("needs docker and the compose binary (make deploy installs both)")
    recipe = load_recipe(CASE)
    write_all([render(recipe)], tmp_path)
    compose = tmp_path / "cpu" / "compose.yaml"
    project = "ds4-delivery-test"
    env = {**os.environ, "DS4_SECRETS_ENV": "/dev/null", "DS4_MODEL_DIR": str(tmp_path)}
    base = [compose_binary(), "-f", str(compose), "-p", project]
    try:
        p = subprocess.run([*base, "create", "engine"], capture_output=True, text=True, env=env, timeout=300,
                           check=False)
        assert p.returncode == 0, p.stderr
        ids = subprocess.run([*base, "ps", "-aq", "engine"], capture_output=True, text=True, env=env, timeout=60,
                             check=True).stdout.split()
        assert ids, "compose created no engine container"
        config = json.loads(subprocess.run([docker, "inspect", ids[0]], capture_output=True, text=True,
                                           timeout=60, check=True).stdout)[0]["Config"]
    finally:
        subprocess.run([*base, "down", "-v"], capture_output=True, env=env, timeout=120, check=False)
    env_of = dict(e.split("=", 1) for e in config["Env"])
    assert env_of["PROMPT_TAG"] == "cost=$5"
    argv = config["Cmd"]
    assert argv == [*recipe.engine.entrypoint, *json.loads((tmp_path / "cpu" / "engine-args.json").read_text())]
    assert json.loads(argv[argv.index("--override-generation-config") + 1])["stop"] == ["$HOME", "${END}", "</s>$"]
