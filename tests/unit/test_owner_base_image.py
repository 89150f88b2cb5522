"""An owner-supplied base image (issue 24: the V100 recipe builds on the owner's own port, `local/...`) is pinned by
its image ID in recipes/<name>.lock.json (`ds4deploy image lock`), and every build refuses a lock without it or a
host whose image under that tag has another ID.

The Docker tests use the real daemon: two images it already holds (the Debian base, the front door) are tagged under a
throwaway ``local/ds4-test-owner:<random>`` name (under ``flock /tmp/ds4-docker.lock``, as every Docker change on
this machine), and the tags are removed afterwards."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess

import pytest
import yaml

from ds4deploy.build import artifacts
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.load import load_recipe
from tests.support import host_docker
from tests.unit.conftest import REPO, run_cli

pytestmark = pytest.mark.tool  # runs a real tool or waits in real time: not in `make check-fast`

V100 = "v100x8-ds41-flash-iq2"
DOCKER_LOCK = str(host_docker.LOCK)
# Images the daemon holds after the warm-up deploy; any two tagged images with different IDs do.
PREFERRED = ["ds4deploy/debian:bookworm-local", "ds4deploy/front-door:nginx-bookworm"]
FAKE_ID = "sha256:" + "ab" * 32


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """A Docker command that changes the daemon's tags, under the shared Docker lock."""
    return subprocess.run(["flock", "-w", "300", DOCKER_LOCK, "docker", *args], capture_output=True, text=True,
                          check=check, timeout=330)


def _two_images() -> tuple[tuple[str, str], tuple[str, str]] | None:
    """Two (reference, image ID) pairs of different images the daemon holds, or None."""
    if shutil.which("docker") is None or shutil.which("flock") is None:
        return None
    p = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", "--no-trunc"],
                       capture_output=True, text=True, check=False, timeout=60)
    if p.returncode != 0:
        return None
    found = {}
    for line in p.stdout.splitlines():
        ref, _, image_id = line.partition(" ")
        if "<none>" not in ref:
            found.setdefault(ref, image_id)
    refs = [r for r in PREFERRED if r in found] + sorted(r for r in found if r not in PREFERRED)
    first = refs[0] if refs else None
    second = next((r for r in refs if found[r] != found.get(first)), None)
    if first is None or second is None:
        return None
    return (first, found[first]), (second, found[second])


IMAGES = _two_images()
needs_docker = pytest.mark.skipif(IMAGES is None, reason="needs the docker CLI, a reachable daemon and flock, with two "
                                                          "different tagged images in the daemon")


@pytest.fixture
def owner(recipe_dir):
    """The V100 recipe in a scratch recipes/, its base image renamed to a throwaway ``local/ds4-test-owner:<random>``
    tag that no daemon holds yet; yields (recipes dir, tag). Removes the tag afterwards."""
    ref = f"local/ds4-test-owner:{secrets.token_hex(6)}"
    data = yaml.safe_load((REPO / "recipes" / f"{V100}.yaml").read_text())
    data["engine"]["image"]["base_image"] = ref
    (recipe_dir / f"{V100}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    yield recipe_dir, ref
    if IMAGES is not None:
        _docker("rmi", ref, check=False)


def _write_lock(recipe_dir, base: dict | None, **extra) -> None:
    lock = {"recipe": V100, "image": "sm70", "artifacts": {}, **extra}
    if base is not None:
        lock["base_image"] = base
    (recipe_dir / f"{V100}.lock.json").write_text(json.dumps(lock))


def test_which_bases_are_owner_supplied():
    assert artifacts.owner_base_image(load_recipe(V100)) == "local/ds41-pp2tp4-sm70:owner"
    for name in ("cpu", "gx10x2-ds4-flash-fp8", "rtx3090x2-xeon-ds4-flash", "v100x8-ds4-flash-llamacpp"):
        assert artifacts.owner_base_image(load_recipe(name)) is None, name


@needs_docker
def test_lock_pins_the_image_id_and_a_retagged_image_is_refused(owner, tmp_path):
    recipe_dir, ref = owner
    (a_ref, a_id), (b_ref, b_id) = IMAGES
    _docker("tag", a_ref, ref)
    p = run_cli("image", "lock", V100, env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    assert f"base image: {ref} id {a_id}" in p.stdout and "commit it" in p.stdout
    lock = json.loads((recipe_dir / f"{V100}.lock.json").read_text())
    assert lock["base_image"]["ref"] == ref and lock["base_image"]["id"] == a_id
    assert lock["artifacts"] == {}
    # Locking again on the same image changes nothing.
    p = run_cli("image", "lock", V100, env_dir=recipe_dir)
    assert p.returncode == 0 and "up to date" in p.stdout, p.stderr
    recipe = load_recipe(V100)
    assert artifacts.check_base_image(recipe) == a_id
    # The control host's build context carries the locked ID for the nodes' check, and passes.
    p = run_cli("image", "context", V100, "--dest", str(tmp_path / "ctx"), env_dir=recipe_dir)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["base_image"] == {"ref": ref, "id": a_id, "repo_digests": lock["base_image"][
        "repo_digests"]}

    # Another image under the same tag: the build check and the lock both stop, naming both IDs.
    _docker("tag", b_ref, ref)
    with pytest.raises(UserError) as err:
        artifacts.check_base_image(recipe)
    assert err.value.code == 1 and a_id in err.value.cause and b_id in err.value.cause
    assert "docker load" in err.value.fix
    before = (recipe_dir / f"{V100}.lock.json").read_text()
    p = run_cli("image", "lock", V100, env_dir=recipe_dir)
    assert p.returncode == 1 and a_id in p.stderr and b_id in p.stderr and "Traceback" not in p.stderr
    assert (recipe_dir / f"{V100}.lock.json").read_text() == before


@needs_docker
def test_an_absent_owner_image_is_refused_with_one_message_and_nothing_written(owner):
    recipe_dir, ref = owner
    p = run_cli("image", "lock", V100, env_dir=recipe_dir)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"this host has no image {ref}" in p.stderr and "docker load -i" in p.stderr
    assert not (recipe_dir / f"{V100}.lock.json").exists()
    # A build with a lock but without the image on this host.
    _write_lock(recipe_dir, {"ref": ref, "id": FAKE_ID, "repo_digests": []})
    with pytest.raises(UserError, match=f"this host has no image {ref}") as err:
        artifacts.check_base_image(load_recipe(V100))
    assert "docker load -i" in err.value.fix


def test_a_build_without_the_locked_base_image_id_is_refused_before_anything_is_laid_out(recipe_dir, tmp_path):
    from ds4deploy.build.image import prepare_context

    shutil.copy(REPO / "recipes" / f"{V100}.yaml", recipe_dir)
    recipe = load_recipe(V100)
    for lock in (None, "without"):
        if lock == "without":
            _write_lock(recipe_dir, None)
        with pytest.raises(UserError) as err:
            prepare_context(recipe, tmp_path / "ctx", [], None)
        assert "local/ds41-pp2tp4-sm70:owner" in err.value.cause
        assert f"`ds4deploy image lock {V100}`" in err.value.fix
        assert not (tmp_path / "ctx").exists()
    # A lock of another tag than the recipe's base locks nothing of it.
    _write_lock(recipe_dir, {"ref": "local/other:owner", "id": FAKE_ID, "repo_digests": []})
    with pytest.raises(UserError, match="locks base image local/other:owner, but recipe"):
        prepare_context(recipe, tmp_path / "ctx", [], None)
    # With the lock: the context is laid out and its digest follows the locked ID (another image rebuilds).
    from ds4deploy.build.image import context_digest

    _write_lock(recipe_dir, {"ref": "local/ds41-pp2tp4-sm70:owner", "id": FAKE_ID, "repo_digests": []})
    assert prepare_context(recipe, tmp_path / "ctx", [], None) is True
    first = context_digest(recipe, tmp_path / "ctx")
    other = "sha256:" + "cd" * 32
    _write_lock(recipe_dir, {"ref": "local/ds41-pp2tp4-sm70:owner", "id": other, "repo_digests": []})
    assert context_digest(recipe, tmp_path / "ctx") != first
    # The check compares what the host holds (given here) with the lock.
    assert artifacts.check_base_image(recipe, {"id": other, "repo_digests": []}) == other
    with pytest.raises(UserError, match=r"is image sha256:abab.*but .* locks sha256:cdcd"):
        artifacts.check_base_image(recipe, {"id": FAKE_ID, "repo_digests": []})


def test_the_deploy_carries_the_locked_id_to_the_node_checks(recipe_dir):
    shutil.copy(REPO / "recipes" / f"{V100}.yaml", recipe_dir)
    recipe = load_recipe(V100)
    pinned_base_id = artifacts.pinned_base_id  # what play_vars passes the nodes as ds4_image_base_id
    assert pinned_base_id(recipe) is None
    _write_lock(recipe_dir, {"ref": "local/ds41-pp2tp4-sm70:owner", "id": FAKE_ID, "repo_digests": []})
    assert pinned_base_id(recipe) == FAKE_ID
    assert pinned_base_id(load_recipe("cpu")) is None


@pytest.mark.parametrize(("base", "field"), [
    ({"ref": "local/ds41-pp2tp4-sm70:owner", "id": "sha256:XYZ", "repo_digests": []}, "base_image.id"),
    ({"ref": "local/ds41-pp2tp4-sm70:owner", "id": "ab" * 32, "repo_digests": []}, "base_image.id"),
    ({"ref": "local/ds41 pp2tp4:owner", "id": FAKE_ID, "repo_digests": []}, "base_image.ref"),
    ({"ref": "local/ds41-pp2tp4-sm70:owner", "id": FAKE_ID, "repo_digests": ["not a digest"]},
     "base_image.repo_digests.0"),
    ({"ref": "local/ds41-pp2tp4-sm70:owner", "id": FAKE_ID, "repo_digests": ["x@sha256:" + "0" * 64] * 17},
     "base_image.repo_digests"),
    ({"ref": "local/ds41-pp2tp4-sm70:owner", "id": FAKE_ID, "tag": "owner"}, "base_image.tag"),
    ({"ref": "local/ds41-pp2tp4-sm70:owner"}, "base_image.id"),
    ("sha256:" + "ab" * 32, "base_image"),
])
def test_a_malformed_base_image_lock_gets_one_message_naming_file_field_and_fix(recipe_dir, base, field):
    shutil.copy(REPO / "recipes" / f"{V100}.yaml", recipe_dir)
    _write_lock(recipe_dir, base)
    p = run_cli("image", "context", V100, "--dest", str(recipe_dir.parent / "ctx"), env_dir=recipe_dir)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"{V100}.lock.json: {field}" in p.stderr, p.stderr
    assert f"ds4deploy image lock {V100}" in p.stderr
    assert not (recipe_dir.parent / "ctx").exists()


def test_node_checks_compare_the_locked_id_before_any_change():
    """The node-side comparison is in the preflight role (before any node is changed) and before the image build."""
    main = (REPO / "ansible/roles/preflight/tasks/main.yml").read_text()
    assert "import_tasks: base_image.yml" in main and "ds4_image_base_id" in main
    check = (REPO / "ansible/roles/preflight/tasks/base_image.yml").read_text()
    assert "== ds4_image_base_id" in check and "docker load -i" in check
    build = (REPO / "ansible/roles/image/tasks/build.yml").read_text()
    refuse = build.index("import_tasks: owner_base.yml")
    assert refuse < build.index("- name: Build the engine image")
    owner = (REPO / "ansible/roles/image/tasks/owner_base.yml").read_text()
    assert "== (image_context.stdout | from_json).base_image.id" in owner


def test_a_base_image_name_the_lock_cannot_hold_is_refused_and_nothing_written(recipe_dir, monkeypatch):
    data = yaml.safe_load((REPO / "recipes" / f"{V100}.yaml").read_text())
    data["engine"]["image"]["base_image"] = "local/two words:owner"
    (recipe_dir / f"{V100}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    # As if a daemon answered for it (Docker itself refuses such a reference: the lock must not depend on that).
    monkeypatch.setattr(artifacts, "inspect_image", lambda ref: {"id": FAKE_ID, "repo_digests": []})
    with pytest.raises(UserError, match=r"base_image 'local/two words:owner' .* cannot be locked \(base_image.ref"):
        artifacts.lock_image(load_recipe(V100), {})
    assert not (recipe_dir / f"{V100}.lock.json").exists()


@needs_docker
def test_a_reference_docker_refuses_is_one_message():
    with pytest.raises(UserError, match="local/UPPER:x is not an image name Docker accepts"):
        artifacts.inspect_image("local/UPPER:x")
