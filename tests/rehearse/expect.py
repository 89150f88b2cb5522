"""What the stand-in engine (tests/rehearse/standin/engine.py) checks, read from a recipe's committed render.

`expectations(recipe, model_files)` reads compose/<recipe>/compose*.yaml and deploy-vars.yml as committed (not a
fresh render: the deploy applies the committed files) and returns, per node role (compose file), the engine
service's command, environment, volume targets and modes, devices, ulimits and GPU reservation, plus the served
name, the worker's ready marker and the master port.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ds4deploy.engines import engine_args_start
from ds4deploy.recipe.schema import Recipe
from ds4deploy.render.compose import COMPOSE_DIR


def _volumes(service: dict) -> dict[str, str]:
    """Container path -> "ro" or "rw" for every volume of `service` (compose short syntax)."""
    out = {}
    for vol in service.get("volumes", []):
        parts = vol.split(":") if isinstance(vol, str) else [vol["source"], vol["target"]]
        # "${DS4_MODEL_DIR:-/path}:/model:ro": the interpolation itself holds a ':'.
        if parts[0].startswith("${") and not parts[0].endswith("}"):
            parts = [parts[0] + ":" + parts[1], *parts[2:]]
        out[parts[1]] = parts[2] if len(parts) > 2 else "rw"
    return out


def _gpus(service: dict) -> bool:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return any(d.get("driver") == "nvidia" for d in devices)


def expectations(recipe: Recipe, model_files: list[str], compose_dir: Path = COMPOSE_DIR) -> dict:
    """The stand-in's expect.json for `recipe` (see the module docstring); `model_files` must be under /model."""
    render = compose_dir / recipe.name
    deploy_vars = yaml.safe_load((render / "deploy-vars.yml").read_text())
    roles = {}
    for file in deploy_vars["ds4_compose_files"]:
        engine = yaml.safe_load((render / file).read_text())["services"]["engine"]
        command = list(engine["command"])
        roles[file] = {
            "command": command,
            "engine_args_from": engine_args_start(recipe, command),
            "environment": {k: str(v) for k, v in engine.get("environment", {}).items()},
            "api_key": bool(engine.get("env_file")),
            "gpus": _gpus(engine),
            "volumes": _volumes(engine),
            "devices": [d.split(":")[1] for d in engine.get("devices", [])],
            "ulimits": {k: v for k, v in engine.get("ulimits", {}).items() if k in ("memlock", "stack")},
            "worker": "--headless" in command,
        }
    return {
        "recipe": recipe.name,
        "served_name": recipe.model.served_name,
        "worker_ready_log": deploy_vars.get("ds4_worker_ready_log") or "",
        "master_port": deploy_vars.get("ds4_master_port") if deploy_vars["ds4_nodes"] > 1 else None,
        "model_files": sorted(model_files),
        "roles": roles,
    }
