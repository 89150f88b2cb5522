"""The llama.cpp tier's fixtures: the llamacpp-cpu image, built once from the locked source, and a tiny-GGUF maker.

The image is built through the product's own path (`ds4deploy.build.image.prepare_context`: the sdist verified
against recipes/cpu-llamacpp.lock.json, then `docker build` with the recipe's build args and the locked sha256),
from the local debootstrap base where no registry is reachable (the base `make deploy` builds). Docker must be
there; the tier is skipped, saying why, where it is not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ds4deploy.build.image import build_args, context_digest, debian_base, image_exists, prepare_context
from ds4deploy.engines.llamacpp import SPLIT_RE, gguf_parts
from ds4deploy.model.tiny_gguf import TinyGgufSpec, chat_template_from, generate
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from tests.support.images import CONTEXT_LABEL, context_label

CPU_RECIPE = "cpu-llamacpp"


def _docker_ok() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="session")
def llamacpp_image() -> str:
    """``repository:tag`` of the cpu-llamacpp recipe's image, built once (kept: the tag names its inputs), labelled
    as a deploy labels the image it builds (ansible/roles/image/tasks/build.yml), so that a deploy of a llama.cpp
    recipe on this image's arch keeps it and a stand-in host it is loaded into (tests/office) need not build. An
    image there without that label (built before the label was given here) is built again: its own layers are the
    build's cache, so that takes seconds."""
    if not _docker_ok():
        pytest.skip("no Docker daemon: the llama.cpp engine check runs the real llama-server in its image")
    recipe = load_recipe(CPU_RECIPE)
    ref = recipe.image_ref
    ctx = REPO_ROOT / ".cache" / "build" / recipe.engine.image.arch
    prepare_context(recipe, ctx)
    digest = context_digest(recipe, ctx)
    if image_exists(ref) and context_label(ref) == digest:
        return ref
    base = debian_base(recipe.engine.image.base_image)
    argv = ["docker", "build", "-t", ref, "--build-arg", f"BASE_IMAGE={base}",
            "--label", f"{CONTEXT_LABEL}={digest}", "--label", f"io.ds4deploy.recipe={CPU_RECIPE}"]
    for k, v in build_args(recipe).items():
        argv += ["--build-arg", f"{k}={v}"]
    t0 = time.monotonic()
    # The classic builder (the CI host has no buildx); each build step is a cached layer (images/llamacpp-cpu).
    subprocess.run([*argv, str(ctx)], check=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    print(f"\nllamacpp-cpu image built in {time.monotonic() - t0:.0f} s ({ref})")
    return ref


@pytest.fixture(scope="session")
def chat_template() -> str:
    """The DeepSeek V4 chat template from the locked sdist (placed in the build context by `llamacpp_image`)."""
    recipe = load_recipe(CPU_RECIPE)
    from ds4deploy.build.artifacts import locked_files
    from ds4deploy.build.image import default_wheel_dirs

    sdist = next(iter(locked_files(recipe, default_wheel_dirs()).values()))
    return chat_template_from(Path(sdist))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, chat_template):
    """``make(file, parts) -> dir``: a directory holding the tiny deepseek4 GGUF under the recipe's own file names."""
    made: dict[tuple[str, int], Path] = {}

    def make(file: str, parts: int) -> Path:
        key = (file, parts)
        if key not in made:
            names = gguf_parts(file, parts)
            stem = SPLIT_RE.match(names[0])["stem"] if parts > 1 else names[0].removesuffix(".gguf")
            dest = tmp_path_factory.mktemp("gguf")
            generate(dest, TinyGgufSpec(parts=parts, stem=stem), chat_template)
            made[key] = dest
        return made[key]

    return make
