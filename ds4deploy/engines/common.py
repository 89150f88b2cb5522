"""What every engine family shares in the container: where the model is mounted and which address it binds."""

from __future__ import annotations

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import Recipe

# Where the model directory is mounted inside the container (read-only), for every family.
CONTAINER_MODEL_DIR = "/model"

# Seconds an engine's HTTP server keeps an idle connection open before it closes it, per family: vLLM's uvicorn
# server 5 s unless VLLM_HTTP_TIMEOUT_KEEP_ALIVE says otherwise (vllm/envs.py at the pinned versions), llama-server's
# cpp-httplib 5 s (CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND in vendor/cpp-httplib/httplib.h at the llama.cpp pin).
KEEP_ALIVE_S = {"vllm": 5, "llamacpp": 5}
KEEP_ALIVE_ENV = {"vllm": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"}
# Whether a proxy may send a second request on a connection the engine answered, per family. llama-server at the
# llama.cpp pin closes a kept-alive connection after some streamed (SSE) answers without announcing it (no
# "Connection: close"): the next request sent on it gets no answer. Measured on cpu-llamacpp (2026-12-01): 29 of 200
# streamed chat completions on one reused connection ended in "server disconnected without sending a response",
# 0 of 200 with "Connection: close"; behind nginx's upstream keep-alive, 10 of 200 were answered 502.
PROXY_REUSE = {"vllm": True, "llamacpp": False}


def keep_alive_s(recipe: Recipe) -> int:
    """Seconds the recipe's engine keeps an idle HTTP connection open (`KEEP_ALIVE_S`, or the engine's own variable
    in ``engine.env`` where the family reads one). A proxy that keeps its idle connections to the engine longer
    sends requests on connections the engine is closing: nginx answers those 502 "upstream prematurely closed
    connection" (seen on the cpu stack under 16 clients, 2026-12-01).

    Raises:
        UserError: the recipe sets the family's keep-alive variable to something other than whole seconds.
    """
    family = recipe.engine.family
    var = KEEP_ALIVE_ENV.get(family)
    if var and var in recipe.engine.env:
        value = str(recipe.engine.env[var])
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"engine.env {var} is {value!r}: the engine reads it as whole seconds",
                            f"set {var} to a whole number of seconds (1 or more), or leave it out (default "
                            f"{KEEP_ALIVE_S[family]} s)")
        return int(value)
    return KEEP_ALIVE_S[family]


def proxy_may_reuse(recipe: Recipe) -> bool:
    """Whether the front door may keep connections to the recipe's engine open for further requests
    (`PROXY_REUSE`)."""
    return PROXY_REUSE[recipe.engine.family]


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
