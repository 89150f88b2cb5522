"""The generated default model: deterministic, matches its committed manifest, loads as a real tokenizer."""

from __future__ import annotations

import json
import os

import pytest
from tokenizers import Tokenizer

from ds4deploy.core.errors import UserError
from ds4deploy.model.manifest import load_manifest, manifest_of_files, verify_dir
from ds4deploy.model.tiny import TinyModelSpec, files, generate
from ds4deploy.recipe.load import load_recipe
from tests.unit.conftest import run_cli


@pytest.fixture(scope="module")
def spec():
    return TinyModelSpec(**load_recipe("cpu").model.generator.model_dump())


def test_generation_matches_the_committed_manifest(spec):
    r = load_recipe("cpu")
    assert manifest_of_files(r, files(spec)) == load_manifest(r)


def test_generate_is_idempotent_and_verifies(tmp_path, spec):
    assert sorted(generate(tmp_path, spec)) == sorted(load_manifest(load_recipe("cpu"))["files"])
    assert generate(tmp_path, spec) == []
    assert verify_dir(tmp_path, load_manifest(load_recipe("cpu"))) == []
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


def test_a_corrupted_byte_is_named(tmp_path, spec):
    generate(tmp_path, spec)
    w = tmp_path / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    problems = verify_dir(tmp_path, load_manifest(load_recipe("cpu")))
    assert len(problems) == 1 and "model.safetensors: sha256" in problems[0]
    (tmp_path / "config.json").unlink()
    assert any("config.json: missing" in p for p in verify_dir(tmp_path, load_manifest(load_recipe("cpu"))))
    p = run_cli("model", "verify", "cpu", "--dir", str(tmp_path))
    assert p.returncode == 1 and "model.safetensors" in p.stderr and "Traceback" not in p.stderr


def test_config_shape_and_tokenizer(tmp_path, spec):
    generate(tmp_path, spec)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["head_dim"] == 64
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert cfg["vocab_size"] >= tok.get_vocab_size()
    text = "The river ran slow under the bridge: {\"city\": \"Paris\"} 131072 tok/s"
    assert tok.decode(tok.encode(text).ids) == text  # byte-level BPE round-trips anything
    assert tok.token_to_id("<|im_end|>") == cfg["eos_token_id"]
    assert "<tool_call>" in json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"]


def test_head_dim_16_is_refused():
    with pytest.raises(UserError, match="head_dim=16"):
        TinyModelSpec(head_dim=16).validate()


def test_unwritable_destination_is_a_clear_error(tmp_path, spec):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="could not write the model"):
        generate(blocker / "model", spec)


def test_stage_generates_verifies_and_reports_sha256(tmp_path):
    dest = tmp_path / "staged"
    p = run_cli("model", "stage", "cpu", "--dest", str(dest))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    manifest = load_manifest(load_recipe("cpu"))
    assert out["changed"] is True
    assert out["sha256"] == {k: v["sha256"] for k, v in manifest["files"].items()}
    assert json.loads(run_cli("model", "stage", "cpu", "--dest", str(dest)).stdout)["changed"] is False


def test_stage_refuses_a_generator_that_drifted_from_the_manifest(recipe_dir, tmp_path):
    import yaml

    data = yaml.safe_load((recipe_dir / "cpu.yaml").read_text())
    data["model"]["generator"]["seed"] = 1
    (recipe_dir / "cpu.yaml").write_text(yaml.safe_dump(data))
    p = run_cli("model", "stage", "cpu", "--dest", str(tmp_path / "staged"), env_dir=recipe_dir)
    assert p.returncode == 1
    assert "model.safetensors: sha256" in p.stderr
    assert "ds4deploy model lock cpu" in p.stderr


def test_chat_template_renders_a_system_message_wherever_it_stands():
    """Coding agents send system entries mid-conversation; each is rendered once, in place (the first one in the
    leading system block, with or without tools)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from ds4deploy.model.tiny import CHAT_TEMPLATE

    tpl = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)
    msgs = [{"role": "system", "content": "FIRST-RULE"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "system", "content": "LATER-RULE"},
            {"role": "user", "content": "go on"}]
    for tools in (None, [{"type": "function", "function": {"name": "f", "parameters": {}}}]):
        out = tpl.render(messages=msgs, tools=tools, add_generation_prompt=True)
        assert out.count("FIRST-RULE") == 1 and out.count("LATER-RULE") == 1
        assert out.index("hello") < out.index("<|im_start|>system\nLATER-RULE<|im_end|>") < out.index("go on")
