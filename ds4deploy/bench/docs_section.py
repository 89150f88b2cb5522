"""Regenerated sections of the benchmark documents in docs/.

Each `make bench-*` target owns one section of a markdown file, between an HTML-comment begin and end marker; the
text outside the markers is written by people and never touched.
"""

from __future__ import annotations

from pathlib import Path


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
