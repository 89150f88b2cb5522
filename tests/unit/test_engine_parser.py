"""Every recipe's rendered engine argv parses with vLLM's own argument parser (the CPU build on PyPI ships it),
after removing the flags the recipe declares as fork-only (tests/support/vllm_parser.py: .cache/engine-venv, which
`make unit` creates)."""

from __future__ import annotations

import pytest

from ds4deploy.recipe.load import all_recipes
from ds4deploy.render.compose import node_files
from tests.support.vllm_parser import parse_with_vllm, strip_fork_only

pytestmark = pytest.mark.tool  # runs a real tool or waits in real time: not in `make check-fast`


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
