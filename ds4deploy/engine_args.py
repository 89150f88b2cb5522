"""The engine's command line, derived from a recipe.

`engine_args(recipe)` returns the vLLM argument list exactly as the container runs it (after the entrypoint).
Order is fixed so renders are stable. Values are strings; bare flags have no value.
"""

from __future__ import annotations

import json

from ds4deploy.recipe import Recipe

# Where the model directory is mounted inside the container (read-only).
CONTAINER_MODEL_DIR = "/model"


def listen_host(recipe: Recipe) -> str:
    """Address the engine listens on inside its network namespace.

    With bridge networking the container port is published on `serving.bind_address` by Docker, so the engine
    listens on all container interfaces; with host networking the engine binds the recipe's address itself.
    """
    return "0.0.0.0" if recipe.serving.network_mode == "bridge" else recipe.serving.bind_address  # noqa: S104


def engine_args(recipe: Recipe) -> list[str]:
    """vLLM OpenAI-server arguments for `recipe`, in a stable order.

    Returns:
        e.g. ``["--model", "/model", "--served-model-name", "ds4-tiny", "--host", "0.0.0.0", ...]``.
    """
    s, p, m = recipe.serving, recipe.parallelism, recipe.model
    args: list[str] = [
        "--model", CONTAINER_MODEL_DIR,
        "--served-model-name", m.served_name,
        "--host", listen_host(recipe),
        "--port", str(s.port),
        "--dtype", m.dtype,
        "--max-model-len", str(s.max_model_len),
        "--max-num-seqs", str(s.max_num_seqs),
        "--gpu-memory-utilization", str(s.gpu_memory_utilization),
        "--tensor-parallel-size", str(p.tensor),
        "--pipeline-parallel-size", str(p.pipeline),
    ]
    if m.quantization:
        args += ["--quantization", m.quantization]
    if s.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.kv_cache_dtype:
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.tokenizer_mode:
        args += ["--tokenizer-mode", s.tokenizer_mode]
    if s.speculative:
        spec = {
            "method": s.speculative.method,
            "num_speculative_tokens": s.speculative.num_speculative_tokens,
            **s.speculative.extra,
        }
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if s.tool_call_parser:
        args += ["--tool-call-parser", s.tool_call_parser]
    if s.enable_auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    if s.reasoning_parser:
        args += ["--reasoning-parser", s.reasoning_parser]
    if s.enable_prefix_caching is not None:
        args.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    if recipe.hardware.nodes > 1:
        # Written once in the recipe (hardware.nodes, parallelism, the rendezvous port), derived here; the per-node
        # half (rank, head address) is added by ds4deploy.render.node_files.
        if p.multinode == "nnodes":
            args += ["--nnodes", str(recipe.hardware.nodes), "--master-port", str(recipe.master_port)]
        else:
            args += ["--data-parallel-size", str(p.data), "--data-parallel-size-local", "1",
                     "--data-parallel-rpc-port", str(recipe.master_port)]
    for name, value in s.extra_args.items():
        if value is True:
            args.append(f"--{name}")
        elif value is False:
            args.append(f"--no-{name}")
        else:
            args += [f"--{name}", str(value)]
    return args


# Environment derived from the recipe's fabric, so each fact is written once (fabric), never copied into engine.env.
FABRIC_ENV = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def engine_env(recipe: Recipe) -> dict[str, str]:
    """The engine's non-secret environment: ``engine.env`` plus what the fabric implies.

    With a fabric: NCCL_IB_HCA lists ``fabric.nccl_ib_hca`` (both twin HCAs of every rail's port), and NCCL's,
    Gloo's and torch's socket interface is the first rail's netdev (shared/UPSTREAM.md sm121 NCCL/torch env).
    """
    env = dict(recipe.engine.env)
    if recipe.fabric is not None:
        env["NCCL_IB_HCA"] = ",".join(recipe.fabric.nccl_ib_hca)
        for key in FABRIC_ENV[1:]:
            env[key] = recipe.fabric.rails[0].netdev
    return env
