"""Model staging (ds4deploy/model/staging.py), the one path behind `model stage`, `bundle create` and `bundle
stage-model`:
the cpu recipe's generated model staged, restaged, copied from a bundle's model directory, and refused when a
file is missing or differs from the committed manifest."""

from __future__ import annotations

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.model.manifest import load_manifest, sha256_map
from ds4deploy.model.staging import stage
from ds4deploy.model.tiny import generator_spec
from ds4deploy.recipe.load import load_recipe


def test_stage_generates_verifies_and_reports_the_sha256_of_every_file(tmp_path):
    r = load_recipe("cpu")
    first = stage(r, tmp_path / "staged")
    assert first["changed"] is True and sorted(first["sha256"]) == sorted(load_manifest(r)["files"])
    again = stage(r, tmp_path / "staged")
    assert again["changed"] is False and again["sha256"] == first["sha256"]


def test_stage_from_a_bundle_copies_and_refuses_a_bad_copy(tmp_path):
    r = load_recipe("cpu")
    src = tmp_path / "bundle-model"
    stage(r, src)
    out = stage(r, tmp_path / "dest", copy_from=src)
    assert out["changed"] is True and out["sha256"] == sha256_map(src, load_manifest(r))
    assert not list((tmp_path / "dest").rglob("*.ds4-partial"))

    w = src / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"model.safetensors: sha256") as bad:
        stage(r, tmp_path / "dest2", copy_from=src)
    assert bad.value.code == 1 and "ds4deploy bundle verify" in bad.value.fix

    (src / "config.json").unlink()
    with pytest.raises(UserError, match=r"has no model file config\.json") as gone:
        stage(r, tmp_path / "dest3", copy_from=src)
    assert gone.value.code == 2


def test_only_a_generated_recipe_has_a_generator_spec():
    assert generator_spec(load_recipe("cpu")).hidden_size > 0
    with pytest.raises(UserError, match=r"has model\.source 'hub', not 'generated'"):
        generator_spec(load_recipe("gx10x2-ds4-flash-fp8"))
