"""Rule family: memory claims. A recipe admits `max_num_seqs` sessions of up to `max_model_len` tokens; whether its KV
pool holds them all at full length is said here, as a warning with how many full-length sessions fit (long-context
recipes legitimately admit more sessions than fit at full length: prefixes are shared and most sessions are short,
but an owner should know the number).

The count comes from `ds4deploy.engines.kv_pool.full_length_sessions`, the small stand-in the memory estimator
replaces; the recipe index shows the same figure (ds4deploy/render/index.py).
"""

from __future__ import annotations

from ds4deploy.engines.kv_pool import full_length_sessions
from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe


@rule("kv-pool-sessions", "the KV pool holds max_num_seqs sessions of max_model_len tokens (a warning when not)",
      "vLLM sizes one full-length request's KV at start (\"To serve at least one request with the model's max seq len "
      "... KV cache is needed\"); eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml at 00afef20 "
      "(11.04 GiB per 1,048,576 tokens per rank; 12 agents evicting each other's prefixes from a pool too small for "
      "them); ds4deploy/engines/kv_pool.py", lambda r: True)
def _kv_sessions(r: Recipe, hosts):
    claim = full_length_sessions(r)
    if claim is None:
        return "unknown", "no KV pool size or per-token KV figure is recorded for this recipe's model and KV layout", (
            "add the model's per-token KV cost to ds4deploy/engines/kv_pool.py (or set the pool size) to check it")
    nums = f"{claim.summary()} ({claim.source})"
    if claim.holds_claim:
        return "pass", nums, ""
    return "warn", nums, (
        f"expect prefix-cache evictions when all {claim.max_num_seqs} sessions grow long: lower max_num_seqs to "
        f"{max(claim.full_sessions, 1)} for full-length sessions, or raise the KV pool "
        "(serving.extra_args.kv-cache-memory-bytes or gpu_memory_utilization, within the GPU memory rules)")
