"""The llama.cpp family: llama-server's command line, environment, health and progress, derived from a recipe.

A recipe of this family says ``engine.family: llamacpp`` and carries an ``engine.llamacpp`` section
(`ds4deploy.recipe.schema.LlamaCpp`: each field is one llama-server flag, named in its description) and a
``model.gguf`` section (the file llama-server is pointed at, and how many gguf-split parts it has). Everything else
comes from the sections every recipe has, written once:

| llama-server flag | from |
|---|---|
| ``-m /model/<model.gguf.file>`` | the model directory is mounted at ``/model`` (read-only); part 1 of a split model |
| ``--host`` / ``--port`` | `listen_host` and ``Recipe.engine_port`` (loopback behind the front door) |
| ``-a`` | ``model.served_name`` and ``model.aliases``, comma-separated (`common/arg.cpp` ``--alias``) |
| ``-np`` | ``serving.max_num_seqs``: parallel slots |
| ``-c`` | ``serving.max_model_len x serving.max_num_seqs``: llama-server divides ``-c`` among the slots (its log: |
| | ``n_ctx_slot``), so every request keeps ``max_model_len`` |
| ``-n`` | ``serving.default_max_tokens``: tokens a request without max_tokens generates at most (``--n-predict``) |
| ``--metrics``, ``--slots`` | always: the supervisor judges busy from stuck by /metrics (``read_llamacpp`` of |
| | `ds4deploy.operate.progress`; 501 without ``--metrics``); the bench reads both. No recipe can drop them |
| API key | never on the command line: ``LLAMA_API_KEY`` in the environment (`common/arg.cpp` ``--api-key``) |

Every flag is checked against the registry of the pinned source (`llamacpp_flags.json`, written by
``python -m tools.llamacpp_flags`` from its `common/arg.cpp`): a flag that commit does not know is refused before
anything is rendered (`unknown_flags`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.engines.common import CONTAINER_MODEL_DIR, listen_host
from ds4deploy.recipe.schema import Recipe

FLAGS_FILE = Path(__file__).with_name("llamacpp_flags.json")
# llama-server's health route: 200 {"status": "ok"} once the model is loaded, 503 while loading
# (tools/server/README.md "GET /health").
HEALTH_PATH = "/health"
# gguf-split part names (tools/gguf-split, llama_split_path): <prefix>-00001-of-00005.gguf.
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# llama-server's log line prefix with timestamps on: "<minutes>.<s>.<ms>.<us> <level> " with level D, I, W or E
# (common/log.cpp at the pin, e.g. "0.00.111.793 E llama_model_load: ..."). Stripped before a line is judged fatal.
LOG_PREFIX = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} [DIWE] ")
# llama-server's fatal lines (the pinned source): a model that does not load (src/llama.cpp "%s: error loading
# model: %s"), the server giving up (tools/server/server.cpp "exiting due to model loading error", "exiting due to
# HTTP server error"), a ggml assertion (ggml/include/ggml.h GGML_ASSERT: "GGML_ASSERT(%s) failed", then abort()).
# Its per-request errors (E "srv    send_error: ...") are not fatal.
FATAL_LOG = re.compile(r"error loading model: |exiting due to |GGML_ASSERT\(.*\) failed")


# llama-server's /metrics page (pinned llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f, as vendored by
# llama-cpp-python 0.3.36: tools/server/server-task.cpp, server_task_result_metrics::to_metrics, which writes every
# name below with a `llamacpp:` prefix, HELP and TYPE lines; docs/sources.md#llamacpp-metrics). The gauges:
# requests_processing = slots processing a request (server-context.cpp, SERVER_TASK_TYPE_METRICS: slots with
# is_processing()), requests_deferred = requests queued because no slot was free (queue_tasks_deferred_size()).
# The counters that move when the server works (server-context.cpp, metrics_post_decode / metrics_flush_prompt /
# metrics_on_prediction): n_decode_total, one per llama_decode() call, so it moves with every batch of a long
# prefill (prompt_tokens_total is only added when a batch with output completes); prompt and cached-prompt tokens
# and their seconds; generated tokens and their seconds; the speculative-decoding draft counters. Left out: the
# averaged rates (prompt_tokens_seconds, predicted_tokens_seconds, n_busy_slots_per_decode: their window is reset by
# every scrape, so they change without any work) and n_tokens_max (a high-water mark, not a counter of work). The
# supervisor's progress reading (`ds4deploy.operate.progress.read_llamacpp`) takes its names from here.
METRICS = {name: f"llamacpp:{name}" for name in (
    "n_decode_total", "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
    "tokens_predicted_total", "tokens_predicted_seconds_total", "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total", "requests_processing",
    "requests_deferred")}


@cache
def known_flags() -> dict[str, dict]:
    """``{flag: {"value": bool, "negation": bool}}``: every flag llama-server accepts at the pinned commit."""
    return json.loads(FLAGS_FILE.read_text(encoding="utf-8"))["flags"]


def flags_source() -> str:
    """Where the registry was read from (the sdist and commit)."""
    return json.loads(FLAGS_FILE.read_text(encoding="utf-8"))["source"]


def gguf_parts(file: str, parts: int) -> list[str]:
    """Every file of a GGUF model, part 1 first: ``[file]`` for one file, else the gguf-split names
    ``<stem>-0000k-of-0000N.gguf`` derived from part 1's name.

    Raises:
        UserError: `file` is not a ``.gguf`` name, or a split model's part 1 is not named ``-00001-of-<parts>``.
    """
    if not file.endswith(".gguf"):
        raise UserError(f"model.gguf.file {file!r} is not a GGUF file (.gguf): llama-server loads only GGUF",
                        "convert the checkpoint to GGUF (llama.cpp convert_hf_to_gguf.py) or pick a vLLM recipe")
    if parts == 1:
        return [file]
    m = SPLIT_RE.match(file)
    if not m or int(m["no"]) != 1 or int(m["count"]) != parts:
        raise UserError(f"model.gguf.file {file!r} is not part 1 of {parts} gguf-split parts",
                        f"name part 1, <stem>-00001-of-{parts:05d}.gguf: llama-server is pointed at it and opens "
                        "the others by name")
    return [f"{m['stem']}-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]


def context_tokens(recipe: Recipe) -> int:
    """``-c``: the whole KV context, tokens = ``max_model_len x max_num_seqs`` (module docstring)."""
    return recipe.serving.max_model_len * recipe.serving.max_num_seqs


def _bare(v: object) -> bool:
    return v is True


def server_args(recipe: Recipe) -> list[str]:
    """llama-server's arguments (after the binary) for `recipe`, in a stable order.

    Returns:
        e.g. ``["-m", "/model/ds4-tiny-deepseek4-00001-of-00002.gguf", "--host", "127.0.0.1", "--port", "8001", ...]``.
    Raises:
        UserError: the recipe is not of the llama.cpp family, or a flag is unknown to the pinned commit.
    """
    lc, gg = recipe.engine.llamacpp, recipe.model.gguf
    if recipe.engine.family != "llamacpp" or lc is None or gg is None:
        raise UserError(f"recipe '{recipe.name}' is not a llama.cpp recipe (engine.family: {recipe.engine.family})",
                        "set engine.family: llamacpp with engine.llamacpp and model.gguf sections")
    s, m = recipe.serving, recipe.model
    args = ["-m", f"{CONTAINER_MODEL_DIR}/{gguf_parts(gg.file, gg.parts)[0]}",
            "--host", listen_host(recipe), "--port", str(recipe.engine_port),
            "-a", ",".join([m.served_name, *m.aliases]),
            "-c", str(context_tokens(recipe)), "-np", str(s.max_num_seqs)]
    if s.default_max_tokens is not None:
        args += ["-n", str(s.default_max_tokens)]
    pairs: list[tuple[str, object]] = [
        ("-ngl", lc.n_gpu_layers), ("-sm", lc.split_mode),
        ("-ts", ",".join(f"{x:g}" for x in lc.tensor_split) if lc.tensor_split else None),
        ("-fa", lc.flash_attn), ("-b", lc.batch_size), ("-ub", lc.ubatch_size),
        ("--cache-type-k", lc.cache_type_k), ("--cache-type-v", lc.cache_type_v),
        ("-t", lc.threads), ("-tb", lc.threads_batch), ("--numa", lc.numa),
        ("-ot", ",".join(lc.override_tensor) if lc.override_tensor else None),
        ("--n-cpu-moe", lc.n_cpu_moe), ("-rea", lc.reasoning),
    ]
    for flag, value in pairs:
        if value is not None:
            args += [flag, str(value)]
    args.append("--jinja" if lc.jinja else "--no-jinja")
    args += ["--metrics", "--slots"]
    derived = len(args)
    flags = known_flags()
    for name, value in lc.extra_args.items():
        flag = name if name.startswith("-") else f"--{name}"
        if value is False and flag in flags:
            # A switch turned off is its negated spelling (--no-<x>), where the option has one; a negated spelling
            # set to false would mean the switch on, which its own name says plainly.
            if flags[flag].get("negation"):
                raise UserError(f"engine.llamacpp.extra_args sets {flag}: false (a double negative)",
                                f"write the switch itself: {flags[flag]['option'].removeprefix('--')}: true")
            off = next((n for n, f in flags.items() if f.get("negation") and f.get("option") == flags[flag]["option"]),
                       None)
            if off is None:
                raise UserError(f"engine.llamacpp.extra_args sets {flag}: false, and llama-server's {flag} has no "
                                "negated form", f"remove {name} from engine.llamacpp.extra_args to leave it off")
            args.append(off)
            continue
        args += [flag] if _bare(value) else [flag, str(value)]
    bad = unknown_flags(args)
    if bad:
        raise UserError(
            f"recipe '{recipe.name}': llama-server at the pinned commit has no flag {', '.join(bad)} "
            f"(registry: {flags_source()})",
            "check the spelling against `llama-server --help` of the recipe's image, or remove it from "
            "engine.llamacpp.extra_args")
    _one_spelling_each(recipe, args, derived, flags)
    return args


# Options the deploy owns outside the argv: the API key is the front door's and the key file's (serving.auth).
_OWNED_OPTIONS = ("--api-key", "--api-key-file")


def _one_spelling_each(recipe: Recipe, args: list[str], derived: int, flags: dict[str, dict]) -> None:
    """Refuse an extra flag that is an option the render already sets under any of its spellings (-t and --threads,
    --jinja and --no-jinja: llama-server keeps the last one given), or one the deploy owns (`_OWNED_OPTIONS`).
    Extra flags among themselves are not compared: some options may be given several times (--override-kv).

    Raises:
        UserError: naming the extra flag, the spelling already there and the recipe field that sets it.
    """
    def option(tok: str) -> str | None:
        return (flags.get(tok.split("=", 1)[0]) or {}).get("option")

    ours = {option(t): t for t in args[:derived] if t.startswith("-") and option(t)}
    clashes, owned = [], []
    for tok in args[derived:]:
        opt = option(tok) if tok.startswith("-") else None
        if opt in _OWNED_OPTIONS:
            owned.append(tok)
        elif opt is not None and opt in ours:
            clashes.append(f"{tok} (the render sets {ours[opt]})")
    if owned:
        raise UserError(f"recipe '{recipe.name}': engine.llamacpp.extra_args sets {', '.join(owned)}: the API key is "
                        "the deploy's (serving.auth's key file, checked by the front door)",
                        "remove it from engine.llamacpp.extra_args")
    if clashes:
        raise UserError(f"recipe '{recipe.name}': engine.llamacpp.extra_args sets {', '.join(clashes)}: "
                        "llama-server would get one option twice and keep the last",
                        "set it in its own recipe field (engine.llamacpp.threads, serving.max_model_len, "
                        "model.aliases, ...) or once in extra_args")


def unknown_flags(args: list[str]) -> list[str]:
    """The flags in `args` (tokens starting with ``-``, values skipped) the pinned llama-server does not accept."""
    flags = known_flags()
    out, skip = [], False
    for tok in args:
        if skip:
            skip = False
            continue
        if tok.startswith("-") and not re.fullmatch(r"-?\d+(\.\d+)?", tok):
            name = tok.split("=", 1)[0]
            if name not in flags:
                out.append(name)
            else:
                skip = flags[name]["value"] and "=" not in tok
    return out


def server_env(recipe: Recipe) -> dict[str, str]:
    """The container's environment: ``engine.env`` (the key comes from the key file as ``LLAMA_API_KEY``, never
    here)."""
    return dict(sorted(recipe.engine.env.items()))


def argv_check_entrypoint(entrypoint: list[str]) -> list[str]:
    """The entrypoint that runs the container's own `entrypoint` and command with ``--help`` appended: llama-server
    converts and checks every argument (and each LLAMA_ARG_* variable) before it answers ``--help``, so a value it
    would refuse at start (a word for a number, an unknown option, a buffer type no device has, a chat template it
    cannot read) fails here with its own message and exit 1, and an accepted command prints the usage and exits 0,
    with no model opened and no port bound (common/arg.cpp common_params_parse: common_params_parse_ex parses all
    arguments, then `params.usage` prints and exits; at the pinned commit, FLAGS_FILE's source)."""
    return ["/bin/sh", "-c", 'exec "$@" --help', "ds4-engine-check", *entrypoint]
