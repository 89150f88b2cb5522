"""Plots of a profile's cells: PNG files (matplotlib) and one interactive HTML page (plotly) with hover details.

Four views: decode tok/s vs prompt length, TTFT vs prompt length (log-log), aggregate tok/s vs
concurrency and per-session tok/s vs concurrency; for a clock sweep, tok/s and tok/s per W vs the clock cap
(`write_sweep_plots`). Invalid cells are drawn as hollow markers (matplotlib) or named
in the hover text (plotly), never dropped silently. The HTML page loads ``plotly.min.js`` from its own directory
(written beside it once), so it works on an office network without internet.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ds4deploy.bench.report import fmt_rate, fmt_s

VIEWS = (
    # (file stem, title, x key, y key, series key, log x, log y)
    ("decode_vs_context", "Decode tok/s vs prompt length", "prompt", "decode_tok_s", "content_conc", True, False),
    ("ttft_vs_prompt", "TTFT vs prompt length (log-log)", "prompt", "ttft_s", "content_conc", True, True),
    ("aggregate_vs_concurrency", "Aggregate tok/s vs concurrency", "concurrency", "aggregate_tok_s", "prompt_series",
     False, False),
    ("per_session_vs_concurrency", "Per-session tok/s vs concurrency", "concurrency", "per_session_tok_s",
     "prompt_series", False, False),
)
LABELS = {"prompt": "prompt tokens", "concurrency": "concurrent sessions", "decode_tok_s": "decode tok/s",
          "ttft_s": "TTFT, s", "aggregate_tok_s": "aggregate tok/s", "per_session_tok_s": "per-session tok/s"}


def _points(cells: list[dict], xkey: str, ykey: str, skey: str) -> dict[str, list[tuple[float, float, dict]]]:
    series: dict[str, list[tuple[float, float, dict]]] = defaultdict(list)
    for c in cells:
        s = c["spec"]
        y = c.get(ykey)
        if y is None or y <= 0:
            continue
        x = s["prompt_tokens"] if xkey == "prompt" else s["concurrency"]
        think = {True: ", thinking", False: ", no thinking", None: ""}[s["thinking"]]
        name = (f"{s['content']}, conc. {s['concurrency']}{think}" if skey == "content_conc"
                else f"prompt {s['prompt_tokens']:,}, {s['content']}{think}")
        series[name].append((x, y, c))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in series.items()}


def write_png(cells: list[dict], out_dir: Path, title: str) -> list[Path]:
    """One PNG per view into `out_dir`; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, vtitle, xkey, ykey, skey, logx, logy in VIEWS:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        for name, pts in _points(cells, xkey, ykey, skey).items():
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            line = ax.plot(xs, ys, marker="o", label=name)[0]
            bad = [(p[0], p[1]) for p in pts if not p[2]["valid"]]
            if bad:
                ax.scatter(*zip(*bad, strict=True), s=120, facecolors="none", edgecolors=line.get_color(),
                           linewidths=2, zorder=3)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(LABELS[xkey])
        ax.set_ylabel(LABELS[ykey])
        ax.set_title(f"{title}: {vtitle}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def write_html(cells: list[dict], path: Path, title: str) -> Path:
    """One HTML page with the four views as a 2x2 grid; hover shows each cell's id, numbers and flags."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=2, subplot_titles=[v[1] for v in VIEWS])
    for i, (_stem, _t, xkey, ykey, skey, logx, logy) in enumerate(VIEWS):
        row, col = i // 2 + 1, i % 2 + 1
        for name, pts in _points(cells, xkey, ykey, skey).items():
            hover = [
                f"{c['cell_id']}<br>prompt {c['spec']['prompt_tokens']:,} (measured {c['prompt_tokens_median']}), "
                f"conc. {c['spec']['concurrency']}<br>TTFT {fmt_s(c['ttft_s'])}, prefill {fmt_rate(c['prefill_tok_s'])}"
                f" t/s<br>decode {fmt_rate(c['decode_tok_s'])} t/s, aggregate {fmt_rate(c['aggregate_tok_s'])} t/s<br>"
                f"failed {c['failed']}; {'; '.join(c['flags']) or 'valid'}"
                for _x, _y, c in pts]
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=i == 0 or skey != VIEWS[0][4],
                                     hovertext=hover, hoverinfo="text"), row=row, col=col)
        fig.update_xaxes(title_text=LABELS[xkey], type="log" if logx else "linear", row=row, col=col)
        fig.update_yaxes(title_text=LABELS[ykey], type="log" if logy else "linear", row=row, col=col)
    fig.update_layout(title=title, height=900)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs="directory")
    return path


def _sweep_points(cells: list[dict]) -> list[tuple[str, float, dict]]:
    """(label, x, decode cell) per cap, uncapped last at x = 1.1 x the highest cap."""
    by: dict[int | None, list[dict]] = {}
    for c in cells:
        by.setdefault(c.get("clock_cap_mhz"), []).append(c)
    capped = sorted(k for k in by if k is not None)
    top = (capped[-1] * 1.1) if capped else 1.0
    pts = [(str(k), float(k), min(by[k], key=lambda c: c["spec"]["prompt_tokens"])) for k in capped]
    if None in by:
        pts.append(("none", top, min(by[None], key=lambda c: c["spec"]["prompt_tokens"])))
    return pts


def write_sweep_plots(cells: list[dict], png_dir: Path, html_path: Path, title: str) -> list[Path]:
    """tok/s and tok/s per W vs clock cap: ``<png_dir>/clock_sweep.png`` and the interactive page `html_path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pts = _sweep_points(cells)
    labels = [p[0] for p in pts]
    xs = [p[1] for p in pts]
    tok = [p[2].get("aggregate_tok_s") for p in pts]
    tpw = [(p[2].get("telemetry") or {}).get("tok_s_per_w") for p in pts]
    png_dir.mkdir(parents=True, exist_ok=True)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    a1.plot(xs, [t if t is not None else float("nan") for t in tok], marker="o")
    a2.plot(xs, [t if t is not None else float("nan") for t in tpw], marker="o", color="tab:green")
    for ax, yl in ((a1, "output tok/s (decode cell)"), (a2, "tok/s per W")):
        ax.set_xticks(xs, labels)
        ax.set_xlabel("graphics clock cap, MHz")
        ax.set_ylabel(yl)
        ax.grid(True, alpha=0.3)
    if all(t is None for t in tpw):
        a2.text(0.5, 0.5, "no power readings", transform=a2.transAxes, ha="center")
        a2.set_yticks([])
    fig.suptitle(f"{title}: clock sweep", fontsize=10)
    fig.tight_layout()
    png = png_dir / "clock_sweep.png"
    fig.savefig(png)
    plt.close(fig)
    hover = [f"cap {lab}<br>{p[2]['cell_id']}<br>tok/s {p[2].get('aggregate_tok_s')}<br>"
             f"telemetry: {(p[2].get('telemetry') or {}).get('status')}" for lab, p in zip(labels, pts, strict=True)]
    pf = make_subplots(rows=1, cols=2, subplot_titles=["tok/s vs clock cap", "tok/s per W vs clock cap"])
    pf.add_trace(go.Scatter(x=labels, y=tok, mode="lines+markers", name="tok/s", hovertext=hover, hoverinfo="text"),
                 row=1, col=1)
    pf.add_trace(go.Scatter(x=labels, y=tpw, mode="lines+markers", name="tok/s per W", hovertext=hover,
                            hoverinfo="text"), row=1, col=2)
    pf.update_xaxes(title_text="graphics clock cap, MHz", type="category")
    pf.update_layout(title=f"{title}: clock sweep", height=500)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    pf.write_html(html_path, include_plotlyjs="directory")
    return [png, html_path]
