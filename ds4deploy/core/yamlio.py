"""Strict YAML reading for every file a user writes: recipes (and their variants), bench profiles, inventories.

PyYAML's ``safe_load`` is lenient in two ways that silently change what a deploy does:

- a key written twice in one mapping keeps the last value without a word (YAML 1.2 says keys must be unique,
  https://yaml.org/spec/1.2.2/#mapping, but PyYAML does not enforce it);
- unquoted scalars that look like dates or times (``2026-07-31``, ``12:30:00``) become ``datetime`` objects (YAML
  1.1 timestamp type, https://yaml.org/type/timestamp.html), which the render cannot serialise and pydantic
  reports as "not a string".

`load_strict` refuses duplicate keys, naming both line numbers, and unquoted date-like scalars, naming the line
and the quoting that makes them text. `line_of` maps a key path back to its line, so schema errors can name the
line too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ds4deploy.core.errors import UserError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and unquoted timestamps."""


class AmbiguousScalar(yaml.YAMLError):
    """An unquoted scalar that YAML 1.1 readers (PyYAML, Ansible) turn into a date, YAML 1.2 readers into a string."""

    def __init__(self, value: str, line: int) -> None:
        super().__init__(f"unquoted date/time {value!r} at line {line}")
        self.value, self.line = value, line


def _refuse_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> None:
    raise AmbiguousScalar(node.value, node.start_mark.line + 1)


_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _refuse_timestamp)


class DuplicateKey(yaml.YAMLError):
    """A mapping names the same key twice."""

    def __init__(self, key: Any, first_line: int, second_line: int) -> None:
        super().__init__(f"key {key!r} appears twice (lines {first_line} and {second_line})")
        self.key, self.first_line, self.second_line = key, first_line, second_line


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found an unhashable key", key_node.start_mark
            ) from None
        line = key_node.start_mark.line + 1
        if key in seen:
            raise DuplicateKey(key, seen[key], line)
        seen[key] = line
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _key_lines(node: yaml.Node, path: tuple, out: dict[tuple, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            sub = (*path, k.value)
            out[sub] = k.start_mark.line + 1
            _key_lines(v, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[(*path, i)] = v.start_mark.line + 1
            _key_lines(v, (*path, i), out)


class StrictYaml:
    """A parsed YAML document and the line of every key path in it.

    Attributes:
        data: the document (dict, list or scalar).
        lines: key path (tuple of str keys and int list indices) -> 1-based line number.
    """

    def __init__(self, data: Any, lines: dict[tuple, int]) -> None:
        self.data, self.lines = data, lines

    def line_of(self, loc: tuple) -> int | None:
        """The line of the deepest prefix of `loc` that the document has (pydantic error locations may go deeper
        than the YAML, e.g. into a model validator), or None."""
        loc = tuple(str(p) if not isinstance(p, int) else p for p in loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return None


def parse_strict(text: str, origin: str) -> StrictYaml:
    """Parse YAML `text` strictly.

    Args:
        text: the YAML source.
        origin: file name (or other label) named in error messages.
    Returns:
        The document with its key lines.
    Raises:
        UserError: a YAML syntax error (with line and column), or a key written twice (with both lines).
    """
    try:
        node = yaml.compose(text, Loader=_StrictLoader)
        loader = _StrictLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except AmbiguousScalar as exc:
        raise UserError(f"{origin}: line {exc.line}: the unquoted value {exc.value} is a date to YAML 1.1 readers "
                        "(PyYAML, Ansible) and a string to others, so what the engine gets would depend on the reader",
                        f"quote it at line {exc.line} ('{exc.value}') if you mean the text") from None
    except DuplicateKey as exc:
        raise UserError(f"{origin}: key '{exc.key}' is written twice, at lines {exc.first_line} and "
                        f"{exc.second_line} (YAML would silently keep the second value)",
                        f"keep one of the two lines in {origin}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{origin}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}",
                        "fix the YAML syntax (yamllint shows the spot)") from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _key_lines(node, (), lines)
    return StrictYaml(data, lines)


def load_strict(path: Path) -> StrictYaml:
    """Read and parse `path` strictly (see `parse_strict`).

    Raises:
        UserError: the file cannot be read, or `parse_strict` refuses it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}", "check the path and that the file is UTF-8 text") from None
    return parse_strict(text, str(path))
