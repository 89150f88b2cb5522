"""Know before you deploy: capacity and speed of a recipe, from its model's config, its layout and a few constants
per hardware class (`constants`), checked against the reference systems' published tables (docs/estimator.md).

- `capacity(recipe)`: weights per GPU and the KV budget: how many full-length sessions the engine holds (the
  preflight rule ``kv-capacity`` refuses a recipe whose single request cannot fit, warns when max_num_seqs cannot).
- `estimate(recipe, ...)`: capacity plus decode per session and in aggregate, prefill and TTFT for a workload.
- `calibrate.calibrate`: the hardware constants fitted to an owner's own bench run (``--calibrate``).

Units: GB = 10**9 bytes, GiB = 2**30 bytes, tok/s, s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

import ds4deploy.plan.estimate.constants as C
import ds4deploy.plan.estimate.model as M
from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_json
from ds4deploy.recipe import paths as recipe_paths
from ds4deploy.recipe.load import problem_lines
from ds4deploy.recipe.schema import Recipe

GIB = M.GIB


def hw_class(recipe: Recipe) -> str:
    """The hardware class of `recipe` (a key of `constants.HARDWARE`).

    Raises:
        UserError: the recipe's hardware has no class with constants.
    """
    g, arch = recipe.hardware.gpus, recipe.engine.image.arch
    if arch == "cpu" and g.count == 0:
        return "cpu-x86"
    if g.arch == "sm70" and "V100" in (g.model or ""):
        return "sm70-v100"
    if g.arch == "sm121":
        return "sm121-gb10"
    if g.arch == "sm86" and M.experts_on_host(recipe):
        return "sm86-rtx3090-xeon"
    raise UserError(f"recipe '{recipe.name}': hardware class '{g.arch} ({g.model or 'no model named'})' has no "
                    f"constants in ds4deploy/plan/estimate/constants.py (known: {', '.join(sorted(C.HARDWARE))})",
                    f"run a benchmark profile on the hardware (`make bench RECIPE={recipe.base_name}`) and fit its "
                    f"constants: `ds4deploy estimate {recipe.base_name} --calibrate <run.json> --write`")


def calibration_path(recipe: Recipe) -> Path:
    """recipes/<recipe>.calibration.json: an owner's constants, fitted by ``estimate --calibrate --write``."""
    return recipe_paths.RECIPES_DIR / f"{recipe.base_name}.calibration.json"


class CalibrationFile(BaseModel):
    """recipes/<recipe>.calibration.json as `calibrate.write_calibration` writes it: the hardware class, the bench
    run it was fitted on and the constants (`constants.Fitted`: finite, > 0 where a step divides by them)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    hardware_class: str
    run: str
    constants: C.Fitted


def read_calibration(recipe: Recipe, cls: str | None = None) -> CalibrationFile | None:
    """The recipe's own calibration (`calibration_path`), checked in full, or None when it has none. With `cls`,
    the class it was fitted for must be the recipe's hardware class.

    Raises:
        UserError: unreadable, not JSON, not the shape above (naming each bad key), or fitted for another class.
    """
    path = calibration_path(recipe)
    if not path.is_file():
        return None
    fix = f"write it again: `ds4deploy estimate {recipe.base_name} --calibrate <run.json> --write`"
    data = load_json(path, fix)
    try:
        own = CalibrationFile.model_validate(data)
    except ValidationError as exc:
        lines = problem_lines(exc, None) if isinstance(data, dict) else ["  not a JSON object"]
        raise UserError(f"{path} is not a calibration ({{\"hardware_class\", \"run\", \"constants\"}}):\n"
                        + "\n".join(lines), fix) from None
    if cls is not None and own.hardware_class != cls:
        raise UserError(f"{path} was fitted for hardware class '{own.hardware_class}', but recipe '{recipe.name}' is "
                        f"now of class '{cls}'", fix)
    return own


def constants_for(recipe: Recipe) -> tuple[str, dict, str]:
    """(hardware class, calibrated constants, where they come from): the recipe's own calibration file when one is
    committed, else the class's constants.

    Raises:
        UserError: no class, or a class without fitted constants.
    """
    cls = hw_class(recipe)
    own = read_calibration(recipe, cls)
    if own is not None:
        return cls, own.constants.constants(), f"{calibration_path(recipe).name} (fitted on {own.run})"
    fitted = C.HARDWARE[cls]["fitted"]
    if not fitted:
        raise UserError(f"hardware class '{cls}' has no calibrated constants",
                        f"fit them: `ds4deploy estimate {recipe.base_name} --calibrate <run.json> --write`")
    return cls, dict(fitted), f"constants.HARDWARE['{cls}'] (fitted on {', '.join(C.HARDWARE[cls]['fitted_on'])})"


@dataclass(frozen=True)
class Capacity:
    """Weights and KV per GPU of a recipe at ``context`` tokens per request."""

    recipe: Recipe
    card: M.Card
    weights: M.Weights
    kv: M.Kv
    context: int


def capacity(recipe: Recipe, context: int | None = None) -> Capacity:
    """Weights per GPU and KV capacity (full-length sessions) of `recipe`; needs no hardware constants.

    Raises:
        UserError: the model config cannot be read, or names an unknown quantisation.
    """
    check_context(recipe, context)
    card = M.load_card(recipe)
    w = M.weights(recipe, card)
    return Capacity(recipe, card, w, M.kv(recipe, card, w, context), context or recipe.serving.max_model_len)


def check_context(recipe: Recipe, context: int | None) -> None:
    """Refuse a request length the engine would not take: at least 1 token, at most serving.max_model_len (vLLM
    refuses a longer request; its KV cache is sized for max_model_len).

    Raises:
        UserError: `context` below 1 or above max_model_len.
    """
    top = recipe.serving.max_model_len
    if context is not None and not 1 <= context <= top:
        raise UserError(f"--context {context}: a request of recipe '{recipe.name}' holds 1 to {top:,} tokens "
                        "(serving.max_model_len; the engine refuses longer ones)",
                        f"pass --context from 1 to {top:,}, or raise serving.max_model_len in the recipe")


def default_output(recipe: Recipe) -> int:
    """Tokens out per request when none are given: benchmark.max_tokens, else 1,024."""
    return recipe.benchmark.max_tokens if recipe.benchmark and recipe.benchmark.max_tokens else 1024


def check_workload(cap: Capacity, prompt: int, sessions: int, output: int | None = None,
                   acceptance: float | None = None) -> None:
    """Refuse a workload `speed` cannot answer, before anything runs: counts below 1, a draft acceptance rate that is
    not a probability, a request (prompt + output) longer than serving.max_model_len (vLLM refuses it), more
    sessions than `constants.MAX_SESSIONS`, or more simulation than `constants.MAX_SIM_WORK`.

    Raises:
        UserError: the first of these, naming the option and its bound.
    """
    r = cap.recipe
    if sessions < 1 or prompt < 1 or (output is not None and output < 1):
        raise UserError(f"--sessions {sessions}, --prompt {prompt}"
                        + (f", --output {output}" if output is not None else "")
                        + ": --sessions, --prompt and --output must be at least 1", "pass positive numbers")
    if acceptance is not None:
        M.check_acceptance(acceptance)
    out = output or default_output(r)
    top = r.serving.max_model_len
    if prompt + out > top:
        given = "--output" if output is not None else "benchmark.max_tokens" if r.benchmark and \
            r.benchmark.max_tokens else "the default output"
        raise UserError(f"--prompt {prompt:,} + {out:,} output tokens ({given}) is a request of {prompt + out:,} "
                        f"tokens, longer than recipe '{r.name}' takes (serving.max_model_len {top:,}; vLLM refuses it)",
                        f"pass --prompt and --output that add up to at most {top:,}")
    if sessions > C.MAX_SESSIONS:
        raise UserError(f"--sessions {sessions:,}: more than the {C.MAX_SESSIONS:,} sessions the estimator "
                        "simulates (constants.MAX_SESSIONS)",
                        f"pass at most {C.MAX_SESSIONS:,}; sessions past serving.max_num_seqs "
                        f"({r.serving.max_num_seqs}) only wait in the engine's queue")
    geo = M.geometry(r, cap.card, cap.weights, out, acceptance)
    problem = M.workload_problem(geo, prompt, sessions)
    if problem:
        raise UserError(problem, "estimate fewer sessions or shorter requests (--sessions, --prompt, --output)")


@dataclass(frozen=True)
class Speed:
    """Predicted figures of one workload cell: ``sessions`` concurrent sessions of ``prompt`` tokens in,
    ``output`` out. Rates in tok/s, times in s."""

    prompt: int
    sessions: int
    output: int
    tokens_per_round: float
    per_session_tok_s: float
    aggregate_tok_s: float
    prefill_tok_s: float | None
    ttft_s: float | None
    round_s: float


def speed(recipe: Recipe, prompt: int, sessions: int, output: int | None = None, acceptance: float | None = None,
          accepted: float | None = None, cap: Capacity | None = None) -> tuple[Speed, str]:
    """Decode, prefill and TTFT of `recipe` for one cell, and the source of the constants used.

    Raises:
        UserError: as `capacity` and `constants_for`.
    """
    cap = cap or capacity(recipe)
    check_workload(cap, prompt, sessions, output, acceptance)
    cls, hw, source = constants_for(recipe)
    out = output or default_output(recipe)
    geo = M.geometry(recipe, cap.card, cap.weights, out, acceptance, accepted)
    bw = hw.get("bw_gbs", C.HARDWARE[cls]["bw_gbs"])
    res = M.simulate(geo, hw, prompt, sessions, bw, hw.get("host_bw_gbs", C.HARDWARE[cls].get("host_bw_gbs")))
    # Without a calibrated prefill rate the prompt is not costed: no prefill or TTFT figure is given.
    pre = hw.get("tflops") is not None
    return Speed(prompt, sessions, out, geo.tokens_per_round, res["per_session_tok_s"], res["aggregate_tok_s"],
                 res["prefill_tok_s"] if pre else None, res["ttft_s"] if pre else None, res["round_s"]), source


def _gib(b: float | None) -> str:
    if b is None:
        return "unknown"
    return f"{b / GIB:.2f} GiB" if b >= GIB / 100 else f"{b / 2**20:.1f} MiB"


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def capacity_lines(cap: Capacity) -> list[str]:
    """The capacity part of `ds4deploy estimate`, one fact a line."""
    r, w, kv = cap.recipe, cap.weights, cap.kv
    p = r.parallelism
    lines = [
        f"model config: {cap.card.origin}",
        f"weights: {_gb(w.total)} in all ({w.source})"
        + (f"; routed experts {_gb(w.experts)}, the rest {_gb(w.rest)} ({_gb(w.replicated)} replicated on every "
           "tensor-parallel rank)" if w.experts else ""),
        f"per GPU (TP {p.tensor} x PP {p.pipeline}): weights {_gib(w.gpu)}"
        + (f"; in host RAM: {_gb(w.host)} (of {r.hardware.min_ram_gib:g} GiB the recipe asks per node)"
           if w.host else ""),
    ]
    g = r.hardware.gpus
    if g.unified_memory and g.memory_gib:
        engine = r.serving.gpu_memory_utilization * g.memory_gib
        lines.append(f"unified memory: the GPU's {g.memory_gib:g} GiB is the node's RAM; the engine may take "
                     f"{engine:.2f} GiB (gpu_memory_utilization {r.serving.gpu_memory_utilization}), leaving "
                     f"{g.memory_gib - engine:.2f} GiB for the OS, the page cache and every other process")
    if kv.missing:
        lines.append(f"KV cache: {kv.missing}; available {_gib(kv.available)} per GPU ({kv.available_basis})")
        return lines
    lines += [
        f"KV per GPU for one {cap.context:,}-token request: {_gib(kv.need)} ({kv.per_token:,.0f} B per token"
        + (f" + {kv.per_flight:,.0f} B per in-flight token x {M.batched_tokens(r):,}" if kv.per_flight else "")
        + f"; {kv.basis})",
        f"KV available per GPU: {_gib(kv.available)} ({kv.available_basis})",
    ]
    if kv.sessions is not None:
        lines.append(f"full-length sessions resident: {kv.sessions} (pool {kv.pool_tokens:,} tokens; max_num_seqs "
                     f"{r.serving.max_num_seqs})")
    return lines


def speed_lines(sp: Speed, source: str) -> list[str]:
    """The speed part of `ds4deploy estimate`."""
    return [
        f"workload: {sp.sessions} session(s), {sp.prompt:,}-token prompts, {sp.output:,} tokens out, "
        f"{sp.tokens_per_round:.2f} tokens per decode round",
        f"decode: {sp.per_session_tok_s:.1f} tok/s per session, {sp.aggregate_tok_s:.1f} tok/s aggregate (prefill "
        f"included); one round {sp.round_s * 1000:.1f} ms",
        (f"prefill: {sp.prefill_tok_s:,.0f} tok/s; TTFT {sp.ttft_s:.2f} s" if sp.ttft_s is not None else
         "prefill and TTFT: not calibrated for this hardware class (no prefill figure to fit; aggregate leaves the "
         "prompt out)"),
        f"constants: {source}",
    ]


def index_cell(recipe: Recipe) -> str:
    """The recipe index's prediction column: single-session decode at a 1,024-token prompt and full-length
    sessions resident, or what is missing.

    Raises:
        UserError: the recipe's committed calibration file is broken (`read_calibration`): an input of the index,
            refused like a broken manifest, not shown as a missing figure.
    """
    try:
        cls = hw_class(recipe)
    except UserError:
        cls = None
    read_calibration(recipe, cls)
    try:
        cap = capacity(recipe)
    except UserError as exc:
        why = exc.cause.removeprefix(f"recipe '{recipe.name}': ")
        return f"- ({why.split(' (')[0].split(';')[0]})"
    kv = cap.kv
    seqs = recipe.serving.max_num_seqs
    if kv.sessions is None:
        sessions = "resident sessions unknown"
    elif kv.sessions >= seqs:
        sessions = f"all {seqs} resident"
    else:
        sessions = f"{kv.sessions} of {seqs} resident"
    try:
        sp, _ = speed(recipe, 1024, 1, cap=cap)
        decode = f"{sp.per_session_tok_s:.0f}"
    except UserError:
        decode = "?"
    return f"{decode}; {sessions}"


__all__ = ["CalibrationFile", "Capacity", "Speed", "calibration_path", "capacity", "capacity_lines", "check_context",
           "check_workload", "constants_for", "default_output", "hw_class", "index_cell", "read_calibration", "speed",
           "speed_lines"]


def bench_lines(recipe: Recipe, records: list[dict], meta: dict) -> list[str]:
    """`ds4deploy bench run`'s measured-against-predicted lines: per cell, TTFT, per-session decode and aggregate
    measured and as `speed` predicts them for the cell's prompt, sessions, output tokens and requests per session;
    one line naming what is missing when the estimator cannot predict for this recipe."""
    from ds4deploy.plan.estimate.reference import Cell

    try:
        cap = capacity(recipe)
        cls, hw, source = constants_for(recipe)
    except UserError as exc:
        return [f"predicted: not available ({exc.cause})"]
    import ds4deploy.plan.estimate.calibrate as K

    out = [f"measured vs predicted ({source}):"]
    cache: dict = {}
    for r in records:
        spec = r["spec"]
        parts = []
        for metric in ("ttft_s", "per_session_tok_s", "aggregate_tok_s"):
            if metric == "ttft_s" and hw.get("tflops") is None:
                continue
            cell = Cell("run", recipe.name, spec["prompt_tokens"], spec["concurrency"], metric, 1.0,
                        output=int(meta.get("max_tokens") or 0) or None,
                        requests=int(meta.get("requests_per_session") or 1))
            pred = K.predict(recipe, cap.card, cap.weights, cls, hw, cell, cache)
            got = r.get(metric)
            shown = "-" if got is None else (f"{got:.3f}" if metric == "ttft_s" else f"{got:.1f}")
            parts.append(f"{metric} {shown} vs {pred:.3f}" if metric == "ttft_s" else
                         f"{metric} {shown} vs {pred:.1f}")
        out.append(f"  {r['cell_id']}: " + ", ".join(parts))
    return out
