"""Field reports: engine build, fabric limits and socket interfaces that failed on real deployments."""

from __future__ import annotations

from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe

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
    from ds4deploy.engines.vllm import engine_env

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
