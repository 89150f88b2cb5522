"""Host checks: Docker runs, the engine container is healthy and runs this recipe's render, the port is bound
only where the recipe says, the API key is protected and never leaks."""

from __future__ import annotations

import json


def test_docker_daemon_runs(host):
    assert host.run("docker info --format '{{.ServerVersion}}'").rc == 0


def test_engine_container_is_healthy(engine_container):
    assert engine_container["State"]["Running"]
    assert engine_container["State"]["Health"]["Status"] == "healthy"


def test_engine_container_runs_this_recipe(engine_container, dv):
    labels = engine_container["Config"]["Labels"]
    assert labels["io.ds4deploy.recipe"] == dv["ds4_recipe"]
    assert labels["io.ds4deploy.recipe-sha256"] == dv["ds4_recipe_sha256"]
    assert engine_container["Config"]["Image"] == dv["ds4_image"]


def test_model_is_mounted_read_only(engine_container, dv):
    mounts = {m["Destination"]: m for m in engine_container["Mounts"]}
    assert mounts["/model"]["Source"] == dv["ds4_model_dir"]
    assert mounts["/model"]["RW"] is False


def test_port_listens_on_the_configured_address_only(host, dv):
    port = dv["ds4_port"]
    bound = [s for s in host.socket.get_listening_sockets() if s.startswith("tcp") and s.endswith(f":{port}")]
    want = dv["ds4_bind_address"]
    want_sock = f"tcp://{want}:{port}" if ":" not in want else f"tcp://[{want}]:{port}"
    assert want_sock in bound or f"tcp://{want}:{port}" in bound, bound
    assert all(want in s for s in bound), f"port {port} is also bound elsewhere: {bound}"


def test_api_key_file_is_private(host, dv):
    if dv["ds4_auth_mode"] != "api_key":
        return
    f = host.file(dv["ds4_key_file"])
    assert f.is_file
    assert f.mode == 0o600
    assert f.user == "root"


def test_api_key_never_in_command_line_logs_or_renders(host, dv, api_key, engine_container):
    if api_key is None:
        return
    assert api_key not in json.dumps(engine_container["Config"]["Cmd"])
    assert api_key not in json.dumps(engine_container["Args"])
    logs = host.run(f"docker logs {engine_container['Id']}")
    assert api_key not in logs.stdout + logs.stderr
    stack_files = host.run(f"grep -rl -- {api_key} /opt/ds4deploy/stacks/{dv['ds4_recipe']}")
    assert stack_files.stdout.strip() == ""
