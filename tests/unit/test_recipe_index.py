"""recipes/README.md is generated from the recipes (ds4deploy.render.index) and fails here when it is stale."""

from __future__ import annotations

import json
import shutil

from ds4deploy.plan.estimate import index_cell
from ds4deploy.render import index as recipe_index
from tests.unit.conftest import REPO, run_cli


def test_committed_index_is_what_the_recipes_generate():
    committed = (REPO / "recipes" / "README.md").read_text(encoding="utf-8")
    assert committed == recipe_index.index_markdown(predict=index_cell), \
        "recipes/README.md is stale: run `ds4deploy recipe index`"


def test_every_recipe_has_a_row_and_the_readme_links_the_index():
    text = (REPO / "recipes" / "README.md").read_text(encoding="utf-8")
    for p in sorted((REPO / "recipes").glob("*.yaml")):
        assert f"| [{p.stem}]({p.name})" in text
    assert "(recipes/README.md)" in (REPO / "README.md").read_text(encoding="utf-8")


def test_owner_steps_follow_what_is_committed_and_check_fails_when_stale(recipe_dir):
    name = "gx10x2-ds4-flash-fp8"
    shutil.copy(REPO / "recipes" / f"{name}.yaml", recipe_dir / f"{name}.yaml")
    assert run_cli("recipe", "index", env_dir=recipe_dir).returncode == 0
    p = run_cli("recipe", "index", "--check", env_dir=recipe_dir)
    assert p.returncode == 0 and "is fresh" in p.stdout
    text = (recipe_dir / "README.md").read_text()
    assert f"`ds4deploy model lock {name}` (records every file's digest from the hub" in text
    # Per-session decode cells of the reference table; the GX10 pair is in `make test`'s rehearsal (REHEARSED).
    assert "| 45.9-56.1 | " in text and "| rehearsed here, needs the hardware |" in text
    # The estimator's column: one session's predicted decode, and one of six full-length sessions resident.
    assert "; 1 of 6 resident | rehearsed here" in text
    assert "| 500-1500 | " in text and "| serves here | 1. `make deploy RECIPE=cpu` |" in text
    # Once the owner commits the manifest, the lock step is gone and the committed index is stale.
    (recipe_dir / f"{name}.manifest.json").write_text(json.dumps(
        {"recipe": name, "source": "hub", "repo_id": "deepseek-ai/DeepSeek-V4-Flash-0731",
         "revision": "9e165c30e2704aec5d9d593cce3eebd58bbef1cb",
         "files": {"config.json": {"size": 3, "git_sha1": "a" * 40}}}))
    p = run_cli("recipe", "index", "--check", env_dir=recipe_dir)
    assert p.returncode == 1 and "README.md is stale" in p.stderr and "ds4deploy recipe index" in p.stderr
    assert "Traceback" not in p.stderr
    assert f"ds4deploy model lock {name}" not in recipe_index.index_markdown(predict=index_cell)


def test_every_gateway_recipe_has_a_row():
    text = (REPO / "recipes" / "README.md").read_text(encoding="utf-8")
    gateways = sorted((REPO / "recipes" / "gateways").glob("*.yaml"))
    assert gateways
    for p in gateways:
        assert f"| [{p.stem}](gateways/{p.name}) | " in text
    # office.yaml: two cpu--lan hosts (the variant linked to its base recipe's file), their URLs derived from the
    # recipe's serving.port, three people.
    assert ("| box-a: [cpu--lan](cpu.yaml) at http://box-a.office.lan:8000; box-b: "
            "[cpu--lan](cpu.yaml) at http://box-b.office.lan:8000 | ds4-tiny | 3 | 127.0.0.1:8030 |" in text)


def test_a_refused_gateway_recipe_stops_the_index_and_writes_nothing(recipe_dir):
    (recipe_dir / "gateways").mkdir()
    gw = (REPO / "recipes" / "gateways" / "office.yaml").read_text()
    gw = gw.replace("recipe: cpu--lan", "recipe: nosuch")
    (recipe_dir / "gateways" / "office.yaml").write_text(gw)
    p = run_cli("recipe", "index", env_dir=recipe_dir)
    assert p.returncode == 2 and "names recipe 'nosuch', which does not exist" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not (recipe_dir / "README.md").exists()
