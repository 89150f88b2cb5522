"""End-to-end bad-input tests: run the real `make deploy` with broken recipes and assert one clear message,
a non-zero exit, no traceback and no container left behind.

Each test writes a variant of recipes/cpu.yaml into a scratch recipe directory (DS4_RECIPES_DIR) and renders it
into a scratch compose directory (DS4_COMPOSE_DIR); the committed recipes are never touched. These run after
the main deploy of `make test`, so the engine image is already built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


class Scratch:
    """A scratch recipe/compose directory pair and helpers to deploy from it."""

    def __init__(self, root: Path) -> None:
        self.recipes = root / "recipes"
        self.compose = root / "compose"
        self.recipes.mkdir()
        shutil.copy(REPO / "recipes" / "cpu.manifest.json", self.recipes / "cpu.manifest.json")
        self.env = dict(os.environ, DS4_RECIPES_DIR=str(self.recipes), DS4_COMPOSE_DIR=str(self.compose),
                        ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")

    def variant(self, name: str, edit, render: bool = True) -> str:
        data = yaml.safe_load((REPO / "recipes" / "cpu.yaml").read_text())
        data["name"] = name
        data["serving"]["port"] = 8093  # never the port of the main deploy
        edit(data)
        (self.recipes / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        self.copy_manifest(name)
        if render:
            subprocess.run([str(VENV_BIN / "ds4deploy"), "render", name], env=self.env, check=True,
                           capture_output=True)
        return name

    def copy_manifest(self, name: str) -> None:
        """The cpu recipe's model manifest as recipe `name`'s: the same files, recorded for `name` (a manifest names
        the recipe it was locked for, and the deploy refuses one copied from another recipe)."""
        manifest = json.loads((self.recipes / "cpu.manifest.json").read_text())
        (self.recipes / f"{name}.manifest.json").write_text(json.dumps({**manifest, "recipe": name}, indent=2) + "\n")

    def deploy(self, name: str, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", "deploy", f"RECIPE={name}", *extra], cwd=REPO,
                              env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def write(self, name: str, data: dict, manifest: bool = True) -> str:
        """Write recipe `name` (a full recipe dict) into the scratch recipes/ and render it; `manifest`: with a
        copy of the cpu recipe's model manifest."""
        (self.recipes / f"{name}.yaml").write_text(yaml.safe_dump({**data, "name": name}, sort_keys=False))
        if manifest:
            self.copy_manifest(name)
        subprocess.run([str(VENV_BIN / "ds4deploy"), "render", name], env=self.env, check=True, capture_output=True)
        return name


@pytest.fixture
def scratch(tmp_path):
    return Scratch(tmp_path)


def containers_of(project: str) -> list[str]:
    """Every container (running or not) of a compose project."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()
