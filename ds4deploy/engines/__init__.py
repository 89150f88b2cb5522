"""Per-family dispatch: the engine's command, environment and health probe for a recipe, whichever family serves it.

``engine.family`` picks the module: ``vllm`` (`ds4deploy.engines.vllm`) or ``llamacpp``
(`ds4deploy.engines.llamacpp`). The render, the preflight rules and the tools ask here, never a family directly,
unless what they check belongs to one family.
"""

from __future__ import annotations

from ds4deploy.recipe.schema import Recipe

# llama-server reads its key from LLAMA_API_KEY (common/arg.cpp --api-key); the key file holds it as VLLM_API_KEY
# (one key file for every family, read by the front door too). A shell copies one into the other and execs the
# server, so the key is on no command line.
LLAMACPP_KEY_SHIM = ["/bin/sh", "-c", 'LLAMA_API_KEY="$VLLM_API_KEY" exec "$@"', "sh"]


def engine_args(recipe: Recipe) -> list[str]:
    """The engine's arguments after its entrypoint (what engine-args.json records)."""
    if recipe.engine.family == "llamacpp":
        from ds4deploy.engines.llamacpp import server_args

        return server_args(recipe)
    from ds4deploy.engines.vllm import engine_args as vllm_args

    return vllm_args(recipe)


def argv_check(recipe: Recipe, command: list[str], entrypoint: list[str]) -> list[str]:
    """The entrypoint of the engine's own argument check for a container of `recipe` that runs `entrypoint` with
    `command`: given the same command, it parses the server's arguments as the server would at start and exits
    (docs/architecture.md, "The engine's own argument check"): 0 accepted, 3 no parser in the image (vLLM only), any
    other status refused, with the engine's message.

    Raises:
        ValueError: `command` does not hold the recipe's engine.entrypoint (a render bug, not bad input).
    """
    if recipe.engine.family == "llamacpp":
        from ds4deploy.engines.llamacpp import argv_check_entrypoint

        return argv_check_entrypoint(entrypoint)
    from ds4deploy.engines.vllm import argv_check_entrypoint as vllm_check

    return vllm_check(engine_args_start(recipe, command))


def engine_args_start(recipe: Recipe, command: list[str]) -> int:
    """Index in a rendered container `command` of the engine's own first argument: the item after the first run of
    the recipe's engine.entrypoint (which a key shim may precede).

    Raises:
        ValueError: `command` does not hold the recipe's engine.entrypoint (a render bug, not bad input).
    """
    entry = recipe.engine.entrypoint
    starts = [i for i in range(len(command) - len(entry) + 1) if command[i:i + len(entry)] == entry]
    if not starts:
        raise ValueError(f"the command {command[:6]} does not run the engine.entrypoint {entry}")
    return starts[0] + len(entry)


def engine_env(recipe: Recipe) -> dict[str, str]:
    """The engine's non-secret environment."""
    if recipe.engine.family == "llamacpp":
        from ds4deploy.engines.llamacpp import server_env

        return server_env(recipe)
    from ds4deploy.engines.vllm import engine_env as vllm_env

    return vllm_env(recipe)


def command(recipe: Recipe, argv: list[str]) -> list[str]:
    """The container's command for `argv` (entrypoint + arguments): as is for vLLM, behind `LLAMACPP_KEY_SHIM` for
    llama.cpp when the recipe has an API key."""
    if recipe.engine.family == "llamacpp" and recipe.serving.auth.mode == "api_key":
        return [*LLAMACPP_KEY_SHIM, *argv]
    return argv


def health_test(recipe: Recipe, url: str) -> list[str]:
    """The compose healthcheck test that GETs `url`: python3 in the vLLM images, curl in the llama.cpp images (no
    Python there); both fail on a non-2xx answer."""
    if recipe.engine.family == "llamacpp":
        return ["CMD", "curl", "-fsS", "-o", "/dev/null", "--max-time", "5", url]
    return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen('{url}', timeout=5)"]


# What each family's server says it is in ``GET /v1/models`` (``owned_by`` of every model): llama-server's
# (tools/server/server-context.cpp at the pinned llama.cpp commit) and vLLM's, as both answered here
# (tests/unit/fixtures/engines: the cpu-llamacpp stack and vLLM CPU 0.32.0).
OWNED_BY = {"vllm": "vllm", "llamacpp": "llamacpp"}


def family_of_models(models: object) -> str | None:
    """The engine family that answered a ``GET /v1/models`` body (`OWNED_BY`), or None when it does not say (another
    server, a body that is not the OpenAI list shape)."""
    data = models.get("data") if isinstance(models, dict) else None
    owners = {m.get("owned_by") for m in data or () if isinstance(m, dict)}
    return next((fam for fam, owner in OWNED_BY.items() if owner in owners), None)
