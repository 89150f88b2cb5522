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
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

import ds4deploy.plan.estimate.constants as C
import ds4deploy.plan.estimate.model as M
from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_json
from ds4deploy.plan.estimate.reference import Cell
from ds4deploy.recipe.load import problem_lines
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


# A cell id names its file, cells/<id>.json, beside run.json (`ds4deploy.bench.profiles.Cell.cell_id`, e.g.
# p1024-c4-code): a plain file name, never a path out of cells/.
CELL_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class BenchRun(BaseModel):
    """What the calibration reads of a bench run's run.json (`ds4deploy.bench.run` writes it; other keys are left
    alone): the cell ids, and the tokens out per request and requests per session the harness asked for."""

    model_config = ConfigDict(strict=True, extra="ignore")

    cells: list[Annotated[str, StringConstraints(pattern=CELL_ID)]]
    max_tokens: int | None = Field(default=None, ge=1)
    requests_per_session: int | None = Field(default=None, ge=1)


class CellSpec(BaseModel):
    """A cell's workload: prompt tokens and concurrent sessions (`ds4deploy.bench.profiles.Cell`)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    prompt_tokens: int = Field(ge=1)
    concurrency: int = Field(ge=1)


class BenchCell(BaseModel):
    """What the calibration reads of one cell record, cells/<id>.json (`ds4deploy.bench.report`): whether the
    harness kept it (``valid``), its workload and the measured TTFT (s) and aggregate output rate (tok/s), finite
    numbers >= 0 where given. A cell the harness kept has its ``spec``."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    valid: bool = False
    spec: CellSpec | None = None
    ttft_s: float | None = Field(default=None, ge=0)
    aggregate_tok_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _kept_cell_has_spec(self) -> BenchCell:
        if self.valid and self.spec is None:
            raise ValueError("a valid cell needs its spec (prompt_tokens, concurrency)")
        return self


def _read(model: type[BaseModel], path: Path, what: str, fix: str) -> Any:
    """`path` read through the bounded JSON reader (`core.yamlio.load_json`: size, depth, syntax) and checked as
    `model`.

    Raises:
        UserError: naming the file and each bad key.
    """
    data = load_json(path, fix)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = problem_lines(exc, None) if isinstance(data, dict) else ["  not a JSON object"]
        raise UserError(f"{path} is not {what}:\n" + "\n".join(lines), fix) from None


def run_cells(run_json: Path, recipe_name: str) -> list[Cell]:
    """The valid cells of a `ds4deploy bench run` (its run.json and the cells/ beside it) as `Cell`s: TTFT and
    aggregate output rate of each (`RUN_METRICS`). A cell flagged by the harness is left out.

    Raises:
        UserError: the file is not a bench run (or a cell record is not one), or it has no valid cell.
    """
    fix = "pass the run.json that `ds4deploy bench run` wrote (docs/results/bench/<recipe>/<profile>/run.json)"
    run = _read(BenchRun, Path(run_json), "a bench run (no 'cells' list of cell ids)", fix)
    out = []
    for cid in run.cells:
        path = Path(run_json).parent / "cells" / f"{cid}.json"
        if not path.is_file():
            continue
        c = _read(BenchCell, path, "a bench cell record", f"run the profile again (`make bench`); {fix}")
        if not c.valid:
            continue
        for metric in RUN_METRICS:
            v = getattr(c, metric)
            if v:
                out.append(Cell("run", recipe_name, c.spec.prompt_tokens, c.spec.concurrency, metric, float(v), None,
                                source=f"{Path(run_json).name} {cid}", output=run.max_tokens,
                                requests=run.requests_per_session or 1))
    if not out:
        raise UserError(f"{run_json} has no valid cell to calibrate on",
                        "run the profile again on a quiet host (`make bench`) and calibrate on that run")
    return out


def check_cells(recipe: Recipe, cells: Sequence[Cell], run_json: Path) -> None:
    """Refuse an owner's cells the fit cannot simulate within bounds: each cell's request longer than
    serving.max_model_len, or past `C.MAX_SESSIONS` / `C.MAX_SIM_WORK` (`model.workload_problem`); and all of them
    together past `C.MAX_FIT_WORK`, since the fit simulates every cell again at each of its evaluations.

    Raises:
        UserError: naming the cell and its bound.
    """
    card = M.load_card(recipe)
    w = M.weights(recipe, card)
    fix = "calibrate on a run of this recipe's own bench profile (`make bench`), whose cells fit the recipe"
    total, seen = 0, set()
    for c in cells:
        wl = workload(c, recipe, {})
        where = f"{run_json}, cell {c.source.rsplit(' ', 1)[-1]}"
        if c.prompt + wl["output"] > recipe.serving.max_model_len:
            raise UserError(f"{where}: {c.prompt:,} prompt + {wl['output']:,} output tokens is longer than "
                            f"serving.max_model_len ({recipe.serving.max_model_len:,}) of recipe '{recipe.name}'", fix)
        geo = M.geometry(recipe, card, w, wl["output"], accepted=wl["accepted"])
        problem = M.workload_problem(geo, c.prompt, c.sessions, wl["requests"])
        if problem:
            raise UserError(f"{where}: {problem}", fix)
        key = (c.prompt, c.sessions)
        if key not in seen:
            seen.add(key)
            total += M.planned_work(geo, c.prompt, c.sessions, wl["requests"])
    if total > C.MAX_FIT_WORK:
        raise UserError(f"{run_json}: its cells take {total:,} units of simulation (model.planned_work) once, more "
                        f"than the {C.MAX_FIT_WORK:,} (constants.MAX_FIT_WORK) a fit runs per evaluation; it "
                        "simulates them again at each of about 600",
                        "calibrate on a run with fewer or shorter cells (a profile of short prompts and low "
                        "concurrency fits the same constants)")


def calibrate(recipe: Recipe, hw_class: str, run_json: Path) -> tuple[dict, list[Cell]]:
    """Fit the per-round cost, the per-request cost and the achieved prefill compute of `hw_class` to an owner's
    bench run; returns (constants, the cells used). The context and attention terms are fitted only when the run's
    prompts span a factor of 8 or more."""
    cells = run_cells(run_json, recipe.name)
    check_cells(recipe, cells, run_json)
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
    try:
        C.Fitted.model_validate(fitted)  # what `read_calibration` will accept, checked before it is written
    except ValidationError as exc:
        raise UserError(f"the fit on {run_json} gave constants the estimator cannot use:\n"
                        + "\n".join(problem_lines(exc, None)),
                        "calibrate on another run of the profile (`make bench`); nothing was written") from None
    data = {"hardware_class": hw_class, "run": str(run_json), "constants": fitted}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
