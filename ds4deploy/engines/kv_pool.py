"""How many full-length sessions a recipe's KV pool holds: the small memory-claim check.

PLACEHOLDER FOR THE FULL ESTIMATOR: `full_length_sessions` is the one function the preflight rule
``kv-pool-sessions`` (ds4deploy/plan/preflight/engine.py) and the recipe index (ds4deploy/render/index.py) call; the
memory estimator (another work item, ds4deploy/plan/estimate or similar) replaces it with its own pool and
per-token figures. Keep the signature: ``full_length_sessions(recipe) -> KvPoolClaim | None``.

What it knows, per rank (GPU, or the CPU engine's process):
- the pool: ``serving.extra_args.kv-cache-memory-bytes`` when the recipe fixes it, else the recipe's
  ``memory.kv_cache_gib_per_gpu``, else on the CPU backend ``VLLM_CPU_KVCACHE_SPACE`` (GiB, vLLM CPU docs);
- the cost of one token: computed for a generated checkpoint (layers x 2 (K and V) x KV heads per rank x head_dim x
  dtype bytes), or a measured figure per model family and KV layout (`MEASURED_KV_GIB_PER_1M`). Anything else is
  unknown (None): no claim is made for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ds4deploy.recipe.schema import Recipe

GIB = 2**30
TOKENS_1M = 1_048_576

# GiB of KV per rank that one 1,048,576-token DeepSeek-V4-Flash request needs with the 584-byte sparse-MLA layout:
# "To serve at least one request with the model's max seq len (1048576), 11.04 GiB KV cache is needed" (vLLM's own
# start-up check, TP 2 on 2x GB10, fp8_ds_mla; eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml at
# 00afef20fb36094c37297f1118f83dd0802d144c). The sparse-MLA KV is replicated on every TP rank, so the figure is per
# rank at any TP. nvfp4_ds_mla uses the same 584-byte layout in the GB10 0.1.1 image (MiaAI-Lab/
# DeepSeek-v4-Flash-DSpark-2x-DGX-Spark docs/PATCHES.md, issue 22); fp8 is vLLM's alias that resolves to fp8_ds_mla.
DSV4_FLASH_GIB_PER_1M = 11.04
MEASURED_KV_GIB_PER_1M = {
    ("deepseek-v4-flash", "fp8_ds_mla"): DSV4_FLASH_GIB_PER_1M,
    ("deepseek-v4-flash", "fp8"): DSV4_FLASH_GIB_PER_1M,
    ("deepseek-v4-flash", "nvfp4_ds_mla"): DSV4_FLASH_GIB_PER_1M,
}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "auto": 2}


@dataclass(frozen=True)
class KvPoolClaim:
    """A recipe's KV pool against its claim of `max_num_seqs` sessions of `max_model_len` tokens (all per rank).

    Attributes:
        pool_gib: KV pool per rank, GiB.
        pool_tokens: tokens the pool holds.
        max_model_len: the recipe's full session length, tokens.
        max_num_seqs: sessions the recipe admits at once.
        full_sessions: full-length sessions the pool holds (floor).
        tokens_per_session: pool tokens / max_num_seqs: what each admitted session can hold when all are busy.
        source: where the per-token cost comes from.
    """

    pool_gib: float
    pool_tokens: int
    max_model_len: int
    max_num_seqs: int
    full_sessions: int
    tokens_per_session: int
    source: str

    @property
    def holds_claim(self) -> bool:
        """True when the pool holds `max_num_seqs` sessions of `max_model_len` tokens."""
        return self.full_sessions >= self.max_num_seqs

    def summary(self) -> str:
        """One line, e.g. ``KV pool 12 GiB = 1,139,756 tokens per rank: 1 of 6 full-length (1,048,576-token)
        sessions; 189,959 tokens each when all 6 are busy``."""
        return (f"KV pool {self.pool_gib:g} GiB = {self.pool_tokens:,} tokens per rank: {self.full_sessions} of "
                f"{self.max_num_seqs} full-length ({self.max_model_len:,}-token) sessions; "
                f"{self.tokens_per_session:,} tokens each when all {self.max_num_seqs} are busy")


def _pool_bytes(r: Recipe) -> Fraction | None:
    """The KV pool per rank in bytes, exact (a GiB figure is read as the decimal the recipe writes)."""
    fixed = r.serving.extra_args.get("kv-cache-memory-bytes")
    if fixed is not None and int(fixed) > 0:
        return Fraction(int(fixed))
    if r.memory is not None and r.memory.kv_cache_gib_per_gpu is not None:
        return Fraction(str(r.memory.kv_cache_gib_per_gpu)) * GIB
    space = r.engine.env.get("VLLM_CPU_KVCACHE_SPACE")
    if r.hardware.gpus.count == 0 and space is not None and str(space).replace(".", "", 1).isdigit():
        return Fraction(str(space)) * GIB
    return None


def _bytes_per_token(r: Recipe) -> tuple[Fraction, str] | None:
    """Bytes of KV one token costs per rank (exact), and where the figure comes from; None when unknown."""
    g = r.model.generator
    if r.model.source == "generated" and g is not None:
        kv_heads = max(g.num_key_value_heads // max(r.parallelism.tensor, 1), 1)
        width = _DTYPE_BYTES.get(r.serving.kv_cache_dtype or r.model.dtype, 2)
        per = g.num_hidden_layers * 2 * kv_heads * g.head_dim * width
        return Fraction(per), (f"generated checkpoint: {g.num_hidden_layers} layers x 2 x {kv_heads} KV heads per "
                               f"rank x head_dim {g.head_dim} x {width} bytes")
    names = " ".join(x.lower() for x in (r.model.repo_id or "", r.model.path, r.model.served_name))
    family = "deepseek-v4-flash" if "deepseek-v4-flash" in names else None
    gib = MEASURED_KV_GIB_PER_1M.get((family, r.serving.kv_cache_dtype or ""))
    if gib is None:
        return None
    return Fraction(str(gib)) * GIB / TOKENS_1M, (
        f"DeepSeek-V4-Flash {r.serving.kv_cache_dtype}: {gib} GiB per 1,048,576 tokens per rank (vLLM's start-up "
        "figure, eugr/spark-vllm-docker 00afef20)")


def full_length_sessions(recipe: Recipe) -> KvPoolClaim | None:
    """How many `serving.max_model_len` sessions the recipe's KV pool holds, against `serving.max_num_seqs`.

    This is the small stand-in the memory estimator replaces (module docstring); it counts only the KV pool and the
    per-token cost, per rank, and ignores prefix-cache sharing (shared prefixes hold one copy) and the sliding-window
    parts of hybrid models.

    Returns:
        The claim, or None when the pool or the per-token cost is not known for this recipe.
    """
    pool = _pool_bytes(recipe)
    cost = _bytes_per_token(recipe)
    if pool is None or cost is None:
        return None
    per_token, source = cost
    tokens = int(pool // per_token)
    s = recipe.serving
    return KvPoolClaim(pool_gib=round(float(pool / GIB), 3), pool_tokens=tokens, max_model_len=s.max_model_len,
                       max_num_seqs=s.max_num_seqs, full_sessions=tokens // s.max_model_len,
                       tokens_per_session=tokens // s.max_num_seqs, source=source)
