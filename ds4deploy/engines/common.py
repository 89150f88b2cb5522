"""What every engine family shares in the container: where the model is mounted and which address it binds."""

from __future__ import annotations

from ds4deploy.recipe.schema import Recipe

# Where the model directory is mounted inside the container (read-only), for every family.
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
