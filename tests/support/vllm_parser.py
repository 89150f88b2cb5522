"""vLLM's own CLI parser on engine argvs, run in the host engine venv (.cache/engine-venv: the cpu recipe's engine
pins, which `make unit` and `make rehearse` create with `ds4deploy engine-venv --recipe cpu`): how the tests check
an argv the way `vllm serve` reads it without starting an engine (tests/unit/test_engine_parser.py on every
recipe's render, tests/rehearse on the argv each stand-in engine container was given)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from ds4deploy.build.engine_venv import ENGINE_PYTHON

PARSE = textwrap.dedent("""
    import json, sys
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    argvs = json.load(sys.stdin)
    parser = make_arg_parser(FlexibleArgumentParser())
    out = []
    for argv in argvs:
        try:
            ns = parser.parse_args(argv)
            out.append({"ok": True, "tp": ns.tensor_parallel_size, "pp": ns.pipeline_parallel_size,
                        "headless": bool(getattr(ns, "headless", False))})
        except SystemExit as exc:
            out.append({"ok": False, "code": exc.code})
    print(json.dumps(out))
""")


def strip_fork_only(argv: list[str], fork_only: list[str]) -> list[str]:
    """`argv` without the flags in `fork_only` (a recipe's engine.fork_only_flags: flags of an engine fork that stock
    vLLM's parser does not know) and the value after each one that takes a value."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.lstrip("-") in fork_only:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(a)
    return out


def parse_with_vllm(argvs: list[list[str]]) -> list[dict]:
    """Each argv (the words after `vllm serve`) parsed by vLLM's parser, in one engine-venv process: per argv
    {"ok": True, "tp", "pp", "headless"} or {"ok": False, "code": <the parser's exit code, 2 for an unknown flag>}.
    Fails the test (with the fix) when the engine venv is missing."""
    if not ENGINE_PYTHON.is_file():
        pytest.fail(f"no engine venv at {ENGINE_PYTHON.parent.parent}. Fix: `make unit` or `make rehearse` (they "
                    "create it), or `ds4deploy engine-venv --recipe cpu`.")
    p = subprocess.run([str(ENGINE_PYTHON), "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                       timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
