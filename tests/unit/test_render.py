"""Rendering: committed renders are fresh, stale ones are caught, templates are strict, no secrets rendered."""

from __future__ import annotations

import json

import pytest
import yaml
from jinja2 import StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from ds4deploy.core.errors import UserError
from ds4deploy.engines.vllm import engine_args
from ds4deploy.recipe.load import load_recipe
from ds4deploy.render import compose as render
from tests.unit.conftest import REPO, run_cli, write_variant


@pytest.mark.tool
def test_committed_renders_are_fresh():
    p = run_cli("render", "--check")
    assert p.returncode == 0, p.stderr


def test_render_is_deterministic():
    r = load_recipe("cpu")
    assert render.render(r).files == render.render(r).files


@pytest.mark.tool
def test_stale_render_is_reported_and_exit_1(recipe_dir):
    assert run_cli("render", "cpu", env_dir=recipe_dir).returncode == 0
    compose = recipe_dir.parent / "compose" / "cpu" / "compose.yaml"
    compose.write_text(compose.read_text().replace('"--port"', '"--port-x"'))
    (compose.parent / "leftover.yaml").write_text("x: 1\n")
    p = run_cli("render", "--check", "cpu", env_dir=recipe_dir)
    assert p.returncode == 1
    assert "compose/cpu/compose.yaml differs from the recipe" in p.stderr
    assert "compose/cpu/leftover.yaml is not produced by the recipe" in p.stderr
    assert "fix: run `ds4deploy render`" in p.stderr


def test_changing_the_recipe_changes_every_derived_artifact(recipe_dir):
    write_variant(recipe_dir, "port9", lambda d: (d["serving"].update(port=9001),
                                                  d["serving"]["front_door"].update(engine_port=9002)))
    out = render.render(load_recipe("port9")).files
    assert "listen 127.0.0.1:9001;" in out["front-door.conf.template"]
    assert "server 127.0.0.1:9002;" in out["front-door.conf.template"]
    assert "ds4_port: 9001" in out["deploy-vars.yml"]
    args = json.loads(out["engine-args.json"])
    assert args[args.index("--port") + 1] == "9002"


def test_compose_render_shape():
    r = load_recipe("cpu")
    files = render.render(r).files
    c = yaml.safe_load(files["compose.yaml"])
    svc = c["services"]["engine"]
    assert svc["image"] == r.image_ref
    assert svc["command"] == [*r.engine.entrypoint, *engine_args(r)]
    # Host networking behind the front door: nothing published, no Docker proxy on the request path.
    assert "ports" not in svc and "ports" not in c["services"]["front-door"]
    assert svc["network_mode"] == c["services"]["front-door"]["network_mode"] == "host"
    assert any(v.endswith(":/model:ro") for v in svc["volumes"])
    assert svc["healthcheck"]["start_period"] == f"{r.container.start_period_s}s"
    assert svc["logging"]["options"] == {"max-size": "50m", "max-file": "5"}
    assert [e["path"] for e in svc["env_file"]] == ["${DS4_SECRETS_ENV:-/etc/ds4deploy/secrets/cpu.env}"]
    assert svc["environment"] == r.engine.env


def test_secrets_in_env_or_flags_are_refused(recipe_dir):
    write_variant(recipe_dir, "envkey", lambda d: d["engine"]["env"].update(VLLM_API_KEY="secret123"))
    with pytest.raises(UserError) as e:
        load_recipe("envkey")
    assert "engine.env.VLLM_API_KEY: 'VLLM_API_KEY' names a credential" in str(e.value)
    write_variant(recipe_dir, "flagkey", lambda d: d["serving"]["extra_args"].update({"api-key": "secret456"}))
    with pytest.raises(UserError) as e:
        load_recipe("flagkey")
    assert "serving.extra_args.api-key: 'api-key' names a credential" in str(e.value)


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
    # Behind the front door on host networking: loopback, the front door's engine_port.
    assert args[:8] == ["--model", "/model", "--served-model-name", "ds4-tiny", "--host", "127.0.0.1", "--port",
                        "8001"]
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
    write_variant(recipe_dir, "v6", lambda d: d["serving"].update(bind_address="::1", network_mode="bridge"))
    c = yaml.safe_load(render.render(load_recipe("v6")).files["compose.yaml"])
    assert c["services"]["front-door"]["ports"] == ["[::1]:8000:8000"]
    assert "ports" not in c["services"]["engine"]  # the engine is reached on the compose network only

    def host_net(d):
        d["serving"].update(bind_address="10.0.0.5", network_mode="host", front_door={"engine_port": 8001})

    write_variant(recipe_dir, "hostnet", host_net)
    files = render.render(load_recipe("hostnet")).files
    c = yaml.safe_load(files["compose.yaml"])
    svc = c["services"]["engine"]
    assert svc["network_mode"] == "host"
    assert "ports" not in svc
    # Host networking behind the front door: the engine on loopback, its own port; the proxy on the recipe's.
    assert "http://127.0.0.1:8001/health" in svc["healthcheck"]["test"][-1]
    assert svc["command"][svc["command"].index("--host") + 1] == "127.0.0.1"
    assert svc["command"][svc["command"].index("--port") + 1] == "8001"
    assert c["services"]["front-door"]["network_mode"] == "host"
    conf = files["front-door.conf.template"]
    assert "listen 10.0.0.5:8000;" in conf and "server 127.0.0.1:8001;" in conf

    def no_door(d):
        d["serving"].update(bind_address="127.0.0.5", network_mode="host")
        del d["serving"]["front_door"]

    write_variant(recipe_dir, "hostnet-lo", no_door)
    files = render.render(load_recipe("hostnet-lo")).files
    svc = yaml.safe_load(files["compose.yaml"])["services"]["engine"]
    assert "http://127.0.0.5:8000/health" in svc["healthcheck"]["test"][-1]
    assert svc["command"][svc["command"].index("--host") + 1] == "127.0.0.5"
    assert "front-door.conf.template" not in files


@pytest.mark.tool
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
    # only the serve CLI turns --headless into a headless worker (after the encoder step, images/sm121)
    assert worker["command"][:3] == ["ds4-dsv4-encoder", "vllm", "serve"]
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


PINNED = {"ram_gb_each": 170, "vram_gib_each": 6.15, "source": "one per NUMA node"}


# A replica per NUMA node needs the reference box's RAM (768 GB: 192 GB = 178.8 GiB per node, docs/sources.md
# #rtx3090-xeon), not the recipe's practical start of 128 GB per node, and the 0.3 share of each GPU per replica that
# layout used (the recipe's one engine now takes 0.95).
PINNED_RAM = {"ram_per_numa_gib": 178.8, "min_ram_gib": 716}
PINNED_GPU_SHARE = 0.3


def pinned_rtx():
    """The RTX 3090 recipe with one numactl-pinned replica per NUMA node (the layout it no longer uses: replicas that
    share the GPUs and start one after another)."""
    ref = load_recipe("rtx3090x2-xeon-ds4-flash")
    data = ref.model_dump(mode="python", exclude_unset=True)
    data["instances"] = PINNED
    data["hardware"].update(PINNED_RAM)
    data["serving"]["gpu_memory_utilization"] = PINNED_GPU_SHARE
    pinned = type(ref).model_validate(data)
    pinned._source = ref.source_path
    return pinned


def test_numa_instances_render_one_pinned_service_each():
    ref = load_recipe("rtx3090x2-xeon-ds4-flash")
    single = yaml.safe_load(render.render(ref).files["compose.yaml"])["services"]
    assert list(single) == ["engine"]
    assert "numactl" not in single["engine"]["command"]
    c = yaml.safe_load(render.render(pinned_rtx()).files["compose.yaml"])
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

    from ds4deploy.render.compose import WORKER_ALIVE

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
    env = yaml.safe_load(files["compose.head.yaml"])["services"]["engine"]["environment"]
    # Names differ per node (either GX10 port pair may be cabled): the files refer to each node's .env
    # (ds4deploy.plan.node_fabric; tests/unit/test_node_fabric.py), the recipe's names reach it through the node plan.
    assert env["NCCL_IB_HCA"] == "${DS4_NCCL_IB_HCA:?set by the deploy}"
    assert {env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")} == {
        "${DS4_SOCKET_IFNAME:?set by the deploy}"}
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


def test_ordered_stacks_are_never_restarted_by_the_docker_daemon():
    """Replicas sharing GPUs and multi-node stacks get restart "no" (the daemon would start them all at once after a
    reboot); a single engine keeps the recipe's policy."""
    for recipe, files in ((pinned_rtx(), ["compose.yaml"]),
                          (load_recipe("cpu-2node-tp"), ["compose.head.yaml", "compose.worker.yaml"]),
                          (load_recipe("gx10x2-ds4-flash-fp8"), ["compose.head.yaml", "compose.worker.yaml"])):
        rendered = render.render(recipe).files
        for f in files:
            services = yaml.safe_load(rendered[f])["services"]
            engines = {name: svc for name, svc in services.items() if name.startswith("engine")}
            assert {svc["restart"] for svc in engines.values()} == {"no"}, (recipe.name, f)
    assert yaml.safe_load(render.render(load_recipe("cpu")).files["compose.yaml"])["services"]["engine"][
        "restart"] == "unless-stopped"


def test_an_ordered_stack_with_a_restart_policy_is_refused(tmp_path):
    data = yaml.safe_load((REPO / "recipes" / "rtx3090x2-xeon-ds4-flash.yaml").read_text())
    path = tmp_path / "rtx3090x2-xeon-ds4-flash.yaml"
    data["instances"] = PINNED
    data["hardware"].update(PINNED_RAM)
    data["serving"]["gpu_memory_utilization"] = PINNED_GPU_SHARE
    data["container"]["restart"] = "unless-stopped"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as exc:
        render.render(load_recipe(path))
    assert "must start one after another" in exc.value.cause and "remove container.restart" in exc.value.fix
    data["container"]["restart"] = "no"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert render.render(load_recipe(path)).files["compose.yaml"].count('restart: "no"') == 3


def test_each_node_gets_its_own_compose_project():
    """The project name takes the node's rank from its .env (compose interpolation, not a literal "$"): two nodes on
    one Docker host must not share (and replace) one project."""
    for f in ("compose.head.yaml", "compose.worker.yaml"):
        doc = render.compose_config(REPO / "compose" / "cpu-2node-tp" / f)
        assert doc["name"] == f"ds4-cpu-2node-tp-node{render.EXAMPLE_NODE_ENV['DS4_NODE_RANK']}", doc["name"]
