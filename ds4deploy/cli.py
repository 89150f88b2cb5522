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

from ds4deploy.errors import UserError


def _recipes(names: list[str]):
    """The named recipes, validated; every recipe under recipes/ when none are named."""
    from ds4deploy.recipe import all_recipes, load_recipe

    return [load_recipe(n) for n in names] if names else all_recipes()


def cmd_recipe_validate(ns: argparse.Namespace) -> int:
    """Validate the named recipes (all when none are named); exit 2 with the problems listed otherwise."""
    for r in _recipes(ns.recipes):
        print(f"ok: {r.name} ({r.engine.name} {r.engine.version}, {r.model.served_name})")
    return 0


def cmd_render(ns: argparse.Namespace) -> int:
    """Render recipes into compose/<name>/, or with --check report stale, missing and orphaned renders."""
    from ds4deploy import render

    bad: list[str] = []
    recipes = _recipes(ns.recipes)
    if ns.check and not ns.recipes:
        bad += render.orphans([r.name for r in recipes])
    for r in recipes:
        out = render.render(r)
        if ns.check:
            bad += render.stale(out)
        else:
            for path in render.write(out):
                print(f"wrote {path.relative_to(render.COMPOSE_DIR.parent)}")
    if bad:
        raise UserError(
            "committed renders are stale:\n  " + "\n  ".join(bad),
            "run `ds4deploy render` and commit compose/",
            code=1,
        )
    if ns.check:
        print("renders are fresh")
    return 0


def _generator_spec(recipe):
    from ds4deploy.tinymodel import TinyModelSpec

    if recipe.model.source != "generated" or recipe.model.generator is None:
        raise UserError(
            f"recipe '{recipe.name}' has model.source '{recipe.model.source}', not 'generated'",
            "use `ds4deploy model fetch` for hub models",
        )
    return TinyModelSpec(**recipe.model.generator.model_dump())


def cmd_model_generate(ns: argparse.Namespace) -> int:
    """Generate a 'generated' recipe's checkpoint; prints {"changed", "files", "dest"}."""
    from ds4deploy.recipe import load_recipe
    from ds4deploy.tinymodel import generate

    recipe = load_recipe(ns.recipe)
    dest = Path(ns.dest or recipe.model.path)
    changed = generate(dest, _generator_spec(recipe))
    print(json.dumps({"changed": bool(changed), "files": changed, "dest": str(dest)}))
    return 0


def cmd_model_manifest(ns: argparse.Namespace) -> int:
    """Print (or --write next to the recipe) the model manifest: from the generator or the hub's metadata."""
    from ds4deploy.manifest import manifest_of_files, manifest_path
    from ds4deploy.recipe import load_recipe

    recipe = load_recipe(ns.recipe)
    if recipe.model.source == "hub":
        from ds4deploy.hub import hub_manifest

        manifest = hub_manifest(recipe)
    else:
        from ds4deploy.tinymodel import files

        manifest = manifest_of_files(recipe, files(_generator_spec(recipe)))
    text = json.dumps(manifest, indent=2) + "\n"
    if ns.write:
        manifest_path(recipe).write_text(text, encoding="utf-8")
        print(f"wrote {manifest_path(recipe)}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_model_verify(ns: argparse.Namespace) -> int:
    """Check a model directory against the committed manifest, in parallel, with a progress bar and a per-file table
    (stdout; ``--json`` prints one JSON object instead). Unchanged files verified before are taken from the sidecar
    (size, mtime, ctime, inode); ``--full`` re-hashes everything. Exit 1 naming each differing file."""
    from ds4deploy.manifest import load_manifest, manifest_path
    from ds4deploy.recipe import load_recipe
    from ds4deploy.verify import byte_progress, results_table, verify_model

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
    from ds4deploy.fetch import fetch_model
    from ds4deploy.recipe import load_recipe

    recipe = load_recipe(ns.recipe)
    if recipe.model.source != "hub":
        raise UserError(f"recipe '{recipe.name}' has model.source '{recipe.model.source}', not 'hub'",
                        "use `ds4deploy model generate` for generated models; local models are placed by hand")
    res = fetch_model(recipe, Path(ns.dest or recipe.model.path), workers=ns.workers)
    print(json.dumps({"dest": str(res.dest), "commit": res.commit, "fetched": res.fetched,
                      "present": len(res.present)}))
    return 0


def cmd_model_stage(ns: argparse.Namespace) -> int:
    """Generate or fetch the model into a staging directory, verify it against the committed manifest, and print
    the sha256 of every file (what the nodes' copies are checked against)."""
    from ds4deploy.manifest import load_manifest, manifest_path, sha256_map
    from ds4deploy.recipe import load_recipe
    from ds4deploy.verify import verify_model

    recipe = load_recipe(ns.recipe)
    if recipe.model.source == "local":
        raise UserError(
            f"recipe '{recipe.name}' uses model.source 'local': the deploy does not copy or verify local models yet",
            f"place the files in {recipe.model.path} on every node and start the rendered stack with docker compose "
            f"(compose/{recipe.name}/)",
        )
    dest = Path(ns.dest)
    manifest = load_manifest(recipe)
    before = verify_model(dest, manifest).problems() if dest.is_dir() else ["absent"]
    if recipe.model.source == "generated":
        from ds4deploy.tinymodel import generate

        generate(dest, _generator_spec(recipe))
    elif before:
        from ds4deploy.fetch import fetch_model

        fetch_model(recipe, dest, manifest)
    problems = verify_model(dest, manifest).problems()
    if problems:
        raise UserError(
            f"the staged model in {dest} does not match {manifest_path(recipe).name}:\n  " + "\n  ".join(problems),
            f"if the recipe's model changed on purpose, rebuild the manifest (`ds4deploy model manifest "
            f"{recipe.name} --write`); otherwise delete {dest} and deploy again",
            code=1,
        )
    print(json.dumps({"changed": bool(before), "dest": str(dest), "sha256": sha256_map(dest, manifest)}))
    return 0


def cmd_image_context(ns: argparse.Namespace) -> int:
    """Prepare an image build context; prints {"changed", "context", "image", "sha256", "local_base"}."""
    from ds4deploy.image import LOCAL_BASE_IMAGE, context_digest, prepare_context
    from ds4deploy.recipe import load_recipe

    recipe = load_recipe(ns.recipe)
    wheel_dirs = [Path(p) for p in ns.wheelhouse] if ns.wheelhouse else None
    ca = Path(ns.ca_bundle) if ns.ca_bundle else None
    changed = prepare_context(recipe, Path(ns.dest), wheel_dirs, ca)
    print(json.dumps({"changed": changed, "context": ns.dest, "image": recipe.image_ref,
                      "sha256": context_digest(recipe, Path(ns.dest)), "local_base": LOCAL_BASE_IMAGE}))
    return 0


def cmd_preflight(ns: argparse.Namespace) -> int:
    """Run the preflight rule book; exit 1 when a rule fails (unknown verdicts are shown, not fatal)."""
    from rich.console import Console
    from rich.table import Table

    from ds4deploy import preflight
    from ds4deploy.recipe import load_recipe

    recipe = load_recipe(ns.recipe)
    hosts = preflight.load_inventory(Path(ns.inventory)) if ns.inventory else None
    verdicts = preflight.run(recipe, hosts)
    shown = [v for v in verdicts if ns.all or v.status != "skip"]
    table = Table(title=f"preflight {recipe.name}", show_lines=False, expand=False)
    for col in ("rule", "verdict", "numbers", "remediation", "source"):
        table.add_column(col, overflow="fold")
    style = {"pass": "green", "fail": "bold red", "unknown": "yellow", "skip": "dim"}
    for v in shown:
        table.add_row(v.rule, f"[{style[v.status]}]{v.status}[/]", v.numbers, v.remediation, v.source)
    console = Console(width=ns.width)
    console.print(table)
    counts = {s: sum(v.status == s for v in verdicts) for s in ("pass", "fail", "unknown", "skip")}
    console.print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['unknown']} unknown, "
                  f"{counts['skip']} not applicable")
    return preflight.Report(recipe.name, verdicts).exit_code


def cmd_summary(ns: argparse.Namespace) -> int:
    """Print the post-deploy summary (URL, model, key location)."""
    from ds4deploy.summary import summary

    print(summary(ns.recipe))
    return 0


def cmd_engine_venv(ns: argparse.Namespace) -> int:
    """Create .cache/engine-venv with the CPU engine's pins (vLLM's argument parser for the tests, bare bench)."""
    from ds4deploy.engine_venv import ensure_engine_venv
    from ds4deploy.recipe import load_recipe

    print(ensure_engine_venv(load_recipe(ns.recipe)))
    return 0


def cmd_bundle_create(ns: argparse.Namespace) -> int:
    """Write an air-gapped bundle for a recipe (see ds4deploy.bundle); prints its bundle.json summary."""
    from ds4deploy.bundle import create
    from ds4deploy.recipe import load_recipe

    meta = create(load_recipe(ns.recipe), Path(ns.dest))
    size = sum(f["size"] for f in meta["files"].values())
    print(f"bundle {ns.dest}: recipe {meta['recipe']}, {len(meta['images'])} image(s), {meta['model']['files']} model "
          f"files, {meta['wheels']} wheels, {size / 1024**3:.2f} GiB; deploy it with "
          f"`make deploy RECIPE={meta['recipe']} OFFLINE={ns.dest}`")
    return 0


def cmd_bundle_verify(ns: argparse.Namespace) -> int:
    """Check a bundle against this checkout's recipe and its own file hashes; exit 1 naming damaged files."""
    from ds4deploy.bundle import verify
    from ds4deploy.recipe import load_recipe

    meta = verify(Path(ns.bundle), load_recipe(ns.recipe))
    print(json.dumps({"verified": len(meta["files"]), "images": meta["images"], "collections": meta["collections"]}))
    return 0


def cmd_bundle_stage_model(ns: argparse.Namespace) -> int:
    """Stage the model from a bundle (the offline `model stage`); prints {"changed", "dest", "sha256"}."""
    from ds4deploy.bundle import stage_model
    from ds4deploy.recipe import load_recipe

    print(json.dumps(stage_model(Path(ns.bundle), load_recipe(ns.recipe), Path(ns.dest))))
    return 0


def cmd_nodes_plan(ns: argparse.Namespace) -> int:
    """Validate an inventory against a recipe's nodes; print {host: {rank, role, host_ip, master_addr, ...}}."""
    from ds4deploy.nodes import as_facts, plan_from_inventory
    from ds4deploy.recipe import load_recipe

    print(json.dumps(as_facts(plan_from_inventory(load_recipe(ns.recipe), Path(ns.inventory)))))
    return 0


def cmd_supervise(ns: argparse.Namespace) -> int:
    """Watch a deployed recipe and restart its node group in order on failure (see ds4deploy.supervise)."""
    from ds4deploy.recipe import load_recipe
    from ds4deploy.supervise import Journal, Policy, make_target, supervise

    recipe = load_recipe(ns.recipe)
    policy = Policy(interval_s=ns.interval, failures_to_restart=ns.failures, probe_every_s=ns.probe_every,
                    probe_timeout_s=ns.probe_timeout, max_restarts=ns.max_restarts, window_s=ns.window,
                    backoff_s=ns.backoff)
    journal = Journal(Path(ns.journal or f"/var/lib/ds4deploy/supervise/{recipe.name}.jsonl"))
    return supervise(make_target(recipe, Path(ns.inventory), ns.url), policy, journal, max_cycles=ns.cycles)


def cmd_bench_stack(ns: argparse.Namespace) -> int:
    """Measure the packaging cost of a deployed stack (see ds4deploy.bench.stack)."""
    from ds4deploy.bench.stack import run_bench_stack

    return run_bench_stack(ns)


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



def cmd_check_run(ns: argparse.Namespace) -> int:
    """Host, rails and fabric checks against an inventory: one table per host; exit 0 all passed (skips allowed),
    1 a check failed, 2 a check could not run."""
    from ds4deploy import preflight
    from ds4deploy.checks import report, runner
    from ds4deploy.recipe import load_recipe

    recipe = load_recipe(ns.recipe)
    inventory = Path(ns.inventory)
    hosts = runner.select_hosts(preflight.load_inventory(inventory), runner.inventory_groups(inventory), ns.limit)
    groups = tuple(g.strip() for g in ns.groups.split(",") if g.strip())
    rows = runner.run_checks(recipe, hosts, groups)
    if ns.require_hardware:
        rows = [report.Row(r.host, r.check, r.expected, r.measured, report.FAIL, "this host lacks the hardware",
                           r.source) if r.verdict == report.SKIP and ("NVIDIA GPU" in r.measured or "RDMA" in
                                                                       r.measured) else r for r in rows]
    report.print_tables(rows, f"check {recipe.name}", width=ns.width)
    return report.exit_code(rows)


def cmd_check_inputs(ns: argparse.Namespace) -> int:
    """Refuse bad inventory/recipe input before any host is changed; with --write, write the provisioning
    variables (ds4_* keys the provisioning roles read) as YAML."""
    import yaml

    from ds4deploy import preflight
    from ds4deploy.checks import inputs
    from ds4deploy.recipe import load_recipe

    recipe = load_recipe(ns.recipe)
    hosts = preflight.load_inventory(Path(ns.inventory)) if ns.inventory else {}
    inputs.validate_inputs(recipe, hosts)
    text = yaml.safe_dump(inputs.provision_vars(recipe), sort_keys=True)
    if ns.write:
        out = Path(ns.write)
        changed = not out.is_file() or out.read_text() != text
        if changed:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        print(json.dumps({"changed": changed, "path": str(out), "hosts": len(hosts)}))
    else:
        print(text, end="")
    return 0


def cmd_fabric_gid_index(ns: argparse.Namespace) -> int:
    """Print the RoCE v2 GID index of --ipv4 on --hca, resolved from this node's sysfs (for NCCL_IB_GID_INDEX)."""
    from ds4deploy.checks.fabric import resolve_gid_index

    print(resolve_gid_index(ns.hca, ns.ipv4, ns.sysfs))
    return 0


def cmd_fabric_dump_command(ns: argparse.Namespace) -> int:
    """Print the shell command that dumps a node's GID table under --sysfs; nothing when RECIPE has no fabric."""
    from ds4deploy.checks.fabric import gid_dump_command
    from ds4deploy.recipe import load_recipe

    if load_recipe(ns.recipe).fabric is not None:
        print(gid_dump_command(ns.sysfs))
    return 0


def cmd_fabric_launch_env(ns: argparse.Namespace) -> int:
    """Print a node's resolved fabric launch facts as JSON (`ds4deploy.checks.fabric.launch_env`)."""
    from ds4deploy.checks.fabric import launch_env
    from ds4deploy.recipe import load_recipe

    try:
        rails = json.loads(ns.rails)
    except json.JSONDecodeError as exc:
        raise UserError(f"--rails is not JSON: {exc}", "pass the host's ds4_rails as JSON, e.g. "
                        "'{\"rail0\": {\"address\": \"192.168.100.1\"}}'") from None
    if not isinstance(rails, dict):
        raise UserError(f"--rails is {type(rails).__name__}, not a mapping of rail name to {{address: ...}}",
                        "pass the host's ds4_rails as a JSON object")
    try:
        dump = sys.stdin.read() if ns.dump_file == "-" else Path(ns.dump_file).read_text()
    except OSError as exc:
        raise UserError(f"cannot read --dump-file {ns.dump_file}: {exc.strerror or exc}",
                        "pass the file written from `ds4deploy fabric dump-command`'s output, or - for stdin") from None
    print(json.dumps(launch_env(load_recipe(ns.recipe), ns.node, rails, dump, ns.sysfs)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every ds4deploy command."""
    p = argparse.ArgumentParser(prog="ds4deploy", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    rp = sub.add_parser("recipe", help="recipe commands").add_subparsers(dest="sub", required=True)
    v = rp.add_parser("validate", help="validate recipes (all when none named)")
    v.add_argument("recipes", nargs="*")
    v.set_defaults(func=cmd_recipe_validate)

    r = sub.add_parser("render", help="render compose/<recipe>/ from recipes (all when none named)")
    r.add_argument("recipes", nargs="*")
    r.add_argument("--check", action="store_true", help="fail (exit 1) when a committed render is stale")
    r.set_defaults(func=cmd_render)

    mp = sub.add_parser("model", help="model commands").add_subparsers(dest="sub", required=True)
    g = mp.add_parser("generate", help="generate the tiny checkpoint of a 'generated' recipe")
    g.add_argument("recipe")
    g.add_argument("--dest", help="directory (default: the recipe's model.path)")
    g.set_defaults(func=cmd_model_generate)
    m = mp.add_parser("manifest", help="print (or --write) the model manifest (generated: from the generator; "
                      "hub: from the hub's file metadata)")
    m.add_argument("recipe")
    m.add_argument("--write", action="store_true", help="write recipes/<recipe>.manifest.json")
    m.set_defaults(func=cmd_model_manifest)
    f = mp.add_parser("fetch", help="download a 'hub' recipe's pinned revision (resumable, parallel); only files "
                      "matching the manifest are placed")
    f.add_argument("recipe")
    f.add_argument("--dest", help="directory (default: the recipe's model.path)")
    f.add_argument("--workers", type=int, default=8, help="files downloaded in parallel (default 8)")
    f.set_defaults(func=cmd_model_fetch)
    st = mp.add_parser("stage", help="generate or fetch into --dest, verify against the manifest, print sha256s")
    st.add_argument("recipe")
    st.add_argument("--dest", required=True)
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

    pf = sub.add_parser("preflight", help="run the preflight rule book against a recipe (and an inventory)")
    pf.add_argument("recipe")
    pf.add_argument("--inventory", help="Ansible YAML inventory with host facts (ds4_kernel, ds4_rails)")
    pf.add_argument("--all", action="store_true", help="also list rules that do not apply")
    pf.add_argument("--width", type=int, default=160, help="table width in columns")
    pf.set_defaults(func=cmd_preflight)

    su = sub.add_parser("summary", help="what a deployed recipe serves: URLs, model name, where the key is")
    su.add_argument("recipe")
    su.set_defaults(func=cmd_summary)

    ev = sub.add_parser("engine-venv", help="create .cache/engine-venv with a recipe's engine pins (host side)")
    ev.add_argument("--recipe", default="cpu")
    ev.set_defaults(func=cmd_engine_venv)

    npl = sub.add_parser("nodes", help="multi-node plans").add_subparsers(dest="sub", required=True)
    npp = npl.add_parser("plan", help="check an inventory against a recipe's nodes; print each node's launch facts")
    npp.add_argument("recipe")
    npp.add_argument("--inventory", required=True, help="YAML Ansible inventory (ds4_node_rank, ds4_host_ip)")
    npp.set_defaults(func=cmd_nodes_plan)

    sv = sub.add_parser("supervise", help="restart a deployed node group in order when it dies, turns unhealthy "
                        "or stops making progress")
    sv.add_argument("recipe")
    sv.add_argument("--inventory", default="ansible/inventories/local.yml")
    sv.add_argument("--url", help="the head's API (default: from the recipe and inventory)")
    sv.add_argument("--journal", help="JSON-lines journal (default /var/lib/ds4deploy/supervise/<recipe>.jsonl)")
    sv.add_argument("--interval", type=float, default=10, help="seconds between checks")
    sv.add_argument("--failures", type=int, default=2, help="failed /health checks in a row before a restart")
    sv.add_argument("--probe-every", type=float, default=30, help="seconds between progress probes")
    sv.add_argument("--probe-timeout", type=float, default=60, help="seconds a one-token completion may take")
    sv.add_argument("--max-restarts", type=int, default=5, help="restarts within --window before giving up")
    sv.add_argument("--window", type=float, default=3600, help="seconds")
    sv.add_argument("--backoff", type=float, default=10, help="first wait after a failed restart, doubling")
    sv.add_argument("--cycles", type=int, help="stop after this many checks (default: run until stopped)")
    sv.set_defaults(func=cmd_supervise)

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

    b = sub.add_parser("bench-stack", help="deployed stack vs the same engine started bare (packaging cost)")
    b.add_argument("--recipe", default="cpu")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--requests", type=int, default=8, help="requests per run")
    b.add_argument("--max-tokens", type=int, default=512)
    b.add_argument("--out", default="docs/benchmarks.md")
    b.add_argument("--cold", action="store_true", help="also time a cold deploy (removes the engine and base images)")
    b.set_defaults(func=cmd_bench_stack)

    bn = sub.add_parser("bench", help="benchmark harness (profiles -> tables, plots, expected comparison)")
    bns = bn.add_subparsers(dest="sub", required=True)
    br = bns.add_parser("run", help="run a profile against a running server")
    br.add_argument("recipe")
    br.add_argument("--profile", required=True, help="bundled profile name (`ds4deploy bench profiles`) or YAML path")
    br.add_argument("--url", help="server base URL (default: the recipe's serving address and port)")
    br.add_argument("--key-file", help="API key file, VLLM_API_KEY=<key> (default: the recipe's key file)")
    br.add_argument("--model", help="served model name (default: the recipe's)")
    br.add_argument("--out", help="output directory (default: docs/bench/<recipe>)")
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
    ba.add_argument("--out", default="docs/bench/ab", help="output directory (default docs/bench/ab)")
    ba.add_argument("--name", default="ab", help="report name: <out>/<name>.md and .json")
    ba.add_argument("--label-a", help="what configuration A is, for the report (e.g. 'bf16, defaults')")
    ba.add_argument("--label-b", help="what configuration B is, for the report")
    ba.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a response chunk")
    ba.add_argument("--quiet", action="store_true", help="print only the report path")
    ba.set_defaults(func=cmd_bench_ab)

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
    ci = ck.add_parser("inputs", help="refuse bad inventory/recipe input (rail addresses, duplicates, clocks) "
                       "and print or --write the provisioning variables")
    ci.add_argument("recipe")
    ci.add_argument("--inventory", help="YAML Ansible inventory")
    ci.add_argument("--write", help="write the variables to this YAML file (prints {\"changed\": ...})")
    ci.set_defaults(func=cmd_check_inputs)

    fb = sub.add_parser("fabric", help="fabric helpers run on a node").add_subparsers(dest="sub", required=True)
    fg = fb.add_parser("gid-index", help="print the RoCE v2 GID index of a rail address on an HCA (this node)")
    fg.add_argument("--hca", required=True, help="RDMA device, e.g. rocep1s0f0")
    fg.add_argument("--ipv4", required=True, help="the rail's IPv4 address on this node")
    fg.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    fg.set_defaults(func=cmd_fabric_gid_index)
    fd = fb.add_parser("dump-command", help="print the read-only shell command that dumps a node's GID table "
                       "(nothing when the recipe has no fabric)")
    fd.add_argument("recipe")
    fd.add_argument("--sysfs", default="/sys", help="sysfs root on the node (default /sys)")
    fd.set_defaults(func=cmd_fabric_dump_command)
    fl = fb.add_parser("launch-env", help="resolve a node's NCCL_IB_GID_INDEX (every HCA of every rail) from its "
                       "GID table dump; prints JSON {env, hcas}")
    fl.add_argument("recipe")
    fl.add_argument("--node", required=True, help="inventory host name (for messages)")
    fl.add_argument("--rails", required=True, help="the host's ds4_rails as JSON: {rail: {address: a.b.c.d}}")
    fl.add_argument("--dump-file", required=True, help="output of `ds4deploy fabric dump-command` on the node "
                    "(- = stdin)")
    fl.add_argument("--sysfs", default="/sys", help="sysfs root the dump was taken under (default /sys)")
    fl.set_defaults(func=cmd_fabric_launch_env)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ds4deploy` console script. Returns the process exit code."""
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except UserError as exc:
        print(f"error: {exc.cause}\nfix: {exc.fix}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
