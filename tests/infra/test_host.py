"""Host checks: Docker runs, the engine container is healthy and runs this recipe's render, the port is bound
only where the recipe says, the API key is protected and never leaks."""

from __future__ import annotations

import json

import pytest

from tests.infra.conftest import REPO


def test_docker_daemon_runs(host):
    assert host.run("docker info --format '{{.ServerVersion}}'").rc == 0


def test_engine_container_is_healthy(engine_container):
    assert engine_container["State"]["Running"]
    assert engine_container["State"]["Health"]["Status"] == "healthy"


def test_engine_container_runs_this_recipe(engine_container, dv):
    labels = engine_container["Config"]["Labels"]
    assert labels["io.ds4deploy.recipe"] == dv["ds4_recipe"]
    # The service as rendered (labels aside): the label the render committed is the one the container carries.
    assert labels["io.ds4deploy.service-sha256"] in {h for f in dv["ds4_service_sha256"].values() for h in f.values()}
    assert engine_container["Config"]["Image"] == dv["ds4_image"]


def test_model_is_mounted_read_only(engine_container, dv):
    mounts = {m["Destination"]: m for m in engine_container["Mounts"]}
    assert mounts["/model"]["Source"] == dv["ds4_model_dir"]
    assert mounts["/model"]["RW"] is False


def test_port_listens_on_the_configured_address_only(host, dv):
    from ds4deploy.core.net import listens_only_on

    port = dv["ds4_port"]
    ok, bound = listens_only_on(host.socket.get_listening_sockets(), dv["ds4_bind_address"], port)
    assert ok, f"port {port} is bound on {bound}, the recipe says {dv['ds4_bind_address']}"


def test_api_key_file_is_private(host, dv):
    if dv["ds4_auth_mode"] != "api_key":
        pytest.skip("recipe serves without an API key")
    f = host.file(dv["ds4_key_file"])
    assert f.is_file
    assert f.mode == 0o600
    assert f.user == "root"


def test_api_key_never_in_command_line_logs_or_renders(host, dv, api_key, engine_container):
    """Compared in Python, never on a command line or in an assertion message, so a failure cannot leak the key."""
    if api_key is None:
        pytest.skip("recipe serves without an API key")
    in_argv = api_key in json.dumps(engine_container["Config"]["Cmd"]) + json.dumps(engine_container["Args"])
    assert not in_argv, "API key found in the engine's command line"
    logs = host.run(f"docker logs {engine_container['Id']}")
    in_logs = api_key in logs.stdout + logs.stderr
    assert not in_logs, "API key found in the engine's logs"
    stack_dir = f"/opt/ds4deploy/stacks/{dv['ds4_recipe']}"
    assert host.file(stack_dir).is_directory
    leaked = [name for name in host.file(stack_dir).listdir()
              if api_key in host.file(f"{stack_dir}/{name}").content_string]
    assert not leaked, f"API key found in rendered files on the node: {leaked}"
    leaked = [str(p) for p in (REPO / "compose").rglob("*") if p.is_file() and api_key in p.read_text()]
    assert not leaked, f"API key found in committed renders: {leaked}"
