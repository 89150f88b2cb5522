"""Markdown tables laid out like the reference tables of docs/sources.md, and atomic per-cell JSON writes."""

from __future__ import annotations

import json
import os

import pytest

from ds4deploy.bench import report
from ds4deploy.bench.expected import compare
from ds4deploy.recipe.load import load_recipe


def cell(prompt, conc, content="prose", thinking=None, valid=True, flags=(), **m):
    rec = {"cell_id": f"p{prompt}-c{conc}-{content}", "valid": valid, "flags": list(flags), "failed": 0,
           "spec": {"prompt_tokens": prompt, "concurrency": conc, "content": content, "thinking": thinking},
           "aggregate_tok_s": None, "per_session_tok_s": None, "decode_tok_s": None, "prefill_tok_s": None,
           "ttft_s": None, "prompt_tokens_median": prompt, "decode_tok_s_min": None, "decode_tok_s_max": None,
           "p90_ttft_ms": None, "p90_e2el_ms": None, "server_counters": None}
    rec.update(m)
    return rec


META = {"profile": "gx10-context", "description": "d", "source": "s", "layout": "context", "recipe": "r",
        "run_id": "abcd1234", "date": "2026-11-29 20:00 UTC", "server": "http://x", "model": "m", "host": "h",
        "max_tokens": 2048, "temperature": 0.6, "top_p": 0.95, "ignore_eos": False, "requests_per_session": 1,
        "salted": True}


def test_context_layout_matches_seeds_b():
    cells = [cell(256, 1, aggregate_tok_s=55.8, per_session_tok_s=56.1, prefill_tok_s=1744.0, ttft_s=0.21),
             cell(2048, 1, valid=False, flags=["cache hit: 2,000 of 2,048"], aggregate_tok_s=49.8,
                  per_session_tok_s=50.1, prefill_tok_s=9480.0, ttft_s=0.23)]
    lines = report.table_context(cells)
    assert lines[0] == "| prompt | conc. | aggregate t/s | per-session t/s | prefill t/s | TTFT |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| 256 | 1 | 55.8 | 56.1 | 1,744 | 0.210 s |"
    assert lines[3] == "| 2,048 | 1 | 49.8 | 50.1 | 9,480 (cache hit: 2,000 of 2,048) | 0.230 s |"


def test_content_layout_matches_seeds_a():
    cells = [cell(1024, 1, c, True, decode_tok_s=d, ttft_s=t, prefill_tok_s=p) for c, d, t, p in
             (("code", 215.0, 1.2, 948.0), ("json", 203.0, 1.1, 820.0), ("legal", 118.0, 1.25, 900.0))]
    lines = report.table_content(cells)
    assert lines[0] == "| prompt | TTFT | prefill tok/s | code | JSON | legal (decode tok/s) |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| 1,024 | 1.20 s | 820.0-948.0 | 215.0 | 203.0 | 118.0 |"


def test_markdown_names_invalid_cells_and_the_expected_comparison():
    exp = load_recipe("gx10x2-ds4-flash-fp8").expected
    cells = [cell(256, 1, per_session_tok_s=56.0, ttft_s=0.2, aggregate_tok_s=55.0, prefill_tok_s=1700.0),
             cell(2048, 1, valid=False, flags=["cache hit: the prefix cache served 2,000 of 2,048"])]
    md = report.markdown(META, cells, compare(cells, "gx10-context", exp))
    assert "| 256 x 1 | per_session_tok_s | 56.0 | 56.1 (50.5-61.7) | within |" in md
    assert "## Invalid cells" in md and "- p2048-c1-prose: cache hit" in md


def test_cell_write_is_atomic(tmp_path, monkeypatch):
    first = cell(256, 1, aggregate_tok_s=1.0)
    path = report.write_cell(tmp_path, "p", first)
    assert json.loads(path.read_text())["aggregate_tok_s"] == 1.0

    def crash(src, dst):
        raise OSError("killed between write and rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        report.write_cell(tmp_path, "p", cell(256, 1, aggregate_tok_s=2.0))
    # The finished cell is intact; the interrupted one never appears under a final name.
    assert json.loads(path.read_text())["aggregate_tok_s"] == 1.0
    assert [json.loads(p.read_text())["aggregate_tok_s"] for p in (tmp_path / "p" / "cells").glob("*.json")] == [1.0]


def test_number_formats():
    assert report.fmt_rate(9480.4) == "9,480" and report.fmt_rate(55.84) == "55.8" and report.fmt_rate(None) == "-"
    assert report.fmt_s(0.2104) == "0.210 s" and report.fmt_s(17.68) == "17.68 s" and report.fmt_s(212.7) == "212.7 s"


def test_plots_draw_every_view_and_name_invalid_cells(tmp_path):
    from ds4deploy.bench.plots import VIEWS, write_html, write_png

    cells = [cell(p, c, aggregate_tok_s=10.0 * c, per_session_tok_s=50.0 / c, decode_tok_s=50.0 / c,
                  prefill_tok_s=1000.0, ttft_s=p / 1000) for p in (256, 1024) for c in (1, 4)]
    cells.append(cell(2048, 1, valid=False, flags=["cache hit: x"], decode_tok_s=40.0, ttft_s=0.01,
                      aggregate_tok_s=39.0, per_session_tok_s=40.0, prefill_tok_s=9480.0))
    pngs = write_png(cells, tmp_path, "t")
    assert [p.stem for p in pngs] == [v[0] for v in VIEWS]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    html = write_html(cells, tmp_path / "t.html", "t").read_text()
    assert "p2048-c1-prose" in html and "cache hit: x" in html
    assert (tmp_path / "plotly.min.js").is_file()
