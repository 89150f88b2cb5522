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

from ds4deploy.engine_args import CONTAINER_MODEL_DIR, engine_args, engine_env
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
    """Docker compose project name for a recipe (``ds4-<name>``). Variants share their base recipe's project: they
    are operating choices of the same deployment, so switching variants replaces it instead of running beside it."""
    return f"ds4-{recipe.base_name}"


def node_project_name(recipe: Recipe, rank: int | str) -> str:
    """Compose project of one node of a multi-node recipe (``ds4-<name>-node<rank>``): one project per node, so
    several node containers can share one Docker host. `rank` is the node rank, or the compose interpolation that
    supplies it at start-up in the rendered file."""
    return f"{project_name(recipe)}-node{rank}"


def recipe_sha256(recipe: Recipe) -> str:
    """sha256 of the recipe file's bytes: labels the containers so a changed recipe is visible on the host."""
    return hashlib.sha256(recipe.source_path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Rendered:
    """One recipe's artifacts: file name -> text."""

    recipe: str
    files: dict[str, str]


@dataclass(frozen=True)
class Service:
    """One engine container of a compose file: its name, argv, published port and healthcheck test."""

    name: str
    command: list[str]
    port: int | None
    health_test: list[str]
    environment: dict[str, str]
    depends_on: str | None = None


# A headless worker serves no HTTP; its healthcheck asks whether the engine process is still alive: any process
# other than the probe itself whose argv holds "--headless" (processes that exit mid-scan are skipped).
WORKER_ALIVE = ["CMD", "python3", "-c",
                "import os,sys\n"
                "def argv(p):\n"
                "    try: return open(f'/proc/{p}/cmdline','rb').read()\n"
                "    except OSError: return b''\n"
                "me=str(os.getpid())\n"
                "sys.exit(0 if any(b'--headless' in argv(p) for p in os.listdir('/proc') if p.isdigit() and p!=me) "
                "else 1)"]


def _http_health(recipe: Recipe, port: int) -> list[str]:
    # The healthcheck probes from inside the container: loopback with bridge networking (the engine listens on all
    # container interfaces), the bound address itself with host networking.
    probe = "127.0.0.1" if recipe.serving.network_mode == "bridge" else recipe.serving.bind_address
    url = f"{base_url(probe, port)}/health"
    return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen('{url}', timeout=5)"]


def _with_port(args: list[str], port: int) -> list[str]:
    out = list(args)
    out[out.index("--port") + 1] = str(port)
    return out


def node_files(recipe: Recipe) -> dict[str, list[Service]]:
    """The compose files of a recipe and the engine services in each.

    - one node, one instance: ``compose.yaml`` with service ``engine``;
    - one node, CPU-expert instances (`Recipe.instances`): ``compose.yaml`` with ``engine-0..n-1``, instance i bound
      to NUMA node i with ``numactl --membind=i --cpunodebind=i`` on port ``serving.port + i``;
    - several nodes: ``compose.head.yaml`` (node rank 0, serves the API) and ``compose.worker.yaml`` (node rank
      >= 1, ``--headless``). Launch facts that differ per node come from the environment at start-up and are
      required: DS4_NODE_RANK, DS4_MASTER_ADDR (head's fabric address), DS4_HOST_IP (this node's fabric address,
      exported as VLLM_HOST_IP), DS4_NCCL_IB_GID_INDEX (RoCE v2 GID index resolved on this node).
    """
    from ds4deploy.instances import instance_count

    entry = recipe.engine.entrypoint
    args = engine_args(recipe)
    port = recipe.serving.port
    if recipe.hardware.nodes > 1:
        rank, master = "${DS4_NODE_RANK:?set by the deploy}", "${DS4_MASTER_ADDR:?set by the deploy}"
        env = {"VLLM_HOST_IP": "${DS4_HOST_IP:?set by the deploy}"}
        if recipe.fabric is not None:
            env["NCCL_IB_GID_INDEX"] = "${DS4_NCCL_IB_GID_INDEX:?set by the deploy}"
        if recipe.hardware.gpus.count == 0:
            # CPU engines: which cores this node's OpenMP threads bind to (vLLM envs.py VLLM_CPU_OMP_THREADS_BIND);
            # "auto" on a machine of its own, a core list when several node containers share one host.
            env["VLLM_CPU_OMP_THREADS_BIND"] = "${DS4_CPU_BIND:-auto}"
        if recipe.parallelism.multinode == "nnodes":
            head_args = [*args, "--node-rank", rank, "--master-addr", master]
            worker_args = [*head_args, "--headless"]
        else:
            # One API server on the head fronts every replica (vLLM starts one per DP rank otherwise).
            head_args = [*args, "--data-parallel-address", master, "--api-server-count", "1"]
            worker_args = [*args, "--data-parallel-address", master, "--data-parallel-start-rank", rank, "--headless"]
        head = Service("engine", [*entry, *head_args], port, _http_health(recipe, port), env)
        worker = Service("engine", [*entry, *worker_args], None, WORKER_ALIVE, env)
        return {"compose.head.yaml": [head], "compose.worker.yaml": [worker]}
    if recipe.instances is not None:
        count, _ = instance_count(recipe)
        services = []
        for i in range(count):
            numa = ["numactl", f"--membind={i}", f"--cpunodebind={i}"]
            # Instances share the GPUs: start them one after another (vLLM's start-up memory profiling is wrong
            # while another process on the same GPU is still allocating).
            services.append(Service(f"engine-{i}", [*numa, *entry, *_with_port(args, port + i)], port + i,
                                    _http_health(recipe, port + i), {}, f"engine-{i - 1}" if i else None))
        return {"compose.yaml": services}
    return {"compose.yaml": [Service("engine", [*entry, *args], port, _http_health(recipe, port), {})]}


def render(recipe: Recipe) -> Rendered:
    """Render all artifacts for `recipe` in memory.

    Raises:
        UserError: a template refers to something the recipe does not define.
    """
    args = engine_args(recipe)
    nodes = node_files(recipe)
    base = {
        "recipe": recipe,
        "project": project_name(recipe),
        "node_project": node_project_name(recipe, "${DS4_NODE_RANK:?set by the deploy}"),
        "recipe_sha256": recipe_sha256(recipe),
        "container_model_dir": CONTAINER_MODEL_DIR,
        "bind_host": url_host(recipe.serving.bind_address),
        "health": HEALTHCHECK,
        "compose_files": list(nodes),
        "engine_env": engine_env(recipe),
        "ports": [svc.port for svcs in nodes.values() for svc in svcs if svc.port is not None],
        "master_port": recipe.master_port,
    }
    files: dict[str, str] = {}
    try:
        for out, services in nodes.items():
            files[out] = _ENV.get_template("compose.yaml.j2").render(
                {**base, "services": services, "role": out.split(".")[1] if out.count(".") == 2 else "single"})
        for out, tpl in (("engine.env", "engine.env.j2"), ("deploy-vars.yml", "deploy-vars.yml.j2")):
            files[out] = _ENV.get_template(tpl).render(base)
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
