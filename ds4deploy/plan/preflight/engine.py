"""Rule family: what the pinned engine registers (its registry file, ds4deploy/engines/registry/<pin>.yaml).

Engine-specific names in a recipe are facts of the pinned engine, not claims of the recipe: a tool-call or reasoning
parser, a tokenizer mode, a speculative method, a KV cache dtype, an attention or MoE backend, a variable in the
engine's own namespace, a capability (``nvfp4_ds_mla``), and the CUDA version and GPU architecture the engine is
built for. Each rule here compares the recipe with the engine's registry (`ds4deploy.engines.engine_registry`) and
refuses, in one message naming the engine pin and what it registers, before any node is changed or any model
staged (the deploy runs the rule book in `ds4deploy vars`, before Ansible). A recipe whose engine has no registry
file gets ``unknown`` (the fact is missing, and the message says where to add it), never a silent pass.
"""

from __future__ import annotations

import difflib
import re

from ds4deploy.engines.engine_registry import EngineRegistry, engine_pin, load_registry, registry_path
from ds4deploy.engines.vllm import engine_env
from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe

SOURCE = ("the pinned engine's registry, ds4deploy/engines/registry/<engine.name>-<engine.version>.yaml, read from "
          "the engine's source at the pin (each file lists the repository, commit and paths)")


def _no_registry(r: Recipe) -> tuple[str, str, str]:
    return ("unknown", f"engine pin {engine_pin(r)} has no registry file ({registry_path(r).name})",
            f"record what the engine registers in ds4deploy/engines/registry/{engine_pin(r)}.yaml (read from its "
            "source at the pin; ds4deploy/engines/engine_registry.py describes the fields)")


def _listing(names: frozenset[str], wanted: str) -> str:
    """All registered names, the closest ones to `wanted` first."""
    close = difflib.get_close_matches(wanted, sorted(names), n=3, cutoff=0.6)
    if not close:
        return f"all {len(names)}: {', '.join(sorted(names))}"
    rest = sorted(names - set(close))
    return f"closest: {', '.join(close)}; the other {len(rest)}: {', '.join(rest)}"


# (registry field, what it is, how the recipe names it)
NAMED = (
    ("tool_call_parsers", "tool-call parser", "serving.tool_call_parser"),
    ("reasoning_parsers", "reasoning parser", "serving.reasoning_parser"),
    ("tokenizer_modes", "tokenizer mode", "serving.tokenizer_mode"),
    ("speculative_methods", "speculative method", "serving.speculative.method"),
    ("kv_cache_dtypes", "KV cache dtype", "serving.kv_cache_dtype"),
    ("attention_backends", "attention backend", "serving.extra_args.attention-backend"),
    ("moe_backends", "MoE backend", "serving.extra_args.moe-backend"),
)


def named_values(r: Recipe) -> list[tuple[str, str, str, str]]:
    """Every engine-specific name the recipe sets: ``(registry field, what, recipe field, value)``; the draft's own
    attention backend (``serving.speculative.extra.attention_backend``) counts as an attention backend."""
    s = r.serving
    values = {
        "serving.tool_call_parser": s.tool_call_parser,
        "serving.reasoning_parser": s.reasoning_parser,
        "serving.tokenizer_mode": s.tokenizer_mode,
        "serving.speculative.method": s.speculative.method if s.speculative else None,
        "serving.kv_cache_dtype": s.kv_cache_dtype,
        "serving.extra_args.attention-backend": s.extra_args.get("attention-backend"),
        "serving.extra_args.moe-backend": s.extra_args.get("moe-backend"),
    }
    out = [(field, what, where, str(values[where])) for field, what, where in NAMED if values[where] is not None]
    draft_attn = (s.speculative.extra.get("attention_backend") if s.speculative else None)
    if draft_attn is not None:
        out.append(("attention_backends", "attention backend", "serving.speculative.extra.attention_backend",
                    str(draft_attn)))
    return out


@rule("engine-names", "every parser, tokenizer mode, speculative method, KV cache dtype and backend the recipe names "
      "is registered by its pinned engine", SOURCE, lambda r: True)
def _names(r: Recipe, hosts):
    reg = load_registry(r)
    if reg is None:
        return _no_registry(r)
    named = named_values(r)
    bad, seen = [], []
    for field, what, where, value in named:
        names = reg.names(field)
        if names is None:
            bad.append(f"{where} {value!r}: the registry does not record the engine's {what}s, so it cannot be "
                       "checked")
        elif value not in names:
            bad.append(f"{where} {value!r} is not a {what} it registers ({_listing(names, value)})")
        else:
            seen.append(f"{what} {value}")
    pin = f"engine pin {reg.pin} ({reg.relpath()})"
    if not bad:
        return "pass", f"{pin} registers {', '.join(seen) or 'nothing the recipe names (none named)'}", ""
    return "fail", f"{pin}: " + "; ".join(bad), (
        "use a name the pinned engine registers (a typo or a name from another engine stops the engine only after "
        "the model is staged), or pin an engine that registers it and record its registry")


def _owned(reg: EngineRegistry, name: str) -> bool:
    return any(name.startswith(p) for p in reg.env_prefixes)


@rule("engine-env", "every variable in the engine's own namespace that the recipe sets is registered by the engine",
      SOURCE + "; vLLM warns 'Unknown vLLM environment variable detected' and ignores an unregistered VLLM_* name",
      lambda r: True)
def _env(r: Recipe, hosts):
    reg = load_registry(r)
    if reg is None:
        return _no_registry(r)
    owned = sorted(k for k in engine_env(r) if _owned(reg, k))
    pin = f"engine pin {reg.pin} ({reg.relpath()})"
    registered = reg.names("env_vars")
    if registered is None:
        if not owned:
            return "pass", f"{pin}: the recipe sets no {'/'.join(reg.env_prefixes)}* variable", ""
        return "fail", f"{pin} does not record its registered variables; the recipe sets {', '.join(owned)}", (
            "record the engine's variable registry (env_vars) or remove the variables")
    unknown = [k for k in owned if k not in registered]
    if not unknown:
        return "pass", (f"{pin}: {len(owned)} {'/'.join(reg.env_prefixes)}* variable(s) set, all among the "
                        f"{len(registered)} it registers"), ""
    detail = "; ".join(f"{k} ({_listing(registered, k)})" for k in unknown)
    return "fail", (f"{pin} registers {len(registered)} variables with prefix {'/'.join(reg.env_prefixes)}; not "
                    f"these: {detail}"), (
        f"remove {', '.join(unknown)} from engine.env (the engine ignores them: they belong to another build), or "
        "use the name the pinned engine registers")


@rule("engine-capabilities", "the capabilities the recipe relies on are the pinned engine's",
      SOURCE + "; stock vLLM lists nvfp4_ds_mla among its KV dtypes but refuses nvfp4 KV with MLA models "
      "(https://github.com/eugr/spark-vllm-docker/blob/00afef20fb36094c37297f1118f83dd0802d144c/recipes/"
      "deepseek-v4-flash-0731-1m.yaml)", lambda r: True)
def _caps(r: Recipe, hosts):
    reg = load_registry(r)
    if reg is None:
        return _no_registry(r)
    need = set(r.engine.capabilities)
    if r.serving.kv_cache_dtype == "nvfp4_ds_mla":
        need.add("nvfp4_ds_mla")
    if r.serving.speculative and r.serving.speculative.method == "dspark":
        need.add("dspark")
    missing = sorted(need - reg.capabilities)
    pin = f"engine pin {reg.pin} ({reg.relpath()})"
    nums = f"{pin} has {', '.join(sorted(reg.capabilities)) or 'no listed capability'}"
    if not missing:
        return "pass", nums + f"; the recipe needs {', '.join(sorted(need)) or 'none'}", ""
    return "fail", nums + f"; the recipe needs {', '.join(missing)} too", (
        "drop the capability from engine.capabilities and what needs it (nvfp4_ds_mla KV: use fp8_ds_mla), or pin "
        "an engine build that has it")


_CUDA_BASE = re.compile(r"(?:^|/)cuda:(\d+)\.(\d+)")


def recipe_cuda_versions(r: Recipe) -> list[tuple[str, str]]:
    """The CUDA versions the recipe builds its engine with, ``(where, "major.minor")``: engine.cuda.nvcc, the build
    arg CUDA_VERSION and an ``nvidia/cuda:X.Y...`` base image."""
    out = []
    if r.engine.cuda is not None:
        out.append(("engine.cuda.nvcc", r.engine.cuda.nvcc))
    if r.engine.image.build_args.get("CUDA_VERSION"):
        out.append(("build arg CUDA_VERSION", r.engine.image.build_args["CUDA_VERSION"]))
    m = _CUDA_BASE.search(r.engine.image.base_image or "")
    if m:
        out.append(("engine.image.base_image", f"{m.group(1)}.{m.group(2)}"))
    return [(where, ".".join(v.split(".")[:2])) for where, v in out]


@rule("engine-cuda", "the engine's CUDA build runs on the recipe's GPU architecture, and the recipe builds it on "
      "that CUDA", SOURCE + "; CUDA 13 dropped sm_70, GB10 (sm_121) needs CUDA 13 (docs/sources.md#sm70-cuda, "
      "https://developer.nvidia.com/cuda/gpus)", lambda r: True)
def _cuda(r: Recipe, hosts):
    reg = load_registry(r)
    if reg is None:
        return _no_registry(r)
    cuda = reg.cuda
    versions, archs = list(cuda.get("versions") or []), list(cuda.get("archs") or [])
    arch = r.hardware.gpus.arch
    pin = f"engine pin {reg.pin} ({reg.relpath()})"
    nums = f"{pin} is built for CUDA {', '.join(versions) or 'none'} on {', '.join(archs) or 'no GPU'}"
    bad = []
    if archs and arch not in archs:
        bad.append(f"the recipe's GPUs are {arch}")
    used = recipe_cuda_versions(r)
    bad += [f"{where} is CUDA {v}" for where, v in used if v not in versions]
    nums += "; the recipe: " + (", ".join(f"{w} {v}" for w, v in used) or "no CUDA") + f" on {arch}"
    if not bad:
        return "pass", nums, ""
    return "fail", nums + " (" + "; ".join(bad) + ")", (
        f"build on the engine's own CUDA ({', '.join(versions) or 'none'}) for {', '.join(archs)}, or pin an engine "
        "built for this GPU")


def model_mount_paths(r: Recipe) -> list[tuple[str, str]]:
    """Every path inside the model mount the engine is given, ``(where, path relative to the mount)``: the model
    file (``model.file``), ``serving.extra_args`` values and ``engine.env`` values under ``/model/``."""
    from ds4deploy.engines.common import CONTAINER_MODEL_DIR

    prefix = CONTAINER_MODEL_DIR + "/"
    out = [("model.file", r.model.file)] if r.model.file else []
    out += [(f"serving.extra_args.{k}", str(v)[len(prefix):]) for k, v in r.serving.extra_args.items()
            if isinstance(v, str) and v.startswith(prefix)]
    out += [(f"engine.env.{k}", v[len(prefix):]) for k, v in r.engine.env.items() if v.startswith(prefix)]
    return [(where, rel.rstrip("/")) for where, rel in out]


@rule("engine-model-paths", "every path inside the model the engine is given is in the model's manifest",
      "the engine opens these paths at start, after the model is copied to the nodes: a file the copy lacks stops it "
      "only then (the manifest, recipes/<name>.manifest.json, lists every file of the copy)",
      lambda r: bool(model_mount_paths(r)))
def _model_paths(r: Recipe, hosts):
    from ds4deploy.core.errors import UserError
    from ds4deploy.model.manifest import load_manifest, manifest_path

    paths = model_mount_paths(r)
    nums = ", ".join(f"{where} /model/{rel}" for where, rel in paths)
    try:
        files = set(load_manifest(r)["files"])
    except UserError as exc:
        return "unknown", f"{nums}; {exc.cause}", exc.fix
    missing = [f"{where} /model/{rel}" for where, rel in paths
               if rel not in files and not any(f.startswith(rel + "/") for f in files)]
    if not missing:
        return "pass", f"{nums}: all in {manifest_path(r).name}", ""
    return "fail", f"{manifest_path(r).name} has no {', '.join(missing)}", (
        "add the files to the model copy and lock it again (`ds4deploy model lock <recipe> --from <dir>`), or point "
        "the recipe at the names the copy has")
