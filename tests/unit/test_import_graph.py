"""The import graph of the installed package: no cycles (counting imports inside functions too, which only move a
cycle to run time), no import from a higher layer (the order the package docstring states), and no import of the
validation tooling in tools/ (not installed with the package)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ds4deploy
from ds4deploy.recipe.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "ds4deploy"


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    """``ds4deploy/bench/run.py`` -> ``ds4deploy.bench.run``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported(path: Path, name: str) -> set[str]:
    """Every module `path` (module `name`) imports, anywhere in the file except ``if TYPE_CHECKING:`` blocks.
    ``from a import b`` counts as an import of ``a.b`` when that is a module, else of ``a``."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(n) for t in ast.walk(tree) if _type_checking_only(t) for n in ast.walk(t)}
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    files = {module_name(p): p for p in package.rglob("*.py")}
    return {m: {i for i in imported(p, m) if i in files and i != m} for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import p.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n")
    graph = {m: {i for i in imported(p, m) if i.startswith("p.")} for m, p in
             ((module_name(p, tmp_path), p) for p in pkg.rglob("*.py"))}
    assert cycles({m: {i for i in v if i in graph and i != m} for m, v in graph.items()}) == [["p.a", "p.c",
                                                                                               "p.sub.b"]]


def test_the_package_does_not_import_the_validation_tooling():
    users = sorted(m for m, p in ((module_name(p), p) for p in PACKAGE.rglob("*.py"))
                   if any(i == "tools" or i.startswith("tools.") for i in imported(p, m)))
    assert users == []


def layers(doc: str | None = ds4deploy.__doc__) -> list[str]:
    """The layer order the package docstring states (``layers: a < b < ...``), lowest first."""
    m = re.search(r"layers: ([a-z_ <\n]+)", doc or "")
    assert m, "the package docstring must state its layers as `layers: a < b < ...`"
    return [x.strip() for x in m.group(1).split("<")]


def layer_of(module: str, order: list[str]) -> int:
    """A module's layer index: its first name under the package (``ds4deploy.plan.nodes`` -> ``plan``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1  # the package itself: its docstring only
    assert parts[1] in order, f"{module} is in no layer: add {parts[1]} to the package docstring's layers"
    return order.index(parts[1])


def upward_imports(graph: dict[str, set[str]], order: list[str]) -> list[str]:
    """``importer -> imported`` for every import of a higher layer."""
    return sorted(f"{m} -> {i}" for m, deps in graph.items() for i in deps
                  if layer_of(i, order) > layer_of(m, order))


def test_no_module_imports_a_higher_layer():
    assert upward_imports(import_graph(), layers()) == []


def test_every_subpackage_has_a_layer():
    order = layers()
    subs = sorted({m.split(".")[1] for m in import_graph() if m.count(".") >= 1})
    assert [s for s in subs if s not in order] == []


def test_a_planted_upward_import_is_found(tmp_path):
    pkg = tmp_path / "p"
    for sub in ("core", "operate"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "operate" / "run.py").write_text("from p.core import util\n")
    (pkg / "core" / "util.py").write_text("def f():\n    from p.operate import run\n")
    files = {module_name(f, tmp_path): f for f in pkg.rglob("*.py")}
    graph = {m: {i for i in imported(f, m) if i in files and i != m} for m, f in files.items()}
    assert upward_imports(graph, layers("layers: core < operate")) == [
        "p.core.util -> p.operate", "p.core.util -> p.operate.run"]
