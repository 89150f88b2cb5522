"""Real backends and a real gateway on this machine: the one start-up the deployed gateway tests (tests/gateway,
`make e2e-gateway`) and the gateway benchmark (tools/benchval/gateway.py, `make bench-gateway`) share.

Backends: real llama-server containers (the cpu-llamacpp recipe's image, tiny deepseek4 GGUF and argv), each behind
the cpu-llamacpp recipe's rendered front door, stand for deployments: each engine holds its own key, each front door
accepts that key and the gateway's (from the backend's ``<key file>.gateway.env``); ``a`` and ``b`` serve
``office-tiny`` (the same model files), ``c`` serves ``office-other``. `start` starts some or all of them.

Gateway: `gateway_up` renders a gateway recipe over them (the product's `ds4deploy gateway render` code), writes the
gateway and people key files (mode 0600) and the people maps (`ds4deploy gateway keys`), and starts the render with
`docker compose up --wait`; it takes it down again on exit.

A `Rig` names the containers and ports: `TEST_RIG` is the tests', `BENCH_RIG` the benchmark's (other names and
ports, so the two never touch each other's containers).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from ds4deploy.build import gateway_image
from ds4deploy.build.image import image_exists
from ds4deploy.model.manifest import load_manifest
from ds4deploy.recipe.load import load_recipe
from ds4deploy.render import compose as render
from ds4deploy.render import front_door, gateway
from tools.benchval.stack import wait_healthy

REPO = Path(__file__).resolve().parents[1]
# The committed gateway recipe whose backends the tests' rig are (`make deploy RECIPE=loopback` in tests/gateway):
# each backend's front door port (what the gateway reaches) and model name are read from it, in one place.
LOOPBACK = yaml.safe_load((REPO / "recipes" / "gateways" / "loopback.yaml").read_text())
BACKEND_MODEL = {b["name"]: b["models"][0] for b in LOOPBACK["backends"]}


@dataclass(frozen=True)
class Rig:
    """Names and loopback ports of one set of backends: containers ``<prefix>-backend-<b>`` (engine) and
    ``<prefix>-backend-<b>-front-door``; backend -> its front door's port (what the gateway reaches), and backend ->
    its llama-server's port (the engine holds its own key only)."""

    prefix: str
    backend_ports: dict[str, int]
    engine_ports: dict[str, int]


TEST_RIG = Rig("ds4-gwtest", {b["name"]: int(b["url"].rsplit(":", 1)[1]) for b in LOOPBACK["backends"]},
               {"a": 18124, "b": 18125, "c": 18126})
BENCH_RIG = Rig("ds4-gwbench", {"a": 18221, "b": 18222, "c": 18223}, {"a": 18224, "b": 18225, "c": 18226})
# The tests' ports, as the tests name them.
BACKEND_PORTS = TEST_RIG.backend_ports
ENGINE_PORTS = TEST_RIG.engine_ports


def engine_args(port: int, model: str) -> list[str]:
    """The cpu-llamacpp recipe's committed llama-server argv (compose/cpu-llamacpp/engine-args.json: the stack's
    model file, context, slots, default output length, threads and flags, so the conformance matrix through the
    gateway meets the engine the stack's own matrix met), listening on 127.0.0.1:`port` and serving `model`."""
    argv = json.loads((REPO / "compose" / "cpu-llamacpp" / "engine-args.json").read_text())
    for flag, value in (("--port", str(port)), ("-a", model), ("--host", "127.0.0.1")):
        argv[argv.index(flag) + 1] = value
    return argv


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`docker <args>`, output captured."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def containers(b: str, rig: Rig = TEST_RIG) -> tuple[str, str]:
    """Backend `b`'s two containers: its engine and its front door."""
    return f"{rig.prefix}-backend-{b}", f"{rig.prefix}-backend-{b}-front-door"


def missing() -> str | None:
    """Why the rig cannot start here (no Docker daemon, no llama-server image, no front door image), with the fix;
    None when it can."""
    import shutil

    if shutil.which("docker") is None or docker("info", check=False).returncode != 0:
        return "no Docker daemon: the gateway rig runs real containers"
    llama = load_recipe("cpu-llamacpp")
    if not image_exists(llama.image_ref):
        return f"no {llama.image_ref}: build it with `make llamacpp` or `make deploy RECIPE=cpu-llamacpp`"
    if not image_exists(front_door.IMAGE):
        return f"no {front_door.IMAGE}: `make deploy RECIPE=cpu-llamacpp` builds it"
    return None


def model_dir(tmp: Path) -> Path:
    """The cpu-llamacpp recipe's tiny GGUF, staged into `tmp` by the product's own `ds4deploy model stage`
    (generated and verified against the committed manifest; about 5 s)."""
    dest = tmp / "model"
    subprocess.run([sys.executable, "-m", "ds4deploy.cli", "model", "stage", "cpu-llamacpp", "--dest", str(dest)],
                   check=True, cwd=REPO, capture_output=True)
    return dest


def write_secret(path: Path, text: str) -> Path:
    """Write `text` to `path` with mode 0600 (as a key file is kept)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def start(tmp: Path, which: tuple[str, ...] = tuple(BACKEND_MODEL), rig: Rig = TEST_RIG) -> dict:
    """Start backends `which` (engine and front door each) and wait for their /health through the front door.

    Returns:
        {"gw_key", "own_keys": {b: key}, "backend_url": {b: url}, "names": [container names]}.
    """
    llama = load_recipe("cpu-llamacpp")
    models = model_dir(tmp)
    llama_door = render.render(llama).files[front_door.TEMPLATE_FILE]
    gw_key = "ds4-" + secrets.token_hex(20)
    own_keys = {b: f"ds4-own-{b}-" + secrets.token_hex(20) for b in which}
    keys_dir = tmp / "backend-keys"
    keys_dir.mkdir()
    names = []
    for b in which:
        port = rig.backend_ports[b]
        write_secret(keys_dir / f"{b}.key", own_keys[b])
        os.chmod(keys_dir / f"{b}.key", 0o644)  # read by llama-server in its container
        # The backend's key files as its deploy leaves them: its own key, its metrics key and, because it serves
        # behind the gateway, <key file>.gateway.env with the gateway's key.
        envs = [write_secret(tmp / f"{b}.env", f"VLLM_API_KEY={own_keys[b]}\n"),
                write_secret(tmp / f"{b}.metrics.env", f"DS4_METRICS_KEY=ds4m-{secrets.token_hex(20)}\n"),
                write_secret(tmp / f"{b}.gateway.env", f"DS4_GATEWAY_KEY={gw_key}\n")]
        engine, door = containers(b, rig)
        names += [engine, door]
        docker("rm", "-f", engine, door, check=False)
        docker("run", "-d", "--name", engine, "--network", "host",
               "-v", f"{models}:/model:ro", "-v", f"{keys_dir}:/keys:ro", "--entrypoint", "/usr/bin/tini",
               llama.image_ref, "--", "llama-server", *engine_args(rig.engine_ports[b], BACKEND_MODEL[b]),
               "--api-key-file", f"/keys/{b}.key")
        # The cpu-llamacpp recipe's rendered front door, moved to this backend's ports, run by the front door image
        # with this tree's entrypoint (the image in the daemon may predate it), as the stack's compose runs it.
        template = llama_door.replace(f"listen {front_door.listen(llama)};", f"listen 127.0.0.1:{port};")
        template = template.replace(f"server {front_door.upstream(llama)};", f"server 127.0.0.1:{rig.engine_ports[b]};")
        (tmp / f"{b}.conf.template").write_text(template)
        docker("run", "-d", "--name", door, "--network", "host", "--read-only",
               "--tmpfs", "/run", "--tmpfs", "/var/lib/nginx", "--tmpfs", "/var/log/nginx",
               *[a for e in envs for a in ("--env-file", str(e))],
               "-v", f"{tmp / f'{b}.conf.template'}:{front_door.CONTAINER_TEMPLATE}:ro",
               "-v", f"{REPO / 'images' / 'proxy' / 'entrypoint.sh'}:/usr/local/bin/front-door:ro",
               front_door.IMAGE)
    urls = {b: f"http://127.0.0.1:{rig.backend_ports[b]}" for b in which}
    for url in urls.values():
        wait_healthy(url, 120)
    return {"gw_key": gw_key, "own_keys": own_keys, "backend_url": urls, "names": names}


def revive(*bs: str, rig: Rig = TEST_RIG) -> None:
    """Start backends `bs` again after a test killed them (their containers are kept) and wait for their health."""
    for b in bs:
        docker("start", *containers(b, rig))
    for b in bs:
        wait_healthy(f"http://127.0.0.1:{rig.backend_ports[b]}", 120)


def backend_doc(b: str, rig: Rig = TEST_RIG) -> dict:
    """Backend `b` as a gateway recipe names it: by URL, with its model name and the cpu-llamacpp model's identity
    (the manifest every backend's files come from)."""
    ident = gateway.manifest_identity(load_manifest(load_recipe("cpu-llamacpp"))["files"])
    return {"name": b, "url": f"http://127.0.0.1:{rig.backend_ports[b]}", "models": [BACKEND_MODEL[b]],
            "manifest_sha256": ident}


@contextlib.contextmanager
def gateway_up(tmp: Path, recipe: dict, gw_key: str, wait_s: int = 120) -> Iterator[dict]:
    """Render gateway `recipe` (a gateway recipe as a dict, without its key files), start it, take it down on exit.

    Writes into `tmp`: the people key file (a fresh key per person of the recipe) and the gateway key file holding
    `gw_key` (both 0600) with its metrics key file, the recipe, the render under ``render/``, and the people maps
    (`ds4deploy gateway keys`). Builds the router image first when the recipe routes with SMG (a no-op once built).

    Yields:
        {"url", "keys": {person: key}, "recipe": recipe path, "people_file", "gw_key", "compose": compose file,
        "keys_output": what `ds4deploy gateway keys` printed, "name"}.
    Raises:
        AssertionError: `docker compose up --wait` failed (with compose's output and the containers' logs).
    """
    name = recipe["name"]
    t0 = time.monotonic()
    if recipe.get("routing", {}).get("router", "smg") == "smg":
        image = gateway_image.build()
        print(f"\ngateway image {image} ready in {time.monotonic() - t0:.0f} s")
    people_keys = {p["name"]: f"ds4p-{p['name']}-" + secrets.token_urlsafe(30) for p in recipe["people"]}
    people_file = write_secret(tmp / "people", "".join(f"{p} {k}\n" for p, k in people_keys.items()))
    key_file = write_secret(tmp / "gateway.env", f"VLLM_API_KEY={gw_key}\n")
    write_secret(tmp / "gateway.metrics.env", "DS4_METRICS_KEY=ds4m-" + secrets.token_hex(20) + "\n")
    recipe = {**recipe, "people_key_file": str(people_file), "key_file": str(key_file)}
    recipe_path = tmp / f"{name}.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    gw = gateway.load_gateway(recipe_path)
    gateway.write([(gw, gateway.render(gw))], tmp / "render")
    compose = tmp / "render" / name / "compose.yaml"
    keys = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "gateway", "keys", str(recipe_path)],
                          capture_output=True, text=True, check=True, cwd=REPO)
    up = subprocess.run(["docker", "compose", "-f", str(compose), "up", "-d", "--wait", "--wait-timeout", str(wait_s)],
                        capture_output=True, text=True, check=False)
    try:
        if up.returncode != 0:
            logs = "".join(docker("logs", c, check=False).stderr[-3000:] for c in
                           (f"{gateway.project_name(gw)}-router", gateway.front_door_container(gw)))
            raise AssertionError(up.stdout + up.stderr + logs)
        print(f"gateway {name} up in {time.monotonic() - t0:.0f} s")
        yield {"url": f"http://127.0.0.1:{recipe['port']}", "keys": people_keys, "recipe": recipe_path,
               "people_file": people_file, "gw_key": gw_key, "compose": compose, "keys_output": keys.stdout,
               "name": name}
    finally:
        subprocess.run(["docker", "compose", "-f", str(compose), "down", "-v", "--timeout", "10"],
                       capture_output=True, check=False)


# The gateway the deployed tests deploy with the product's make targets: the committed loopback recipe, on this host.
GATEWAY = LOOPBACK["name"]
INVENTORY = "ansible/inventories/local.yml"


def make(target: str) -> subprocess.CompletedProcess:
    """`make <target> RECIPE=loopback INVENTORY=<the local inventory>` in the repository (no colours), captured."""
    return subprocess.run(["make", "--no-print-directory", target, f"RECIPE={GATEWAY}", f"INVENTORY={INVENTORY}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "CI": "1", "ANSIBLE_NOCOLOR": "1"})


def gateway_containers() -> list[str]:
    """Every container of the loopback gateway's compose project, running or not."""
    return docker("ps", "--all", "--filter", f"label=com.docker.compose.project=ds4-gw-{GATEWAY}",
                  "--format", "{{.Names}}").stdout.split()
