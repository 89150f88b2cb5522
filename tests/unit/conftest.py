"""Shared helpers for unit tests: a scratch recipe directory built from the committed cpu recipe."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
    import ds4deploy.recipe
    import ds4deploy.render

    monkeypatch.setattr(ds4deploy.recipe, "RECIPES_DIR", d)
    monkeypatch.setattr(ds4deploy.render, "COMPOSE_DIR", tmp_path / "compose")
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
