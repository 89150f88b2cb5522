"""Speculative decoding and CUDA graphs: the limits of the drafter and of graph capture."""

from __future__ import annotations

from ds4deploy.plan.preflight.rulebook import _spec_k, rule
from ds4deploy.recipe.schema import Recipe, whole_number


@rule("dspark-seqs-32", "Lvllmds4-x 2.3.8: max_num_seqs x (k+1) <= 32",
      "docs/sources.md#dspark-batch-cap: guqiong96/Lvllmds4-x routed_experts.py caps the batch at 32 (not in 2.3.9)",
      lambda r: r.engine.flavor == "lvllmds4-x" and r.engine.version.startswith("2.3.8") and _spec_k(r) > 0)
def _dspark32(r: Recipe, hosts):
    k, n = _spec_k(r), r.serving.max_num_seqs
    nums = f"max_num_seqs {n} x (k {k} + 1) = {n * (k + 1)}; limit 32"
    if n * (k + 1) <= 32:
        return "pass", nums, ""
    return "fail", nums, (f"lower max_num_seqs to {32 // (k + 1)} or k; warm-up otherwise dies on a tensor size "
                          "mismatch (seqs=4, k=5 was fastest)")


@rule("gb10-dspark-k5", "GB10 community builds: DSpark k must be 5 (or a multiple of 5)",
      "docs/sources.md#dspark-k5: on these builds k must be 5",
      lambda r: r.engine.flavor == "gb10-community" and _spec_k(r) > 0)
def _k5(r: Recipe, hosts):
    k = _spec_k(r)
    if k % 5 == 0:
        return "pass", f"k = {k}", ""
    return "fail", f"k = {k}", "set serving.speculative.num_speculative_tokens to 5"


@rule("cudagraph-capture-size", "max-cudagraph-capture-size equals max_num_seqs x (k+1)",
      "docs/sources.md#sm121-serve-flags (--max-cudagraph-capture-size <seqs*(k+1)>)",
      lambda r: "max-cudagraph-capture-size" in r.serving.extra_args
      or (r.engine.flavor == "gb10-community" and _spec_k(r) > 0))
def _capture(r: Recipe, hosts):
    k, n = _spec_k(r), r.serving.max_num_seqs
    raw = r.serving.extra_args.get("max-cudagraph-capture-size")
    if raw is None:
        return "fail", "max-cudagraph-capture-size unset", (
            f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)} (GB10 builds with DSpark need it)")
    got = whole_number(raw)
    if got is None:
        return "fail", f"capture size {raw!r} is not a whole number", (
            f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)} (a number)")
    nums = f"capture size {got}; max_num_seqs {n} x (k {k} + 1) = {n * (k + 1)}"
    if got == n * (k + 1):
        return "pass", nums, ""
    return "fail", nums, f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)}"
