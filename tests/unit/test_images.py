"""The GPU images cannot be built here (no GPU base images, no GitHub): every pin is checked instead.

Each recipe's build args must be declared in its Dockerfile with the same default, the base image must match, and
each architecture's pins (arch list, CUDA major, digest pin) must hold. The checks the images run at build time
(sm70's arch check, sm86's wheel sha256 check) are run here for real, not read as text.
check_cuda_toolkit.py is tested on real tool output captured on this machine (tests/unit/fixtures).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ds4deploy.build import image
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.load import all_recipes, load_recipe
from ds4deploy.recipe.paths import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"


def dockerfile_args(arch: str) -> dict[str, str | None]:
    """ARG name -> its default in images/<arch>/Dockerfile (None: no default, the build must pass it)."""
    text = (REPO_ROOT / "images" / arch / "Dockerfile").read_text()
    return {m.group(1): (m.group(3).strip('"') if m.group(2) else None)
            for m in re.finditer(r"^ARG (\w+)(=(.*))?$", text, re.M)}


# Passed by the image role itself (ansible/roles/image/tasks/build.yml), not by the recipe: the base, the index
# switch, and each downloaded artifact's sha256 from its lock (`ds4deploy.build.artifacts.locked_build_args`).
ROLE_ARGS = {"BASE_IMAGE", "PIP_NO_INDEX", "LVLLMDS4X_SHA256"}


@pytest.mark.parametrize("recipe", all_recipes(), ids=lambda r: r.name)
def test_the_recipe_is_the_only_copy_of_the_build_pins(recipe):
    """Every pin the Dockerfile takes without a default comes from the recipe's build args (the build fails
    otherwise), every recipe build arg is an ARG of the Dockerfile, and the Dockerfile repeats none of them."""
    args = dockerfile_args(recipe.engine.image.arch)
    given = recipe.image_build_args
    from ds4deploy.build.artifacts import image_artifacts

    locked = {a.sha_arg for a in image_artifacts(recipe)}  # from the recipe's lock, passed with the recipe's args
    required = {k for k, v in args.items() if v is None} - ROLE_ARGS - locked
    assert required <= set(given), f"no value for {sorted(required - set(given))}"
    for key in recipe.engine.image.build_args:
        assert key in args, f"{key} is not an ARG of images/{recipe.engine.image.arch}/Dockerfile"
        assert args[key] is None, f"images/{recipe.engine.image.arch}/Dockerfile repeats {key}={args[key]!r}"


@pytest.mark.parametrize("arch", ["cpu", "sm70", "sm86", "sm121", "llamacpp-cpu", "llamacpp-cuda"])
def test_every_dockerfile_is_hadolint_clean_and_has_no_syntax_line(arch):
    path = REPO_ROOT / "images" / arch / "Dockerfile"
    assert not path.read_text().startswith("# syntax="), "a syntax line makes BuildKit pull an image"
    p = subprocess.run([str(REPO_ROOT / ".venv/bin/hadolint"), str(path)], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stdout


def image_args(arch: str) -> dict[str, str]:
    """BASE_IMAGE and every build arg the recipe of `arch` gives its image build."""
    r = next(r for r in all_recipes() if r.engine.image.arch == arch)
    return {"BASE_IMAGE": r.engine.image.base_image, **r.image_build_args}


def test_sm121_base_is_pinned_by_digest():
    args = image_args("sm121")
    assert re.fullmatch(r"ghcr\.io/anemll/dspark-vllm-gx10:0\.1\.1@sha256:[0-9a-f]{64}", args["BASE_IMAGE"])
    assert args["TORCH_CUDA_ARCH_LIST"] == "12.1a"
    for key in ("VLLM_COMMIT", "FLASHINFER_COMMIT", "B12X_COMMIT"):
        assert re.fullmatch(r"[0-9a-f]{40}", args[key])


def test_sm70_is_a_checked_layer_over_the_owners_engine():
    """The V100 engine is the owner's own port (not public): the image is a thin layer over their image that refuses,
    at build, a base without CUDA 12, an sm_70 torch or the DeepSeek-V4.1 package."""
    args = image_args("sm70")
    assert args["BASE_IMAGE"] == "local/ds41-pp2tp4-sm70:owner"
    assert args["TORCH_CUDA_ARCH_LIST"] == "7.0"
    assert re.fullmatch(r"[0-9a-f]{40}", args["ONECAT_COMMIT"])
    text = (REPO_ROOT / "images/sm70/Dockerfile").read_text()
    assert 'if [ "${TORCH_CUDA_ARCH_LIST}" != "7.0" ]' in text
    assert "(torch.version.cuda or '').startswith('12.')" in text
    assert "'vllm.models.deepseek_v41', 'vllm.tool_parsers.deepseekv41_engine_tool_parser'" in text
    assert "git clone" not in text and "pip install" not in text  # the owner builds their engine, not this layer


def _sm70_checks(text: str) -> list[str]:
    """The sm70 Dockerfile's three `python3 -c "..."` build checks."""
    return re.findall(r'python3 -c "([^"]+)"', text)


@pytest.mark.tool
def test_sm70_checks_run_without_a_gpu_and_refuse_a_cpu_engine(engine_python):
    """The image's checks, run for real with this machine's CPU vLLM (.cache/engine-venv): each evaluates without a
    GPU; the CUDA and sm_70 checks refuse that engine. vLLM 0.32 has the DeepSeek-V4.1 package upstream, so the
    package check passes it, and refuses a name it does not have."""
    eng = engine_python
    checks = _sm70_checks((REPO_ROOT / "images/sm70/Dockerfile").read_text())
    assert len(checks) == 3
    for check in checks[:2]:
        p = subprocess.run([str(eng), "-c", check], capture_output=True, text=True, check=False, timeout=300)
        assert p.returncode == 1 and "AssertionError" in p.stderr, check
    ok = subprocess.run([str(eng), "-c", checks[2]], capture_output=True, text=True, check=False, timeout=300)
    assert ok.returncode == 0, ok.stderr
    gone = checks[2].replace("vllm.models.deepseek_v41'", "vllm.models.deepseek_v41_absent'")
    bad = subprocess.run([str(eng), "-c", gone], capture_output=True, text=True, check=False, timeout=300)
    assert bad.returncode == 1 and "deepseek_v41_absent" in bad.stderr


def _sm86_wheel_check(tmp_path: Path) -> str:
    """The sm86 Dockerfile's wheel check (the first RUN up to the venv), run here with the image's paths moved
    under `tmp_path` (no CA files, a wheel already in the wheelhouse, so nothing is downloaded)."""
    text = (REPO_ROOT / "images/sm86/Dockerfile").read_text()
    start = text.index('RUN if [ -z "${LVLLMDS4X_SHA256}" ]')
    script = text[start + 4:text.index("&& python3 -m venv /opt/venv", start)].replace("\\\n", " ")
    script = (script.replace("/etc/ssl/certs/ca-certificates.crt /tmp/extra-ca.pem", "/dev/null")
              .replace("/tmp/ca-bundle.pem", f"{tmp_path}/ca-bundle.pem").replace("/wheelhouse/", f"{tmp_path}/"))
    assert "/wheelhouse" not in script and "/etc/" not in script
    return script


@pytest.mark.parametrize(("sha", "rc", "says"), [
    ("", 1, "LVLLMDS4X_SHA256 is empty: the Lvllmds4-x wheel cannot be verified"),
    ("0" * 64, 1, "FAILED"),
    (None, 0, ": OK"),
])
def test_sm86_installs_the_wheel_only_with_its_sha256(tmp_path, sha, rc, says):
    import hashlib

    wheel = tmp_path / "lvllmds4_x-test.whl"
    wheel.write_bytes(b"not really a wheel")
    env = {"PATH": "/usr/bin:/bin", "LVLLMDS4X_WHEEL": wheel.name,
           "LVLLMDS4X_SHA256": hashlib.sha256(wheel.read_bytes()).hexdigest() if sha is None else sha}
    p = subprocess.run(["sh", "-c", _sm86_wheel_check(tmp_path)], env=env, capture_output=True, text=True,
                       check=False)
    assert (p.returncode != 0) == (rc != 0), p.stdout + p.stderr
    assert says in p.stdout + p.stderr


def _checker():
    spec = importlib.util.spec_from_file_location("check_cuda_toolkit",
                                                  REPO_ROOT / "images/sm86/check_cuda_toolkit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cuda_toolkit_check_on_real_tool_output():
    chk = _checker()
    nvcc = chk.nvcc_release((FIXTURES / "nvcc-13.0-version.txt").read_text())
    assert nvcc == "13.0.88"
    system_headers = chk.header_version((FIXTURES / "cuda_runtime_api-13.0-excerpt.h").read_text())
    triton_headers = chk.header_version((FIXTURES / "cuda_runtime_api-triton-excerpt.h").read_text())
    assert (system_headers, triton_headers) == ("13.0", "13.1")
    assert chk.agree(nvcc, system_headers, "13.0.96")
    # The mismatch this machine really has: nvcc 13.0 beside headers 13.1 (triton's bundled copy).
    assert not chk.agree(nvcc, triton_headers, "13.0.96")
    with pytest.raises(ValueError, match="no 'release"):
        chk.nvcc_release("nvcc: command not found\n")


def test_gpu_contexts_need_no_local_torch_wheel(tmp_path, recipe_dir):
    # The V100 image builds on its owner's image, pinned by image ID in its lock (tests/unit/test_owner_base_image.py).
    for f in (REPO_ROOT / "recipes").glob("*.yaml"):
        shutil.copy(f, recipe_dir)
    (recipe_dir / "v100x8-ds41-flash-iq2.lock.json").write_text(json.dumps(
        {"recipe": "v100x8-ds41-flash-iq2", "image": "sm70", "artifacts": {},
         "base_image": {"ref": "local/ds41-pp2tp4-sm70:owner", "id": "sha256:" + "ab" * 32, "repo_digests": []}}))
    for name in ("gx10x2-ds4-flash-fp8", "v100x8-ds41-flash-iq2"):
        r = load_recipe(name)
        dest = tmp_path / name
        assert image.prepare_context(r, dest, [], None) is True
        assert (dest / "Dockerfile").is_file()


def _sm121_torch_check(tmp_path, installed: str, pinned: str) -> subprocess.CompletedProcess:
    """Run the sm121 Dockerfile's own torch check (its `python3 -c "..."` text, expanded by bash as the RUN line
    is) against a stand-in torch module that reports `installed`, with build arg TORCH_VERSION=`pinned`."""
    text = (REPO_ROOT / "images" / "sm121" / "Dockerfile").read_text()
    match = re.search(r'(python3 -c "import vllm, torch;[^"]*")', text)
    assert match, "the sm121 Dockerfile lost its torch check"
    (tmp_path / "torch.py").write_text(f"__version__ = {installed!r}\n")
    (tmp_path / "vllm.py").write_text("")
    return subprocess.run(["bash", "-o", "pipefail", "-c", match.group(1)], capture_output=True, text=True,
                          check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path),
                                            # no .pyc: the stand-in is rewritten within one second, same size
                                            "PYTHONDONTWRITEBYTECODE": "1", "TORCH_VERSION": pinned})


def test_sm121_torch_check_compares_the_local_version_too(tmp_path):
    assert _sm121_torch_check(tmp_path, "2.11.0+cu130", "2.11.0+cu130").returncode == 0
    wrong_cuda = _sm121_torch_check(tmp_path, "2.11.0+cu128", "2.11.0+cu130")
    assert wrong_cuda.returncode != 0  # same public version, CUDA 12.8 build: no sm_121 kernels
    assert "2.11.0+cu128" in wrong_cuda.stderr
    assert _sm121_torch_check(tmp_path, "2.10.0+cu130", "2.11.0+cu130").returncode != 0
    # sm86 downloads the Lvllmds4-x wheel: without its lock nothing is laid out (tests/unit/test_artifacts.py builds
    # the context from a lock).
    with pytest.raises(UserError, match=r"rtx3090x2-xeon-ds4-flash.lock.json is missing"):
        image.prepare_context(load_recipe("rtx3090x2-xeon-ds4-flash"), tmp_path / "sm86", [], None)
    assert not (tmp_path / "sm86").exists()


ENCODER = REPO_ROOT / "images" / "sm121" / "ds4-dsv4-encoder"
FIX = REPO_ROOT / "images" / "sm121" / "ds4_dsv4_encoder_fix.py"

# A stand-in for the checkpoint's encoder with its fault (tests' own code): arguments always parsed as JSON text,
# anything else wrapped as one `arguments` parameter (MiaAI-Lab two-Spark setup, issue 21).
FAULTY_ENCODER = """import json


def encode_arguments_to_dsml(tool_call):
    try:
        arguments = json.loads(tool_call["arguments"])
    except Exception:
        arguments = {"arguments": tool_call["arguments"]}
    return "\\n".join(f'<p name="{k}">{v if isinstance(v, str) else json.dumps(v)}</p>' for k, v in arguments.items())


def render(call):
    return encode_arguments_to_dsml(call)
"""
# The same format, written the way vLLM's own encoder handles both types: the reference.
REFERENCE_ENCODER = FAULTY_ENCODER.replace(
    """    try:
        arguments = json.loads(tool_call["arguments"])
    except Exception:
        arguments = {"arguments": tool_call["arguments"]}""",
    """    arguments = tool_call["arguments"]
    if isinstance(arguments, str):
        arguments = json.loads(arguments)""")


def _fix(*args, cwd=None):
    import sys

    return subprocess.run([sys.executable, str(FIX), *map(str, args)], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=120)


def test_the_fix_makes_a_replayed_object_argument_encode_as_vllm_does(tmp_path):
    import importlib.util as iu
    import json

    enc, ref = tmp_path / "enc.py", tmp_path / "ref.py"
    enc.write_text(FAULTY_ENCODER)
    ref.write_text(REFERENCE_ENCODER)
    call = {"name": "write_file", "arguments": {"path": "a.py", "n": 2}}

    def load(path):
        spec = iu.spec_from_file_location(f"m{path.stat().st_mtime_ns}{path.name}", path)
        mod = iu.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    assert 'name="arguments"' in load(enc).render(call)  # the fault, as the checkpoint has it
    p = _fix("apply", enc, "--reference", ref)
    assert p.returncode == 0, p.stderr
    assert "object arguments encode as vLLM's unpatched encoder encodes them" in p.stdout
    fixed = load(enc)
    as_text = {**call, "arguments": json.dumps(call["arguments"])}
    assert fixed.render(call) == load(ref).render(call) == fixed.render(as_text)
    # Applying again changes nothing; the module's own callers (render) use the wrapper.
    once = enc.read_text()
    assert _fix("apply", enc, "--reference", ref).returncode == 0 and enc.read_text() == once


def test_the_fix_refuses_an_encoder_it_cannot_fix_and_restores_it(tmp_path):
    enc, ref = tmp_path / "enc.py", tmp_path / "ref.py"
    # Wraps every argument whatever its type: no wrapper around the function can repair that.
    broken = FAULTY_ENCODER.replace('arguments = json.loads(tool_call["arguments"])',
                                    'arguments = {"arguments": tool_call["arguments"]}')
    enc.write_text(broken)
    ref.write_text(REFERENCE_ENCODER)
    p = _fix("apply", enc, "--reference", ref)
    assert p.returncode == 1
    assert "error: ds4_dsv4_encoder_fix apply: the arguments are wrapped into one parameter" in p.stderr
    assert enc.read_text() == broken  # restored
    enc.write_text("OLD = 1\n")
    assert "has no encode_arguments_to_dsml" in _fix("apply", enc, "--reference", ref).stderr


def test_the_build_self_test_on_vllms_own_encoder(engine_python):
    """The image runs it at build against its vLLM's deepseek_v4 encoder; here against the CPU vLLM's (same file)."""
    find = subprocess.run([str(engine_python), "-c", "import importlib.util as u; "
                           "print(u.find_spec('vllm').submodule_search_locations[0])"],
                          capture_output=True, text=True, check=True, timeout=120)
    ref = Path(find.stdout.strip()) / "tokenizers" / "deepseek_v4_encoding.py"
    p = _fix("self-test", "--reference", ref)
    assert p.returncode == 0, p.stderr
    assert "fixes the faulty stand-in" in p.stdout


def _encoder_run(tmp_path, *, checkpoint_has_encoder=True, engine_has_module=True, checkpoint=FAULTY_ENCODER):
    """Run images/sm121/ds4-dsv4-encoder against a stand-in vllm package and model directory."""
    import os
    import sys

    site = tmp_path / "site"
    (site / "vllm" / "tokenizers").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    installed = site / "vllm" / "tokenizers" / "deepseek_v4_encoding.py"
    if engine_has_module:
        installed.write_text("OLD = 1\n")
    model = tmp_path / "model" / "encoding"
    model.mkdir(parents=True)
    if checkpoint_has_encoder:
        (model / "encoding_dsv4.py").write_text(checkpoint)
    reference = tmp_path / "reference.py"
    reference.write_text(REFERENCE_ENCODER)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PYTHONPATH": str(site), "PATH": f"{bindir}:{os.environ['PATH']}",
           "DS4_DSV4_ENCODER": str(model / "encoding_dsv4.py"), "DS4_DSV4_FIX": str(FIX),
           "DS4_DSV4_REFERENCE": str(reference)}
    p = subprocess.run(["bash", str(ENCODER), "sh", "-c", "echo engine ran with $0", "ok"], env=env,
                       capture_output=True, text=True, check=False)
    return p, installed


def test_encoder_step_installs_the_checkpoints_encoder_fixes_it_then_runs_the_engine(tmp_path):
    p, installed = _encoder_run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert installed.read_text().startswith(FAULTY_ENCODER)
    assert "ds4_dsv4_encoder_fix: patched" in p.stderr
    assert p.stdout.strip() == "engine ran with ok"


@pytest.mark.parametrize(("kwargs", "cause"), [
    ({"checkpoint_has_encoder": False}, "not a DeepSeek-V4 checkpoint with its encoder"),
    ({"engine_has_module": False}, "the engine has no vllm/tokenizers/deepseek_v4_encoding.py"),
    ({"checkpoint": "NEW = 731\n"}, "has no encode_arguments_to_dsml"),
])
def test_encoder_step_fails_closed(tmp_path, kwargs, cause):
    p, _ = _encoder_run(tmp_path, **kwargs)
    assert p.returncode == 1
    assert cause in p.stderr
    assert "engine ran" not in p.stdout


ANCHOR_ORDER = ["hotfix-gb10-spin-wait.sh", "hotfix-dsv4-mtp-buffer-50312.sh", "hotfix-dsv4-adaptive-topk-50004.sh",
                "hotfix-dsv4-skip-topk-49486.sh", "hotfix-dsv4-dense-prefill-indexer-48407.sh",
                "hotfix-dsv4-skip-empty-c128-48957.sh", "hotfix-dsv4-flashmla-workspace-50298.sh",
                "hotfix-dsv4-grammar-advance.sh"]


def test_sm121_pins_the_anchors_backports_by_commit_and_sha256():
    """The scripts the two-Spark setup runs before every start (docker-compose.dspark.yml at 489af958), in its
    order, each with a sha256; the URL names that commit."""
    lines = (REPO_ROOT / "images/sm121/anchor-patches.sha256").read_text().splitlines()
    assert [ln.split("  ")[1] for ln in lines] == ANCHOR_ORDER
    assert all(re.fullmatch(r"[0-9a-f]{64}", ln.split("  ")[0]) for ln in lines)
    args = dockerfile_args("sm121")
    assert args["ANCHOR_PATCHES_URL"] == ("https://raw.githubusercontent.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-"
                                          "DGX-Spark/489af9589684127ece879dd9e53395c5ff9157c8/patches")


def _apply_loop(tmp_path: Path, scripts: dict[str, str]) -> subprocess.CompletedProcess:
    """The sm121 Dockerfile's own apply loop (its text from `while read` to the sha256 file), run on stand-in
    scripts in `tmp_path`: each gets VLLM_ROOT, then --status."""
    text = (REPO_ROOT / "images/sm121/Dockerfile").read_text()
    start = text.index('&& while read -r _ p; do \\\n         VLLM_ROOT=')
    end = text.index("done < /opt/ds4deploy/anchor-patches.sha256", start)
    loop = text[start + 3:end + len("done < /opt/ds4deploy/anchor-patches.sha256")].replace("\\\n", "\n")
    sums = tmp_path / "sums"
    sums.write_text("".join(f"{'0' * 64}  {name}\n" for name in scripts))
    for name, body in scripts.items():
        (tmp_path / name).write_text(body)
    script = f"d={tmp_path}; vllm_dir={tmp_path}/vllm\n" + loop.replace("/opt/ds4deploy/anchor-patches.sha256",
                                                                         str(sums))
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True, text=True, check=False)


GOOD = 'if [ "${1:-}" = --status ]; then echo "part : APPLIED"; fi; test -n "$VLLM_ROOT"\n'


@pytest.mark.parametrize(("bad", "says"), [
    (None, ""),
    ('if [ "${1:-}" = --status ]; then echo "part : NOT APPLIED"; fi\n', "NOT APPLIED"),
    ('echo "[FAIL] anchor moved" >&2; exit 1\n', "[FAIL] anchor moved"),
])
def test_sm121_build_fails_when_a_backport_does_not_take(tmp_path, bad, says):
    scripts = {"a.sh": GOOD, "b.sh": GOOD if bad is None else bad, "c.sh": GOOD}
    p = _apply_loop(tmp_path, scripts)
    assert (p.returncode == 0) == (bad is None), p.stdout + p.stderr
    assert says in p.stdout + p.stderr
    if bad is not None:
        assert "c.sh: applied" not in p.stderr  # stops at the first failure


def test_sm121_routes_nvfp4_ds_mla_decode_to_the_fp8_path_or_fails_the_build():
    text = (REPO_ROOT / "images/sm121/Dockerfile").read_text()
    assert "grep -qF 'use_fp8_cache = self.kv_cache_dtype == \"fp8_ds_mla\"'" in text
    assert "grep -qF 'use_fp8_cache = self.kv_cache_dtype in (\"fp8_ds_mla\", \"nvfp4_ds_mla\")'" in text
    assert "COPY --chmod=0755 ds4-dsv4-encoder /usr/local/bin/ds4-dsv4-encoder" in text
    assert "ds4_dsv4_encoder_fix.py self-test" in text and "sha256sum -c -" in text
    assert load_recipe("gx10x2-ds4-flash-fp8").engine.entrypoint[0] == "ds4-dsv4-encoder"
