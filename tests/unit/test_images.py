"""The GPU images cannot be built here (no GPU base images, no GitHub): every pin is checked instead.

Each recipe's build args must be declared in its Dockerfile with the same default, the base image must match, and
each architecture's pins (arch list, CUDA major, digest pin) must hold. The checks the images run at build time
(sm70's arch check, sm86's wheel sha256 check) are run here for real, not read as text.
check_cuda_toolkit.py is tested on real tool output captured on this machine (tests/unit/fixtures).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from ds4deploy.build import image
from ds4deploy.build.engine_venv import ENGINE_PYTHON
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


def test_sm70_is_cuda12_and_arch_70_only():
    args = image_args("sm70")
    assert re.match(r"nvidia/cuda:12\.8\.\d+-devel-", args["BASE_IMAGE"])
    assert args["TORCH_CUDA_ARCH_LIST"] == "7.0"
    assert args["TORCH_INDEX"].endswith("/cu128")
    assert re.fullmatch(r"[0-9a-f]{40}", args["ONECAT_COMMIT"])
    assert args["TILELANG_VERSION"] == "0.1.10"
    text = (REPO_ROOT / "images/sm70/Dockerfile").read_text()
    assert 'if [ "${TORCH_CUDA_ARCH_LIST}" != "7.0" ]' in text
    assert "ninja-build" in text and "g++" in text
    # source tree kept for JIT; requirements and the editable build resolve against the cu128 torch index, as the
    # fork's bootstrap does (--torch-backend=cu128)
    assert '--no-build-isolation --extra-index-url "${TORCH_INDEX}" -e /opt/1cat' in text
    assert '--extra-index-url "${TORCH_INDEX}" \\\n      -r /opt/1cat/requirements/build/cuda.txt' in text
    # the torch patches run with the venv's interpreter (the script's default is a bare `python`) and need `patch`
    assert text.count("bash /opt/1cat/tools/torch_patches/apply.sh /opt/venv/bin/python") == 2
    assert re.search(r"apt-get install[^&]* patch\b", text)
    assert "FLASH_ATTN_V100_CUDA_ARCH_LIST=7.0" in text
    assert "git+https://github.com/triton-lang/triton" not in text


def test_sm70_arch_check_needs_no_gpu():
    """The image's sm_70 check, run for real against this machine's CPU torch: it must evaluate (no GPU needed)
    and fail here, because the CPU build has no CUDA arch flags."""
    eng = ENGINE_PYTHON
    if not eng.is_file():
        pytest.skip("no .cache/engine-venv: run `make unit` (it creates it)")
    text = (REPO_ROOT / "images/sm70/Dockerfile").read_text()
    check = re.search(r'/opt/venv/bin/python -c "(import torch; flags = [^"]+)"', text).group(1)
    p = subprocess.run([str(eng), "-c", check], capture_output=True, text=True, check=False)
    assert p.returncode == 1
    assert "AssertionError" in p.stderr


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


def test_gpu_contexts_need_no_local_torch_wheel(tmp_path):
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


def _encoder_run(tmp_path, *, checkpoint_has_encoder=True, engine_has_module=True):
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
        (model / "encoding_dsv4.py").write_text("NEW = 0731\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PYTHONPATH": str(site), "PATH": f"{bindir}:{os.environ['PATH']}",
           "DS4_DSV4_ENCODER": str(model / "encoding_dsv4.py")}
    p = subprocess.run(["bash", str(ENCODER), "sh", "-c", "echo engine ran with $0", "ok"], env=env,
                       capture_output=True, text=True, check=False)
    return p, installed


def test_encoder_step_installs_the_checkpoints_encoder_then_runs_the_engine(tmp_path):
    p, installed = _encoder_run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert installed.read_text() == "NEW = 0731\n"
    assert p.stdout.strip() == "engine ran with ok"


@pytest.mark.parametrize(("kwargs", "cause"), [
    ({"checkpoint_has_encoder": False}, "not a DeepSeek-V4 checkpoint with its encoder"),
    ({"engine_has_module": False}, "the engine has no vllm/tokenizers/deepseek_v4_encoding.py"),
])
def test_encoder_step_fails_closed(tmp_path, kwargs, cause):
    p, _ = _encoder_run(tmp_path, **kwargs)
    assert p.returncode == 1
    assert cause in p.stderr
    assert "engine ran" not in p.stdout


def test_sm121_routes_nvfp4_ds_mla_decode_to_the_fp8_path_or_fails_the_build():
    text = (REPO_ROOT / "images/sm121/Dockerfile").read_text()
    assert "grep -qF 'use_fp8_cache = self.kv_cache_dtype == \"fp8_ds_mla\"'" in text
    assert "grep -qF 'use_fp8_cache = self.kv_cache_dtype in (\"fp8_ds_mla\", \"nvfp4_ds_mla\")'" in text
    assert "COPY --chmod=0755 ds4-dsv4-encoder /usr/local/bin/ds4-dsv4-encoder" in text
    assert load_recipe("gx10x2-ds4-flash-fp8").engine.entrypoint[0] == "ds4-dsv4-encoder"
