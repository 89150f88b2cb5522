"""Fitting a hardware class's calibrated constants to measured cells: the published reference tables
(``constants.HARDWARE[...]["fitted_on"]``) and an owner's own bench run (``ds4deploy estimate --calibrate``).

The fit minimises the sum of squared log errors, sum(log(predicted / measured) ** 2), over the chosen cells with
Nelder-Mead on the logarithms of the constants (so every constant stays positive), from fixed starting points.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import ds4deploy.plan.estimate.constants as C
import ds4deploy.plan.estimate.model as M
from ds4deploy.core.errors import UserError
from ds4deploy.plan.estimate.reference import Cell
from ds4deploy.recipe.schema import Recipe

# Starting points of the fit (s, s per token, 10**12 FLOP/s, s per token squared, s, drafts, fraction).
START = {"t_round_s": 0.018, "ctx_s": 3e-8, "tflops": 54.0, "attn_s": 2e-9, "t_req_s": 0.06,
         "chat_accepted": 1.2, "share": 1.1, "prefill_share": 0.05, "bw_gbs": 370.0, "host_bw_gbs": 200.0}
# Constants that are fractions are kept at or below 1.
AT_MOST_ONE = ("prefill_share",)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iters: int = 400, step: float = 0.5) -> np.ndarray:
    """Minimise `f` from `x0` with the Nelder-Mead simplex (reflection 1, expansion 2, contraction 0.5, shrink
    0.5; Nelder and Mead, The Computer Journal 7(4), 1965). Returns the best point found."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < 1e-9:
            break
        centre = np.mean(simplex[:-1], axis=0)
        refl = centre + (centre - simplex[-1])
        fr = f(refl)
        if fr < values[0]:
            exp = centre + 2 * (centre - simplex[-1])
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = centre + 0.5 * (simplex[-1] - centre)
            fc = f(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def workload(cell: Cell, recipe: Recipe, hw: dict) -> dict:
    """Output tokens, requests per session and drafts accepted per round for `cell` (a published cell, or one of
    an owner's run: system "run")."""
    from ds4deploy.plan.estimate.reference import OUTPUT_TOKENS

    system, content = cell.system, cell.content
    output = cell.output or OUTPUT_TOKENS.get(system) or \
        (recipe.benchmark.max_tokens if recipe.benchmark else None) or 1024
    accepted = None
    if content == "chat" and "chat_accepted" in hw:
        accepted = hw["chat_accepted"]
    elif content in C.ACCEPTED_PER_ROUND and system == "A":
        accepted = C.ACCEPTED_PER_ROUND[content]
    return {"output": output, "accepted": accepted, "requests": cell.requests}


def predict(recipe: Recipe, card: M.Card, w: M.Weights, hw_class: str, hw: dict, cell: Cell,
            cache: dict | None = None) -> float:
    """The estimator's value for `cell` with constants `hw` (one simulation per prompt/sessions/content)."""
    wl = workload(cell, recipe, hw)
    key = (cell.prompt, cell.sessions, wl["output"], wl["accepted"], wl["requests"], cell.recipe)
    if cache is not None and key in cache:
        res = cache[key]
    else:
        geo = M.geometry(recipe, card, w, wl["output"], accepted=wl["accepted"])
        cls = C.HARDWARE[hw_class]
        res = M.simulate(geo, hw, cell.prompt, cell.sessions, hw.get("bw_gbs", cls["bw_gbs"]),
                         hw.get("host_bw_gbs", cls.get("host_bw_gbs")), requests=wl["requests"])
        if cache is not None:
            cache[key] = res
    return res[cell.metric]


def fit(recipe: Recipe, hw_class: str, cells: Sequence[Cell], params: Sequence[str], fixed: dict | None = None,
        start: dict | None = None) -> dict:
    """Constants `params` of `hw_class` fitted to `cells` (others from `fixed`); returns them rounded to 4
    significant digits, as they are written into constants.py."""
    from ds4deploy.recipe.load import load_recipe

    recipes = {c.recipe: (recipe if c.recipe == recipe.name else load_recipe(c.recipe)) for c in cells}
    facts = {n: (r, M.load_card(r)) for n, r in recipes.items()}
    facts = {n: (r, card, M.weights(r, card)) for n, (r, card) in facts.items()}
    base = dict(fixed or {})
    x0 = np.log([(start or {}).get(p, START[p]) for p in params])

    def consts(x: np.ndarray) -> dict:
        out = dict(base)
        for p, v in zip(params, x, strict=True):
            out[p] = min(math.exp(v), 1.0) if p in AT_MOST_ONE else math.exp(v)
        return out

    def loss(x: np.ndarray) -> float:
        hw = consts(x)
        cache: dict = {}
        return sum(math.log(max(predict(*facts[c.recipe], hw_class, hw, c, cache), 1e-12) / c.value) ** 2
                   for c in cells)

    x = x0
    for _ in range(2):  # a restart from the best point shakes the simplex out of a stall
        x = nelder_mead(loss, x)
    best = consts(x)
    return {k: float(f"{v:.4g}") for k, v in best.items()}


# --- an owner's bench run -----------------------------------------------------------------------------------------

# TTFT and the aggregate output rate: both timed by the harness over whole requests. One session's stream rate is
# left out: on a busy host the client sees tokens in bursts (the harness's own stream-timing check), which the
# aggregate of the cell's requests does not depend on.
RUN_METRICS = ("ttft_s", "aggregate_tok_s")


def run_cells(run_json: Path, recipe_name: str) -> list[Cell]:
    """The valid cells of a `ds4deploy bench run` (its run.json and the cells/ beside it) as `Cell`s: TTFT and
    aggregate output rate of each (`RUN_METRICS`). A cell flagged by the harness is left out.

    Raises:
        UserError: the file is not a bench run, or it has no valid cell.
    """
    try:
        run = json.loads(Path(run_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{run_json} cannot be read as a bench run: {exc}",
                        "pass the run.json that `ds4deploy bench run` wrote "
                        "(docs/results/bench/<recipe>/<profile>/run.json)") from None
    if not isinstance(run, dict) or "cells" not in run:
        raise UserError(f"{run_json} is not a bench run (no 'cells')",
                        "pass the run.json that `ds4deploy bench run` wrote")
    out = []
    for cid in run["cells"]:
        path = Path(run_json).parent / "cells" / f"{cid}.json"
        if not path.is_file():
            continue
        c = json.loads(path.read_text(encoding="utf-8"))
        if not c.get("valid"):
            continue
        spec = c["spec"]
        n = spec["concurrency"]
        for metric in RUN_METRICS:
            v = c.get(metric)
            if v:
                out.append(Cell("run", recipe_name, spec["prompt_tokens"], n, metric, float(v), None,
                                source=f"{Path(run_json).name} {cid}", output=int(run.get("max_tokens") or 0) or None,
                                requests=int(run.get("requests_per_session") or 1)))
    if not out:
        raise UserError(f"{run_json} has no valid cell to calibrate on",
                        "run the profile again on a quiet host (`make bench`) and calibrate on that run")
    return out


def calibrate(recipe: Recipe, hw_class: str, run_json: Path) -> tuple[dict, list[Cell]]:
    """Fit the per-round cost, the per-request cost and the achieved prefill compute of `hw_class` to an owner's
    bench run; returns (constants, the cells used). The context and attention terms are fitted only when the run's
    prompts span a factor of 8 or more."""
    cells = run_cells(run_json, recipe.name)
    prompts = sorted({c.prompt for c in cells})
    params = ["t_round_s", "t_req_s", "tflops"]
    fixed = {"ctx_s": 0.0, "attn_s": 0.0}
    if prompts[-1] >= 8 * prompts[0]:
        params += ["ctx_s"]
        fixed.pop("ctx_s")
    return fit(recipe, hw_class, cells, params, fixed), cells


def calibration_lines(recipe: Recipe, hw_class: str, fitted: dict, cells: Sequence[Cell],
                      before: dict | None) -> list[str]:
    """Per measured cell: the value, the prediction with the constants in force before (`before`, None when the
    class had none) and with the fitted ones; then the fitted constants."""
    card = M.load_card(recipe)
    w = M.weights(recipe, card)
    out = [f"calibration of hardware class {hw_class} on {len(cells)} measured cells:"]
    c_before: dict = {}
    c_after: dict = {}
    for c in cells:
        after = predict(recipe, card, w, hw_class, fitted, c, c_after)
        was = "" if before is None else \
            f", before {predict(recipe, card, w, hw_class, before, c, c_before):.4g}"
        out.append(f"  {c.source} {c.metric}: measured {c.value:.4g}{was}, fitted {after:.4g} "
                   f"({after / c.value - 1:+.1%})")
    out.append("constants: " + ", ".join(f"{k} {v:g}" for k, v in fitted.items()))
    return out


def write_calibration(path: Path, hw_class: str, fitted: dict, run_json: Path) -> None:
    """Write an owner's calibration (`ds4deploy.plan.estimate.calibration_path`), used by later estimates of the
    recipe instead of the class constants."""
    data = {"hardware_class": hw_class, "run": str(run_json), "constants": fitted}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
