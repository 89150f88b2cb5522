"""Rendering: committed renders are fresh, stale ones are caught, templates are strict, no secrets rendered."""

from __future__ import annotations

import json

import pytest
import yaml
from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from ds4deploy import render
from ds4deploy.engine_args import engine_args
from ds4deploy.recipe import load_recipe
from tests.unit.conftest import run_cli, write_variant


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


def test_api_key_never_reaches_renders_or_argv():
    files = render.render(load_recipe("cpu")).files
    for text in files.values():
        assert "VLLM_API_KEY=" not in text
        assert "--api-key" not in text


def test_engine_args_for_cpu():
    args = engine_args(load_recipe("cpu"))
    assert args[:6] == ["--model", "/model", "--served-model-name", "ds4-tiny", "--host", "0.0.0.0"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.1"
    assert "--enable-auto-tool-choice" in args
    spec = json.loads(args[args.index("--structured-outputs-config") + 1])
    assert spec == {"backend": "xgrammar", "disable_any_whitespace": True}


def test_strict_undefined_is_an_error():
    env = SandboxedEnvironment(undefined=StrictUndefined)
    with pytest.raises(TemplateError):
        env.from_string("{{ recipe.no_such_key }}").render(recipe={})
    assert render._ENV.undefined is StrictUndefined
