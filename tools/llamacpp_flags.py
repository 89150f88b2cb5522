"""Write ds4deploy/engines/llamacpp_flags.json: every flag llama-server accepts at the pinned llama.cpp commit.

Read from the pinned source's own option table, `common/arg.cpp` (`common_params_parser_init`): each
``add_opt(common_arg({names...}, [{negations...}], [value hint], help, handler)[.set_examples({...})]...)`` call. An
option applies to llama-server when it names no examples (common to every tool) or its ``set_examples`` lists
``LLAMA_EXAMPLE_SERVER`` or ``LLAMA_EXAMPLE_COMMON``; ``set_excludes`` with the server removes it. The handler's
signature says whether the flag takes a value; a second brace list holds the negated spellings (``--no-...``).

    python -m tools.llamacpp_flags <llama-cpp-python sdist .tar.gz> [commit]

Not installed with the package: run it when the pinned source changes, and commit the JSON.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "ds4deploy" / "engines" / "llamacpp_flags.json"


def _calls(src: str) -> list[str]:
    """The text of each ``add_opt(common_arg(...)...);`` statement (balanced parentheses, strings skipped)."""
    out = []
    for m in re.finditer(r"add_opt\(common_arg\(", src):
        i, depth, in_str = m.end(), 2, False
        while depth and i < len(src):
            c = src[i]
            if in_str:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "'":  # a char literal such as '"' or '(' is no string and no parenthesis
                i = src.index("'", i + 2 if src[i + 1] == "\\" else i + 1)
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        end = src.find(";", i)
        out.append(src[m.start():end])
    return out


def parse(src: str) -> dict[str, dict]:
    """``{flag: {"value": bool, "negation": bool, "option": str}}`` for every option llama-server accepts; `option`
    names the option a spelling belongs to (its first long name: ``-t`` and ``--threads`` are ``--threads``, and
    a negation ``--no-x`` is its option's), so two spellings of one option can be told apart from two options."""
    flags: dict[str, dict] = {}
    for call in _calls(src):
        # A whole-line comment may stand before the names (`// note: "-mmdev" must sort after ...`).
        body = re.sub(r"^\s*//[^\n]*\n", "", call[len("add_opt(common_arg("):], flags=re.M)
        lists = re.match(r"\s*\{([^}]*)\}\s*,\s*(?:\{([^}]*)\}\s*,\s*)?(\"[^\"]*\"\s*,)?", body)
        if not lists:
            continue
        examples = re.search(r"\.set_examples\(\{([^}]*)\}\)", call)
        excludes = re.search(r"\.set_excludes\(\{([^}]*)\}\)", call)
        if examples and not re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", examples.group(1)):
            continue
        if excludes and "LLAMA_EXAMPLE_SERVER" in excludes.group(1):
            continue
        # The handler's signature says it: (params, const std::string & value) or (params, int value) takes a value,
        # (params) is a bare switch, (params, bool value) a switch with its negation in the second list.
        handler = re.search(r"\[\]\(common_params\s*&\s*\w+\s*(,\s*([^)]*))?\)", call)
        arg_type = (handler.group(2) or "") if handler else ""
        takes_value = bool(arg_type) and not arg_type.startswith("bool")
        names = re.findall(r'"([^"]+)"', lists.group(1))
        option = next((n for n in names if n.startswith("--")), names[0] if names else "")
        for name in names:
            flags[name] = {"value": takes_value, "negation": False, "option": option}
        for name in re.findall(r'"([^"]+)"', lists.group(2) or ""):
            flags[name] = {"value": False, "negation": True, "option": option}
    return dict(sorted(flags.items()))


def main() -> None:
    sdist = Path(sys.argv[1])
    commit = sys.argv[2] if len(sys.argv) > 2 else "unknown"
    with tarfile.open(sdist, "r:gz") as tar:
        root = tar.next().name.split("/", 1)[0]
        src = tar.extractfile(f"{root}/vendor/llama.cpp/common/arg.cpp").read().decode()
    data = {"source": f"{sdist.name}: vendor/llama.cpp/common/arg.cpp (ggml-org/llama.cpp {commit})",
            "generated_by": "python -m tools.llamacpp_flags", "flags": parse(src)}
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(data['flags'])} flags -> {OUT}")


if __name__ == "__main__":
    main()
