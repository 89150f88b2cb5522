"""The `ds4deploy` command line.

Exit codes: 0 success; 1 a check ran and failed (stale render, model mismatch); 2 could not run or bad input.
Every error the user can fix prints ``error: <cause>`` and ``fix: <fix>`` on stderr, with no traceback.
Commands that Ansible calls print one JSON object on stdout (``{"changed": ...}``) so tasks report changes
truthfully.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.plan.inventory import read_inventory


def cmd_recipe_validate(ns: argparse.Namespace) -> int:
    """Validate the named recipes (all and their variants when none are named), rendering each in memory so that
    derived values are checked too; exit 2 with every problem listed otherwise."""
    for r, _ in _load_all(ns.recipes, variants=True):
        print(f"ok: {r.name} ({r.engine.name} {r.engine.version}, {r.model.served_name})")
    return 0


def _load_all(names: list[str], variants: bool = False):
    """Every named recipe (all recipes and variants when none are named; with `variants`, a named base recipe's
    variants too), each loaded and rendered in memory.

    Returns:
        [(recipe, render)].
    Raises:
        UserError: one or more recipes are refused; the message lists every one, each with its cause and fix.
    """
    from ds4deploy.recipe.load import load_recipe
    from ds4deploy.recipe.paths import RECIPES_DIR
    from ds4deploy.recipe.schema import VARIANT_SEP
    from ds4deploy.render import compose as render

    if names:
        wanted = list(names)
    else:
        wanted = []
        for p in sorted(RECIPES_DIR.glob("*.yaml")):
            wanted.append(str(p))
    out, problems = [], []
    for n in wanted:
        try:
            r = load_recipe(n)
            out.append((r, render.render(r)))
            if not names or (variants and VARIANT_SEP not in r.name):
                for v in sorted(r.variants):
                    rv = load_recipe(r.source_path, variant=v) if names else load_recipe(f"{r.name}{VARIANT_SEP}{v}")
                    try:
                        out.append((rv, render.render(rv)))
                    except UserError as exc:
                        problems.append(f"variant {rv.name}: {exc.cause}\n    fix: {exc.fix}")
        except UserError as exc:
            problems.append(f"{exc.cause}\n    fix: {exc.fix}")
    if problems:
        raise UserError(f"{len(problems)} recipe(s) cannot be rendered; nothing was written:\n  "
                        + "\n  ".join(problems), "fix each recipe as listed, then render again")
    return out


def cmd_recipe_index(ns: argparse.Namespace) -> int:
    """Write recipes/README.md from the recipes, or with --check fail (exit 1) when the committed one is stale."""
    from ds4deploy.plan.estimate import index_cell
    from ds4deploy.render.index import write_or_check

    print(write_or_check(ns.check, index_cell))
    return 0


def cmd_recipe_reference(ns: argparse.Namespace) -> int:
    """Write docs/recipe-reference.md from the schema, or with --check fail (exit 1) when the committed one is
    stale; a schema field without a description is refused either way."""
    from ds4deploy.plan.reference import write_or_check

    print(write_or_check(ns.check))
    return 0


def cmd_render(ns: argparse.Namespace) -> int:
    """Render recipes into compose/<name>/ all or nothing, or with --check report stale, missing and orphaned
    renders and run the real `docker compose config` on every committed compose file."""
    from ds4deploy.render import compose as render

    loaded = _load_all(ns.recipes)
    for note in dict.fromkeys(n for _, out in loaded for n in out.notes):
        print(f"note: {note}", file=sys.stderr)
    if not ns.check:
        for path in render.write_all([out for _, out in loaded]):
            print(f"wrote {path.relative_to(render.COMPOSE_DIR.parent)}")
        return 0
    bad: list[str] = []
    if not ns.recipes:
        # compose/gateways/ holds the gateway renders (`ds4deploy gateway render --check` checks them).
        bad += render.orphans([r.name for r, _ in loaded] + ["gateways"])
    for _, out in loaded:
        bad += render.stale(out)
    if bad:
        raise UserError(
            "committed renders are stale:\n  " + "\n  ".join(bad),
            "run `ds4deploy render` and commit compose/",
            code=1,
        )
    for _, out in loaded:
        for name in render.compose_files_of(out):
            render.compose_config(render.COMPOSE_DIR / out.recipe / name, fmt="quiet")
    print("renders are fresh, and docker compose accepts every compose file")
    return 0


def cmd_model_generate(ns: argparse.Namespace) -> int:
    """Generate a 'generated' recipe's checkpoint (a llama.cpp recipe's tiny GGUF parts); prints {"changed", "files",
    "dest"}."""
    from ds4deploy.build.image import generated_chat_template
    from ds4deploy.model.generated import generate_model
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    dest = Path(ns.dest or recipe.model.path)
    changed = generate_model(recipe, dest, generated_chat_template(recipe))
    print(json.dumps({"changed": bool(changed), "files": changed, "dest": str(dest)}))
    return 0


def cmd_model_manifest(ns: argparse.Namespace) -> int:
    """Print the model manifest built from the model's own source (generator, hub metadata, or --from for a local
    model); ``--write`` records it as `ds4deploy model lock` does."""
    from ds4deploy.model.lock import build_manifest

    if ns.write:
        return cmd_model_lock(ns)
    from ds4deploy.build.image import generated_chat_template

    recipe = _load(ns.recipe)
    built = build_manifest(recipe, _from(ns), chat_template=generated_chat_template(recipe))
    sys.stdout.write(json.dumps(built, indent=2) + "\n")
    return 0


def cmd_model_lock(ns: argparse.Namespace) -> int:
    """Build the model manifest from its source and write recipes/<name>.manifest.json (to commit); a committed
    manifest that agrees is kept, one that disagrees stops (exit 1) naming each difference."""
    from ds4deploy.build.image import generated_chat_template
    from ds4deploy.model.lock import lock_model

    recipe = _load(ns.recipe)
    manifest, path, written = lock_model(recipe, _from(ns), chat_template=generated_chat_template(recipe))
    rev = f" at commit {manifest['revision']}" if manifest.get("revision") else ""
    size = sum(f["size"] for f in manifest["files"].values())
    print(f"{'wrote' if written else 'up to date:'} {path}: {len(manifest['files'])} file(s), {size / 1e9:.2f} GB"
          f"{rev}" + ("; commit it" if written else ""))
    return 0


def _load(name: str):
    from ds4deploy.recipe.load import load_recipe

    return load_recipe(name)


def _from(ns: argparse.Namespace) -> Path | None:
    """--from PATH, allowed only for ``source: local`` recipes (it names where the model's files are)."""
    src = getattr(ns, "from_path", None)
    if src is None:
        return None
    from ds4deploy.model.staging import check_source

    check_source(_load(ns.recipe), Path(src))
    return Path(src)


def cmd_model_verify(ns: argparse.Namespace) -> int:
    """Check a model directory against the committed manifest, in parallel, with a progress bar and a per-file table
    (stdout; ``--json`` prints one JSON object instead). Unchanged files verified before are taken from the sidecar
    (size, mtime, ctime, inode); ``--full`` re-hashes everything. Exit 1 naming each differing file."""
    from ds4deploy.model.manifest import load_manifest, manifest_path
    from ds4deploy.model.verify import byte_progress, results_table, verify_model
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    model_dir = Path(ns.dir or recipe.model.path)
    manifest = load_manifest(recipe)
    if not model_dir.is_dir():
        raise UserError(f"model directory {model_dir} does not exist",
                        f"fetch or stage the model first (`ds4deploy model fetch {recipe.name}`), or pass --dir")
    with byte_progress(f"verifying {model_dir.name}") as (on_total, on_bytes):
        report = verify_model(model_dir, manifest, full=ns.full, workers=ns.workers, on_total=on_total,
                              on_bytes=on_bytes)
    rate = report.bytes_hashed / report.seconds if report.seconds > 0 else 0.0
    if ns.json:
        print(json.dumps({"ok": report.ok, "dir": str(model_dir), "verified": sum(r.ok for r in report.results),
                          "counts": report.counts(), "bytes_hashed": report.bytes_hashed,
                          "seconds": round(report.seconds, 3), "bytes_per_s": round(rate), "workers": report.workers,
                          "files": {r.name: r.status for r in report.results}}))
    else:
        from rich.console import Console

        console = Console()
        console.print(results_table(report, f"{recipe.name}: {model_dir}"))
        c = report.counts()
        console.print(f"{sum(r.ok for r in report.results)}/{len(report.results)} verified "
                      f"({c.get('cached', 0)} from the sidecar), {report.bytes_hashed / 1e9:.2f} GB hashed in "
                      f"{report.seconds:.2f} s ({rate / 1e9:.2f} GB/s, {report.workers} threads)")
    if not report.ok:
        raise UserError(
            f"model in {model_dir} does not match {manifest_path(recipe).name}:\n  " + "\n  ".join(report.problems()),
            f"remove the named files (or {model_dir}) and fetch or deploy again",
            code=1,
        )
    return 0


def cmd_model_fetch(ns: argparse.Namespace) -> int:
    """Download a 'hub' recipe's pinned revision into --dest (default: model.path), placing only files whose hash
    matches the committed manifest; prints {"dest", "commit", "fetched", "present"}."""
    from ds4deploy.model.fetch import fetch_model
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    if recipe.model.source != "hub":
        raise UserError(f"recipe '{recipe.name}' has model.source '{recipe.model.source}', not 'hub'",
                        "use `ds4deploy model generate` for generated models; `ds4deploy model lock --from` for "
                        "local ones")
    res = fetch_model(recipe, Path(ns.dest or recipe.model.path), workers=ns.workers)
    print(json.dumps({"dest": str(res.dest), "commit": res.commit, "fetched": res.fetched,
                      "present": len(res.present)}))
    return 0


def cmd_model_stage(ns: argparse.Namespace) -> int:
    """Stage the model on the control host and print what every node's copy is checked against:
    ``{"changed", "dest", "copy_from", "sha256": {file: hex}, "manifest_written"}``.

    generated/hub: generate or fetch into --dest and verify it against the manifest; with no committed manifest,
    lock it first (`ds4deploy.model.lock`) and say on stderr where it was written. local: with --from, verify those
    files against the manifest (lock it from them first when none is committed) and name them in ``copy_from``;
    without --from the files are already on each node (``copy_from`` null) and only the nodes' copies are checked.
    """
    from ds4deploy.build.image import generated_chat_template
    from ds4deploy.model.lock import lock_model
    from ds4deploy.model.manifest import load_manifest, manifest_path

    recipe = _load(ns.recipe)
    src = _from(ns)
    template = generated_chat_template(recipe)  # a generated GGUF's embedded template (None for other models)
    written = None
    if manifest_path(recipe).is_file():
        manifest = load_manifest(recipe)
    elif recipe.model.source != "local" or src is not None:
        manifest, path, _ = lock_model(recipe, src, chat_template=template)
        written = str(path)
        print(f"ds4deploy: no manifest was committed for '{recipe.base_name}': wrote {path} from the model's own "
              "source; commit it so every later deploy is checked against it", file=sys.stderr)
    else:
        manifest = load_manifest(recipe)  # raises: names `model lock --from` as the fix
    if recipe.model.source == "local":  # staging.stage covers generated and hub models
        print(json.dumps({"changed": False, **_local_copy(recipe, manifest, src), "manifest_written": written}))
        return 0
    from ds4deploy.model.staging import stage

    out = stage(recipe, Path(ns.dest), chat_template=template)
    print(json.dumps({**out, "copy_from": out["dest"], "manifest_written": written}))
    return 0


def _local_copy(recipe, manifest: dict, src: Path | None) -> dict:
    """A local model's part of `model stage`: every file's sha256 from the manifest, and (with --from) the
    directory its files are copied from, after verifying them there in parallel.

    Raises:
        UserError: a manifest entry without sha256 (code 2); files under --from that differ from the manifest
            (code 1, each named).
    """
    from ds4deploy.model.lock import local_files
    from ds4deploy.model.manifest import manifest_path
    from ds4deploy.model.staging import local_sha256
    from ds4deploy.model.verify import byte_progress, verify_model

    name = manifest_path(recipe).name
    sha = local_sha256(recipe, manifest)
    if src is None:
        return {"dest": None, "copy_from": None, "sha256": sha}
    root, _ = local_files(src)
    with byte_progress(f"verifying {root.name}") as (on_total, on_bytes):
        report = verify_model(root, manifest, on_total=on_total, on_bytes=on_bytes)
    if not report.ok:
        raise UserError(f"the model files under {root} do not match {name} (the committed manifest wins):\n  "
                        + "\n  ".join(report.problems()),
                        f"point --from (MODEL_FROM=) at the copy {name} records, or, if the model changed on purpose, "
                        f"delete {name}, lock again and review the diff before committing", code=1)
    return {"dest": str(root), "copy_from": str(root), "sha256": sha}


def cmd_image_context(ns: argparse.Namespace) -> int:
    """Prepare an image build context; prints {"changed", "context", "image", "sha256", "local_base", "build_args",
    "base_image"} (base_image: the locked {ref, id} of an owner-supplied base, which each node checks before building;
    null for a public base)."""
    from ds4deploy.build.artifacts import locked_base_image
    from ds4deploy.build.image import LOCAL_BASE_IMAGE, build_args, context_digest, prepare_context
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    wheel_dirs = [Path(p) for p in ns.wheelhouse] if ns.wheelhouse else None
    ca = Path(ns.ca_bundle) if ns.ca_bundle else None
    changed = prepare_context(recipe, Path(ns.dest), wheel_dirs, ca)
    print(json.dumps({"changed": changed, "context": ns.dest, "image": recipe.image_ref,
                      "sha256": context_digest(recipe, Path(ns.dest)), "local_base": LOCAL_BASE_IMAGE,
                      "build_args": build_args(recipe), "base_image": locked_base_image(recipe)}))
    return 0


def cmd_image_lock(ns: argparse.Namespace) -> int:
    """Resolve every artifact the recipe's image build downloads (default URL, or --artifact NAME=URL|PATH), hash
    it, read the image ID of an owner-supplied base image on this host, and write recipes/<name>.lock.json; a
    committed lock that disagrees stops (exit 1) naming both digests."""
    from ds4deploy.build.artifacts import image_artifacts, lock_image, parse_sources

    recipe = _load(ns.recipe)
    lock, path, written = lock_image(recipe, parse_sources(ns.artifact or [], image_artifacts(recipe)))
    for name, e in lock["artifacts"].items():
        print(f"{name}: {e['file']} {e['size'] / 1e6:.1f} MB sha256 {e['sha256']}")
    if base := lock.get("base_image"):
        print(f"base image: {base['ref']} id {base['id']}"
              + (f" ({', '.join(base['repo_digests'])})" if base["repo_digests"] else ""))
    print(f"wrote {path}; commit it" if written else f"up to date: {path}")
    return 0


def _print_preflight(name: str, verdicts: list, show_all: bool, width: int, stderr: bool = False) -> None:
    """The preflight table of recipe `name` and its counts line, on stdout (or stderr)."""
    from rich.console import Console
    from rich.table import Table

    shown = [v for v in verdicts if show_all or v.status != "skip"]
    table = Table(title=f"preflight {name}", show_lines=False, expand=False)
    for col in ("rule", "verdict", "numbers", "remediation", "source"):
        table.add_column(col, overflow="fold")
    style = {"pass": "green", "fail": "bold red", "warn": "yellow", "unknown": "yellow", "skip": "dim"}
    for v in shown:
        table.add_row(v.rule, f"[{style[v.status]}]{v.status}[/]", v.numbers, v.remediation, v.source)
    console = Console(width=width, stderr=stderr)
    console.print(table)
    counts = {s: sum(v.status == s for v in verdicts) for s in ("pass", "fail", "warn", "unknown", "skip")}
    console.print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['unknown']} unknown, "
                  f"{counts['warn']} warnings, {counts['skip']} not applicable")


def cmd_preflight(ns: argparse.Namespace) -> int:
    """Run the preflight rule book, then every other check the deploy makes before it changes a node: exit 1 when a
    rule or a node check fails (unknown verdicts are shown, not fatal), 2 when the recipe cannot be deployed as it is
    (the deploy's own message).

    With --inventory the deploy's control-host checks (`ds4deploy.plan.playvars.check_run`, the node plan included) run,
    then ansible/preflight.yml reads every node (`ds4deploy.operate.node_checks`), unless --no-nodes; without one, the
    checks that need no inventory run and the output says the nodes were not read.
    """
    from ds4deploy.plan import preflight
    from ds4deploy.plan.playvars import check_run, write_play_vars
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    hosts = read_inventory(ns.inventory).hosts if ns.inventory else None
    verdicts = preflight.run(recipe, hosts)
    _print_preflight(recipe.name, verdicts, ns.all, ns.width)
    if preflight.Report(recipe.name, verdicts).exit_code:
        return 1
    model_from = Path(ns.model_from) if ns.model_from else None
    bundle = Path(ns.bundle) if ns.bundle else None
    if hosts is None or ns.no_nodes:
        check_run(recipe, hosts, "deploy", ns.inventory or "(none)", bundle, model_from)
        print("control-host checks of the deploy passed; nodes not read ("
              + ("--no-nodes" if hosts is not None else "pass --inventory: the deploy reads every node's CPU, RAM, "
                 "GPUs, disk and ports before it changes one") + ")")
        return 0
    from ds4deploy.operate.node_checks import read_nodes

    path = write_play_vars(recipe, hosts, "deploy", ns.inventory, bundle, model_from=model_from)
    print("control-host checks of the deploy passed; reading every node (ansible/preflight.yml, changes nothing)")
    return read_nodes(recipe.name, ns.inventory, path, model_from)


def cmd_estimate(ns: argparse.Namespace) -> int:
    """Capacity and speed of a recipe (`ds4deploy.plan.estimate`); exit 1 when one request of --context tokens
    (default max_model_len) cannot fit the KV cache. With --calibrate, the hardware constants fitted to an owner's
    bench run (--write keeps them in recipes/<recipe>.calibration.json)."""
    from ds4deploy.plan import estimate as est
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    if ns.calibrate:
        from ds4deploy.plan.estimate import calibrate

        cls = est.hw_class(recipe)
        try:
            before = est.constants_for(recipe)[1]
        except UserError:
            before = None
        fitted, cells = calibrate.calibrate(recipe, cls, Path(ns.calibrate))
        print("\n".join(calibrate.calibration_lines(recipe, cls, fitted, cells, before)))
        if ns.write:
            path = est.calibration_path(recipe)
            calibrate.write_calibration(path, cls, fitted, Path(ns.calibrate))
            print(f"wrote {path}; commit it")
        return 0
    # Every option is checked against its bound before anything is printed (`est.check_workload`).
    cap = est.capacity(recipe, ns.context)
    est.check_workload(cap, ns.prompt, ns.sessions, ns.output, ns.acceptance)
    print("\n".join(est.capacity_lines(cap)))
    if cap.kv.need is not None and cap.kv.available is not None and cap.kv.need > cap.kv.available:
        print(f"does not fit: one {cap.context:,}-token request needs more KV than the engine can allocate; the engine "
              "refuses to start (preflight rule kv-capacity)")
        return 1
    sp, source = est.speed(recipe, ns.prompt, ns.sessions, ns.output, ns.acceptance, cap=cap)
    print("\n".join(est.speed_lines(sp, source)))
    return 0


def cmd_summary(ns: argparse.Namespace) -> int:
    """Print the post-deploy summary (URL, model, key location)."""
    from ds4deploy.operate.summary import summary

    print(summary(ns.recipe, Path(ns.inventory) if ns.inventory else None))
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    """Print every node's containers, /health and (--logs N) engine log lines as docker printed them."""
    from ds4deploy.operate.status import status

    return status(ns.recipe, ns.inventory, ns.logs, ns.verbose)


def cmd_engine_venv(ns: argparse.Namespace) -> int:
    """Create .cache/engine-venv with the CPU engine's pins (vLLM's argument parser for the tests, bare bench)."""
    from ds4deploy.build.engine_venv import ensure_engine_venv
    from ds4deploy.recipe.load import load_recipe

    print(ensure_engine_venv(load_recipe(ns.recipe)))
    return 0


def cmd_bundle_create(ns: argparse.Namespace) -> int:
    """Write an air-gapped bundle for a recipe (see ds4deploy.plan.bundle); prints its bundle.json summary."""
    from ds4deploy.plan.bundle import create
    from ds4deploy.recipe.load import load_recipe

    meta = create(load_recipe(ns.recipe), Path(ns.dest))
    size = sum(f["size"] for f in meta["files"].values())
    print(f"bundle {ns.dest}: recipe {meta['recipe']}, {len(meta['images'])} image(s), {meta['model']['files']} model "
          f"files, {meta['wheels']} wheels, {size / 1024**3:.2f} GiB; deploy it with "
          f"`make deploy RECIPE={meta['recipe']} OFFLINE={ns.dest}`")
    return 0


def cmd_bundle_verify(ns: argparse.Namespace) -> int:
    """Check a bundle against this checkout's recipe and its own file hashes; exit 1 naming damaged files."""
    from ds4deploy.plan.bundle import verify
    from ds4deploy.recipe.load import load_recipe

    meta = verify(Path(ns.bundle), load_recipe(ns.recipe))
    print(json.dumps({"verified": len(meta["files"]), "images": meta["images"], "collections": meta["collections"]}))
    return 0


def cmd_bundle_stage_model(ns: argparse.Namespace) -> int:
    """Stage the model from a bundle (the offline `model stage`, `ds4deploy.model.staging.stage`); prints the same
    {"changed", "dest", "copy_from", "sha256", "manifest_written"} as `model stage`."""
    from ds4deploy.model.staging import stage
    from ds4deploy.plan.bundle import load_meta
    from ds4deploy.recipe.load import load_recipe

    bundle = Path(ns.bundle)
    src = bundle / load_meta(bundle)["model"]["dir"]
    out = stage(load_recipe(ns.recipe), Path(ns.dest), copy_from=src)
    print(json.dumps({**out, "copy_from": out["dest"], "manifest_written": None}))
    return 0


def cmd_nodes_plan(ns: argparse.Namespace) -> int:
    """Validate an inventory against a recipe's nodes; print {host: {rank, role, host_ip, master_addr, ...}}."""
    from ds4deploy.plan.nodes import as_facts, plan_from_inventory
    from ds4deploy.recipe.load import load_recipe

    print(json.dumps(as_facts(plan_from_inventory(load_recipe(ns.recipe), Path(ns.inventory)))))
    return 0


def cmd_nodes_wait(ns: argparse.Namespace) -> int:
    """Wait until a starting group's head engine is healthy while every node's containers run; exit 1 naming the
    node whose containers stopped (see ds4deploy.operate.group_wait)."""
    from ds4deploy.operate.group_wait import group, wait_for_group
    from ds4deploy.recipe.load import load_recipe

    print(wait_for_group(group(load_recipe(ns.recipe), Path(ns.inventory)), ns.timeout))
    return 0


def cmd_incident_collect(ns: argparse.Namespace) -> int:
    """Save every node's engine logs and container states into an incident folder before a stop; print its JSON
    (dir, earliest fatal line, message). See ds4deploy.operate.incidents."""
    from ds4deploy.operate.incidents import collect
    from ds4deploy.plan.inventory import read_inventory
    from ds4deploy.plan.nodes import plan
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    hosts = read_inventory(Path(ns.inventory)).hosts
    incident = collect(recipe, plan(recipe, hosts), hosts, ns.reason, root=Path(ns.root), keep=ns.keep)
    print(json.dumps(incident.as_json()))
    return 0


def _supervised(name: str):
    """The stack recipe or the gateway recipe (recipes/gateways/<name>.yaml) `supervise` and `supervisor` take by
    `name`. Raises UserError: no such recipe, or a gateway named as a stack recipe (`load_gateway` refuses it)."""
    from ds4deploy.operate.gateway_supervise import is_gateway
    from ds4deploy.recipe.load import load_recipe
    from ds4deploy.render import gateway

    return gateway.load_gateway(name) if is_gateway(name) else load_recipe(name)


def cmd_supervise(ns: argparse.Namespace) -> int:
    """Watch a deployed recipe and restart its node group in order on failure (see ds4deploy.operate.supervisor);
    a gateway: its containers and its door's /health, restarted from its deployed copy
    (ds4deploy.operate.gateway_supervise)."""
    import signal

    from ds4deploy.operate.gateway_supervise import make_gateway_target
    from ds4deploy.operate.supervisor import Journal, Policy, make_targets, supervise_all
    from ds4deploy.recipe.schema import GatewayRecipe

    # Ctrl-C / SIGINT stops it even when started from a shell that ignores SIGINT for background jobs (POSIX sh
    # does for `cmd &`; Python then installs no KeyboardInterrupt handler and the supervisor could not be stopped).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    recipe = _supervised(ns.recipe)
    gw = isinstance(recipe, GatewayRecipe)
    bound = ns.progress_bound if ns.progress_bound is not None else (
        Policy.progress_bound_s if gw else recipe.serving.progress_bound_s)
    policy = Policy(interval_s=ns.interval, failures_to_restart=ns.failures, probe_every_s=ns.probe_every,
                    probe_timeout_s=ns.probe_timeout, reading_timeout_s=ns.reading_timeout,
                    max_restarts=ns.max_restarts, window_s=ns.window, backoff_s=ns.backoff, progress_bound_s=bound)
    journal = Journal(Path(ns.journal or f"/var/lib/ds4deploy/supervise/{recipe.name}.jsonl"))
    targets = ([make_gateway_target(recipe, Path(ns.inventory), ns.url)] if gw
               else make_targets(recipe, Path(ns.inventory), ns.url))
    return supervise_all(targets, policy, journal, max_cycles=ns.cycles)


def cmd_supervisor(ns: argparse.Namespace) -> int:
    """Start, stop or show the supervisor service of a recipe or a gateway (see ds4deploy.operate.service)."""
    from ds4deploy.operate import service as svc

    recipe = _supervised(ns.recipe)
    if ns.action == "start":
        out = svc.start(recipe, Path(ns.inventory))
        where = out.get("unit") or f"pid {out['pid']}, log {out['log']}"
        print(f"supervisor of {recipe.name} running ({out['mode']}: {where})")
    elif ns.action == "stop":
        out = svc.stop(recipe)
        print(f"supervisor of {recipe.name} {'stopped' if out['stopped'] else 'was not running'}")
    else:
        out = svc.status(recipe)
        detail = out.get("unit") or (f"pid {out['pid']} since {out['since']}, log {out['log']}" if "pid" in out
                                     else "never started: `make deploy` starts it")
        print(f"supervisor of {recipe.name}: {'running' if out['running'] else 'NOT running'} ({out['mode']}: "
              f"{detail})")
        return 0 if out["running"] else 1
    return 0


def cmd_bench_run(ns: argparse.Namespace) -> int:
    """Run a benchmark profile against a server (see ds4deploy.bench.run); exit 1 when a cell is invalid."""
    from ds4deploy.bench.run import run_bench

    return run_bench(ns)


def cmd_bench_profiles(ns: argparse.Namespace) -> int:
    """List the bundled benchmark profiles."""
    from ds4deploy.bench.run import list_profiles

    return list_profiles(ns)


def cmd_bench_ab(ns: argparse.Namespace) -> int:
    """Paired greedy A/B of two servers (see ds4deploy.bench.ab); exit 1 when outputs differ or a request failed."""
    from ds4deploy.bench.ab import run_ab

    return run_ab(ns)


def cmd_bench_soak(ns: argparse.Namespace) -> int:
    """Steady load for a while on a running server (see ds4deploy.bench.soak); exit 1 when a request failed (or,
    with --require-flat, the engine's memory rose)."""
    from ds4deploy.bench.soak import run_soak

    return run_soak(ns)


def cmd_conformance(ns: argparse.Namespace) -> int:
    """The client conformance matrix against a server (see ds4deploy.conformance.runner), or with ``record`` in
    place of the recipe the recording proxy (ds4deploy.conformance.record). Exit 0 nothing failed, 1 a case failed,
    2 the server could not be tested."""
    if ns.recipe == "record":
        from ds4deploy.conformance.record import run_record

        return run_record(ns)
    if ns.recipe == "parsers":
        from ds4deploy.conformance.pinned_parsers import run_parsers

        return run_parsers(ns)
    from ds4deploy.conformance.runner import run_conformance

    return run_conformance(ns)


def cmd_check_run(ns: argparse.Namespace) -> int:
    """Host, rails and fabric checks against an inventory: one table per host; exit 0 all passed (skips allowed),
    1 a check failed, 2 a check could not run."""
    from ds4deploy.checks import report, runner
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    inventory = Path(ns.inventory)
    inv = read_inventory(inventory)
    hosts = runner.select_hosts(inv.hosts, inv.groups, ns.limit)
    groups = tuple(g.strip() for g in ns.groups.split(",") if g.strip())
    rows = runner.run_checks(recipe, hosts, groups)
    if ns.require_hardware:
        rows = [report.Row(r.host, r.check, r.expected, r.measured, report.FAIL, "this host lacks the hardware",
                           r.source) if r.verdict == report.SKIP and ("NVIDIA GPU" in r.measured or "RDMA" in
                                                                       r.measured) else r for r in rows]
    report.print_tables(rows, f"check {recipe.name}", width=ns.width)
    return report.exit_code(rows)


def cmd_vars(ns: argparse.Namespace) -> int:
    """Validate the recipe and the inventory for a run (`ds4deploy.plan.playvars`) and write every variable its plays
    read; prints the file's path (what ansible/nodes-plan.yml loads)."""
    from ds4deploy.plan.playvars import InputsRefused, write_play_vars
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(ns.recipe)
    hosts = read_inventory(ns.inventory).hosts
    try:
        path = write_play_vars(recipe, hosts, ns.scope, ns.inventory, Path(ns.bundle) if ns.bundle else None,
                               model_from=Path(ns.model_from) if ns.model_from else None)
    except InputsRefused as exc:
        # The preflight table first, as `ds4deploy preflight` prints it (stdout is the path Ansible reads).
        _print_preflight(recipe.name, exc.verdicts, False, 120, stderr=True)
        raise
    print(path)
    return 0


def cmd_fabric_gid_index(ns: argparse.Namespace) -> int:
    """Print the RoCE v2 GID index of --ipv4 on --hca, resolved from this node's sysfs (for NCCL_IB_GID_INDEX)."""
    from ds4deploy.checks.fabric import resolve_gid_index

    print(resolve_gid_index(ns.hca, ns.ipv4, ns.sysfs))
    return 0


def cmd_gateway_render(ns: argparse.Namespace) -> int:
    """Render gateway recipes into compose/gateways/<name>/ (all when none named), or with --check fail (exit 1)
    when a committed gateway render is stale."""
    from ds4deploy.render import gateway

    names = ns.gateways or gateway.gateway_names()
    renders = [(gw, gateway.render(gw)) for gw in (gateway.load_gateway(n) for n in names)]
    if ns.check:
        bad = [s for gw, files in renders for s in gateway.stale(gw, files)]
        if not ns.gateways and gateway.render_root().is_dir():
            bad += [f"{d} has no gateway recipe" for d in sorted(gateway.render_root().iterdir())
                    if d.name not in names]
        if bad:
            raise UserError("committed gateway renders are stale:\n  " + "\n  ".join(bad),
                            "run `ds4deploy gateway render` and commit compose/gateways/", code=1)
        for gw, _ in renders:
            gateway.compose_check(gw)
        print("gateway renders are fresh, and docker compose accepts them")
        return 0
    for path in gateway.write(renders):
        print(f"wrote {path.relative_to(gateway.COMPOSE_DIR.parent)}")
    return 0


def cmd_gateway_keys(ns: argparse.Namespace) -> int:
    """Check the people key file of a gateway and write the front door's people maps beside it; with --reload,
    reload the running front door gracefully (nginx -s reload: open streams finish, new requests see the maps)."""

    from ds4deploy.render import gateway

    gw = gateway.load_gateway(ns.gateway)
    keys = gateway.read_people_keys(gw, Path(ns.people_file) if ns.people_file else None)
    dest = gateway.write_people_maps(gw, keys, Path(ns.dest) if ns.dest else None)
    missing = sorted({p.name for p in gw.people} - set(keys))
    print(f"wrote the people maps of {len(keys)} person(s) into {dest}"
          + (f"; no key (refused at the door): {', '.join(missing)}" if missing else ""))
    if ns.reload:
        from ds4deploy.operate import nginx_reload

        name = ns.container or gateway.front_door_container(gw)
        nginx_reload.reload(name, "/run/front-door/nginx.conf")
        print(f"reloaded {name}: its new workers hold the maps, the old ones accept nothing and finish what they "
              "hold")
    return 0


def cmd_gateway_model_id(ns: argparse.Namespace) -> int:
    """Print the model identity of a recipe's committed manifest (sha256 of its file list), for a gateway's url
    backend (``manifest_sha256``)."""
    from ds4deploy.model.manifest import load_manifest
    from ds4deploy.recipe.load import load_recipe
    from ds4deploy.render.gateway import manifest_identity

    print(manifest_identity(load_manifest(load_recipe(ns.recipe))["files"]))
    return 0


def cmd_gateway_usage(ns: argparse.Namespace) -> int:
    """Per-person requests, bytes, tokens and seconds from a gateway front door's access log (--log FILE, '-' for stdin;
    default: `docker logs` of the gateway's front door container)."""
    import subprocess

    from ds4deploy.operate.gateway_usage import table, usage

    if ns.log == "-":
        lines = sys.stdin.read().splitlines()
    elif ns.log:
        try:
            lines = Path(ns.log).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read the access log {ns.log}: {getattr(exc, 'strerror', None) or exc}",
                            "pass --log with the front door's saved log (a text file), or '-' for stdin") from None
    else:
        from ds4deploy.render import gateway

        name = gateway.front_door_container(gateway.load_gateway(ns.gateway))
        try:
            p = subprocess.run(["docker", "logs", name], capture_output=True, text=True, check=False)
        except OSError as exc:
            raise UserError(f"cannot run docker to read the log of {name}: {exc.strerror}",
                            "run it on the gateway host (where Docker is), or pass --log FILE") from None
        if p.returncode != 0:
            raise UserError(f"could not read the log of {name}: {p.stderr.strip()[-300:]}",
                            "is the gateway deployed here? Or pass --log FILE")
        lines = p.stdout.splitlines()
    print(table(usage(lines)))
    return 0


def cmd_gateway_drain(ns: argparse.Namespace) -> int:
    """Take a backend out of a running gateway's pool (SMG's control plane, with the gateway key): its sessions'
    next turns go to the other backends of its model; requests it is answering finish."""
    from ds4deploy.operate.gateway_control import drain
    from ds4deploy.render import gateway

    print(drain(gateway.load_gateway(ns.gateway), ns.backend, force=ns.force))
    return 0


def cmd_gateway_rejoin(ns: argparse.Namespace) -> int:
    """Add a drained backend back to a running gateway's pool and wait until it is ready."""
    from ds4deploy.operate.gateway_control import rejoin
    from ds4deploy.render import gateway

    print(rejoin(gateway.load_gateway(ns.gateway), ns.backend))
    return 0


def cmd_gateway_vars(ns: argparse.Namespace) -> int:
    """Check a gateway recipe, its committed render and the inventory (deploy: also every recipe backend deployed on
    its host) and write the variables of its plays; prints the file's path (what ansible/gateway-plan.yml loads)."""
    from ds4deploy.operate import gateway_deploy

    variables = gateway_deploy.plan_vars(ns.gateway, Path(ns.inventory), read_inventory(ns.inventory), ns.scope)
    print(gateway_deploy.write_vars(variables, ns.scope))
    return 0


def cmd_gateway_preflight(ns: argparse.Namespace) -> int:
    """The gateway deploy's second check (ansible/roles/gateway/tasks/preflight.yml runs it): the key files as the
    play read them on the gateway host (JSON on stdin) and every backend answering with the gateway key; prints the
    front door's people maps as JSON for the play to write. Never prints a key in a message."""
    from ds4deploy.operate import gateway_deploy

    if sys.stdout.isatty():
        raise UserError("gateway preflight prints the front door's people maps, which hold every person's key, for the "
                        "deploy's play to write: not to a terminal",
                        "run it through `make deploy RECIPE=<gateway>` (ansible/gateway.yml), or send its output to a "
                        "file only root can read")
    try:
        seen = json.loads(sys.stdin.read())
    except ValueError:
        raise UserError("gateway preflight reads the key files as JSON on stdin, and that is not JSON",
                        "run it through `make deploy RECIPE=<gateway>` (ansible/gateway.yml)") from None
    print(json.dumps(gateway_deploy.check_secrets_and_backends(ns.gateway, seen)))
    return 0


def cmd_gateway_image(ns: argparse.Namespace) -> int:
    """Build the router image (images/gateway/) on this host's Docker unless it exists; print its reference."""
    from ds4deploy.build import gateway_image

    print(gateway_image.build())
    return 0


def cmd_gateway_collect(ns: argparse.Namespace) -> int:
    """Save the gateway's containers' logs and states into an incident folder before a stop; print its JSON."""
    from ds4deploy.operate import gateway_deploy
    from ds4deploy.operate.incidents import collect_projects
    from ds4deploy.render import gateway

    inv = read_inventory(ns.inventory)
    gw = gateway.load_gateway(ns.gateway)
    host = gateway_deploy.gateway_host(gw, inv)
    incident = collect_projects(f"gateway-{gw.name}", [(host, "gateway", gateway.project_name(gw))], inv.hosts,
                                ns.reason, root=Path(ns.root), keep=ns.keep)
    print(json.dumps(incident.as_json()))
    return 0


def cmd_gateway_status(ns: argparse.Namespace) -> int:
    """Print the gateway's containers, its front door's /health and every backend's readiness (--logs N: and the
    gateway containers' last N log lines)."""
    from ds4deploy.operate.status import status

    return status(ns.gateway, ns.inventory, log_lines=ns.logs, verbose=ns.verbose, playbook_name="gateway-status.yml",
                  extra=(f"gateway={ns.gateway}",))


def _collect_options(p: argparse.ArgumentParser, what: str, per: str) -> None:
    """The options of an incident collection before a stop (`incident collect`, `gateway collect`): inventory,
    reason, the incidents root and how many folders are kept (ds4deploy.operate.incidents' INCIDENTS_ROOT, KEEP)."""
    from ds4deploy.operate.incidents import INCIDENTS_ROOT, KEEP

    p.add_argument("--inventory", default="ansible/inventories/local.yml")
    p.add_argument("--reason", default="stop", help=f"why the {what} is stopped (kept in incident.json)")
    p.add_argument("--root", default=str(INCIDENTS_ROOT), help="incidents root (default %(default)s)")
    p.add_argument("--keep", type=int, default=KEEP, help=f"incident folders kept per {per} (default %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every ds4deploy command."""
    p = argparse.ArgumentParser(prog="ds4deploy", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    rp = sub.add_parser("recipe", help="recipe commands").add_subparsers(dest="sub", required=True)
    v = rp.add_parser("validate", help="validate recipes (all when none named)")
    v.add_argument("recipes", nargs="*")
    v.set_defaults(func=cmd_recipe_validate)
    ri = rp.add_parser("index", help="write recipes/README.md (one row per recipe: hardware, model, engine, nodes, "
                       "expected decode, status, an owner's remaining steps)")
    ri.add_argument("--check", action="store_true", help="fail (exit 1) when the committed index is stale")
    ri.set_defaults(func=cmd_recipe_index)
    rf = rp.add_parser("reference", help="write docs/recipe-reference.md (every recipe field: type, bounds, default, "
                       "description, the engine flag or variable it becomes, the preflight rules that read it)")
    rf.add_argument("--check", action="store_true", help="fail (exit 1) when the committed reference is stale")
    rf.set_defaults(func=cmd_recipe_reference)

    r = sub.add_parser("render", help="render compose/<recipe>/ from recipes (all when none named)")
    r.add_argument("recipes", nargs="*")
    r.add_argument("--check", action="store_true", help="fail (exit 1) when a committed render is stale")
    r.set_defaults(func=cmd_render)

    mp = sub.add_parser("model", help="model commands").add_subparsers(dest="sub", required=True)
    g = mp.add_parser("generate", help="generate the tiny checkpoint of a 'generated' recipe")
    g.add_argument("recipe")
    g.add_argument("--dest", help="directory (default: the recipe's model.path)")
    g.set_defaults(func=cmd_model_generate)
    m = mp.add_parser("manifest", help="print (or --write, as `model lock`) the model manifest (generated: from the "
                      "generator; hub: from the hub's file metadata; local: from --from)")
    m.add_argument("recipe")
    m.add_argument("--write", action="store_true", help="write recipes/<recipe>.manifest.json (= `model lock`)")
    m.add_argument("--from", dest="from_path", metavar="PATH", help="local model: its file or directory here")
    m.set_defaults(func=cmd_model_manifest)
    lk = mp.add_parser("lock", help="build the model manifest from its source (hub metadata at the resolved full "
                       "commit, or the sha256 of a local model's files) and write recipes/<recipe>.manifest.json")
    lk.add_argument("recipe")
    lk.add_argument("--from", dest="from_path", metavar="PATH", help="local model: its file (e.g. a .gguf) or the "
                    "directory of its parts on this host")
    lk.set_defaults(func=cmd_model_lock)
    f = mp.add_parser("fetch", help="download a 'hub' recipe's pinned revision (resumable, parallel); only files "
                      "matching the manifest are placed")
    f.add_argument("recipe")
    f.add_argument("--dest", help="directory (default: the recipe's model.path)")
    f.add_argument("--workers", type=int, default=8, help="files downloaded in parallel (default 8)")
    f.set_defaults(func=cmd_model_fetch)
    st = mp.add_parser("stage", help="generate or fetch into --dest, verify against the manifest, print sha256s")
    st.add_argument("recipe")
    st.add_argument("--dest", required=True)
    st.add_argument("--from", dest="from_path", metavar="PATH", help="local model: its file or directory on this host "
                    "(copied to every node); without it the files must already be in model.path on each node")
    st.set_defaults(func=cmd_model_stage)
    vf = mp.add_parser("verify", help="check a model directory against the recipe's manifest (parallel; unchanged "
                       "files verified before come from the sidecar)")
    vf.add_argument("recipe")
    vf.add_argument("--dir", help="model directory (default: the recipe's model.path)")
    vf.add_argument("--full", action="store_true", help="ignore the sidecar and re-hash every byte (catches silent "
                    "corruption that leaves size, mtime and ctime unchanged)")
    vf.add_argument("--workers", type=int, help="hashing threads (default: usable cores)")
    vf.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    vf.set_defaults(func=cmd_model_verify)

    ip = sub.add_parser("image", help="image commands").add_subparsers(dest="sub", required=True)
    c = ip.add_parser("context", help="prepare an engine image build context")
    c.add_argument("recipe")
    c.add_argument("--dest", required=True)
    c.add_argument("--wheelhouse", action="append", help="wheel directory (repeatable)")
    c.add_argument("--ca-bundle", help="extra CA certificates (PEM) for pip inside the build")
    c.set_defaults(func=cmd_image_context)
    il = ip.add_parser("lock", help="hash every artifact the image build downloads (the Lvllmds4-x wheel, pinned "
                       "tarballs), read the image ID of an owner-supplied base image (engine.image.base_image "
                       "under local/) on this host, and write recipes/<recipe>.lock.json, which builds verify against")
    il.add_argument("recipe")
    il.add_argument("--artifact", action="append", metavar="NAME=URL|PATH",
                    help="where to take artifact NAME from instead of its default URL: a mirror URL or a local file "
                    "(repeatable)")
    il.set_defaults(func=cmd_image_lock)

    es = sub.add_parser("estimate", help="capacity (weights, KV, resident full-length sessions) and speed (decode, "
                        "prefill, TTFT) of a recipe before deploying it; --calibrate fits the hardware constants to "
                        "a bench run")
    es.add_argument("recipe")
    es.add_argument("--context", type=int, help="tokens per request for the capacity (default max_model_len)")
    es.add_argument("--sessions", type=int, default=1, help="concurrent sessions (default 1)")
    es.add_argument("--prompt", type=int, default=1024, help="prompt tokens per request (default 1024)")
    es.add_argument("--output", type=int, help="tokens out per request (default benchmark.max_tokens, else 1024)")
    es.add_argument("--acceptance", type=float, help="draft acceptance rate per token (default 0.85)")
    es.add_argument("--calibrate", metavar="RUN_JSON", help="fit the hardware constants to this bench run.json")
    es.add_argument("--write", action="store_true",
                    help="with --calibrate: keep them in recipes/<recipe>.calibration.json")
    es.set_defaults(func=cmd_estimate)

    pf = sub.add_parser("preflight", help="run the preflight rule book against a recipe (and an inventory)")
    pf.add_argument("recipe")
    pf.add_argument("--inventory", help="Ansible inventory: host facts (ds4_kernel, ds4_rails) for the rules, the node "
                    "plan, and the nodes the deploy's read-only node checks read")
    pf.add_argument("--no-nodes", action="store_true", help="with --inventory: do not read the nodes (rules and "
                    "control-host checks only)")
    pf.add_argument("--model-from", help="MODEL_FROM of the deploy: a local model's file or directory on this host")
    pf.add_argument("--bundle", help="OFFLINE of the deploy: the air-gapped bundle directory to verify")
    pf.add_argument("--all", action="store_true", help="also list rules that do not apply")
    pf.add_argument("--width", type=int, default=160, help="table width in columns")
    pf.set_defaults(func=cmd_preflight)

    su = sub.add_parser("summary", help="what a deployed recipe serves: URLs, model name, where the key is")
    su.add_argument("recipe")
    su.add_argument("--inventory", help="the inventory it was deployed with: a recipe on 0.0.0.0 is shown at its "
                                        "hosts' addresses")
    su.set_defaults(func=cmd_summary)

    ss = sub.add_parser("status", help="every node's containers and /health (and log lines), as docker printed them")
    ss.add_argument("recipe")
    ss.add_argument("--inventory", default="ansible/inventories/local.yml")
    ss.add_argument("--logs", type=int, default=0, metavar="N", help="also each node's last N engine log lines")
    ss.add_argument("--verbose", action="store_true", help="Ansible's whole output instead of the reports")
    ss.set_defaults(func=cmd_status)

    ev = sub.add_parser("engine-venv", help="create .cache/engine-venv with a recipe's engine pins (host side)")
    ev.add_argument("--recipe", default="cpu")
    ev.set_defaults(func=cmd_engine_venv)

    va = sub.add_parser("vars", help="validate a recipe and an inventory once, at the start of a run, and write every "
                        "variable its plays read (prints the file)")
    va.add_argument("recipe")
    va.add_argument("--inventory", required=True, help="Ansible inventory (YAML or INI)")
    va.add_argument("--scope", choices=["deploy", "provision", "operate"], default="deploy",
                    help="deploy: render, preflight, GPU settings, bundle and node plan checked; provision: preflight "
                    "and GPU settings; operate (status, down, restart): node plan only")
    va.add_argument("--bundle", help="air-gapped bundle directory to verify against the recipe (deploy)")
    va.add_argument("--model-from", help="MODEL_FROM: a local model's file or directory on this host (deploy)")
    va.set_defaults(func=cmd_vars)

    npl = sub.add_parser("nodes", help="multi-node plans").add_subparsers(dest="sub", required=True)
    npp = npl.add_parser("plan", help="check an inventory against a recipe's nodes; print each node's launch facts")
    npp.add_argument("recipe")
    npp.add_argument("--inventory", required=True, help="YAML Ansible inventory (ds4_node_rank, ds4_host_ip)")
    npp.set_defaults(func=cmd_nodes_plan)
    npw = npl.add_parser("wait", help="wait until the head's engine is healthy while every node's containers run "
                                      "(the deploy's head start); exit 1 at once when a node's containers stop")
    npw.add_argument("recipe")
    npw.add_argument("--inventory", required=True, help="YAML Ansible inventory of the deployment")
    npw.add_argument("--timeout", type=float, required=True, help="seconds to wait in all (ds4_health_timeout_s)")
    npw.set_defaults(func=cmd_nodes_wait)

    inc = sub.add_parser("incident", help="incident folders").add_subparsers(dest="sub", required=True)
    ic = inc.add_parser("collect", help="save every node's engine logs and container states (before a stop); print "
                        "the folder and the earliest fatal line as JSON")
    ic.add_argument("recipe")
    _collect_options(ic, "stack", "recipe")
    ic.set_defaults(func=cmd_incident_collect)

    from ds4deploy.operate.supervisor import Policy  # its defaults are the flags' defaults (one source)

    sv = sub.add_parser("supervise", help="restart a deployed node group in order when it dies, turns unhealthy "
                        "or stops making progress (a gateway: when a container stops or its door's /health fails)")
    sv.add_argument("recipe", help="a stack recipe, or a gateway (recipes/gateways/<name>.yaml)")
    sv.add_argument("--inventory", default="ansible/inventories/local.yml")
    sv.add_argument("--url", help="the head's API, a gateway's front door (default: from the recipe and inventory)")
    sv.add_argument("--journal", help="JSON-lines journal (default /var/lib/ds4deploy/supervise/<recipe>.jsonl)")
    sv.add_argument("--interval", type=float, default=Policy.interval_s, help="seconds between checks")
    sv.add_argument("--failures", type=int, default=Policy.failures_to_restart,
                    help="failed /health checks in a row before a restart")
    sv.add_argument("--probe-every", type=float, default=Policy.probe_every_s,
                    help="seconds between progress probes of an idle engine")
    sv.add_argument("--probe-timeout", type=float, default=Policy.probe_timeout_s,
                    help="seconds a one-token completion may take")
    sv.add_argument("--reading-timeout", type=float, default=Policy.reading_timeout_s,
                    help="seconds the engine's /metrics may take")
    sv.add_argument("--progress-bound", type=float, help="seconds a busy engine may show no progress before it "
                    "counts as stuck (default: the recipe's serving.progress_bound_s)")
    sv.add_argument("--max-restarts", type=int, default=Policy.max_restarts,
                    help="restarts within --window before giving up")
    sv.add_argument("--window", type=float, default=Policy.window_s, help="seconds")
    sv.add_argument("--backoff", type=float, default=Policy.backoff_s,
                    help="first wait after a failed restart, doubling")
    sv.add_argument("--cycles", type=int, help="stop after this many checks (default: run until stopped)")
    sv.set_defaults(func=cmd_supervise)

    ss = sub.add_parser("supervisor", help="run `supervise` for a deployed recipe as a service (systemd unit, or a "
                        "detached process recorded in the stack directory): start, stop, status")
    ss.add_argument("action", choices=["start", "stop", "status"])
    ss.add_argument("recipe", help="a stack recipe, or a gateway (recipes/gateways/<name>.yaml)")
    ss.add_argument("--inventory", default="ansible/inventories/local.yml")
    ss.set_defaults(func=cmd_supervisor)

    bp = sub.add_parser("bundle", help="air-gapped bundles").add_subparsers(dest="sub", required=True)
    bc = bp.add_parser("create", help="write images, model, wheelhouse and recipe for an offline deploy")
    bc.add_argument("recipe")
    bc.add_argument("--dest", required=True, help="bundle directory to create (must not exist)")
    bc.set_defaults(func=cmd_bundle_create)
    bv = bp.add_parser("verify", help="check a bundle against this checkout and its recorded hashes")
    bv.add_argument("bundle")
    bv.add_argument("recipe")
    bv.set_defaults(func=cmd_bundle_verify)
    bs = bp.add_parser("stage-model", help="stage the model from a bundle and verify it (offline `model stage`)")
    bs.add_argument("bundle")
    bs.add_argument("recipe")
    bs.add_argument("--dest", required=True)
    bs.set_defaults(func=cmd_bundle_stage_model)

    bn = sub.add_parser("bench", help="benchmark harness (profiles -> tables, plots, expected comparison)")
    bns = bn.add_subparsers(dest="sub", required=True)
    br = bns.add_parser("run", help="run a profile against a running server")
    br.add_argument("recipe")
    br.add_argument("--profile", required=True, help="bundled profile name (`ds4deploy bench profiles`) or YAML path")
    br.add_argument("--url", help="server base URL (default: the recipe's serving address and port)")
    br.add_argument("--key-file", help="API key file, VLLM_API_KEY=<key> (default: the recipe's key file)")
    br.add_argument("--model", help="served model name (default: the recipe's)")
    br.add_argument("--out", help="output directory (default: docs/results/bench/<recipe>)")
    br.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for a response chunk")
    br.add_argument("--no-plots", action="store_true", help="skip the PNG and HTML plots")
    br.add_argument("--no-salt", action="store_true", help="send unsalted prompts (only to show the cache guard)")
    br.add_argument("--quiet", action="store_true", help="no progress bar")
    br.add_argument("--yes", action="store_true", help="confirm a profile that changes GPU clocks (clock sweep)")
    br.add_argument("--restore-locked-clocks", metavar="MIN,MAX",
                    help="the host's standing `nvidia-smi -lgc` lock to restore after a clock sweep (NVML cannot read "
                    "it back; default: reset to the driver default)")
    br.set_defaults(func=cmd_bench_run)
    bl = bns.add_parser("profiles", help="list the bundled benchmark profiles")
    bl.set_defaults(func=cmd_bench_profiles)
    ba = bns.add_parser("ab", help="paired greedy A/B of two servers: speed ratio and byte-identical output")
    ba.add_argument("a", help="config A: server base URL (http://host:port) or recipe name")
    ba.add_argument("b", help="config B: server base URL or recipe name")
    ba.add_argument("--key-file", help="API key file for both servers (VLLM_API_KEY=<key>)")
    ba.add_argument("--key-file-a", help="API key file for A (default --key-file; a recipe's own key file)")
    ba.add_argument("--key-file-b", help="API key file for B")
    ba.add_argument("--model", help="served model name on both (default: the recipe's, or the server's only model)")
    ba.add_argument("--pairs", type=int, default=16, help="prompt pairs (default 16)")
    ba.add_argument("--prompt-tokens", type=int, default=256, help="prompt length, tokens of A's tokenizer")
    ba.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request")
    ba.add_argument("--content", action="append", choices=["code", "json", "legal", "prose", "chat"],
                    help="content type(s) to cycle through (default: all five)")
    ba.add_argument("--seed", type=int, default=0, help="request seed sent to both (default 0)")
    ba.add_argument("--temperature", type=float, default=0.0, help="must be 0: ab is greedy-only")
    ba.add_argument("--ignore-eos", action="store_true", help="decode exactly max_tokens tokens (vLLM extension)")
    ba.add_argument("--out", default="docs/results/bench/ab", help="output directory (default docs/results/bench/ab)")
    ba.add_argument("--name", default="ab", help="report name: <out>/<name>.md and .json")
    ba.add_argument("--label-a", help="what configuration A is, for the report (e.g. 'bf16, defaults')")
    ba.add_argument("--label-b", help="what configuration B is, for the report")
    ba.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a response chunk")
    ba.add_argument("--quiet", action="store_true", help="print only the report path")
    ba.add_argument("--cross-family", action="store_true",
                    help="A and B are different engines (vLLM vs llama.cpp): report agreement apart from speed, "
                    "no identity verdict (automatic for two recipes of different families)")
    ba.set_defaults(func=cmd_bench_ab)
    sk = bns.add_parser("soak", help="steady streaming load for a while: failed requests, TTFT and decode per window, "
                        "the engine container's memory trend")
    sk.add_argument("recipe")
    sk.add_argument("--minutes", type=float, default=30.0, help="how long to keep the load (default 30)")
    sk.add_argument("--sessions", type=int, default=8, help="concurrent streaming sessions (default 8)")
    sk.add_argument("--window-min", type=float, default=5.0, help="report window, minutes (default 5)")
    sk.add_argument("--prompt-tokens", default="256,1024,4096",
                    help="comma-separated prompt lengths sent in turn, tokens (default 256,1024,4096)")
    sk.add_argument("--max-tokens", type=int, default=256, help="output tokens per request (default 256)")
    sk.add_argument("--url", help="server base URL (default: the recipe's serving address and port)")
    sk.add_argument("--key-file", help="API key file, VLLM_API_KEY=<key> (default: the recipe's key file)")
    sk.add_argument("--model", help="served model name (default: the recipe's)")
    sk.add_argument("--container", help="engine container to sample memory from (default: the recipe's on this "
                    "host; none with --url)")
    sk.add_argument("--mem-interval", type=float, default=15.0, help="seconds between memory samples (default 15)")
    sk.add_argument("--out", help="report directory (default docs/results/bench/<recipe>): soak.md, soak.json")
    sk.add_argument("--section", help="also replace the soak section of this markdown file (docs/benchmarks.md)")
    sk.add_argument("--require-flat", action="store_true", help="exit 1 when the memory trend is not flat")
    sk.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a response chunk")
    sk.add_argument("--quiet", action="store_true", help="no progress lines")
    sk.set_defaults(func=cmd_bench_soak)

    cf = sub.add_parser("conformance", help="client conformance matrix (OpenAI and Anthropic SDKs, raw HTTP) "
                        "against a server; `conformance record` runs the recording proxy; `conformance parsers` runs "
                        "the pinned engines' tool-call parsers offline")
    cf.add_argument("recipe", nargs="?", help="recipe whose server to test (address, port, key file, model), or "
                    "`record` for the recording proxy")
    cf.add_argument("--url", help="server base URL, http://host:port (default: the recipe's); for `record`, the "
                    "server to forward to")
    cf.add_argument("--key-file", help="API key file, VLLM_API_KEY=<key> (default: the recipe's key file)")
    cf.add_argument("--model", help="served model name (default: the recipe's, or the server's only model)")
    cf.add_argument("--out", help="report directory (default docs/results/conformance/<recipe>); for `record`, where "
                    "request shapes are saved (default ./recorded)")
    cf.add_argument("--shapes", help="directory of recorded request shapes to replay besides the bundled ones")
    cf.add_argument("--only", help="run only cases whose name contains one of these comma-separated words")
    cf.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    cf.add_argument("--header", action="append", metavar="'NAME: VALUE'", help="send this header with the "
                    "matrix's requests (repeatable; the reachability probe and the auth cases send their own), e.g. "
                    "a gateway's session header to keep the matrix on one backend")
    cf.add_argument("--width", type=int, default=200, help="table width in columns")
    cf.add_argument("--listen", default="127.0.0.1:8099", help="record: address:port the proxy listens on")
    cf.add_argument("--recipe", dest="recipe_for_record", metavar="RECIPE",
                    help="record: forward to this recipe's server (instead of --url)")
    cf.add_argument("--strip-text", action="store_true", help="record: save prose (system prompt, messages, tool "
                    "descriptions) as filler of the same length, to share a shape without its content")
    cf.add_argument("--fetch-only", action="store_true", help="parsers: only download the pinned parser code")
    cf.set_defaults(func=cmd_conformance)

    ck = sub.add_parser("check", help="host, rails and fabric checks of provisioned nodes").add_subparsers(
        dest="sub", required=True)
    cr = ck.add_parser("run", help="run the checks against an inventory; one table per host (exit 0 all passed, "
                       "1 a check failed, 2 could not check)")
    cr.add_argument("--recipe", required=True)
    cr.add_argument("--inventory", required=True, help="YAML Ansible inventory (ds4_rails per host, ds4_netns for "
                    "test hosts in network namespaces)")
    cr.add_argument("--groups", default="host,rails,fabric", help="check groups, comma-separated")
    cr.add_argument("--limit", help="host or inventory group names, comma-separated (default: all hosts)")
    cr.add_argument("--require-hardware", action="store_true",
                    help="count 'no NVIDIA GPU' / 'no RDMA device' skips as failures")
    cr.add_argument("--width", type=int, default=160, help="table width in columns")
    cr.set_defaults(func=cmd_check_run)

    gp = sub.add_parser("gateway", help="gateway recipes (recipes/gateways/): render, people keys, usage, drain and "
                        "rejoin a backend")
    gp = gp.add_subparsers(dest="sub", required=True)
    gr = gp.add_parser("render", help="render compose/gateways/<name>/ (all when none named)")
    gr.add_argument("gateways", nargs="*")
    gr.add_argument("--check", action="store_true", help="fail (exit 1) when a committed gateway render is stale")
    gr.set_defaults(func=cmd_gateway_render)
    gk = gp.add_parser("keys", help="check the people key file and write the front door's people maps (revoke: "
                       "remove the person's line, run this with --reload)")
    gk.add_argument("gateway")
    gk.add_argument("--people-file", help="the people key file (default: the recipe's people_key_file)")
    gk.add_argument("--dest", help="where to write the maps (default: <people_key_file>.d)")
    gk.add_argument("--reload", action="store_true", help="reload the running front door gracefully")
    gk.add_argument("--container", help="the front door container (default: ds4-gw-<name>-front-door)")
    gk.set_defaults(func=cmd_gateway_keys)
    gm = gp.add_parser("model-id", help="the model identity of a recipe's manifest (a url backend's manifest_sha256)")
    gm.add_argument("recipe")
    gm.set_defaults(func=cmd_gateway_model_id)
    gu = gp.add_parser("usage", help="per-person requests, bytes, tokens and seconds from the front door's access log")
    gu.add_argument("gateway")
    gu.add_argument("--log", help="an access log file ('-': stdin); default: docker logs of the front door")
    gu.set_defaults(func=cmd_gateway_usage)
    gd = gp.add_parser("drain", help="take a backend out of the running gateway (maintenance): its sessions move to "
                       "the other backends of its model, running requests finish (run on the gateway host)")
    gd.add_argument("gateway")
    gd.add_argument("backend", help="the backend's name in the gateway recipe")
    gd.add_argument("--force", action="store_true",
                    help="drain it even when it is the last ready backend of a model that has no served fallback")
    gd.set_defaults(func=cmd_gateway_drain)
    gj = gp.add_parser("rejoin", help="add a drained backend back to the running gateway; waits until it is ready")
    gj.add_argument("gateway")
    gj.add_argument("backend", help="the backend's name in the gateway recipe")
    gj.set_defaults(func=cmd_gateway_rejoin)
    gv = gp.add_parser("vars", help="check a gateway recipe, its committed render and the inventory; write the "
                       "variables of its plays (make deploy/status/down RECIPE=<gateway> run it); print the file")
    gv.add_argument("gateway")
    gv.add_argument("--inventory", default="ansible/inventories/local.yml")
    gv.add_argument("--scope", choices=("deploy", "operate"), default="deploy",
                    help="deploy: every check (render fresh, recipe backends deployed); operate: the gateway host only")
    gv.set_defaults(func=cmd_gateway_vars)
    gpf = gp.add_parser("preflight", help="check the key files (JSON on stdin, as ansible/gateway.yml read them on "
                        "the gateway host) and every backend with the gateway key; print the people maps as JSON")
    gpf.add_argument("gateway")
    gpf.set_defaults(func=cmd_gateway_preflight)
    gi = gp.add_parser("image", help="build the router image (images/gateway/) here unless it exists; print it")
    gi.set_defaults(func=cmd_gateway_image)
    gc = gp.add_parser("collect", help="save the gateway's logs and container states in an incident folder (before "
                       "a stop); print it as JSON")
    gc.add_argument("gateway")
    _collect_options(gc, "gateway", "gateway")
    gc.set_defaults(func=cmd_gateway_collect)
    gs = gp.add_parser("status", help="the gateway's containers, its front door's /health, every backend's readiness")
    gs.add_argument("gateway")
    gs.add_argument("--inventory", default="ansible/inventories/local.yml")
    gs.add_argument("--logs", type=int, default=0, metavar="N", help="also the gateway containers' last N log lines")
    gs.add_argument("--verbose", action="store_true", help="Ansible's whole output instead")
    gs.set_defaults(func=cmd_gateway_status)

    fb = sub.add_parser("fabric", help="fabric helpers run on a node").add_subparsers(dest="sub", required=True)
    fg = fb.add_parser("gid-index", help="print the RoCE v2 GID index of a rail address on an HCA (this node)")
    fg.add_argument("--hca", required=True, help="RDMA device, e.g. rocep1s0f0")
    fg.add_argument("--ipv4", required=True, help="the rail's IPv4 address on this node")
    fg.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    fg.set_defaults(func=cmd_fabric_gid_index)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ds4deploy` console script. Returns the process exit code."""
    from ds4deploy.core.secret_scan import redact

    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except UserError as exc:
        # No message prints a credential, whatever it quotes (a URL with userinfo, a value the user passed).
        print(f"error: {redact(exc.cause)}\nfix: {redact(exc.fix)}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
