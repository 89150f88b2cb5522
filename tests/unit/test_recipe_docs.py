"""Each reference recipe's comparison document (docs/recipes/<name>.md) explains every line of its committed render.

The document's table has one row per engine flag, environment variable and container setting:
``| flag | `--max-model-len` | `1048576` | <anchor's value> | <source> | <reason> |`` (kinds: flag, env, container).
The test parses those rows and fails when a render (compose/<name>/engine-args.json, compose*.yaml) has a
flag, variable or setting the table does not list, when a listed value differs from the rendered one, or when a row
says "not set" (ours ``—``) for something the render sets. Variants (compose/<name>--<variant>/) must use only names
the table lists; their values are the variant's operating choices, named in the document's variant section.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ["v100x8-ds41-flash-iq2", "rtx3090x2-xeon-ds4-flash", "gx10x2-ds4-flash-fp8"]
NOT_SET = "—"
# A bare flag (no value) is written `on` in the document.
BARE = "on"
ROW = re.compile(r"^\|\s*(flag|env|container)\s*\|\s*`([^`]+)`\s*\|\s*([^|]*?)\s*\|")
# Container settings whose rendered value is one scalar, compared with the document's.
SCALAR_SETTINGS = ("image", "user", "network_mode", "ipc", "shm_size", "restart", "stop_grace_period")


def doc_rows(text: str) -> dict[tuple[str, str], str]:
    """(kind, name) -> our value as the table states it (backticks removed; NOT_SET when we do not set it).

    Raises:
        AssertionError: a (kind, name) is listed twice.
    """
    rows: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        kind, name, ours = m.group(1), m.group(2), m.group(3).strip()
        assert (kind, name) not in rows, f"{kind} {name} listed twice"
        rows[(kind, name)] = ours.strip("`") if ours.startswith("`") else ours
    return rows


def flags_of(argv: list[str]) -> dict[str, str]:
    """``--name`` -> value (BARE for a flag without one) over an argument list."""
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else BARE
    return out


def render_lines(render_dir: Path) -> dict[tuple[str, str], str | None]:
    """(kind, name) -> rendered value (None where the setting is structured and only its presence is compared)."""
    lines: dict[tuple[str, str], str | None] = {}
    for name, value in flags_of(json.loads((render_dir / "engine-args.json").read_text())).items():
        lines[("flag", name)] = value
    for compose in sorted(render_dir.glob("compose*.yaml")):
        services = yaml.safe_load(compose.read_text())["services"]
        # The engine's lines; the front door service is explained in docs/front-door.md.
        for svc in (v for k, v in services.items() if k.startswith("engine")):
            for name, value in flags_of([str(a) for a in svc.get("command", [])]).items():
                lines[("flag", name)] = value
            for key, value in (svc.get("environment") or {}).items():
                lines[("env", key)] = str(value)
            for key, value in svc.items():
                if key != "environment":  # each variable is its own `env` row
                    lines[("container", key)] = str(value) if key in SCALAR_SETTINGS else None
            for key, value in (svc.get("ulimits") or {}).items():
                lines[("container", f"ulimits.{key}")] = str(value)
    return lines


def _compare(rows: dict, lines: dict, check_values: bool) -> list[str]:
    problems = []
    for key, value in sorted(lines.items()):
        if key not in rows:
            problems.append(f"{key[0]} {key[1]} is rendered but not in the document")
        elif rows[key] == NOT_SET:
            problems.append(f"{key[0]} {key[1]} is rendered but the document says we do not set it")
        elif check_values and value is not None and rows[key] != value:
            problems.append(f"{key[0]} {key[1]}: rendered {value!r}, document {rows[key]!r}")
    return problems


@pytest.mark.parametrize("name", REFERENCE)
def test_the_document_explains_every_rendered_line(name):
    rows = doc_rows((ROOT / "docs" / "recipes" / f"{name}.md").read_text())
    lines = render_lines(ROOT / "compose" / name)
    assert _compare(rows, lines, check_values=True) == []
    stale = [f"{k[0]} {k[1]}" for k, v in rows.items() if v != NOT_SET and k not in lines]
    assert stale == [], "the document lists values the render does not set"
    for variant in sorted((ROOT / "compose").glob(f"{name}--*")):
        assert _compare(rows, render_lines(variant), check_values=False) == [], variant.name


def test_the_check_fails_on_an_unexplained_or_changed_line(tmp_path):
    name = "gx10x2-ds4-flash-fp8"
    rows = doc_rows((ROOT / "docs" / "recipes" / f"{name}.md").read_text())
    render = tmp_path / name
    render.mkdir()
    (render / "engine-args.json").write_text((ROOT / "compose" / name / "engine-args.json").read_text())
    args = json.loads((render / "engine-args.json").read_text())
    args[args.index("--max-num-seqs") + 1] = "7"
    (render / "engine-args.json").write_text(json.dumps([*args, "--enforce-eager"]))
    head = yaml.safe_load((ROOT / "compose" / name / "compose.head.yaml").read_text())
    head["services"]["engine"]["environment"]["VLLM_SOMETHING_NEW"] = "1"
    cmd = head["services"]["engine"]["command"]
    cmd[cmd.index("--max-num-seqs") + 1] = "7"
    (render / "compose.head.yaml").write_text(yaml.safe_dump(head))
    problems = _compare(rows, render_lines(render), check_values=True)
    assert "flag --enforce-eager is rendered but not in the document" in problems
    assert "env VLLM_SOMETHING_NEW is rendered but not in the document" in problems
    assert "flag --max-num-seqs: rendered '7', document '6'" in problems
