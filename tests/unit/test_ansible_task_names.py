"""Task names a user reads render on every path. Ansible templates a task's name also when the task is skipped,
where a variable that is a mapping on one path is empty on another (a single-node recipe's ``ds4_node_network`` is
``{}``): ``Create {{ ds4_node_network.name }}`` then printed "Create << error 1 - object of type 'dict' has no
attribute 'name' >>". So a templated name uses plain variables only, never an attribute or item of one."""

from __future__ import annotations

from pathlib import Path

import jinja2
import jinja2.nodes
import pytest
import yaml

from ds4deploy.recipe.paths import REPO_ROOT

TASK_LISTS = ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")


def task_names(node) -> list[str]:
    """Every ``name`` of a play, task or block in a parsed playbook or task file."""
    out = []
    if isinstance(node, list):
        for item in node:
            out += task_names(item)
    elif isinstance(node, dict):
        if isinstance(node.get("name"), str):
            out.append(node["name"])
        for key in TASK_LISTS:
            out += task_names(node.get(key))
    return out


def lookups(name: str) -> list[str]:
    """The attribute and item lookups (``x.y``, ``x['y']``) in a task name's template expressions."""
    tree = jinja2.Environment(autoescape=False).parse(name)  # noqa: S701 - parsed, never rendered to HTML
    return [f"{n.node.name}.{n.attr}" if isinstance(n, jinja2.nodes.Getattr) and isinstance(n.node, jinja2.nodes.Name)
            else type(n).__name__ for n in tree.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem))]


FILES = sorted(p for p in (REPO_ROOT / "ansible").rglob("*.yml")
               if "tasks" in p.parts or "handlers" in p.parts or p.parent.name == "ansible")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO_ROOT / "ansible")))
def test_templated_task_names_use_plain_variables(path: Path):
    bad = {n: lookups(n) for n in task_names(yaml.safe_load(path.read_text())) if "{{" in n and lookups(n)}
    assert bad == {}


def test_the_rule_catches_the_name_that_printed_an_error():
    names = task_names([{"name": "play", "tasks": [{"name": "outer", "block": [
        {"name": "Create {{ ds4_node_network.name }}"}, {"name": "Build {{ ds4_image }}"}]}]}])
    assert names == ["play", "outer", "Create {{ ds4_node_network.name }}", "Build {{ ds4_image }}"]
    assert lookups(names[2]) == ["ds4_node_network.name"] and lookups(names[3]) == []
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701 - not HTML
    with pytest.raises(jinja2.UndefinedError, match="has no attribute 'name'"):
        env.from_string(names[2]).render(ds4_node_network={})
