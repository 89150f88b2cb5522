"""Every recipe's rendered engine argv parses with vLLM's own argument parser (the CPU build on PyPI ships it),
after removing the flags the recipe declares as fork-only. Runs in .cache/engine-venv (`make unit` creates it)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from ds4deploy.build.engine_venv import ENGINE_PYTHON
from ds4deploy.recipe.load import all_recipes
from ds4deploy.render.compose import node_files

pytestmark = pytest.mark.tool  # runs a real tool or waits in real time: not in `make check-fast`

# One definition of which flags vLLM's parser is not shown: the stand-in engine's (tests/rehearse/standin/engine.py,
# standard library only because it runs inside the stand-in image), loaded here by path.
_spec = importlib.util.spec_from_file_location(
    "standin_engine", Path(__file__).resolve().parents[1] / "rehearse" / "standin" / "engine.py")
_standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_standin)
strip_fork_only = _standin.strip_fork_only

ENGINE_PY = ENGINE_PYTHON
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
            out.append({"ok": True, "tp": ns.tensor_parallel_size, "pp": ns.pipeline_parallel_size})
        except SystemExit as exc:
            out.append({"ok": False, "code": exc.code})
    print(json.dumps(out))
""")


def parse_with_vllm(argvs: list[list[str]]) -> list[dict]:
    if not ENGINE_PY.is_file():
        pytest.skip("no .cache/engine-venv: run `make unit` (it creates it)")
    p = subprocess.run([str(ENGINE_PY), "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                       timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_every_rendered_argv_parses_with_the_real_vllm_parser():
    # vLLM's parser judges the vLLM family; llama.cpp argvs are checked by the pinned flag registry and the real
    # llama-server (tests/llamacpp).
    argvs, labels, recipes = [], [], [r for r in all_recipes() if r.engine.family == "vllm"]
    for r in recipes:
        for file, services in node_files(r).items():
            for svc in services:
                argv = svc.command[svc.command.index(r.engine.entrypoint[-1]) + 1:]
                argv = [{"${DS4_NODE_RANK:?set by the deploy}": "1",
                         "${DS4_MASTER_ADDR:?set by the deploy}": "192.0.2.1"}.get(a, a) for a in argv]
                argvs.append(strip_fork_only(argv, r.engine.fork_only_flags))
                labels.append(f"{r.name}/{file}/{svc.name}")
    results = parse_with_vllm(argvs)
    failed = [label for label, res in zip(labels, results, strict=True) if not res["ok"]]
    assert failed == []
    by_label = dict(zip(labels, results, strict=True))
    assert by_label["v100x8-ds41-flash-iq2/compose.yaml/engine"]["tp"] == 4
    assert by_label["v100x8-ds41-flash-iq2/compose.yaml/engine"]["pp"] == 2


def test_the_parser_rejects_what_stock_vllm_does_not_know():
    bad = ["--model", "/model", "--no-such-flag-ds4", "1"]
    assert parse_with_vllm([bad]) == [{"ok": False, "code": 2}]
    # Declared fork-only, the flag is removed before parsing, and the rest parses.
    assert parse_with_vllm([strip_fork_only(bad, ["no-such-flag-ds4"])])[0]["ok"] is True
