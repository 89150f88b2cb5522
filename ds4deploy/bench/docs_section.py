"""Regenerated sections of the benchmark documents in docs/, and where generated evidence goes.

Each `make bench-*` target owns one section of a markdown file, between an HTML-comment begin and end marker; the
text outside the markers is written by people and never touched. Everything a run generates whole (raw JSON, run
logs, per-cell reports, plots, conformance reports) goes under ``docs/results/`` (`RESULTS_DIR`), so docs/ itself
holds prose.
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.recipe.paths import REPO_ROOT

# docs/results/ of this checkout: the one place generated evidence is written to.
RESULTS_DIR = REPO_ROOT / "docs" / "results"


def results_beside(md_path: Path, name: str) -> Path:
    """Where the raw results file `name` of the document `md_path` goes: ``results/<name>`` in the document's folder
    (``docs/results/bench-stack.json`` for ``docs/benchmarks.md``); the folder is created when missing."""
    out = md_path.parent / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def write_section(path: Path, begin: str, end: str, section: str, title: str) -> None:
    """Replace the text from `begin` to `end` in `path` with `section`, or append it when the markers are absent.

    Args:
        path: the markdown file; created as ``# <title>`` when missing.
        begin, end: the markers; `section` must start with `begin` and end with `end` (a trailing newline is ignored).
        section: the new section, markers included.
        title: heading of a newly created file.
    """
    section = section.rstrip("\n")
    text = path.read_text(encoding="utf-8") if path.is_file() else f"# {title}\n\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")
