"""`source: local` models (issue 14): the user names a file or directory on the control host; the first lock or
stage records a manifest (sha256, size) of it; `model stage` verifies those files against the committed manifest and
names them for the copy to every node, or, with no --from, hands the nodes only the sha256 to check their copies."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from tests.unit.conftest import run_cli, write_variant

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path / "ds4-cache"))


@pytest.fixture
def gguf(recipe_dir, tmp_path):
    """A local-model recipe and a directory holding a GGUF split in three parts (and a hidden file to leave out)."""

    def edit(d):
        d["model"] = {"source": "local", "served_name": "tiny-gguf", "dtype": "float16", "quantization": "gguf",
                      "size_on_disk_gb": 0.006, "path": str(tmp_path / "node-model")}

    write_variant(recipe_dir, "gguf", edit)
    src = tmp_path / "gguf"
    src.mkdir()
    parts = {f"tiny-0000{i}-of-00003.gguf": os.urandom((i + 1) * MIB + i) for i in range(1, 4)}
    for name, data in parts.items():
        (src / name).write_bytes(data)
    (src / ".partial-download").write_bytes(b"x")
    return recipe_dir, src, parts


def test_lock_from_a_directory_records_every_part(gguf):
    recipe_dir, src, parts = gguf
    p = run_cli("model", "lock", "gguf", "--from", str(src), env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    path = recipe_dir / "gguf.manifest.json"
    assert f"wrote {path}: 3 file(s)" in p.stdout
    manifest = json.loads(path.read_text())
    assert manifest["source"] == "local"
    assert manifest["files"] == {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in parts.items()}
    again = run_cli("model", "lock", "gguf", "--from", str(src), env_dir=recipe_dir)
    assert again.returncode == 0 and "up to date" in again.stdout
    # One part of a split named on its own is refused before any hashing: the engine needs every part.
    one = src / "tiny-00001-of-00003.gguf"
    p = run_cli("model", "lock", "gguf", "--from", str(one), env_dir=recipe_dir)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "split GGUF tiny: part(s) 00002-of-00003, 00003-of-00003 missing (1 of 3 present)" in p.stderr
    assert json.loads(path.read_text()) == manifest


def test_lock_of_a_single_file(gguf, tmp_path):
    recipe_dir, _, parts = gguf
    name = "tiny.gguf"  # a GGUF in one file (not a part of a split)
    (tmp_path / name).write_bytes(parts["tiny-00002-of-00003.gguf"])
    p = run_cli("model", "lock", "gguf", "--from", str(tmp_path / name), env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    files = json.loads((recipe_dir / "gguf.manifest.json").read_text())["files"]
    data = parts["tiny-00002-of-00003.gguf"]
    assert files == {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


@pytest.mark.parametrize(("args", "needle"), [
    ((), "run `ds4deploy model lock gguf --from PATH`"),
    (("--from", "/nonexistent/model.gguf"), "model source /nonexistent/model.gguf does not exist on this host"),
])
def test_lock_without_a_usable_source_is_one_message(gguf, args, needle):
    recipe_dir, _, _ = gguf
    p = run_cli("model", "lock", "gguf", *args, env_dir=recipe_dir)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
    assert not (recipe_dir / "gguf.manifest.json").exists()


def test_from_is_refused_for_a_model_that_is_not_local(recipe_dir, tmp_path):
    p = run_cli("model", "lock", "cpu", "--from", str(tmp_path), env_dir=recipe_dir)
    assert p.returncode == 2 and "--from names a local model's files" in p.stderr


def test_first_stage_records_the_manifest_and_names_the_files_to_copy(gguf, tmp_path):
    recipe_dir, src, parts = gguf
    dest = tmp_path / "staging"
    p = run_cli("model", "stage", "gguf", "--dest", str(dest), "--from", str(src), env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    path = recipe_dir / "gguf.manifest.json"
    out = json.loads(p.stdout)
    assert out == {"changed": False, "dest": str(src), "copy_from": str(src), "manifest_written": str(path),
                   "sha256": {n: hashlib.sha256(b).hexdigest() for n, b in parts.items()}}
    assert f"wrote {path}" in p.stderr
    assert not dest.exists()  # 248.8 GB are not copied twice on the control host: the nodes copy from --from
    # Already on each node: no --from, only the sha256 the nodes' copies are checked against.
    p = run_cli("model", "stage", "gguf", "--dest", str(dest), env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {**out, "dest": None, "copy_from": None, "manifest_written": None}


def test_stage_refuses_a_local_copy_that_differs_from_the_manifest(gguf, tmp_path):
    recipe_dir, src, _ = gguf
    assert run_cli("model", "lock", "gguf", "--from", str(src), env_dir=recipe_dir).returncode == 0
    bad = src / "tiny-00003-of-00003.gguf"
    with bad.open("r+b") as fh:
        fh.seek(MIB)
        byte = fh.read(1)
        fh.seek(MIB)
        fh.write(bytes([byte[0] ^ 1]))
    p = run_cli("model", "stage", "gguf", "--dest", str(tmp_path / "s"), "--from", str(src), env_dir=recipe_dir)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"the model files under {src} do not match gguf.manifest.json" in p.stderr
    assert f"{bad}: sha256" in p.stderr and "manifest says" in p.stderr
    (src / "tiny-00001-of-00003.gguf").unlink()
    p = run_cli("model", "stage", "gguf", "--dest", str(tmp_path / "s"), "--from", str(src), env_dir=recipe_dir)
    assert p.returncode == 1 and f"{src / 'tiny-00001-of-00003.gguf'}: missing" in p.stderr


def test_stage_without_manifest_or_source_names_the_lock_command(gguf, tmp_path):
    recipe_dir, _, _ = gguf
    p = run_cli("model", "stage", "gguf", "--dest", str(tmp_path / "s"), env_dir=recipe_dir)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "no model manifest for recipe 'gguf'" in p.stderr and "--from PATH" in p.stderr
