"""Sources live in the repo: no product file cites notes a user's clone does not have, and every
``docs/sources.md#<anchor>`` link names a section that exists.

Anchors are GitHub's: a heading's slug (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2``... for
repeats) or an explicit ``<a id="...">`` / ``<a name="...">``.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "docs" / "sources.md"

# Citations of the project's private background notes: the notes directory beside the repo, and the notes by name
# (with or without ".md", e.g. "SEEDS B", "UPSTREAM sm121").
PRIVATE_CITATION = re.compile(r"\.\./shared\b|\bshared/(SEEDS|UPSTREAM|STYLE)\b|\bSEEDS\b|\bUPSTREAM\b")
# A link to a section of docs/sources.md: from anywhere by its repo path, from docs/ by its file name.
SOURCES_LINK = re.compile(r"(?<![\w.-])sources\.md#([A-Za-z0-9_-]+)")
SELF_LINK = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def repo_files() -> list[Path]:
    """Files in the tree that git tracks or would track (untracked but not ignored), as absolute paths."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return [REPO / p for p in sorted(set(out.split("\0"))) if p and (REPO / p).is_file()]


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary (not UTF-8) file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def private_citations(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line citing the private notes."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if PRIVATE_CITATION.search(line)]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading text: inline markup and punctuation dropped, lower case, spaces to
    hyphens (its rule: keep letters, digits, spaces, hyphens and underscores)."""
    text = re.sub(r"<[^>]+>", "", heading)                      # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)        # links keep their text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor a markdown page defines: explicit ``<a id/name>`` and heading slugs with GitHub's suffixes."""
    found = set(EXPLICIT_ANCHOR.findall(markdown))
    seen: Counter[str] = Counter()
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            slug = github_slug(m.group(1))
            found.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return found


def broken_links(text: str, known: set[str], self_page: bool = False) -> list[str]:
    """Anchors linked to docs/sources.md (and, on that page itself, ``](#anchor)``) that it does not define."""
    linked = SOURCES_LINK.findall(text) + (SELF_LINK.findall(text) if self_page else [])
    return sorted({a for a in linked if a not in known})


def test_no_product_file_cites_the_private_notes():
    offenders = []
    for path in repo_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "tests":
            continue
        text = read_text(path)
        if text is None:
            continue
        offenders += [f"{rel}:{n}: {line}" for n, line in private_citations(text)]
    assert offenders == [], ("cite a section of docs/sources.md (docs/sources.md#<anchor>) or the public page "
                             "instead:\n" + "\n".join(offenders))


def test_every_sources_link_names_an_existing_anchor():
    known = anchors(SOURCES.read_text(encoding="utf-8"))
    assert {"v100x8", "rtx3090-xeon", "gx10-pair"} <= known
    broken = []
    for path in repo_files():
        text = None if path == Path(__file__).resolve() else read_text(path)  # this file holds bad links on purpose
        if text is None:
            continue
        broken += [f"{path.relative_to(REPO)}: #{a}" for a in broken_links(text, known, path == SOURCES)]
    assert broken == [], "links to anchors docs/sources.md does not define:\n" + "\n".join(broken)


def test_the_checks_catch_bad_input():
    """The scanners above find what they must (so the two tree-wide tests can fail) and pass what they must."""
    assert [n for n, _ in private_citations("ok\n# see ../shar" + "ed/SEEDS.md C\nfrom SEEDS B\nUPSTREAM sm121\n")] == \
        [2, 3, 4]
    assert private_citations("the upstream vLLM issue; seeds of the prompt salt; shared memory") == []
    page = "# Sources\n\n<a id=\"gx10-pair\"></a>\n### 2x GX10 (GB10, sm121): FP8\n## Tools\n## Tools\n```\n# no\n```\n"
    known = anchors(page)
    assert known == {"sources", "gx10-pair", "2x-gx10-gb10-sm121-fp8", "tools", "tools-1"}
    assert broken_links("see docs/sources.md#gx10-pair and sources.md#tools-1", known) == []
    assert broken_links("see docs/sources.md#gx10-typo, [x](sources.md#no)", known) == ["gx10-typo", "no"]
    assert broken_links("[a](#missing) [b](#tools)", known, self_page=True) == ["missing"]
    assert broken_links("[a](#missing)", known) == []
