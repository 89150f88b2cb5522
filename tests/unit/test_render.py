"""Rendering: committed renders are fresh, stale ones are caught, templates are strict, no secrets rendered."""

from __future__ import annotations

import json

import pytest
import yaml
from jinja2 import StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from ds4deploy import render
from ds4deploy.engine_args import engine_args
from ds4deploy.errors import UserError
from ds4deploy.recipe import load_recipe
from tests.unit.conftest import REPO, run_cli, write_variant


def test_committed_renders_are_fresh():
    p = run_cli("render", "--check")
    assert p.returncode == 0, p.stderr


def test_render_is_deterministic():
    r = load_recipe("cpu")
    assert render.render(r).files == render.render(r).files


def test_stale_render_is_reported_and_exit_1(recipe_dir):
    assert run_cli("render", "cpu", env_dir=recipe_dir).returncode == 0
    compose = recipe_dir.parent / "compose" / "cpu" / "compose.yaml"
    compose.write_text(compose.read_text().replace('"8000"', '"8001"'))
    (compose.parent / "leftover.yaml").write_text("x: 1\n")
    p = run_cli("render", "--check", "cpu", env_dir=recipe_dir)
    assert p.returncode == 1
    assert "compose/cpu/compose.yaml differs from the recipe" in p.stderr
    assert "compose/cpu/leftover.yaml is not produced by the recipe" in p.stderr
    assert "fix: run `ds4deploy render`" in p.stderr


def test_changing_the_recipe_changes_every_derived_artifact(recipe_dir):
    write_variant(recipe_dir, "port9", lambda d: d["serving"].update(port=9001))
    out = render.render(load_recipe("port9")).files
    assert '"127.0.0.1:9001:9001"' in out["compose.yaml"]
    assert "ds4_port: 9001" in out["deploy-vars.yml"]
    args = json.loads(out["engine-args.json"])
    assert args[args.index("--port") + 1] == "9001"


def test_compose_render_shape():
    r = load_recipe("cpu")
    files = render.render(r).files
    c = yaml.safe_load(files["compose.yaml"])
    svc = c["services"]["engine"]
    assert svc["image"] == r.image_ref
    assert svc["command"] == [*r.engine.entrypoint, *engine_args(r)]
    assert svc["ports"] == ["127.0.0.1:8000:8000"]
    assert any(v.endswith(":/model:ro") for v in svc["volumes"])
    assert svc["healthcheck"]["start_period"] == f"{r.container.start_period_s}s"
    assert svc["logging"]["options"] == {"max-size": "50m", "max-file": "5"}
    assert {e["path"] for e in svc["env_file"]} == {"engine.env", "${DS4_SECRETS_ENV:-/etc/ds4deploy/secrets/cpu.env}"}


def test_secrets_in_env_or_flags_are_refused(recipe_dir):
    write_variant(recipe_dir, "envkey", lambda d: d["engine"]["env"].update(VLLM_API_KEY="secret123"))
    with pytest.raises(UserError) as e:
        load_recipe("envkey")
    assert "VLLM_API_KEY must not be set in the recipe" in str(e.value)
    write_variant(recipe_dir, "flagkey", lambda d: d["serving"]["extra_args"].update({"api-key": "secret456"}))
    with pytest.raises(UserError) as e:
        load_recipe("flagkey")
    assert "--api-key must not be in the recipe" in str(e.value)


def test_key_file_must_have_a_directory_of_its_own(recipe_dir):
    write_variant(recipe_dir, "etckey", lambda d: d["serving"]["auth"].update(key_file="/etc/ds4.env"))
    with pytest.raises(UserError, match="sits directly in /etc"):
        load_recipe("etckey")


def test_default_key_file_is_per_recipe(recipe_dir):
    write_variant(recipe_dir, "other", lambda d: None)
    assert load_recipe("other").key_file == "/etc/ds4deploy/secrets/other.env"
    assert load_recipe("cpu").key_file == "/etc/ds4deploy/secrets/cpu.env"


def test_engine_args_for_cpu():
    args = engine_args(load_recipe("cpu"))
    assert args[:6] == ["--model", "/model", "--served-model-name", "ds4-tiny", "--host", "0.0.0.0"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.1"
    assert "--enable-auto-tool-choice" in args
    spec = json.loads(args[args.index("--structured-outputs-config") + 1])
    assert spec == {"backend": "xgrammar", "disable_any_whitespace": True}


def test_a_template_naming_a_missing_recipe_value_is_a_user_error(monkeypatch):
    from jinja2 import DictLoader

    env = SandboxedEnvironment(loader=DictLoader({
        "compose.yaml.j2": "{{ recipe.serving.no_such_key }}", "engine.env.j2": "", "deploy-vars.yml.j2": ""}),
        undefined=StrictUndefined)
    monkeypatch.setattr(render, "_ENV", env)
    with pytest.raises(UserError, match="rendering recipe 'cpu' failed"):
        render.render(load_recipe("cpu"))


def test_ipv6_and_host_network_renders(recipe_dir):
    write_variant(recipe_dir, "v6", lambda d: d["serving"].update(bind_address="::1"))
    c = yaml.safe_load(render.render(load_recipe("v6")).files["compose.yaml"])
    assert c["services"]["engine"]["ports"] == ["[::1]:8000:8000"]

    def host_net(d):
        d["serving"].update(bind_address="10.0.0.5", network_mode="host")

    write_variant(recipe_dir, "hostnet", host_net)
    c = yaml.safe_load(render.render(load_recipe("hostnet")).files["compose.yaml"])
    svc = c["services"]["engine"]
    assert svc["network_mode"] == "host"
    assert "ports" not in svc
    assert "http://10.0.0.5:8000/health" in svc["healthcheck"]["test"][-1]
    assert svc["command"][svc["command"].index("--host") + 1] == "10.0.0.5"


def test_orphaned_render_directory_is_reported(recipe_dir):
    assert run_cli("render", env_dir=recipe_dir).returncode == 0
    (recipe_dir.parent / "compose" / "deleted-recipe").mkdir()
    p = run_cli("render", "--check", env_dir=recipe_dir)
    assert p.returncode == 1
    assert "compose/deleted-recipe/ has no recipe" in p.stderr


def test_multi_node_recipe_renders_head_and_headless_worker():
    files = render.render(load_recipe("gx10x2-ds4-flash-fp8")).files
    assert "compose.yaml" not in files
    head = yaml.safe_load(files["compose.head.yaml"])["services"]["engine"]
    worker = yaml.safe_load(files["compose.worker.yaml"])["services"]["engine"]
    assert "--headless" in worker["command"] and "--headless" not in head["command"]
    # only the serve CLI turns --headless into a headless worker
    assert worker["command"][:2] == ["vllm", "serve"]
    for svc in (head, worker):
        assert svc["network_mode"] == "host"
        assert svc["ipc"] == "host"
        assert svc["ulimits"] == {"memlock": -1, "stack": 67108864}
        assert svc["devices"] == ["/dev/infiniband:/dev/infiniband"]
        assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        assert svc["environment"]["VLLM_HOST_IP"].startswith("${DS4_HOST_IP:?")
        assert svc["command"][svc["command"].index("--master-addr") + 1].startswith("${DS4_MASTER_ADDR:?")
        assert any(v.endswith(":/model:ro") for v in svc["volumes"])
    assert "/health" in head["healthcheck"]["test"][-1]
    assert "/health" not in worker["healthcheck"]["test"][-1]


def test_numa_instances_render_one_pinned_service_each():
    c = yaml.safe_load(render.render(load_recipe("rtx3090x2-xeon-ds4-flash")).files["compose.yaml"])
    names = sorted(c["services"])
    assert names == ["engine-0", "engine-1", "engine-2"]
    for i, name in enumerate(names):
        cmd = c["services"][name]["command"]
        assert cmd[:3] == ["numactl", f"--membind={i}", f"--cpunodebind={i}"]
        assert cmd[cmd.index("--port") + 1] == str(8000 + i)


def test_worker_probe_fails_without_an_engine_and_passes_with_one(tmp_path):
    """The worker healthcheck, run for real in a PID namespace of its own (as in the worker's container, where it
    sees only that container's processes; on the host it would also see any worker container running there):
    no --headless process -> 1; one running -> 0."""
    import subprocess
    import sys

    from ds4deploy.render import WORKER_ALIVE

    code = WORKER_ALIVE[-1]
    pidns = ["unshare", "--pid", "--fork", "--mount-proc"]
    assert subprocess.run([*pidns, sys.executable, "-c", code], check=False).returncode == 1
    with_engine = f"import subprocess,sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', " \
                  f"'--headless']); import time; time.sleep(0.5); sys.exit(subprocess.run([sys.executable, '-c', " \
                  f"{code!r}]).returncode)"
    assert subprocess.run([*pidns, sys.executable, "-c", with_engine], check=False).returncode == 0


def test_fabric_facts_are_written_once_and_derived(recipe_dir):
    import shutil

    shutil.copy(REPO / "recipes" / "gx10x2-ds4-flash-fp8.yaml", recipe_dir / "gx10x2-ds4-flash-fp8.yaml")
    files = render.render(load_recipe("gx10x2-ds4-flash-fp8")).files
    env = files["engine.env"]
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in env
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in env and "GLOO_SOCKET_IFNAME=enp1s0f1np1" in env
    args = json.loads(files["engine-args.json"])
    assert args[args.index("--nnodes") + 1] == "2"
    assert args[args.index("--master-port") + 1] == "25000"
    write_variant_from(recipe_dir, "gx10x2-ds4-flash-fp8", "gxdup",
                       lambda d: d["engine"]["env"].update(NCCL_IB_HCA="rocep1s0f1"))
    with pytest.raises(UserError, match="derives from fabric"):
        load_recipe("gxdup")


def write_variant_from(recipe_dir, base, name, edit):
    data = yaml.safe_load((recipe_dir / f"{base}.yaml").read_text())
    data["name"] = name
    edit(data)
    (recipe_dir / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
