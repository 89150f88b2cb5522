"""Benchmark output: one JSON file per cell (written atomically), a markdown table per profile.

Layout of an output directory (``docs/results/bench/<recipe>/`` for `make bench`)::

    <profile>.md                 the profile's table, the comparison with the recipe's expected figures, flags
    <profile>.html               interactive plots (plotly; plotly.min.js beside it)
    <profile>/cells/<cell>.json  raw per-cell results (vLLM `--save-result` keys where they mean the same)
    <profile>/*.png              static plots (matplotlib)

A cell file is written to ``<name>.tmp`` and renamed over the final name (rename is atomic on POSIX), so a killed
run leaves every finished cell complete and no half-written file under the final name.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from ds4deploy.bench import telemetry
from ds4deploy.bench.expected import Verdict
from ds4deploy.bench.prompts import CONTENT_TYPES

CONTENT_HEADER = {"code": "code", "json": "JSON", "legal": "legal", "prose": "prose", "chat": "chat"}


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_cell(out_dir: Path, profile: str, cell: dict) -> Path:
    """Write one cell record atomically to ``out_dir/<profile>/cells/<cell_id>.json``; returns the path."""
    path = out_dir / profile / "cells" / f"{cell['cell_id']}.json"
    atomic_write_text(path, json.dumps(cell, indent=1) + "\n")
    return path


def fmt_rate(v: float | None) -> str:
    """tok/s the way the reference tables (docs/sources.md) write them: 1,744 / 55.8; '-' for no value."""
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"


def fmt_s(v: float | None) -> str:
    """Seconds: 0.012 s / 1.21 s / 555.6 s; '-' for no value."""
    if v is None:
        return "-"
    if v < 1:
        return f"{v:.3f} s"
    return f"{v:.2f} s" if v < 100 else f"{v:.1f} s"


def _flag(cell: dict) -> str:
    return "" if cell["valid"] else f" ({'; '.join(cell['flags'])})"


def _prompt_label(n: int) -> str:
    return f"{n:,}"


def table_context(cells: list[dict]) -> list[str]:
    """docs/sources.md#gx10-context-table layout: one row per prompt length x concurrency (x content / thinking
    when the profile varies them)."""
    multi = len({(c["spec"]["content"], c["spec"]["thinking"]) for c in cells}) > 1
    head = "| prompt | conc. |" + (" content | thinking |" if multi else "")
    lines = [head + " aggregate t/s | per-session t/s | prefill t/s | TTFT |",
             "|---" * (head.count("|") - 1 + 4) + "|"]
    for c in cells:
        s = c["spec"]
        row = f"| {_prompt_label(s['prompt_tokens'])} | {s['concurrency']} |"
        if multi:
            row += f" {s['content']} | {_think(s['thinking'])} |"
        row += (f" {fmt_rate(c['aggregate_tok_s'])} | {fmt_rate(c['per_session_tok_s'])} | "
                f"{fmt_rate(c['prefill_tok_s'])}{_flag(c)} | {fmt_s(c['ttft_s'])} |")
        lines.append(row)
    return lines


def _think(t: bool | None) -> str:
    return {True: "on", False: "off", None: "server default"}[t]


def table_content(cells: list[dict]) -> list[str]:
    """docs/sources.md#v100x8-table layout: rows = prompt length; TTFT and prefill over the content types; a decode
    column per type.
    One table per (concurrency, thinking) combination present."""
    out: list[str] = []
    groups = sorted({(c["spec"]["concurrency"], str(c["spec"]["thinking"])) for c in cells})
    for conc, think in groups:
        sub = [c for c in cells if c["spec"]["concurrency"] == conc and str(c["spec"]["thinking"]) == think]
        types = [t for t in CONTENT_TYPES if any(c["spec"]["content"] == t for c in sub)]
        if len(groups) > 1:
            out += [f"Concurrency {conc}, thinking {_think(sub[0]['spec']['thinking'])}:", ""]
        cols = " | ".join(CONTENT_HEADER[t] for t in types)
        out += [f"| prompt | TTFT | prefill tok/s | {cols} (decode tok/s) |", "|---" * (3 + len(types)) + "|"]
        for p in sorted({c["spec"]["prompt_tokens"] for c in sub}):
            row_cells = [c for c in sub if c["spec"]["prompt_tokens"] == p]
            ttfts = [c["ttft_s"] for c in row_cells if c["ttft_s"] is not None]
            pre = [c["prefill_tok_s"] for c in row_cells if c["prefill_tok_s"] is not None]
            pre_s = "-" if not pre else (fmt_rate(pre[0]) if len(pre) == 1 else
                                         f"{fmt_rate(min(pre))}-{fmt_rate(max(pre))}")
            decode = []
            for t in types:
                cc = [c for c in row_cells if c["spec"]["content"] == t]
                decode.append(f"{fmt_rate(cc[0]['decode_tok_s'])}{'*' if not cc[0]['valid'] else ''}" if cc else "")
            ttft_s = fmt_s(statistics.median(ttfts)) if ttfts else "-"
            out.append(f"| {_prompt_label(p)} | {ttft_s} | {pre_s} | " + " | ".join(decode) + " |")
        out.append("")
    if any(not c["valid"] for c in cells):
        out.append("`*` invalid cell, see the flags below.")
    return out


def table_cells(cells: list[dict]) -> list[str]:
    """Every column for every cell."""
    lines = ["| cell | prompt tok (measured) | conc. | TTFT median / p90 | prefill t/s | decode t/s median (min-max) "
             "| aggregate t/s | e2e p90 | prefix-cache hits | spec. tokens/round | failed | flags |",
             "|---" * 12 + "|"]
    for c in cells:
        s = c["spec"]
        cnt = c.get("server_counters") or {}
        hr = cnt.get("prefix_cache_hit_rate")
        tpr = cnt.get("spec_tokens_per_round")
        p90 = c.get("p90_ttft_ms")
        e2e = c.get("p90_e2el_ms")
        rng = (f" ({fmt_rate(c['decode_tok_s_min'])}-{fmt_rate(c['decode_tok_s_max'])})"
               if c.get("decode_tok_s_min") is not None else "")
        lines.append(
            f"| {c['cell_id']} | {_prompt_label(s['prompt_tokens'])} ({fmt_rate(c['prompt_tokens_median'])}) | "
            f"{s['concurrency']} | {fmt_s(c['ttft_s'])} / {fmt_s(p90 / 1000 if p90 is not None else None)} | "
            f"{fmt_rate(c['prefill_tok_s'])} | {fmt_rate(c['decode_tok_s'])}{rng} | {fmt_rate(c['aggregate_tok_s'])} "
            f"| {fmt_s(e2e / 1000 if e2e is not None else None)} | {'-' if hr is None else f'{hr:.1%}'} | "
            f"{'-' if tpr is None else f'{tpr:.2f}'} | {c['failed']} | {'; '.join(c['flags']) or 'ok'} |")
    return lines


def clock_table(cells: list[dict]) -> list[str]:
    """docs/sources.md#gx10-clock-caps table: one row per cap; decode t/s from the cap's shortest-prompt cell,
    prefill t/s from its longest-prompt cell, actual clock / power / temperature per GPU (``A / B``) and t/s per W
    from the decode cell's telemetry (its aggregate output tok/s / its mean total power)."""
    caps: dict[str, list[dict]] = {}
    for c in cells:
        caps.setdefault(str(c.get("clock_cap_mhz")), []).append(c)
    longest = max((c["spec"]["prompt_tokens"] for c in cells), default=0)
    lines = [f"| clock cap MHz | actual MHz | decode t/s | prefill t/s ({longest:,}) | power W | temp C | t/s per W |",
             "|---" * 7 + "|"]

    def per_gpu(tel: dict, key: str, fmt: str) -> str:
        vals = [g.get(key) for g in (tel.get("gpus") or [])]
        return " / ".join("-" if v is None else format(v, fmt) for v in vals) or "-"

    for cap, cc in caps.items():
        dec = min(cc, key=lambda c: c["spec"]["prompt_tokens"])
        pre = max(cc, key=lambda c: c["spec"]["prompt_tokens"])
        tel = dec.get("telemetry") or {}
        ok = tel.get("status") == "ok"
        tpw = tel.get("tok_s_per_w")
        bad = "" if all(c["valid"] for c in cc) else " *"
        lines.append(
            f"| {'none' if cap == 'None' else cap} | {per_gpu(tel, 'graphics_mhz_mean', '.0f') if ok else '-'} | "
            f"{fmt_rate(dec['decode_tok_s'])}{bad} | {fmt_rate(pre['prefill_tok_s'])} | "
            f"{per_gpu(tel, 'power_w_mean', '.1f') if ok else '-'} | "
            f"{per_gpu(tel, 'temperature_c_max', 'd') if ok else '-'} | {'-' if tpw is None else f'{tpw:.2f}'} |")
    return lines


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    """The comparison with the recipe's expected figures."""
    if not verdicts:
        return ["The recipe has no expected figures for this profile."]
    lines = ["| cell | metric | measured | expected (range) | verdict | source |", "|---" * 6 + "|"]
    for v in verdicts:
        f = fmt_s if v.metric == "ttft_s" else fmt_rate
        ref = f"{f(v.reference)} ({f(v.low)}-{f(v.high)})" if v.reference is not None else f"{f(v.low)}-{f(v.high)}"
        lines.append(f"| {v.what} | {v.metric} | {f(v.measured)} | {ref} | {v.verdict}"
                     f"{' (cell invalid)' if v.invalid else ''} | {v.source} |")
    return lines


def markdown(meta: dict, cells: list[dict], verdicts: list[Verdict]) -> str:
    """The whole ``<profile>.md``: what was run, the table in the profile's layout, the expected comparison, and
    every flagged cell with its reason."""
    layout = {"context": table_context, "content": table_content, "cells": table_cells,
              "clocks": clock_table}[meta["layout"]]
    invalid = [c for c in cells if not c["valid"]]
    lines = [
        f"# Benchmark `{meta['profile']}` on recipe `{meta['recipe']}`",
        "",
        f"{meta['description']}. Reproduces: {meta['source']}.",
        "",
        f"Run {meta['run_id']}, {meta['date']}, server {meta['server']} (model `{meta['model']}`), client host "
        f"{meta['host']}. Sampling: max_tokens {meta['max_tokens']}, temperature {meta['temperature']}, top_p "
        f"{meta['top_p']}{', ignore_eos' if meta['ignore_eos'] else ''}; {meta['requests_per_session']} request(s) "
        f"per session; prompts salted per request: {'yes' if meta['salted'] else 'NO (cache test)'}. Decode and "
        "per-session t/s: (completion tokens - 1) / (last - first token time), median over the cell's requests; "
        "aggregate t/s: completion tokens of the cell / its wall time; prefill t/s: prompt tokens / TTFT (median).",
        "",
        *layout(cells),
        "",
        *telemetry.markdown_lines(cells, meta.get("telemetry")),
        "",
        "## Against the recipe's expected figures",
        "",
        *verdict_table(verdicts),
        "",
    ]
    if invalid:
        lines += ["## Invalid cells", ""]
        lines += [f"- {c['cell_id']}: {'; '.join(c['flags'])}" for c in invalid]
        lines.append("")
    lines += [f"Raw per-cell JSON: `{meta['profile']}/cells/`. Plots: `{meta['profile']}/*.png`, "
              f"`{meta['profile']}.html`.", ""]
    return "\n".join(lines)
