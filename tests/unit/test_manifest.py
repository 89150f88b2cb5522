"""Manifest checks (ds4deploy.model.manifest), pin rules and the free-space guard (ds4deploy.model.fetch,
ds4deploy.model.hub)."""

from __future__ import annotations

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.model.fetch import check_free_space, gb_gib, pinned_commit, staging_dir
from ds4deploy.model.hub import check_resolved
from ds4deploy.model.manifest import check_manifest, load_manifest
from ds4deploy.recipe.load import load_recipe
from tests.unit.conftest import write_variant

SHA = "9e165c30" + "0" * 32
GOOD = {"size": 3, "sha256": "a" * 64}


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "a\\b", "./a", "a//b", ""])
def test_unsafe_names_are_refused(name):
    with pytest.raises(UserError, match="unsafe path"):
        check_manifest({"files": {name: GOOD}})


@pytest.mark.parametrize("entry", [{"size": "3", "sha256": "a" * 64}, {"size": -1, "sha256": "a" * 64},
                                   {"size": 3}, {"size": 3, "sha256": "xyz"}, {"size": 3, "git_sha1": "a" * 64}])
def test_bad_entries_are_refused(entry):
    with pytest.raises(UserError):
        check_manifest({"files": {"a.bin": entry}})


def test_good_manifest_passes():
    check_manifest({"files": {"a.bin": GOOD, "sub/b.json": {"size": 0, "git_sha1": "b" * 40}}})
    with pytest.raises(UserError, match="lists no files"):
        check_manifest({"files": {}})


def test_broken_committed_manifest_is_a_clean_error(recipe_dir):
    (recipe_dir / "cpu.manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="is not valid JSON"):
        load_manifest(load_recipe("cpu"))


@pytest.fixture
def hub_recipe(recipe_dir, tmp_path):
    def make(revision):
        def edit(d):
            d["model"] = {"source": "hub", "repo_id": "ds4/tiny-hub", "revision": revision, "served_name": "t",
                          "dtype": "bfloat16", "size_on_disk_gb": 0.006, "path": str(tmp_path / "model")}

        write_variant(recipe_dir, "hubby", edit)
        return load_recipe("hubby")

    return make


def test_pinned_commit_rules(hub_recipe):
    m = {"source": "hub", "repo_id": "ds4/tiny-hub", "revision": SHA, "files": {"a": GOOD}}
    assert pinned_commit(hub_recipe(SHA), m) == SHA
    assert pinned_commit(hub_recipe(SHA[:8]), m) == SHA  # a prefix pin fetches the manifest's full commit
    with pytest.raises(UserError, match="does not pin a full 40-hex commit"):
        pinned_commit(hub_recipe(SHA[:8]), {**m, "revision": SHA[:8]})
    with pytest.raises(UserError, match="was built for commit"):
        pinned_commit(hub_recipe("abcdef0"), m)
    with pytest.raises(UserError, match="is not a manifest of ds4/tiny-hub"):
        pinned_commit(hub_recipe(SHA), {**m, "source": "generated"})


def test_resolved_commit_must_extend_the_pin(hub_recipe):
    r = hub_recipe(SHA[:8])
    assert check_resolved(r, SHA) == SHA
    with pytest.raises(UserError, match="does not start with the pinned"):
        check_resolved(r, "1" * 40)  # e.g. a branch named like the prefix
    with pytest.raises(UserError, match="did not resolve"):
        check_resolved(r, SHA[:12])


def test_free_space_guard_names_both_units(tmp_path):
    check_free_space(tmp_path / "not" / "yet", 0, "x")  # nearest existing parent is probed
    with pytest.raises(UserError) as e:
        check_free_space(tmp_path, 10**18, "downloading 1 file(s)")
    assert "needs 1000000000.00 GB (931322574.62 GiB)" in e.value.cause and "GiB) free" in e.value.cause
    assert gb_gib(5382640) == "0.01 GB (0.01 GiB)" and gb_gib(2**30) == "1.07 GB (1.00 GiB)"


def test_staging_is_a_sibling_on_the_same_filesystem(tmp_path):
    assert staging_dir(tmp_path / "model") == tmp_path / ".model.ds4-staging"
    assert staging_dir(tmp_path / "model").parent.stat().st_dev == tmp_path.stat().st_dev


def test_committed_manifests_pass_the_check():
    from ds4deploy.model.manifest import manifest_path
    from ds4deploy.recipe.load import all_recipes

    checked = [r.name for r in all_recipes() if manifest_path(r).is_file() and load_manifest(r)]
    assert "cpu" in checked
