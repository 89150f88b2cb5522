"""Loading recipes: YAML read strictly, ``extends:`` merged, a variant applied, the schema validated.

Every failure is one `UserError` naming the file, each bad key path with its value, and what is allowed there.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ds4deploy.core.errors import UserError
from ds4deploy.core.secret_scan import find_secrets
from ds4deploy.core.yamlio import StrictYaml, load_strict, quote_advice
from ds4deploy.recipe import paths
from ds4deploy.recipe.paths import resolve_recipe_path
from ds4deploy.recipe.schema import (
    HCA_RE,
    HCA_RULE,
    NETDEV_RE,
    NETDEV_RULE,
    NODE_PATH_RE,
    NODE_PATH_RULE,
    VARIANT_SEP,
    VLLM_FLAG_RE,
    VLLM_FLAG_RULE,
    Recipe,
)


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _allowed(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    if err["type"] == "extra_forbidden":
        return "remove it, or check the spelling against the schema in ds4deploy/recipe/schema.py"
    if err["type"] == "literal_error" and "expected" in ctx:
        return f"allowed: {ctx['expected']}"
    if err["type"] == "missing":
        return "add this key"
    if "pattern" in ctx:
        return f"must match {ctx['pattern']}"
    for k, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if k in ctx:
            return f"must be {word} {ctx[k]}"
    return err["msg"]


def _split_path(hit: str) -> list[str | int]:
    """The key path of a `find_secrets` hit (``engine.entrypoint[4]: ...``) as a list for `StrictYaml.line_of`."""
    out: list[str | int] = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", hit.split(":", 1)[0]):
        out.append(int(part[1:-1]) if part.startswith("[") else part)
    return out


def split_variant(name: str) -> tuple[str, str | None]:
    """``<recipe>--<variant>`` -> (recipe, variant); a name whose own file exists under recipes/, or a path, ->
    (name, None)."""
    if VARIANT_SEP in name and "/" not in name and not (paths.RECIPES_DIR / f"{name}.yaml").is_file():
        base, variant = name.split(VARIANT_SEP, 1)
        return base, variant
    return name, None


def load_recipe(name_or_path: str | Path, variant: str | None = None) -> Recipe:
    """Load and validate a recipe (and, for a base recipe, every one of its variants).

    Args:
        name_or_path: a name under recipes/ (without .yaml), ``<name>--<variant>``, or a path to a YAML file.
        variant: the variant of `name_or_path` to load (a path's variant, which ``--`` cannot name).
    Returns:
        The validated `Recipe`.
    Raises:
        UserError: missing file, YAML syntax error or bound passed (`ds4deploy.core.yamlio`), credentials in the recipe,
            or a schema violation, in the recipe or in any of its variants (a variant that could never deploy fails
            its recipe's validation). The message names the file, every bad key path with its value, and what is
            allowed there.
    """
    name, named = split_variant(str(name_or_path))
    variant = variant or named
    path = resolve_recipe_path(name)
    doc = load_strict(path, recipe=True)
    data = _extended(path, doc.data, ())
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe must be a YAML mapping", "start from recipes/cpu.yaml")
    if data.get("kind") == "gateway":
        raise UserError(f"{path} is a gateway recipe (kind: gateway), not a stack recipe",
                        f"use `ds4deploy gateway render {path}` (a gateway recipe's commands: `ds4deploy gateway "
                        "--help`; deploy it with `make deploy RECIPE=<its name> INVENTORY=<file>`)")
    secrets = find_secrets(data)
    if secrets:
        raise UserError(
            f"{path}: the recipe holds credentials, which would land in committed files and renders:\n  "
            + "\n  ".join(f"{s} (line {doc.line_of(tuple(_split_path(s)))})" for s in secrets),
            "remove them; the API key belongs in the key file (serving.auth.mode: api_key writes it outside the "
            "repo, mode 0600), a hub token in HF_TOKEN on the control host at deploy time",
        )
    _check_variants(path, data)
    if variant is not None:
        return _validated(path, doc, _apply_variant(path, data, variant), variant)
    recipe = _validated(path, doc, data, None)
    for v in sorted(data.get("variants") or {}):
        _validated(path, doc, _apply_variant(path, data, v), v)
    return recipe


_PATTERN_RULES = {NETDEV_RE: NETDEV_RULE, HCA_RE: HCA_RULE, NODE_PATH_RE: NODE_PATH_RULE, VLLM_FLAG_RE: VLLM_FLAG_RULE}


def problem_lines(exc: ValidationError, doc: StrictYaml | None) -> list[str]:
    """One line per schema problem of `exc`: ``  <key path> = <value> (line N): <message> (<what is allowed>)``,
    the value left out for a missing key or a mapping/list, the line and the quoting advice for a value YAML read as
    another type only when `doc` is the file validated (None: a variant's merged data, which has no lines). Used for
    stack recipes (`_validated`) and gateway recipes (`ds4deploy.render.gateway.load_gateway`)."""
    lines = []
    for err in exc.errors():
        shown = err["type"] != "missing" and not isinstance(err.get("input"), dict | list)
        value = f" = {err.get('input')!r}" if shown else ""
        allowed = _allowed(err)  # a validator's own message already says what is allowed: not twice
        rule = _PATTERN_RULES.get((err.get("ctx") or {}).get("pattern", ""))
        if rule:
            err = {**err, "msg": f"not {rule}"}
            allowed = err["msg"]
        line = doc.line_of(err["loc"]) if doc is not None else None
        at = f" (line {line})" if line else ""
        text_wanted = doc is not None and shown and err["type"] == "string_type"
        advice = quote_advice(doc, err["loc"], err.get("input")) if text_wanted else ""
        lines.append(f"  {_fmt_loc(err['loc'])}{value}{at}: {err['msg']}"
                     + (f" ({allowed})" if allowed != err["msg"] else "") + advice)
    return lines


def _validated(path: Path, doc: StrictYaml, data: dict, variant: str | None) -> Recipe:
    """`data` validated as a `Recipe` (the base recipe, or the one variant `variant` makes of it).

    Raises:
        UserError: every schema problem, with its key path, value, line (base recipe) and what is allowed.
    """
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        lines = problem_lines(exc, doc if variant is None else None)
        what = "the recipe" if variant is None else (
            f"variant '{variant}' (variants.{variant} sets these keys, checked exactly as the recipe's own)")
        raise UserError(
            f"{path}: {len(lines)} problem(s) in {what}:\n" + "\n".join(lines),
            f"edit {path} as listed above; recipes/cpu.yaml is a valid example",
        ) from None
    recipe._source = path
    if recipe.base_name != path.stem:
        raise UserError(
            f"{path}: recipe name '{recipe.name}' differs from its file name '{path.stem}'",
            f"set name: {path.stem}, or rename the file",
        )
    if re.search(r"\s", recipe.engine.image.repository):
        raise UserError(f"{path}: engine.image.repository has spaces", "use a docker image name")
    return recipe


def merge(base: Any, child: Any) -> Any:
    """`child` over `base`, the merge `extends:` applies: mappings merge key by key (recursively), a key set to
    ``null`` in `child` is removed, anything else (lists, scalars) in `child` replaces `base`'s value."""
    if not isinstance(base, dict) or not isinstance(child, dict):
        return copy.deepcopy(child)
    out = copy.deepcopy(base)
    for k, v in child.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v) if k in out else copy.deepcopy(v)
    return out


def _extends_path(path: Path, base: str) -> Path:
    """The file ``extends: <base>`` in recipe `path` names, never looked up from the current directory: a recipe
    name (``cpu``) is a recipe under the recipes directory, else a ``<base>.yaml`` beside `path`; a file path
    (``../cpu.yaml``, ``recipes/cpu.yaml``) is taken relative to the directory of `path`, else to the project
    root (so a recipe outside the checkout can write ``extends: recipes/cpu.yaml``).

    Raises:
        UserError: nothing of that name exists in either place (both named).
    """
    here = path.resolve().parent
    if base.endswith((".yaml", ".yml")) or "/" in base:
        tried = [here / base, paths.REPO_ROOT / base]
    else:
        tried = [paths.RECIPES_DIR / f"{base}.yaml", here / f"{base}.yaml"]
    for p in tried:
        if p.is_file():
            return p
    looked = " and ".join(dict.fromkeys(map(str, tried)))
    raise UserError(f"{path}: extends: no recipe named '{base}' (looked for {looked})",
                    "name a recipe (extends: cpu) or a path relative to this recipe's directory "
                    "(extends: ../recipes/cpu.yaml)")


def _extended(path: Path, data: Any, seen: tuple[Path, ...]) -> Any:
    """A recipe mapping with its ``extends: <recipe>`` applied: the named recipe (itself extended first) merged
    under this one with `merge`. The base's ``variants`` are not inherited: a variant belongs to its own recipe.

    ``extends`` names a recipe of the recipes directory (``extends: cpu``), or a recipe file by its path relative
    to the extending file's own folder (``extends: ../../recipes/cpu.yaml``, what a test fixture that holds only
    its defect uses), never relative to the working directory.

    Raises:
        UserError: the base does not exist, or recipes extend each other in a cycle.
    """
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base_name = data["extends"]
    if not isinstance(base_name, str):
        raise UserError(f"{path}: extends must name a recipe (a string), not {base_name!r}", "e.g. extends: cpu")
    base_path = _extends_path(path, base_name)
    if base_path.resolve() in seen or base_path.resolve() == path.resolve():
        chain = " -> ".join(p.stem for p in (*seen, path, base_path))
        raise UserError(f"{path}: recipes extend each other in a cycle ({chain})", "remove one of the extends:")
    base = _extended(base_path, load_strict(base_path, recipe=True).data, (*seen, path.resolve()))
    if not isinstance(base, dict):
        raise UserError(f"{base_path}: a recipe must be a YAML mapping", "start from recipes/cpu.yaml")
    base = {k: v for k, v in base.items() if k != "variants"}
    return merge(base, {k: v for k, v in data.items() if k != "extends"})


def _check_variants(path: Path, data: dict) -> None:
    """The shape of ``variants``: a mapping of variant name -> mapping of dotted key path -> value.

    Raises:
        UserError: naming the variant and what it is instead.
    """
    variants = data.get("variants")
    if variants is None:
        return
    example = "variants: {fast: {serving.max_num_seqs: 8}}"
    if not isinstance(variants, dict):
        raise UserError(f"{path}: variants is {type(variants).__name__} {variants!r}, not a mapping of variant "
                        "name to overrides", f"write it as {example}")
    for name, overrides in variants.items():
        if not isinstance(overrides, dict):
            raise UserError(f"{path}: variants.{name} is {type(overrides).__name__} {overrides!r}, not a mapping of "
                            "dotted key paths to values", f"write it as {example}")
        for dotted in overrides:
            if not isinstance(dotted, str) or not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", dotted):
                raise UserError(f"{path}: variants.{name} sets {dotted!r}, which is not a dotted key path",
                                f"write it as {example}")


def _apply_variant(path: Path, data: dict, variant: str) -> dict:
    """The recipe mapping with variant `variant`'s dotted-path overrides applied, named ``<base>--<variant>``.

    Raises:
        UserError: no such variant, or an override path that is not in the recipe.
    """
    variants = data.get("variants") or {}
    if variant not in variants:
        known = ", ".join(sorted(variants)) or "(none)"
        raise UserError(f"{path}: recipe has no variant '{variant}'", f"use one of: {known}")
    out = copy.deepcopy(data)
    for dotted, value in variants[variant].items():
        node, keys = out, dotted.split(".")
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                raise UserError(f"{path}: variant '{variant}' sets {dotted}, but {k} is not a section of the recipe",
                                "use a dotted path of an existing section, e.g. serving.max_num_seqs")
            node = node[k]
        node[keys[-1]] = value
    out["name"] = f"{data.get('name')}{VARIANT_SEP}{variant}"
    out["variants"] = {}
    return out


def all_recipes() -> list[Recipe]:
    """Every recipe under recipes/ and every variant of each, validated, sorted by name."""
    out = []
    for p in sorted(paths.RECIPES_DIR.glob("*.yaml")):
        base = load_recipe(p)
        out.append(base)
        out += [load_recipe(f"{base.name}{VARIANT_SEP}{v}") for v in sorted(base.variants)]
    return out
