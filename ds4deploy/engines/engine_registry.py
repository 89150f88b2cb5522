"""What each pinned engine registers, as data beside the engine pins: ``ds4deploy/engines/registry/<pin>.yaml``.

A recipe names engine-specific things (a tool-call parser, a reasoning parser, a speculative method, a KV cache
dtype, attention and MoE backends, environment variables, capabilities such as ``nvfp4_ds_mla``) and a CUDA base.
Those names are facts of the pinned engine, read from its source at the pin, not claims of the recipe: one file per
pinned engine records them, with the repository, commit and file paths they were read from (``source``). The
preflight rule family `ds4deploy.plan.preflight.engine` refuses a recipe that names anything its engine does not
register, before any node is changed or any model staged.

The pin of a recipe is ``<engine.name>-<engine.version>`` (``git-`` versions shortened to their first 12 hex
digits), e.g. ``vllm-gb10-dspark-0.25.1``.

File shape (every list sorted; a list that was not read from the engine is ``null``, and a check against it says
so instead of passing)::

    pin: vllm-gb10-dspark-0.25.1
    engine: {repository: ..., commit: ..., version: ...}
    public: true                 # false: the engine is supplied by the owner (why: ...)
    source: [{repository, commit, paths: [...], note}]   # what was read, where
    tool_call_parsers: [...]
    reasoning_parsers: [...]
    tokenizer_modes: [...]
    speculative_methods: [...]
    kv_cache_dtypes: [...]
    attention_backends: [...]
    moe_backends: [...]
    env_prefixes: [VLLM_]        # the engine owns these names: each one set must be in env_vars
    env_vars: [...]
    capabilities: [...]
    cuda: {versions: ["13.0"], archs: [sm121], source: ...}

`extract_from_source` reads the same lists from a vLLM source tree (an installed ``vllm`` package or an unpacked
wheel) without importing it, so a registry file can be checked against the real package
(tests/unit/test_engine_registry.py does that for the cpu engine when .cache/engine-venv exists).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ds4deploy.core import yamlio
from ds4deploy.core.errors import UserError

REGISTRY_DIR = Path(__file__).resolve().parent / "registry"

# The registry's name lists, in file order; each is a sorted list of strings or null (not read).
NAME_FIELDS = ("tool_call_parsers", "reasoning_parsers", "tokenizer_modes", "speculative_methods", "kv_cache_dtypes",
               "attention_backends", "moe_backends", "env_vars")


@dataclass(frozen=True)
class EngineRegistry:
    """One pinned engine's registered names and facts (module docstring).

    Attributes:
        pin: ``<engine.name>-<version>``, the file's stem.
        path: the YAML file it was read from.
        data: the whole file (name lists as lists, or None when not read from the engine).
    """

    pin: str
    path: Path
    data: dict

    def names(self, field: str) -> frozenset[str] | None:
        """The registered names of `field` (one of `NAME_FIELDS`), or None when the file does not record them."""
        value = self.data.get(field)
        return None if value is None else frozenset(value)

    @property
    def capabilities(self) -> frozenset[str]:
        """Features of this build (``nvfp4_ds_mla``, ``dspark``, ``lk_moe_cpu_experts``...)."""
        return frozenset(self.data.get("capabilities") or ())

    @property
    def env_prefixes(self) -> tuple[str, ...]:
        """Name prefixes the engine owns: a variable with one of them must be registered (``env_vars``)."""
        return tuple(self.data.get("env_prefixes") or ())

    @property
    def cuda(self) -> dict:
        """``{"versions": ["12.8"], "archs": ["sm70"], "source": ...}``: the CUDA major.minor versions the engine is
        built for and the GPU architectures it runs on."""
        return dict(self.data.get("cuda") or {})

    @property
    def public(self) -> bool:
        """False when the engine is not published (the owner supplies it); `not_public_why` says why."""
        return bool(self.data.get("public", True))

    @property
    def not_public_why(self) -> str:
        """Why the engine is not public (empty for a public engine)."""
        return str(self.data.get("not_public_why") or "")

    def relpath(self) -> str:
        """The file's path relative to the repository (for messages)."""
        return f"ds4deploy/engines/registry/{self.path.name}"


def engine_pin(recipe) -> str:
    """``<engine.name>-<engine.version>`` of a recipe; a ``git-<40 hex>`` version is cut to 12 hex digits."""
    version = recipe.engine.version
    if version.startswith("git-"):
        version = "git-" + version[4:16]
    return f"{recipe.engine.name}-{version}"


def registry_path(recipe) -> Path:
    """Where the recipe's engine registry lives: ``ds4deploy/engines/registry/<pin>.yaml``."""
    return REGISTRY_DIR / f"{engine_pin(recipe)}.yaml"


def load_registry(recipe) -> EngineRegistry | None:
    """The registry of the recipe's pinned engine, or None when no file records it.

    Raises:
        UserError: the file exists but is not a mapping with the expected fields (names the file and the field).
    """
    path = registry_path(recipe)
    if not path.is_file():
        return None
    data = _load(path)
    if not isinstance(data, dict) or data.get("pin") != path.stem:
        raise UserError(f"{path}: not an engine registry for pin {path.stem} (its `pin` field must say so)",
                        "fix the file (its stem and `pin` are <engine.name>-<engine.version>)")
    for field in NAME_FIELDS:
        value = data.get(field)
        if value is not None and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            raise UserError(f"{path}: {field} must be a list of names or null", f"fix {field} in {path.name}")
    return EngineRegistry(path.stem, path, data)


def _load(path: Path):
    """The registry file's data, read strictly (a key written twice or a YAML error stops with its line)."""
    return yamlio.load_strict(path).data


# --- reading the names from a vLLM source tree -------------------------------------------------------------------


def _tree(path: Path) -> ast.Module | None:
    return ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None


def _assigned(tree: ast.Module) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def dict_keys(path: Path, name: str) -> list[str] | None:
    """The string keys of the module-level dict literal `name` in `path`, sorted; None when absent."""
    tree = _tree(path)
    value = _assigned(tree).get(name) if tree else None
    if not isinstance(value, ast.Dict):
        return None
    return sorted(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))


def literal_values(path: Path, name: str) -> list[str] | None:
    """The strings of the module-level ``Literal[...]`` alias `name` in `path`, following aliases defined in the
    same module (``SpeculativeMethod = Literal["ngram", EagleModelTypes, ...]``), sorted; None when absent."""
    tree = _tree(path)
    if tree is None:
        return None
    names = _assigned(tree)
    if name not in names:
        return None

    def walk(node: ast.expr, seen: frozenset[str]) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            return [] if node.id in seen or node.id not in names else walk(names[node.id], seen | {node.id})
        if isinstance(node, ast.Subscript):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [x for e in inner for x in walk(e, seen)]
        if isinstance(node, ast.Tuple):
            return [x for e in node.elts for x in walk(e, seen)]
        return []

    return sorted(set(walk(names[name], frozenset({name}))))


def enum_members(path: Path, cls: str) -> list[str] | None:
    """The upper-case member names of class `cls` in `path` (an Enum), sorted; None when absent."""
    tree = _tree(path)
    for node in tree.body if tree else ():
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return sorted(b.targets[0].id for b in node.body
                          if isinstance(b, ast.Assign) and isinstance(b.targets[0], ast.Name)
                          and b.targets[0].id.isupper())
    return None


def extract_from_source(vllm_dir: Path) -> dict[str, list[str] | None]:
    """The registry name lists of a vLLM source tree (the ``vllm`` package directory), read without importing it.

    Where each list comes from (vLLM 0.25 - 0.32 layout): tool-call parsers, the keys of
    ``tool_parsers/__init__.py:_TOOL_PARSERS_TO_REGISTER``; reasoning parsers,
    ``reasoning/__init__.py:_REASONING_PARSERS_TO_REGISTER``; tokenizer modes, ``config/model.py:TokenizerMode``
    plus ``tokenizers/registry.py:_VLLM_TOKENIZERS`` plus ``slow`` (the registry resolves it to ``hf``);
    speculative methods, ``config/speculative.py:SpeculativeMethod``; KV cache dtypes, ``config/cache.py:CacheDType``;
    attention backends, the members of ``v1/attention/backends/registry.py:AttentionBackendEnum``; MoE backends,
    ``config/kernel.py:MoEBackend``; environment variables, the keys of ``envs.py:environment_variables``.

    Returns:
        ``{field: sorted names or None}`` for every field of `NAME_FIELDS`.
    """
    d = Path(vllm_dir)
    modes = set(literal_values(d / "config/model.py", "TokenizerMode") or ())
    modes |= set(dict_keys(d / "tokenizers/registry.py", "_VLLM_TOKENIZERS") or ())
    return {
        "tool_call_parsers": dict_keys(d / "tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER"),
        "reasoning_parsers": dict_keys(d / "reasoning/__init__.py", "_REASONING_PARSERS_TO_REGISTER"),
        "tokenizer_modes": sorted(modes | {"slow"}) if modes else None,
        "speculative_methods": literal_values(d / "config/speculative.py", "SpeculativeMethod"),
        "kv_cache_dtypes": literal_values(d / "config/cache.py", "CacheDType"),
        "attention_backends": enum_members(d / "v1/attention/backends/registry.py", "AttentionBackendEnum"),
        "moe_backends": literal_values(d / "config/kernel.py", "MoEBackend"),
        "env_vars": dict_keys(d / "envs.py", "environment_variables"),
    }
