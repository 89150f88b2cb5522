"""The llama.cpp family's rules: the GGUF the recipe names, the flags the pinned llama-server knows, and the Volta
limits the V100 owner found (docs/sources.md#v100x8-llamacpp).

`gguf_parts_problem` checks the GGUF parts in a directory as the loader will read them: every part present,
numbered 1..N of N, each a GGUF file whose ``split.no`` is its position; only its tests call it today. The deploy
checks the parts by name and digest instead: the manifest and a MODEL_FROM directory hold every part the recipe
names (`ds4deploy.model.staging.check_source`, on the control host), the committed manifest's split parts are
complete (`ds4deploy.model.manifest.split_gguf_problems`), and each node's copy matches the manifest's sha256
(ansible/roles/model/tasks/verify.yml), before any node is changed.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.engines.llamacpp import flags_source, gguf_parts, server_args
from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe

GGUF_MAGIC = b"GGUF"


def _llamacpp(r: Recipe) -> bool:
    return r.engine.family == "llamacpp"


@rule("llamacpp-gguf", "a llama.cpp recipe names a GGUF model, part 1 of its gguf-split parts",
      "llama-server loads GGUF only and opens a split model's other parts by the names derived from part 1 "
      "(docs/sources.md#llamacpp-source; llama.cpp src/llama-model-loader.cpp llama_get_list_splits)",
      _llamacpp)
def _gguf(r: Recipe, hosts):
    g = r.model.gguf
    try:
        names = gguf_parts(g.file, g.parts)
    except UserError as exc:
        return "fail", f"model.gguf.file {g.file}, parts {g.parts}", f"{exc.cause}; {exc.fix}"
    return "pass", f"{len(names)} part(s): {names[0]}" + (f" .. {names[-1]}" if len(names) > 1 else ""), ""


@rule("llamacpp-flags", "every llama-server flag the recipe renders exists at the pinned llama.cpp commit",
      "the pinned source's own option table, common/arg.cpp (ds4deploy/engines/llamacpp_flags.json, "
      "docs/sources.md#llamacpp-source)", _llamacpp)
def _flags(r: Recipe, hosts):
    try:
        args = server_args(r)
    except UserError as exc:
        return "fail", exc.cause, exc.fix
    return "pass", f"{sum(a.startswith('-') for a in args)} flags known to {flags_source()}", ""


@rule("llamacpp-volta-k-cache", "deepseek4 on Volta keeps the K cache in f16",
      "a quantized K cache on DeepSeek V4 gives garbage on sm_70 with a green /health (ggml-org/llama.cpp#26423; "
      "docs/sources.md#v100x8-llamacpp)",
      lambda r: _llamacpp(r) and r.hardware.gpus.arch == "sm70")
def _volta_k(r: Recipe, hosts):
    k = r.engine.llamacpp.cache_type_k
    nums = f"engine.llamacpp.cache_type_k {k or 'unset (llama-server default f16)'}; gpus sm70"
    if k not in (None, "f16", "f32"):
        return "fail", nums, ("set engine.llamacpp.cache_type_k: f16 (the V100 owner's setting; the f16 K cache is "
                              "small for this model)")
    return "pass", nums, ""


@rule("llamacpp-volta-split", "on Volta the model is split by layer, not by tensor or row",
      "tensor split with a long prefill wedged the Volta driver; the owner runs -sm layer only "
      "(docs/sources.md#v100x8-llamacpp)",
      lambda r: _llamacpp(r) and r.hardware.gpus.arch == "sm70" and r.hardware.gpus.count > 1)
def _volta_split(r: Recipe, hosts):
    lc = r.engine.llamacpp
    nums = f"engine.llamacpp.split_mode {lc.split_mode or 'unset (llama-server default layer)'}; " \
           f"{r.hardware.gpus.count} x sm70"
    if lc.split_mode in ("tensor", "row") or lc.tensor_split:
        return "fail", nums + (f"; tensor_split {lc.tensor_split}" if lc.tensor_split else ""), (
            "set engine.llamacpp.split_mode: layer and remove tensor_split")
    return "pass", nums, ""


def _split_no(path: Path) -> int | None:
    """``split.no`` of a GGUF file (u16), or None when the file has none; reads the header only."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("split.no")
    return None if field is None else int(field.parts[field.data[0]][0])


def gguf_parts_problem(recipe: Recipe, model_dir: Path) -> str | None:
    """Why `model_dir` does not hold the recipe's GGUF as llama-server would load it, or None.

    Checks: every part present; each starts with the GGUF magic; a split model's part k has ``split.no`` k-1 (the
    loader refuses a part out of order with "invalid split file idx").
    """
    g = recipe.model.gguf
    names = gguf_parts(g.file, g.parts)
    missing = [n for n in names if not (model_dir / n).is_file()]
    if missing:
        return f"{model_dir} lacks GGUF part(s) {', '.join(missing)} of {len(names)}"
    for k, name in enumerate(names):
        path = model_dir / name
        with path.open("rb") as fh:
            head = fh.read(8)
        if head[:4] != GGUF_MAGIC or struct.unpack("<I", head[4:8])[0] < 2:
            return f"{path} is not a GGUF file (v2+ header)"
        if g.parts > 1 and _split_no(path) != k:
            return f"{path} is part {k + 1} by name but its split.no is {_split_no(path)} (parts out of order)"
    return None
