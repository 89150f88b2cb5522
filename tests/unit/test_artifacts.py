"""Image artifact locks (issue 14): `ds4deploy image lock` resolves the sm86 image's Lvllmds4-x wheel from a local
file or a URL (a real python http.server on 127.0.0.1), writes recipes/<name>.lock.json, and builds place the wheel in
the context only when its sha256 matches the lock, passing the locked sha256 as the Dockerfile's build argument."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from ds4deploy.recipe.load import load_recipe
from tests.unit.conftest import REPO, run_cli

SM86 = "rtx3090x2-xeon-ds4-flash"
WHEEL = load_recipe(SM86).engine.image.build_args["LVLLMDS4X_WHEEL"]  # the wheel the recipe pins
BYTES = b"PK\x03\x04 stands in for the Lvllmds4-x wheel " * 4096


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path / "ds4-cache"))


@pytest.fixture
def served(tmp_path):
    """A python http.server on 127.0.0.1 serving a directory holding the wheel; yields (base URL, directory)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / WHEEL).write_bytes(BYTES)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sm86(recipe_dir):
    """The sm86 reference recipe in a scratch recipes/; `url(base)` points its wheel URL at `base`."""
    path = recipe_dir / f"{SM86}.yaml"
    shutil.copy(REPO / "recipes" / f"{SM86}.yaml", path)

    def url(base: str) -> None:
        data = yaml.safe_load(path.read_text())
        data["engine"]["image"]["build_args"]["LVLLMDS4X_URL"] = base
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return recipe_dir, url


def _lock(recipe_dir):
    return json.loads((recipe_dir / f"{SM86}.lock.json").read_text())


def test_lock_from_a_local_file_and_build_context_from_the_lock(sm86, tmp_path):
    recipe_dir, url = sm86
    url("http://127.0.0.1:9/nowhere")  # no network: only the local file can be used
    wheel = tmp_path / "downloads" / "renamed.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(BYTES)
    p = run_cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={wheel}", env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    sha = hashlib.sha256(BYTES).hexdigest()
    assert f"LVLLMDS4X: {WHEEL}" in p.stdout and sha in p.stdout and "commit it" in p.stdout
    lock = _lock(recipe_dir)
    assert lock["artifacts"]["LVLLMDS4X"] == {"file": WHEEL, "url": f"http://127.0.0.1:9/nowhere/{WHEEL}",
                                              "size": len(BYTES), "sha256": sha}
    again = run_cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={wheel}", env_dir=recipe_dir)
    assert again.returncode == 0 and "up to date" in again.stdout
    # The build context gets the wheel (from the cache the lock filled) and the locked sha256 as build argument.
    ctx = tmp_path / "ctx"
    p = run_cli("image", "context", SM86, "--dest", str(ctx), "--wheelhouse", str(tmp_path / "none"),
                env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["build_args"]["LVLLMDS4X_SHA256"] == sha
    assert (ctx / "wheelhouse" / WHEEL).read_bytes() == BYTES
    assert (ctx / "Dockerfile").read_text() == (REPO / "images/sm86/Dockerfile").read_text()


def test_lock_from_a_url_then_build_downloads_and_verifies(sm86, served, tmp_path, monkeypatch):
    recipe_dir, url = sm86
    base, root = served
    url(base)
    p = run_cli("image", "lock", SM86, env_dir=recipe_dir)  # the default URL: <LVLLMDS4X_URL>/<LVLLMDS4X_WHEEL>
    assert p.returncode == 0, p.stderr
    assert _lock(recipe_dir)["artifacts"]["LVLLMDS4X"]["url"] == f"{base}/{WHEEL}"
    # A fresh cache: the build downloads the wheel from the locked URL and checks it.
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path / "fresh-cache"))
    ctx = tmp_path / "ctx"
    p = run_cli("image", "context", SM86, "--dest", str(ctx), "--wheelhouse", str(tmp_path / "none"),
                env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    assert (ctx / "wheelhouse" / WHEEL).read_bytes() == BYTES
    # The server now serves other bytes (a re-published release): the build refuses, naming both digests.
    other = BYTES + b"!"
    (root / WHEEL).write_bytes(other)
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path / "third-cache"))
    ctx2 = tmp_path / "ctx2"
    p = run_cli("image", "context", SM86, "--dest", str(ctx2), "--wheelhouse", str(tmp_path / "none"),
                env_dir=recipe_dir)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"has sha256 {hashlib.sha256(other).hexdigest()}" in p.stderr
    assert f"locks {hashlib.sha256(BYTES).hexdigest()}; the build was not started" in p.stderr
    assert not (ctx2 / "wheelhouse" / WHEEL).exists()
    # ... and locking again from it stops too: the committed lock wins.
    p = run_cli("image", "lock", SM86, env_dir=recipe_dir)
    assert p.returncode == 1 and "the committed lock wins" in p.stderr
    assert _lock(recipe_dir)["artifacts"]["LVLLMDS4X"]["sha256"] == hashlib.sha256(BYTES).hexdigest()


def test_a_wheel_in_a_wheel_directory_that_differs_from_the_lock_is_refused(sm86, tmp_path):
    recipe_dir, url = sm86
    url("http://127.0.0.1:9/nowhere")
    wheel = tmp_path / WHEEL
    wheel.write_bytes(BYTES)
    assert run_cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={wheel}", env_dir=recipe_dir).returncode == 0
    shutil.rmtree(tmp_path / "ds4-cache" / "artifacts")
    site = tmp_path / "site-wheels"
    site.mkdir()
    (site / WHEEL).write_bytes(BYTES[:-1] + b"?")
    p = run_cli("image", "context", SM86, "--dest", str(tmp_path / "ctx"), "--wheelhouse", str(site),
                env_dir=recipe_dir)
    assert p.returncode == 1 and f"{site / WHEEL} has sha256" in p.stderr and "Traceback" not in p.stderr


def test_no_lock_and_no_network_is_one_message_naming_the_command(sm86, tmp_path):
    recipe_dir, url = sm86
    url("http://127.0.0.1:9/nowhere")
    p = run_cli("image", "context", SM86, "--dest", str(tmp_path / "ctx"), env_dir=recipe_dir)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"{SM86}.lock.json is missing" in p.stderr and f"run `ds4deploy image lock {SM86}`" in p.stderr
    p = run_cli("image", "lock", SM86, env_dir=recipe_dir)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"could not download http://127.0.0.1:9/nowhere/{WHEEL}" in p.stderr
    assert "--artifact LVLLMDS4X=PATH" in p.stderr
    assert not (recipe_dir / f"{SM86}.lock.json").exists()


@pytest.mark.parametrize(("arg", "needle"), [
    ("LVLLMDS4X", "is not NAME=URL or NAME=PATH"),
    ("TORCH=/x.whl", "names TORCH, which this image build does not download"),
    ("LVLLMDS4X=/nonexistent/x.whl", "/nonexistent/x.whl is not a file on this host"),
    ("LVLLMDS4X=http://127.0.0.1:9/x.whl", "could not download http://127.0.0.1:9/x.whl"),
])
def test_bad_artifact_sources_are_refused(sm86, arg, needle):
    recipe_dir, _ = sm86
    p = run_cli("image", "lock", SM86, "--artifact", arg, env_dir=recipe_dir)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr


def test_recipe_sha_must_agree_with_the_lock_and_preflight_reads_the_lock(sm86, tmp_path):
    from ds4deploy.plan import preflight

    recipe_dir, url = sm86
    url("http://127.0.0.1:9/nowhere")
    pins = next(v for v in preflight.run(load_recipe(SM86)) if v.rule == "image-pins")
    assert pins.status == "fail" and f"ds4deploy image lock {SM86}" in pins.remediation
    wheel = tmp_path / WHEEL
    wheel.write_bytes(BYTES)
    assert run_cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={wheel}", env_dir=recipe_dir).returncode == 0
    pins = next(v for v in preflight.run(load_recipe(SM86)) if v.rule == "image-pins")
    assert pins.status == "pass" and hashlib.sha256(BYTES).hexdigest()[:12] in pins.numbers
    path = recipe_dir / f"{SM86}.yaml"
    data = yaml.safe_load(path.read_text())
    data["engine"]["image"]["build_args"]["LVLLMDS4X_SHA256"] = "0" * 64
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    pins = next(v for v in preflight.run(load_recipe(SM86)) if v.rule == "image-pins")
    assert pins.status == "fail" and "but rtx3090x2-xeon-ds4-flash.lock.json locks" in pins.numbers


def test_images_without_downloads_need_no_lock():
    from ds4deploy.build.artifacts import image_artifacts

    assert [a.name for a in image_artifacts(load_recipe(SM86))] == ["LVLLMDS4X"]
    for name in ("cpu", "v100x8-ds41-flash-iq2", "gx10x2-ds4-flash-fp8"):
        assert image_artifacts(load_recipe(name)) == []


def test_the_deploy_checks_a_locked_download_before_any_node_is_changed(sm86, served, tmp_path):
    """`check_obtainable` (run by the deploy's control-host checks, ds4deploy.plan.playvars.check_run): a locked
    artifact
    with no local copy passes while its URL answers, and stops with the URL and the fix once it does not; a copy in
    the cache passes without the network."""
    from ds4deploy.build.artifacts import check_obtainable
    from ds4deploy.core.errors import UserError

    recipe_dir, url = sm86
    base, root = served
    url(base)
    assert run_cli("image", "lock", SM86, env_dir=recipe_dir).returncode == 0
    cache = tmp_path / "ds4-cache" / "artifacts"
    shutil.rmtree(cache)
    check_obtainable(load_recipe(SM86), [])  # no copy, the URL answers
    (root / WHEEL).unlink()  # the release page lost the file: 404
    with pytest.raises(UserError) as err:
        check_obtainable(load_recipe(SM86), [])
    assert f"{base}/{WHEEL} (locked in {SM86}.lock.json) cannot be fetched: HTTP 404" in err.value.cause
    assert "--artifact LVLLMDS4X=PATH" in err.value.fix
    site = tmp_path / "site-wheels"
    site.mkdir()
    (site / WHEEL).write_bytes(BYTES)
    check_obtainable(load_recipe(SM86), [site])  # a local copy: no request at all
