"""What a deploy produced: URL, served model name, where the API key is, and a curl to try.

`ds4deploy summary <recipe>` prints it (the last step of `make deploy`). Never prints the key itself.
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.core.net import base_url
from ds4deploy.recipe.load import load_recipe


def summary(name: str, inventory: Path | None = None) -> str:
    """The post-deploy message for recipe `name`. With the `inventory` it was deployed with, a recipe listening on
    every address (0.0.0.0) is shown at the address of the host that serves it (the head; a one-node recipe on
    several hosts: one replica per host, each listed, each with its own key on its host).

    Raises:
        UserError: the inventory cannot be read or does not fit the recipe (`ds4deploy.plan.nodes.plan`)."""
    r = load_recipe(name)
    s = r.serving
    url = base_url(s.bind_address, s.port)
    replicas: list[str] = []
    if inventory is not None and s.bind_address in ("0.0.0.0", "::"):  # noqa: S104 (read, not bound)
        from ds4deploy.operate.supervisor import head_url
        from ds4deploy.plan.inventory import read_inventory
        from ds4deploy.plan.nodes import plan

        hosts = read_inventory(inventory).hosts
        heads = [n for n in plan(r, hosts) if n.role in ("head", "single")]
        replicas = [head_url(r, [n], hosts) for n in heads]
        url = replicas[0]
    lines = [
        f"ds4deploy: recipe '{r.name}' is up.",
        f"  OpenAI API:     {url}/v1      (chat: {url}/v1/chat/completions)",
        f"  Anthropic API:  {url}/v1/messages",
        f"  served model:   {r.model.served_name}",
    ]
    if len(replicas) > 1:
        lines.append(f"  replicas:       {', '.join(replicas)} (one per host, each with its own key in {r.key_file} "
                     "on that host; a gateway puts one URL in front: docs/gateway.md)")
    if s.auth.mode == "api_key":
        lines += [
            f"  API key:        in {r.key_file} (VLLM_API_KEY=..., mode 0600, root only)",
            f"  try (as root):  KEY=$(sed -n 's/^VLLM_API_KEY=//p' {r.key_file}); curl -s {url}/v1/chat/completions "
            f"-H \"Authorization: Bearer $KEY\" -H 'Content-Type: application/json' "
            f"-d '{{\"model\": \"{r.model.served_name}\", \"messages\": [{{\"role\": \"user\", \"content\": "
            f"\"Hello\"}}], \"max_tokens\": 32}}'",
        ]
        if s.front_door is not None:
            lines.append("  front door:     the key on every route but " + ", ".join(s.front_door.allow)
                         + f", as a bearer token or x-api-key (Claude Code: ANTHROPIC_BASE_URL={url} "
                         "ANTHROPIC_API_KEY=<key>)")
        else:
            lines.append("  Anthropic clients: send the key as a bearer token (Claude Code: "
                         f"ANTHROPIC_AUTH_TOKEN=<key>, ANTHROPIC_BASE_URL={url}); vLLM refuses the x-api-key header")
    else:
        lines.append("  API key:        none (bound to loopback only)")
    lines.append(f"  health:         curl -s {url}/health   |  make status  |  make logs  |  make down")
    return "\n".join(lines)

