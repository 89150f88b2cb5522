"""The conformance reports: one JSON (every result, machine-readable) and one markdown page (the table an owner
reads), written side by side as ``<out>/conformance.json`` and ``<out>/conformance.md``, and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from ds4deploy.bench.report import atomic_write_text
from ds4deploy.conformance import engine_rules
from ds4deploy.conformance.cases import FAIL, FINDING, MODEL, PASS, VERDICTS

SCHEMA = "ds4deploy-conformance/1"
STYLE = {PASS: "green", FAIL: "bold red", MODEL: "yellow", FINDING: "magenta"}


def counts(results: list[dict]) -> dict[str, int]:
    """Results per verdict, every verdict listed (0 when absent)."""
    return {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}


def by_mode(results: list[dict]) -> dict[str, dict[str, int]]:
    """Results per mode label (``stream+think``, ``no-stream``, ``-``, ...), each with its count per verdict, in
    the order the modes first appear."""
    out: dict[str, dict[str, int]] = {}
    for r in results:
        row = out.setdefault(r["mode"], {v: 0 for v in VERDICTS})
        row[r["verdict"]] += 1
    return out


def exit_code(results: list[dict]) -> int:
    """1 when any case failed, else 0 (model-dependent results and findings do not fail a run)."""
    return 1 if any(r["verdict"] == FAIL for r in results) else 0


def table(meta: dict, results: list[dict]) -> Table:
    """The rich table: case, mode, verdict (coloured), evidence."""
    t = Table(title=f"conformance {meta['target']} ({meta['server_version']}, model {meta['model']})",
              expand=False)
    for col in ("case", "mode", "verdict", "evidence"):
        t.add_column(col, overflow="fold")
    for r in results:
        t.add_row(r["case"], r["mode"], f"[{STYLE[r['verdict']]}]{r['verdict']}[/]", r["evidence"])
    return t


def summary_line(meta: dict, results: list[dict]) -> str:
    """``N results: a pass, b fail, ... in S s``."""
    c = counts(results)
    return (f"{len(results)} results: " + ", ".join(f"{c[v]} {v}" for v in VERDICTS)
            + f" in {meta['duration_s']:.1f} s")


def mode_line(results: list[dict]) -> str:
    """``per mode: <mode> <pass>/<results> pass, ...``: how many cases pass in each mode."""
    return "per mode: " + ", ".join(f"{m} {c[PASS]}/{sum(c.values())} pass" for m, c in by_mode(results).items())


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(meta: dict, results: list[dict], docs: dict[str, str],
             rules: engine_rules.FamilyRules | None = None) -> str:
    """The markdown report: what was tested against what, the counts, one row per case and mode, what each
    case checks (`docs`: case name -> description) and the engine family's rules that judged it (`rules`)."""
    lines = [
        f"# Client conformance: {meta['target']}",
        "",
        f"Written by `ds4deploy conformance` on {meta['date']}; raw results in `conformance.json`.",
        "",
        "| | |",
        "|---|---|",
        f"| server | {meta['url']} |",
        f"| server version | {meta['server_version']} |",
        f"| model | {meta['model']} (context {meta['max_model_len']} tokens) |",
        f"| recipe | {meta['recipe'] or '-'} (sha256 {meta['recipe_sha256'] or '-'}) |",
        f"| clients | {', '.join(f'{k} {v}' for k, v in meta['clients'].items())} |",
        f"| duration | {meta['duration_s']:.1f} s |",
        f"| result | {summary_line(meta, results)} |",
        "",
        "Verdicts: **pass** seen and right; **fail** the server broke the contract; **model-dependent** the model "
        "did not show the behaviour (the reason is given; forced modes never get this verdict); **finding** works as "
        "built, but an owner must know it.",
        "",
        "Per mode (a case runs in every stream x thinking mode that applies to it; `-`: the mode does not apply):",
        "",
        "| mode | " + " | ".join(VERDICTS) + " |",
        "|---|" + "---|" * len(VERDICTS),
        *[f"| {m} | " + " | ".join(str(c[v]) for v in VERDICTS) + " |" for m, c in by_mode(results).items()],
        "",
        "| case | mode | verdict | evidence |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['mode']} | {r['verdict']} | {_md_cell(r['evidence'])} |" for r in results]
    lines += ["", "## What each case checks", ""]
    lines += [f"- `{name}`: {_md_cell(doc)}" for name, doc in docs.items()]
    if rules is not None and (rules.forced or rules.rules):
        used = {r.get("rule") for r in results}
        lines += ["", f"## Judged by the {rules.family} family's rules ({rules.engine})", "",
                  "A row a rule re-judged keeps the case's own verdict as `raw_verdict` in conformance.json.", ""]
        if rules.forced:
            held = [r for r in results if (r["case"], r["mode"]) in rules.forced]
            lines.append(f"- `forced` ({sum(r['verdict'] == PASS for r in held)} of {len(held)} rows passed): "
                         + ", ".join(f"{c} [{m}]" for c, m in sorted(rules.forced))
                         + f" must pass ({_md_cell(rules.forced_source)})")
        lines += [f"- `{r.name}` ({'used' if r.name in used else 'unused'}, {r.verdict}): {_md_cell(r.cause)}; "
                  f"source: {_md_cell(r.source)}" for r in rules.rules]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, meta: dict, results: list[dict], docs: dict[str, str],
          rules: engine_rules.FamilyRules | None = None) -> tuple[Path, Path]:
    """Write conformance.json and conformance.md into `out_dir` (created), atomically; `rules`: the engine
    family's rules that judged `results` (listed in the markdown). Returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m = out_dir / "conformance.json", out_dir / "conformance.md"
    atomic_write_text(j, json.dumps({"schema": SCHEMA, **meta, "counts": counts(results),
                                     "by_mode": by_mode(results), "results": results},
                                    indent=1) + "\n")
    atomic_write_text(m, markdown(meta, results, docs, rules))
    return j, m
