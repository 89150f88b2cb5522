"""KV capacity: one ``max_model_len`` request must fit the KV cache the engine can allocate (as the engine refuses to
start otherwise), and ``max_num_seqs`` full-length sessions should (else only some are resident at once).

The numbers come from the estimator (`ds4deploy.plan.estimate.capacity`): weights per GPU from the model's config and
file sizes, the KV budget, and the KV bytes per request as the pinned engine accounts them (docs/estimator.md).
"""

from __future__ import annotations

from ds4deploy.core.errors import UserError
from ds4deploy.plan.estimate import capacity
from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe

GIB = 2**30


@rule("kv-capacity", "one max_model_len request fits the KV cache; max_num_seqs of them are resident",
      "docs/estimator.md (ds4deploy estimate): vLLM refuses to start when one max_model_len request needs more KV "
      "than it can allocate (\"To serve at least one request with the model's max seq len ... KV cache is needed, "
      "which is larger than the available KV cache memory\", vllm/v1/core/kv_cache_utils.py)",
      lambda r: True)
def _kv_capacity(r: Recipe, hosts):
    try:
        cap = capacity(r)
    except UserError as exc:
        return "unknown", exc.cause, exc.fix
    kv = cap.kv
    if kv.missing or kv.need is None:
        return "unknown", kv.missing or "no KV accounting", "add the engine's KV accounting to ds4deploy/plan/estimate"
    if kv.available is None:
        return "unknown", f"KV available per GPU: {kv.available_basis}", "set them in the recipe"
    basis = kv.basis.split(" (")[0]
    nums = (f"one {cap.context:,}-token request needs {kv.need / GIB:.2f} GiB of KV per GPU ({basis}); "
            f"{kv.available / GIB:.2f} GiB available ({kv.available_basis})")
    seqs = r.serving.max_num_seqs
    if kv.need > kv.available:
        return "fail", nums, ("lower serving.max_model_len, raise the KV allocation (kv-cache-memory-bytes or "
                              "gpu_memory_utilization) where memory allows, or use more GPUs / a smaller KV dtype")
    if kv.sessions is not None and kv.sessions < seqs:
        return "warn", (f"{nums}; {kv.sessions} of max_num_seqs {seqs} full-length sessions resident (pool "
                        f"{kv.pool_tokens:,} tokens)"), (
            f"expect at most {kv.sessions} full-length sessions at once (shorter ones share the pool); lower "
            "max_num_seqs or max_model_len to make every admitted session fit")
    return "pass", f"{nums}; {kv.sessions} full-length sessions fit (max_num_seqs {seqs})", ""
