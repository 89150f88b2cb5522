"""Limits the model itself sets, read from its ``config.json`` and checked against the recipe.

The engine refuses (or, with ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, silently degrades) a ``--max-model-len`` above the
context the checkpoint was trained for. vLLM derives that limit from the config in
``vllm/config/model.py:_get_and_verify_max_len`` (vLLM 0.32, https://github.com/vllm-project/vllm/blob/main/vllm/
config/model.py): the smallest of the length keys below, scaled by ``rope_scaling.factor`` for the RoPE scalings
that extend the context (not for ``su``/``longrope``/``llama3`` or the YaRN variants, whose config already states
the extended length). The attention head size must be one the engine's attention backend supports (the CPU backend
lists them in ``vllm/v1/attention/backends/cpu_attn.py:get_supported_head_sizes``).
`native_context` follows that rule and `context_problem` is the one check: it runs when the model is staged (hub
and local sources, after the bytes are verified) and at validation for a generated model (its config is the
recipe's generator section).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_json

# The config keys vLLM reads as a maximum length (same source as the module docstring).
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_sequence_length", "max_seq_length", "seq_len")
# RoPE scalings whose config already gives the extended length (no further factor), as vLLM 0.32 lists them.
NO_FACTOR_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# Head sizes vLLM 0.32's CPU attention backend runs (CPUAttentionBackend.get_supported_head_sizes).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys of a ``config.json`` mapping: its ``text_config`` section where a multimodal config
    keeps them there (transformers' composite configs), else the mapping itself."""
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def native_context(config: dict[str, Any]) -> int | None:
    """The longest context (tokens) a model's ``config.json`` admits, or None when it names no length.

    Multimodal configs keep the language model's keys under ``text_config``; that section wins (`text_config`).
    """
    cfg = text_config(config)
    lengths = [int(cfg[k]) for k in LENGTH_KEYS if isinstance(cfg.get(k), int | float)]
    if not lengths:
        return None
    out = min(lengths)
    rope = cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type")
    if isinstance(rope, dict) and kind and kind not in NO_FACTOR_ROPE and isinstance(rope.get("factor"), int | float):
        out = int(out * rope["factor"])
    return out


# GPUs without bfloat16 arithmetic (Volta, sm70): a bf16 checkpoint must be cast to float16 there.
NO_BF16_ARCH = ("sm70",)


def dtype_problem(config: dict[str, Any], recipe_dtype: str, gpu_arch: str | None, origin: str) -> str | None:
    """What is wrong when the recipe casts a bfloat16 checkpoint to float16 on hardware that runs bfloat16, or None.

    vLLM 0.32 allows the cast with only a log warning ("Casting torch.bfloat16 to torch.float16",
    vllm/config/model.py:_get_and_verify_dtype), and float16's range (max 65504) overflows where bfloat16 does not;
    the cast is only needed on GPUs without bf16 (`NO_BF16_ARCH`).

    Args:
        config: the model's config mapping (``torch_dtype`` or ``dtype``).
        recipe_dtype: model.dtype of the recipe.
        gpu_arch: hardware.gpus.arch (None for CPU-only recipes).
        origin: named in the message.
    """
    cfg = text_config(config)
    stored = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
    if stored == "bfloat16" and recipe_dtype in ("float16", "half") and gpu_arch not in NO_BF16_ARCH:
        return (f"model.dtype {recipe_dtype} casts the bfloat16 checkpoint ({origin}) to float16 on hardware that "
                "runs bfloat16; float16 overflows where bfloat16 does not. Fix: set model.dtype to auto or bfloat16")
    return None


def head_dim_problem(config: dict[str, Any], image_arch: str, origin: str) -> str | None:
    """What is wrong when the model's attention head size is one the engine cannot run, or None. Only the CPU
    backend's list is known here (`CPU_HEAD_SIZES`); GPU backends are not checked.

    Args:
        config: the model's config mapping (``head_dim``, else ``hidden_size / num_attention_heads``).
        image_arch: the recipe's engine.image.arch (``cpu``, ``sm70``, ...).
        origin: named in the message.
    """
    cfg = text_config(config)
    head = cfg.get("head_dim")
    if head is None and cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        head = cfg["hidden_size"] // cfg["num_attention_heads"]
    if image_arch == "cpu" and isinstance(head, int) and head not in CPU_HEAD_SIZES:
        return (f"the model's attention head size {head} ({origin}) is not one vLLM's CPU attention runs "
                f"({', '.join(map(str, CPU_HEAD_SIZES))}); the engine would fail at start. Fix: use a model with one "
                "of those head sizes (for a generated model: model.generator.head_dim)")
    return None


def context_problem(max_model_len: int, config: dict[str, Any], origin: str) -> str | None:
    """What is wrong when ``serving.max_model_len`` exceeds the model's native context, or None.

    Args:
        max_model_len: the recipe's serving.max_model_len (tokens).
        config: the model's config mapping.
        origin: where `config` came from (a file path, or the recipe's generator section), named in the message.
    """
    native = native_context(config)
    if native is not None and max_model_len > native:
        return (f"serving.max_model_len {max_model_len} is above the model's native context {native} tokens "
                f"({origin}); the engine refuses it. Fix: set serving.max_model_len to {native} or less")
    return None


def check_staged(recipe, model_dir: Path) -> None:
    """`context_problem`, `head_dim_problem` and `dtype_problem` against ``model_dir/config.json`` (GGUF-only
    directories have none and are not checked).

    Raises:
        UserError: config.json is not JSON, or either check fails.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return
    config = load_json(path, "the staged model is damaged: delete it and deploy again")
    if not isinstance(config, dict):
        raise UserError(f"{path} is not a JSON object", "the staged model is damaged: delete it and deploy again")
    problem = (context_problem(recipe.serving.max_model_len, config, str(path))
               or head_dim_problem(config, recipe.engine.image.arch, str(path))
               or dtype_problem(config, recipe.model.dtype, recipe.hardware.gpus.arch, str(path)))
    if problem:
        cause, fix = problem.split(" Fix: ")
        raise UserError(f"recipe '{recipe.name}': {cause}", fix)
