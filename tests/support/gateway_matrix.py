"""The client conformance matrix through a gateway in front of cpu-llamacpp backends (tests/gateway's loopback rig,
tests/office's stand-in hosts), judged against the stack's own committed report."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

from ds4deploy.conformance import cases

REPO = Path(__file__).resolve().parents[2]
# The matrix's cases but the tool-argument fidelity ones (args.*, messages.args.*: 18 cases, 72 rows, three quarters
# of the matrix's time here, each model-dependent on the tiny model: they measure what the model writes into a call's
# arguments, which the gateway passes through as it passes every other tool field). The whole matrix through the
# gateway once (2026-12-02): 248 s, 38 pass, 0 fail, as on the stack.
MATRIX_CASES = [c.name for c in cases.CASES if not c.name.startswith(("args.", "messages.args."))]


def check_matrix_through(url: str, key_file: Path, key: str, model: str, out: Path) -> dict:
    """`ds4deploy conformance cpu-llamacpp` against the gateway at `url` with a person's key (`key_file`, holding
    `key`), model name `model`, report under `out`: asserts the CLI fails no row, as on the cpu-llamacpp stack, that
    every row passing in the stack's committed report (docs/results/conformance/cpu-llamacpp/) passes here too, and
    that the key is in no output. Returns the report."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "conformance", "cpu-llamacpp", "--url", url,
                        "--key-file", str(key_file), "--model", model, "--out", str(out), "--only",
                        ",".join(MATRIX_CASES),
                        # One session, as Claude Code keeps one: every request on one backend (a seeded answer
                        # repeated on the other backend may differ: each llama-server's prompt cache and batches are
                        # its own).
                        "--header", f"x-claude-code-session-id: matrix-{secrets.token_hex(4)}"],
                       capture_output=True, text=True, cwd=REPO, check=False)
    report_file = out / "conformance.json"
    assert report_file.is_file(), p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(report_file.read_text())
    print(f"conformance through the gateway: {time.monotonic() - t0:.0f} s, {report['counts']}")
    assert report["engine_family"] == "llamacpp" and report["url"] == url
    failed = [(r["case"], r["mode"], r["evidence"][:200]) for r in report["results"] if r["verdict"] == "fail"]
    # A streamed /v1/messages answer that llama-server opened without message_start (its first token held back
    # inside a UTF-8 character: 3 of 50 streams on a backend directly, 2 of 50 through the gateway) is the llama.cpp
    # family's named finding (engine_rules "stream-without-message-start"), not a failed row.
    assert p.returncode == 0 and not failed, (p.returncode, failed)
    stack = json.loads((REPO / "docs" / "results" / "conformance" / "cpu-llamacpp" / "conformance.json").read_text())
    here = {(r["case"], r["mode"]): r for r in report["results"]}
    stack_rows = [r for r in stack["results"] if r["case"] in MATRIX_CASES]
    assert set(here) == {(r["case"], r["mode"]) for r in stack_rows}
    for r in stack_rows:
        if here[r["case"], r["mode"]]["verdict"] != r["verdict"]:
            print(f"  {r['case']} [{r['mode']}]: {r['verdict']} on the stack, {here[r['case'], r['mode']]['verdict']} "
                  f"here: {here[r['case'], r['mode']]['evidence'][:200]}")
    lost = [(r["case"], r["mode"], here[r["case"], r["mode"]]["verdict"], here[r["case"], r["mode"]]["evidence"][:160])
            for r in stack_rows if r["verdict"] == "pass" and here[r["case"], r["mode"]]["verdict"] != "pass"
            and here[r["case"], r["mode"]].get("rule") != "stream-without-message-start"]
    assert not lost, lost
    assert key not in p.stdout + p.stderr + report_file.read_text()
    return report
