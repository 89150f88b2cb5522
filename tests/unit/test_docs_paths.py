"""Every repository path and make target the README and docs/*.md name exists (so a reader following them is not
sent to a deleted file). Paths are the backticked words and markdown link targets that look like files: a
``<placeholder>`` matches any name; a bare file name (``render.py``) must exist somewhere in the repository."""

from __future__ import annotations

import os
import re
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

import pytest

from ds4deploy.recipe.paths import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# What a path-looking word ends with when it names a file of this repository.
SUFFIXES = (".py", ".yml", ".yaml", ".md", ".json", ".sh", ".txt", ".j2", ".cfg", ".toml", ".jsonl", ".h", ".pcap",
            "Dockerfile", "Makefile")
# Top-level folders a relative path starts with.
TOP = {p.name for p in REPO_ROOT.iterdir() if not p.name.startswith(".")}
TICKED = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# `make X` at the start of a backticked span or of a line in a fenced code block; `make bench-*` names a family.
MAKE = re.compile(r"(?:`|^\s*)make ([a-z0-9][a-z0-9-]*[a-z0-9])(?![-*\w])", re.M)
FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.S)
# Paths the deploy creates (on the control host or in a bundle), not files of the repository.
# Written by the tool when a user runs it (not in a fresh clone): build output, locks an owner creates, the model's
# own files.
CREATED = ("dist/", ".cache/", ".venv/", "wheelhouse/", "cells/", "docs/results/bench/<recipe>/", "<profile>/",
           "bundle.json", "recipes/<r>.lock.json", "recipes/rtx3090x2-xeon-ds4-flash.lock.json", "config.json")


@cache
def repo_paths() -> tuple[str, ...]:
    """Every file and folder of the working tree, relative, with "/" (dot folders such as .venv and .git left out).
    """
    out = []
    for root, dirs, files in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        rel = Path(root).relative_to(REPO_ROOT)
        out += [str(rel / n) for n in dirs + files]
    return tuple(sorted(p.removeprefix("./") for p in out))


def _candidates(text: str) -> set[str]:
    out = set()
    for w in TICKED.findall(text):
        w = w.rstrip(".,:;")
        if w.startswith(("/", "http", "-", "$", "~", "../")) or any(c in w for c in "=*:") or w.startswith(CREATED):
            continue
        head = w.split("/", 1)[0]
        if ("/" in w and head in TOP) or ("/" not in w and w.endswith(SUFFIXES) and not w.startswith(".")):
            out.add(w)
    return out


def _broken_links(text: str, doc: Path) -> list[str]:
    """Markdown link targets that are not web addresses and name no file or folder beside `doc`."""
    return sorted(t for t in LINK.findall(text)
                  if not t.startswith(("http://", "https://", "mailto:")) and not (doc.parent / t).exists())


def _exists(word: str, doc: Path) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", word).rstrip("/")
    if "/" not in word:
        return any(fnmatchcase(p.rsplit("/", 1)[-1], pattern) for p in repo_paths())
    rel = doc.parent.relative_to(REPO_ROOT) if doc.parent.is_relative_to(REPO_ROOT) else Path(".")
    tries = [pattern] if rel == Path(".") else [pattern, f"{rel}/{pattern}"]
    return any(fnmatchcase(p, t) for t in tries for p in repo_paths())


def make_named(text: str) -> set[str]:
    """Make targets a document tells the reader to run (inline code and fenced code blocks; prose is not read)."""
    inline = {m for m in MAKE.findall(text)}
    return {m for m in inline if f"`make {m}" in text} | {m for block in FENCED.findall(text) for m in
                                                           MAKE.findall(block)}


def make_targets() -> set[str]:
    """Targets defined in the Makefile (``name:`` at the start of a line)."""
    text = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z0-9][a-z0-9-]*)\s*:(?!=)", text, re.M))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_path_exists(doc):
    text = doc.read_text()
    missing = sorted(w for w in _candidates(text) if not _exists(w, doc)) + _broken_links(text, doc)
    assert missing == [], f"{doc.relative_to(REPO_ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_make_target_exists(doc):
    missing = sorted(make_named(doc.read_text()) - make_targets())
    assert missing == [], f"{doc.relative_to(REPO_ROOT)} names make targets the Makefile does not define: {missing}"


def test_the_checks_find_a_missing_path_and_target(tmp_path):
    doc = tmp_path / "x.md"
    text = ("Run `tools/benchval/gone.py`, see [old](nothere.md), `gone_module.py`; then `make nosuchtarget`, "
            "the `make bench-*` family, and make sure of it.\n```\nmake deploy\nmake gone-too\n```\n")
    assert _candidates(text) == {"tools/benchval/gone.py", "gone_module.py"}
    assert not any(_exists(w, doc) for w in _candidates(text))
    assert _broken_links(text, doc) == ["nothere.md"]
    (tmp_path / "nothere.md").write_text("")
    assert _broken_links(text, doc) == []
    assert _exists("compose/<name>/compose.yaml", doc) and _exists("compose.py", doc)
    assert make_named(text) == {"nosuchtarget", "deploy", "gone-too"}
    assert make_named(text) - make_targets() == {"nosuchtarget", "gone-too"}
