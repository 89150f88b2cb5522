"""Hub models end to end against a local server speaking the hub's download protocol (tests/support/fakehub.py):
manifest from the hub's metadata, fetch of a pinned revision, verification, and each failure's message."""

from __future__ import annotations

import json

import pytest

from ds4deploy.recipe import load_recipe
from ds4deploy.tinymodel import TinyModelSpec, files
from tests.support.fakehub import FakeHub
from tests.unit.conftest import run_cli, write_variant

SHA = "9e165c30" + "0" * 32
REPO_ID = "ds4/tiny-hub"


@pytest.fixture(scope="module")
def model_files():
    return files(TinyModelSpec(**load_recipe("cpu").model.generator.model_dump()))


@pytest.fixture
def hub_recipe(recipe_dir, tmp_path):
    def edit(d):
        d["model"] = {"source": "hub", "repo_id": REPO_ID, "revision": SHA, "served_name": "tiny-hub",
                      "dtype": "bfloat16", "size_on_disk_gb": 0.006, "path": str(tmp_path / "model")}

    write_variant(recipe_dir, "hubby", edit)
    return recipe_dir


def cli(recipe_dir, hub, tmp_path, *args):
    import os

    env_extra = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1",
                 "HF_HUB_DISABLE_TELEMETRY": "1"}
    old = {k: os.environ.get(k) for k in env_extra}
    os.environ.update(env_extra)
    try:
        return run_cli(*args, env_dir=recipe_dir)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_manifest_fetch_and_stage(hub_recipe, tmp_path, model_files):
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        p = cli(hub_recipe, hub, tmp_path, "model", "manifest", "hubby", "--write")
        assert p.returncode == 0, p.stderr
        manifest = json.loads((hub_recipe / "hubby.manifest.json").read_text())
        assert manifest["revision"] == SHA
        assert "sha256" in manifest["files"]["model.safetensors"]  # large file: LFS sha256
        assert "git_sha1" in manifest["files"]["config.json"]  # small file: git blob id
        dest = tmp_path / "staged"
        p = cli(hub_recipe, hub, tmp_path, "model", "stage", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["changed"] is True
        assert set(out["sha256"]) == set(model_files)
        assert (dest / "model.safetensors").read_bytes() == model_files["model.safetensors"]
        again = cli(hub_recipe, hub, tmp_path, "model", "stage", "hubby", "--dest", str(dest))
        assert json.loads(again.stdout)["changed"] is False


def test_unknown_revision_is_named(hub_recipe, tmp_path, model_files):
    with FakeHub(REPO_ID, "f" * 40, model_files) as hub:
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(tmp_path / "x"))
    assert p.returncode == 2
    assert f"revision {SHA} does not exist in {REPO_ID}" in p.stderr
    assert "Traceback" not in p.stderr


def test_corrupted_download_is_never_reported_verified(hub_recipe, tmp_path, model_files):
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        assert cli(hub_recipe, hub, tmp_path, "model", "manifest", "hubby", "--write").returncode == 0
        bad = bytearray(model_files["model.safetensors"])
        bad[1000] ^= 0x01
        hub.served["model.safetensors"] = bytes(bad)
        p = cli(hub_recipe, hub, tmp_path, "model", "stage", "hubby", "--dest", str(tmp_path / "staged"))
    assert p.returncode != 0
    assert "model.safetensors" in p.stderr
    assert "Traceback" not in p.stderr


def test_file_missing_upstream(hub_recipe, tmp_path, model_files):
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        assert cli(hub_recipe, hub, tmp_path, "model", "manifest", "hubby", "--write").returncode == 0
        hub.missing.add("tokenizer.json")
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(tmp_path / "staged"))
    assert p.returncode == 2
    assert f"error: a file of {REPO_ID}@{SHA} is missing upstream" in p.stderr
    assert "fix: pin a revision whose files are all present" in p.stderr
    assert "Traceback" not in p.stderr


def test_unreachable_hub(hub_recipe, tmp_path, model_files):
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        endpoint = hub.endpoint
    dead = type("Dead", (), {"endpoint": endpoint})()
    p = cli(hub_recipe, dead, tmp_path, "model", "fetch", "hubby", "--dest", str(tmp_path / "x"))
    assert p.returncode == 2
    assert "could not reach the model hub" in p.stderr
    assert "HF_ENDPOINT" in p.stderr
