"""recipes/README.md: the recipe index, generated from the recipes (and the locks committed beside them).

One row per recipe file: the hardware it was proven on, the model, the engine, the nodes, the expected decode rate
from the recipe's own reference figures (``expected.decode_tok_s``, else the single-session decode cells of
``expected.table``, the reference system's published table), whether it serves on this project's own CI machine or
needs the hardware, and the steps an owner of that hardware still has to take, derived from what is committed:
the model manifest (`ds4deploy.model.manifest.manifest_path`), the image artifact lock (`ds4deploy.build.artifacts`), an
inventory of the nodes. `ds4deploy recipe index` writes it; ``--check`` (and tests/unit/test_recipe_index.py) fails
when the committed file is stale.

Gateway recipes (``recipes/gateways/*.yaml``, docs/gateway.md) get a table of their own below the stacks: name,
backends (the recipe and host, or the URL, of each), the model names served, how many people hold a key, and the
front door's address and port.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe import paths as recipe_paths
from ds4deploy.recipe.load import load_recipe, split_variant
from ds4deploy.recipe.schema import GatewayRecipe, Recipe

# Metrics that are one session's decode rate (tok/s): vLLM's per-request decode rate and the per-session output
# rate at concurrency 1 are the same figure (ds4deploy.bench.metrics).
DECODE_METRICS = ("decode_tok_s", "per_session_tok_s")
LOCAL_INVENTORY = "ansible/inventories/local.yml"
TWO_NODE_INVENTORY = "ansible/inventories/two-node-local.yml"


def index_path() -> Path:
    """Where the index lives: recipes/README.md."""
    return recipe_paths.RECIPES_DIR / "README.md"


def _hardware(r: Recipe) -> str:
    g = r.hardware.gpus
    gpus = f"{g.count}x {g.model or g.arch}" if g.count else "no GPU"
    per_node = f"{gpus}, {r.hardware.cpu.arch}, {r.hardware.min_ram_gib:g} GiB RAM"
    return per_node if r.hardware.nodes == 1 else f"{r.hardware.nodes} nodes of: {per_node}"


def _model(r: Recipe) -> str:
    m = r.model
    quant = f", {m.quantization}" if m.quantization else ""
    if m.source == "hub":
        return f"{m.repo_id}@{m.revision}{quant}, {m.size_on_disk_gb:g} GB"
    if m.source == "local":
        return f"{m.served_name} (local files{quant}), {m.size_on_disk_gb:g} GB"
    if m.gguf is not None:
        return f"{m.served_name} (generated tiny deepseek4 GGUF, {m.gguf.parts} parts)"
    return f"{m.served_name} (generated tiny checkpoint)"


def _engine(r: Recipe) -> str:
    version = r.engine.version
    return f"{r.engine.name} {version[:16] if version.startswith('git-') else version}"


def _parallel(r: Recipe) -> str:
    p = r.parallelism
    shape = f"TP {p.tensor} x PP {p.pipeline}"
    return f"{p.nodes} ({shape}{f', {p.data} replicas' if p.data > 1 else ''})"


def expected_decode(r: Recipe) -> str:
    """The recipe's expected single-session decode rate, tok/s: its ``decode_tok_s`` range, else the lowest and
    highest single-session decode cells of its reference table; "-" when it has none. Labelled as the owner's when
    the engine is not public."""
    from ds4deploy.engines.engine_registry import load_registry

    e = r.expected
    registry = load_registry(r)
    # Figures of an engine that is not public are the owner's, for a build nobody else can run.
    whose = " (reported by the owner, unpublished build)" if registry is not None and not registry.public else ""
    if e.decode_tok_s is not None:
        return f"{e.decode_tok_s.low:g}-{e.decode_tok_s.high:g}{whose}"
    cells = sorted(c.value for c in e.table if c.metric in DECODE_METRICS and c.concurrency == 1)
    if not cells:
        return "-"
    return (f"{cells[0]:g}" if cells[0] == cells[-1] else f"{cells[0]:g}-{cells[-1]:g}") + whose


# GPU recipes whose real `make deploy` `make test` rehearses on stand-in nodes (tests/rehearse: only the hardware
# stood in; `make rehearse RECIPE=<name>` runs one).
REHEARSED = frozenset({"gx10x2-ds4-flash-fp8", "rtx3090x2-xeon-ds4-flash", "v100x8-ds41-flash-iq2"})


def status(r: Recipe) -> str:
    """``serves here`` for recipes that need no GPU (`make test` deploys the cpu recipes on the CI machine);
    ``rehearsed here, needs the hardware`` for those in `REHEARSED`; else ``needs the hardware``. Then, when it
    applies: ``engine not public: <why>`` (the engine's registry, `ds4deploy.engines.engine_registry`). How many
    full-length sessions the KV cache holds is the estimator's column (`ds4deploy.plan.estimate.index_cell`).

    A llama.cpp recipe on GPUs adds where its argv meets the real engine here: the CPU build of llama-server on a
    tiny same-layout GGUF (`make llamacpp`, tests/llamacpp); cpu-llamacpp deploys here (`make e2e-llamacpp`)."""
    from ds4deploy.engines.engine_registry import load_registry

    if r.hardware.gpus.count == 0:
        where = "serves here"
    else:
        where = "rehearsed here, needs the hardware" if r.base_name in REHEARSED else "needs the hardware"
    notes = [where]
    if r.engine.family == "llamacpp" and r.hardware.gpus.count:
        notes.append("argv served by the CPU engine here (`make llamacpp`)")
    registry = load_registry(r)
    if registry is not None and not registry.public:
        notes.append(f"engine not public: {registry.not_public_why}")
    return "; ".join(notes)


def owner_steps(r: Recipe) -> list[str]:
    """What an owner of the hardware still has to do before `make deploy`, from what is committed now."""
    from ds4deploy.build.artifacts import image_artifacts, lock_path, owner_base_image, pinned_base_id
    from ds4deploy.engines.engine_registry import load_registry
    from ds4deploy.model.manifest import manifest_path

    name = r.base_name
    steps = []
    registry = load_registry(r)
    if registry is not None and not registry.public:
        steps.append(f"supply the engine: load (`docker load`) or pull the image of your own engine on each node and "
                     f"tag it {r.engine.image.base_image} (the recipe's engine.image.base_image; it is not public)")
    if (owner := owner_base_image(r)) is not None and pinned_base_id(r) is None:
        steps.append(f"pin that image: `ds4deploy image lock {name}` on a node that holds {owner} (records its "
                         f"image ID; every node and build is checked against it), commit recipes/{name}.lock.json")
    inventory = ""
    if r.container.node_network is not None:
        # Nodes that are containers on one Docker host: the committed two-node inventory runs them here.
        inventory = f" INVENTORY={TWO_NODE_INVENTORY}"
    elif r.hardware.gpus.count or r.hardware.nodes > 1:
        start = TWO_NODE_INVENTORY + " (ds4_node_rank, ds4_host_ip)" if r.hardware.nodes > 1 else LOCAL_INVENTORY
        steps.append(f"write an Ansible inventory of your {r.hardware.nodes} node(s) (`ansible_host` per machine; "
                     f"start from {start}) and check it: `ds4deploy preflight {name} --inventory <file>`")
        inventory = " INVENTORY=<file>"
    if not manifest_path(r).is_file():
        if r.model.source == "local":
            steps.append(f"lock the model from your copy: `ds4deploy model lock {name} --from <file or dir>`, commit "
                         f"recipes/{name}.manifest.json; deploy with `MODEL_FROM=<file or dir>` (or copy the files to "
                         f"{r.model.path} on each node)")
        elif r.model.source == "hub":
            how = (f"resolves {r.model.revision} to its full commit" if len(r.model.revision or "") < 40
                   else "records every file's digest from the hub; the first deploy would too")
            steps.append(f"lock the model: `ds4deploy model lock {name}` ({how}), commit "
                         f"recipes/{name}.manifest.json")
    arts = image_artifacts(r)
    if arts and not lock_path(r).is_file():
        names = ", ".join(a.name for a in arts)
        steps.append(f"lock the image artifacts ({names}): `ds4deploy image lock {name}` (`--artifact "
                     f"{arts[0].name}=<file>` when {arts[0].url.split('/')[2]} is unreachable), commit "
                     f"recipes/{name}.lock.json")
    steps.append(f"`make deploy RECIPE={name}{inventory}`")
    return steps


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _gateway_backends(gw: GatewayRecipe) -> str:
    """A gateway's backends as the index shows them: ``box-a: cpu--lan at http://box-a.office.lan:8000`` (the
    URL the router uses, derived from the recipe's serving.port) or ``a: http://10.0.0.5:8000 (office-tiny)``."""
    from ds4deploy.render.gateway import resolve_backends

    urls = {b.name: b.url for b in resolve_backends(gw)}
    # A variant (<recipe>--<variant>) links its base recipe's file, where its variants: section is.
    return "; ".join(f"{b.name}: [{b.recipe}]({split_variant(b.recipe)[0]}.yaml) at {urls[b.name]}"
                     if b.recipe is not None else f"{b.name}: {b.url} ({', '.join(b.models)})" for b in gw.backends)


def gateway_lines(gateways: list[GatewayRecipe]) -> list[str]:
    """The index's gateway section: one row per gateway recipe (name, backends, models, people, front door
    address:port, routing policy); no section when there are none."""
    if not gateways:
        return []
    lines = [
        "",
        "## Gateways",
        "",
        "One URL and one key per person in front of several deployments (`recipes/gateways/*.yaml`, "
        "[docs/gateway.md](../docs/gateway.md)); `ds4deploy gateway render` writes compose/gateways/<name>/.",
        "",
        "| Gateway | Backends | Models | People | Front door | Routing |",
        "|---|---|---|---|---|---|",
    ]
    for gw in gateways:
        row = [f"[{gw.name}](gateways/{gw.name}.yaml)", _gateway_backends(gw),
               ", ".join(gw.models), str(len(gw.people)), f"{gw.bind_address}:{gw.port}",
               (f"smg {gw.routing.policy}, sticky on {gw.routing.session_header}" if gw.routing.router == "smg"
                else f"{gw.routing.router}, consistent hash on {gw.routing.session_header}")]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def load_gateways() -> list[GatewayRecipe]:
    """Every gateway recipe under recipes/gateways/, each loaded and checked against the recipes it names.

    Raises:
        UserError: the first gateway recipe that is refused (`ds4deploy.render.gateway.load_gateway`).
    """
    from ds4deploy.render import gateway

    return [gateway.load_gateway(n) for n in gateway.gateway_names()]


def index_markdown(recipes: list[Recipe] | None = None, predict: Callable[[Recipe], str] | None = None,
                   gateways: list[GatewayRecipe] | None = None) -> str:
    """The whole recipes/README.md text (variants are listed with their recipe, not as rows; gateway recipes in a
    section of their own, all of recipes/gateways/ when `gateways` is None). `predict` gives the
    "Predicted" column (``ds4deploy.plan.estimate.index_cell``: single-session decode and resident full-length
    sessions); this layer cannot import the estimator, so the caller passes it."""
    if recipes is None:
        recipes = [load_recipe(p) for p in sorted(recipe_paths.RECIPES_DIR.glob("*.yaml"))]
    if gateways is None:
        gateways = load_gateways()
    lines = [
        "# Recipes",
        "",
        "<!-- Generated by `ds4deploy recipe index` from recipes/*.yaml, the manifests and locks beside them and "
        "recipes/gateways/*.yaml; do not edit. -->",
        "",
        "One YAML per deployment. Expected decode is one session's output rate in tok/s from the recipe's own "
        "reference figures (`expected` in the YAML, with their sources). Predicted: `ds4deploy estimate`'s "
        "single-session decode tok/s at a 1,024-token prompt and how many full-length (max_model_len) sessions the "
        "KV cache holds of max_num_seqs (docs/estimator.md). *serves here*: deployed and tested on this "
        "project's CI machine by `make test`; *rehearsed here*: `make test` runs its real `make deploy` on stand-in "
        "nodes made on that machine, with only the hardware stood in (`make rehearse RECIPE=<name>`, "
        "tests/rehearse); *argv served by the CPU engine here*: `make test` (`make llamacpp`) runs the recipe's "
        "exact llama-server argv in the real CPU engine on a tiny GGUF of the model's architecture and file layout "
        "(tests/llamacpp); *needs the "
        "hardware*: the steps are what an owner of that hardware still has to do, in order.",
        "",
        "| Recipe | Hardware (per node) | Model | Engine | Nodes | Expected decode tok/s | Predicted decode tok/s; "
        "sessions | Status | Steps for an owner |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recipes:
        variants = f" (variants: {', '.join(sorted(r.variants))})" if r.variants else ""
        steps = " ".join(f"{i}. {s}" for i, s in enumerate(owner_steps(r), 1))
        row = [f"[{r.name}]({r.name}.yaml){variants}", _hardware(r), _model(r), _engine(r), _parallel(r),
               expected_decode(r), predict(r) if predict else "-", status(r), steps]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines += gateway_lines(gateways)
    return "\n".join(lines) + "\n"


def check_inputs(recipes: list[Recipe]) -> None:
    """Read every input the index is generated from, through the same readers a deploy uses, before anything is
    written: each recipe with its variants (`load_recipe` validates them), each committed model manifest
    (`ds4deploy.model.manifest.load_manifest`) and image lock (`ds4deploy.build.artifacts.load_lock`).

    Raises:
        UserError: the first input that is invalid, named with its file and the fix.
    """
    from ds4deploy.build.artifacts import load_lock
    from ds4deploy.model.manifest import load_manifest, manifest_path

    for r in recipes:
        if manifest_path(r).is_file():
            load_manifest(r)
        load_lock(r)


def write_or_check(check: bool, predict: Callable[[Recipe], str] | None = None) -> str:
    """Write recipes/README.md, or with `check` compare it with what the recipes generate (`predict` as in
    `index_markdown`).

    Returns:
        A one-line report.
    Raises:
        UserError: code 1 with `check` when the committed index is missing or stale.
    """
    path = index_path()
    recipes = [load_recipe(p) for p in sorted(recipe_paths.RECIPES_DIR.glob("*.yaml"))]
    check_inputs(recipes)
    text = index_markdown(recipes, predict, load_gateways())
    if check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            raise UserError(f"{path} is {'stale' if path.is_file() else 'missing'}: it differs from what the recipes "
                            "(and their committed manifests and locks) generate",
                            "run `ds4deploy recipe index` and commit recipes/README.md", code=1)
        return f"{path} is fresh"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)  # never half-written: the old index stays until the new one is complete
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not write {path}: {exc.strerror or exc}", f"make {path.parent} writable") from None
    return f"wrote {path}"
