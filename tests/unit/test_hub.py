"""Hub models end to end against a local server speaking the hub's download protocol (tests/support/fakehub.py):
manifest from the hub's metadata, fetch of a pinned revision, verification, and each failure's message."""

from __future__ import annotations

import hashlib
import json

import pytest

from ds4deploy.model.tiny import TinyModelSpec, files
from ds4deploy.recipe.load import load_recipe
from tests.support.fakehub import FakeHub
from tests.unit.conftest import run_cli, write_variant

pytestmark = pytest.mark.tool  # runs a hub server with real stall timeouts: not in `make check-fast`

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


# --- fetch: staging, hash before move, resume, failures (issue 7) -----------------------------------------------

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Each test's verification sidecars live in its own cache directory."""
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path / "ds4-cache"))


@pytest.fixture
def small_fs(tmp_path):
    """Mount a tmpfs of a given size (real ENOSPC); skipped where mounting is not allowed."""
    import subprocess

    mounted = []

    def make(size: str):
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True,
                           text=True, check=False)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.fixture(scope="module")
def big_files(model_files):
    """The tiny model plus a 32 MiB shard: huggingface_hub writes downloads in 10 MiB pieces
    (constants.DOWNLOAD_CHUNK_SIZE), so only a file larger than that can be resumed part-way."""
    import numpy as np

    return {**model_files, "model-00002-of-00002.safetensors": np.random.default_rng(7).bytes(32 * MIB)}


def _resume_offset(cut: int) -> int:
    """Where huggingface_hub resumes after a cut at byte `cut`: the whole 10 MiB pieces it had written."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    return cut // DOWNLOAD_CHUNK_SIZE * DOWNLOAD_CHUNK_SIZE


def _manifest(hub_recipe, hub, tmp_path) -> dict:
    p = cli(hub_recipe, hub, tmp_path, "model", "manifest", "hubby", "--write")
    assert p.returncode == 0, p.stderr
    return json.loads((hub_recipe / "hubby.manifest.json").read_text())


def _staging(dest):
    return dest.parent / f".{dest.name}.ds4-staging"


def _file_gets(hub, name):
    return [rng for method, n, rng in hub.requests if method == "GET" and n == name]


def test_fetch_places_verified_files_and_removes_staging(hub_recipe, tmp_path, model_files):
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["commit"] == SHA and sorted(out["fetched"]) == sorted(model_files) and out["present"] == 0
        assert {f.name: f.read_bytes() for f in dest.iterdir()} == model_files
        assert not _staging(dest).exists()
        # A second fetch finds every file verified (from the sidecar) and downloads nothing.
        gets = len(hub.requests)
        again = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["fetched"] == [] and json.loads(again.stdout)["present"] == len(model_files)
        assert hub.requests[gets:] == []
    v = run_cli("model", "verify", "hubby", "--dir", str(dest), "--json", env_dir=hub_recipe)
    assert v.returncode == 0, v.stderr
    assert set(json.loads(v.stdout)["files"].values()) == {"cached"}  # fetch recorded what it verified


def test_fetch_replaces_only_the_damaged_file(hub_recipe, tmp_path, model_files):
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        assert cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest)).returncode == 0
        with (dest / "tokenizer.json").open("r+b") as fh:
            fh.truncate(100)
        hub.requests.clear()
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["fetched"] == ["tokenizer.json"]
        assert {n for _, n, _ in hub.requests} == {"tokenizer.json"}
    assert (dest / "tokenizer.json").read_bytes() == model_files["tokenizer.json"]


def test_cut_connection_resumes_with_a_range_request(hub_recipe, tmp_path, big_files):
    dest = tmp_path / "model"
    shard = "model-00002-of-00002.safetensors"
    with FakeHub(REPO_ID, SHA, big_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.cuts[shard] = [15 * MIB, 1]  # the connection drops once, 15 MiB into the 32 MiB shard
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        gets = _file_gets(hub, shard)
    assert gets == [None, f"bytes={_resume_offset(15 * MIB)}-"], gets  # full request, then a resume
    assert (dest / shard).read_bytes() == big_files[shard]


def test_interrupted_fetch_keeps_complete_files_for_the_next_run(hub_recipe, tmp_path, big_files):
    """Across runs huggingface_hub (>= 1.18) continues whole files, not partial ones (ds4deploy.model.hub docstring)."""
    dest = tmp_path / "model"
    shard = "model-00002-of-00002.safetensors"
    with FakeHub(REPO_ID, SHA, big_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        # huggingface_hub retries 5 times in-process when no new byte arrives; 6 cuts make the first run give up.
        hub.cuts[shard] = [15 * MIB, 6]
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 2, p.stderr
        assert "could not reach the model hub" in p.stderr and "Traceback" not in p.stderr
        assert len(_file_gets(hub, shard)) == 6
        assert not dest.exists()  # nothing placed, not even the complete small files
        assert (_staging(dest) / "config.json").is_file() and not (_staging(dest) / shard).exists()
        hub.requests.clear()
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        assert _file_gets(hub, shard) == [None]  # the cut shard again, from its start
        assert _file_gets(hub, "config.json") == []  # complete staged files are not downloaded again
    assert (dest / shard).read_bytes() == big_files[shard]
    assert not _staging(dest).exists()
    v = run_cli("model", "verify", "hubby", "--dir", str(dest), "--full", "--json", env_dir=hub_recipe)
    assert v.returncode == 0 and json.loads(v.stdout)["ok"] is True


def test_corrupted_byte_is_named_with_both_hashes_and_never_placed(hub_recipe, tmp_path, model_files):
    import hashlib

    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        bad = bytearray(model_files["model.safetensors"])
        bad[4 * MIB] ^= 0x01
        hub.served["model.safetensors"] = bytes(bad)
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 1, p.stderr
        want = hashlib.sha256(model_files["model.safetensors"]).hexdigest()
        got = hashlib.sha256(bytes(bad)).hexdigest()
        assert f"model.safetensors: sha256 expected {want}, got {got}" in p.stderr
        assert not dest.exists()  # not even the files that were fine
        assert not (_staging(dest) / "model.safetensors").exists()  # the bad copy is deleted
        # Once the hub serves the right bytes, the next run downloads that file afresh and places everything.
        del hub.served["model.safetensors"]
        hub.requests.clear()
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        assert _file_gets(hub, "model.safetensors") == [None]
    assert (dest / "model.safetensors").read_bytes() == model_files["model.safetensors"]


def test_file_missing_upstream_places_nothing(hub_recipe, tmp_path, model_files):
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.missing.add("tokenizer.json")
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
    assert p.returncode == 2
    assert "tokenizer.json" in p.stderr and "missing upstream" in p.stderr
    assert not dest.exists()


def test_not_enough_room_is_refused_before_downloading(hub_recipe, tmp_path, model_files, small_fs):
    fs = small_fs("2m")
    dest = fs / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.requests.clear()
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert hub.requests == []  # no file was requested
    need = sum(len(b) for b in model_files.values())
    assert p.returncode == 2, p.stderr
    assert f"needs {need / 1e9:.2f} GB ({need / 2**30:.2f} GiB)" in p.stderr
    assert f"has {2 * MIB / 1e9:.2f} GB ({2 * MIB / 2**30:.2f} GiB) free" in p.stderr
    assert "Traceback" not in p.stderr
    assert list(fs.iterdir()) == []


def test_disk_full_during_download_leaves_nothing_behind(hub_recipe, tmp_path, model_files, small_fs):
    import shutil

    fs = small_fs("8m")  # room for the 5.4 MB the manifest names, not for what the hub sends
    dest = fs / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.served["model.safetensors"] = model_files["model.safetensors"] + bytes(16 * MIB)
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
    assert p.returncode == 2, p.stderr
    assert "no space left on device" in p.stderr and "the partial files were removed" in p.stderr
    assert "Traceback" not in p.stderr
    assert list(fs.iterdir()) == []  # no model dir, no staging dir
    assert shutil.disk_usage(fs).used < MIB


def test_recipe_pin_must_match_the_manifest(hub_recipe, tmp_path, model_files):
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        manifest = _manifest(hub_recipe, hub, tmp_path)
        # A manifest without a full commit is refused.
        (hub_recipe / "hubby.manifest.json").write_text(json.dumps({**manifest, "revision": SHA[:8]}))
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(tmp_path / "m"))
        assert p.returncode == 2 and "does not pin a full 40-hex commit" in p.stderr
        # A manifest built for another commit than the recipe pins is refused.
        other = "1" * 40
        (hub_recipe / "hubby.manifest.json").write_text(json.dumps({**manifest, "revision": other}))
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(tmp_path / "m"))
        assert p.returncode == 2 and f"was built for commit {other}" in p.stderr
    assert not (tmp_path / "m").exists()


def test_short_pin_is_fetched_by_the_manifests_full_commit(recipe_dir, tmp_path, model_files):
    def edit(d):
        d["model"] = {"source": "hub", "repo_id": REPO_ID, "revision": SHA[:8], "served_name": "tiny-hub",
                      "dtype": "bfloat16", "size_on_disk_gb": 0.006, "path": str(tmp_path / "model")}

    write_variant(recipe_dir, "hubby", edit)
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        manifest = _manifest(recipe_dir, hub, tmp_path)
        assert manifest["revision"] == SHA  # the full commit the hub resolved the prefix to
        hub.requests.clear()
        p = cli(recipe_dir, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["commit"] == SHA
    # The hub now resolves the same prefix to another commit (history rewritten, or the manifest is stale).
    moved = SHA[:8] + "a" * 32
    with FakeHub(REPO_ID, moved, model_files) as hub:
        p = cli(recipe_dir, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(tmp_path / "other"))
    assert p.returncode == 2
    assert f"resolves {REPO_ID}@{SHA[:8]} to commit {moved}" in p.stderr and f"built for {SHA}" in p.stderr
    assert not (tmp_path / "other").exists()


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from ds4deploy.core.errors import UserError
from ds4deploy.model.fetch import fetch_lock_path
from ds4deploy.core.holder_lock import HolderLock
with HolderLock(fetch_lock_path(Path(sys.argv[1])), lambda who: UserError(who, ""), what="ds4deploy model fetch hubby"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_second_fetch_into_the_same_directory_is_refused_with_the_holder(hub_recipe, tmp_path, model_files):
    import subprocess
    import sys

    dest = tmp_path / "model"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(dest)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with FakeHub(REPO_ID, SHA, model_files) as hub:
            _manifest(hub_recipe, hub, tmp_path)
            gets = len(hub.requests)
            p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
            assert p.returncode == 2
            assert f"another fetch into {dest} is running: pid {holder.pid} (ds4deploy model fetch hubby)" in p.stderr
            assert "Traceback" not in p.stderr
            assert [r for r in hub.requests[gets:] if r[0] == "GET"] == []  # nothing downloaded
            assert not dest.exists() and not _staging(dest).exists()
            holder.kill()
            holder.wait()
            # The kernel dropped the dead holder's flock: the next fetch runs.
            p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
            assert p.returncode == 0, p.stderr
            assert {f.name: f.read_bytes() for f in dest.iterdir()} == model_files
            assert sorted(f.name for f in tmp_path.iterdir() if f.name.startswith(".model")) == []  # no lock left
    finally:
        holder.kill()
        holder.wait()


# --- fetch: stall watchdog (issue 15) ------------------------------------------------------------------------------


def _watchdog_env(monkeypatch, stall_s: float, attempts: int) -> None:
    monkeypatch.setenv("DS4_FETCH_STALL_S", str(stall_s))
    monkeypatch.setenv("DS4_FETCH_ATTEMPTS", str(attempts))


def _fetch_here(hub, tmp_path, monkeypatch, dest):
    """`fetch_model` of recipe hubby in this process with the stall watchdog on `HeldClock`: the production stall
    window (`fetch.STALL_S`, 300 s) passes only while the hub holds a transfer back, a few polls after the hold
    starts, so no test waits it out. The download child is spawned with this environment (the hub's endpoint);
    this process's huggingface_hub, possibly imported before with another endpoint, is pointed at the hub too."""
    from huggingface_hub import constants

    from ds4deploy.model import fetch
    from tests.support.fakehub import HeldClock

    for k, v in {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1",
                 "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    return fetch.fetch_model(load_recipe("hubby"), dest, progress=False, clock=HeldClock(hub, fetch.STALL_S))


def test_trickling_download_is_stopped_and_resumed(hub_recipe, tmp_path, model_files, monkeypatch, capsys):
    """One byte every 0.5 s never trips huggingface_hub's 10 s read timeout; the watchdog stops it after its window
    (the production 300 s, on the hub's clock) without a new byte staged and resumes: the second attempt gets the
    whole file."""
    monkeypatch.delenv("DS4_FETCH_STALL_S", raising=False)
    monkeypatch.setenv("DS4_FETCH_ATTEMPTS", "3")
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.trickles["tokenizer.json"] = [0.5, 1]
        result = _fetch_here(hub, tmp_path, monkeypatch, dest)
        assert len(_file_gets(hub, "tokenizer.json")) == 2
    assert "stalled (no new byte for 300 s): stopped it and resuming, attempt 2 of 3" in capsys.readouterr().err
    assert sorted(result.fetched) == sorted(model_files)
    assert {f.name: f.read_bytes() for f in dest.iterdir()} == model_files


def test_headers_without_body_end_bounded_with_the_cause_then_resume(hub_recipe, tmp_path, model_files, monkeypatch,
                                                                     capsys):
    from ds4deploy.core.errors import UserError

    monkeypatch.delenv("DS4_FETCH_STALL_S", raising=False)
    monkeypatch.setenv("DS4_FETCH_ATTEMPTS", "2")
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.trickles["tokenizer.json"] = [None, 2]  # headers, then silence, twice
        with pytest.raises(UserError) as err:
            _fetch_here(hub, tmp_path, monkeypatch, dest)
        assert "stalled 2 time(s) in a row (last: no new byte for 300 s)" in err.value.cause
        assert "still missing: tokenizer.json" in err.value.cause
        assert "check the path to the hub" in err.value.fix
        assert "attempt 2 of 2" in capsys.readouterr().err
        assert not dest.exists()  # nothing placed
        staged = _staging(dest)
        assert (staged / "config.json").is_file() and not list(staged.rglob("*.incomplete"))
        # Resume, through the CLI a user runs: the complete staged files are not downloaded again.
        hub.requests.clear()
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        assert _file_gets(hub, "config.json") == [] and len(_file_gets(hub, "tokenizer.json")) == 1
    assert (dest / "tokenizer.json").read_bytes() == model_files["tokenizer.json"]


def test_huggingface_read_timeouts_count_as_a_stall_and_resume(hub_recipe, tmp_path, model_files, monkeypatch):
    """Headers without a body under huggingface_hub's own read timeout (1 s here): it gives up after its retries
    before the watchdog's window; that attempt is resumed like a stall, not reported as an unreachable hub."""
    _watchdog_env(monkeypatch, 600, 3)
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        _manifest(hub_recipe, hub, tmp_path)
        hub.trickles["tokenizer.json"] = [None, 6]  # every GET of the first attempt (1 + 5 retries) gets no body
        p = cli(hub_recipe, hub, tmp_path, "model", "fetch", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        assert len(_file_gets(hub, "tokenizer.json")) == 7
    assert "stalled (huggingface_hub gave up on read timeouts: could not reach the model hub" in p.stderr
    assert "stopped it and resuming, attempt 2 of 3" in p.stderr
    assert (dest / "tokenizer.json").read_bytes() == model_files["tokenizer.json"]
# --- locking the model (issue 14): `model lock`, short revisions, first-fetch lock, the committed manifest wins ----

def _short_recipe(recipe_dir, tmp_path, revision=SHA[:8]):
    def edit(d):
        d["model"] = {"source": "hub", "repo_id": REPO_ID, "revision": revision, "served_name": "tiny-hub",
                      "dtype": "bfloat16", "size_on_disk_gb": 0.006, "path": str(tmp_path / "model")}

    write_variant(recipe_dir, "hubby", edit)
    return recipe_dir


def test_lock_resolves_a_short_revision_against_the_commit_list(recipe_dir, tmp_path, model_files):
    _short_recipe(recipe_dir, tmp_path)
    older = ["1234567" + "0" * 33, "abcdef0" + "1" * 33, "fedcba9" + "2" * 33]  # three pages of two commits
    with FakeHub(REPO_ID, SHA, model_files, history=older) as hub:
        p = cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby")
        assert p.returncode == 0, p.stderr
        path = recipe_dir / "hubby.manifest.json"
        assert f"wrote {path}" in p.stdout and f"at commit {SHA}" in p.stdout and "commit it" in p.stdout
        manifest = json.loads(path.read_text())
        assert manifest["revision"] == SHA and manifest["source"] == "hub"
        assert set(manifest["files"]) == set(model_files)
        assert "sha256" in manifest["files"]["model.safetensors"] and "git_sha1" in manifest["files"]["config.json"]
        again = cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby")
        assert again.returncode == 0 and "up to date" in again.stdout
    # A prefix of an older commit (on page 2 of the listing) resolves to that commit, not to main's head.
    _short_recipe(recipe_dir, tmp_path, older[1][:9])
    path.unlink()
    with FakeHub(REPO_ID, SHA, model_files, history=older) as hub:
        p = cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby")
    assert p.returncode == 0, p.stderr
    assert json.loads(path.read_text())["revision"] == older[1]


def test_ambiguous_and_unknown_prefixes_stop_with_the_candidates(recipe_dir, tmp_path, model_files):
    _short_recipe(recipe_dir, tmp_path)
    twin = SHA[:8] + "f" * 32
    with FakeHub(REPO_ID, SHA, model_files, history=["7" * 40, twin]) as hub:
        p = cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"revision {SHA[:8]} matches 2 commits of {REPO_ID}" in p.stderr
    assert SHA in p.stderr and twin in p.stderr and "7" * 40 not in p.stderr
    assert "pin the one you mean in full (40 hex)" in p.stderr
    assert not (recipe_dir / "hubby.manifest.json").exists()
    _short_recipe(recipe_dir, tmp_path, "0abcdef")
    with FakeHub(REPO_ID, SHA, model_files, history=["7" * 40]) as hub:
        p = cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"revision 0abcdef matches no commit of {REPO_ID} (2 commits on 1 branch(es))" in p.stderr
    assert SHA in p.stderr and "7" * 40 in p.stderr  # the newest commits, as candidates
    assert not (recipe_dir / "hubby.manifest.json").exists()


def test_first_stage_without_a_manifest_locks_it_and_says_where(recipe_dir, tmp_path, model_files):
    _short_recipe(recipe_dir, tmp_path)
    dest = tmp_path / "staged"
    path = recipe_dir / "hubby.manifest.json"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        p = cli(recipe_dir, hub, tmp_path, "model", "stage", "hubby", "--dest", str(dest))
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["manifest_written"] == str(path) and f"wrote {path}" in p.stderr and "commit it" in p.stderr
        assert json.loads(path.read_text())["revision"] == SHA
        assert {f.name: f.read_bytes() for f in dest.iterdir()} == model_files
        again = cli(recipe_dir, hub, tmp_path, "model", "stage", "hubby", "--dest", str(dest))
        assert again.returncode == 0 and json.loads(again.stdout)["manifest_written"] is None


def test_a_committed_manifest_that_disagrees_with_the_hub_stops_before_any_download(recipe_dir, tmp_path,
                                                                                    model_files):
    _short_recipe(recipe_dir, tmp_path)
    path = recipe_dir / "hubby.manifest.json"
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        assert cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby").returncode == 0
        manifest = json.loads(path.read_text())
        manifest["files"]["model.safetensors"]["sha256"] = "0" * 64
        path.write_text(json.dumps(manifest))
        hub.requests.clear()
        p = cli(recipe_dir, hub, tmp_path, "model", "stage", "hubby", "--dest", str(tmp_path / "staged"))
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert f"hubby.manifest.json disagrees with the hub's metadata of {REPO_ID}@{SHA}" in p.stderr
        want = hashlib.sha256(model_files["model.safetensors"]).hexdigest()
        assert f"model.safetensors: sha256 {want}, manifest says {'0' * 64}" in p.stderr
        assert [r for r in hub.requests if r[0] == "GET"] == []  # not one file downloaded
        assert json.loads(path.read_text()) == manifest  # the committed manifest is left as it is
        # `model lock` refuses to overwrite it as well, naming the same file.
        p = cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby")
        assert p.returncode == 1 and "the committed manifest wins" in p.stderr and "model.safetensors" in p.stderr
        assert json.loads(path.read_text()) == manifest
    assert not (tmp_path / "staged").exists()


def test_preflight_model_pin_follows_the_manifest(recipe_dir, tmp_path, model_files):
    _short_recipe(recipe_dir, tmp_path)
    p = run_cli("preflight", "hubby", env_dir=recipe_dir)
    assert p.returncode == 1 and "model-pin" in p.stdout and "ds4deploy model lock hubby" in p.stdout
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        assert cli(recipe_dir, hub, tmp_path, "model", "lock", "hubby").returncode == 0
    # The preflight runs the deploy's control-host checks too: an unrendered recipe is refused by both.
    assert "compose/hubby/compose.yaml is missing" in run_cli("preflight", "hubby", env_dir=recipe_dir).stderr
    assert run_cli("render", "hubby", env_dir=recipe_dir).returncode == 0
    with FakeHub(REPO_ID, SHA, model_files) as hub:
        p = cli(recipe_dir, hub, tmp_path, "preflight", "hubby", "--width", "400")
        assert p.returncode == 0, p.stdout + p.stderr
        assert SHA in p.stdout
        # The hub is asked before any node is: the pin and every file's metadata, nothing downloaded.
        assert [r for r in hub.requests if r[0] == "GET"] == []
        # A committed manifest that disagrees with the hub: the preflight refuses it (the deploy's control-host
        # checks are the same), with the file named, before the model stage would find it.
        path = recipe_dir / "hubby.manifest.json"
        manifest = json.loads(path.read_text())
        manifest["files"]["model.safetensors"]["sha256"] = "0" * 64
        path.write_text(json.dumps(manifest))
        p = cli(recipe_dir, hub, tmp_path, "preflight", "hubby", "--width", "400")
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert f"hubby.manifest.json disagrees with the hub's metadata of {REPO_ID}@{SHA}" in p.stderr, p.stderr
        assert "model.safetensors: sha256" in p.stderr
    # No hub to ask: refused too (the model stage would be).
    p = run_cli("preflight", "hubby", "--width", "400", env_dir=recipe_dir)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "could not reach the model hub for ds4/tiny-hub@9e165c30" in p.stderr, p.stderr
