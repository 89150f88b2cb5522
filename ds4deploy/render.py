"""Render every deployment artifact of a recipe, and check committed renders are fresh.

Templates live in ds4deploy/templates and render in a sandboxed jinja2 environment with StrictUndefined: a name
the template uses but the recipe lacks is an error, never an empty string. Output goes to
``compose/<recipe>/``:

- ``compose.yaml``: the docker compose stack (works with plain ``docker compose up`` on one host)
- ``engine.env``: the engine's non-secret environment
- ``engine-args.json``: the engine's argv after the entrypoint (what tests and the bench read)
- ``deploy-vars.yml``: the Ansible variables the roles and host checks read
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from jinja2 import PackageLoader, StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from ds4deploy.engine_args import CONTAINER_MODEL_DIR, engine_args
from ds4deploy.errors import UserError
from ds4deploy.net import base_url, url_host
from ds4deploy.recipe import REPO_ROOT, Recipe

# $DS4_COMPOSE_DIR renders elsewhere (tests, private recipes); the committed renders live in compose/.
# Healthcheck cadence for every engine: probe /health every 10 s, give each probe 6 s (vLLM answers /health in
# milliseconds unless the engine is wedged), declare unhealthy after 3 misses; the model-load grace is the recipe's
# container.start_period_s. Values follow Docker's healthcheck defaults scaled for a slow CPU host.
HEALTHCHECK = {"interval_s": 10, "timeout_s": 6, "retries": 3}

COMPOSE_DIR = Path(os.environ.get("DS4_COMPOSE_DIR") or REPO_ROOT / "compose")

_ENV = SandboxedEnvironment(
    loader=PackageLoader("ds4deploy", "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # output is YAML and env files, not HTML
)


def project_name(recipe: Recipe) -> str:
    """Docker compose project name for a recipe (``ds4-<name>``)."""
    return f"ds4-{recipe.name}"


def recipe_sha256(recipe: Recipe) -> str:
    """sha256 of the recipe file's bytes: labels the containers so a changed recipe is visible on the host."""
    return hashlib.sha256(recipe.source_path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Rendered:
    """One recipe's artifacts: file name -> text."""

    recipe: str
    files: dict[str, str]


def render(recipe: Recipe) -> Rendered:
    """Render all artifacts for `recipe` in memory.

    Raises:
        UserError: a template refers to something the recipe does not define.
    """
    args = engine_args(recipe)
    # The healthcheck probes from inside the container: loopback with bridge networking (the engine listens on all
    # container interfaces), the bound address itself with host networking.
    probe = "127.0.0.1" if recipe.serving.network_mode == "bridge" else recipe.serving.bind_address
    ctx = {
        "recipe": recipe,
        "project": project_name(recipe),
        "recipe_sha256": recipe_sha256(recipe),
        "command": [*recipe.engine.entrypoint, *args],
        "container_model_dir": CONTAINER_MODEL_DIR,
        "bind_host": url_host(recipe.serving.bind_address),
        "health_url": f"{base_url(probe, recipe.serving.port)}/health",
        "health": HEALTHCHECK,
    }
    files: dict[str, str] = {}
    try:
        for out, tpl in (
            ("compose.yaml", "compose.yaml.j2"),
            ("engine.env", "engine.env.j2"),
            ("deploy-vars.yml", "deploy-vars.yml.j2"),
        ):
            files[out] = _ENV.get_template(tpl).render(ctx)
    except TemplateError as exc:
        raise UserError(
            f"rendering recipe '{recipe.name}' failed: {exc}",
            "the recipe lacks a value a template needs; compare it with recipes/cpu.yaml",
        ) from None
    files["engine-args.json"] = json.dumps(args, indent=2) + "\n"
    return Rendered(recipe.name, files)


def write(rendered: Rendered, root: Path = COMPOSE_DIR) -> list[Path]:
    """Write a render under ``root/<recipe>/``, replacing stale files. Returns the paths that changed."""
    out_dir = root / rendered.recipe
    out_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in sorted(rendered.files.items()):
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def orphans(known: list[str], root: Path = COMPOSE_DIR) -> list[str]:
    """Render directories under `root` whose recipe no longer exists (a deleted or renamed recipe)."""
    if not root.is_dir():
        return []
    return [f"{(root / d.name).relative_to(root.parent)}/ has no recipe" for d in sorted(root.iterdir())
            if d.is_dir() and d.name not in known]


def stale(rendered: Rendered, root: Path = COMPOSE_DIR) -> list[str]:
    """Names of files under ``root/<recipe>/`` that are missing, differ from `rendered`, or are not produced by
    the render at all (left over from an older render)."""
    out_dir = root / rendered.recipe
    problems = []
    for name, text in sorted(rendered.files.items()):
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{path.relative_to(root.parent)} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path.relative_to(root.parent)} differs from the recipe")
    if out_dir.is_dir():
        for extra in sorted(p.name for p in out_dir.iterdir() if p.name not in rendered.files):
            problems.append(f"{(out_dir / extra).relative_to(root.parent)} is not produced by the recipe")
    return problems
