"""The engine's own argument check (ds4deploy.render.compose.engine_check, ansible/roles/stack/tasks/engine_check.yml):
each committed compose file has an engine-check file whose engine services run the same command with the check's
entrypoint, no network and only the model mounted, which the real `docker compose config` accepts; and the vLLM
check script, run by the engine venv's vLLM (the cpu recipes' pins), accepts the committed commands and refuses a
value vLLM refuses, with vLLM's message. The llama.cpp check runs in the real llama-server image in
tests/llamacpp/test_engine.py; a refused redeploy that leaves the running stack as it was, in tests/e2e.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from ds4deploy.engines import argv_check
from ds4deploy.engines.vllm import ARGV_CHECK_SCRIPT
from ds4deploy.recipe.load import all_recipes, load_recipe
from ds4deploy.render import compose as render
from tests.unit.conftest import REPO
from tests.unit.test_render_contract import LAUNCH, needs_compose, unescape

RECIPES = [r.name for r in all_recipes()]


def _config(path) -> dict:
    """`docker compose config` of a check file, with the launch facts the deploy gives it (no key file)."""
    return render.compose_config(path, env={**LAUNCH, "DS4_SECRETS_ENV": "/dev/null"})


@needs_compose
@pytest.mark.tool
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_compose_file_has_an_engine_check_of_the_same_command(recipe):
    r = load_recipe(recipe)
    vars_ = yaml.safe_load((REPO / "compose" / recipe / "deploy-vars.yml").read_text())
    for file, services in render.node_files(r).items():
        check_file = REPO / "compose" / recipe / vars_["ds4_engine_check_files"][file]
        stack, check = render.compose_config(REPO / "compose" / recipe / file), _config(check_file)
        assert check is not None, check_file
        assert check["name"] == f"{stack['name']}-engine-check"
        # Every engine service, and only those (no front door).
        assert sorted(check["services"]) == sorted(s.name for s in services)
        for name, svc in check["services"].items():
            assert unescape(svc["command"]) == unescape(stack["services"][name]["command"]), (file, name)
            assert unescape(svc["entrypoint"]) == argv_check(r, unescape(svc["command"]), render.ENTRYPOINT)
            assert svc["network_mode"] == "none" and "networks" not in svc and "ports" not in svc
            assert [v["target"] for v in svc["volumes"]] == ["/model"]
            assert "healthcheck" not in svc and "labels" not in svc
            assert {k: v for k, v in svc.get("environment", {}).items() if k != "VLLM_API_KEY"} == {
                k: v for k, v in stack["services"][name].get("environment", {}).items() if k != "VLLM_API_KEY"}


def test_a_command_without_the_engine_is_a_render_bug():
    r = load_recipe("cpu")
    with pytest.raises(ValueError, match=r"does not run the engine\.entrypoint"):
        argv_check(r, ["python3", "-m", "something.else", "--model", "/model"], render.ENTRYPOINT)


def _vllm_check(python: str, recipe: str, edit=None) -> subprocess.CompletedProcess:
    """The vLLM check script run by `python` on the recipe's rendered command (its first compose file's engine),
    with the launch facts filled in and `edit` applied to the command."""
    r = load_recipe(recipe)
    svc = next(iter(render.node_files(r).values()))[0]
    command = [next((v for k, v in LAUNCH.items() if a.startswith(f"${{{k}:")), a) for a in svc.command]
    if edit:
        command = edit(command)
    entry = argv_check(r, svc.command, render.ENTRYPOINT)
    assert entry[:3] == ["python3", "-c", ARGV_CHECK_SCRIPT]
    return subprocess.run([python, "-c", ARGV_CHECK_SCRIPT, *entry[3:], *command], capture_output=True, text=True,
                          timeout=600, check=False)


def _set(flag: str, value: str):
    def edit(command: list[str]) -> list[str]:
        i = command.index(flag)
        return [*command[:i + 1], value, *command[i + 2:]]
    return edit


@pytest.mark.tool
@pytest.mark.parametrize("recipe", ["cpu", "cpu-2node-tp"])
def test_the_vllm_check_accepts_the_committed_commands(engine_python, recipe):
    p = _vllm_check(str(engine_python), recipe)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "vLLM's parser accepts the arguments" in p.stdout


@pytest.mark.tool
@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-num-seqs", "lots", "argument --max-num-seqs: invalid int value: 'lots'"),
    ("--dtype", "float7", "argument --dtype: invalid choice: 'float7'"),
    ("--structured-outputs-config", '{"backend": ', "argument --structured-outputs-config"),
])
def test_the_vllm_check_refuses_what_vllm_refuses(engine_python, flag, value, message):
    p = _vllm_check(str(engine_python), "cpu", _set(flag, value))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    # The line the deploy quotes (roles/stack/tasks/engine_check.yml: the first line with "error:" after ": ").
    assert f"vllm serve: error: {message}" in p.stderr, p.stderr[-2000:]


@pytest.mark.tool
def test_an_image_without_vllm_says_so_and_is_not_refused():
    p = _vllm_check(sys.executable, "cpu")
    assert p.returncode == 3, p.stderr
    assert "this image has no vLLM argument parser (No module named 'vllm')" in p.stderr
