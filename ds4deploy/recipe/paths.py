"""Where recipes live: the repository root, the recipe directory ($DS4_RECIPES_DIR overrides it) and name lookup.

`RECIPES_DIR` is read at call time (``paths.RECIPES_DIR``), so tests and sites can point it elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from ds4deploy.core.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
# $DS4_RECIPES_DIR points the tool at another recipe directory (tests, a site's private recipes).
RECIPES_DIR = Path(os.environ.get("DS4_RECIPES_DIR") or REPO_ROOT / "recipes")


def resolve_recipe_path(name_or_path: str) -> Path:
    """Map a recipe name (``cpu``) or a path to the YAML file.

    Raises:
        UserError: no such recipe; the message lists the recipes that exist.
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if p.is_file():
            return p
    elif (RECIPES_DIR / f"{name_or_path}.yaml").is_file():
        return RECIPES_DIR / f"{name_or_path}.yaml"
    known = ", ".join(sorted(x.stem for x in RECIPES_DIR.glob("*.yaml"))) or "(none)"
    if (RECIPES_DIR / "gateways" / f"{name_or_path}.yaml").is_file():
        raise UserError(f"'{name_or_path}' is a gateway recipe (recipes/gateways/{name_or_path}.yaml), not a stack "
                        "recipe", f"use `ds4deploy gateway render {name_or_path}` or `make deploy RECIPE="
                        f"{name_or_path} INVENTORY=<file>`; stack recipes: {known}")
    raise UserError(f"no recipe named '{name_or_path}'", f"use one of: {known}, or a path to a recipe YAML")
