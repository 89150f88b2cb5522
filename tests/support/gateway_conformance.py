"""The client conformance matrix through a deployed gateway, compared with the committed report of the stack its
backends run (tests/gateway: the loopback gateway in front of llama-servers; tests/office: the office gateway in front
of two vLLM `cpu--lan` stacks)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

from ds4deploy.conformance import cases
from ds4deploy.recipe.load import load_recipe

REPO = Path(__file__).resolve().parents[2]

# The matrix's cases but the tool-argument fidelity ones (args.*, messages.args.*: 18 cases, 72 rows, three quarters
# of the matrix's time here, each model-dependent on the tiny model: they measure what the model writes into a call's
# arguments, which the gateway passes through as it passes every other tool field). The whole matrix through the
# loopback gateway once (2026-12-02): 248 s, 38 pass, 0 fail, as on the stack.
MATRIX_CASES = [c.name for c in cases.CASES if not c.name.startswith(("args.", "messages.args."))]


def through_gateway(recipe: str, url: str, key_file: Path, model: str, out: Path,
                    findings: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict, list]:
    """Run `ds4deploy conformance <recipe> --url <url>` (the recipe names the engine family whose rules judge the
    rows) on `MATRIX_CASES` as one Claude Code session (one `x-claude-code-session-id`, so every request stays on one
    backend: a seeded answer repeated on another backend may differ), and compare its rows with the stack's committed
    report, docs/results/conformance/<recipe's base>/conformance.json.

    Returns (the CLI's process, its report, lost): lost lists (case, mode, verdict here, evidence) of every row that
    passes in the committed report and not through the gateway, but rows judged by one of the engine rules named in
    `findings` (a known engine bug met now and then, e.g. llama.cpp's "stream-without-message-start").

    Raises AssertionError when the CLI wrote no report, or the report's rows are not the committed report's rows of
    these cases."""
    base = load_recipe(recipe).base_name
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "conformance", recipe, "--url", url, "--key-file",
                        str(key_file), "--model", model, "--out", str(out), "--only", ",".join(MATRIX_CASES),
                        "--header", f"x-claude-code-session-id: matrix-{secrets.token_hex(4)}"],
                       capture_output=True, text=True, cwd=REPO, check=False)
    report_file = out / "conformance.json"
    assert report_file.is_file(), p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(report_file.read_text())
    print(f"conformance through the gateway: {time.monotonic() - t0:.0f} s, {report['counts']}")
    stack = json.loads((REPO / "docs" / "results" / "conformance" / base / "conformance.json").read_text())
    here = {(r["case"], r["mode"]): r for r in report["results"]}
    stack_rows = [r for r in stack["results"] if r["case"] in MATRIX_CASES]
    assert set(here) == {(r["case"], r["mode"]) for r in stack_rows}
    for r in stack_rows:
        got = here[r["case"], r["mode"]]
        if got["verdict"] != r["verdict"]:
            print(f"  {r['case']} [{r['mode']}]: {r['verdict']} on the stack, {got['verdict']} here: "
                  f"{got['evidence'][:200]}")
    lost = [(r["case"], r["mode"], here[r["case"], r["mode"]]["verdict"], here[r["case"], r["mode"]]["evidence"][:160])
            for r in stack_rows if r["verdict"] == "pass" and here[r["case"], r["mode"]]["verdict"] != "pass"
            and here[r["case"], r["mode"]].get("rule") not in findings]
    return p, report, lost
