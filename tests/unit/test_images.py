"""The GPU images cannot be built here (no GPU base images, no GitHub): every pin is checked instead.

Each recipe's build args must be declared in its Dockerfile with the same default, the base image must match, and
each architecture's hard facts (arch list, CUDA major, digest pin, wheel verification) must hold in the text.
check_cuda_toolkit.py is tested on real tool output captured on this machine (tests/unit/fixtures).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from ds4deploy import image
from ds4deploy.engine_venv import ENGINE_PYTHON
from ds4deploy.recipe import REPO_ROOT, all_recipes, load_recipe

FIXTURES = Path(__file__).parent / "fixtures"


def dockerfile_args(arch: str) -> dict[str, str]:
    text = (REPO_ROOT / "images" / arch / "Dockerfile").read_text()
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^ARG (\w+)=(.*)$", text, re.M)}


@pytest.mark.parametrize("recipe", all_recipes(), ids=lambda r: r.name)
def test_recipe_pins_match_the_dockerfile(recipe):
    args = dockerfile_args(recipe.engine.image.arch)
    assert args["BASE_IMAGE"] == recipe.engine.image.base_image
    for key, value in recipe.engine.image.build_args.items():
        assert key in args, f"{key} is not an ARG of images/{recipe.engine.image.arch}/Dockerfile"
        assert args[key] == value, f"{key}: Dockerfile {args[key]!r} != recipe {value!r}"


@pytest.mark.parametrize("arch", ["cpu", "sm70", "sm86", "sm121"])
def test_every_dockerfile_is_hadolint_clean_and_has_no_syntax_line(arch):
    path = REPO_ROOT / "images" / arch / "Dockerfile"
    assert not path.read_text().startswith("# syntax="), "a syntax line makes BuildKit pull an image"
    p = subprocess.run([str(REPO_ROOT / ".venv/bin/hadolint"), str(path)], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stdout


def test_sm121_base_is_pinned_by_digest():
    base = dockerfile_args("sm121")["BASE_IMAGE"]
    assert re.fullmatch(r"ghcr\.io/anemll/dspark-vllm-gx10:0\.1\.1@sha256:[0-9a-f]{64}", base)
    assert dockerfile_args("sm121")["TORCH_CUDA_ARCH_LIST"] == "12.1a"
    for key in ("VLLM_COMMIT", "FLASHINFER_COMMIT", "B12X_COMMIT"):
        assert re.fullmatch(r"[0-9a-f]{40}", dockerfile_args("sm121")[key])


def test_sm70_is_cuda12_and_arch_70_only():
    args = dockerfile_args("sm70")
    assert re.match(r"nvidia/cuda:12\.8\.\d+-devel-", args["BASE_IMAGE"])
    assert args["TORCH_CUDA_ARCH_LIST"] == "7.0"
    assert args["TORCH_INDEX"].endswith("/cu128")
    assert re.fullmatch(r"[0-9a-f]{40}", args["ONECAT_COMMIT"])
    assert args["TILELANG_VERSION"] == "0.1.10"
    text = (REPO_ROOT / "images/sm70/Dockerfile").read_text()
    assert 'if [ "${TORCH_CUDA_ARCH_LIST}" != "7.0" ]' in text
    assert "ninja-build" in text and "g++" in text
    assert "pip install --no-cache-dir --no-build-isolation -e /opt/1cat" in text  # source tree kept for JIT
    assert text.count("bash /opt/1cat/tools/torch_patches/apply.sh") == 2
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


def test_sm86_verifies_the_wheel_and_pins_one_cuda_toolkit():
    text = (REPO_ROOT / "images/sm86/Dockerfile").read_text()
    assert 'sha256sum -c -' in text
    assert 'if [ -z "${LVLLMDS4X_SHA256}" ]' in text
    for pkg in ("nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cuda-nvcc", "nvidia-cuda-cccl"):
        assert f'"{pkg}==${{CUDA_PIP_VERSION}}"' in text
    # after torch, without its dependency resolution (torch 2.11.0 pins the 13.0 toolkit)
    assert text.index("pip install --no-cache-dir --no-deps") > text.index('"torch==${TORCH_VERSION}"')
    runtime = text[text.rindex("FROM ${BASE_IMAGE}"):]
    assert "python3-dev" in runtime
    assert "check_cuda_toolkit.py" in text and "numactl" in text
    assert dockerfile_args("sm86")["BASE_IMAGE"] == "ubuntu:24.04"


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
    for name in ("gx10x2-ds4-flash-fp8", "rtx3090x2-xeon-ds4-flash", "v100x8-ds41-flash-iq2"):
        r = load_recipe(name)
        dest = tmp_path / name
        assert image.prepare_context(r, dest, [], None) is True
        assert (dest / "Dockerfile").is_file()
    assert (tmp_path / "rtx3090x2-xeon-ds4-flash" / "check_cuda_toolkit.py").is_file()
