"""The API key file: ``VLLM_API_KEY=<key>`` in a 0600 file outside the repo (path: `Recipe.key_file`).

Everything that needs the key (the bench harness, the serving checks) reads it here, so the file format is
written down once. The key is never printed or logged by ds4deploy.
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.errors import UserError
from ds4deploy.recipe import Recipe


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=value`` lines of a docker env file; blank lines and ``#`` comments are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def read_api_key(recipe: Recipe) -> str | None:
    """The deployed API key of `recipe` on this host, or None when the recipe serves without one.

    Raises:
        UserError: auth is on but the key file is missing or unreadable (not deployed yet, or not root).
    """
    if recipe.serving.auth.mode != "api_key":
        return None
    path = Path(recipe.key_file)
    try:
        key = parse_env_file(path.read_text()).get("VLLM_API_KEY")
    except OSError as exc:
        raise UserError(f"cannot read the API key file {path}: {exc.strerror}",
                        "deploy the recipe first (`make deploy`), and run as root") from None
    if not key:
        raise UserError(f"{path} has no VLLM_API_KEY= line", f"delete {path} and deploy again to regenerate it")
    return key
