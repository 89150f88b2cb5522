"""The estimator's model: weights per GPU, the KV budget and how the engine accounts it, and decode/prefill speed.

Inputs are a recipe (`ds4deploy.recipe.schema.Recipe`), the model's ``config.json`` (`load_card`) and the hardware
class constants (`ds4deploy.plan.estimate.constants.HARDWARE`, or an owner's calibration). Nothing here guesses: a
missing fact raises `UserError` naming it.

Memory (per GPU, GiB = 2**30 bytes):

- weights: routed experts from the config (layers x experts x 3 x hidden x moe_intermediate x bits of the experts'
  quantisation), the rest of the checkpoint from its file sizes (manifest, else ``model.size_on_disk_gb``) minus
  the experts; experts and attention are split over tensor x pipeline ranks, the replicated projections
  (``fused_wqa_wkv``, the compressors: vLLM builds them with ``disable_tp``) only over pipeline stages; experts held
  in host RAM (engine capability ``lk_moe_cpu_experts``) do not count against the GPU.
- KV: the engine's per-request need for ``max_model_len`` tokens (`kv_need`) against what it can allocate: the fixed
  ``--kv-cache-memory-bytes`` (or the CPU backend's ``VLLM_CPU_KVCACHE_SPACE``), else utilisation x device memory
  minus weights minus the activation peak and graphs (``memory.overhead_gib_per_gpu``).

Speed (`simulate`): the engine's scheduler stepped in time. Each step runs every decoding session's verify round
(1 + k tokens) and, within ``max_num_batched_tokens``, chunks of waiting prompts, first come first served. A step
costs the fixed round cost + bytes read / achieved bandwidth (dense part every round, routed experts as the
fraction touched by the step's tokens: ``1 - (1 - active/experts) ** tokens``) + a context term per decoding
session + prefill compute (2 FLOP per active weight at the achieved rate, plus an attention term growing with the
position). With pipeline parallel a decode round crosses every stage in turn, and a prompt's chunks overlap across
stages (one extra stage time to fill the pipe).
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ds4deploy.plan.estimate.constants as C
from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_json
from ds4deploy.recipe.model_config import text_config
from ds4deploy.recipe.schema import Recipe

GIB = 2**30
# Committed model cards: the config.json fields of checkpoints no recipe host has at hand (docs/sources.md#estimator).
MODELS_DIR = Path(__file__).resolve().parents[2] / "data"
CARD_GLOB = "model-card-*.json"


# --- the model's config -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """The model facts the estimator reads: ``config`` (config.json, the language model's section), where it came
    from, and the quantisation of the routed experts and of the rest (None for a dense model)."""

    config: dict[str, Any]
    origin: str
    experts_quant: str | None = None
    other_quant: str | None = None

    @property
    def model_type(self) -> str:
        """config.json's model_type (``deepseek_v4``, ``qwen3``, ...)."""
        return str(self.config.get("model_type", ""))

    def get(self, key: str) -> Any:
        """A config value; raises `UserError` naming the key when the config lacks it."""
        if key not in self.config:
            raise UserError(f"the model config ({self.origin}) has no '{key}', which the estimator needs",
                            "use the checkpoint's own config.json (it names every field the engine reads)")
        return self.config[key]

    @property
    def is_moe(self) -> bool:
        """The model has routed experts (``n_routed_experts`` in its config)."""
        return "n_routed_experts" in self.config


def _read_json(path: Path) -> dict:
    """A model config or card, through the bounded reader every user file goes through (`core.yamlio.load_json`).

    Raises:
        UserError: unreadable, not JSON, or not a JSON object.
    """
    data = load_json(path, "restore the checkpoint's config.json (or the model card) and run again")
    if not isinstance(data, dict):
        raise UserError(f"the model config {path} is not a JSON object", "restore the checkpoint's config.json")
    return data


def _matches(card: dict, recipe: Recipe) -> bool:
    match, m = card.get("match", {}), recipe.model
    return bool((match.get("repo_id") and match["repo_id"] == m.repo_id)
                or (match.get("path_name") and match["path_name"] == Path(m.path).name))


def _card_quants(recipe: Recipe, models_dir: Path) -> tuple[str | None, str | None]:
    """The quantisations a committed card records for the recipe's checkpoint (a config.json does not say how a GGUF
    was quantised), else (None, None)."""
    for path in sorted(models_dir.glob(CARD_GLOB)):
        card = _read_json(path)
        if _matches(card, recipe):
            return card.get("experts_quant"), card.get("other_quant")
    return None, None


def load_card(recipe: Recipe, models_dir: Path = MODELS_DIR) -> Card:
    """The model's config for `recipe`.

    Order: a generated model's config is its ``model.generator`` section; else ``<model.path>/config.json`` (or
    ``hf/config.json`` beside a GGUF) when this host has the model, with the quantisations of a matching card; else
    the committed model card in `models_dir` matching the recipe's ``repo_id`` or the name of ``model.path``.

    Raises:
        UserError: no config is found, or the one found is not a readable JSON object.
    """
    m = recipe.model
    if m.source == "generated" and m.generator is not None:
        cfg = {"model_type": "qwen3", **m.generator.model_dump(), "torch_dtype": "float32",
               "tie_word_embeddings": True}
        return Card(cfg, "recipe model.generator")
    local = Path(m.path) / "config.json"
    # A GGUF directory keeps the checkpoint's own config.json beside the .gguf under hf/ (transformers cannot derive
    # it from the GGUF for this architecture).
    for path in (local, Path(m.path) / "hf" / "config.json"):
        if path.is_file():
            return Card(text_config(_read_json(path)), str(path), *_card_quants(recipe, models_dir))
    for path in sorted(models_dir.glob(CARD_GLOB)):
        card = _read_json(path)
        if _matches(card, recipe):
            return Card(text_config(card["config"]), f"model card {path.name}", card.get("experts_quant"),
                        card.get("other_quant"))
    raise UserError(f"recipe '{recipe.name}': no model config to read ({local} is not on this host and no model card "
                    f"in {models_dir} matches {m.repo_id or Path(m.path).name})",
                    f"copy the checkpoint's config.json to {local}, or add a model card for it to {models_dir}")


# --- weights ------------------------------------------------------------------------------------------------------


def quant_bits(name: str, what: str) -> float:
    """Bits per weight of quantisation `name` (`constants.QUANT_BITS`).

    Raises:
        UserError: an unknown quantisation, naming `what` it was for.
    """
    if name not in C.QUANT_BITS:
        raise UserError(f"unknown quantisation '{name}' for {what}: the estimator knows "
                        f"{', '.join(sorted(C.QUANT_BITS))}",
                        "add its bits per weight, with the format's source, to QUANT_BITS in "
                        "ds4deploy/plan/estimate/constants.py")
    return C.QUANT_BITS[name]


def checkpoint_bytes(recipe: Recipe) -> tuple[float, str]:
    """Bytes of the checkpoint's weight files: the committed manifest's ``*.safetensors`` / ``*.gguf`` sizes when
    there is one, else ``model.size_on_disk_gb`` (GB = 10**9 bytes). Returns (bytes, where from)."""
    from ds4deploy.model.manifest import load_manifest, manifest_path

    path = manifest_path(recipe)
    if path.is_file():
        # The one reader of a manifest (shape, sizes as bounded integers, safe names): `model.manifest.check_manifest`.
        files = load_manifest(recipe)["files"]
        size = sum(e["size"] for n, e in files.items() if n.endswith((".safetensors", ".gguf")))
        if size:
            return float(size), f"{path.name} (weight files)"
    return finite(recipe.model.size_on_disk_gb * 1e9, f"recipe '{recipe.name}': model.size_on_disk_gb "
                  f"{recipe.model.size_on_disk_gb:g} GB", "write the checkpoint's real size in GB"), \
        "model.size_on_disk_gb"


def finite(value: float, what: str, fix: str) -> float:
    """`value` when it is a finite number; the estimator never divides or steps on an infinity or a NaN that its
    arithmetic made of a recipe's numbers (a size or a memory so large that bytes overflow a float).

    Raises:
        UserError: naming `what` the value came from, with `fix`.
    """
    if not math.isfinite(value):
        raise UserError(f"{what} gives {value} bytes or tokens: the estimator cannot count with it", fix)
    return value


@dataclass(frozen=True)
class Weights:
    """Where the weights sit, in bytes. ``*_gpu`` are per GPU (one rank of tensor x pipeline); ``host`` is the
    experts held in host RAM (whole box). ``active_params_gpu`` is the weights one token passes through per GPU
    (2 FLOP each in prefill)."""

    total: float
    experts: float
    rest: float
    replicated: float
    experts_gpu: float
    rest_gpu: float
    streamed_gpu: float
    host: float
    active_params_gpu: float
    experts_quant: str
    source: str

    @property
    def gpu(self) -> float:
        """Bytes of weights per GPU."""
        return self.experts_gpu + self.rest_gpu


def experts_on_host(recipe: Recipe) -> bool:
    """Routed experts live in host RAM: the lk_moe hybrid (engine capability ``lk_moe_cpu_experts``) or a llama.cpp
    override that pins ``exps`` tensors to the CPU (``--override-tensor exps=CPU``)."""
    ot = str(recipe.serving.extra_args.get("override-tensor", ""))
    return "lk_moe_cpu_experts" in recipe.engine.capabilities or "exps=CPU" in ot


def gpu_layer_fraction(recipe: Recipe, card: Card) -> float:
    """Fraction of the layers held on the GPUs: llama.cpp's ``--n-gpu-layers N`` (serving.extra_args) keeps N layers
    there and the rest in host RAM (ggml-org/llama.cpp tools/server/README.md); 1.0 without it."""
    ngl = recipe.serving.extra_args.get("n-gpu-layers")
    layers = int(card.config.get("num_hidden_layers") or 0)
    if ngl is None or not layers:
        return 1.0
    if isinstance(ngl, bool) or not isinstance(ngl, int | str) or not str(ngl).lstrip("-").isdigit():
        raise UserError(f"recipe '{recipe.name}': serving.extra_args.n-gpu-layers = {ngl!r} is not a layer count",
                        "write the number of layers llama.cpp keeps on the GPUs (e.g. 999 for all)")
    return max(0.0, min(1.0, int(ngl) / layers))


def _dsv4_replicated_params(card: Card) -> float:
    """Parameters vLLM replicates on every tensor-parallel rank, per model: fused_wqa_wkv (hidden x (q_lora +
    head_dim)) and the KV compressors (hidden x 2 x coff x head_dim; coff 2 on ratio-4 layers), per layer
    (vllm/models/deepseek_v4/attention.py, compressor.py: disable_tp=True)."""
    h, hd = card.get("hidden_size"), card.get("head_dim")
    out = 0.0
    for r in card.get("compress_ratios")[: card.get("num_hidden_layers")]:
        out += h * (card.get("q_lora_rank") + hd)
        if r > 1:
            out += h * 2 * (2 if r == 4 else 1) * hd
    return out


def streamed_params(card: Card) -> float:
    """Non-expert weights a decode round streams, in parameters: per layer the attention projections (wq_a, wkv,
    wq_b, wo_a, wo_b; vllm/models/deepseek_v4/attention.py), the KV compressor and, on ratio-4 layers, the sparse
    indexer (wq_b, weights_proj, its compressor); the shared experts; the LM head. Embedding and Engram tables are
    looked up a row at a time, not streamed."""
    h, hd, heads = card.get("hidden_size"), card.get("head_dim"), card.get("num_attention_heads")
    ql, ol, groups = card.get("q_lora_rank"), card.get("o_lora_rank"), card.get("o_groups")
    ihd, ih = card.get("index_head_dim"), card.get("index_n_heads")
    per = 0.0
    for r in _dsv4_layers(card):
        per += h * (ql + hd) + ql * heads * hd + (heads * hd // groups) * groups * ol + groups * ol * h
        if r > 1:
            per += h * 2 * (2 if r == 4 else 1) * hd
        if r == 4:
            per += ql * ih * ihd + h * ih + h * 2 * 2 * ihd
    shared = card.get("num_hidden_layers") * card.config.get("n_shared_experts", 0) * 3 * h * \
        card.get("moe_intermediate_size")
    return per + shared + card.get("vocab_size") * h


def weights(recipe: Recipe, card: Card) -> Weights:
    """Weights per GPU and in host RAM for `recipe` (see the module docstring).

    Raises:
        UserError: an unknown quantisation, a config without a needed field, or a checkpoint smaller than its own
            experts (config and file sizes disagree).
    """
    total, where = checkpoint_bytes(recipe)
    tp, pp = recipe.parallelism.tensor, recipe.parallelism.pipeline
    if not card.is_moe:
        stored = str(card.config.get("torch_dtype") or "bfloat16")
        dt = recipe.model.dtype if recipe.model.dtype != "auto" else stored
        if stored not in C.DTYPE_BYTES or dt not in C.DTYPE_BYTES:
            raise UserError(f"unknown dtype '{stored if stored not in C.DTYPE_BYTES else dt}' for the weights of "
                            f"{recipe.name}", "set model.dtype to bfloat16, float16 or float32")
        params = total / C.DTYPE_BYTES[stored]
        mem = params * C.DTYPE_BYTES[dt]
        return Weights(mem, 0.0, mem, 0.0, 0.0, mem / (tp * pp), mem / (tp * pp), 0.0, params / (tp * pp), dt,
                       f"{where}, {stored} on disk, {dt} in memory")
    q = card.experts_quant or C.EXPERT_DTYPE_QUANT.get(str(card.config.get("expert_dtype")), "")
    bits = quant_bits(q or str(card.config.get("expert_dtype")), f"the routed experts of {recipe.name}")
    layers, e, h, i = (card.get(k) for k in ("num_hidden_layers", "n_routed_experts", "hidden_size",
                                             "moe_intermediate_size"))
    expert_params = layers * e * 3 * h * i
    experts = expert_params * bits / 8
    rest = total - experts
    if rest <= 0:
        raise UserError(f"recipe '{recipe.name}': the checkpoint ({total / 1e9:.1f} GB, {where}) is smaller than its "
                        f"routed experts alone ({experts / 1e9:.1f} GB at {bits:g} bits, from {card.origin})",
                        "check model.size_on_disk_gb / the manifest and the experts' quantisation")
    other_bits = quant_bits(card.other_quant or "fp8", f"the non-expert weights of {recipe.name}")
    replicated = min(rest, _dsv4_replicated_params(card) * other_bits / 8) if "compress_ratios" in card.config \
        else 0.0
    host = experts_on_host(recipe)
    on_gpu = gpu_layer_fraction(recipe, card)  # GGUF offload: the other layers' weights stay in host RAM
    experts_gpu = 0.0 if host else experts * on_gpu / (tp * pp)
    rest_gpu = ((rest - replicated) / (tp * pp) + replicated / pp) * on_gpu
    in_host = (experts if host else experts * (1 - on_gpu)) + rest * (1 - on_gpu)
    # Active weights per token: the experts a token routes to (plus shared) and the rest (read as params at ~1 B).
    active_expert = layers * (card.get("num_experts_per_tok") + card.config.get("n_shared_experts", 0)) * 3 * h * i
    active = active_expert + rest / (other_bits / 8)
    streamed = min(rest, streamed_params(card) * other_bits / 8) if "compress_ratios" in card.config else rest
    return Weights(total, experts, rest, replicated, experts_gpu, rest_gpu, streamed * on_gpu / (tp * pp),
                   in_host,
                   active / (tp * pp), q, f"{where}; experts {q} ({bits:g} bits) from {card.origin}")


# --- KV cache -----------------------------------------------------------------------------------------------------


def _dsv4_layers(card: Card) -> list[int]:
    return list(card.get("compress_ratios")[: card.get("num_hidden_layers")])


def dsv4_physical(card: Card, kv_dtype: str) -> tuple[float, float, float]:
    """Physical bytes of vLLM's DeepSeek V4 KV cache for one request (constants.DSV4_ROW_BYTES and the layout named
    there): (bytes per context token, bytes per in-flight token, bytes held per request whatever its length).
    In-flight tokens (up to max_num_batched_tokens per step) hold a compressor state row per compressing layer and a
    sliding-window row per layer; every request keeps its sliding window (``sliding_window`` rows per layer) and
    the compressor's lookback (coff x ratio state rows).

    Raises:
        UserError: a KV dtype with no DeepSeek V4 layout.
    """
    if kv_dtype not in C.DSV4_ROW_BYTES:
        raise UserError(f"KV cache dtype '{kv_dtype}' has no DeepSeek V4 layout in the estimator "
                        f"({', '.join(sorted(C.DSV4_ROW_BYTES))})",
                        "set serving.kv_cache_dtype to fp8_ds_mla or nvfp4_ds_mla")
    row, hd = C.DSV4_ROW_BYTES[kv_dtype], card.get("head_dim")
    idx_hd = card.get("index_head_dim")
    window = card.get("sliding_window")
    per_ctx = per_flight = fixed = 0.0
    for r in _dsv4_layers(card):
        per_flight += row
        fixed += row * window
        if r > 1:
            coff = 2 if r == 4 else 1
            state = 2 * coff * hd * C.FP32_BYTES
            per_ctx += row / r
            per_flight += state
            fixed += state * coff * r
        if r == 4:
            per_ctx += (idx_hd + C.DSV4_INDEX_ROW_EXTRA) / r
            per_flight += 2 * 2 * idx_hd * C.FP32_BYTES
    return per_ctx, per_flight, fixed


def engine_kv_factors(profile: str = "vllm-dsv4") -> tuple[float, float]:
    """(length factor, in-flight factor) of the engine's DeepSeek V4 KV accounting over the physical layout, solved
    from the two published per-request needs in ``constants.ENGINE_KV_ACCOUNTING[profile]`` (same context,
    two max_num_batched_tokens) with the DeepSeek-V4-Flash-0731 card."""
    acc = C.ENGINE_KV_ACCOUNTING[profile]
    path = MODELS_DIR / "model-card-deepseek-ai__DeepSeek-V4-Flash-0731.json"
    card = Card(text_config(_read_json(path)["config"]), path.name)
    per_ctx, per_flight, _ = dsv4_physical(card, "fp8_ds_mla")
    (l1, b1, g1), (_, b2, g2) = acc["published"]
    flight = (g2 - g1) * GIB / (b2 - b1)
    ctx = (g1 * GIB - flight * b1) / l1
    return ctx / per_ctx, flight / per_flight


@dataclass(frozen=True)
class Kv:
    """KV capacity per GPU: bytes one ``max_model_len`` request needs as the engine accounts it (``need``), the bytes
    the engine can allocate (``available``), full-length sessions that fit (``sessions``), the pool in tokens and
    the basis of the accounting (engine figures, or the physical layout where the engine's own accounting is not
    known). ``missing`` names what is unknown (then the numbers are None)."""

    per_token: float | None
    per_flight: float | None
    need: float | None
    available: float | None
    sessions: int | None
    pool_tokens: int | None
    basis: str
    available_basis: str
    missing: str | None = None


def kv_dtype(recipe: Recipe) -> str:
    """serving.kv_cache_dtype, "auto" when unset (the engine's default)."""
    return recipe.serving.kv_cache_dtype or "auto"


def batched_tokens(recipe: Recipe) -> int:
    """max_num_batched_tokens: the recipe's, else vLLM's default (constants.DEFAULT_BATCHED_TOKENS)."""
    if recipe.serving.max_num_batched_tokens:
        return recipe.serving.max_num_batched_tokens
    return C.DEFAULT_BATCHED_TOKENS["cpu" if recipe.engine.image.arch == "cpu" else "gpu"]


def kv_available(recipe: Recipe, w: Weights) -> tuple[float | None, str]:
    """Bytes per GPU the engine can give the KV cache, and how that was found."""
    fixed = recipe.serving.extra_args.get("kv-cache-memory-bytes")
    if fixed is not None:
        return _bytes_setting(fixed, 1, f"recipe '{recipe.name}': serving.extra_args.kv-cache-memory-bytes"), \
            "fixed: serving.extra_args.kv-cache-memory-bytes"
    if recipe.engine.image.arch == "cpu":
        space = recipe.engine.env.get("VLLM_CPU_KVCACHE_SPACE", C.CPU_KVCACHE_SPACE_DEFAULT_GIB)
        return _bytes_setting(space, GIB, f"recipe '{recipe.name}': engine.env.VLLM_CPU_KVCACHE_SPACE (GiB)"), \
            "fixed: engine.env VLLM_CPU_KVCACHE_SPACE (vLLM CPU backend)"
    g = recipe.hardware.gpus
    if g.memory_gib is None or recipe.memory is None:
        return None, "hardware.gpus.memory_gib and memory.overhead_gib_per_gpu (activation peak, graphs) are not set"
    util = recipe.serving.gpu_memory_utilization
    avail = finite(util * g.memory_gib * GIB - w.gpu - recipe.memory.overhead_gib_per_gpu * GIB,
                   f"recipe '{recipe.name}': hardware.gpus.memory_gib {g.memory_gib:g} GiB and "
                   f"memory.overhead_gib_per_gpu {recipe.memory.overhead_gib_per_gpu:g} GiB",
                   "write the GPU's usable memory in GiB as nvidia-smi reports it")
    return avail, (f"gpu_memory_utilization {recipe.serving.gpu_memory_utilization} x {g.memory_gib} GiB - weights - "
                   f"overhead {recipe.memory.overhead_gib_per_gpu} GiB (memory.overhead_gib_per_gpu)")


def _bytes_setting(value: object, unit: float, what: str) -> float:
    """A memory setting the engine reads (a number, or its text in an environment variable) times `unit`, in bytes.

    Raises:
        UserError: not a number, not finite or not > 0 (the engine would refuse to start).
    """
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number * unit) or number <= 0:
        raise UserError(f"{what} = {value!r} is not a finite number > 0", "write the size the engine allocates for "
                        "its KV cache as a plain number")
    return number * unit


def kv(recipe: Recipe, card: Card, w: Weights, context: int | None = None) -> Kv:
    """KV capacity for requests of `context` tokens (default ``max_model_len``); see `Kv`."""
    length = context or recipe.serving.max_model_len
    avail, abasis = kv_available(recipe, w)
    b = batched_tokens(recipe)
    pp = recipe.parallelism.pipeline
    per_fixed = 0.0
    if card.model_type == "deepseek_v4":
        per_ctx, per_flight, per_fixed = dsv4_physical(card, kv_dtype(recipe))
        prof = next((k for k, a in C.ENGINE_KV_ACCOUNTING.items()
                     if recipe.engine.flavor in a["flavors"] and kv_dtype(recipe) in a["dtypes"]), None)
        if prof:
            fl, fb = engine_kv_factors(prof)
            # The engine reserves in-flight rows for max_num_batched_tokens; its fitted factor covers the window.
            per_ctx, per_flight, per_fixed = per_ctx * fl, per_flight * fb, 0.0
            basis = f"{recipe.engine.flavor} accounting ({C.ENGINE_KV_ACCOUNTING[prof]['fitted_on']})"
        else:
            per_flight = 0.0
            basis = (f"physical layout of vLLM's DeepSeek V4 cache (rows per context token, sliding window and "
                     f"compressor state per request); no accounting figures for engine flavor {recipe.engine.flavor} "
                     f"with KV dtype {kv_dtype(recipe)}, so this is the minimum it needs")
        per_ctx, per_flight, per_fixed = per_ctx / pp, per_flight / pp, per_fixed / pp
    elif card.model_type in ("qwen3", "qwen2", "llama"):
        cfg = card.config
        heads = cfg.get("num_key_value_heads") or card.get("num_attention_heads")
        hd = cfg.get("head_dim") or card.get("hidden_size") // card.get("num_attention_heads")
        dt = kv_dtype(recipe)
        el = 1 if dt.startswith("fp8") else 2
        per_ctx = 2 * heads * hd * card.get("num_hidden_layers") * el / (recipe.parallelism.tensor * pp)
        per_flight = 0.0
        basis = "K and V per layer (2 x KV heads x head_dim x dtype bytes), split over tensor x pipeline ranks"
    else:
        return Kv(None, None, None, avail, None, None, "", abasis,
                  missing=f"no KV accounting for model_type '{card.model_type}' ({card.origin}) and engine "
                          f"{recipe.engine.name} {recipe.engine.version}")
    need = finite(per_ctx * length + per_flight * min(b, length) + per_fixed,
                  f"recipe '{recipe.name}': the KV need of one {length:,}-token request ({card.origin})",
                  "check serving.max_model_len and the model config")
    sessions = pool = None
    if avail is not None and need > 0:
        pool_f = finite(avail / need * length, f"recipe '{recipe.name}': KV available {avail:g} B over "
                        f"{need:g} B per request", "check hardware.gpus.memory_gib and the KV settings")
        sessions, pool = max(0, int(avail // need)), int(pool_f)
    return Kv(per_ctx, per_flight, need, avail, sessions, pool, basis, abasis)


# --- speed --------------------------------------------------------------------------------------------------------


@dataclass
class Geometry:
    """What one step of the engine moves, per GPU: dense bytes read every round, routed-expert bytes (all of them;
    a round reads the touched fraction), experts in host RAM, and the expert counts."""

    dense_gpu: float
    experts_gpu: float
    experts_host: float
    experts: int
    active: int
    pp: int
    chunk: int
    active_params_gpu: float
    k: int
    tokens_per_round: float
    output: int
    max_seqs: int = 1 << 30


def tokens_per_round(k: int, acceptance: float | None = None, accepted: float | None = None) -> float:
    """Tokens a session gains per verify round with k drafts: 1 + accepted drafts; from a per-draft acceptance rate
    p (each draft accepted only if the one before was): 1 + p + ... + p**k."""
    if k == 0:
        return 1.0
    if accepted is not None:
        if not math.isfinite(accepted) or accepted < 0:
            raise UserError(f"{accepted} drafts accepted per round is not a count of drafts",
                            "give a finite number of accepted drafts, 0 or more")
        return 1.0 + min(accepted, k)
    p = C.DEFAULT_ACCEPTANCE_RATE if acceptance is None else acceptance
    check_acceptance(p)
    # The geometric sum in closed form: no loop over k, which a recipe may set to any count.
    return float(k + 1) if p == 1 else (1 - p ** (k + 1)) / (1 - p)


def check_acceptance(p: float) -> None:
    """Refuse a draft acceptance rate that is not a probability: each draft is accepted or not, so the rate is a
    finite number from 0 (none accepted: one token per round) to 1 (all k accepted: k + 1 tokens per round).

    Raises:
        UserError: NaN, infinite, below 0 or above 1.
    """
    if not (math.isfinite(p) and 0 <= p <= 1):
        raise UserError(f"--acceptance {p}: a draft acceptance rate is a probability per draft token, from 0 to 1",
                        f"pass a rate from 0 to 1 (leave it out for the default, {C.DEFAULT_ACCEPTANCE_RATE})")


def touched(tokens: float, experts: int, active: int) -> float:
    """Fraction of a layer's routed experts that `tokens` independently routed tokens touch."""
    if experts == 0 or tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - active / experts) ** tokens


@dataclass
class _Request:
    session: int
    prompt: int
    start: float  # when the scheduler sees it
    left: int
    sent: float = 0.0  # when the client sent it
    api: float = 0.0  # time the API server spent on it before its first token
    ready: float = 0.0  # when its prompt has crossed every pipeline stage (decoding starts then)
    ctx: float = 0.0
    made: float = 0.0
    first: float | None = None
    end: float | None = None


def _arrival(r: _Request) -> tuple[float, int]:
    return r.start, r.session


def planned_steps(geo: Geometry, prompt: int, sessions: int, requests: int = 1) -> int:
    """Engine steps `simulate` takes for this workload, as planned before it runs: the sessions go through the
    engine max_num_seqs at a time, each wave prefilling its prompts in max_num_batched_tokens chunks and then decoding
    ``geo.output`` tokens at ``geo.tokens_per_round`` per round. Overlapping waves take fewer."""
    running = max(1, min(sessions, geo.max_seqs))
    waves = -(-sessions * requests // running)
    prefill = -(-prompt * running // max(1, geo.chunk))
    decode = math.ceil(max(geo.output - 1, 0) / geo.tokens_per_round) + 1
    return waves * (prefill + decode)


def planned_work(geo: Geometry, prompt: int, sessions: int, requests: int = 1) -> int:
    """The simulation's time for this workload in units of one running request's share of a step: `planned_steps`
    x (requests the engine runs at once + `C.STEP_COST_REQUESTS`, the fixed part of a step)."""
    return planned_steps(geo, prompt, sessions, requests) * (min(sessions, geo.max_seqs) + C.STEP_COST_REQUESTS)


def workload_problem(geo: Geometry, prompt: int, sessions: int, requests: int = 1) -> str | None:
    """What makes this workload one the simulation does not run (a count below 1, more sessions than
    `C.MAX_SESSIONS`, more `planned_work` than `C.MAX_SIM_WORK`), or None."""
    if min(prompt, sessions, requests, geo.output) < 1:
        return (f"a workload of {sessions} session(s) x {requests} request(s) of {prompt} prompt and {geo.output} "
                "output tokens: each count must be at least 1")
    if sessions > C.MAX_SESSIONS:
        return f"{sessions:,} sessions are more than the {C.MAX_SESSIONS:,} the estimator simulates"
    work = planned_work(geo, prompt, sessions, requests)
    if work > C.MAX_SIM_WORK:
        return (f"{sessions:,} session(s) x {requests} request(s) of {prompt:,} prompt and {geo.output:,} output "
                f"tokens take {planned_steps(geo, prompt, sessions, requests):,} engine steps with up to "
                f"{min(sessions, geo.max_seqs)} request(s) running ({geo.tokens_per_round:.2f} tokens per round): "
                f"{work:,} units of simulation, more than the {C.MAX_SIM_WORK:,} (constants.MAX_SIM_WORK, a few "
                "seconds) the estimator runs")
    return None


def simulate(geo: Geometry, hw: dict, prompt: int, sessions: int, bw_gbs: float | None,
             host_bw_gbs: float | None = None, requests: int = 1) -> dict[str, float]:
    """Step the scheduler for `sessions` closed-loop sessions, each sending `requests` requests of `prompt` tokens
    one after another (the next as soon as the last token of the one before is out), ``geo.output`` tokens each.

    `hw` holds the calibrated constants (t_round_s, ctx_s, tflops, attn_s, t_req_s, share, prefill_share; bw_gbs and
    host_bw_gbs override the datasheet bandwidths). Returns, over all requests: mean TTFT (s), mean prefill tok/s
    (prompt / (TTFT - t_req_s)), per-session decode tok/s of the median request (tokens after the first / time
    after the first), aggregate output tok/s (all tokens / time until the last one) and the mean decode round time (s).

    Raises:
        UserError: a workload `workload_problem` refuses, or constants that make a figure infinite or NaN.
    """
    problem = workload_problem(geo, prompt, sessions, requests)
    if problem:
        raise UserError(problem, "estimate fewer sessions or shorter requests (--sessions, --prompt, --output)")
    t_round, ctx_s = hw["t_round_s"], hw.get("ctx_s", 0.0)
    # Without a calibrated prefill rate (tflops) prompts cost nothing here and TTFT/prefill are not reported.
    c0 = 2 * geo.active_params_gpu / (hw["tflops"] * 1e12) if hw.get("tflops") else 0.0
    attn, t_req, share = hw.get("attn_s", 0.0), hw.get("t_req_s", 0.0), hw.get("share", 1.0)
    pshare = hw.get("prefill_share", 1.0)
    # Requests in the order the scheduler takes them: by arrival, then by session (`_arrival`); only the first
    # max_num_seqs are looked at per step, so a step costs what the engine runs, not the whole queue.
    live = [_Request(i, prompt, 0.0, prompt) for i in range(sessions)]
    sent = [1] * sessions
    done: list[_Request] = []
    now, rounds, round_time = 0.0, 0, 0.0
    per_round = 1 + geo.k
    # Every loop either runs a step (a decode round of at least one request, or a whole chunk of prompts, or the
    # last chunk of a prompt) or waits for the next one: at most twice that many turns. A loop past this bound has
    # stopped making progress; it stops rather than running forever.
    total = sessions * requests
    bound = 2 * total * (math.ceil(max(geo.output - 1, 0) / geo.tokens_per_round) + 2
                         + -(-prompt // max(1, geo.chunk))) + 2
    for _ in range(bound):
        if not live:
            break
        # The engine runs at most max_num_seqs requests; the rest wait in arrival order.
        running = live[: geo.max_seqs]
        dec = [r for r in running if r.left == 0 and r.ready <= now]
        budget = max(0, geo.chunk - len(dec) * per_round)
        pre_cost, chunk_sizes, finished = 0.0, [], []
        for r in running:  # first come, first served; one chunk budget per step
            if r.left == 0 or budget == 0 or r.start > now:
                continue
            n = min(r.left, budget)
            start = r.prompt - r.left
            pre_cost += n * (c0 + attn * (start + n / 2))
            chunk_sizes.append(n)
            r.left -= n
            budget -= n
            if r.left == 0:
                finished.append((r, n))
        # Independently routed tokens: a session's verify round routes (1 + k) x share tokens' worth of experts
        # (share > 1: the drafter's own routing adds to it); a prompt's consecutive tokens overlap, each after the
        # first adding prefill_share of a fresh token's experts.
        t_eff = len(dec) * (1 + geo.k) * share + sum(1 + (n - 1) * pshare for n in chunk_sizes)
        frac = touched(t_eff, geo.experts, geo.active)
        mem = 0.0
        if bw_gbs:
            mem += (geo.dense_gpu + geo.experts_gpu * frac) / (bw_gbs * 1e9)
        if geo.experts_host and host_bw_gbs:
            mem += geo.experts_host * frac / (host_bw_gbs * 1e9)
        # Roofline: a step waits for its weights or for its arithmetic, whichever is longer.
        step = t_round + max(mem * geo.pp, pre_cost) + ctx_s * sum(r.ctx for r in dec)
        if not dec and not chunk_sizes:
            # Nothing to run yet: wait for the next request or pipeline stage of a request the engine runs (the
            # queued ones cannot start before one of those ends).
            now = min(r.start if r.left else r.ready for r in running)
            continue
        now += step
        if dec:
            rounds += 1
            round_time += step
        for r in dec:
            r.made += geo.tokens_per_round
            r.ctx += geo.tokens_per_round
            if r.made >= geo.output - 1:
                r.end = now
        for i, (r, n) in enumerate(finished, start=1):
            # The last chunk leaves the first stage now; it still crosses the other pp - 1 stages. The API server
            # handles the requests of one step one after another (t_req_s each).
            r.api = i * t_req
            r.ready = now + (geo.pp - 1) * n * c0
            r.first = r.ready + r.api
            r.ctx = r.prompt
            if geo.output <= 1:
                r.end = r.first
        for r in sorted((r for r in running if r.end is not None), key=lambda r: r.session):
            done.append(r)
            live.remove(r)
            if sent[r.session] < requests:
                sent[r.session] += 1
                bisect.insort(live, _Request(r.session, prompt, r.end, prompt, sent=r.end), key=_arrival)
    if live:
        raise UserError(f"the simulation of {sessions} session(s) x {requests} request(s) of {prompt:,} prompt and "
                        f"{geo.output:,} output tokens made no progress within {bound:,} engine steps",
                        "report it with the recipe and the command: the estimator's scheduler model is at fault")
    n = len(done)
    ttft = sum(r.first - r.sent for r in done) / n
    # One session's decode rate is the median request's, as `ds4deploy bench` reports per_session_tok_s.
    decode = statistics.median((geo.output - 1) / max(r.end - r.first + t_req, 1e-9) for r in done)
    out = {
        "ttft_s": ttft,
        "prefill_tok_s": prompt / max(ttft - t_req, 1e-9),
        "per_session_tok_s": decode,
        "aggregate_tok_s": n * geo.output / max(max(r.end for r in done) + t_req, 1e-9),
        "round_s": round_time / rounds if rounds else 0.0,
    }
    bad = sorted(k for k, v in out.items() if not math.isfinite(v))
    if bad:
        raise UserError(f"the constants {sorted(hw)} make {', '.join(bad)} of this workload infinite or NaN",
                        "calibrate the hardware class again on a bench run: "
                        "`ds4deploy estimate <recipe> --calibrate <run.json> --write`")
    return out


def geometry(recipe: Recipe, card: Card, w: Weights, output: int, acceptance: float | None = None,
             accepted: float | None = None) -> Geometry:
    """The `Geometry` of `recipe`: bytes per GPU, experts, chunk size, drafts and tokens per round."""
    k = recipe.serving.speculative.num_speculative_tokens if recipe.serving.speculative else 0
    e = int(card.config.get("n_routed_experts", 0))
    a = int(card.config.get("num_experts_per_tok", 0))
    return Geometry(dense_gpu=w.streamed_gpu, experts_gpu=w.experts_gpu,
                    experts_host=w.host / max(1, recipe.parallelism.pipeline), experts=e, active=a,
                    pp=recipe.parallelism.pipeline, chunk=batched_tokens(recipe),
                    active_params_gpu=w.active_params_gpu, k=k,
                    tokens_per_round=tokens_per_round(k, acceptance, accepted), output=output,
                    max_seqs=recipe.serving.max_num_seqs or 1 << 30)
