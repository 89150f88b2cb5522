"""The backends the deployed gateway tests share (tests/gateway/conftest.py starts them once per run).

Three real llama-server containers (the cpu-llamacpp recipe's image, tiny deepseek4 GGUF and argv), each behind the
cpu-llamacpp recipe's rendered front door, stand for three deployments: each engine holds its own key, each front
door accepts that key and the gateway's (from the backend's ``<key file>.gateway.env``); ``a`` and ``b`` serve
``office-tiny`` (the same model files), ``c`` serves ``office-other``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

from ds4deploy.recipe.load import load_recipe
from ds4deploy.render import compose as render
from ds4deploy.render import front_door
from tools.benchval.stack import wait_healthy

REPO = Path(__file__).resolve().parents[2]
# The committed gateway recipe whose backends these are (`make deploy RECIPE=loopback` in test_make_deploy.py):
# each backend's front door port (what the gateway reaches) and model name are read from it, in one place.
LOOPBACK = yaml.safe_load((REPO / "recipes" / "gateways" / "loopback.yaml").read_text())
BACKEND_PORTS = {b["name"]: int(b["url"].rsplit(":", 1)[1]) for b in LOOPBACK["backends"]}
BACKEND_MODEL = {b["name"]: b["models"][0] for b in LOOPBACK["backends"]}
# The llama-server behind each front door (holding its own key only).
ENGINE_PORTS = {"a": 18124, "b": 18125, "c": 18126}


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


def containers(b: str) -> tuple[str, str]:
    """Backend `b`'s two containers: its engine and its front door."""
    return f"ds4-gwtest-backend-{b}", f"ds4-gwtest-backend-{b}-front-door"


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


def start(tmp: Path) -> dict:
    """Start the three backends (engine and front door each) and wait for their /health through the front door.

    Returns:
        {"gw_key", "own_keys": {b: key}, "backend_url": {b: url}, "names": [container names]}.
    """
    llama = load_recipe("cpu-llamacpp")
    models = model_dir(tmp)
    llama_door = render.render(llama).files[front_door.TEMPLATE_FILE]
    gw_key = "ds4-" + secrets.token_hex(20)
    own_keys = {b: f"ds4-own-{b}-" + secrets.token_hex(20) for b in BACKEND_PORTS}
    keys_dir = tmp / "backend-keys"
    keys_dir.mkdir()
    names = []
    for b, port in BACKEND_PORTS.items():
        write_secret(keys_dir / f"{b}.key", own_keys[b])
        os.chmod(keys_dir / f"{b}.key", 0o644)  # read by llama-server in its container
        # The backend's key files as its deploy leaves them: its own key, its metrics key and, because it serves
        # behind the gateway, <key file>.gateway.env with the gateway's key.
        envs = [write_secret(tmp / f"{b}.env", f"VLLM_API_KEY={own_keys[b]}\n"),
                write_secret(tmp / f"{b}.metrics.env", f"DS4_METRICS_KEY=ds4m-{secrets.token_hex(20)}\n"),
                write_secret(tmp / f"{b}.gateway.env", f"DS4_GATEWAY_KEY={gw_key}\n")]
        engine, door = containers(b)
        names += [engine, door]
        docker("rm", "-f", engine, door, check=False)
        docker("run", "-d", "--name", engine, "--network", "host",
               "-v", f"{models}:/model:ro", "-v", f"{keys_dir}:/keys:ro", "--entrypoint", "/usr/bin/tini",
               llama.image_ref, "--", "llama-server", *engine_args(ENGINE_PORTS[b], BACKEND_MODEL[b]),
               "--api-key-file", f"/keys/{b}.key")
        # The cpu-llamacpp recipe's rendered front door, moved to this backend's ports, run by the front door image
        # with this tree's entrypoint (the image in the daemon may predate it), as the stack's compose runs it.
        template = llama_door.replace(f"listen {front_door.listen(llama)};", f"listen 127.0.0.1:{port};")
        template = template.replace(f"server {front_door.upstream(llama)};", f"server 127.0.0.1:{ENGINE_PORTS[b]};")
        (tmp / f"{b}.conf.template").write_text(template)
        docker("run", "-d", "--name", door, "--network", "host", "--read-only",
               "--tmpfs", "/run", "--tmpfs", "/var/lib/nginx", "--tmpfs", "/var/log/nginx",
               *[a for e in envs for a in ("--env-file", str(e))],
               "-v", f"{tmp / f'{b}.conf.template'}:{front_door.CONTAINER_TEMPLATE}:ro",
               "-v", f"{REPO / 'images' / 'proxy' / 'entrypoint.sh'}:/usr/local/bin/front-door:ro",
               front_door.IMAGE)
    urls = {b: f"http://127.0.0.1:{p}" for b, p in BACKEND_PORTS.items()}
    for url in urls.values():
        wait_healthy(url, 120)
    return {"gw_key": gw_key, "own_keys": own_keys, "backend_url": urls, "names": names}


def revive(*bs: str) -> None:
    """Start backends `bs` again after a test killed them (their containers are kept) and wait for their health."""
    for b in bs:
        docker("start", *containers(b))
    for b in bs:
        wait_healthy(f"http://127.0.0.1:{BACKEND_PORTS[b]}", 120)


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
