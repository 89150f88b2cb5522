"""Gateway recipes (kind: gateway, ``recipes/gateways/<name>.yaml``): load, check against the recipes they name,
read the people key file, and render ``compose/gateways/<name>/`` (docs/gateway.md).

The gateway is two containers on the gateway host, both on host networking:

- ``router``: SMG (Shepherd Model Gateway, images/gateway/) on 127.0.0.1:<router_port>, with every backend's URL,
  a load-aware policy and sticky sessions keyed on the recipe's session header. It holds the gateway key (the key
  file's ``VLLM_API_KEY``, read by images/gateway/router-launch.py from the environment, never from argv) and
  presents it to every backend.
- ``front-door``: the stacks' nginx front door image with a config of its own: one key per person (``Bearer`` or
  ``x-api-key``, from maps written on the host from the people key file, never from the render), one JSON access
  log line per request naming the person, and the gateway key presented to the router.

With ``routing.router: nginx`` there is no router container: the front door routes itself, with an nginx
``upstream`` of the backends hashed on the session header (consistent hashing), another backend tried when one
refuses or times out the connection, and one model name per gateway (nginx does not read the body).

A gateway recipe never holds a key: the people key file (``<person> <key>`` lines, mode 0600) and the gateway key
file live on the gateway host. Revoking a person is removing their line and running ``ds4deploy gateway keys``,
which rewrites the maps and reloads nginx gracefully (open streams finish on the old workers).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from ds4deploy.build.gateway_image import image_ref
from ds4deploy.core.errors import UserError
from ds4deploy.core.keys import KEY_RE, KEY_RULE
from ds4deploy.core.net import is_loopback_host, same_host, url_host
from ds4deploy.core.secret_scan import find_secrets
from ds4deploy.core.yamlio import ComposeDumper, load_strict
from ds4deploy.recipe import paths
from ds4deploy.recipe.load import load_recipe, problem_lines, split_variant
from ds4deploy.recipe.schema import VARIANT_SEP, GatewayRecipe
from ds4deploy.render import front_door
from ds4deploy.render.compose import COMPOSE_DIR, Rendered, compose_config, write_all

# Where the people maps are mounted in the front door container (written on the host by `write_people_maps`).
CONTAINER_PEOPLE_DIR = "/etc/ds4deploy/people"
PERSON_LINE_RE = re.compile(r"^(?P<person>\S+)\s+(?P<key>\S+)$")
# The compose services of a gateway render: the router (SMG; none with routing.router nginx) and the front door.
ROUTER_SERVICE = "router"
DOOR_SERVICE = "front-door"


def gateways_dir() -> Path:
    """``recipes/gateways/``: where gateway recipes live (beside, not among, the stack recipes)."""
    return paths.RECIPES_DIR / "gateways"


def render_root() -> Path:
    """``compose/gateways/``: where the gateway renders are committed."""
    return COMPOSE_DIR / "gateways"


def gateway_names() -> list[str]:
    """The names of every gateway recipe, sorted."""
    return sorted(p.stem for p in gateways_dir().glob("*.yaml"))


def load_gateway(name_or_path: str | Path) -> GatewayRecipe:
    """Load and validate a gateway recipe, then check it against the recipes it names (`resolve_backends`).

    Args:
        name_or_path: a name under recipes/gateways/ (without .yaml) or a path to a YAML file.
    Returns:
        The validated `GatewayRecipe`.
    Raises:
        UserError: missing file, YAML error, credentials in the file, schema problems (each with its key path,
            value, line and what is allowed), a name that is also a stack recipe's, or a backend problem
            (`resolve_backends`).
    """
    text = str(name_or_path)
    path = Path(text) if text.endswith((".yaml", ".yml")) or "/" in text else gateways_dir() / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(gateway_names()) or "(none)"
        raise UserError(f"no gateway recipe {path}", f"use one of: {known}, or a path to a gateway recipe file")
    doc = load_strict(path, recipe=True)
    if not isinstance(doc.data, dict):
        raise UserError(f"{path}: a gateway recipe must be a YAML mapping", "start from recipes/gateways/office.yaml")
    if "kind" not in doc.data and "schema_version" in doc.data:
        raise UserError(f"{path} is a stack recipe (no kind: gateway), not a gateway recipe",
                        f"use `ds4deploy render {path}` for a stack; a gateway recipe starts with kind: gateway "
                        "(recipes/gateways/office.yaml)")
    secrets = find_secrets(doc.data)
    if secrets:
        raise UserError(f"{path}: the gateway recipe holds credentials: " + "; ".join(secrets),
                        "remove them: people's keys belong in people_key_file, the gateway key in key_file, both "
                        "on the gateway host")
    try:
        gw = GatewayRecipe.model_validate(doc.data)
    except ValidationError as exc:
        lines = problem_lines(exc, doc)
        raise UserError(f"{path}: {len(lines)} problem(s) in the gateway recipe:\n" + "\n".join(lines),
                        f"edit {path} as listed above; recipes/gateways/office.yaml is a valid example") from None
    if gw.name != path.stem:
        raise UserError(f"{path}: gateway name '{gw.name}' differs from its file name '{path.stem}'",
                        f"set name: {path.stem}, or rename the file")
    gw._source = path
    if (paths.RECIPES_DIR / f"{gw.name}.yaml").is_file():
        # `make deploy RECIPE=<name>` takes a gateway recipe's path when one exists by that name (Makefile GATEWAY):
        # a stack of the same name could no longer be deployed, status-checked or taken down by name.
        raise UserError(f"{path}: gateway name '{gw.name}' is also the name of the stack recipe "
                        f"{paths.RECIPES_DIR / (gw.name + '.yaml')}; make deploy/status/down RECIPE={gw.name} "
                        "would take the gateway", "give the gateway a name of its own (its file name and name:)")
    if gw.routing.router == "nginx" and len(gw.models) > 1:
        raise UserError(f"{path}: routing.router nginx serves one model name, and models lists {len(gw.models)} "
                        f"({', '.join(gw.models)}): nginx picks a backend before it reads the request body, so it "
                        "cannot route by the body's model name",
                        "list one model name in models (and only backends serving it), run one nginx gateway per "
                        "model name on its own port, or set routing.router: smg, which routes by model name")
    resolve_backends(gw)
    return gw


@dataclass(frozen=True)
class Backend:
    """A backend as the router sees it: its name, URL, the model names it serves and the model's identity
    (the sha256 of its manifest's file list, or of the recipe name where no manifest is committed)."""

    name: str
    url: str
    models: tuple[str, ...]
    identity: str


def manifest_identity(files: dict) -> str:
    """sha256 (hex) of a manifest's ``files`` mapping (file name -> size and sha256), in canonical JSON: two
    deployments of the same model files have the same identity whatever recipe or source named them."""
    canon = json.dumps(files, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _reachable_variants(base: str) -> list[str]:
    """``<base>--<variant>`` for each variant of recipe `base` that listens beyond loopback (each loaded as a deploy
    loads it)."""
    names = [f"{base}{VARIANT_SEP}{v}" for v in sorted(load_recipe(base).variants)]
    return [n for n in names if not is_loopback_host(load_recipe(n).serving.bind_address)]


def _endpoint_problems(gw: GatewayRecipe, backends: list[Backend]) -> list[str]:
    """Two backends at one ``host:port`` (the router would count one server twice), and a backend at one of the
    gateway's own ports on its loopback or bind address (the gateway would send requests to itself)."""
    problems, seen = [], {}
    own = {gw.port, gw.router_port, gw.router_metrics_port} - {None}
    for be in backends:
        host, port = be.url.removeprefix("http://").rsplit(":", 1)
        host = host.strip("[]")
        endpoint = f"{same_host(host)}:{port}"
        if endpoint in seen:
            problems.append(f"backends '{seen[endpoint]}' and '{be.name}' are one server ({endpoint}): list it once")
        seen.setdefault(endpoint, be.name)
        if int(port) in own and (is_loopback_host(host) or same_host(host) == same_host(gw.bind_address)):
            problems.append(f"backend '{be.name}' ({endpoint}) is the gateway itself (its port, router_port or "
                            "router_metrics_port): name the backend's own address and port")
    return problems


def resolve_backends(gw: GatewayRecipe) -> list[Backend]:
    """Every backend's URL, model names and model identity; the checks that need the recipes.

    Raises:
        UserError: a backend names a recipe (or variant) that does not exist; a recipe backend on another host whose
            recipe listens on loopback only (the gateway could never reach it); two backends at one host:port, or one
            at the gateway's own port (`_endpoint_problems`); two backends serve one model name with different models
            (manifests differ); a model of ``models`` no backend serves. One message with every problem.
    """
    from ds4deploy.model.manifest import load_manifest, manifest_path

    out, problems = [], []
    for b in gw.backends:
        if b.recipe is None:
            assert b.url is not None
            out.append(Backend(b.name, b.url, tuple(b.models), b.manifest_sha256 or f"url:{b.url}"))
            continue
        base = split_variant(b.recipe)[0]
        if not (paths.RECIPES_DIR / f"{base}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in paths.RECIPES_DIR.glob("*.yaml")))
            problems.append(f"backend '{b.name}' names recipe '{b.recipe}', which does not exist (recipes: {known}; "
                            f"a variant is <recipe>{VARIANT_SEP}<variant>)")
            continue
        try:
            r = load_recipe(b.recipe)
        except UserError as exc:  # an unknown variant, or a recipe that does not validate
            problems.append(f"backend '{b.name}': {exc.cause} ({exc.fix})")
            continue
        if is_loopback_host(r.serving.bind_address) and not is_loopback_host(b.host or ""):
            # The recipe's server answers on its own host's loopback only: from the gateway it is a refused
            # connection on every request, which the deploy's probe would report only as "unreachable".
            open_ = _reachable_variants(r.base_name)
            instead = (f"name its variant {' or '.join(open_)}, which listens on the network," if open_ else
                       f"add a variant to recipes/{r.base_name}.yaml with serving.bind_address: 0.0.0.0 and name "
                       "it here,")
            problems.append(f"backend '{b.name}': recipe '{b.recipe}' listens on {r.serving.bind_address} only "
                            f"(serving.bind_address), so the gateway cannot reach it at {b.host}: {instead} or run "
                            "the gateway on that host with host: 127.0.0.1")
        ident = (manifest_identity(load_manifest(r)["files"]) if manifest_path(r).is_file()
                 else f"recipe:{r.base_name}")
        out.append(Backend(b.name, f"http://{url_host(b.host or '')}:{r.serving.port}",
                           (r.model.served_name, *r.model.aliases),
                           ident))
    problems += _endpoint_problems(gw, out)
    by_model: dict[str, list[Backend]] = {}
    for be in out:
        for m in be.models:
            by_model.setdefault(m, []).append(be)
    for m, bes in sorted(by_model.items()):
        if len({be.identity for be in bes}) > 1:
            listed = ", ".join(f"{be.name} ({be.identity if ':' in be.identity else be.identity[:12]})" for be in bes)
            problems.append(f"model name '{m}' is served by backends with different models: {listed}; the router "
                            "would answer one session from two different models")
    for m in gw.models:
        if m not in by_model and not problems:
            problems.append(f"models lists '{m}', which no backend serves (served: {', '.join(sorted(by_model))})")
    if gw.routing.router == "nginx" and not problems:
        # nginx sends every request to the hashed backend without reading its body: each backend must serve it.
        model = gw.models[0]
        for be in out:
            if model not in be.models:
                problems.append(f"backend '{be.name}' does not serve '{model}' (it serves {', '.join(be.models)}), "
                                "and router nginx sends every request to any backend")
    if problems:
        where = gw._source or gw.name
        raise UserError(f"{where}: " + "; ".join(problems),
                        "name recipes that exist and the gateway can reach (each problem above says how), and give "
                        "each model name one model: rename a model (model.served_name / aliases in its recipe) or "
                        "remove one of the backends; a url backend states its model's manifest_sha256 (`ds4deploy "
                        "gateway model-id <recipe>`)")
    return out


def read_people_keys(gw: GatewayRecipe, path: Path | None = None) -> dict[str, str]:
    """The people key file: ``<person> <key>`` per line (``#`` comments and blank lines allowed), mode 0600.

    Returns:
        person -> key, for the people the recipe lists (a person listed without a line simply has no key yet).
    Raises:
        UserError: the file is missing, readable by others, or has a malformed line, a person the recipe does not
            list, a person twice, a key shorter than 32 characters or of other characters than A-Z a-z 0-9 _ -, or
            one key given to two people. The message names line numbers and people, never a key.
    """
    path = Path(path or gw.people_key_file)
    if not path.is_file():
        raise UserError(f"gateway '{gw.name}': no people key file {path}",
                        "create it (mode 0600) with one '<person> <key>' line per person of the recipe; a key: "
                        "`python3 -c 'import secrets; print(\"ds4p-\" + secrets.token_urlsafe(30))'`")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise UserError(f"{path} is readable or writable by group or others (mode "
                        f"{stat.S_IMODE(path.stat().st_mode):04o})", f"chmod 600 {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the people key file {path}: {getattr(exc, 'strerror', None) or 'not UTF-8 text'}",
                        "run as the file's owner (sudo), and keep it UTF-8 text of '<person> <key>' lines") from None
    return parse_people_keys(gw, text, str(path))


def parse_people_keys(gw: GatewayRecipe, text: str, where: str) -> dict[str, str]:
    """The people key file's text (`read_people_keys`; the gateway deploy reads it on the gateway host): person ->
    key for the people the recipe lists.

    Raises:
        UserError: a malformed line, a person the recipe does not list, a person twice, a short key or one of other
            characters, one key given to two people (line numbers and people named, never a key; `where` names the
            file).
    """
    listed = {p.name for p in gw.people}
    keys: dict[str, str] = {}
    owner: dict[str, tuple[str, int]] = {}
    problems = []
    # A byte order mark (an editor's UTF-8 "with BOM") is no part of the first person's name.
    for n, raw in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = PERSON_LINE_RE.match(line)
        if not m:
            problems.append(f"line {n} is not '<person> <key>'")
            continue
        person, key = m["person"], m["key"]
        if person not in listed and KEY_RE.match(person):
            # Never quoted: a line written the wrong way round ('<key> <person>') would put the key in the message.
            problems.append(f"line {n}: its first field looks like a key; the format is '<person> <key>'")
        elif person not in listed:
            # Not quoted either: a key the wrong way round that fails KEY_RE (too short, other characters) lands here.
            problems.append(f"line {n} names a person who is not in the recipe's people "
                            f"({', '.join(sorted(listed))})")
        elif person in keys:
            problems.append(f"line {n} gives '{person}' a second key")
        elif not KEY_RE.match(key):
            problems.append(f"line {n} ('{person}'): the key is not {KEY_RULE}")
        elif key in owner:
            first, first_line = owner[key]
            problems.append(f"line {n} gives '{person}' the key of '{first}' (line {first_line}): the log could not "
                            "tell them apart and revoking one would revoke both")
        else:
            keys[person] = key
            owner[key] = (person, n)
    if problems:
        raise UserError(f"{where}: " + "; ".join(problems),
                        f"one line per person of the recipe, each with a key of their own ({KEY_RULE})")
    return keys


def people_maps(keys: dict[str, str]) -> dict[str, str]:
    """The two nginx map include files the front door reads: ``bearer.map`` (Authorization header) and
    ``x-api-key.map``, each ``"<regex>" <person>;`` per person. Regular expressions, so the key compares
    case-sensitively (plain nginx map strings compare ignoring case); the key alphabet is literal in them."""
    bearer = "".join(f'"~^[Bb][Ee][Aa][Rr][Ee][Rr] +{k}$" {p};\n' for p, k in sorted(keys.items()))
    xkey = "".join(f'"~^{k}$" {p};\n' for p, k in sorted(keys.items()))
    return {"bearer.map": bearer, "x-api-key.map": xkey}


def people_dir(gw: GatewayRecipe) -> Path:
    """The host directory holding the people maps (``<people_key_file>.d``), mounted read-only into the front
    door. A directory, not files: maps replaced by rename are seen by the container (a file bind mount would keep
    the old inode)."""
    return Path(f"{gw.people_key_file}.d")


def write_people_maps(gw: GatewayRecipe, keys: dict[str, str], dest: Path | None = None) -> Path:
    """Write `people_maps` into `dest` (default `people_dir`), mode 0700 directory and 0600 files, each replaced
    atomically (written beside, then renamed). Returns the directory."""
    dest = Path(dest or people_dir(gw))
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(dest, 0o700)
        for name, text in people_maps(keys).items():
            tmp = dest / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, dest / name)
    except OSError as exc:
        raise UserError(f"cannot write the people maps in {dest}: {exc.strerror}",
                        "run as the owner of the people key file (sudo), or pass --dest a folder you can write"
                        ) from None
    return dest


def project_name(gw: GatewayRecipe) -> str:
    """The compose project name of a gateway: ``ds4-gw-<name>``."""
    return f"ds4-gw-{gw.name}"


def front_door_container(gw: GatewayRecipe) -> str:
    """The front door container's name (`ds4deploy gateway usage` reads its log, `keys` reloads it)."""
    return f"{project_name(gw)}-front-door"


def router_argv(gw: GatewayRecipe, backends: list[Backend]) -> list[str]:
    """SMG's flags (``smg launch --help`` of smg 1.13.0; docs/sources.md#gateway-smg). No key: the launcher adds
    it from the environment."""
    r = gw.routing
    return ["--host", "127.0.0.1", "--port", str(gw.router_port),
            "--worker-urls", *[b.url for b in backends],
            "--policy", r.policy,
            "--sticky-sessions", "--routing-key-headers", r.session_header,
            "--sticky-key-idle-secs", str(r.sticky_idle_s),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(gw.router_metrics_port),
            "--log-level", "warn"]


# The OpenAI API routes a person may reach through the gateway's door, exact paths (the Anthropic ones, /v1/messages
# and /v1/messages/count_tokens, pass by front_door.ANTHROPIC_PREFIXES): the ones vLLM and llama-server serve to
# clients (https://platform.openai.com/docs/api-reference: models, chat completions, completions, embeddings).
# Every other path is refused at the door: SMG registers its admin and stored-state routes beside the client ones,
# some under /v1/ (/workers, /v1/tokenizers, /v1/responses/{id}, /v1/conversations: lightseekorg/smg
# model_gateway/src/server.rs), and the door would call them with the gateway key.
CLIENT_ROUTES = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings")

# The router's answers to a request whose model has a fallback that make the front door resend it under the fallback
# name (templates/gateway-front-door.conf.j2, images/proxy/fallback.js), seen from SMG 1.13.0 on this host
# (docs/gateway.md, "Fallback model"): 404 model_not_found (no worker of the name: drained, or never registered),
# 500 call_upstream_connection_failed (the worker it chose refused the connection: host or front door down), 502 and
# 504 (that worker's front door: its engine not answering, or too late; also the door's own when the router is
# down), 503 (unavailable). Each comes before any byte of an answer. An engine's own 500 (llama-server answers one
# for some requests it cannot handle) is resent too: the door does not read the answer it drops.
FALLBACK_STATUSES = (404, 500, 502, 503, 504)


def _front_door_conf(gw: GatewayRecipe, backends: list[Backend]) -> str:
    """The gateway front door's nginx config template (``${VLLM_API_KEY}`` and ``${DS4_METRICS_KEY}`` substituted
    by the front door image's entrypoint at start, as for every stack). With ``routing.router: nginx`` the front
    door is the router too: an ``upstream`` of every backend's ``host:port``, hashed on the session header."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(loader=PackageLoader("ds4deploy", "templates"), undefined=StrictUndefined,
                      keep_trailing_newline=True, autoescape=False)  # noqa: S701 (nginx config, not HTML)
    errors = {s: {"openai": front_door.error_body(s, "openai"), "anthropic": front_door.error_body(s, "anthropic"),
                  "status": front_door.CLIENT_STATUS.get(s, s)} for s in front_door.ERRORS}
    session_var = "$http_" + gw.routing.session_header.replace("-", "_")
    nginx_router = gw.routing.router == "nginx"
    return env.get_template("gateway-front-door.conf.j2").render(
        gw=gw, listen=f"{gw.bind_address}:{gw.port}", router=f"127.0.0.1:{gw.router_port}",
        nginx_router=nginx_router, backends=[b.url.removeprefix("http://") for b in backends],
        backend_var="$upstream_addr" if nginx_router else "$upstream_http_x_smg_routed_worker_id",
        people_dir=CONTAINER_PEOPLE_DIR, session_var=session_var, errors=errors,
        anthropic_prefixes=front_door.ANTHROPIC_PREFIXES, request_errors=front_door.REQUEST_ERRORS,
        client_routes=CLIENT_ROUTES, fallback_statuses=FALLBACK_STATUSES,
        fallback_json=json.dumps(dict(sorted(gw.fallback.items())), separators=(",", ":")))


def render(gw: GatewayRecipe) -> dict[str, str]:
    """The files of ``compose/gateways/<name>/``: ``compose.yaml``, ``front-door.conf.template``,
    ``router-args.json`` (SMG only; ``routing.router: nginx`` renders the front door alone, routing itself). Holds no
    key (checked with the one secret detector)."""
    backends = resolve_backends(gw)
    nginx_router = gw.routing.router == "nginx"
    argv = [] if nginx_router else router_argv(gw, backends)
    conf = _front_door_conf(gw, backends)
    conf_sha = hashlib.sha256(conf.encode()).hexdigest()
    log = {"driver": "json-file", "options": {"max-size": "50m", "max-file": "5"}}
    label = {"io.ds4deploy.gateway": gw.name}
    secrets_env = [{"path": f"${{DS4_GATEWAY_KEY_FILE:-{gw.key_file}}}", "required": True}]
    compose = {
        "name": project_name(gw),
        "services": {
            ROUTER_SERVICE: {
                "image": image_ref(),
                "container_name": f"{project_name(gw)}-router",
                "command": argv,
                "env_file": secrets_env,
                "network_mode": "host",
                "read_only": True,
                "tmpfs": ["/tmp"],  # noqa: S108 (a tmpfs inside the read-only container, for SMG and Python)
                "healthcheck": {"test": ["CMD", "curl", "-fsS", "-o", "/dev/null", "--max-time", "5",
                                         f"http://127.0.0.1:{gw.router_port}/liveness"],
                                "interval": "10s", "timeout": "6s", "retries": 3, "start_period": "30s"},
                "restart": "unless-stopped", "stop_grace_period": "30s", "logging": log,
                "labels": {**label, "io.ds4deploy.role": "router"},
            },
            DOOR_SERVICE: {
                "image": front_door.IMAGE,
                "container_name": front_door_container(gw),
                "env_file": [*secrets_env,
                             {"path": f"${{DS4_GATEWAY_METRICS_FILE:-{gw.metrics_key_file}}}",
                              "required": False}],
                "environment": {"DS4_FRONT_DOOR_CONF_SHA256": conf_sha},
                "depends_on": {ROUTER_SERVICE: {"condition": "service_healthy"}},
                "network_mode": "host",
                "read_only": True,
                "tmpfs": ["/run", "/var/lib/nginx", "/var/log/nginx"],
                "volumes": [f"./{front_door.TEMPLATE_FILE}:{front_door.CONTAINER_TEMPLATE}:ro",
                            f"${{DS4_GATEWAY_PEOPLE_DIR:-{people_dir(gw)}}}:{CONTAINER_PEOPLE_DIR}:ro"],
                "healthcheck": {"test": ["CMD", "bash", "-c",
                                         f"exec 3<>/dev/tcp/127.0.0.1/{gw.port} && printf 'GET /health "
                                         "HTTP/1.0\\r\\n\\r\\n' >&3 && head -1 <&3 | grep -q ' 200 '"],
                                "interval": "10s", "timeout": "6s", "retries": 3, "start_period": "30s"},
                "restart": "unless-stopped", "stop_grace_period": "10s", "logging": log,
                "labels": {**label, "io.ds4deploy.role": "front-door"},
            },
        },
    }
    if nginx_router:
        # The front door routes itself: no router service to wait for.
        del compose["services"][ROUTER_SERVICE]
        del compose["services"][DOOR_SERVICE]["depends_on"]
    head = (f"# Rendered by `ds4deploy gateway render {gw.name}` from recipes/gateways/{gw.name}.yaml. Do not edit "
            "by hand.\n# Keys: the gateway key file and the people maps on the gateway host, never here "
            "(docs/gateway.md).\n")
    files = {
        "compose.yaml": head + yaml.dump(compose, Dumper=ComposeDumper, sort_keys=False, width=120),
        front_door.TEMPLATE_FILE: conf,
    }
    if not nginx_router:
        files["router-args.json"] = json.dumps(argv, indent=2) + "\n"
    hits = find_secrets({name: text.splitlines() for name, text in files.items()})
    if hits:
        raise UserError(f"gateway '{gw.name}': the render would hold credentials: " + "; ".join(hits),
                        "keys belong in the key files on the gateway host")
    return files


def stale(gw: GatewayRecipe, files: dict[str, str], root: Path | None = None) -> list[str]:
    """Files of ``compose/gateways/<name>/`` that are missing, differ from `files`, or are not rendered."""
    d = (root or render_root()) / gw.name
    out = [f"{d / n} is {'stale' if (d / n).is_file() else 'missing'}" for n, t in sorted(files.items())
           if not (d / n).is_file() or (d / n).read_text(encoding="utf-8") != t]
    if d.is_dir():
        out += [f"{d / p.name} is not rendered" for p in sorted(d.iterdir()) if p.name not in files]
    return out


# What compose reads from the deploy's environment when it checks a gateway render: the key file as /dev/null (the
# real one lives on the gateway host only).
CHECK_ENV = {"DS4_GATEWAY_KEY_FILE": "/dev/null"}


def compose_check(gw: GatewayRecipe, root: Path | None = None) -> None:
    """The real `docker compose config` on the committed ``compose.yaml`` (the key file given as /dev/null).

    Raises:
        UserError: no compose binary, or compose refuses the file (its own message).
    """
    compose_config((root or render_root()) / gw.name / "compose.yaml", fmt="quiet", env=CHECK_ENV)


def write(renders: list[tuple[GatewayRecipe, dict[str, str]]], root: Path | None = None) -> list[Path]:
    """Write each gateway's `files` into ``compose/gateways/<name>/`` all or nothing, as the stacks' renders are
    written (`ds4deploy.render.compose.write_all`: staged, every compose file checked by the real `docker compose
    config`, then swapped in). Returns the paths whose content changed.

    Raises:
        UserError: compose refuses a render, or the render folder cannot be written (nothing changed).
    """
    return write_all([Rendered(gw.name, files) for gw, files in renders], root or render_root(), env=CHECK_ENV)
