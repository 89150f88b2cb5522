"""`make deploy / status / down RECIPE=<gateway>`: the checks and the play variables of a gateway deploy
(ansible/gateway.yml, gateway-status.yml, gateway-down.yml; docs/gateway.md, "Deploy").

Two steps run before anything changes on any host, each ending in one message with every problem it found:

1. `plan_vars` (``ds4deploy gateway vars``, on the control host, before Ansible changes anything): the gateway
   recipe (schema, the recipes it names, one model per model name: `ds4deploy.render.gateway.load_gateway`), its
   committed render fresh byte for byte, the gateway host in the inventory, and every recipe backend's host in the
   inventory with that recipe's stack running there (its compose project's containers, read with the docker CLI the
   way the supervisor and the incident collector reach a node's daemon: `ds4deploy.operate.incidents.docker_env`).
2. `check_secrets_and_backends` (``ds4deploy gateway preflight``, run by ansible/gateway.yml on the control host
   with what the play read, read only, on the gateway host): the gateway key file and the people key file (present,
   mode 0600, well formed; one key per person: `ds4deploy.render.gateway.parse_people_keys`), the gateway's ports
   free (or held by its own containers, a redeploy), and every backend
   answering ``GET /v1/models`` with the gateway key (unreachable; refusing the key: the gateway key is not beside
   that backend's own; serving other model names than the recipe says). Keys never appear in a message.
"""

from __future__ import annotations

import json
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ds4deploy.core.errors import UserError
from ds4deploy.core.keys import KEY_RULE
from ds4deploy.core.net import base_url
from ds4deploy.operate.incidents import docker_env
from ds4deploy.operate.key_file import parse_env_file
from ds4deploy.plan.inventory import Inventory
from ds4deploy.plan.playvars import VARS_DIR
from ds4deploy.recipe.load import load_recipe, problem_lines
from ds4deploy.recipe.schema import GatewayRecipe
from ds4deploy.render import front_door, gateway
from ds4deploy.render.compose import node_project_name, project_name

# The inventory group naming the gateway host when the inventory holds other hosts too (the backends' hosts).
GATEWAY_GROUP = "gateway"
# Where the gateway host keeps its copy of the committed render (beside the stacks' /opt/ds4deploy/stacks/).
STACKS_ROOT = "/opt/ds4deploy/gateways"
# Seconds a backend may take to answer GET /v1/models at deploy (it answers from memory; a LAN round trip).
PROBE_TIMEOUT_S = 10.0
# Seconds docker compose waits for the router's and the front door's healthchecks at deploy (their start_period is
# 30 s and SMG registers its workers within seconds: docs/gateway.md).
HEALTH_TIMEOUT_S = 120


@dataclass(frozen=True)
class Where:
    """Where a recipe backend runs: its inventory host and the compose project of its stack (the head's)."""

    backend: str
    recipe: str
    inventory_host: str | None
    project: str


def gateway_host(gw: GatewayRecipe, inv: Inventory) -> str:
    """The inventory host the gateway runs on: the one host of group ``gateway``, else the inventory's only host.

    Raises:
        UserError: no such host, or more than one.
    """
    hosts = inv.groups.get(GATEWAY_GROUP) or (inv.groups.get("all", []) if len(inv.groups.get("all", [])) == 1
                                               else [])
    if len(hosts) != 1:
        raise UserError(f"gateway '{gw.name}': the inventory names {len(hosts) or 'no'} gateway host(s) "
                        f"({', '.join(hosts) or 'group ' + GATEWAY_GROUP + ' is empty or missing'})",
                        f"put the gateway host alone in group '{GATEWAY_GROUP}' (other hosts of the inventory, such "
                        "as the backends' hosts, stay outside it), or use an inventory of one host")
    return hosts[0]


def _inventory_host(host: str, inv: Inventory) -> str | None:
    """The inventory host a recipe backend's ``host`` names: by inventory name or by ``ansible_host``."""
    for name, hv in inv.hosts.items():
        if host in (name, hv.get("ansible_host")):
            return name
    return None


def backend_places(gw: GatewayRecipe, inv: Inventory) -> list[Where]:
    """Every recipe backend with its inventory host (None when the inventory does not hold it) and the compose
    project its stack runs under (a multi-node recipe: its head's, rank 0)."""
    out = []
    for b in gw.backends:
        if b.recipe is None:
            continue
        r = load_recipe(b.recipe)
        project = project_name(r) if r.hardware.nodes <= 1 else node_project_name(r, 0)
        out.append(Where(b.name, b.recipe, _inventory_host(b.host or "", inv), project))
    return out


def running_containers(host: str, hostvars: dict, project: str) -> tuple[dict[str, str] | None, str]:
    """The running containers of compose `project` on `host` (its daemon reached as the supervisor does), each with
    the recipe its render labels it with (``io.ds4deploy.recipe``, the recipe or variant deployed: variants share their
    base's project), or (None, why) when its Docker daemon did not answer."""
    try:
        p = subprocess.run(["docker", "ps", "--filter", f"label=com.docker.compose.project={project}",
                            "--filter", "status=running", "--format", '{{.Names}} {{.Label "io.ds4deploy.recipe"}}'],
                           capture_output=True, text=True, env=docker_env(host, hostvars), timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if p.returncode != 0:
        return None, p.stderr.strip()[:200]
    return dict(line.partition(" ")[::2] for line in p.stdout.splitlines() if line.strip()), ""


def deployment_problems(gw: GatewayRecipe, inv: Inventory) -> list[str]:
    """A recipe backend whose host is not in the inventory, whose host's Docker does not answer, or whose recipe's
    stack is not running there (none of its compose project, or another variant of it: the base recipe where the
    gateway names its lan variant listens on loopback only). Empty when every recipe backend is deployed where the
    gateway recipe says."""
    problems = []
    for w in backend_places(gw, inv):
        if w.inventory_host is None:
            problems.append(f"backend '{w.backend}' runs recipe '{w.recipe}' on a host the inventory does not hold "
                            "(the deploy reads that host to check the recipe is deployed there): add it to the "
                            "inventory, outside group 'gateway'")
            continue
        running, why = running_containers(w.inventory_host, inv.hosts[w.inventory_host], w.project)
        deploy = (f"deploy it there first (`make deploy RECIPE={w.recipe} INVENTORY=<its inventory>`), or name the "
                  "host it runs on")
        if running is None:
            problems.append(f"backend '{w.backend}': Docker on {w.inventory_host} does not answer ({why})")
        elif not running:
            problems.append(f"backend '{w.backend}': recipe '{w.recipe}' is not deployed on {w.inventory_host} (no "
                            f"running container of compose project {w.project}): {deploy}")
        elif others := sorted({r for r in running.values() if r and r != w.recipe}):  # unlabelled: not known
            problems.append(f"backend '{w.backend}': {w.inventory_host} runs recipe {', '.join(others)} in compose "
                            f"project {w.project}, not '{w.recipe}' (a variant replaces its base there): {deploy}")
    return problems


def control_url(gw: GatewayRecipe, inv: Inventory) -> str:
    """Where the control host reaches the gateway's front door (its supervisor's health checks): the bound address,
    or the gateway host's address (127.0.0.1 for a local one) when bound to 0.0.0.0.

    Raises:
        UserError: no single gateway host in the inventory (`gateway_host`); the door listens on loopback of a host
            that is not this control host (the supervisor could never reach it, and would restart a healthy gateway).
    """
    host = gateway_host(gw, inv)
    hv = inv.hosts.get(host, {})
    local = hv.get("ansible_connection") == "local" or host in ("localhost", "127.0.0.1")
    addr = gw.bind_address
    if addr == "0.0.0.0":  # noqa: S104 (an address we read, not one we bind)
        addr = "127.0.0.1" if local else hv.get("ansible_host", host)
    elif addr.startswith("127.") and not local:
        raise UserError(f"gateway '{gw.name}' listens on {addr} of {host}, which its supervisor on this control host "
                        "cannot reach", "run `make deploy` on the gateway host itself (an inventory with "
                        "ansible_connection: local), or bind the gateway to an address this host reaches "
                        f"(bind_address in recipes/gateways/{gw.name}.yaml)")
    return base_url(addr, gw.port)


def plan_vars(name: str, inventory_path: Path, inv: Inventory, scope: str = "deploy") -> dict:
    """Check a gateway recipe against its committed render and the inventory; the variables of its plays.

    Args:
        name: gateway name (recipes/gateways/<name>.yaml) or a path to a gateway recipe file.
        inventory_path: the Ansible inventory (its path goes into the variables for the plays' own commands).
        inv: that inventory as read (`ds4deploy.plan.inventory.read_inventory`).
        scope: ``deploy`` (every check) or ``operate`` (status and down: the recipe and the gateway host only).

    Returns:
        The play variables (``ds4_gw_*``): the host, paths on it, ports, images, backends (name, URL, models).

    Raises:
        UserError: one message with every problem: the recipe (`load_gateway`), a stale or missing render, no
            gateway host in the inventory, a recipe backend not deployed on its host, a door its supervisor on the
            control host cannot reach (`control_url`).
    """
    gw = gateway.load_gateway(name)
    host = gateway_host(gw, inv)
    problems = []
    if scope == "deploy":
        stale = gateway.stale(gw, gateway.render(gw))
        if stale:
            problems.append("its committed render differs from the recipe (" + "; ".join(stale) + "): run "
                            f"`ds4deploy gateway render {gw.name}` and commit compose/gateways/{gw.name}/")
        problems += deployment_problems(gw, inv)
        try:
            control_url(gw, inv)
        except UserError as exc:
            problems.append(f"{exc.cause} ({exc.fix})")
    if problems:
        raise UserError(f"gateway '{gw.name}' cannot be deployed: " + "; ".join(problems),
                        "fix each problem above, then deploy again; nothing was changed on any host")
    backends = gateway.resolve_backends(gw)
    return {
        "ds4_gw_name": gw.name,
        "ds4_gw_host": host,
        "ds4_gw_inventory": str(Path(inventory_path).resolve()),
        "ds4_gw_render_dir": str(gateway.render_root() / gw.name),
        "ds4_gw_stack_dir": f"{STACKS_ROOT}/{gw.name}",
        "ds4_gw_project": gateway.project_name(gw),
        "ds4_gw_router": gw.routing.router,
        "ds4_gw_url": f"http://{gw.bind_address}:{gw.port}",
        "ds4_gw_router_url": f"http://127.0.0.1:{gw.router_port}" if gw.routing.router == "smg" else "",
        "ds4_gw_key_file": gw.key_file,
        "ds4_gw_metrics_key_file": gw.metrics_key_file,
        "ds4_gw_people_key_file": gw.people_key_file,
        "ds4_gw_people_dir": str(gateway.people_dir(gw)),
        "ds4_gw_router_image": gateway.image_ref() if gw.routing.router == "smg" else "",
        "ds4_gw_front_door_image": front_door.IMAGE,
        "ds4_gw_front_door_container": gateway.front_door_container(gw),
        "ds4_gw_health_timeout_s": HEALTH_TIMEOUT_S,
        # The ports the gateway listens on, with the compose service that holds each (the front door on
        # bind_address, SMG's two on loopback): probed free at deploy unless that service's own container runs
        # (roles/gateway/tasks/preflight.yml).
        "ds4_gw_ports": [{"host": gw.bind_address, "port": gw.port, "service": gateway.DOOR_SERVICE}] + [
            {"host": "127.0.0.1", "port": p, "service": gateway.ROUTER_SERVICE}
            for p in (gw.router_port, gw.router_metrics_port) if p is not None and gw.routing.router == "smg"],
        "ds4_gw_backends": [{"name": b.name, "url": b.url, "models": list(b.models)} for b in backends],
        # model -> fallback model (the recipe's): `make status` says which is in use (roles/gateway/tasks/status.yml).
        "ds4_gw_fallback": dict(sorted(gw.fallback.items())),
    }


def write_vars(variables: dict, scope: str, dest_dir: Path | None = None) -> Path:
    """Write the play variables (JSON is YAML: Ansible's include_vars reads it) where the stacks' `ds4deploy vars`
    writes theirs (`ds4deploy.plan.playvars.VARS_DIR`): ``gateway-<name>.<scope>.json``, replaced atomically.
    Returns its path."""
    path = (dest_dir or VARS_DIR) / f"gateway-{variables['ds4_gw_name']}.{scope}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(variables, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


class SeenFile(BaseModel):
    """A key file as the play read it on the gateway host (ansible/roles/gateway/tasks/preflight.yml): whether it
    exists, its mode as Ansible's stat gives it (octal text, ``"0600"``), its text when read."""

    model_config = ConfigDict(extra="forbid")
    exists: bool = False
    mode: Annotated[str, Field(pattern=r"^[0-7]{3,4}$")] | None = None
    text: str = ""


class Seen(BaseModel):
    """What the play saw on the gateway host: the three key files and the gateway's ports that another process
    holds."""

    model_config = ConfigDict(extra="forbid")
    key_file: SeenFile = SeenFile()
    people_key_file: SeenFile = SeenFile()
    metrics_key_file: SeenFile = SeenFile()
    ports_busy: list[Annotated[int, Field(ge=1, le=65535)]] = []


def _file_problem(what: str, path: str, seen: SeenFile) -> str | None:
    """A key file as the play saw it on the gateway host: missing or open to others."""
    if not seen.exists:
        return f"{what} {path} does not exist on the gateway host"
    mode = int(seen.mode or "0", 8)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{what} {path} has mode {mode:04o} (others than its owner may read the keys): chmod 600 {path}"
    return None


def probe(url: str, key: str, models: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """``GET <url>/v1/models`` with the gateway key as Bearer: None when it answers 200 listing every name of
    `models`, else what is wrong (unreachable, the key refused, other model names). Never quotes the key."""
    try:
        r = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"does not answer at {url} ({type(exc).__name__}: {str(exc)[:120]})"
    if r.status_code in (401, 403):
        return (f"refuses the gateway key (HTTP {r.status_code} at {url}/v1/models): its front door does not hold "
                "it beside its own key")
    if r.status_code != 200:
        return f"answers HTTP {r.status_code} at {url}/v1/models"
    try:
        served = {str(m["id"]) for m in r.json()["data"]}
    except (ValueError, KeyError, TypeError):
        return f"answers {url}/v1/models with something else than a model list"
    missing = [m for m in models if m not in served]
    if missing:
        return f"serves {', '.join(sorted(served)) or 'no model'}, not {', '.join(missing)}"
    return None


def check_secrets_and_backends(name: str, seen: dict) -> dict[str, str]:
    """The second step of the preflight: the key files as the play read them on the gateway host, and every
    backend answering with the gateway key.

    Args:
        name: the gateway.
        seen: ``{"key_file": {"exists", "mode", "text"}, "people_key_file": {...}, "metrics_key_file": {"exists",
            "mode"}, "ports_busy": [port, ...]}`` (text: the file's content, when it exists; the metrics key file may
            be missing, the deploy generates it; ports_busy: the gateway's ports another process holds).

    Returns:
        The front door's people maps (file name -> text: `ds4deploy.render.gateway.people_maps`), for the play to
        write on the gateway host.

    Raises:
        UserError: `seen` is not the play's report; one message with every problem: a key file missing, open to
            others or malformed (a person's key reused for another person, or the gateway key given to a person,
            or two gateway keys, among them), a metrics key file kept from an earlier deploy open to others, a
            port of the gateway in use, a backend unreachable, refusing the gateway key, or serving other model
            names. The message never holds a key.
    """
    gw = gateway.load_gateway(name)
    try:
        seen_ = Seen.model_validate(seen)
    except ValidationError as exc:
        raise UserError(f"gateway preflight: the play's report of the gateway host is malformed ({len(exc.errors())} "
                        f"problem(s), first:{problem_lines(exc, None)[0]})",
                        "run it through `make deploy RECIPE=<gateway>` (ansible/roles/gateway/tasks/preflight.yml "
                        "writes that report)") from None
    problems, fixes = [], []
    key = None
    kf = seen_.key_file
    bad = _file_problem("the gateway key file", gw.key_file, kf)
    if bad is None:
        lines = [ln for ln in kf.text.splitlines() if ln.strip().startswith("VLLM_API_KEY")]
        key = parse_env_file(kf.text).get("VLLM_API_KEY")
        if len(lines) > 1:
            bad = (f"the gateway key file {gw.key_file} has {len(lines)} VLLM_API_KEY lines: which key the router "
                   "presents would depend on the reader")
            key = None
        elif not key or not gateway.KEY_RE.match(key):
            bad = f"the gateway key file {gw.key_file} holds no VLLM_API_KEY= line of {KEY_RULE}"
            key = None
    if bad:
        problems.append(bad)
        fixes.append(f"create {gw.key_file} on the gateway host, mode 0600, with one line VLLM_API_KEY=<key> "
                     "(`python3 -c 'import secrets; print(\"VLLM_API_KEY=ds4g-\" + secrets.token_urlsafe(30))'`), "
                     "and give each backend that key (docs/gateway.md, \"Backends\")")
    keys: dict[str, str] = {}
    pf = seen_.people_key_file
    bad = _file_problem("the people key file", gw.people_key_file, pf)
    if bad:
        problems.append(bad)
        fixes.append(f"create {gw.people_key_file} (mode 0600) with one '<person> <key>' line per person")
    else:
        try:
            keys = gateway.parse_people_keys(gw, pf.text, gw.people_key_file)
        except UserError as exc:
            problems.append(exc.cause)
            fixes.append(exc.fix)
    holders = sorted(p for p, k in keys.items() if key is not None and k == key)
    if holders:
        problems.append(f"the people key file gives {', '.join(holders)} the gateway key, which every backend "
                        "accepts: they could call the backends directly, unlogged")
        fixes.append(f"give {', '.join(holders)} a key of their own in {gw.people_key_file}")
    mf, metrics_file = seen_.metrics_key_file, gw.metrics_key_file
    bad = _file_problem("the metrics key file", metrics_file, mf) if mf.exists else None
    if bad:
        problems.append(bad + " (anyone on the gateway host could read the door's /metrics)")
        fixes.append(f"chmod 600 {metrics_file} (delete it to have the deploy generate a new key if others may have "
                     "read it)")
    busy = sorted(seen_.ports_busy)
    if busy:
        problems.append(f"port(s) {', '.join(map(str, busy))} on the gateway host are in use by another process "
                        "(not this gateway's containers)")
        fixes.append("stop that process (`ss -ltnp` names it), or move port / router_port / router_metrics_port in "
                     f"recipes/gateways/{gw.name}.yaml and run `ds4deploy gateway render {gw.name}`")
    if key is not None:
        for b in gateway.resolve_backends(gw):
            wrong = probe(b.url, key, list(b.models))
            if wrong:
                problems.append(f"backend '{b.name}' {wrong}")
        if any(p.startswith("backend ") for p in problems):
            fixes.append("start every backend (`make status` on its host), give each backend's front door the "
                         "gateway key (<its key file>.gateway.env, then redeploy it: docs/gateway.md) and serve "
                         "the model names the recipe lists")
    if problems:
        raise UserError(f"gateway '{gw.name}' cannot be deployed: " + "; ".join(problems),
                        "; ".join(fixes) + ". Nothing was changed on any host")
    return gateway.people_maps(keys)
