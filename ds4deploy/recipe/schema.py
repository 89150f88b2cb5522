"""Recipe schema: one YAML file per deployment, the single source of truth.

A recipe names the hardware it was proven on, the engine image, the model, how the model is split (tensor,
pipeline, nodes), how it is served, and what it is expected to measure. Everything else (compose files, env
files, engine arguments, Ansible variables, check thresholds, benchmark expectations) is derived from it by
`ds4deploy.render.compose`.

Units are in the key names: ``*_gib`` is GiB (2**30 bytes), ``*_gb`` is GB (10**9 bytes), ``*_tok_s`` is tokens per
second, ``*_s`` seconds. Unknown keys are rejected everywhere (``extra="forbid"``); `load_recipe` turns a
validation failure into a `UserError` naming the file, the key path, the bad value and what is allowed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ds4deploy.core.keys import NGINX_CONF_BUFFER
from ds4deploy.core.net import destination_problem, no_server_there
from ds4deploy.core.secret_scan import is_secret_name
from ds4deploy.recipe import paths

NAME_RE = r"^[a-z0-9][a-z0-9-]*$"
# An environment variable (POSIX: letters, digits, underscore, not starting with a digit) -> a one-line value: a
# newline would inject a second variable wherever the environment is written as KEY=value lines.
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, Field(pattern=r"^[^\n\r\x00]*$", description="one line: no newline, carriage return or NUL")]
Env = dict[EnvName, EnvValue]
# A path on the node, also used as a compose default (${VAR:-path}) and as a bind mount's source: absolute, no '$' or
# '}' (compose interpolation), no ':' (the short volume syntax `source:target:mode` splits on it: compose refuses
# "too many colons"), no white space or control character (a line break would split the env file or argv it lands
# in), and no '..' component (the path would name another place than it reads).
NODE_PATH_RE = r"^/[^$}:\s\x00-\x1f\x7f]*$"
NODE_PATH_RULE = "an absolute path without white space, control characters, ':', '$' or '}'"


def _no_dotdot(v: str) -> str:
    if ".." in v.split("/"):
        raise ValueError(f"{v!r} climbs out with '..': write the path it means without '..'")
    if "//" in v or "." in v.split("/"):
        # //etc and /usr/./bin are /etc and /usr/bin to the kernel, but not to a check comparing the text.
        raise ValueError(f"{v!r} holds '//' or a '.' folder: write the path plainly, each '/' once")
    if tree := in_system_tree(v.rstrip("/")):
        raise ValueError(f"{v!r} lies in {tree}, a system tree the deploy must not create, mount or write into: "
                         "name a folder of its own (e.g. under /var/lib/ds4deploy or /etc/ds4deploy)")
    return v


NodePath = Annotated[str, Field(pattern=NODE_PATH_RE), AfterValidator(_no_dotdot)]

# A vLLM flag as serving.extra_args names it: the spelling vLLM's --help prints, without the leading "--". vLLM's
# parser also reads '_' for '-' (FlexibleArgumentParser), so max_model_len would slip past the check of flags the
# render derives (and then override them); capitals and leading dashes are no flag at all. A JSON flag may take one
# key in dot notation (--compilation-config.mode; a list's item with a final '+':
# --compilation-config.custom_ops+, vLLM docs "CLI arguments").
VLLM_FLAG_RE = r"^[a-z0-9][a-z0-9-]*(\.[a-z0-9_]+)*\+?$"
VLLM_FLAG_RULE = ("a vLLM flag as its --help spells it, without the leading '--': lower case, '-' between words (vLLM "
                  "reads '_' as '-', so max_model_len would override a flag the render derives)")
# "<recipe>--<variant>" selects a named variant of a recipe (recipe.variants).
VARIANT_SEP = "--"
# Names of a netdev and of an RDMA device (HCA), one rule for the recipe's rails and a node's overrides
# (ds4deploy.plan.node_fabric). The kernel allows more in a netdev name (anything but '/', ':' and white space, 1-15
# bytes: IFNAMSIZ 16 with the NUL, net/core/dev.c dev_valid_name) and an RDMA name (up to 63 bytes, IB_DEVICE_NAME_MAX
# 64, include/rdma/ib_verbs.h), but both reach shell commands, Ansible and NCCL_IB_HCA (which reads ',' as a list
# separator, ':' as the port, a leading '^'/'=' as exclude/exact: NCCL user guide, Environment Variables), and no
# driver names its devices with anything but letters, digits, '_', '.' and '-' (enp1s0f1np1, enP2p1s0f1np1, bond0.100,
# mlx5_0, rocep1s0f1): anything else, a space or a shell metacharacter, is refused.
NETDEV_RE = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,14}$"
HCA_RE = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,62}$"
NETDEV_RULE = ("a network interface name: 1-15 of A-Z a-z 0-9 _ . -, not starting with . (no space, no shell "
               "metacharacter)")
HCA_RULE = "an RDMA device name: 1-63 of A-Z a-z 0-9 _ . - (no space, no shell metacharacter, no ',' ':' '^' '=')"
# Directories a key file must not sit in directly: the role makes the key's directory 0700.
SYSTEM_DIRS = frozenset({"/", "/etc", "/root", "/home", "/var", "/var/lib", "/opt", "/usr", "/tmp", "/srv"})  # noqa: S108
# Trees no deploy may mount, create, chown or write into (the Filesystem Hierarchy Standard 3.0's programs, libraries,
# boot files and the kernel's pseudo-filesystems, https://refspecs.linuxfoundation.org/FHS_3.0/fhs/index.html, sections
# 3.4, 3.5, 3.9, 3.16, 4.4, 4.6, 6.1.5-6): a model directory or a key file there would replace system files.
# (Not /run, where desktops mount removable disks (/run/media/<user>), nor /usr/share, where packaged servers keep
# models.)
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr/bin", "/usr/lib",
                "/usr/lib64", "/usr/libexec", "/usr/sbin")


def repeated(values: list) -> list:
    """The values `values` holds more than once, sorted (for "listed twice" refusals)."""
    return sorted({v for v in values if values.count(v) > 1})


def in_system_tree(path: str) -> str | None:
    """The system tree `path` (absolute, no '..') lies in or is, else None (`SYSTEM_TREES`)."""
    return next((t for t in SYSTEM_TREES if path == t or path.startswith(t + "/")), None)


class Strict(BaseModel):
    """Base for every recipe section: unknown keys are an error, values are not coerced across types."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Source(Strict):
    """Where a fact or number comes from: a section of docs/sources.md, an upstream issue, a datasheet."""

    source: str = Field(min_length=3, description="docs/sources.md#<anchor>, upstream issue or datasheet")


class CpuSpec(Strict):
    """Host CPU the recipe needs. `flags` are /proc/cpuinfo flag names that must all be present."""

    arch: Literal["x86_64", "aarch64"] = Field(description="CPU architecture every node must report (uname -m)")
    flags: list[str] = Field(
        default_factory=list,
        description="/proc/cpuinfo flags every node must have (e.g. avx2: vLLM's CPU wheels need it); checked by the "
                    "node preflight",
    )
    min_cores: int = Field(
        ge=1,
        description="logical cores per node at least; also the core budget of the thread rules (lk-threads-cores, "
                    "omp-threads-numa)",
    )


class GpuSpec(Strict):
    """GPUs per node. `arch` is the CUDA compute capability tag the engine image is built for (sm70, sm86, ...)."""

    count: int = Field(ge=0, description="GPUs per node")
    arch: Literal["none", "sm70", "sm86", "sm121"] = Field(
        default="none",
        description="CUDA compute capability tag the engine image is built for (sm70 V100, sm86 RTX 3090, sm121 "
                    "GB10); 'none' exactly when count is 0",
    )
    model: str | None = Field(
        default=None,
        description="GPU product name as nvidia-smi prints it (e.g. Tesla V100-SXM2-32GB); the host checks take the "
                    "datasheet clocks and limits for it",
    )
    memory_gib: float | None = Field(default=None, gt=0, description="usable memory per GPU, GiB")
    unified_memory: bool = Field(default=False, description="GPU shares system memory (GB10): NVML reports N/A")
    power_limit_w: int | None = Field(default=None, gt=0, description="per-GPU power limit the recipe sets, W")
    graphics_clock_lock_mhz: int | None = Field(default=None, gt=0, description="locked graphics clock, MHz")
    graphics_clock_cap_mhz: int | None = Field(default=None, gt=0, description="graphics clock cap, MHz")

    @model_validator(mode="after")
    def _arch_matches_count(self) -> GpuSpec:
        if (self.count == 0) != (self.arch == "none"):
            raise ValueError("gpus.arch must be 'none' exactly when gpus.count is 0")
        return self


class KnownBadKernel(Strict):
    """A kernel release the recipe refuses (``uname -r`` prefix match), with why and who reported it."""

    release: str = Field(description="kernel release prefix, as `uname -r` prints it (e.g. 7.0.0-1019-nvidia)")
    reason: str = Field(description="what breaks on it (shown when a node runs it)")
    source: str = Field(min_length=3, description="who reported it (an upstream issue or docs/sources.md#<anchor>)")


class Hardware(Strict):
    """What one node must have. RAM and disk in GiB."""

    nodes: int = Field(ge=1, description="machines the deployment spans; equals parallelism.nodes")
    cpu: CpuSpec = Field(description="the CPU every node must have")
    gpus: GpuSpec = Field(description="the GPUs of each node")
    min_ram_gib: float = Field(gt=0, description="installed RAM per node, GiB")
    numa_nodes: int = Field(
        default=1, ge=1,
        description="NUMA nodes per machine (numactl --hardware); the thread and instance rules plan per NUMA node",
    )
    ram_per_numa_gib: float | None = Field(default=None, gt=0, description="RAM per NUMA node, GiB")
    min_free_disk_gib: float = Field(gt=0, description="free space needed where model and images live, GiB")
    known_bad_kernels: list[KnownBadKernel] = Field(
        default_factory=list,
        description="kernel releases the recipe refuses (uname -r prefix match), each with why and who reported it "
                    "(rule kernel-known-bad)",
    )

    @model_validator(mode="after")
    def _numa_within_ram(self) -> Hardware:
        # The node preflight checks both minimums (preflight role: MemTotal >= min_ram_gib; memory_numa: each NUMA
        # node >= ram_per_numa_gib): a host with min_ram_gib split over numa_nodes must pass the second as well.
        if self.ram_per_numa_gib is not None and self.numa_nodes * self.ram_per_numa_gib > self.min_ram_gib:
            raise ValueError(
                f"numa_nodes x ram_per_numa_gib = {self.numa_nodes} x {self.ram_per_numa_gib:g} = "
                f"{self.numa_nodes * self.ram_per_numa_gib:g} GiB is more than min_ram_gib {self.min_ram_gib:g}: "
                "a host with min_ram_gib would pass the RAM check and fail the NUMA one. Fix: raise min_ram_gib to "
                "the RAM the NUMA nodes need together, or lower ram_per_numa_gib")
        return self


_ID = r"([0-9]{1,10}|[a-z_][a-z0-9_-]{0,31})"


class ImageSpec(Strict):
    """The engine container image: built from images/<arch>/Dockerfile as `repository:<derived tag>`.

    The tag and the build args that repeat the engine pin are derived (`Recipe.image_tag`,
    `Recipe.image_build_args`), never written twice: `version_arg` names the build arg that receives
    ``engine.version``, and ``TORCH_CUDA_ARCH_LIST`` comes from ``engine.torch_cuda_arch_list``. A recipe written
    before that (an explicit `tag`, the pin repeated in `build_args`) still works as it reads: its tag is used as
    is, and a repeated pin must equal the derived one.
    """

    arch: Literal["cpu", "sm70", "sm86", "sm121", "llamacpp-cpu", "llamacpp-cuda"] = Field(
        description="which images/<arch>/Dockerfile builds the engine image",
    )
    repository: str = Field(
        pattern=r"^[a-z0-9][a-z0-9._/-]*$",
        description="image repository; the tag is derived (Recipe.image_tag)",
    )
    base_image: str = Field(description="FROM image (build arg BASE_IMAGE; a local debootstrap base stands in for "
                                        "debian:bookworm-slim where no registry is reachable); under local/ it is "
                                        "owner-supplied (loaded or pulled and tagged by the owner, never pulled by a "
                                        "deploy) and `ds4deploy image lock` pins its image ID in "
                                        "recipes/<name>.lock.json")
    tag: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$",
                            description="explicit tag (recipes written before tags were derived); default: derived")
    version_arg: str | None = Field(default=None, pattern=r"^[A-Z][A-Z0-9_]*$",
                                    description="build arg that receives engine.version (git- prefix removed)")
    build_args: Env = Field(
        default_factory=dict,
        description="further Docker build args, NAME: value; the engine pin's own (version_arg, TORCH_CUDA_ARCH_LIST) "
                    "are derived and refused here when they differ",
    )
    # A uid or a user name (useradd's default NAME_REGEX, 32 characters), then optionally ':' and a gid or group.
    user: str = Field(default="0:0", pattern=rf"^{_ID}(:{_ID})?$",
                      description="uid:gid (or user[:group] names) the engine runs as inside the container (Docker "
                                  "--user)")


class CudaToolkit(Strict):
    """CUDA versions inside the image. nvcc, the runtime headers and cudart must be one toolkit
    (docs/sources.md#cuda-toolkit-match: nvcc 13.2 with 13.0 headers fails with CCCL "compiler and toolkit headers are
    incompatible")."""

    nvcc: str = Field(description="nvcc version in the image (`nvcc --version`)")
    headers: str = Field(
        description="version of the CUDA runtime headers the build compiles against (cuda_runtime_api.h "
                    "CUDART_VERSION)",
    )
    cudart: str = Field(description="version of the CUDA runtime library (libcudart) the image ships")
    source: str = Field(
        min_length=3,
        description="where the three versions were read (a lock file, a Dockerfile, a captured `nvcc --version`)",
    )


class LlamaCpp(Strict):
    """llama-server's settings for a recipe of the llama.cpp family (``engine.family: llamacpp``).

    Each field becomes one llama-server flag (named first in its description, as the pinned source's
    `common/arg.cpp` spells it); unset fields are left to llama-server's defaults. The model file, host, port,
    aliases, context (``-c``), slots (``-np``) and output cap (``-n``) come from ``model`` and ``serving``
    (`ds4deploy.engines.llamacpp`), never from here. Flags without a field go to `extra_args`, checked against the
    pinned commit's flag registry.
    """

    n_gpu_layers: int | None = Field(default=None, ge=0,
                                     description="-ngl: layers offloaded to the GPUs (999: all of them)")
    split_mode: Literal["none", "layer", "row", "tensor"] | None = Field(
        default=None, description="-sm: how the model is split across GPUs (layer: layers and KV, pipelined)")
    tensor_split: list[float] | None = Field(default=None, description="-ts: share of the model per GPU, in order")
    flash_attn: Literal["on", "off", "auto"] | None = Field(default=None, description="-fa: flash attention")
    batch_size: int | None = Field(default=None, ge=1, description="-b: logical batch, tokens")
    ubatch_size: int | None = Field(default=None, ge=1, description="-ub: physical batch, tokens")
    cache_type_k: Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] | None = Field(
        default=None, description="--cache-type-k: K cache type (common/arg.cpp kv_cache_types)")
    cache_type_v: Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] | None = Field(
        default=None, description="--cache-type-v: V cache type")
    jinja: bool = Field(default=True, description="--jinja / --no-jinja: the model's own chat template (tool calls "
                                                  "need it)")
    threads: int | None = Field(default=None, ge=1, description="-t: CPU threads for generation")
    threads_batch: int | None = Field(default=None, ge=1, description="-tb: CPU threads for prompt processing")
    numa: Literal["distribute", "isolate", "numactl"] | None = Field(
        default=None, description="--numa: NUMA placement of the CPU threads")
    override_tensor: list[Annotated[str, Field(pattern=r"^[^=,\s]+=[A-Za-z0-9_]+$")]] = Field(
        default_factory=list, description="-ot: <tensor name regex>=<buffer type> (CPU keeps matching weights, e.g. "
                                          "routed experts, in system RAM)")
    n_cpu_moe: int | None = Field(default=None, ge=0,
                                  description="--n-cpu-moe: the first N layers' MoE weights stay on the CPU")
    reasoning: Literal["on", "off", "auto"] | None = Field(default=None, description="-rea: reasoning (thinking)")
    extra_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="further flags, name with or without leading dashes -> value (true = bare "
                                          "flag); each must exist at the pinned commit")


class GgufFiles(Strict):
    """The GGUF llama-server loads: `file` is what ``-m`` names (part 1, ``<stem>-00001-of-0000N.gguf``, when the
    model is split), `parts` how many gguf-split files there are; the other names are derived from part 1's."""

    file: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.gguf$",
                      description="-m: the GGUF file in model.path llama-server loads (part 1 of a split model, "
                                  "<stem>-00001-of-0000N.gguf)")
    parts: int = Field(default=1, ge=1, le=99999,
                       description="gguf-split parts of the model (the five-digit part numbers bound it at 99,999)")


class Engine(Strict):
    """The serving engine: name and pinned version, image, entrypoint and environment.

    `family` is the serving engine the recipe runs: ``vllm`` (every flavor below but ``llamacpp``) or ``llamacpp``
    (llama-server; its settings in `llamacpp`, `ds4deploy.engines.llamacpp`). `flavor` names the build family the
    preflight rules know (stock vLLM, the CPU build, the 1Cat-vLLM fork, the Lvllmds4-x fork, the GB10 community
    build, llama.cpp); `capabilities` lists features only some builds have (e.g. ``nvfp4_ds_mla``).
    """

    # The derived tag starts with it, and a Docker tag is [A-Za-z0-9_.-], 128 characters at most (docker docs,
    # "docker image tag"): the name keeps to that alphabet and leaves room for the version and the hash.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                      description="the engine build's name, the first part of the derived image tag (e.g. vllm-cpu)")
    family: Literal["vllm", "llamacpp"] = Field(
        default="vllm", description="the serving engine: vllm, or llamacpp (llama-server; settings in llamacpp)")
    llamacpp: LlamaCpp | None = Field(
        default=None, description="llama-server's settings, set exactly when family is llamacpp")
    flavor: Literal["vllm-cpu", "vllm", "1cat-vllm", "lvllmds4-x", "gb10-community", "llamacpp"] = Field(
        default="vllm",
        description="the build family the preflight rules know: stock 'vllm', the CPU build 'vllm-cpu', the 1Cat-vLLM "
                    "fork, the Lvllmds4-x fork, the GB10 community build, 'llamacpp' (with family llamacpp)",
    )
    capabilities: list[str] = Field(
        default_factory=list,
        description="features only some builds have, named as the rules ask for them (e.g. nvfp4_ds_mla, the nvfp4 KV "
                    "cache layout; rule nvfp4-kv-engine)",
    )
    cuda: CudaToolkit | None = Field(
        default=None,
        description="the CUDA toolkit inside the image; nvcc, headers and cudart must be one version (rule "
                    "cuda-one-toolkit); unset for CPU images",
    )
    torch_cuda_arch_list: str | None = Field(
        default=None,
        description="CUDA architectures the image compiles kernels for (build arg TORCH_CUDA_ARCH_LIST, e.g. '7.0' "
                    "for V100: rule v100-arch-list)",
    )
    version: str = Field(pattern=r"^(\d+\.\d+\.\d+([.+-][A-Za-z0-9.]+)?|git-[0-9a-f]{40})$",
                         description="release version, or git-<40-hex commit> for a fork without releases")
    image: ImageSpec = Field(
        description="the engine container image: built from images/<arch>/Dockerfile, tag derived from the build "
                    "inputs",
    )
    entrypoint: list[str] = Field(
        min_length=1,
        description="the container's command before the engine arguments (e.g. [vllm, serve] or [python3, -m, "
                    "vllm.entrypoints.openai.api_server]); no credential may appear in it",
    )
    env: Env = Field(
        default_factory=dict,
        description="the engine's non-secret environment, NAME: one-line value; variables the deploy derives (fabric "
                    "interfaces, GID index, node launch facts) are refused here",
    )
    fork_only_flags: list[str] = Field(
        default_factory=list,
        description="flags this engine fork accepts that stock vLLM's parser does not",
    )

    @field_validator("env")
    @classmethod
    def _no_credential_names(cls, v: dict[str, str]) -> dict[str, str]:
        # Even empty: compose's `environment` overrides the key file's `env_file`, so VLLM_API_KEY: "" would start
        # the engine with an empty key (the secret scan passes an empty value, which holds no secret).
        named = sorted(k for k in v if is_secret_name(k))
        if named:
            raise ValueError(f"{', '.join(named)} name a credential: the API key comes from the key file "
                             "(serving.auth), a hub token from HF_TOKEN on the control host at deploy time; remove "
                             "them from engine.env")
        return v

    @model_validator(mode="after")
    def _family(self) -> Engine:
        if (self.family == "llamacpp") != (self.flavor == "llamacpp"):
            raise ValueError("engine.family llamacpp goes with engine.flavor llamacpp (and only with it)")
        if (self.family == "llamacpp") != (self.llamacpp is not None):
            raise ValueError("engine.llamacpp (llama-server's settings) is set exactly when engine.family is llamacpp")
        if self.family == "llamacpp" and not self.image.arch.startswith("llamacpp-"):
            raise ValueError(f"engine.family llamacpp needs a llama.cpp image (engine.image.arch llamacpp-cpu or "
                             f"llamacpp-cuda), not {self.image.arch}")
        return self


class GeneratorSpec(Strict):
    """Shape of the generated tiny checkpoint (see ds4deploy.model.tiny.TinyModelSpec)."""

    seed: int = Field(
        default=0,
        description="seed of the random weights, so the generated checkpoint is byte-identical on every run (its "
                    "manifest is committed)",
    )
    hidden_size: int = Field(default=256, ge=32, description="model width (Qwen3 config hidden_size)")
    intermediate_size: int = Field(default=512, ge=32, description="MLP width (Qwen3 config intermediate_size)")
    num_hidden_layers: int = Field(default=2, ge=1, description="transformer layers")
    num_attention_heads: int = Field(default=4, ge=1, description="query heads per layer")
    num_key_value_heads: int = Field(
        default=2, ge=1,
        description="key/value heads per layer (grouped-query attention); divides num_attention_heads",
    )
    head_dim: int = Field(
        default=64,
        description="dimension of one attention head; vLLM's CPU attention rejects 16, 64 works (the schema checks it "
                    "against the image arch)",
    )
    vocab_target: int = Field(
        default=1024, ge=300,
        description="size the byte-level BPE tokenizer is trained to, tokens; at least 300 (256 bytes plus special "
                    "tokens)",
    )
    max_position_embeddings: int = Field(
        default=4096, ge=256,
        description="the generated model's native context, tokens; serving.max_model_len may not exceed it",
    )


class Model(Strict):
    """The served model. `source: generated` builds the tiny checkpoint locally; `hub` fetches `repo_id@revision`;
    `local` is a checkpoint no hub serves at a pinned revision (e.g. a GGUF in parts): `ds4deploy model lock
    --from` records its manifest, and the deploy copies it from the control host (MODEL_FROM=) or finds it in
    `path` on every node, checking each node's copy against the committed manifest (`ds4deploy.model.lock`).

    `path` is the directory on each node that holds the model; it is mounted read-only into the container. `file`
    names the one file inside it the engine loads as its model (vLLM reads a local GGUF only as one ``.gguf`` file,
    a directory as a safetensors checkpoint: https://docs.vllm.ai/en/v0.9.2/features/quantization/gguf.html);
    without it the engine gets the directory.
    """

    source: Literal["generated", "hub", "local"] = Field(
        description="'generated': the tiny checkpoint built locally from model.generator; 'hub': repo_id at a pinned "
                    "revision from the Hugging Face Hub; 'local': your own files (a GGUF in parts), locked with "
                    "`ds4deploy model lock --from`",
    )
    repo_id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$",
        description="Hugging Face repository, <owner>/<name> (source: hub)",
    )
    revision: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$",
                                 description="commit, or a 7-39 hex prefix of one: `ds4deploy model lock` resolves it "
                                 "against the repository's commits and records the full commit in the manifest")
    generator: GeneratorSpec | None = Field(
        default=None,
        description="shape of the generated checkpoint (source: generated)",
    )
    gguf: GgufFiles | None = Field(default=None, description="the GGUF file(s) of a llama.cpp recipe; generated: "
                                   "the tiny deepseek4 GGUF (`ds4deploy.model.tiny_gguf`) in this layout")
    served_name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="the model name the API answers to and reports (vLLM --served-model-name, first name)",
    )
    aliases: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]] = Field(
        default_factory=list,
        description="further names the server answers to (vLLM --served-model-name takes several; the first, "
                    "served_name, is the one responses report), e.g. the model names a coding agent asks for",
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32", "half"] = Field(
        description="weight and activation dtype (vLLM --dtype); V100 has no bf16: half (rule v100-fp16)",
    )
    quantization: str | None = Field(
        default=None,
        description="quantization method the engine loads the weights with (vLLM --quantization, e.g. gguf); unset: "
                    "read from the checkpoint",
    )
    size_on_disk_gb: float = Field(gt=0, description="GB (10**9 bytes)")
    path: NodePath = Field(
        description="directory on each node that holds the model, mounted read-only into the container at /model",
    )
    file: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                             description="the one file in `path` the engine loads as the model (a .gguf); "
                                         "default: the directory")

    @field_validator("path")
    @classmethod
    def _path_stays(cls, v: str) -> str:
        """The model directory is mounted into the engine and created/filled by the deploy: a path that climbs
        with ``..`` (``/var/lib/ds4deploy/models/../../../../etc`` is /etc), is ``/`` or a system directory itself
        would hand that directory to both."""
        # '..', '.', '//' and the system trees are NodePath's (`_no_dotdot`); here the system folders themselves.
        if v.rstrip("/") in SYSTEM_DIRS | {""}:
            raise ValueError(f"model.path {v!r} is the root or a system directory; the deploy would mount and fill "
                             "that directory: name the model's own directory, e.g. /var/lib/ds4deploy/models/<name>")
        return v

    @model_validator(mode="after")
    def _names_once(self) -> Model:
        """Each name the server answers to once: vLLM's --served-model-name takes the list as given, so a name listed
        twice, or an alias equal to served_name, is a copy-paste slip (and /v1/models would list it twice)."""
        seen = {self.served_name: "model.served_name"}
        for i, alias in enumerate(self.aliases):
            if alias in seen:
                raise ValueError(f"model.aliases[{i}] {alias!r} is already {seen[alias]}: list each name once and "
                                 "not the served name again")
            seen[alias] = f"model.aliases[{i}]"
        return self

    @model_validator(mode="after")
    def _source_fields(self) -> Model:
        if self.source == "generated" and self.generator is None and self.gguf is None:
            raise ValueError("model.source 'generated' needs a model.generator section (or model.gguf for the tiny "
                             "GGUF of a llama.cpp recipe)")
        if self.source == "hub" and not (self.repo_id and self.revision):
            raise ValueError("model.source 'hub' needs model.repo_id and a pinned model.revision")
        return self


class Parallelism(Strict):
    """How the model is split: tensor x pipeline ranks over `nodes` machines, times `data` replicas.

    `multinode` says how several nodes form one server:

    - ``nnodes``: one model split across nodes (tensor/pipeline ranks on every node), vLLM's
      ``--nnodes/--node-rank/--master-addr/--master-port`` with headless workers (the GX10 system);
    - ``data_parallel``: one full replica per node behind the head's API (``--data-parallel-size`` with
      ``--data-parallel-size-local 1``, ``--data-parallel-address`` the head, headless workers with
      ``--data-parallel-start-rank``). The vLLM CPU build 0.32 runs this across nodes; its ``nnodes`` tensor
      parallel fails with "collective_rpc should not be called on follower node" (docs/multinode-cpu.md).
    """

    tensor: int = Field(ge=1, description="tensor-parallel ranks (vLLM --tensor-parallel-size), across nodes too")
    pipeline: int = Field(ge=1, description="pipeline-parallel stages (vLLM --pipeline-parallel-size)")
    nodes: int = Field(
        ge=1,
        description="machines the model is split over; equals hardware.nodes (tensor x pipeline = GPUs of all nodes: "
                    "rule parallel-shape)",
    )
    data: int = Field(default=1, ge=1, description="data-parallel replicas in total (data_parallel: one per node)")
    multinode: Literal["nnodes", "data_parallel"] = Field(
        default="nnodes",
        description="how several nodes form one server: 'nnodes' (one model split across nodes, headless workers) or "
                    "'data_parallel' (one replica per node behind the head's API)",
    )
    master_port: int | None = Field(default=None, ge=1, le=65535,
                                    description="rendezvous port without an RDMA fabric (data_parallel: RPC port)")


class Speculative(Strict):
    """Speculative decoding, passed to vLLM as --speculative-config JSON."""

    method: str = Field(description="speculative method (e.g. dspark, ngram, mtp), the JSON's method")
    num_speculative_tokens: int = Field(
        ge=1,
        description="draft tokens per step, k; Lvllmds4-x 2.3.8 caps max_num_seqs x (k+1) at 32, GB10 builds need k = "
                    "5",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="further keys of the --speculative-config JSON, as the engine names them",
    )


class Auth(Strict):
    """API key policy. `api_key`: a key is generated on first deploy into `key_file` (mode 0600, outside the repo;
    default ``/etc/ds4deploy/secrets/<recipe>.env``) and handed to the engine through the environment
    (VLLM_API_KEY), never on its command line."""

    mode: Literal["none", "api_key"] = Field(
        description="'api_key': the engine and the front door require the key generated on first deploy (VLLM_API_KEY "
                    "from serving.auth.key_file); 'none': no key, allowed only on a loopback bind_address",
    )
    key_file: str | None = Field(
        default=None, pattern=r"^/[^$}\s]+\.env$",
        description="path on each node of the key file (KEY=value, mode 0600, in a directory of its own outside the "
                    "repository); default /etc/ds4deploy/secrets/<recipe>.env",
    )

    @field_validator("key_file")
    @classmethod
    def _own_directory(cls, v: str | None) -> str | None:
        return None if v is None else key_file_place(v, "key_file")


def key_file_place(v: str, field: str) -> str:
    """`v` as a key file's path (a stack's key_file, a gateway's key files): the node-path rules (`_no_dotdot`), a
    file in a directory of its own, outside the repository. Returns `v`.

    Raises:
        ValueError: naming `field` and what to write instead.
    """
    _no_dotdot(v)  # the node-path rules: no '..', '.', '//', no system tree
    parent = str(Path(v).parent)
    if v.endswith("/") or v.rstrip("/") in SYSTEM_DIRS | {""} or parent in SYSTEM_DIRS:
        raise ValueError(f"{field} {v} is a system folder or sits directly in {parent}; put it in a directory of "
                         "its own (e.g. /etc/ds4deploy/secrets/), whose mode the deploy sets to 0700")
    if Path(v).resolve().is_relative_to(paths.REPO_ROOT):
        raise ValueError(f"{field} {v} is inside the repository; keys live outside it")
    return v


class FrontDoor(Strict):
    """The authenticating reverse proxy (nginx, docs/front-door.md) in front of the engine, a service of the same
    compose stack. It publishes ``serving.bind_address:serving.port``; the engine listens only where the proxy
    reaches it: on the compose network (bridge networking) or on ``127.0.0.1:engine_port`` (host networking).

    `allow` lists the exact paths served without the key (default: ``/health``, for load balancers and the
    compose healthcheck); every other path needs ``Authorization: Bearer <key>`` or ``x-api-key: <key>``.
    `max_body_mib` caps a request body (MiB); unset, it is derived from the context (`Recipe.max_body_mib`).
    `read_timeout_s` is how long the proxy waits between two reads from the engine: it must outlast the longest
    silent stretch of a request, a long prefill before the first token or a whole non-streamed answer.
    """

    engine_port: int | None = Field(default=None, ge=1, le=65535,
                                    description="host networking: loopback port of the engine behind the proxy")
    allow: list[Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]*$")]] = Field(
        default_factory=lambda: ["/health"],
        description="exact paths served without the key (default /health, for load balancers and the compose "
                    "healthcheck); every other path needs the key",
    )
    # Upper bound: nginx stores client_max_body_size as an off_t and refuses a value past its range ("invalid
    # value", ngx_parse_offset, https://nginx.org/en/docs/http/ngx_http_core_module.html#client_max_body_size); long
    # before that a body is no request: 16 bytes per token of the largest context (1M tokens) is 16 MiB. 1 GiB is
    # the policy bound.
    max_body_mib: int | None = Field(default=None, ge=1, le=1024, description="largest request body, MiB")
    # At most a day: nginx keeps proxy_read_timeout as milliseconds in its timer tree (ngx_msec_t,
    # https://nginx.org/en/docs/http/ngx_http_proxy_module.html#proxy_read_timeout); a silence longer than a day is a
    # dead engine, not a long prefill (the longest the recipes expect is minutes).
    read_timeout_s: int = Field(default=3600, ge=10, le=86400, description="seconds between two reads from the engine")

    @field_validator("allow")
    @classmethod
    def _allow_once_with_health(cls, v: list[str]) -> list[str]:
        """Each allowed path once (the template writes one ``location = <path>`` per entry, and nginx refuses a
        duplicate location: "duplicate location", ngx_http_core_module), and ``/health`` among them: the front
        door's own compose healthcheck probes /health without the key (ds4deploy.render.compose), so without it the
        service never turns healthy."""
        twice = repeated(v)
        if twice:
            raise ValueError(f"serving.front_door.allow lists {', '.join(twice)} more than once; nginx refuses two "
                             "'location =' blocks for one path at container start: list each path once")
        if "/health" not in v:
            raise ValueError("serving.front_door.allow must include /health: the front door's own healthcheck "
                             "probes it without the key, so the stack would never turn healthy")
        return v


class CodingAgent(Strict):
    """The recipe serves a coding agent (Claude Code, an OpenAI-API agent): what one of its requests needs.

    `output_tokens` is the agent's own max_tokens (Claude Code sends 32,000), `prompt_tokens` the prompt it sends
    before any work (system prompt and tool definitions), `thinking` whether it asks for reasoning (a ``thinking``
    block). `compact_window_tokens` is the client's auto-compact window, the setting users give their client for
    this deployment (Claude Code: ``CLAUDE_CODE_AUTO_COMPACT_WINDOW``): the agent's prompt grows turn by turn
    until it nears that window and only then is compacted, so every request up to it carries the whole output
    budget on top. Unset, the client's own default applies (`CLIENT_COMPACT_WINDOW_TOKENS`). The preflight rule
    ``coding-agent-fit`` requires a context holding the window plus the output budget, a window above the first
    prompt, and a reasoning parser when thinking is asked for.
    """

    output_tokens: int = Field(
        ge=1,
        description="the agent's own max_tokens per request, tokens (Claude Code sends 32,000)",
    )
    prompt_tokens: int = Field(
        ge=1,
        description="tokens of the prompt the agent sends before any work (system prompt and tool definitions; Claude "
                    "Code's first turn is ~40,000 characters)",
    )
    thinking: bool = Field(
        default=False,
        description="the agent asks for reasoning (a `thinking` block): the recipe then needs a reasoning parser "
                    "(rule coding-agent-fit)",
    )
    compact_window_tokens: int | None = Field(
        default=None, ge=1, description="the client's auto-compact window, tokens (Claude Code: "
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW); unset: the client's default, CLIENT_COMPACT_WINDOW_TOKENS")
    source: str = Field(
        min_length=3,
        description="where the agent's figures come from (docs/sources.md#<anchor> or an upstream page)",
    )

    @property
    def window(self) -> int:
        """The auto-compact window the agent runs with, tokens: `compact_window_tokens` or the client default."""
        return self.compact_window_tokens or CLIENT_COMPACT_WINDOW_TOKENS


# Claude Code's auto-compact window for a model it does not know, tokens: 2.1.332 (the release tests/support pins)
# says so itself ("Claude Code doesn't recognize the model ..., so it assumes a context window of 1m tokens") and
# compacts only near it, whatever the server's context; a server with a shorter context then answers 400 once the
# prompt plus max_tokens passes it (anthropics/claude-code#62070; docs/sources.md#coding-agent-compaction).
CLIENT_COMPACT_WINDOW_TOKENS = 1_000_000


class Serving(Strict):
    """How the API is exposed and what the engine schedules.

    `default_max_tokens` is the server-side output cap (vLLM's ``--override-generation-config
    '{"max_new_tokens": N}'``): what a request that sets no max_tokens generates at most (without it such a request
    runs to the end of the context; preflight rule ``output-cap``), and in vLLM 0.32 also the most any request may
    generate, whatever max_tokens it asks for (the chat and completion servers take the smaller of the two:
    vllm/entrypoints/openai/chat_completion/serving.py ``override_max_tokens``, entrypoints/serve/utils/api_utils.py
    ``get_max_tokens``), so it must hold a coding agent's own max_tokens (rule ``coding-agent-fit``).
    `front_door` puts the authenticating proxy in front of the engine (required when the clients are not on
    loopback).
    """

    bind_address: str = Field(
        description="address the API listens on (an IP): loopback keeps it on the host; any other needs auth.mode "
                    "api_key and the front door",
    )
    port: int = Field(
        ge=1, le=65535,
        description="TCP port of the API on bind_address (the front door's when there is one)",
    )
    network_mode: Literal["bridge", "host"] = Field(
        default="bridge",
        description="Docker networking of the stack: 'bridge' (the engine in its own network namespace) or 'host' (no "
                    "docker-proxy in the path; what machines with an RDMA fabric use)",
    )
    max_model_len: int = Field(ge=16, description="tokens per request (prompt + output)")
    max_num_seqs: int = Field(
        ge=1,
        description="sequences the engine schedules at once (vLLM --max-num-seqs): concurrent requests",
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1,
        description="tokens per scheduler step (vLLM --max-num-batched-tokens): larger prefill chunks cost more "
                    "memory; unset: the engine's default",
    )
    gpu_memory_utilization: float = Field(
        gt=0, le=1,
        description="fraction of each GPU's memory the engine may use, 0-1 (vLLM --gpu-memory-utilization); on the "
                    "CPU build, the share of CPU memory",
    )
    kv_cache_dtype: str | None = Field(
        default=None,
        description="KV cache layout (vLLM --kv-cache-dtype, e.g. fp8_ds_mla); unset: the engine's default",
    )
    speculative: Speculative | None = Field(
        default=None,
        description="speculative decoding (vLLM --speculative-config JSON)",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="parser of the model's tool-call format (vLLM --tool-call-parser, e.g. hermes)",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="parser that separates reasoning from the answer (vLLM --reasoning-parser); needed when a coding "
                    "agent asks for thinking",
    )
    tokenizer_mode: str | None = Field(
        default=None,
        description="tokenizer implementation (vLLM --tokenizer-mode, e.g. deepseek_v4); unset: auto",
    )
    enable_auto_tool_choice: bool = Field(
        default=False,
        description="let the model choose tools by itself (vLLM --enable-auto-tool-choice; tool_choice auto)",
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="reuse the KV cache of shared prompt prefixes (vLLM --enable-prefix-caching / "
                    "--no-enable-prefix-caching); unset: the engine's default",
    )
    auth: Auth = Field(description="the API key policy")
    default_max_tokens: int | None = Field(default=None, ge=1, description="output cap without max_tokens, tokens")
    front_door: FrontDoor | None = Field(
        default=None,
        description="the authenticating proxy in front of the engine; required (and added with its defaults) when "
                    "bind_address is not loopback",
    )
    coding_agent: CodingAgent | None = Field(
        default=None,
        description="the recipe serves a coding agent: what one of its requests needs (rule coding-agent-fit)",
    )
    progress_bound_s: int = Field(
        default=600, ge=30,
        description="seconds a busy engine (requests running or queued) may go without any progress counter moving "
                    "before the supervisor restarts it. Default 600 s: 2.7x the longest silent stretch measured on "
                    "the reference systems, a 223.6 s TTFT of four concurrent 131K-token prompts on the GX10 pair "
                    "(118.7 s for one 256K-token prompt on the V100 system; docs/sources.md#supervisor-progress). "
                    "Raise it for longer prompts on slower hardware.")
    extra_args: dict[Annotated[str, Field(pattern=VLLM_FLAG_RE)], str | int | float | bool] = Field(
        default_factory=dict,
        description="further engine flags, name as vLLM's --help spells it without the leading dashes (lower case, "
                    "'-' between words; a JSON flag's key after a '.') -> value (true = bare flag, false = "
                    "--no-<name>)",
    )

    @field_validator("bind_address")
    @classmethod
    def _ip(cls, v: str) -> str:
        ip = ipaddress.ip_address(v)
        # nginx's `listen` takes no zone index ("invalid IPv6 address"), an IPv4-mapped IPv6 address fails its bind()
        # (EINVAL), and no server listens on a multicast or broadcast address.
        if "%" in v:
            raise ValueError("a scoped IPv6 address (with %<zone>) is not one nginx listens on: use the address "
                             "without the zone, or 0.0.0.0")
        if ip.version == 6 and ip.ipv4_mapped is not None:
            raise ValueError(f"an IPv4-mapped IPv6 address: write the IPv4 address {ip.ipv4_mapped}")
        if no_server_there(ip):
            raise ValueError("a multicast or broadcast address: no server listens there")
        return v

    @model_validator(mode="before")
    @classmethod
    def _front_door_when_exposed(cls, data: Any) -> Any:
        """A recipe whose clients are not on loopback gets the front door with its defaults when it names none
        (issue of exposure, docs/front-door.md); an explicit ``front_door: null`` there is refused below."""
        if isinstance(data, dict) and "front_door" not in data:
            try:
                exposed = not ipaddress.ip_address(str(data.get("bind_address"))).is_loopback
            except ValueError:
                return data  # the field validator names the bad address
            if exposed:
                return {**data, "front_door": {}}
        return data

    @model_validator(mode="after")
    def _auth_when_exposed(self) -> Serving:
        if not ipaddress.ip_address(self.bind_address).is_loopback and self.auth.mode == "none":
            raise ValueError(
                f"serving.bind_address {self.bind_address} is not loopback, so serving.auth.mode must be "
                "'api_key' (an open port would serve anyone on the network)"
            )
        if not ipaddress.ip_address(self.bind_address).is_loopback and self.front_door is None:
            raise ValueError(
                f"serving.bind_address {self.bind_address} is not loopback, so the engine must sit behind the front "
                "door: add serving.front_door (vLLM's own key check leaves routes such as /invocations, /tokenize "
                "and /metrics open; docs/front-door.md)"
            )
        if self.front_door is not None and self.auth.mode != "api_key":
            raise ValueError("serving.front_door checks the API key: set serving.auth.mode to 'api_key'")
        if "served-model-name" in self.extra_args:
            raise ValueError("serving.extra_args sets --served-model-name, which the deploy derives from "
                             "model.served_name and model.aliases: set those instead")
        return self

def _cidr(v: str) -> str:
    ipaddress.ip_network(v, strict=True)  # ValueError names the bad network, e.g. host bits set
    return v


# An IPv4/IPv6 network in CIDR form with no host bits set, e.g. 192.168.100.0/24.
Cidr = Annotated[str, AfterValidator(_cidr)]


class NodeNetwork(Strict):
    """A user-defined Docker network the nodes of a multi-node recipe join as containers: each node's engine gets
    its DS4_HOST_IP on it. Used when the nodes are containers on one Docker host (the CI two-node stack); real
    multi-node machines use host networking and their fabric instead."""

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$", description="the Docker network's name")
    subnet: Cidr = Field(description="its IPv4 subnet in CIDR form; each node container gets its DS4_HOST_IP in it")


class Container(Strict):
    """Container runtime settings for the engine service."""

    shm_size: str = Field(
        pattern=r"^\d+[bkmg]$",
        description="size of the engine container's /dev/shm (compose shm_size, e.g. 16g); NCCL and torch "
                    "multiprocessing pass tensors through it. Ignored with ipc_host",
    )
    ipc_host: bool = Field(
        default=False,
        description="share the host's IPC namespace and its /dev/shm (compose ipc: host); shm_size is then not "
                    "written (Docker ignores it there, Podman refuses it)",
    )
    memlock_unlimited: bool = Field(
        default=False,
        description="unlimited locked memory for the engine (compose ulimits memlock -1): RDMA registers memory with "
                    "the NIC, and NCCL over RoCE/InfiniBand fails without it (rule rdma-memlock)",
    )
    stack_bytes: int | None = Field(
        default=None, ge=1,
        description="stack size limit of the engine's processes, bytes (compose ulimits stack); unset: Docker's "
                    "default",
    )
    infiniband: bool = Field(
        default=False,
        description="pass /dev/infiniband into the engine container (RDMA verbs devices for NCCL's IB/RoCE transport)",
    )
    cap_add: list[Literal["SYS_NICE", "IPC_LOCK", "SYS_PTRACE"]] = Field(
        default_factory=list, description="Linux capabilities added to the engine container"
    )
    start_period_s: int = Field(ge=10, description="healthcheck grace while the model loads")
    restart: Literal["no", "always", "on-failure", "unless-stopped"] = Field(
        default="unless-stopped",
        description="compose restart policy of a single-node, single-engine stack; ordered stacks (several nodes, "
                    "replicas sharing GPUs) are rendered with 'no' and started in order by the supervisor",
    )
    log_max_size: str = Field(
        default="50m", pattern=r"^[1-9][0-9]{0,5}[kmg]?$",
        description="size of one engine log file before rotation (json-file driver max-size: a number with an "
                    "optional unit k, m or g, e.g. 50m)",
    )
    # json-file's max-file is parsed as an int (Docker's daemon/logger/jsonfilelog); 100 files of the largest size
    # are far more evidence than one incident folder can hold.
    log_max_files: int = Field(
        default=5, ge=1, le=100,
        description="rotated log files kept per container (json-file driver max-file); the incident evidence keeps at "
                    "most log_max_size x log_max_files per container",
    )
    node_network: NodeNetwork | None = Field(
        default=None,
        description="the Docker network the node containers of a multi-node recipe share when the nodes are "
                    "containers on one Docker host (CI's two-node stack); real machines use host networking and a "
                    "fabric",
    )


class Rail(Strict):
    """One RoCE rail: the netdev, the HCA(s) whose GIDs carry its address, its subnet and MTU.

    On GB10 a rail is one PCIe half of the cabled ConnectX-7 port: one twin HCA with its own netdev (ibdev2netdev
    rocep1s0f1 <-> enp1s0f1np1, roceP2p1s0f1 <-> enP2p1s0f1np1; recipes/gx10x2-ds4-flash-fp8.yaml cites the sources).
    """

    name: str = Field(description="the rail's name in the recipe and in the inventory's ds4_rails (e.g. rail0)")
    netdev: str = Field(
        pattern=NETDEV_RE,
        description="the rail's network interface as the recipe's cabling names it (ibdev2netdev); a node may "
                    "override it in its inventory; " + NETDEV_RULE,
    )
    hcas: list[Annotated[str, Field(pattern=HCA_RE, description=HCA_RULE)]] = Field(
        min_length=1,
        description="the RDMA device(s) whose GIDs carry the rail's address (on GB10 one twin HCA per rail)",
    )
    subnet: Cidr = Field(description="the rail's IPv4 subnet in CIDR form, one per rail")
    mtu: int = Field(ge=576, le=9216, description="the rail's MTU, bytes; 9000 on RoCE rails (rule rails-mtu-recipe)")


class Fabric(Strict):
    """The inter-node network of a multi-node recipe."""

    rails: list[Rail] = Field(
        min_length=1,
        description="the RoCE rails, one per NIC port half; each on its own subnet (rule rails-distinct-subnets)",
    )
    master_port: int = Field(
        ge=1, le=65535,
        description="TCP port of the multi-node rendezvous on the head (vLLM --master-port), reached over the first "
                    "rail",
    )
    nccl_ib_hca: list[Annotated[str, Field(pattern=HCA_RE)]] = Field(min_length=1, description="HCAs NCCL_IB_HCA lists")
    min_rail_gbit_s: float = Field(gt=0, description="ib_write_bw per rail the fabric checks require, Gb/s")
    source: str = Field(min_length=3, description="where the fabric's figures come from (docs/sources.md#<anchor>)")

    @model_validator(mode="after")
    def _hcas_on_one_rail(self) -> Fabric:
        """Every NCCL_IB_HCA entry belongs to exactly one rail: the deploy resolves each HCA's RoCE v2 GID index
        against its rail's address (the module ansible/library/ds4_gid_index.py), so an HCA on no rail has no
        address to resolve and one on two rails has two (docs/sources.md#gid-resolution)."""
        rails_of: dict[str, list[str]] = {}
        for rail in self.rails:
            for hca in rail.hcas:
                rails_of.setdefault(hca, []).append(rail.name)
        unrailed = [hca for hca in self.nccl_ib_hca if hca not in rails_of]
        if unrailed:
            raise ValueError(f"fabric.nccl_ib_hca lists {', '.join(unrailed)}, which no rail names, so no rail address "
                             "tells which GID index it would use with NCCL_IB_GID_INDEX: add it to the hcas of the "
                             "rail whose netdev it carries (`ibdev2netdev`), or drop it from fabric.nccl_ib_hca")
        twice = [f"{hca} ({', '.join(names)})" for hca, names in rails_of.items() if len(names) > 1]
        if twice:
            raise ValueError(f"fabric.rails name {'; '.join(twice)} on more than one rail: an HCA carries one "
                             "netdev, so it belongs to exactly one rail (`ibdev2netdev` shows which)")
        # The inventory's ds4_rails address each rail by name, and each rail is one netdev's address and MTU.
        for what, values in (("name", [r.name for r in self.rails]), ("netdev", [r.netdev for r in self.rails])):
            dup = repeated(values)
            if dup:
                raise ValueError(f"fabric.rails use the {what} {', '.join(dup)} twice: each rail is one port, named "
                                 "once (the inventory's ds4_rails address rails by name)")
        return self


class Instances(Strict):
    """Several engine instances per node (CPU-expert recipes): one per NUMA node, pinned with numactl --membind."""

    ram_gb_each: float = Field(gt=0, description="system RAM one instance needs, GB")
    vram_gib_each: float = Field(gt=0, description="GPU memory one instance uses per GPU, GiB")
    max_count: int | None = Field(
        default=None, ge=1,
        description="upper bound on the replicas per node; unset: as many as the NUMA nodes' RAM and the GPUs' memory "
                    "allow",
    )
    source: str = Field(min_length=3, description="where the per-replica sizes come from (docs/sources.md#<anchor>)")


class MemoryBudget(Strict):
    """What must fit on each GPU: the GPU-resident weights (GB, all GPUs together) split over tensor x pipeline
    ranks, plus KV cache and runtime overhead per GPU (GiB)."""

    weights_on_gpu_gb: float = Field(
        ge=0,
        description="GPU-resident weights of all GPUs together, GB (10**9 bytes); split over tensor x pipeline ranks "
                    "(rule fit-gpu-memory)",
    )
    # Unset when the recipe fixes the KV allocation with serving.extra_args.kv-cache-memory-bytes (one source).
    kv_cache_gib_per_gpu: float | None = Field(
        default=None, ge=0,
        description="estimated KV cache per GPU, GiB; unset when serving.extra_args.kv-cache-memory-bytes fixes the "
                    "allocation (written once)",
    )
    overhead_gib_per_gpu: float = Field(ge=0, description="CUDA context, activations and graphs per GPU, GiB")
    source: str = Field(
        min_length=3,
        description="where the figures come from (docs/sources.md#<anchor>); estimates are marked as ours",
    )


class Benchmark(Strict):
    """How the bench harness must talk to this server."""

    max_tokens: int | None = Field(
        default=2048, ge=1,
        description="tokens the bench harness asks for per request; required when the server thinks by default (rule "
                    "bench-max-tokens), 2048 as in the reference systems' method",
    )
    server_default_thinking: Literal["none", "high", "max"] = Field(
        default="none",
        description="how hard the server reasons when a request says nothing (the chat template's default): 'none', "
                    "'high' or 'max'; with thinking on by default an unbounded request can run to the end of the "
                    "context",
    )
    # chat_template_kwargs names that switch thinking on/off; every name gets the profile's true/false (Qwen3
    # templates read enable_thinking, DeepSeek V3.1-style templates read thinking; vLLM drops names a template
    # does not use).
    thinking_kwargs: list[str] = Field(
        default_factory=lambda: ["enable_thinking", "thinking"],
        description="chat_template_kwargs names that switch thinking on and off; each gets the profile's true/false "
                    "(Qwen3 templates read enable_thinking, DeepSeek V3.1-style ones thinking; vLLM drops names a "
                    "template does not use)",
    )
    source: str | None = Field(
        default=None,
        description="where the benchmark method comes from (docs/sources.md#<anchor> or an upstream page)",
    )


class Range(Strict):
    """An expected measurement: low..high, with the source it comes from."""

    low: float = Field(description="lowest value still within, in the metric's unit")
    high: float = Field(description="highest value still within, in the metric's unit")
    source: str = Field(
        min_length=3,
        description="where the range comes from (a measurement with its date and machine, or docs/sources.md)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError(f"range low {self.low} is above high {self.high}")
        return self


class ExpectedCell(Strict):
    """One published measurement of the reference system: a benchmark cell and its value."""

    profile: str = Field(description="the bench profile the cell belongs to (`ds4deploy bench profiles`)")
    prompt_tokens: int = Field(ge=1, description="prompt length of the cell, tokens")
    concurrency: int = Field(default=1, ge=1, description="concurrent sessions of the cell")
    content: str | None = Field(
        default=None,
        description="prompt content type of the cell (code, json, legal, prose, chat), where the figure depends on it "
                    "(speculative decoding accepts more draft tokens on code)",
    )
    metric: Literal["decode_tok_s", "aggregate_tok_s", "per_session_tok_s", "prefill_tok_s", "ttft_s"] = Field(
        description="what the value measures: decode_tok_s / per_session_tok_s / aggregate_tok_s (tok/s), "
                    "prefill_tok_s (tok/s), ttft_s (seconds)",
    )
    value: float = Field(gt=0, description="the published figure, in the metric's unit")


class Expected(Strict):
    """Expected benchmark figures; the bench harness compares each cell against these.

    `table` holds the reference system's published cells; a measured cell within ``value x (1 +- tolerance)``
    is "within", else "above"/"below".
    """

    decode_tok_s: Range | None = Field(
        default=None,
        description="expected single-session decode rate, tok/s, low..high with its source; the harness reports each "
                    "measured cell within, above or below",
    )
    ttft_s: Range | None = Field(
        default=None,
        description="expected time to first token of a short prompt, seconds, low..high with its source",
    )
    deploy_s: Range | None = Field(
        default=None,
        description="expected time of `make deploy` to a healthy server, seconds, low..high with its source (recorded "
                    "for readers; no tool compares against it yet)",
    )
    tolerance: float = Field(
        default=0.10, gt=0, lt=1,
        description="relative band around each table cell's value that counts as within, as a fraction (0.10 = +-10 "
                    "%)",
    )
    table: list[ExpectedCell] = Field(
        default_factory=list,
        description="the reference system's published cells (profile, prompt length, concurrency, content, metric, "
                    "value) the bench harness compares against",
    )
    table_source: str | None = Field(
        default=None,
        description="where the table's figures were published (docs/sources.md#<anchor>), with how they were taken",
    )


class Recipe(Strict):
    """A whole deployment. See recipes/cpu.yaml for a commented example."""

    schema_version: Literal[1] = Field(description="version of this schema; 1")
    name: Annotated[str, Field(pattern=NAME_RE)] = Field(
        description="the recipe's name: its file name without .yaml (lower case, digits, '-')",
    )
    description: str = Field(description="one paragraph: what runs, on what, for whom")
    hardware: Hardware = Field(description="what each node must have (checked on every node before any change)")
    engine: Engine = Field(description="the serving engine: pinned version, image, entrypoint, environment")
    model: Model = Field(description="the served model and where it comes from")
    parallelism: Parallelism = Field(description="how the model is split over GPUs and nodes")
    serving: Serving = Field(description="how the API is exposed and what the engine schedules")
    container: Container = Field(description="runtime settings of the engine container")
    tuning: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="free-form notes about tuning, name -> value (not read by any tool)",
    )
    fabric: Fabric | None = Field(default=None, description="the RoCE fabric between the nodes of a multi-node recipe")
    instances: Instances | None = Field(
        default=None,
        description="several engine replicas per node, one per NUMA node (CPU-expert recipes)",
    )
    memory: MemoryBudget | None = Field(default=None, description="what must fit on each GPU (rule fit-gpu-memory)")
    benchmark: Benchmark = Field(default_factory=Benchmark, description="how the bench harness talks to this server")
    expected: Expected = Field(
        default_factory=Expected,
        description="the figures benchmarks are compared against, with their sources",
    )
    variants: dict[Annotated[str, Field(pattern=NAME_RE)], dict[str, Any]] = Field(
        default_factory=dict,
        description="named operating choices: dotted key path -> value, deployed as <recipe>--<variant>",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if (self.engine.family == "llamacpp") != (self.model.gguf is not None):
            raise ValueError("model.gguf (the GGUF file llama-server loads) is set exactly when engine.family is "
                             "llamacpp: llama.cpp serves only GGUF, vLLM recipes name their checkpoint by model.path")
        if self.engine.family == "llamacpp" and (self.engine.image.arch == "llamacpp-cuda") != (self.hardware.gpus.count
                                                                                              > 0):
            raise ValueError("a llama.cpp recipe with GPUs runs the llamacpp-cuda image, one without the llamacpp-cpu "
                             "image")
        gen = self.model.generator
        if self.model.source == "generated" and gen is not None:
            from ds4deploy.recipe.model_config import context_problem, head_dim_problem

            problem = (context_problem(self.serving.max_model_len, gen.model_dump(), "model.generator")
                       or head_dim_problem(gen.model_dump(), self.engine.image.arch, "model.generator"))
            if problem:
                raise ValueError(problem)
        if self.fabric is not None:
            derived = {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"}
            twice = sorted(derived & set(self.engine.env))
            if twice:
                raise ValueError(f"engine.env sets {', '.join(twice)}, which the deploy derives from fabric "
                                 "(nccl_ib_hca, rails[0].netdev): remove them from engine.env")
        if {"nnodes", "master-port"} & set(self.serving.extra_args) and self.fabric is not None:
            raise ValueError("serving.extra_args sets nnodes/master-port, which come from hardware.nodes and "
                             "fabric.master_port: remove them")
        given = self.engine.image.build_args
        clash = sorted(f"{k}={given[k]!r} (derived: {v!r})" for k, v in self._derived_build_args().items()
                       if k in given and given[k] != v)
        if clash:
            raise ValueError(f"engine.image.build_args sets {', '.join(clash)}, which is derived from the engine pin "
                             "(engine.version via engine.image.version_arg, engine.torch_cuda_arch_list): remove it "
                             "from build_args (it is written once, in the engine section)")
        if self.memory is not None:
            fixed = "kv-cache-memory-bytes" in self.serving.extra_args
            if fixed == (self.memory.kv_cache_gib_per_gpu is not None):
                raise ValueError("the KV cache per GPU is written exactly once: memory.kv_cache_gib_per_gpu (an "
                                 "estimate) or serving.extra_args.kv-cache-memory-bytes (a fixed allocation)")
        if self.parallelism.nodes != self.hardware.nodes:
            raise ValueError(
                f"parallelism.nodes={self.parallelism.nodes} differs from hardware.nodes={self.hardware.nodes}"
            )
        p = self.parallelism
        if p.nodes > 1:
            if (self.fabric is None) == (p.master_port is None):
                raise ValueError("a multi-node recipe needs exactly one rendezvous port: fabric.master_port (RDMA "
                                 "fabric) or parallelism.master_port (no fabric)")
            if p.multinode == "data_parallel" and p.data != p.nodes:
                raise ValueError(f"parallelism.multinode data_parallel runs one replica per node: set "
                                 f"parallelism.data to {p.nodes} (is {p.data})")
            if self.serving.network_mode == "bridge" and self.container.node_network is None:
                raise ValueError("a multi-node recipe with bridge networking needs container.node_network (the "
                                 "Docker network its node containers share); real machines use network_mode: host")
        elif p.data != 1 or p.master_port is not None or self.container.node_network is not None:
            raise ValueError("parallelism.data, parallelism.master_port and container.node_network are for "
                             "multi-node recipes (hardware.nodes > 1)")
        if self.serving.front_door is not None and (self.instances is not None or self.container.node_network):
            raise ValueError("serving.front_door fronts one engine API on its node: not yet with several engine "
                             "instances (instances) or node containers on one Docker network (container.node_network)")
        return self

    @property
    def kv_cache_gib_per_gpu(self) -> float | None:
        """KV cache per GPU in GiB: the fixed ``--kv-cache-memory-bytes`` (bytes / 2**30) when the recipe sets
        it, else ``memory.kv_cache_gib_per_gpu``; None without a memory budget."""
        fixed = whole_number(self.serving.extra_args.get("kv-cache-memory-bytes"))
        if fixed is not None:
            return fixed / 2**30
        return self.memory.kv_cache_gib_per_gpu if self.memory is not None else None

    @property
    def engine_port(self) -> int:
        """Port the engine listens on: ``front_door.engine_port`` behind the front door; unset there, ``serving.port``
        with bridge networking (the engine's own network namespace) and ``serving.port + 1`` with host networking
        (the proxy holds serving.port on the host); ``serving.port`` without a front door."""
        fd = self.serving.front_door
        if fd is None:
            return self.serving.port
        if fd.engine_port is not None:
            return fd.engine_port
        return self.serving.port + 1 if self.serving.network_mode == "host" else self.serving.port

    @property
    def max_body_mib(self) -> int:
        """Largest request body the front door accepts, MiB: ``front_door.max_body_mib``, else 16 bytes per token of
        the context (about 4 bytes of text per token, OpenAI's tokenizer guide, times 4 for JSON escaping and
        message structure), at least 1 MiB."""
        fd = self.serving.front_door
        if fd is not None and fd.max_body_mib is not None:
            return fd.max_body_mib
        return max(1, -(-self.serving.max_model_len * 16 // 2**20))

    @property
    def master_port(self) -> int | None:
        """The multi-node rendezvous port: fabric.master_port or parallelism.master_port (None on one node)."""
        return self.fabric.master_port if self.fabric is not None else self.parallelism.master_port

    _source: Path | None = PrivateAttr(default=None)

    @property
    def image_build_args(self) -> dict[str, str]:
        """Every build arg of the engine image: ``engine.image.build_args`` plus those derived from the engine pin
        (``engine.image.version_arg`` = engine.version without its ``git-`` prefix, ``TORCH_CUDA_ARCH_LIST`` =
        engine.torch_cuda_arch_list, ``CMAKE_CUDA_ARCHITECTURES`` = hardware.gpus.arch without ``sm`` for the
        llamacpp-cuda image), sorted by name."""
        args = dict(self.engine.image.build_args)
        args.update(self._derived_build_args())
        return dict(sorted(args.items()))

    def _derived_build_args(self) -> dict[str, str]:
        out = {}
        if self.engine.image.version_arg:
            out[self.engine.image.version_arg] = self.engine.version.removeprefix("git-")
        if self.engine.torch_cuda_arch_list:
            out["TORCH_CUDA_ARCH_LIST"] = self.engine.torch_cuda_arch_list
        if self.engine.image.arch == "llamacpp-cuda":
            # The one GPU arch the recipe runs (sm70 -> 70): ggml-cuda's kernels for it alone.
            out["CMAKE_CUDA_ARCHITECTURES"] = self.hardware.gpus.arch.removeprefix("sm")
        return out

    @property
    def image_tag(self) -> str:
        """``<engine.name>-<version>-<12 hex>``: the engine pin and the first 12 hex of the sha256 of everything the
        build takes from the recipe (arch, base image, `image_build_args`), so a changed pin or build arg is a new
        tag and a stale image is never reused under an old one. Docker tag grammar: [A-Za-z0-9_.-], 128 chars.
        An explicit ``engine.image.tag`` wins (recipes written before tags were derived)."""
        if self.engine.image.tag:
            return self.engine.image.tag
        body = json.dumps([self.engine.image.arch, self.engine.image.base_image, self.image_build_args])
        version = self.engine.version.removeprefix("git-")[:12].replace("+", "_")
        return f"{self.engine.name}-{version}-{hashlib.sha256(body.encode()).hexdigest()[:12]}"

    @property
    def image_ref(self) -> str:
        """``repository:tag`` of the engine image (`image_tag`)."""
        return f"{self.engine.image.repository}:{self.image_tag}"

    @property
    def base_name(self) -> str:
        """The recipe file's name: for a variant ``<base>--<variant>``, the part before ``--``."""
        return self.name.split(VARIANT_SEP, 1)[0]

    @property
    def source_path(self) -> Path:
        """The YAML file this recipe was loaded from."""
        return self._source if self._source is not None else paths.resolve_recipe_path(self.name)

    @property
    def key_file(self) -> str:
        """Where the API key lives on each node: serving.auth.key_file, or /etc/ds4deploy/secrets/<name>.env."""
        return self.serving.auth.key_file or f"/etc/ds4deploy/secrets/{self.base_name}.env"

    @property
    def metrics_key_file(self) -> str:
        """Where the metrics credential lives on the head (``DS4_METRICS_KEY=...``, mode 0600), beside the API key:
        ``<key_file without .env>.metrics.env``. It reaches /metrics through the front door and nothing else."""
        return metrics_file_of(self.key_file)

    @property
    def gateway_key_file(self) -> str:
        """Where a gateway's key lives on the head when this deployment serves behind a gateway
        (``DS4_GATEWAY_KEY=...``, mode 0600), beside the API key: ``<key_file without .env>.gateway.env``. Optional:
        when present the front door accepts that key beside the API key (docs/gateway.md, "Backends"); the engine
        keeps only its own key."""
        return self.key_file.removesuffix(".env") + ".gateway.env"


def metrics_file_of(key_file: str) -> str:
    """The metrics credential file beside an API key file, a stack's or a gateway's: ``<key_file without .env>
    .metrics.env`` (``DS4_METRICS_KEY=...``, mode 0600)."""
    return key_file.removesuffix(".env") + ".metrics.env"


def whole_number(value: Any) -> int | None:
    """An engine argument's value as the engine's argparse reads it into an int: an int, or a string of digits
    (a YAML-quoted ``"6"`` reaches the argv as the same text as ``6``); None for anything else (a bool, a float,
    ``"12GiB"``, missing)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        return int(value)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Gateway recipes (kind: gateway, under recipes/gateways/): one endpoint in front of several deployments.

MODEL_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
# A person's name in the gateway: it is written into the access log and the rendered people maps, so it is kept to
# characters that are literal in nginx map values and in JSON.
PERSON_RE = r"^[a-z0-9][a-z0-9._-]{0,63}$"
# An HTTP header name (RFC 9110 section 5.1: a token), lower case as nginx's $http_ variables want it.
HEADER_RE = r"^[a-z0-9][a-z0-9-]{0,63}$"
# Headers that carry a credential: Authorization and Proxy-Authorization (RFC 9110 sections 11.6.2, 11.7.2), Cookie
# (RFC 6265 section 5.4), x-api-key (Anthropic's API key header, docs.anthropic.com/en/api/overview). A session header
# is written into every access log line and hashed or read by the router: one of these would log each person's key.
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key")
# The gateway's fallback pairs are one nginx parameter (templates/gateway-front-door.conf.j2, `js_var $ds4_fallback
# '<JSON>'`): kept clear of nginx's buffer for one, with room for the quotes and the directive.
NGINX_PARAMETER_MAX = NGINX_CONF_BUFFER - 96
# A url backend: http://<host>:<port>, an IPv6 host in brackets (RFC 3986 section 3.2.2), no path.
BACKEND_URL_RE = re.compile(r"^http://(?P<host>\[[0-9A-Fa-f:.]+\]|[^/:\[\]@?#\s]+):(?P<port>[0-9]{1,5})$")


class GatewayBackend(Strict):
    """One deployment behind the gateway: a recipe of this repository and the inventory host it runs on, or the URL
    of a server ds4deploy did not deploy (then its model names, and its manifest's sha256 when known, are given)."""

    name: Annotated[str, Field(pattern=NAME_RE)] = Field(
        description="the backend's name in the gateway recipe (unique; what error messages call it)")
    recipe: Annotated[str, Field(pattern=NAME_RE)] | None = Field(
        default=None, description="a recipe under recipes/ (or a variant, <recipe>--<variant>) that runs on `host`: "
                                  "its served_name and aliases are the model names this backend serves, its committed "
                                  "manifest the model's identity; on another host than the gateway's it must listen "
                                  "on that host's network (serving.bind_address not loopback)")
    host: str | None = Field(
        default=None,
        description="the host (as the gateway reaches it: an RFC 1123 host name or an IP address, not 0.0.0.0) the "
                    "recipe is deployed on; the backend's URL is http://<host>:<the recipe's serving.port>")
    url: str | None = Field(
        default=None,
        description="http://<host>:<port> of a server not deployed from a recipe here (port 1-65535, an IPv6 address "
                    "in brackets, no path: the gateway adds /v1/...)")
    models: list[Annotated[str, Field(pattern=MODEL_NAME_RE)]] = Field(
        default_factory=list, description="the model names a `url` backend serves (a recipe backend: leave empty, "
                                          "they come from the recipe)")
    manifest_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="a `url` backend's model identity: what `ds4deploy gateway model-id <recipe>` prints for "
                    "the recipe whose model it serves (two backends serving one name must have the same)")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None and (why := destination_problem(v)):
            raise ValueError(f"{why}: name the host as the gateway reaches it")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = BACKEND_URL_RE.fullmatch(v)
        if not m:
            raise ValueError("not http://<host>:<port> (no path, no user, an IPv6 address in brackets)")
        host = m["host"].strip("[]")
        if m["host"].startswith("[") and ":" not in host:
            raise ValueError(f"{m['host']} in brackets is not an IPv6 address: write an IPv4 address without them")
        if why := destination_problem(host):
            raise ValueError(f"{why} (http://<host>:<port>)")
        if not 1 <= int(m["port"]) <= 65535:
            raise ValueError(f"port {int(m['port'])} is outside 1-65535")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> GatewayBackend:
        if (self.recipe is None) == (self.url is None):
            raise ValueError("a backend names either recipe (with host) or url, not both or neither")
        if self.recipe is not None and (self.host is None or self.models or self.manifest_sha256):
            raise ValueError("a recipe backend needs host, and takes its models and manifest from the recipe "
                             "(remove models/manifest_sha256)")
        if self.url is not None and (self.host is not None or not self.models):
            raise ValueError("a url backend lists the models it serves (models: [...]) and has no host")
        return self


class GatewayPerson(Strict):
    """One person with a key at the gateway's front door. The key itself is never in the recipe: it is one
    ``<person> <key>`` line of the people key file on the gateway host (`GatewayRecipe.people_key_file`)."""

    name: Annotated[str, Field(pattern=PERSON_RE)] = Field(
        description="the person's name as the access log and `ds4deploy gateway usage` show it")


def _not_a_credential(header: str) -> str:
    if header in CREDENTIAL_HEADERS or is_secret_name(header):
        raise ValueError(f"{header} carries a credential: the session header is written into every access log line "
                         "and read by the router; name the header that names a session (Claude Code: "
                         "x-claude-code-session-id)")
    return header


class GatewayRouting(Strict):
    """How the gateway picks a backend for a request whose model several backends serve."""

    router: Literal["smg", "nginx"] = Field(
        default="smg",
        description="smg: SMG (Shepherd Model Gateway, PyPI smg, pinned in images/gateway/requirements.txt) routes "
                    "by model name, reads each backend's load, and keeps a session on its backend. nginx: the "
                    "fallback without a router process: the front door itself sends each session to one backend "
                    "by consistent hashing of session_header and tries another before any byte was sent; it cannot "
                    "read the model name from the body, so it serves one model name (docs/gateway.md)")
    policy: Literal["least_load", "power_of_two"] = Field(
        default="least_load",
        description="SMG --policy for a session's first request: a load-aware one. Not cache_aware (SMG's "
                    "default), which sent every session that shares a long system prompt to one backend "
                    "(docs/sources.md#gateway-smg)")
    session_header: Annotated[str, Field(pattern=HEADER_RE), AfterValidator(_not_a_credential)] = Field(
        default="x-claude-code-session-id",
        description="the request header that names a session (Claude Code sends x-claude-code-session-id): every "
                    "request with the same value goes to the same backend while it lives (SMG --sticky-sessions "
                    "--routing-key-headers); never a header that carries a credential (authorization, x-api-key, "
                    "cookie: the access log records this header)")
    sticky_idle_s: int = Field(
        default=14400, ge=60, le=604800,
        description="seconds a session's backend stays pinned without a request (SMG --sticky-key-idle-secs; "
                    "SMG's default 14400)")

    @model_validator(mode="after")
    def _router_settings(self) -> GatewayRouting:
        smg_only = sorted({"policy", "sticky_idle_s"} & self.model_fields_set)
        if self.router == "nginx" and smg_only:
            raise ValueError(f"{' and '.join(smg_only)} set SMG's routing; router nginx hashes session_header "
                             "instead (a session keeps its backend while it lives): remove them")
        return self


class GatewayRecipe(Strict):
    """A gateway recipe: one URL and one key per person in front of several deployments (docs/gateway.md)."""

    kind: Literal["gateway"] = Field(description="gateway: this file is a gateway, not a serving stack")
    name: Annotated[str, Field(pattern=NAME_RE)] = Field(description="the gateway's name; its file name too")
    description: str = Field(description="one paragraph: which office, which deployments")
    bind_address: str = Field(
        default="127.0.0.1", description="IPv4 address the gateway's front door listens on (an office LAN address "
                                         "to serve the office; 127.0.0.1 for loopback only)")
    port: int = Field(ge=1, le=65535, description="the front door's port: the one URL every client uses")
    router_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="SMG's own port, on 127.0.0.1 only (host networking): only the front door reaches it (router "
                    "smg; router nginx has none)")
    router_metrics_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="SMG's Prometheus port (--prometheus-port), on 127.0.0.1 only (router smg; router nginx has "
                    "none)")
    models: list[Annotated[str, Field(pattern=MODEL_NAME_RE)]] = Field(
        min_length=1, description="the model names the gateway serves; each must be served by at least one backend")
    fallback: dict[Annotated[str, Field(pattern=MODEL_NAME_RE)], Annotated[str, Field(pattern=MODEL_NAME_RE)]] = Field(
        default_factory=dict,
        description="model name -> the model name a request for it is resent under when the router cannot answer "
                    "it (no backend of the first serves or answers; both in models; one hop: the fallback has none "
                    "of its own). The gateway's front door resends (docs/gateway.md, \"Fallback model\")")
    backends: list[GatewayBackend] = Field(min_length=1, description="the deployments behind the gateway")
    people: list[GatewayPerson] = Field(min_length=1, description="everyone who gets a key")
    people_key_file: NodePath = Field(
        description="the people key file on the gateway host (mode 0600, one `<person> <key>` line per person, "
                    "keys of 32 to 1,024 characters of A-Z a-z 0-9 _ -); never in the repository or the render")
    key_file: NodePath = Field(
        description="the gateway's own key file on the gateway host (mode 0600): VLLM_API_KEY=<key> (the stacks' key "
                    "file format), the one key the router presents to every backend (each backend's front door must "
                    "accept it)")
    routing: GatewayRouting = Field(default_factory=GatewayRouting, description="how a backend is picked")
    _source: Path | None = PrivateAttr(default=None)

    @property
    def base_name(self) -> str:
        """The gateway's name (a gateway has no variants), so that code handling stack and gateway recipes alike
        (ds4deploy.operate.service) can ask either for its base name."""
        return self.name

    @field_validator("bind_address")
    @classmethod
    def _ipv4(cls, v: str) -> str:
        # nginx's `listen <address>:<port>` in the front door config: an IPv6 address would need brackets there.
        ip = ipaddress.IPv4Address(v)
        if no_server_there(ip):
            raise ValueError("a multicast or broadcast address: no server listens there")
        return v

    @field_validator("key_file", "people_key_file")
    @classmethod
    def _key_places(cls, v: str, info: ValidationInfo) -> str:
        return key_file_place(v, info.field_name or "key file")

    @model_validator(mode="after")
    def _consistent(self) -> GatewayRecipe:
        def twice(names: list[str], what: str) -> None:
            dup = repeated(names)
            if dup:
                raise ValueError(f"{what} {', '.join(dup)} listed twice: list each once")
        twice([b.name for b in self.backends], "backend")
        twice([p.name for p in self.people], "person")
        twice(list(self.models), "model")
        router_ports = [self.router_port, self.router_metrics_port]
        if self.routing.router == "smg" and None in router_ports:
            raise ValueError("router smg needs router_port and router_metrics_port (two free ports of the gateway "
                             "host, on 127.0.0.1)")
        if self.routing.router == "nginx" and router_ports != [None, None]:
            raise ValueError("router nginx has no router process: remove router_port and router_metrics_port")
        ports = [p for p in (self.port, *router_ports) if p is not None]
        if len(set(ports)) != len(ports):
            raise ValueError(f"port, router_port and router_metrics_port must differ (got {ports})")
        for src, dst in self.fallback.items():
            if src not in self.models or dst not in self.models or src == dst:
                raise ValueError(f"fallback {src} -> {dst}: both must be other names listed in models")
            if dst in self.fallback:
                # The front door resends once (templates/gateway-front-door.conf.j2): a second hop would not run.
                raise ValueError(f"fallback {src} -> {dst} -> {self.fallback[dst]}: one hop only; name the last "
                                 f"model for {src} directly, or drop {dst}'s fallback")
        fallback_json = json.dumps(self.fallback, separators=(",", ":"))
        if len(fallback_json) > NGINX_PARAMETER_MAX:
            raise ValueError(f"the fallback pairs take {len(fallback_json)} characters in the front door's config, "
                             f"more than the {NGINX_PARAMETER_MAX} nginx reads in one parameter: use shorter model "
                             "names or fewer pairs")
        files = {"key_file": self.key_file, "people_key_file": self.people_key_file,
                 "the metrics key file (key_file without .env, then .metrics.env)": self.metrics_key_file,
                 "the people maps folder (people_key_file.d)": f"{self.people_key_file}.d"}
        if len(set(files.values())) != len(files):
            same = [k for k, v in files.items() if list(files.values()).count(v) > 1]
            raise ValueError(f"{' and '.join(same)} are one path ({files[same[0]]}): each must be a file of its own; "
                             "give key_file and people_key_file names of their own (e.g. gateway-<name>.env and "
                             "gateway-<name>.people)")
        return self

    @property
    def metrics_key_file(self) -> str:
        """The front door's metrics key file on the gateway host: ``<key_file without .env>.metrics.env``
        (``DS4_METRICS_KEY=``; the gateway deploy generates it on first deploy, as a stack's deploy does)."""
        return metrics_file_of(self.key_file)
