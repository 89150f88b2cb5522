"""The llama.cpp family without Docker: argv, flag registry, schema refusals, preflight rules, GGUF parts."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.engines.llamacpp import gguf_parts, known_flags, server_args, unknown_flags
from ds4deploy.plan.preflight import run
from ds4deploy.plan.preflight.llamacpp import gguf_parts_problem
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.schema import Recipe

V100 = "v100x8-ds4-flash-llamacpp"


def _with(name: str, **changes) -> Recipe:
    """Recipe `name` with dotted-path changes, validated again (as a variant would be)."""
    data = load_recipe(name).model_dump()
    for dotted, value in changes.items():
        node = data
        keys = dotted.split(".")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return Recipe.model_validate(data)


def _verdict(recipe: Recipe, rule_id: str):
    return next(v for v in run(recipe) if v.rule == rule_id)


def test_v100_argv_is_the_owners_command_line():
    args = server_args(load_recipe(V100))
    line = " ".join(args)
    assert "-m /model/DeepSeek-V4-Flash-UD-Q4_K_XL-00001-of-00005.gguf" in line
    assert ("-ngl 999 -sm layer -fa on -b 2048 -ub 1024 --cache-type-k f16 --cache-type-v f16 --jinja") in line
    assert "-c 65536 -np 1" in line and "--api-key" not in line


def test_context_is_per_slot_times_slots():
    r = load_recipe("cpu-llamacpp")
    args = server_args(r)
    assert args[args.index("-c") + 1] == str(r.serving.max_model_len * r.serving.max_num_seqs)


def test_registry_knows_server_flags_and_not_removed_ones():
    flags = known_flags()
    assert flags["-ngl"]["value"] and flags["--jinja"] == {"value": False, "negation": False, "option": "--jinja"}
    assert flags["--no-jinja"]["negation"]
    # gone at the pinned commit (--load-mode replaced them): the registry must not invent them
    assert "--mlock" not in flags and "--no-mmap" not in flags


def test_unknown_flag_is_refused_with_cause_and_fix():
    r = _with("cpu-llamacpp", **{"engine.llamacpp.extra_args": {"no-mmap": True}})
    with pytest.raises(UserError, match="no flag --no-mmap"):
        server_args(r)
    assert _verdict(r, "llamacpp-flags").status == "fail"
    assert unknown_flags(["-ngl", "999", "--frobnicate", "-c", "-1"]) == ["--frobnicate"]


def test_quantized_k_cache_on_volta_refused():
    assert _verdict(load_recipe(V100), "llamacpp-volta-k-cache").status == "pass"
    bad = _with(V100, **{"engine.llamacpp.cache_type_k": "q8_0"})
    v = _verdict(bad, "llamacpp-volta-k-cache")
    assert v.status == "fail" and "f16" in v.remediation


def test_tensor_split_on_volta_refused():
    for change in ({"engine.llamacpp.split_mode": "tensor"}, {"engine.llamacpp.split_mode": "row"}):
        assert _verdict(_with(V100, **change), "llamacpp-volta-split").status == "fail"


def test_model_that_is_not_gguf_refused():
    with pytest.raises(ValueError, match="gguf"):
        _with(V100, **{"model.gguf.file": "model.safetensors"})
    with pytest.raises(ValueError, match=r"model\.gguf"):
        _with(V100, **{"model.gguf": None})


def test_split_part_one_must_match_the_part_count():
    assert gguf_parts("m-00001-of-00003.gguf", 3) == ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf",
                                                      "m-00003-of-00003.gguf"]
    with pytest.raises(UserError, match="not part 1 of 5"):
        gguf_parts("m-00001-of-00003.gguf", 5)
    bad = _with(V100, **{"model.gguf.file": "DeepSeek-V4-Flash-UD-Q4_K_XL-00002-of-00005.gguf"})
    assert _verdict(bad, "llamacpp-gguf").status == "fail"


def test_vllm_rules_do_not_judge_llamacpp_recipes():
    verdicts = {v.rule: v for v in run(load_recipe(V100))}
    assert verdicts["parallel-shape"].status == "skip" and verdicts["v100-fp16"].status == "skip"
    assert not [v for v in verdicts.values() if v.status == "fail"]


def test_cuda_arch_derived_for_the_cuda_image():
    assert load_recipe(V100).image_build_args["CMAKE_CUDA_ARCHITECTURES"] == "70"
    assert "CMAKE_CUDA_ARCHITECTURES" not in load_recipe("cpu-llamacpp").image_build_args


@pytest.fixture(scope="module")
def five_parts(tmp_path_factory) -> Path:
    """The V100 recipe's layout as tiny GGUF parts (a stand-in template: the parts check reads headers only)."""
    from ds4deploy.model.tiny_gguf import TinyGgufSpec, generate

    d = tmp_path_factory.mktemp("five")
    generate(d, TinyGgufSpec(parts=5, stem="DeepSeek-V4-Flash-UD-Q4_K_XL"), "{{ messages }}")
    return d


def test_gguf_parts_present_and_ordered(five_parts, tmp_path):
    r = load_recipe(V100)
    assert gguf_parts_problem(r, five_parts) is None
    shutil.copytree(five_parts, tmp_path / "m")
    (tmp_path / "m" / "DeepSeek-V4-Flash-UD-Q4_K_XL-00004-of-00005.gguf").unlink()
    problem = gguf_parts_problem(r, tmp_path / "m")
    assert "lacks GGUF part(s) DeepSeek-V4-Flash-UD-Q4_K_XL-00004-of-00005.gguf" in problem
    shutil.rmtree(tmp_path / "m")
    shutil.copytree(five_parts, tmp_path / "m")
    a, b = (tmp_path / "m" / f"DeepSeek-V4-Flash-UD-Q4_K_XL-0000{k}-of-00005.gguf" for k in (2, 3))
    a.rename(tmp_path / "x")
    b.rename(a)
    (tmp_path / "x").rename(b)
    assert "out of order" in gguf_parts_problem(r, tmp_path / "m")


def test_tiny_gguf_is_deterministic_and_deepseek4(five_parts, tmp_path):
    from gguf import GGUFReader

    from ds4deploy.model.tiny_gguf import TinyGgufSpec, generate

    assert generate(five_parts, TinyGgufSpec(parts=5, stem="DeepSeek-V4-Flash-UD-Q4_K_XL"), "{{ messages }}") == []
    first = GGUFReader(five_parts / "DeepSeek-V4-Flash-UD-Q4_K_XL-00001-of-00005.gguf")
    arch = first.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "deepseek4"


def test_chat_template_comes_from_the_sdist(tmp_path):
    from ds4deploy.model.tiny_gguf import TEMPLATE_MEMBER, chat_template_from

    sdist = tmp_path / "llama_cpp_python-0.0.0.tar.gz"
    src = tmp_path / "llama_cpp_python-0.0.0" / TEMPLATE_MEMBER
    src.parent.mkdir(parents=True)
    src.write_text("{%- set dsml_token = 'x' -%}")
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "llama_cpp_python-0.0.0", arcname="llama_cpp_python-0.0.0")
    assert "dsml_token" in chat_template_from(sdist)
    with pytest.raises(UserError, match="no DeepSeek V4 chat template"):
        chat_template_from(tmp_path / "missing.tar.gz")


def test_key_shim_hands_the_key_file_variable_to_llama_server():
    """The container command's shell copies VLLM_API_KEY (the key file's variable) into LLAMA_API_KEY (what
    llama-server reads) and execs the program: run for real with `env` in llama-server's place."""
    import subprocess

    from ds4deploy.engines import LLAMACPP_KEY_SHIM, command

    out = subprocess.run([*LLAMACPP_KEY_SHIM, "env"], env={"VLLM_API_KEY": "k$1 'x'", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert "LLAMA_API_KEY=k$1 'x'" in out.splitlines()
    r = load_recipe("cpu-llamacpp")
    cmd = command(r, ["llama-server", *server_args(r)])
    assert cmd[:len(LLAMACPP_KEY_SHIM)] == LLAMACPP_KEY_SHIM and "--api-key" not in cmd


@pytest.mark.tool
def test_the_deploy_vars_of_cpu_llamacpp_are_written_with_its_own_ports():
    """`ds4deploy vars --scope deploy` (what `make deploy` runs first) accepts cpu-llamacpp: every check passes and
    the play variables carry the recipe's ports, off the cpu recipe's 8000/8001 so both stacks run on one host."""
    import yaml

    from tests.unit.conftest import run_cli

    p = run_cli("vars", "cpu-llamacpp", "--inventory", "ansible/inventories/local.yml", "--scope", "deploy")
    assert p.returncode == 0, p.stdout + p.stderr
    dv = yaml.safe_load(Path(p.stdout.strip()).read_text())
    assert (dv["ds4_port"], dv["ds4_engine_port"]) == (8020, 8021)
    assert dv["ds4_model_source"] == "generated" and dv["ds4_image"] == load_recipe("cpu-llamacpp").image_ref
    cpu = load_recipe("cpu")
    assert {8020, 8021}.isdisjoint({cpu.serving.port, cpu.engine_port})


def _scratch_llamacpp(tmp_path: Path, name: str, edit) -> Path:
    """recipes/cpu-llamacpp.yaml (and its image lock) as recipe `name` in a scratch recipes/ directory, changed by
    `edit(data)` and rendered into the scratch compose/ beside it (the render is checked before the model); returns
    recipes/."""
    import json

    import yaml

    from tests.unit.conftest import REPO, run_cli

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    data = yaml.safe_load((REPO / "recipes" / "cpu-llamacpp.yaml").read_text())
    data["name"] = name
    edit(data)
    (recipes / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    lock = json.loads((REPO / "recipes" / "cpu-llamacpp.lock.json").read_text())
    (recipes / f"{name}.lock.json").write_text(json.dumps({**lock, "recipe": name}))
    run_cli("render", name, env_dir=recipes)
    return recipes


def _assert_refused(p, *needles: str) -> None:
    """One message with its fix, exit 2, no traceback, no variables written."""
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "Traceback" not in out and p.stdout.strip() == "", out
    assert p.stderr.startswith("error: ") and p.stderr.count("\nfix: ") == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def _local(data: dict, path: Path) -> None:
    data["model"].update(source="local", path=str(path))


@pytest.mark.tool
def test_a_llamacpp_recipe_without_a_gguf_model_is_refused_before_anything(tmp_path):
    """A llama.cpp recipe whose model is not GGUF (no model.gguf section): refused by the schema, so before any
    check reads a node or anything is written."""
    from tests.unit.conftest import REPO, run_cli

    def edit(d):
        _local(d, tmp_path / "models")
        d["model"].pop("gguf")

    recipes = _scratch_llamacpp(tmp_path, "bad-nogguf", edit)
    p = run_cli("vars", "bad-nogguf", "--inventory", "ansible/inventories/local.yml", "--scope", "deploy",
                env_dir=recipes)
    _assert_refused(p, "model.gguf", "engine.family")
    assert not (REPO / ".cache" / "vars" / "bad-nogguf.deploy.yml").exists()


@pytest.mark.tool
def test_model_from_without_the_gguf_is_refused_with_the_parts_it_lacks(tmp_path):
    """MODEL_FROM (--model-from) for a local llama.cpp model: a safetensors checkpoint (no GGUF at all) and a split
    GGUF with a part missing are refused on the control host, naming the missing parts, before any node is read."""
    from tests.unit.conftest import REPO, run_cli

    models = tmp_path / "models"
    recipes = _scratch_llamacpp(tmp_path, "bad-local", lambda d: _local(d, models))
    st = tmp_path / "st"
    st.mkdir()
    (st / "config.json").write_text("{}")
    (st / "model.safetensors").write_bytes(b"\0" * 8)
    args = ("vars", "bad-local", "--inventory", "ansible/inventories/local.yml", "--scope", "deploy")
    p = run_cli(*args, "--model-from", str(st), env_dir=recipes)
    _assert_refused(p, "lacks ds4-tiny-deepseek4-00001-of-00002.gguf, ds4-tiny-deepseek4-00002-of-00002.gguf",
                    "holds no GGUF file: llama-server loads GGUF only", "point MODEL_FROM")
    one = tmp_path / "one"
    one.mkdir()
    (one / "ds4-tiny-deepseek4-00001-of-00002.gguf").write_bytes(b"GGUF")
    p = run_cli(*args, "--model-from", str(one), env_dir=recipes)
    _assert_refused(p, "lacks ds4-tiny-deepseek4-00002-of-00002.gguf (its GGUF files: "
                    "ds4-tiny-deepseek4-00001-of-00002.gguf)")
    assert not (REPO / ".cache" / "vars" / "bad-local.deploy.yml").exists()


@pytest.mark.tool
def test_a_manifest_without_a_gguf_part_is_refused(tmp_path):
    """A local llama.cpp model whose committed manifest lacks part 2 (locked from an incomplete copy): the deploy
    would check every node against it and pass a node missing that part, so it is refused first."""
    import json

    from tests.unit.conftest import REPO, run_cli

    recipes = _scratch_llamacpp(tmp_path, "bad-manifest", lambda d: _local(d, tmp_path / "models"))
    manifest = json.loads((REPO / "recipes" / "cpu-llamacpp.manifest.json").read_text())
    first = "ds4-tiny-deepseek4-00001-of-00002.gguf"
    # One file, not named as a split part: split_gguf_problems has nothing to say; the recipe's parts do.
    manifest.update(recipe="bad-manifest", source="local",
                    files={"ds4-tiny-deepseek4.gguf": manifest["files"][first]})
    (recipes / "bad-manifest.manifest.json").write_text(json.dumps(manifest))
    p = run_cli("vars", "bad-manifest", "--inventory", "ansible/inventories/local.yml", "--scope", "deploy",
                env_dir=recipes)
    _assert_refused(p, f"bad-manifest.manifest.json lacks {first}", "ds4deploy model lock bad-manifest --from PATH")


def test_every_llamacpp_argv_serves_metrics_and_no_recipe_can_turn_it_off():
    """The supervisor judges a llama.cpp engine from its /metrics (ds4deploy.operate.progress.read_llamacpp), which
    llama-server serves only with --metrics (tools/server/server-context.cpp, get_metrics: 501 otherwise). Every
    recipe's argv carries it, the committed render too, and the registry has no negation a recipe could add."""
    import json

    from ds4deploy.recipe.load import all_recipes
    from tests.unit.conftest import REPO

    recipes = [r for r in all_recipes() if r.engine.family == "llamacpp"]
    assert len(recipes) >= 4
    for r in recipes:
        assert "--metrics" in server_args(r), r.name
        assert "--metrics" in json.loads((REPO / "compose" / r.name / "engine-args.json").read_text()), r.name
    assert known_flags()["--metrics"]["negation"] is False and "--no-metrics" not in known_flags()
    # metrics: false was dropped silently (the argv kept --metrics); now it is refused, as every switch without a
    # negated form is.
    with pytest.raises(UserError, match="--metrics has no negated form"):
        server_args(_with("cpu-llamacpp", **{"engine.llamacpp.extra_args": {"metrics": False}}))
    with pytest.raises(UserError, match="no flag --no-metrics"):
        server_args(_with("cpu-llamacpp", **{"engine.llamacpp.extra_args": {"no-metrics": True}}))
