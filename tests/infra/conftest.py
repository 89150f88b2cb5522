"""Fixtures for the host and serving checks.

Run from `make test`, or against any inventory:
    pytest tests/infra --hosts=ansible://all --ansible-inventory ansible/inventories/local.yml

The recipe comes from $DS4_RECIPE (default ``cpu``); every expectation comes from its rendered
compose/<recipe>/deploy-vars.yml, never from a copy in the tests.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from ds4deploy.core.net import base_url as url_for
from ds4deploy.operate.key_file import parse_env_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def supervisor_paused():
    """The deployed supervisor stopped for a module's tests and started again after, as `make bench` does: its
    progress probe (a one-token completion, while the engine is idle) is traffic of its own, which a benchmark cell
    or a count of generated tokens must not see."""
    cli = REPO / ".venv" / "bin" / "ds4deploy"
    recipe = os.environ.get("DS4_RECIPE", "cpu")
    subprocess.run([str(cli), "supervisor", "stop", recipe], capture_output=True, check=False)
    yield
    subprocess.run([str(cli), "supervisor", "start", recipe, "--inventory",
                    os.environ.get("DS4_INVENTORY", str(REPO / "ansible" / "inventories" / "local.yml"))],
                   capture_output=True, check=False)


@pytest.fixture(scope="session")
def dv() -> dict:
    """The recipe's rendered deploy variables (ds4_* keys)."""
    recipe = os.environ.get("DS4_RECIPE", "cpu")
    compose_dir = Path(os.environ.get("DS4_COMPOSE_DIR") or REPO / "compose")
    return yaml.safe_load((compose_dir / recipe / "deploy-vars.yml").read_text())


@pytest.fixture
def api_key(host, dv) -> str | None:
    """The deployed API key, read from the node's 0600 key file (None when auth is off).
    $DS4_KEY_FILE (a local VLLM_API_KEY= file) overrides it, for a server started by hand."""
    if os.environ.get("DS4_KEY_FILE"):
        return parse_env_file(Path(os.environ["DS4_KEY_FILE"]).read_text()).get("VLLM_API_KEY")
    if dv["ds4_auth_mode"] != "api_key":
        return None
    key = parse_env_file(host.file(dv["ds4_key_file"]).content_string).get("VLLM_API_KEY")
    if not key:
        pytest.fail(f"{dv['ds4_key_file']} on the node has no VLLM_API_KEY= line")
    return key


@pytest.fixture
def base_url(host, dv) -> str:
    """http://<address>:<port> the API is reachable at from this test runner. $DS4_BASE_URL overrides it, e.g. for
    an engine started by hand: DS4_BASE_URL=http://127.0.0.1:8100 DS4_KEY_FILE=<key env file> pytest <tests>."""
    if os.environ.get("DS4_BASE_URL"):
        return os.environ["DS4_BASE_URL"].rstrip("/")
    addr = dv["ds4_bind_address"]
    local = host.backend.get_connection_type() == "local" or host.backend.get_hostname() in (
        "localhost", "127.0.0.1", "::1")
    if ipaddress.ip_address(addr).is_loopback and not local:
        pytest.skip(f"{addr} is loopback on a remote node: run these checks on the node itself")
    if ipaddress.ip_address(addr).is_unspecified and not local:
        addr = host.backend.get_hostname()
    return url_for(addr, dv["ds4_port"])


@pytest.fixture
def engine_container(host, dv) -> dict:
    """`docker inspect` of the recipe's engine container on the node."""
    import json

    ids = host.check_output(f"docker ps -q --filter label=com.docker.compose.project={dv['ds4_project']} "
                            "--filter label=com.docker.compose.service=engine")
    assert ids.strip(), f"no running container of compose project {dv['ds4_project']}"
    return json.loads(host.check_output(f"docker inspect {ids.split()[0]}"))[0]


@pytest.fixture
def front_door_container(host, dv) -> dict:
    """`docker inspect` of the recipe's front door container on the node (skips recipes without one)."""
    import json

    if not dv.get("ds4_front_door"):
        pytest.skip("recipe has no front door")
    ids = host.check_output(f"docker ps -q --filter label=com.docker.compose.project={dv['ds4_project']} "
                            "--filter label=com.docker.compose.service=front-door")
    assert ids.strip(), f"no running front door in compose project {dv['ds4_project']}"
    return json.loads(host.check_output(f"docker inspect {ids.split()[0]}"))[0]
