"""The preflight rule book: every known way a recipe fails on real hardware, checked before any host is touched.

Each rule has an id, a title, the source of the fact behind it (docs/sources.md or a public page), a predicate saying
when it applies, and a check returning a `Verdict`: ``pass``, ``fail`` (with a remediation), ``unknown`` (a fact
is missing: the message says which and where to add it; never a silent pass) or ``skip`` (does not apply).

Host facts come from an Ansible inventory (``--inventory``), per host::

    ds4_kernel: 6.17.0-1032-nvidia          # uname -r
    ds4_rails:                              # per rail of the recipe's fabric
      rail0: {address: 192.168.100.1, mtu: 9000}

Units: GB = 10**9 bytes, GiB = 2**30 bytes; every memory number is printed in both where both appear.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

from ds4deploy.checks.inputs import rail_problems
from ds4deploy.errors import UserError
from ds4deploy.instances import GIB_PER_GB, instance_count
from ds4deploy.recipe import Recipe


@dataclass(frozen=True)
class Verdict:
    """The outcome of one rule: status, the numbers behind it, what to do, and where the rule comes from."""

    rule: str
    status: str  # pass | fail | unknown | skip
    numbers: str
    remediation: str
    source: str


@dataclass(frozen=True)
class Rule:
    """A preflight rule. `check(recipe, hosts)` returns (status, numbers, remediation)."""

    id: str
    title: str
    source: str
    applies: Callable[[Recipe], bool]
    check: Callable[[Recipe, dict[str, dict]], tuple[str, str, str]]


RULES: list[Rule] = []


def rule(id_: str, title: str, source: str, applies: Callable[[Recipe], bool]):
    """Register a rule (decorator)."""

    def wrap(fn):
        RULES.append(Rule(id_, title, source, applies, fn))
        return fn

    return wrap


def _spec_k(r: Recipe) -> int:
    return r.serving.speculative.num_speculative_tokens if r.serving.speculative else 0


def _gib(gb: float) -> float:
    return gb * GIB_PER_GB


# --- memory and shape ------------------------------------------------------------------------------------------


@rule("fit-gpu-memory", "weights + KV + overhead fit on each GPU within gpu_memory_utilization",
      "docs/sources.md#v100x8, #gx10-pair, #rtx3090-xeon memory figures; vLLM sizes its budget as "
      "gpu_memory_utilization x GPU memory",
      lambda r: r.memory is not None and r.hardware.gpus.count > 0)
def _fit(r: Recipe, hosts):
    m, g = r.memory, r.hardware.gpus
    if g.memory_gib is None:
        return "unknown", "hardware.gpus.memory_gib is not set", "add the usable GiB per GPU to the recipe"
    # tensor x pipeline is the whole world size, across nodes too (--nnodes): each rank holds 1/ranks of the weights.
    ranks = r.parallelism.tensor * r.parallelism.pipeline
    weights_gb = m.weights_on_gpu_gb / ranks
    kv = r.kv_cache_gib_per_gpu
    need = _gib(weights_gb) + kv + m.overhead_gib_per_gpu
    budget = g.memory_gib * r.serving.gpu_memory_utilization
    nums = (f"per GPU: weights {weights_gb:.2f} GB ({_gib(weights_gb):.2f} GiB) + KV {kv:g} GiB + "
            f"overhead {m.overhead_gib_per_gpu} GiB = {need:.2f} GiB; budget {r.serving.gpu_memory_utilization} x "
            f"{g.memory_gib} GiB = {budget:.2f} GiB")
    if need <= budget:
        return "pass", nums, ""
    return "fail", nums, ("use more GPUs (tensor/pipeline), a smaller quant, a shorter max_model_len, or a higher "
                          "gpu_memory_utilization if the platform allows it")


@rule("parallel-shape", "tensor x pipeline x nodes equals the GPUs the recipe has",
      "vLLM: world size = tensor_parallel_size x pipeline_parallel_size over all nodes",
      lambda r: r.hardware.gpus.count > 0)
def _shape(r: Recipe, hosts):
    p, g = r.parallelism, r.hardware.gpus
    ranks = p.tensor * p.pipeline
    gpus = g.count * (r.hardware.nodes if r.instances is None else 1)
    if r.instances is None:
        nums = (f"tensor {p.tensor} x pipeline {p.pipeline} = {ranks} ranks; {g.count} GPUs x {r.hardware.nodes} "
                f"nodes = {gpus}")
    else:
        nums = f"per instance: tensor {p.tensor} x pipeline {p.pipeline} = {ranks} ranks; {g.count} GPUs per node"
    if ranks == gpus:
        return "pass", nums, ""
    return "fail", nums, "set parallelism.tensor x parallelism.pipeline to the GPU count (per node x nodes)"


# --- speculative decoding and CUDA graphs -----------------------------------------------------------------------


@rule("dspark-seqs-32", "Lvllmds4-x 2.3.8: max_num_seqs x (k+1) <= 32",
      "docs/sources.md#dspark-batch-cap: guqiong96/Lvllmds4-x routed_experts.py caps the batch at 32 (not in 2.3.9)",
      lambda r: r.engine.flavor == "lvllmds4-x" and r.engine.version.startswith("2.3.8") and _spec_k(r) > 0)
def _dspark32(r: Recipe, hosts):
    k, n = _spec_k(r), r.serving.max_num_seqs
    nums = f"max_num_seqs {n} x (k {k} + 1) = {n * (k + 1)}; limit 32"
    if n * (k + 1) <= 32:
        return "pass", nums, ""
    return "fail", nums, (f"lower max_num_seqs to {32 // (k + 1)} or k; warm-up otherwise dies on a tensor size "
                          "mismatch (seqs=4, k=5 was fastest)")


@rule("gb10-dspark-k5", "GB10 community builds: DSpark k must be 5 (or a multiple of 5)",
      "docs/sources.md#dspark-k5: on these builds k must be 5",
      lambda r: r.engine.flavor == "gb10-community" and _spec_k(r) > 0)
def _k5(r: Recipe, hosts):
    k = _spec_k(r)
    if k % 5 == 0:
        return "pass", f"k = {k}", ""
    return "fail", f"k = {k}", "set serving.speculative.num_speculative_tokens to 5"


@rule("cudagraph-capture-size", "max-cudagraph-capture-size equals max_num_seqs x (k+1)",
      "docs/sources.md#sm121-serve-flags (--max-cudagraph-capture-size <seqs*(k+1)>)",
      lambda r: "max-cudagraph-capture-size" in r.serving.extra_args
      or (r.engine.flavor == "gb10-community" and _spec_k(r) > 0))
def _capture(r: Recipe, hosts):
    k, n = _spec_k(r), r.serving.max_num_seqs
    got = r.serving.extra_args.get("max-cudagraph-capture-size")
    if got is None:
        return "fail", "max-cudagraph-capture-size unset", (
            f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)} (GB10 builds with DSpark need it)")
    nums = f"capture size {got}; max_num_seqs {n} x (k {k} + 1) = {n * (k + 1)}"
    if got == n * (k + 1):
        return "pass", nums, ""
    return "fail", nums, f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)}"


# --- architecture-specific --------------------------------------------------------------------------------------


@rule("v100-fp16", "V100: fp16 only (no bf16 on sm70)", "docs/sources.md#sm70-fp16: V100 has no bf16: --dtype half",
      lambda r: r.hardware.gpus.arch == "sm70")
def _fp16(r: Recipe, hosts):
    if r.model.dtype in ("float16", "half"):
        return "pass", f"dtype {r.model.dtype}", ""
    return "fail", f"dtype {r.model.dtype}", "set model.dtype: float16"


@rule("v100-arch-list", "V100: TORCH_CUDA_ARCH_LIST is 7.0 only",
      "docs/sources.md#sm70-arch-list: a mixed-arch list silently drops the sm_70 Marlin kernels",
      lambda r: r.hardware.gpus.arch == "sm70")
def _archlist(r: Recipe, hosts):
    # The build arg is derived from engine.torch_cuda_arch_list (Recipe.image_build_args): one value to check.
    arch_list = r.image_build_args.get("TORCH_CUDA_ARCH_LIST")
    nums = f"engine.torch_cuda_arch_list {r.engine.torch_cuda_arch_list!r} (build arg TORCH_CUDA_ARCH_LIST)"
    if arch_list == "7.0":
        return "pass", nums, ""
    return "fail", nums, "set engine.torch_cuda_arch_list to \"7.0\" exactly"


@rule("v100-cuda12", "V100: CUDA 12.x (CUDA 13 dropped sm_70)",
      "docs/sources.md#sm70-cuda: CUDA 13 dropped sm_70; torch 2.10.0+cu128 is the last flavour with sm_70",
      lambda r: r.hardware.gpus.arch == "sm70")
def _cuda12(r: Recipe, hosts):
    if r.engine.cuda is None:
        return "unknown", "engine.cuda is not set", "add engine.cuda (nvcc, headers, cudart versions)"
    major = r.engine.cuda.nvcc.split(".")[0]
    if major == "12":
        return "pass", f"nvcc {r.engine.cuda.nvcc}", ""
    return "fail", f"nvcc {r.engine.cuda.nvcc}", "build on CUDA 12.8 (nvidia/cuda:12.8.x base)"


@rule("nvfp4-kv-engine", "nvfp4_ds_mla KV cache only with an engine that has it",
      "docs/sources.md#nvfp4-kv-cache: nvfp4_ds_mla exists only in community builds; stock vLLM rejects nvfp4 with MLA",
      lambda r: r.serving.kv_cache_dtype == "nvfp4_ds_mla")
def _nvfp4(r: Recipe, hosts):
    caps = r.engine.capabilities
    if "nvfp4_ds_mla" in caps:
        return "pass", f"engine {r.engine.name} capabilities {caps}", ""
    return "fail", f"engine {r.engine.name} capabilities {caps}", (
        "use kv_cache_dtype fp8_ds_mla, or an engine build with nvfp4_ds_mla (the GB10 community image)")


@rule("gb10-mem-util", "GB10: gpu_memory_utilization <= 0.78",
      "docs/sources.md#gpu-memory-utilization-078: 0.80 boots then dies on first traffic; a 256K cold prefill at "
      "0.80 hard-resets the node",
      lambda r: r.hardware.gpus.arch == "sm121")
def _gb10util(r: Recipe, hosts):
    u = r.serving.gpu_memory_utilization
    if u <= 0.78:
        return "pass", f"gpu_memory_utilization {u}", ""
    return "fail", f"gpu_memory_utilization {u}", "set serving.gpu_memory_utilization to 0.78"


@rule("cuda-one-toolkit", "nvcc, CUDA headers and cudart come from one toolkit version",
      "docs/sources.md#cuda-toolkit-match: nvcc 13.2 vs headers 13.0 -> CCCL 'compiler and toolkit headers are "
      "incompatible'",
      lambda r: r.engine.cuda is not None)
def _onecuda(r: Recipe, hosts):
    c = r.engine.cuda
    nums = f"nvcc {c.nvcc}, headers {c.headers}, cudart {c.cudart}"
    # major.minor, as images/sm86/check_cuda_toolkit.py compares at build time (component patch levels differ
    # inside one toolkit: nvcc 13.0.88 ships with cudart 13.0.96).
    if len({".".join(v.split(".")[:2]) for v in (c.nvcc, c.headers, c.cudart)}) == 1:
        return "pass", nums, ""
    return "fail", nums, "pin the pip CUDA runtime and NVRTC packages to the nvcc version"


# Above this many tokens per request a GB10 recipe fixes its KV allocation (--kv-cache-memory-bytes): the smallest
# window vLLM's own auto-fit found in a utilization-sized pool over six boots of the same 2x GB10 DeepSeek-V4-Flash-0731
# setup (995,328 down to 833,792 tokens): eugr/spark-vllm-docker at 00afef20fb36094c37297f1118f83dd0802d144c,
# recipes/deepseek-v4-flash-0731-1m.yaml.
GB10_FIXED_KV_ABOVE_TOKENS = 833_792


def _is_on(value) -> bool:
    return value is True or str(value).lower() in ("1", "true")


@rule("v100-dspark-sync", "1Cat-vLLM DeepSeek-V4.1 with DSpark and pipeline parallel runs with async scheduling off",
      "https://github.com/Mermiges/1Cat-vLLM/blob/91d0047a4e9642621ec7a8757ec95cdc54a147e5/tests/models/deepseek_v41/"
      "test_core_async_pp.py (require_async_pp refuses async scheduling with PP > 1 and with a speculative method); "
      "vLLM turns async scheduling on by itself for DSpark with the mp executor (https://github.com/eugr/"
      "spark-vllm-docker/blob/00afef20fb36094c37297f1118f83dd0802d144c/recipes/deepseek-v4-flash-0731-1m.yaml)",
      lambda r: r.engine.flavor == "1cat-vllm" and _spec_k(r) > 0 and r.parallelism.pipeline > 1)
def _v100_sync(r: Recipe, hosts):
    value = r.serving.extra_args.get("async-scheduling")
    nums = (f"speculative {r.serving.speculative.method}, pipeline {r.parallelism.pipeline}, "
            f"async-scheduling {'unset (engine default: on)' if value is None else value}")
    if value is not None and not _is_on(value):
        return "pass", nums, ""
    return "fail", nums, ("set serving.extra_args.async-scheduling: false (renders --no-async-scheduling); the fork's "
                          "DeepSeek-V4.1 core raises NotImplementedError at start otherwise")


@rule("gb10-fixed-kv", f"GB10 above {GB10_FIXED_KV_ABOVE_TOKENS:,} tokens fixes the KV allocation per rank",
      "eugr/spark-vllm-docker recipes/deepseek-v4-flash-0731-1m.yaml (utilization-sized pools varied from boot to boot "
      "and fell 4-6 % short of one 1,048,576-token request); the two-Spark setup renders --kv-cache-memory-bytes "
      "12884901888 per rank (https://github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/commit/"
      "03b859d5489dca31b5cd624202afb6f60cbb37a1)",
      lambda r: r.hardware.gpus.arch == "sm121" and r.serving.max_model_len > GB10_FIXED_KV_ABOVE_TOKENS)
def _gb10_fixed_kv(r: Recipe, hosts):
    fixed = r.serving.extra_args.get("kv-cache-memory-bytes")
    nums = (f"max_model_len {r.serving.max_model_len:,} > {GB10_FIXED_KV_ABOVE_TOKENS:,}; "
            f"kv-cache-memory-bytes {fixed if fixed is not None else 'unset (sized from gpu_memory_utilization)'}")
    if fixed is not None and int(fixed) > 0:
        return "pass", nums, ""
    return "fail", nums, ("set serving.extra_args.kv-cache-memory-bytes (12884901888 = 12 GiB per rank in the "
                          "reference) and drop memory.kv_cache_gib_per_gpu, or lower serving.max_model_len")


# The engine variables the GB10 community image 0.1.1 does not register (vLLM warns "Unknown vLLM environment
# variable" and ignores them), although the image's own compose or its Stage-C lane set them: MiaAI-Lab/
# DeepSeek-v4-Flash-DSpark-2x-DGX-Spark docs/ENVS.md at 489af9589684127ece879dd9e53395c5ff9157c8 (sections B and C,
# audited by listing vllm.envs.environment_variables inside the image).
GB10_011_UNREGISTERED_ENV = (
    "VLLM_TRITON_MLA_SPARSE", "VLLM_SKIP_INIT_MEMORY_CHECK", "VLLM_USE_B12X_WO_PROJECTION",
    "VLLM_DSPARK_CONFIDENCE_THRESHOLD", "VLLM_DSPARK_CONFIDENCE_SCHEDULER", "VLLM_DSPARK_LOCAL_ARGMAX",
    "VLLM_DSPARK_REPLICATE_MARKOV_W1", "VLLM_DSPARK_FUSED_MARKOV_ARGMAX", "VLLM_DSPARK_GPU_REJECTED_CONTEXT_MASK",
    "VLLM_DSPARK_REFERENCE_KV_QUANT_DEQUANT", "VLLM_DSPARK_HARDWARE_SCHEDULER_EARLY_STOP",
    "VLLM_DSV4_B12X_COMPRESSED_MLA", "VLLM_DSV4_DSPARK_DEFER_TARGET_CAPTURE",
    "VLLM_DSV4_DSPARK_DEFER_TARGET_CAPTURE_EXACT",
)
_ENVS_DOC = ("https://github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/blob/"
             "489af9589684127ece879dd9e53395c5ff9157c8/docs/ENVS.md")


def _gb10_011(r: Recipe) -> bool:
    return r.engine.flavor == "gb10-community" and "dspark-vllm-gx10:0.1.1" in (r.engine.image.base_image or "")


@rule("gb10-unregistered-env", "no engine variable the GB10 0.1.1 image ignores",
      f"{_ENVS_DOC} (variables not in the 0.1.1 image's registry are warned about and ignored)", _gb10_011)
def _gb10_env(r: Recipe, hosts):
    ignored = sorted(set(r.engine.env) & set(GB10_011_UNREGISTERED_ENV))
    if not ignored:
        return "pass", f"{len(r.engine.env)} variables, none unknown to the image", ""
    return "fail", f"ignored by the engine: {', '.join(ignored)}", (
        "remove them from engine.env: setting them changes nothing on this image (they belong to other builds)")


@rule("gb10-regular-graphs", "GB10 0.1.1 with DeepSeek V4 opts out of breakable CUDA graphs",
      "https://github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/blob/489af9589684127ece879dd9e53395c5ff9157c8"
      "/docs/DEEPSEEK_V4_FLASH_0731.md (the image turns breakable graphs on when VLLM_USE_BREAKABLE_CUDAGRAPH is "
      "absent; regular graphs: 74.55 -> 95.9 tok/s single-stream decode)", _gb10_011)
def _gb10_graphs(r: Recipe, hosts):
    value = r.engine.env.get("VLLM_USE_BREAKABLE_CUDAGRAPH")
    nums = f"VLLM_USE_BREAKABLE_CUDAGRAPH={value if value is not None else '(unset: the image turns it on)'}"
    if value == "0":
        return "pass", nums, ""
    return "fail", nums, "set engine.env VLLM_USE_BREAKABLE_CUDAGRAPH: \"0\" (regular CUDA graphs decode ~29 % faster)"


@rule("lk-moe-numactl", "lk_moe recipes run one engine per box, not one numactl-pinned engine per NUMA node",
      "lk_moe 2.3.1 (the cp312 wheel on PyPI) places each GPU process on NUMA nodes chosen from the GPU's PCI NUMA "
      "node and binds its threads (sched_setaffinity) and memory (set_mempolicy, numa_alloc_onnode) itself, which "
      "overrides numactl; docs/recipes/rtx3090x2-xeon-ds4-flash.md",
      lambda r: "lk_moe_cpu_experts" in r.engine.capabilities)
def _lk_numactl(r: Recipe, hosts):
    if r.instances is None:
        return "pass", "one engine instance", ""
    count, why = instance_count(r)
    return "fail", f"{count} numactl-pinned instance(s): {why}", (
        "remove instances: (one engine; lk_moe spreads its experts over the NUMA nodes itself)")


def _env_int(r: Recipe, key: str) -> int | None:
    value = r.engine.env.get(key)
    return int(value) if value is not None and str(value).isdigit() else None


@rule("lk-threads-cores", "lk_moe threads x GPU processes x instances fit the physical cores",
      "https://github.com/guqiong96/Lvllm/blob/30b0f47031fb7885676f1da132a001a16cfb73fb/README.md (LK_THREADS = "
      "physical cores / GPUs; more threads than physical cores costs performance); lk_moe 2.3.1 warns 'Total required "
      "threads exceeds available CPUs'",
      lambda r: "lk_moe_cpu_experts" in r.engine.capabilities)
def _lk_threads(r: Recipe, hosts):
    lk = _env_int(r, "LK_THREADS")
    if lk is None:
        return "unknown", "engine.env has no numeric LK_THREADS", "set LK_THREADS to physical cores / GPUs"
    procs = r.parallelism.tensor * r.parallelism.pipeline
    count = instance_count(r)[0]
    total = lk * procs * count
    nums = f"LK_THREADS {lk} x {procs} GPU processes x {count} instance(s) = {total}; {r.hardware.cpu.min_cores} cores"
    if total <= r.hardware.cpu.min_cores:
        return "pass", nums, ""
    return "fail", nums, f"set LK_THREADS to {r.hardware.cpu.min_cores // (procs * count)} (cores / GPU processes)"


@rule("omp-threads-numa", "OpenMP threads x engine processes on one NUMA node fit its cores",
      "OMP_NUM_THREADS is the thread count of every process's parallel regions, one per CPU when unset "
      "(https://gcc.gnu.org/onlinedocs/gcc-12.1.0/libgomp/OMP_005fNUM_005fTHREADS.html); more runnable threads than "
      "a node's cores time-share them with the pinned expert threads",
      lambda r: "OMP_NUM_THREADS" in r.engine.env and r.hardware.numa_nodes >= 1)
def _omp(r: Recipe, hosts):
    omp = _env_int(r, "OMP_NUM_THREADS")
    if omp is None:
        return "unknown", f"OMP_NUM_THREADS={r.engine.env['OMP_NUM_THREADS']!r} is not a number", "set a number"
    nodes = r.hardware.numa_nodes
    cores = r.hardware.cpu.min_cores // nodes
    ranks = r.parallelism.tensor * r.parallelism.pipeline
    # numactl-pinned instances put all their ranks on one node; otherwise the ranks spread over the nodes.
    per_node = ranks if r.instances is not None else -(-ranks // nodes)
    nums = (f"OMP_NUM_THREADS {omp} x {per_node} process(es) per NUMA node = {omp * per_node}; "
            f"{r.hardware.cpu.min_cores} cores / {nodes} nodes = {cores} per node")
    if omp * per_node <= cores:
        return "pass", nums, ""
    return "fail", nums, f"set OMP_NUM_THREADS to at most {max(cores // per_node, 1)} (1 when lk_moe runs the experts)"


# --- fabric -------------------------------------------------------------------------------------------------------


@rule("rails-distinct-subnets", "each RoCE rail on its own subnet",
      "docs/sources.md#gx10-roce-checklist: rails on one subnet pin routing to one rail (~110 Gb/s instead of 196)",
      lambda r: r.fabric is not None)
def _subnets(r: Recipe, hosts):
    nets = [ipaddress.ip_network(x.subnet) for x in r.fabric.rails]
    nums = ", ".join(f"{x.name} {x.subnet}" for x in r.fabric.rails)
    for i, a in enumerate(nets):
        for b in nets[i + 1:]:
            if a.overlaps(b):
                return "fail", nums, "give every rail its own /24 (e.g. 192.168.100.0/24 and 192.168.101.0/24)"
    return "pass", nums, ""


@rule("rails-mtu-recipe", "rails use MTU 9000", "docs/sources.md#rail-netplan: mtu 9000",
      lambda r: r.fabric is not None)
def _mtu_recipe(r: Recipe, hosts):
    nums = ", ".join(f"{x.name} {x.mtu}" for x in r.fabric.rails)
    if all(x.mtu == 9000 for x in r.fabric.rails):
        return "pass", nums, ""
    return "fail", nums, "set fabric.rails[].mtu to 9000"


def _rail_facts(r: Recipe, hosts: dict[str, dict], key: str):
    """(host, rail, value of ds4_rails.<rail>.<key>) for every host and rail of the recipe, and the 'unknown'
    verdict to return instead when there are no host facts or any host lacks the value (else None)."""
    facts = [(h, rail.name, (hf.get("ds4_rails") or {}).get(rail.name, {}).get(key))
             for h, hf in hosts.items() for rail in r.fabric.rails]
    if not hosts:
        fix = f"pass --inventory with ds4_rails: {{<rail>: {{{key}: ...}}}} per host"
        return facts, ("unknown", "no host facts", fix)
    missing = [f"{h}/{rail}" for h, rail, value in facts if value is None]
    if missing:
        return facts, ("unknown", f"no ds4_rails.<rail>.{key} for {', '.join(missing)}", "add it to the inventory")
    return facts, None


@rule("rails-mtu-hosts", "MTU 9000 on both ends of every rail",
      "docs/sources.md#jumbo-frames: verify jumbo frames end to end (don't-fragment ping of MTU-28 bytes)",
      lambda r: r.fabric is not None)
def _mtu_hosts(r: Recipe, hosts):
    facts, unknown = _rail_facts(r, hosts, "mtu")
    if unknown:
        return unknown
    want = {x.name: x.mtu for x in r.fabric.rails}
    nums = ", ".join(f"{h}/{rail} {mtu}" for h, rail, mtu in facts)
    bad = [f"{h}/{rail}" for h, rail, mtu in facts if mtu != want[rail]]
    if bad:
        return "fail", nums, f"set MTU {r.fabric.rails[0].mtu} on {', '.join(bad)} (netplan mtu: 9000)"
    return "pass", nums, ""


@rule("rails-addresses", "every node has an IPv4 inside each rail's subnet, no address twice",
      "docs/sources.md#gx10-roce-checklist: both ports need an IP (the GID is derived from it)",
      lambda r: r.fabric is not None)
def _rail_addrs(r: Recipe, hosts):
    if not hosts:
        return "unknown", "no host facts", "pass --inventory with ds4_rails: {<rail>: {address: ...}} per host"
    problems = rail_problems(r, hosts)
    if problems:
        return "fail", "; ".join(problems), ("give every host an address per rail in the rail's subnet (ds4_rails: "
                                              "{<rail>: {address: a.b.c.d}}), each address once")
    return "pass", ", ".join(f"{h} {(hf.get('ds4_rails') or {})[x.name]['address']}"
                             for h, hf in hosts.items() for x in r.fabric.rails), ""


@rule("nccl-ib-hca-twins", "NCCL_IB_HCA names the HCA of every rail (on GB10: both twin HCAs of the cabled port)",
      "docs/sources.md#sm121-nccl-env: NCCL_IB_HCA lists both twin HCAs of the port; one HCA = half the bandwidth",
      lambda r: r.fabric is not None)
def _twins(r: Recipe, hosts):
    from ds4deploy.engine_args import engine_env

    env = [x for x in engine_env(r).get("NCCL_IB_HCA", "").split(",") if x]
    need = [h for rail in r.fabric.rails for h in rail.hcas]
    missing = [h for h in need if h not in env]
    nums = f"NCCL_IB_HCA={','.join(env) or '(unset)'}; rails need {need}"
    if not missing:
        return "pass", nums, ""
    return "fail", nums, f"add {', '.join(missing)} to fabric.nccl_ib_hca"


@rule("kernel-known-bad", "no node runs a kernel release the recipe knows to be broken",
      "the recipe's hardware.known_bad_kernels (each entry cites its report)",
      lambda r: bool(r.hardware.known_bad_kernels))
def _kernel(r: Recipe, hosts):
    if not hosts:
        return "unknown", "no host facts", "pass --inventory with ds4_kernel (uname -r) per host"
    out = []
    for h, facts in hosts.items():
        k = facts.get("ds4_kernel")
        if k is None:
            return "unknown", f"{h} has no ds4_kernel", "add ds4_kernel (uname -r) to the inventory"
        for bad in r.hardware.known_bad_kernels:
            if str(k).startswith(bad.release):
                return "fail", f"{h} runs {k}", f"boot another kernel: {bad.reason} ({bad.source})"
        out.append(f"{h} {k}")
    return "pass", ", ".join(out), ""


# --- instances, model, benchmark ---------------------------------------------------------------------------------


@rule("instances-fit", "at least one engine instance fits a NUMA node's RAM and the GPUs' memory",
      "docs/sources.md#rtx3090-xeon: ~170 GB system RAM per instance pinned to one NUMA node; 6.6 GB VRAM per card",
      lambda r: r.instances is not None)
def _instances(r: Recipe, hosts):
    if r.hardware.ram_per_numa_gib is None:
        return "unknown", "hardware.ram_per_numa_gib is not set", "add RAM per NUMA node (GiB) to the recipe"
    count, why = instance_count(r)
    per_instance_gib = r.serving.gpu_memory_utilization * (r.hardware.gpus.memory_gib or 0)
    nums = f"{count} instance(s): {why}; each may use {per_instance_gib:.1f} GiB per GPU"
    if count < 1:
        return "fail", nums, "add RAM per NUMA node or use a smaller model"
    if per_instance_gib < r.instances.vram_gib_each:
        return "fail", nums, "raise serving.gpu_memory_utilization to cover instances.vram_gib_each"
    if count * r.serving.gpu_memory_utilization > 1:
        return "fail", nums, "lower the instance count (instances.max_count) or gpu_memory_utilization"
    return "pass", nums, ""


@rule("model-pin", "the model is pinned to one full 40-hex commit, and the committed manifest records that commit",
      "docs/sources.md#gx10-pair: revision 9e165c30 verified file by file; only a full commit names exactly one tree",
      lambda r: r.model.source == "hub")
def _pin(r: Recipe, hosts):
    """A full commit passes (with no manifest the deploy locks one on its first fetch). A 7-39 hex prefix passes
    only when the committed manifest records the full commit it resolved to (`ds4deploy model lock`); this rule
    reads no network, so a prefix without one fails with that command as the fix."""
    from ds4deploy.manifest import load_manifest, manifest_path

    rev = r.model.revision or ""
    path = manifest_path(r)
    lock = (f"run `ds4deploy model lock {r.base_name}` (resolves the pin against the hub's commits and writes "
            f"{path.name}) ")
    if not path.is_file():
        if len(rev) == 40:
            return "pass", f"{r.model.repo_id}@{rev}; no {path.name} yet: the first fetch writes it", ""
        return "fail", (f"{r.model.repo_id}@{rev} is a prefix of {len(rev)} hex digits and no {path.name} records "
                        "its commit"), lock + "and commit it, or pin the full 40-hex commit in model.revision"
    try:
        recorded = str(load_manifest(r).get("revision") or "")
    except UserError as exc:
        return "fail", exc.cause, exc.fix
    if len(recorded) != 40 or not recorded.startswith(rev):
        return "fail", f"model.revision {rev}, but {path.name} records commit {recorded or '(none)'}", (
            f"delete {path.name} and " + lock + "again, or restore the recipe's model.revision")
    return "pass", f"{r.model.repo_id}@{recorded} (recorded in {path.name})", ""


def _downloads(r: Recipe) -> bool:
    from ds4deploy.artifacts import image_artifacts

    return bool(image_artifacts(r))


@rule("image-pins", "every downloaded artifact of the image build is locked by sha256 (recipes/<name>.lock.json)",
      "reproducible builds: images pinned by commit, version or digest, with sha256 for downloaded wheels",
      _downloads)
def _pins(r: Recipe, hosts):
    """Reads the lock only (no download, no hashing): builds verify each artifact's bytes against it."""
    from ds4deploy.artifacts import locked_build_args

    try:
        pins = locked_build_args(r)
    except UserError as exc:
        return "fail", exc.cause, exc.fix
    return "pass", ", ".join(f"{k}={v[:12]}..." for k, v in pins.items()), ""


@rule("bench-max-tokens", "benchmarks set max_tokens when the server's default thinking is unbounded",
      "docs/sources.md#gx10-benchmark-method: DEFAULT_THINKING=max made one request generate for 2 h 45 min "
      "without max_tokens",
      lambda r: r.benchmark.server_default_thinking != "none")
def _maxtok(r: Recipe, hosts):
    if r.benchmark.max_tokens:
        return "pass", f"max_tokens {r.benchmark.max_tokens}", ""
    return "fail", "max_tokens unset", "set benchmark.max_tokens (2048 in the reference method)"


# --- field reports: engine build, fabric limits, socket interfaces ---------------------------------------------

# vLLM issue #47174 (DeepSeek-V4 on SM120, vLLM 0.24): without --kv-cache-dtype the engine dies at model construction
# with "AssertionError: DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got auto"; the SM12x sparse-MLA
# path has no unquantized KV layout (PR #54233). fp8 is the alias vLLM upgrades to fp8_ds_mla; nvfp4_ds_mla is the
# GB10 community builds' own layout (rule nvfp4-kv-engine checks the engine has it).
SRC_DSV4_SM12X_KV = "https://github.com/vllm-project/vllm/issues/47174 (fix: https://github.com/vllm-project/vllm/pull/54233)"
MLA_KV_DTYPES = ("fp8", "fp8_ds_mla", "nvfp4_ds_mla")


def _is_deepseek_v4(r: Recipe) -> bool:
    """The recipe serves a DeepSeek V4 checkpoint (repo id, served name or directory says so)."""
    names = (r.model.repo_id or "", r.model.served_name, r.model.path)
    return any("deepseek-v4" in n.lower() for n in names)


@rule("dsv4-sm12x-kv-layout", "DeepSeek V4 on sm12x sets an MLA KV cache layout (serving.kv_cache_dtype)",
      SRC_DSV4_SM12X_KV,
      lambda r: r.hardware.gpus.arch.startswith("sm12") and _is_deepseek_v4(r))
def _dsv4_kv(r: Recipe, hosts):
    kv = r.serving.kv_cache_dtype
    nums = f"kv_cache_dtype {kv or '(unset: the engine default, auto)'} on {r.hardware.gpus.arch}"
    if kv in MLA_KV_DTYPES:
        return "pass", nums, ""
    return "fail", nums, (
        "set serving.kv_cache_dtype to fp8_ds_mla (or nvfp4_ds_mla on an engine with that capability): with the "
        "default the engine dies at model construction with \"DeepseekV4 fp8_ds_mla layout only supports fp8 "
        f"kv-cache, got auto\" ({SRC_DSV4_SM12X_KV.split()[0]})")


# GB10 (compute capability 12.1) is supported from CUDA 13 only (NVIDIA's CUDA GPU table; conda-forge
# pytorch-cpu-feedstock #486); a cu12x torch has no sm_121 kernels: "no kernel image is available", and torch 2.9
# warns "Minimum and Maximum cuda capability supported by this version of PyTorch is (8.0) - (12.0)" (pytorch #172629).
SRC_SM121_CUDA13 = ("https://developer.nvidia.com/cuda/gpus; https://github.com/conda-forge/pytorch-cpu-feedstock/"
                    "issues/486; https://github.com/pytorch/pytorch/issues/172629")


def torch_local_cuda(version: str) -> str | None:
    """The CUDA flavour of a torch version's local part: ``"2.11.0+cu130"`` -> ``"cu130"``; None without one
    (a PyPI torch, whose CUDA the version does not say) or for a non-CUDA build (``+cpu``)."""
    local = version.partition("+")[2]
    return local if local.startswith("cu") else None


@rule("sm121-cuda13", "sm121 (GB10): CUDA 13 toolkit and a cu13x torch",
      SRC_SM121_CUDA13, lambda r: r.hardware.gpus.arch == "sm121")
def _sm121_cuda13(r: Recipe, hosts):
    args = r.engine.image.build_args
    torch, cuda_arg = args.get("TORCH_VERSION"), args.get("CUDA_VERSION")
    nvcc = r.engine.cuda.nvcc if r.engine.cuda else None
    nums = f"engine.cuda.nvcc {nvcc}, build args CUDA_VERSION {cuda_arg}, TORCH_VERSION {torch}"
    if torch is None or (nvcc is None and cuda_arg is None):
        return "unknown", nums, ("set engine.image.build_args.TORCH_VERSION with its local suffix (e.g. "
                                 "2.11.0+cu130) and engine.cuda or build arg CUDA_VERSION")
    old = [f"{name} {v}" for name, v in (("nvcc", nvcc), ("CUDA_VERSION", cuda_arg))
           if v is not None and int(v.split(".")[0]) < 13]
    flavour = torch_local_cuda(torch)
    if flavour is None or not flavour.startswith("cu13"):
        old.append(f"torch {torch} (needs a +cu13x build)")
    if not old:
        return "pass", nums, ""
    return "fail", nums, (f"{'; '.join(old)}: GB10 (sm_121) kernels exist only from CUDA 13 on, else \"no kernel "
                          "image is available\"; build on CUDA 13.0 with torch 2.11.0+cu130 (the community image's "
                          "pins)")


# RDMA registers pinned memory: with Docker's default locked-memory limit (8 MiB in nccl-tests #206, 64 MiB in
# NVIDIA/cudf-spark #7632) NCCL fails with "ibv_reg_mr ... Cannot allocate memory". NCCL's troubleshooting guide
# (InfiniBand section) asks for an unlimited memlock limit inside containers.
SRC_MEMLOCK = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#infiniband; "
               "https://github.com/NVIDIA/nccl-tests/issues/206")


def needs_unlimited_memlock(r: Recipe) -> bool:
    """The engine does RDMA (a fabric, or InfiniBand devices in the container), so it needs unlimited memlock."""
    return r.fabric is not None or r.container.infiniband


@rule("rdma-memlock", "a fabric / InfiniBand recipe runs the engine with unlimited memlock",
      SRC_MEMLOCK, needs_unlimited_memlock)
def _memlock(r: Recipe, hosts):
    why = ", ".join(x for x, on in (("fabric", r.fabric is not None), ("container.infiniband",
                                                                       r.container.infiniband)) if on)
    nums = f"memlock_unlimited {r.container.memlock_unlimited}; RDMA via {why}"
    if r.container.memlock_unlimited:
        return "pass", nums, ""
    return "fail", nums, ("set container.memlock_unlimited: true; with the default locked-memory limit NCCL's "
                          "memory registration fails (ibv_reg_mr: Cannot allocate memory) "
                          f"({SRC_MEMLOCK.split(';')[0]})")


# Gloo (and NCCL's bootstrap) pick their interface from the hostname; on hosts whose hostname resolves to
# 127.0.1.1 they bind loopback and the peers cannot connect: "Unable to resolve hostname to a (local) address.
# Using the loopback address as fallback. Manually set the network interface to bind to with GLOO_SOCKET_IFNAME"
# then "Gloo connectFullMesh failed" (vLLM #7074; aws-samples/aws-do-eks #50 under host networking).
SRC_SOCKET_IFNAME = ("https://github.com/vllm-project/vllm/issues/7074; "
                     "https://github.com/aws-samples/aws-do-eks/pull/50")


def socket_ifname_keys(r: Recipe) -> tuple[str, ...]:
    """The socket-interface variables a multi-node engine needs: Gloo's always, NCCL's too when it has GPUs."""
    return ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if r.hardware.gpus.count else ("GLOO_SOCKET_IFNAME",)


@rule("multinode-socket-ifname", "a multi-node recipe on host networking names its socket interfaces",
      SRC_SOCKET_IFNAME,
      lambda r: r.hardware.nodes > 1 and r.serving.network_mode == "host")
def _socket_ifname(r: Recipe, hosts):
    from ds4deploy.engine_args import engine_env

    env = engine_env(r)
    keys = socket_ifname_keys(r)
    nums = ", ".join(f"{k}={env.get(k, '(unset)')}" for k in keys)
    if r.fabric is not None:
        nums += (f" (derived per node from its first rail's netdev: {r.fabric.rails[0].netdev} as the recipe names "
                 "it, or the inventory's ds4_rails.<rail>.netdev)")
    missing = [k for k in keys if not env.get(k)]
    if not missing:
        return "pass", nums, ""
    return "fail", nums, (
        f"{', '.join(missing)} unset: Gloo falls back to the hostname's address, often loopback, and the nodes "
        "cannot connect (\"Gloo connectFullMesh failed\"). Add a fabric section (the interfaces follow its first "
        f"rail), or set {' and '.join(missing)} in engine.env to the interface that holds every node's ds4_host_ip "
        "(`ip -o addr show to <ds4_host_ip>` on each node; the name must be the same on all nodes)")


# --- serving surface ----------------------------------------------------------------------------------------------

# A context above this many tokens needs a server-side output cap: one uncapped request there decodes for 20-55 min
# at the reference systems' 10-30 tok/s single-session decode (docs/sources.md#v100x8, #gx10-pair), and one ran
# 2 h 45 min (docs/sources.md#gx10-benchmark-method).
LONG_CONTEXT_TOKENS = 32768


@rule("output-cap", "a long-context recipe caps the output of requests that set no max_tokens",
      "docs/sources.md#gx10-benchmark-method: one request without max_tokens generated for 2 h 45 min; "
      "vLLM --override-generation-config "
      "max_new_tokens sets the default (vLLM docs, engine arguments)",
      lambda r: True)
def _output_cap(r: Recipe, hosts):
    cap, ctx = r.serving.default_max_tokens, r.serving.max_model_len
    if cap is None:
        nums = f"serving.default_max_tokens unset; max_model_len {ctx}"
        if ctx > LONG_CONTEXT_TOKENS:
            return "fail", nums + f" > {LONG_CONTEXT_TOKENS}", (
                "set serving.default_max_tokens (e.g. 32768 for a coding agent): a request without max_tokens "
                "otherwise decodes to the end of the context")
        return "pass", nums + f" <= {LONG_CONTEXT_TOKENS} (short enough uncapped)", ""
    nums = f"default_max_tokens {cap}; max_model_len {ctx}"
    if cap >= ctx:
        return "fail", nums, f"set serving.default_max_tokens below max_model_len ({ctx}) to leave room for a prompt"
    return "pass", nums, ""


@rule("coding-agent-fit", "a coding-agent recipe holds the agent's prompt plus output budget, and parses reasoning "
      "when the agent asks for thinking",
      "Claude Code sends max_tokens 32000 and a thinking block; vLLM answers 400 when prompt + max_tokens exceed "
      "max_model_len, caps max_tokens at --override-generation-config max_new_tokens, and a thinking request needs "
      "--reasoning-parser (README, pointing a coding agent at a deployment)",
      lambda r: r.serving.coding_agent is not None)
def _coding_agent(r: Recipe, hosts):
    a, ctx = r.serving.coding_agent, r.serving.max_model_len
    need = a.output_tokens + a.prompt_tokens
    nums = f"prompt {a.prompt_tokens} + output {a.output_tokens} = {need} tokens; max_model_len {ctx}"
    if need > ctx:
        return "fail", nums, (f"raise serving.max_model_len to at least {need}, or lower coding_agent.output_tokens "
                              "(the agent's max_tokens setting, e.g. CLAUDE_CODE_MAX_OUTPUT_TOKENS)")
    cap = r.serving.default_max_tokens
    if cap is not None and cap < a.output_tokens:
        return "fail", nums + f"; server output cap {cap}", (
            f"raise serving.default_max_tokens to at least {a.output_tokens}: vLLM caps every request's max_tokens "
            "there, so the agent's answers would be cut short")
    if a.thinking and not r.serving.reasoning_parser:
        return "fail", nums + "; thinking requested, no reasoning_parser", (
            "set serving.reasoning_parser to the model's parser (e.g. deepseek_v4), or coding_agent.thinking: false")
    return "pass", nums + ("; reasoning parser " + r.serving.reasoning_parser if a.thinking else ""), ""


@rule("front-door-ports", "front door and engine do not share a port",
      "host networking puts proxy and engine in one network namespace: two listeners on one port cannot both bind",
      lambda r: r.serving.front_door is not None)
def _front_door_ports(r: Recipe, hosts):
    port, eng = r.serving.port, r.engine_port
    engine_host = "127.0.0.1" if r.serving.network_mode == "host" else "engine"
    nums = f"front door {r.serving.bind_address}:{port}, engine {engine_host}:{eng}"
    if r.serving.network_mode == "bridge":
        return "pass", nums + " (own network namespaces)", ""
    taken = {port: "serving.port", r.master_port: "the rendezvous port"} if r.master_port else {port: "serving.port"}
    if r.serving.front_door.engine_port is None or eng in taken:
        what = taken.get(eng, "serving.port")
        return "fail", nums + f": the engine would take {what}", (
            f"set serving.front_door.engine_port to a free port other than {', '.join(map(str, taken))} "
            f"(e.g. {port + 1}) and run `ds4deploy render`")
    return "pass", nums, ""


# --- running ------------------------------------------------------------------------------------------------------


def run(recipe: Recipe, hosts: dict[str, dict] | None = None) -> list[Verdict]:
    """Every rule against `recipe` (and host facts when given), in rule-book order."""
    out = []
    for r in RULES:
        if not r.applies(recipe):
            out.append(Verdict(r.id, "skip", "does not apply", "", r.source))
            continue
        status, numbers, fix = r.check(recipe, hosts or {})
        out.append(Verdict(r.id, status, numbers, fix, r.source))
    return out


@dataclass
class Report:
    """Verdicts of one recipe; `exit_code` is 1 when any rule failed, else 0."""

    recipe: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(v.status == "fail" for v in self.verdicts) else 0
