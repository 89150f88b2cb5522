"""`make help` is generated from each target's own ``##`` comment, so it lists every target and cannot drift; the
pre-commit hooks run `make lint`'s own parts (one place for each command: the Makefile)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from ds4deploy.recipe.paths import REPO_ROOT

MAKEFILE = REPO_ROOT / "Makefile"
TARGET = re.compile(r"^([a-z0-9][a-z0-9-]*)\s*:(?!=)([^\n#]*)(?:## (.*))?$", re.M)


def targets(text: str) -> dict[str, str | None]:
    """Target name -> its ``##`` comment (None without one), for every rule of a Makefile text."""
    return {m.group(1): m.group(3) for m in TARGET.finditer(text)}


def help_lines(makefile) -> dict[str, str]:
    """Target -> description as `make help` prints them for `makefile`."""
    out = subprocess.run(["make", "-s", "-f", str(makefile), "help"], capture_output=True, text=True, check=True,
                         cwd=REPO_ROOT).stdout
    return dict(re.findall(r"^  make (\S+)\s+(.*)$", out, re.M))


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def test_every_target_has_a_help_line():
    mine = targets(MAKEFILE.read_text())
    assert "deploy" in mine and "help" in mine
    assert [t for t, c in mine.items() if not c] == [], "targets without a `## ` comment"
    assert help_lines(MAKEFILE) == mine


def test_help_follows_the_comments(tmp_path):
    """A target added with a comment shows up; one without a comment is what the first test refuses."""
    mk = tmp_path / "Makefile"
    text = MAKEFILE.read_text()
    mk.write_text(text + "\nnew-thing: ## does the new thing\n\t@true\n\nbare:\n\t@true\n")
    shown = help_lines(mk)
    assert shown["new-thing"] == "does the new thing"
    assert "bare" not in shown and targets(mk.read_text())["bare"] is None


def test_pre_commit_runs_the_lint_parts():
    """Each hook runs a `lint-*` target; together they are exactly the prerequisites of `make lint`."""
    hooks = yaml.safe_load((REPO_ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    run = {re.fullmatch(r"make --no-print-directory (lint-[a-z-]+)", h["entry"]).group(1) for h in hooks}
    lint_line = re.search(r"^lint:([^#\n]*)", MAKEFILE.read_text(), re.M).group(1).split()
    assert run == set(lint_line) and "lint-shell" in run
    assert run <= set(targets(MAKEFILE.read_text()))
