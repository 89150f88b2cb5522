"""Every variable an Ansible play reads, from the validated recipe and inventory: one function, one file per run.

Recipe values reach Ansible one way: `write_play_vars` validates the recipe and the inventory once, at the start
of a run, and writes the result of `play_vars` to ``.cache/vars/<recipe>.<scope>.yml`` on the control host; the
first play of every playbook (ansible/nodes-plan.yml) loads that file on every node. Nothing else carries recipe
values into a play (no second vars file, no facts one role sets for another).

What is checked depends on what the run does (`SCOPES`); `check_run` is the one list of these checks, which
`ds4deploy preflight` runs too (then ansible/preflight.yml reads the nodes, as the deploy does before changing one):

- ``deploy`` (site.yml, ``make deploy``): the committed render is fresh and Docker Compose accepts it, every
  preflight rule passes (`ds4deploy.plan.preflight`, which includes the rail-address rule, `rail_problems`), the GPU
  settings are possible per the datasheet, the model can be staged as the recipe says (`ds4deploy.model.staging.
  check_source`: a local model's manifest or MODEL_FROM), an air-gapped bundle matches (online: every locked
  download of the image build is at hand or its URL answers, `ds4deploy.build.artifacts.check_obtainable`, an
  owner-supplied base image has its image ID in the lock, `ds4deploy.build.artifacts.locked_base_image`, which the
  preflight role compares with each node's image, and a hub
  model's
  pin resolves to the committed manifest's commit, whose files the hub records alike, `ds4deploy.model.fetch.
  check_hub_pin`), and the inventory fits the recipe's nodes (`ds4deploy.plan.nodes.plan`);
- ``provision`` (provision.yml alone): the preflight rules and the GPU settings (provisioning starts no engine, so
  neither the render nor the node plan is needed);
- ``operate`` (status.yml, down.yml, restart.yml): the node plan only; a stack already deployed can always be
  looked at, stopped or restarted.

In every scope, the inventory's per-node rail names are checked first (`ds4deploy.plan.node_fabric.check_hosts`: a
host may cable other ports than the recipe names).

The variables (`play_vars`) are the recipe's render (compose/<recipe>/deploy-vars.yml, rendered in memory and, for
``deploy``, proven equal to the committed file), the provisioning values (`provision_vars`), each node's own rails
(``ds4_fabric_node_rails``, host name -> rails with that host's netdev and HCA names, and ``ds4_node_rails``, a
template Ansible resolves per host to its own list: the rails role and the GID index module read it; the checks
derive the same from the inventory) and, outside ``provision``, the node plan: ``ds4_node_plan`` (host name ->
`ds4deploy.plan.nodes.Node` fields and its launch env) and ``ds4_node``, a template Ansible resolves per host to that
host's entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ds4deploy.core.errors import UserError
from ds4deploy.core.keys import KEY_PATTERN, KEY_RULE
from ds4deploy.plan import node_fabric, preflight
from ds4deploy.plan.check_inputs import DRIVER_FOR_CUDA, datasheet_for, gpu_request_problems
from ds4deploy.plan.nodes import as_facts, plan
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.recipe.schema import Recipe
from ds4deploy.render import compose as render

SCOPES = ("deploy", "provision", "operate")
VARS_DIR = REPO_ROOT / ".cache" / "vars"
# Resolved by Ansible on each host: that host's entry of the node plan.
NODE_TEMPLATE = "{{ ds4_node_plan[inventory_hostname] }}"
# Resolved by Ansible on each host: that host's own rails (none for a recipe without a fabric).
NODE_RAILS_TEMPLATE = "{{ ds4_fabric_node_rails[inventory_hostname] | default([]) }}"


def provision_vars(recipe: Recipe) -> dict[str, Any]:
    """The ``ds4_*`` variables the provisioning roles read beyond the render (JSON/YAML-serialisable).

    Keys (units in the names): ds4_gpu_model, ds4_gpu_unified_memory, ds4_gpu_power_limit_w,
    ds4_gpu_clock_lock_mhz, ds4_gpu_clock_cap_mhz, ds4_gpu_max_graphics_mhz (datasheet, or null),
    ds4_driver_min_version / ds4_driver_source (from engine.cuda's major version, or null), ds4_known_bad_kernels
    (list of {release, reason, source}), ds4_numa_nodes, ds4_ram_per_numa_gib, ds4_memlock_unlimited,
    ds4_container_uid / ds4_container_gid (engine.image.user), ds4_fabric_rails (the recipe's rails, list of
    {name, netdev, hcas, subnet, prefix, mtu}; each node's own are ds4_node_rails, `play_vars`),
    ds4_fabric_master_port, ds4_fabric_nccl_ib_hca (the recipe's names), ds4_fabric_min_rail_gbit_s.
    """
    g, hw = recipe.hardware.gpus, recipe.hardware
    sheet = datasheet_for(g.model)
    cuda_major = recipe.engine.cuda.cudart.split(".")[0] if recipe.engine.cuda else None
    driver = DRIVER_FOR_CUDA.get(cuda_major) if cuda_major else None
    uid, _, gid = recipe.engine.image.user.partition(":")
    fabric = recipe.fabric
    return {
        "ds4_gpu_model": g.model,
        "ds4_gpu_unified_memory": g.unified_memory,
        "ds4_gpu_power_limit_w": g.power_limit_w,
        "ds4_gpu_clock_lock_mhz": g.graphics_clock_lock_mhz,
        "ds4_gpu_clock_cap_mhz": g.graphics_clock_cap_mhz,
        "ds4_gpu_max_graphics_mhz": sheet.max_graphics_mhz if sheet else None,
        "ds4_driver_min_version": driver[0] if driver else None,
        "ds4_driver_source": driver[1] if driver else None,
        "ds4_known_bad_kernels": [k.model_dump() for k in hw.known_bad_kernels],
        "ds4_numa_nodes": hw.numa_nodes,
        "ds4_ram_per_numa_gib": hw.ram_per_numa_gib,
        "ds4_memlock_unlimited": recipe.container.memlock_unlimited,
        "ds4_container_uid": int(uid) if uid.isdigit() else 0,
        "ds4_container_gid": int(gid) if gid.isdigit() else 0,
        "ds4_fabric_rails": node_fabric.as_ansible(fabric.rails if fabric else []),
        "ds4_fabric_master_port": fabric.master_port if fabric else None,
        "ds4_fabric_nccl_ib_hca": list(fabric.nccl_ib_hca) if fabric else [],
        "ds4_fabric_min_rail_gbit_s": fabric.min_rail_gbit_s if fabric else None,
    }


def play_vars(recipe: Recipe, hosts: dict[str, dict], scope: str = "deploy",
              rendered: render.Rendered | None = None) -> dict[str, Any]:
    """Every variable the plays of `scope` read, for `recipe` on the inventory `hosts`.

    Args:
        recipe: the validated recipe.
        hosts: host name -> host vars (`ds4deploy.plan.inventory.read_inventory`).
        scope: one of `SCOPES`; ``provision`` leaves out the node plan.
        rendered: the recipe's render when the caller has it (default: rendered here, in memory).

    Returns:
        The render's deploy-vars.yml values, `provision_vars`, ``ds4_fabric_node_rails`` / ``ds4_node_rails`` (each
        host's own rails, `ds4deploy.plan.node_fabric.node_rails`), ``ds4_image_base_id`` (``deploy``: the locked
        image ID of an owner-supplied base image, else null), ``ds4_key_pattern`` (the form of a key, a POSIX ERE:
        `ds4deploy.core.keys.KEY_PATTERN`), ``ds4_key_rule`` (the same in words, for messages) and (outside
        ``provision``) ``ds4_node_plan`` and ``ds4_node``.

    Raises:
        UserError: the recipe cannot be rendered, a host's rail names are wrong (`ds4deploy.plan.node_fabric`), or
            (outside ``provision``) the inventory does not fit its nodes.
    """
    node_fabric.check_hosts(recipe, hosts)
    rendered = rendered or render.render(recipe)
    out = {**yaml.safe_load(rendered.files["deploy-vars.yml"]), **provision_vars(recipe)}
    out["ds4_fabric_node_rails"] = ({name: node_fabric.as_ansible(node_fabric.node_rails(recipe, name, hv))
                                     for name, hv in hosts.items()} if recipe.fabric is not None else {})
    out["ds4_node_rails"] = NODE_RAILS_TEMPLATE
    # The locked image ID of an owner-supplied base image (ds4deploy.build.artifacts.owner_base_image), which the
    # preflight role compares with each node's image before any node is changed; null for a public base.
    from ds4deploy.build.artifacts import pinned_base_id

    out["ds4_image_base_id"] = pinned_base_id(recipe) if scope == "deploy" else None
    # The form of a key (ds4deploy/core/keys.py, the one source): the preflight checks a backend's gateway key with it.
    out["ds4_key_pattern"] = KEY_PATTERN
    out["ds4_key_rule"] = KEY_RULE
    if scope != "provision":
        out["ds4_node_plan"] = as_facts(plan(recipe, hosts))
        out["ds4_node"] = NODE_TEMPLATE
    return out


class InputsRefused(UserError):
    """A recipe and inventory a run refuses (`check_inputs`); `verdicts` are every preflight rule's, for the table."""

    def __init__(self, cause: str, fix: str, verdicts: list[preflight.Verdict]) -> None:
        super().__init__(cause, fix)
        self.verdicts = verdicts


def check_inputs(recipe: Recipe, hosts: dict[str, dict], inventory: str) -> None:
    """Every preflight rule (host facts included) passes and the datasheet allows the recipe's GPU settings.

    Raises:
        InputsRefused: one line per failed rule and refused GPU setting, with the preflight verdicts.
    """
    verdicts = preflight.run(recipe, hosts)
    problems = ([f"preflight {v.rule}: {v.numbers}; fix: {v.remediation} ({v.source})"
                 for v in verdicts if v.status == "fail"] + gpu_request_problems(recipe))
    if problems:
        raise InputsRefused(
            f"{len(problems)} problem(s) with recipe {recipe.name} and inventory {inventory}, nothing was changed on "
            "any host:\n  " + "\n  ".join(problems),
            "fix each one as listed (`ds4deploy preflight <recipe> --inventory <file>` shows every rule), then run "
            "again", verdicts)


def check_render(rendered: render.Rendered) -> None:
    """The committed render of the recipe equals `rendered` and the real Docker Compose accepts its compose files.

    Raises:
        UserError: (code 1) a committed file is stale, missing or left over; Compose refuses a file.
    """
    bad = render.stale(rendered)
    if bad:
        raise UserError("committed renders are stale:\n  " + "\n  ".join(bad),
                        "run `ds4deploy render` and commit compose/", code=1)
    for name in sorted(rendered.files):
        if name.startswith("compose") and name.endswith(".yaml"):
            render.compose_config(render.COMPOSE_DIR / rendered.recipe / name, fmt="quiet")


def check_run(recipe: Recipe, hosts: dict[str, dict] | None, scope: str, inventory: str,
              bundle: Path | None = None, model_from: Path | None = None) -> render.Rendered:
    """Every control-host check of a `scope` run (module docstring), in the deploy's order; reads no node.

    The one list of these checks: `write_play_vars` (every run) and `ds4deploy preflight` both call it.

    Args:
        recipe: the recipe (loaded, so schema-checked).
        hosts: the inventory's hosts and their variables; None when there is no inventory (`ds4deploy preflight`
            without one): then the node plan is not checked.
        scope: one of `SCOPES`.
        inventory: the inventory's path, for the messages.
        bundle: an air-gapped bundle directory to verify against the recipe (``deploy`` only).
        model_from: ``MODEL_FROM``: a local model's file or directory on the control host (``deploy`` only).

    Returns:
        The recipe's render (in memory).

    Raises:
        UserError: the first check that fails (`InputsRefused` for the rule book and the GPU settings).
    """
    if scope not in SCOPES:
        raise UserError(f"unknown scope {scope!r}", f"use one of {', '.join(SCOPES)}")
    if hosts is not None:  # the per-node rail names first, in every scope
        node_fabric.check_hosts(recipe, hosts, inventory)
    rendered = render.render(recipe)
    if scope == "deploy":
        check_render(rendered)
    if scope in ("deploy", "provision"):
        check_inputs(recipe, hosts or {}, inventory)
    if scope == "deploy":
        from ds4deploy.model.staging import check_source

        check_source(recipe, model_from)
    if scope == "deploy" and bundle is not None:
        from ds4deploy.plan.bundle import verify

        verify(bundle, recipe)
    elif scope == "deploy":  # online: the image build's downloads and a hub model's pin, asked before any node
        from ds4deploy.build.artifacts import check_obtainable
        from ds4deploy.build.image import default_wheel_dirs

        check_obtainable(recipe, default_wheel_dirs())
        from ds4deploy.build.artifacts import locked_base_image

        locked_base_image(recipe)  # an owner-supplied base image has an ID in the lock (each node compares its own)
        if recipe.model.source == "hub":
            from ds4deploy.model.fetch import check_hub_pin

            check_hub_pin(recipe)
    if scope != "provision" and hosts is not None:
        plan(recipe, hosts)
    return rendered


def write_play_vars(recipe: Recipe, hosts: dict[str, dict], scope: str, inventory: str,
                    bundle: Path | None = None, dest_dir: Path | None = None,
                    model_from: Path | None = None) -> Path:
    """Validate `recipe` and the inventory for `scope` (`check_run`), then write `play_vars` as YAML.

    Args:
        recipe: the recipe (loaded, so schema-checked).
        hosts: the inventory's hosts and their variables.
        scope: one of `SCOPES`.
        inventory: the inventory's path, for the messages.
        bundle: an air-gapped bundle directory to verify against the recipe (``deploy`` only).
        dest_dir: where to write (default `VARS_DIR`).
        model_from: ``MODEL_FROM`` of a local model (``deploy`` only; see `check_run`).

    Returns:
        The file written, ``<dest_dir>/<recipe>.<scope>.yml``; it is rewritten only when its text changes.

    Raises:
        UserError: any check of `scope` fails (the per-node rail names first, in every scope); nothing is written
            then.
    """
    rendered = check_run(recipe, hosts, scope, inventory, bundle, model_from)
    data = play_vars(recipe, hosts, scope, rendered)
    text = (f"# Every variable of a {scope} run of recipe {recipe.name} on {inventory}, written by `ds4deploy vars`\n"
            f"# (ds4deploy.plan.playvars) after the {scope} checks passed. Do not edit: every run rewrites it.\n"
            + yaml.safe_dump(data, sort_keys=True, allow_unicode=True))
    path = (dest_dir or VARS_DIR) / f"{recipe.name}.{scope}.yml"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path
