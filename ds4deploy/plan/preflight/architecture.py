"""Architecture-specific rules: what each GPU generation (Volta, Ampere, GB10) and its engine build need."""

from __future__ import annotations

from ds4deploy.plan.preflight.rulebook import _spec_k, rule
from ds4deploy.recipe.instances import instance_count
from ds4deploy.recipe.schema import Recipe, whole_number


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
    raw = r.serving.extra_args.get("kv-cache-memory-bytes")
    fixed = whole_number(raw)
    nums = (f"max_model_len {r.serving.max_model_len:,} > {GB10_FIXED_KV_ABOVE_TOKENS:,}; "
            f"kv-cache-memory-bytes {raw if raw is not None else 'unset (sized from gpu_memory_utilization)'}")
    if fixed is not None and fixed > 0:
        return "pass", nums, ""
    return "fail", nums, ("set serving.extra_args.kv-cache-memory-bytes (12884901888 = 12 GiB per rank in the "
                          "reference) and drop memory.kv_cache_gib_per_gpu, or lower serving.max_model_len")


# The unregistered-variable check of the GB10 0.1.1 image is the engine family's rule engine-env
# (ds4deploy/plan/preflight/engine.py), against the image's registry (ds4deploy/engines/registry/); MiaAI-Lab/
# DeepSeek-v4-Flash-DSpark-2x-DGX-Spark docs/ENVS.md at 489af958 audits the same list inside the image.


def _gb10_011(r: Recipe) -> bool:
    return r.engine.flavor == "gb10-community" and "dspark-vllm-gx10:0.1.1" in (r.engine.image.base_image or "")


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
