"""The engine's command line, derived from a recipe.

`engine_args(recipe)` returns the vLLM argument list exactly as the container runs it (after the entrypoint).
Order is fixed so renders are stable. Values are strings; bare flags have no value.
"""

from __future__ import annotations

import json
from typing import Any

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import Recipe

# Where the model directory is mounted inside the container (read-only).
CONTAINER_MODEL_DIR = "/model"


def listen_host(recipe: Recipe) -> str:
    """Address the engine listens on inside its network namespace.

    With bridge networking the engine listens on all interfaces of its own container (Docker publishes the port on
    `serving.bind_address`, or the front door reaches it over the compose network); with host networking the engine
    binds the recipe's address itself, or loopback behind the front door (only the proxy on the same host reaches
    it).
    """
    if recipe.serving.network_mode == "bridge":
        return "0.0.0.0"  # noqa: S104
    return "127.0.0.1" if recipe.serving.front_door is not None else recipe.serving.bind_address


# vLLM flags whose value the engine parses as JSON (vLLM 0.32 vllm/engine/arg_utils.py: the config-valued arguments
# built with `json.loads`/`optional_type(json.loads)`, and the generation/pooler overrides). Any other value that
# starts with '{' or '[' is treated as JSON too.
JSON_FLAGS = frozenset({
    "speculative-config", "compilation-config", "kv-transfer-config", "kv-events-config", "additional-config",
    "hf-overrides", "override-generation-config", "pooler-config", "override-pooler-config",
    "structured-outputs-config", "limit-mm-per-prompt", "mm-processor-kwargs", "model-loader-extra-config",
    "default-chat-template-kwargs", "eplb-config", "attention-config", "reasoning-config", "ep-config",
    "media-io-kwargs", "logits-processors", "ec-transfer-config", "profiler-config",
})


def dump_json(value: Any, where: str) -> str:
    """`value` as the compact JSON text the engine gets (UTF-8, no spaces, no NaN).

    Raises:
        UserError: `value` holds something JSON cannot carry (a set, bytes, NaN); `where` names the recipe field.
    """
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: cannot be written as JSON for the engine: {exc}",
                        "use only strings, numbers, booleans, null, lists and mappings there (quote dates)") from None


def json_arg(name: str, value: str) -> str:
    """A JSON-valued engine argument parsed and re-serialised (`dump_json`), so the engine never sees malformed
    JSON and the render shows one canonical form.

    Raises:
        UserError: `value` is not valid JSON; names the argument and the parser's line, column and character.
    """
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"serving.extra_args.{name}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}, "
            f"character {exc.pos}): {value!r}",
            f"fix the JSON of {name} (the engine parses it with json.loads), or write it as a YAML mapping in "
            "single quotes") from None
    return dump_json(parsed, f"serving.extra_args.{name}")


def engine_args(recipe: Recipe) -> list[str]:
    """vLLM OpenAI-server arguments for `recipe`, in a stable order.

    Returns:
        e.g. ``["--model", "/model", "--served-model-name", "ds4-tiny", "--host", "0.0.0.0", ...]`` (``--model`` is
        ``/model/<model.file>`` when the recipe names one file).
    """
    s, p, m = recipe.serving, recipe.parallelism, recipe.model
    args: list[str] = [
        "--model", f"{CONTAINER_MODEL_DIR}/{m.file}" if m.file else CONTAINER_MODEL_DIR,
        "--served-model-name", m.served_name, *m.aliases,
        "--host", listen_host(recipe),
        "--port", str(recipe.engine_port),
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
        args += ["--speculative-config", dump_json(spec, "serving.speculative")]
    if s.tool_call_parser:
        args += ["--tool-call-parser", s.tool_call_parser]
    if s.enable_auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    if s.reasoning_parser:
        args += ["--reasoning-parser", s.reasoning_parser]
    if s.enable_prefix_caching is not None:
        args.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    gen = s.extra_args.get("override-generation-config")
    if s.default_max_tokens or gen is not None:
        # The output cap: vLLM 0.32 reads max_new_tokens of the generation config as the default max_tokens and
        # also as the upper bound of any request's (config/model.py get_diff_sampling_param; the chat and
        # completion servers' override_max_tokens). Other overrides the recipe gives (stop strings, temperature)
        # are kept in the same argument.
        override = json.loads(json_arg("override-generation-config", gen)) if isinstance(gen, str) else {}
        if not isinstance(override, dict):
            raise UserError("serving.extra_args.override-generation-config must be a JSON object",
                            'write it as {"key": value, ...}')
        cap = override.get("max_new_tokens")
        if s.default_max_tokens and cap is not None and cap != s.default_max_tokens:
            raise UserError(f"serving.extra_args.override-generation-config sets max_new_tokens {cap}, and "
                            f"serving.default_max_tokens says {s.default_max_tokens}",
                            "write the output cap once, in serving.default_max_tokens")
        if s.default_max_tokens:
            override["max_new_tokens"] = s.default_max_tokens
        args += ["--override-generation-config", dump_json(override, "serving.extra_args.override-generation-config")]
    if recipe.hardware.nodes > 1:
        # Written once in the recipe (hardware.nodes, parallelism, the rendezvous port), derived here; the per-node
        # half (rank, head address) is added by ds4deploy.render.compose.node_files.
        if p.multinode == "nnodes":
            args += ["--nnodes", str(recipe.hardware.nodes), "--master-port", str(recipe.master_port)]
        else:
            args += ["--data-parallel-size", str(p.data), "--data-parallel-size-local", "1",
                     "--data-parallel-rpc-port", str(recipe.master_port)]
    ours = {a[2:] for a in args if a.startswith("--")} | {"nnodes", "node-rank", "master-addr", "master-port",
                                                          "headless", "data-parallel-address",
                                                          "data-parallel-start-rank", "api-server-count"}
    twice = sorted(n for n in s.extra_args if n != "override-generation-config"  # merged, not repeated
                   and (n in ours or f"no-{n}" in ours or n.removeprefix("no-") in ours))
    if twice:
        raise UserError(f"serving.extra_args sets {', '.join('--' + n for n in twice)}, which the render already "
                        "derives from the recipe (the engine would get the flag twice and keep the last)",
                        "set the value in its own recipe field (serving.port, serving.max_model_len, "
                        "hardware.nodes, ...) and remove it from serving.extra_args")
    for name, value in s.extra_args.items():
        if name == "override-generation-config":
            continue  # merged with the output cap above
        if value is True:
            args.append(f"--{name}")
        elif value is False:
            args.append(f"--no-{name}")
        elif isinstance(value, str) and (name in JSON_FLAGS or value.lstrip()[:1] in ("{", "[")):
            args += [f"--{name}", json_arg(name, value)]
        else:
            args += [f"--{name}", str(value)]
    return args


# Environment derived from the recipe's fabric, so each fact is written once (fabric), never copied into engine.env.
FABRIC_ENV = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def engine_env(recipe: Recipe) -> dict[str, str]:
    """The engine's non-secret environment: ``engine.env`` plus what the fabric implies.

    With a fabric: NCCL_IB_HCA lists ``fabric.nccl_ib_hca`` (both twin HCAs of every rail's port), and NCCL's,
    Gloo's and torch's socket interface is the first rail's netdev (docs/sources.md#sm121-nccl-env), in the
    recipe's names; a multi-node render refers to each node's own instead (`ds4deploy.render.compose.node_files`,
    `ds4deploy.plan.node_fabric`).
    """
    env = dict(recipe.engine.env)
    if recipe.fabric is not None:
        env["NCCL_IB_HCA"] = ",".join(recipe.fabric.nccl_ib_hca)
        for key in FABRIC_ENV[1:]:
            env[key] = recipe.fabric.rails[0].netdev
    return env
