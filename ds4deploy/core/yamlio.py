"""Bounded, strict reading of every file a user writes or commits: recipes (with extends and variants), bench
profiles, inventories, model manifests, artifact locks and the recipe index's inputs. One reader for all of them, so
every one gets the same bounds and the same kind of message (the file, the place, the fix).

Bounds, checked before anything is built from the text (a refusal costs at most one pass over the file):

- size: `MAX_BYTES` per file;
- depth: `MAX_DEPTH` nested mappings/sequences (PyYAML builds nested nodes recursively, so a deeper document would
  end in a RecursionError; JSON's decoder likewise);
- alias expansion: `MAX_NODES` nodes once every ``*alias`` is expanded. Anchors and aliases let a 1 KB document
  stand for 10**9 nodes (the "billion laughs" document, https://en.wikipedia.org/wiki/Billion_laughs_attack); the
  count is taken from PyYAML's event stream, which never expands an alias, so such a document is refused in
  microseconds instead of hanging whatever walks it later (merge, deep copy, schema validation, a render).

PyYAML's ``safe_load`` is lenient in ways that silently change what a deploy does; `parse_strict` refuses them:

- a key written twice in one mapping keeps the last value without a word (YAML 1.2 says keys must be unique,
  https://yaml.org/spec/1.2.2/#mapping, but PyYAML does not enforce it). Keys are compared as the reader will use
  them (``1`` and ``true`` are one Python key) and reported as written. A key given by a merge key (``<<: *base``,
  https://yaml.org/type/merge.html) and set again in the mapping itself is a legal override, not a duplicate;
- unquoted scalars that look like dates or times (``2026-07-31``, ``12:30:00``) become ``datetime`` objects (YAML
  1.1 timestamp type, https://yaml.org/type/timestamp.html), which the render cannot serialise and pydantic
  reports as "not a string".

`StrictYaml.line_of` maps a key path back to its line, and `StrictYaml.plain_text` gives the text of an unquoted
scalar that YAML 1.1 read as a number or boolean (``0x1f2e...`` is an integer, ``1e5`` a float, ``no`` false), so a
schema error can say "quote it" instead of showing the number YAML made of it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from ds4deploy.core.errors import UserError

# Largest file read, bytes. The largest file the product reads is a model manifest: ~150 bytes per file entry, so
# 4 MiB holds ~25,000 files (a hub checkpoint in 1,000 shards is ~150 KB); recipes are ~10 KB.
MAX_BYTES = 4 * 1024 * 1024
# Deepest nesting of mappings/sequences. Recipes nest 5 levels (variants.x.y: value), manifests and locks 3; 64 is
# far above any of them and far below Python's recursion limit (1,000 frames; PyYAML spends ~4 per level).
MAX_DEPTH = 64
# Most nodes a document may stand for once its aliases are expanded. A 4 MiB manifest is ~100,000 nodes.
MAX_NODES = 500_000


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, unquoted timestamps, the number forms only YAML 1.1 has, and
    numbers that are not finite."""


class _RecipeLoader(_StrictLoader):
    """`_StrictLoader` that also refuses YAML 1.1's word booleans (yes/no/on/off): for recipes, whose free-form
    engine arguments reach the engine as whatever the reader made of them."""


class AmbiguousScalar(yaml.YAMLError):
    """An unquoted scalar that YAML 1.1 readers (PyYAML, Ansible) read as one thing and YAML 1.2 readers (or the
    engine) as another: a date, an octal or sexagesimal number, a word boolean, an infinite number."""

    def __init__(self, value: str, line: int, reading: str = "a date") -> None:
        super().__init__(f"unquoted {value!r} at line {line}")
        self.value, self.line, self.reading = value, line, reading


def _refuse_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> None:
    raise AmbiguousScalar(node.value, node.start_mark.line + 1)


# Forms of YAML 1.1's int and float types that YAML 1.2's core schema reads as strings or as other numbers
# (https://yaml.org/type/int.html, https://yaml.org/type/float.html, YAML 1.2.2 section 10.3.2): a leading 0 is
# octal (010 is 8, not 10), 0b binary, base 60 (1:04 is 64), '_' separators (1_000).
_YAML11_ONLY_NUMBER = re.compile(r"^[-+]?(0[0-7_]+|0b[01_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?|[0-9.]*_[0-9._]*)$")


NOT_FINITE = "a number that is not finite"


def _number(kind: str):
    plain = getattr(yaml.SafeLoader, f"construct_yaml_{kind}")

    def construct(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        value = plain(loader, node)
        text = node.value.strip()
        same = re.fullmatch(r"[-+]?[0-9]+", text) is not None and int(text, 10) == value  # 00, 007: 0 and 7 to both
        if _YAML11_ONLY_NUMBER.fullmatch(text) and not same:
            raise AmbiguousScalar(node.value, node.start_mark.line + 1,
                                  f"the number {value!r} (a YAML 1.1 form; YAML 1.2 reads it otherwise)")
        if isinstance(value, float) and not math.isfinite(value):
            raise AmbiguousScalar(node.value, node.start_mark.line + 1, NOT_FINITE)
        return value

    return construct


def _word_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    value = loader.construct_yaml_bool(node)
    if node.value.lower() not in ("true", "false"):
        raise AmbiguousScalar(node.value, node.start_mark.line + 1,
                              f"the boolean {value} (YAML 1.1; YAML 1.2 reads the word as text)")
    return value


_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _refuse_timestamp)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _number("int"))
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _number("float"))


class DuplicateKey(yaml.YAMLError):
    """A mapping names the same key twice (as the reader sees keys: ``1`` and ``true`` are one key)."""

    def __init__(self, first: str, second: str, first_line: int, second_line: int) -> None:
        super().__init__(f"key {second!r} appears twice (lines {first_line} and {second_line})")
        self.first, self.second, self.first_line, self.second_line = first, second, first_line, second_line


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    # The mapping's own keys, before flatten_mapping prepends those a merge key (<<) brings: only these can clash.
    own = [(k, v) for k, v in node.value if k.tag != _MERGE_TAG]
    seen: dict[Any, tuple[str, int]] = {}
    for key_node, _ in own:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found an unhashable key", key_node.start_mark
            ) from None
        line = key_node.start_mark.line + 1
        written = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key)
        if key in seen:
            raise DuplicateKey(seen[key][0], written, seen[key][1], line)
        seen[key] = (written, line)
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    # Merged pairs come first, the mapping's own last: an own key overrides a merged one (the merge-key rule).
    for key_node, value_node in node.value:
        out[loader.construct_object(key_node, deep=True)] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# Last: PyYAML copies a class's constructors on its first add_constructor, so the recipe loader gets every one above.
_RecipeLoader.add_constructor("tag:yaml.org,2002:bool", _word_bool)

_STR_TAG = "tag:yaml.org,2002:str"


def _key_lines(root: yaml.Node, lines: dict[tuple, int], plain: dict[tuple, str]) -> None:
    """Fill `lines` (key path -> line) and `plain` (key path -> text of an unquoted scalar YAML read as a non-string),
    iteratively (depth is already bounded, but no recursion is needed). An alias is not followed twice."""
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    visited: set[int] = set()
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            if node.style is None and node.tag != _STR_TAG and path:
                plain.setdefault(path, node.value)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                sub = (*path, k.value if isinstance(k, yaml.ScalarNode) else str(k))
                lines.setdefault(sub, k.start_mark.line + 1)
                stack.append((v, sub))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines.setdefault((*path, i), v.start_mark.line + 1)
                stack.append((v, (*path, i)))


class StrictYaml:
    """A parsed YAML (or JSON) document and the line of every key path in it.

    Attributes:
        data: the document (dict, list or scalar).
        lines: key path (tuple of str keys and int list indices) -> 1-based line number.
        plain: key path -> the text of an unquoted scalar that YAML 1.1 read as a number, boolean or null.
    """

    def __init__(self, data: Any, lines: dict[tuple, int], plain: dict[tuple, str] | None = None) -> None:
        self.data, self.lines, self.plain = data, lines, plain or {}

    @staticmethod
    def _norm(loc: tuple) -> tuple:
        return tuple(str(p) if not isinstance(p, int) else p for p in loc)

    def line_of(self, loc: tuple) -> int | None:
        """The line of the deepest prefix of `loc` that the document has (pydantic error locations may go deeper
        than the YAML, e.g. into a model validator), or None."""
        loc = self._norm(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return None

    def plain_text(self, loc: tuple) -> str | None:
        """The text as written of the unquoted scalar at `loc` when YAML read it as a non-string (``0x1f2e``,
        ``1e5``, ``no``), else None."""
        return self.plain.get(self._norm(loc))


def quote_advice(doc: StrictYaml | None, loc: tuple, value: Any) -> str:
    """For a schema error on a value YAML turned into a number/boolean: `` (written unquoted as 0x1f, which YAML
    reads as the integer 31: quote it, '0x1f', if you mean the text)``; else an empty string."""
    if doc is None or isinstance(value, str):
        return ""
    text = doc.plain_text(loc)
    if text is None:
        return ""
    kind = {bool: "boolean", int: "integer", float: "number", type(None): "null"}.get(type(value), type(value).__name__)
    return (f" (written unquoted as {text}, which YAML reads as the {kind} {value!r}: quote it, '{text}', if you "
            "mean the text)")


def _bounds(text: str, origin: str) -> None:
    """Refuse `text` over the size, depth or alias-expansion bound (module docstring), from PyYAML's event stream
    (no node is built, no alias expanded).

    Raises:
        UserError: a bound is passed (which one, where, and the fix); a syntax error (with line and column).
    """
    if len(text) > MAX_BYTES:
        raise UserError(f"{origin}: {len(text):,} characters, more than the {MAX_BYTES:,} this tool reads from one "
                        "file", "this is not a recipe, inventory, manifest or lock; pass the right file")
    if _bracket_depth(text) > MAX_DEPTH:
        raise UserError(f"{origin}: brackets nested more than {MAX_DEPTH} levels deep",
                        f"flatten the structure in {origin}; no file this tool reads nests that deep")
    # Per open collection: [nodes so far, anchor]; sizes of anchored nodes by anchor name.
    stack: list[list] = []
    sizes: dict[str, int] = {}
    total = 0
    try:
        for ev in yaml.parse(text, Loader=_StrictLoader):
            if isinstance(ev, yaml.CollectionStartEvent):
                stack.append([1, ev.anchor])
                if len(stack) > MAX_DEPTH:
                    raise UserError(f"{origin}: nested more than {MAX_DEPTH} levels deep (line "
                                    f"{ev.start_mark.line + 1})", f"flatten the structure in {origin}; no file this "
                                    "tool reads nests that deep")
                continue
            if isinstance(ev, yaml.CollectionEndEvent):
                n, anchor = stack.pop()
            elif isinstance(ev, yaml.ScalarEvent):
                n, anchor = 1, ev.anchor
            elif isinstance(ev, yaml.AliasEvent):
                n, anchor = sizes.get(ev.anchor, 1), None
            else:
                continue
            if anchor:
                sizes[anchor] = n
            if stack:
                stack[-1][0] += n
            else:
                total += n
            if total + sum(s[0] for s in stack) > MAX_NODES or n > MAX_NODES:
                raise UserError(f"{origin}: its aliases (*name) expand to more than {MAX_NODES:,} values (line "
                                f"{ev.start_mark.line + 1}): an alias bomb, or far more data than any file this tool "
                                "reads", f"write the values out instead of nesting aliases of aliases in {origin}")
    except yaml.YAMLError as exc:
        _syntax_error(exc, origin)


def _bracket_depth(text: str, yaml_quotes: bool = True) -> int:
    """Deepest nesting of ``[``/``{`` outside quoted strings, in one pass over the characters. JSON's decoder
    recurses per level, and PyYAML's scanner looks up to 1,024 characters ahead at every open flow collection
    (a possible simple key), so a line of 1,000 ``[`` costs seconds before the first event: the depth is taken
    from the text first."""
    depth = deepest = 0
    quote = ""
    esc = False
    for ch in text:
        if quote:
            if esc:
                esc = False
            elif ch == "\\" and quote == '"':
                esc = True
            elif ch == quote:
                quote = ""
        elif ch == '"' or (ch == "'" and yaml_quotes):
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def _syntax_error(exc: yaml.YAMLError, origin: str) -> None:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    raise UserError(f"{origin}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}",
                    "fix the YAML syntax (yamllint shows the spot)") from None


def parse_strict(text: str, origin: str, recipe: bool = False) -> StrictYaml:
    """Parse YAML `text` strictly and within bounds.

    Args:
        text: the YAML source.
        origin: file name (or other label) named in error messages.
        recipe: a recipe (stack or gateway): YAML 1.1's word booleans (yes/no/on/off) are refused too. Other files
            (inventories, Ansible's own YAML 1.1 dialect) keep them.
    Returns:
        The document with its key lines.
    Raises:
        UserError: over a bound (size, depth, alias expansion); a YAML syntax error (with line and column); a key
            written twice (with both lines, as written); an unquoted date, a YAML 1.1-only number (octal 010, base
            60, binary, '_'), .inf or .nan, and in a recipe a word boolean.
    """
    _bounds(text, origin)
    cls = _RecipeLoader if recipe else _StrictLoader
    try:
        node = yaml.compose(text, Loader=cls)
        loader = cls(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except AmbiguousScalar as exc:
        if exc.reading == "a date":
            raise UserError(f"{origin}: line {exc.line}: the unquoted value {exc.value} is a date to YAML 1.1 readers "
                            "(PyYAML, Ansible) and a string to others, so what the engine gets would depend on the "
                            "reader", f"quote it at line {exc.line} ('{exc.value}') if you mean the text") from None
        if exc.reading == NOT_FINITE:
            raise UserError(f"{origin}: line {exc.line}: {exc.value} is not a finite number; no size, count or bound "
                            "of a deploy is infinite or not a number", f"write a finite number at line {exc.line}"
                            ) from None
        raise UserError(f"{origin}: line {exc.line}: the unquoted value {exc.value} is {exc.reading} to PyYAML and "
                        "Ansible, so what the engine gets would depend on the reader",
                        f"at line {exc.line}, quote it ('{exc.value}') if you mean the text, or write the value "
                        "plainly (a decimal number, true/false)") from None
    except DuplicateKey as exc:
        same = (f"key '{exc.second}' is written twice" if exc.first == exc.second else
                f"keys '{exc.first}' and '{exc.second}' are one key to the reader (YAML 1.1 reads them as "
                f"{_read_as(exc.first)} and {_read_as(exc.second)}, which are equal as mapping keys)")
        raise UserError(f"{origin}: {same}, at lines {exc.first_line} and {exc.second_line} (YAML would silently keep "
                        "the second value)", f"keep one of the two lines in {origin}") from None
    except yaml.YAMLError as exc:
        _syntax_error(exc, origin)
    except RecursionError:  # cannot happen within MAX_DEPTH; kept so no traceback can escape
        raise UserError(f"{origin}: nested too deeply to read", f"flatten the structure in {origin}") from None
    lines: dict[tuple, int] = {}
    plain: dict[tuple, str] = {}
    if node is not None:
        _key_lines(node, lines, plain)
    return StrictYaml(data, lines, plain)


def _read_as(written: str) -> str:
    try:
        return repr(yaml.safe_load(written))
    except yaml.YAMLError:
        return repr(written)


def read_text(path: Path | str, what: str = "file") -> str:
    """The UTF-8 text of a user file, refused above `MAX_BYTES` before it is read.

    Raises:
        UserError: missing, unreadable, too large, or not UTF-8 text.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise UserError(f"{path}: {size:,} bytes, more than the {MAX_BYTES:,} this tool reads from a {what}",
                            f"pass the right file ({path} is not a {what})")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                        "check the path and that the file is UTF-8 text") from None


def load_strict(path: Path | str, recipe: bool = False) -> StrictYaml:
    """Read and parse `path` strictly (see `parse_strict`; `recipe` as there).

    Raises:
        UserError: the file cannot be read or is too large, or `parse_strict` refuses it.
    """
    return parse_strict(read_text(path, "YAML file"), str(path), recipe)


def parse_json(text: str, origin: str, fix: str) -> Any:
    """Parse JSON `text` within the same bounds as YAML (size, depth); `fix` is what the message tells the user.

    Returns:
        The decoded value.
    Raises:
        UserError: too large, nested deeper than `MAX_DEPTH`, not JSON (with line and column), or a key written
            twice in one object.
    """
    if len(text) > MAX_BYTES:
        raise UserError(f"{origin}: {len(text):,} characters, more than the {MAX_BYTES:,} this tool reads", fix)
    deepest = _bracket_depth(text, yaml_quotes=False)
    if deepest > MAX_DEPTH:
        raise UserError(f"{origin}: nested {deepest} levels deep, more than the {MAX_DEPTH} this tool reads", fix)

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"key {k!r} is written twice in one object")
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except ValueError as exc:
        raise UserError(f"{origin} is not valid JSON: {exc}", fix) from None
    except RecursionError:
        raise UserError(f"{origin}: nested too deeply to read", fix) from None


def load_json(path: Path | str, fix: str) -> Any:
    """Read and parse a JSON file (`read_text` + `parse_json`).

    Raises:
        UserError: see `read_text` and `parse_json`.
    """
    return parse_json(read_text(path, "JSON file"), str(path), fix)


class ComposeDumper(yaml.SafeDumper):
    """A YAML dumper for the compose files the tool writes from data (the gateways', the engine checks'): a value
    used twice is written as itself, not as an anchor and an alias, and list items are indented under their key
    (yamllint's default indentation rule)."""

    def ignore_aliases(self, data: object) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)
