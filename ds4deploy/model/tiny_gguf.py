"""Generate a tiny GGUF of the ``deepseek4`` architecture, in split parts, with no download.

The llama.cpp family's stand-in for a recipe's real model (`recipes/cpu-llamacpp.yaml` serves it; the engine
rehearsal loads it with every llama.cpp recipe's argv): same architecture, same file layout (one file, or
gguf-split parts named ``<stem>-00001-of-0000N.gguf`` that llama-server loads by naming part 1), seeded random
weights, a real byte-level BPE tokenizer and a chat template with tools.

Written with the PyPI ``gguf`` package (0.19.0), whose constants predate ``deepseek4``: every key and tensor name is
spelled here as the pinned llama.cpp source spells it (`src/llama-arch.cpp` LLM_KV_NAMES / LLM_TENSOR_NAMES at
commit 0c1e57098bba, the source `ds4deploy image lock` pins for the llamacpp images). The shape is the one the
pinned source's own architecture test builds for deepseek4 (`tests/test-llama-archs.cpp`: n_embd 512, 8 heads of
64 so that the GPU flash-attention kernels take it, 4 layers with compress ratios 0, 0, 4, 128, 2 routed experts,
1 shared, sqrt-softplus gating, 4 hyper-connections), with a smaller expert width and a real tokenizer.

The chat template is the model's own: DeepSeek-V4-Flash-0731's template as the pinned llama.cpp source ships it
(`models/templates/deepseek-ai-DeepSeek-V4-Flash-0731.jinja`, read from the locked sdist by `chat_template_from`, never
copied into this repository). llama-server's ``--jinja`` chat code recognises it (`common/chat.cpp`: a template that
defines ``dsml_token`` selects the DeepSeek V3.2/V4 DSML tool-call parser), so a tool call goes through the same
template and parser as the real model's. The tokenizer is byte-level BPE trained on the vLLM family's corpus
(`ds4deploy.model.tiny`), with the template's own specials (User, Assistant, begin and end of
sentence, each between U+FF5C bars) as control tokens, end of sentence the EOS token.

Split layout (the pinned source's `tools/gguf-split/gguf-split.cpp`): part 1 holds every metadata key; each part
holds ``split.no`` (u16, 0-based), ``split.count`` (u16) and ``split.tensors.count`` (i32, tensors in all parts);
the loader (`src/llama-model-loader.cpp`) opens the others by name and refuses a part whose ``split.no`` is wrong.

Generation is deterministic: the same spec gives byte-identical files.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ds4deploy.core.errors import UserError
from ds4deploy.model.tiny import write_changed

ARCH = "deepseek4"
# LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (src/llama-hparams.h); the deepseek4 loader refuses any other.
GATING_SQRT_SOFTPLUS = 4
# llama_token_type (include/llama.h): NORMAL 1, CONTROL 3.
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
# The DeepSeek V4 template's specials (models/templates/deepseek-ai-DeepSeek-V4-Flash-0731.jinja), control tokens here.
# Written with escapes: U+FF5C FULLWIDTH VERTICAL LINE and U+2581 LOWER ONE EIGHTH BLOCK, as in the template.
BOS, EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
SPECIAL_TOKENS = [BOS, EOS, "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"]
# Where the template sits in the llama-cpp-python sdist (the locked artifact of the llamacpp images).
TEMPLATE_MEMBER = "vendor/llama.cpp/models/templates/deepseek-ai-DeepSeek-V4-Flash-0731.jinja"


def chat_template_from(sdist: Path) -> str:
    """The DeepSeek-V4-Flash-0731 chat template from the llama-cpp-python sdist `sdist` (a .tar.gz).

    Raises:
        UserError: the file is not a readable tarball or holds no such template.
    """
    import tarfile

    try:
        with tarfile.open(sdist, "r:gz") as tar:
            top = tar.next()
            root = top.name.split("/", 1)[0] if top is not None else ""
            member = tar.extractfile(f"{root}/{TEMPLATE_MEMBER}")
            if member is None:
                raise KeyError(TEMPLATE_MEMBER)
            return member.read().decode("utf-8")
    except (OSError, KeyError, tarfile.TarError) as exc:
        raise UserError(f"{sdist} holds no DeepSeek V4 chat template ({TEMPLATE_MEMBER}): {exc}",
                        "pass the llama-cpp-python sdist the llamacpp image lock records (`ds4deploy image lock`)"
                        ) from None


def _train_tokenizer(vocab_target: int):
    """Byte-level BPE on the bundled corpus with the DeepSeek specials (deterministic for a given corpus)."""
    from importlib import resources

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = resources.files("ds4deploy.data").joinpath("corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_target, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    return tok


@dataclass(frozen=True)
class TinyGgufSpec:
    """Shape and file layout of the tiny deepseek4 GGUF.

    Attributes:
        seed: numpy RNG seed for the weights.
        parts: number of gguf-split files (1 = a single ``<stem>.gguf``).
        stem: file name before ``-0000k-of-0000N.gguf`` (or ``.gguf``).
        context_length: ``deepseek4.context_length``, tokens (the model's native context).
        expert_ff: routed and shared expert width (the architecture test uses 1,024; 256 keeps the file ~10 MB).
        vocab_target: BPE vocabulary size asked of the tokenizer trainer.
    """

    seed: int = 0
    parts: int = 1
    stem: str = "ds4-tiny-deepseek4"
    context_length: int = 65536
    expert_ff: int = 256
    vocab_target: int = 1024

    def file_names(self) -> list[str]:
        """The file names, part 1 first: what ``-m`` names is ``file_names()[0]``."""
        if self.parts == 1:
            return [f"{self.stem}.gguf"]
        return [f"{self.stem}-{i:05d}-of-{self.parts:05d}.gguf" for i in range(1, self.parts + 1)]


def recipe_spec(recipe) -> TinyGgufSpec:
    """The `TinyGgufSpec` of a ``generated`` llama.cpp recipe (a `ds4deploy.recipe.schema.Recipe`): the parts and
    the stem of its ``model.gguf`` (part 1's name without ``-00001-of-0000N.gguf``, or without ``.gguf``).

    Raises:
        UserError: the recipe's model is not a generated GGUF, or part 1's name does not fit its part count
            (`ds4deploy.engines.llamacpp.gguf_parts`).
    """
    from ds4deploy.engines.llamacpp import SPLIT_RE, gguf_parts

    g = recipe.model.gguf
    if recipe.model.source != "generated" or g is None:
        raise UserError(f"recipe '{recipe.name}' has no generated GGUF model (model.source "
                        f"'{recipe.model.source}', model.gguf {'set' if g else 'unset'})",
                        "give a llama.cpp recipe model.source: generated and a model.gguf section")
    first = gguf_parts(g.file, g.parts)[0]
    stem = SPLIT_RE.match(first)["stem"] if g.parts > 1 else first.removesuffix(".gguf")
    return TinyGgufSpec(parts=g.parts, stem=stem)


# The architecture test's deepseek4 shape (tests/test-llama-archs.cpp at the pinned commit).
N_EMBD, N_HEAD, HEAD_DIM, N_LAYER = 512, 8, 64, 4
Q_LORA, O_GROUPS, O_LORA = 64, 8, 32
COMPRESS_RATIOS = [0, 0, 4, 128]
HC_MULT = 4
N_EXPERT, N_EXPERT_USED, N_EXPERT_SHARED = 2, 2, 1
INDEXER_HEADS, INDEXER_DIM = 64, 128


def _tensors(spec: TinyGgufSpec, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """Every tensor, in file order, as numpy arrays (numpy shape = the ggml shape reversed). Matrices and expert
    stacks in float16 (the CPU and CUDA kernels take f16 weights), vectors and hyper-connection mixers in float32."""
    rng = np.random.default_rng(spec.seed)
    hc_dim, hc_mix = HC_MULT * N_EMBD, (2 + HC_MULT) * HC_MULT
    ff = spec.expert_ff

    def w(*ggml_shape: int, f16: bool = True) -> np.ndarray:
        a = rng.standard_normal(tuple(reversed(ggml_shape))) * 0.02
        return a.astype(np.float16 if f16 else np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    out: list[tuple[str, np.ndarray]] = [
        ("token_embd.weight", w(N_EMBD, n_vocab)),
        ("output_norm.weight", ones(N_EMBD)),
        ("output.weight", w(N_EMBD, n_vocab)),
        ("output_hc_fn.weight", w(hc_dim, HC_MULT, f16=False)),
        ("output_hc_base.weight", np.zeros(HC_MULT, np.float32)),
        ("output_hc_scale.weight", ones(1)),
    ]
    for i in range(N_LAYER):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", ones(N_EMBD)),
            (b + "attn_sinks.weight", np.zeros(N_HEAD, np.float32)),
            (b + "attn_q_a.weight", w(N_EMBD, Q_LORA)),
            (b + "attn_q_a_norm.weight", ones(Q_LORA)),
            (b + "attn_q_b.weight", w(Q_LORA, N_HEAD * HEAD_DIM)),
            (b + "attn_kv.weight", w(N_EMBD, HEAD_DIM)),
            (b + "attn_kv_a_norm.weight", ones(HEAD_DIM)),
            # stored 2-D as (n_head*head_dim/o_groups, o_lora*o_groups); the loader reshapes it to 3-D
            (b + "attn_output_a.weight", w(N_HEAD * HEAD_DIM // O_GROUPS, O_LORA * O_GROUPS)),
            (b + "attn_output_b.weight", w(O_GROUPS * O_LORA, N_EMBD)),
            (b + "hc_attn_fn.weight", w(hc_dim, hc_mix, f16=False)),
            (b + "hc_attn_base.weight", np.zeros(hc_mix, np.float32)),
            (b + "hc_attn_scale.weight", ones(3)),
            (b + "hc_ffn_fn.weight", w(hc_dim, hc_mix, f16=False)),
            (b + "hc_ffn_base.weight", np.zeros(hc_mix, np.float32)),
            (b + "hc_ffn_scale.weight", ones(3)),
        ]
        ratio = COMPRESS_RATIOS[i]
        if ratio:
            coff = 2 if ratio == 4 else 1
            out += [
                (b + "attn_compressor_kv.weight", w(N_EMBD, coff * HEAD_DIM)),
                (b + "attn_compressor_gate.weight", w(N_EMBD, coff * HEAD_DIM)),
                (b + "attn_compressor_ape.weight", w(coff * HEAD_DIM, ratio, f16=False)),
                (b + "attn_compressor_norm.weight", ones(HEAD_DIM)),
            ]
            if ratio == 4:
                out += [
                    (b + "indexer.proj.weight", w(N_EMBD, INDEXER_HEADS)),
                    (b + "indexer.attn_q_b.weight", w(Q_LORA, INDEXER_HEADS * INDEXER_DIM)),
                    (b + "indexer_compressor_kv.weight", w(N_EMBD, 2 * INDEXER_DIM)),
                    (b + "indexer_compressor_gate.weight", w(N_EMBD, 2 * INDEXER_DIM)),
                    (b + "indexer_compressor_ape.weight", w(2 * INDEXER_DIM, ratio, f16=False)),
                    (b + "indexer_compressor_norm.weight", ones(INDEXER_DIM)),
                ]
        out += [
            (b + "ffn_gate_inp.weight", w(N_EMBD, N_EXPERT, f16=False)),
            (b + "exp_probs_b.bias", np.zeros(N_EXPERT, np.float32)),
            (b + "ffn_norm.weight", ones(N_EMBD)),
            (b + "ffn_gate_exps.weight", w(N_EMBD, ff, N_EXPERT)),
            (b + "ffn_down_exps.weight", w(ff, N_EMBD, N_EXPERT)),
            (b + "ffn_up_exps.weight", w(N_EMBD, ff, N_EXPERT)),
            (b + "ffn_gate_shexp.weight", w(N_EMBD, ff * N_EXPERT_SHARED)),
            (b + "ffn_down_shexp.weight", w(ff * N_EXPERT_SHARED, N_EMBD)),
            (b + "ffn_up_shexp.weight", w(N_EMBD, ff * N_EXPERT_SHARED)),
        ]
    return out


def _metadata(writer, spec: TinyGgufSpec, tok, chat_template: str) -> None:
    """Every key of part 1: the deepseek4 hyper-parameters, the tokenizer and the chat template."""
    a = ARCH
    u32 = writer.add_uint32
    f32 = writer.add_float32
    writer.add_name("ds4-tiny-deepseek4")
    u32(f"{a}.context_length", spec.context_length)
    u32(f"{a}.embedding_length", N_EMBD)
    u32(f"{a}.embedding_length_out", N_EMBD * HC_MULT)
    u32(f"{a}.block_count", N_LAYER)
    u32(f"{a}.feed_forward_length", spec.expert_ff)
    u32(f"{a}.leading_dense_block_count", 0)
    u32(f"{a}.attention.head_count", N_HEAD)
    u32(f"{a}.attention.head_count_kv", 1)
    u32(f"{a}.attention.key_length", HEAD_DIM)
    u32(f"{a}.attention.value_length", HEAD_DIM)
    u32(f"{a}.rope.dimension_count", HEAD_DIM // 2)
    f32(f"{a}.rope.freq_base", 10000.0)
    f32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    u32(f"{a}.attention.q_lora_rank", Q_LORA)
    u32(f"{a}.attention.sliding_window", 128)
    u32(f"{a}.expert_count", N_EXPERT)
    u32(f"{a}.expert_used_count", N_EXPERT_USED)
    u32(f"{a}.expert_shared_count", N_EXPERT_SHARED)
    u32(f"{a}.expert_feed_forward_length", spec.expert_ff)
    f32(f"{a}.expert_weights_scale", 1.0)
    writer.add_bool(f"{a}.expert_weights_norm", True)
    u32(f"{a}.expert_gating_func", GATING_SQRT_SOFTPLUS)
    writer.add_array(f"{a}.swiglu_clamp_exp", [10.0] * N_LAYER)
    writer.add_array(f"{a}.swiglu_clamp_shexp", [10.0] * N_LAYER)
    u32(f"{a}.attention.indexer.head_count", INDEXER_HEADS)
    u32(f"{a}.attention.indexer.key_length", INDEXER_DIM)
    # As the architecture test does: a top-k above any context selects every compressed block (deterministic).
    u32(f"{a}.attention.indexer.top_k", 131072)
    u32(f"{a}.attention.output_group_count", O_GROUPS)
    u32(f"{a}.attention.output_lora_rank", O_LORA)
    writer.add_array(f"{a}.attention.compress_ratios", COMPRESS_RATIOS)
    f32(f"{a}.attention.compress_rope_freq_base", 160000.0)
    u32(f"{a}.hyper_connection.count", HC_MULT)
    u32(f"{a}.hyper_connection.sinkhorn_iterations", 2)
    f32(f"{a}.hyper_connection.epsilon", 1e-6)
    u32(f"{a}.hash_layer_count", 0)

    vocab = tok.get_vocab()
    n_vocab = len(vocab)
    tokens = [""] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    special = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    merges = json.loads(tok.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    # The trainer's pre-tokenizer is byte-level with GPT-2's split regex (tokenizers ByteLevel use_regex=True).
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([TOKEN_CONTROL if i in special else TOKEN_NORMAL for i in range(n_vocab)])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tok.token_to_id(BOS))
    writer.add_eos_token_id(tok.token_to_id(EOS))
    writer.add_pad_token_id(tok.token_to_id(EOS))
    # The template writes the BOS token itself.
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)


def files(spec: TinyGgufSpec, chat_template: str) -> dict[str, bytes]:
    """Every file of the model, as bytes, keyed by file name (part 1 first); `chat_template` is the jinja source
    (`chat_template_from`).

    Raises:
        UserError: ``parts`` is below 1 or above the tensor count.
    """
    from gguf import GGUFWriter

    tok = _train_tokenizer(spec.vocab_target)
    tensors = _tensors(spec, tok.get_vocab_size())
    if not 1 <= spec.parts <= len(tensors):
        raise UserError(f"a tiny GGUF split into {spec.parts} parts: needs 1 to {len(tensors)} parts",
                        "set the recipe's llama.cpp model parts to a value in that range")
    # Contiguous runs of tensors per part, as gguf-split --split-max-tensors cuts them.
    per = -(-len(tensors) // spec.parts)
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="ds4-gguf-") as tmp:
        for k, name in enumerate(spec.file_names()):
            path = Path(tmp) / name
            writer = GGUFWriter(path, ARCH)
            if k == 0:
                _metadata(writer, spec, tok, chat_template)
            if spec.parts > 1:
                writer.add_uint16("split.no", k)
                writer.add_uint16("split.count", spec.parts)
                writer.add_int32("split.tensors.count", len(tensors))
            for tname, arr in tensors[k * per:(k + 1) * per]:
                writer.add_tensor(tname, arr)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            out[name] = path.read_bytes()
    return out


def generate(dest: Path, spec: TinyGgufSpec, chat_template: str) -> list[str]:
    """Write the parts into `dest`, touching only files whose bytes differ (temporary name, then rename).

    Returns:
        Names of the files created or replaced.
    Raises:
        UserError: `dest` cannot be written.
    """
    contents = files(spec, chat_template)
    try:
        return write_changed(dest, contents)
    except OSError as exc:
        raise UserError(f"could not write the tiny GGUF into {dest}: {exc.strerror}",
                        "make the directory writable, or choose another model.path in the recipe") from None
