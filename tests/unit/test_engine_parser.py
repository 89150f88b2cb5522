"""Every recipe's rendered engine argv parses with vLLM's own argument parser (the CPU build on PyPI ships it),
after removing the flags the recipe declares as fork-only (tests/support/vllm_parser.py: .cache/engine-venv, which
`make unit` creates)."""

from __future__ import annotations

import pytest

from ds4deploy.engines import engine_args_start
from ds4deploy.recipe.load import all_recipes
from ds4deploy.render.compose import node_files
from tests.support.vllm_parser import parse_with_vllm, strip_fork_only

pytestmark = pytest.mark.tool  # runs a real tool or waits in real time: not in `make check-fast`


# An argv stock vLLM refuses (a flag it does not know), and the same argv with that flag declared fork-only.
BAD = ["--model", "/model", "--no-such-flag-ds4", "1"]


@pytest.fixture(scope="module")
def parsed(engine_python) -> tuple[dict[str, dict], dict[str, dict]]:
    """(every vLLM-family recipe's rendered engine argv by label "<recipe>/<compose file>/<service>", the two argvs of
    BAD by label), parsed in one engine-venv process (each start imports vLLM: about 20 s on the 2-core host)."""
    argvs, labels = [], []
    for r in (r for r in all_recipes() if r.engine.family == "vllm"):
        for file, services in node_files(r).items():
            for svc in services:
                argv = svc.command[engine_args_start(r, svc.command):]
                argv = [{"${DS4_NODE_RANK:?set by the deploy}": "1",
                         "${DS4_MASTER_ADDR:?set by the deploy}": "192.0.2.1"}.get(a, a) for a in argv]
                argvs.append(strip_fork_only(argv, r.engine.fork_only_flags))
                labels.append(f"{r.name}/{file}/{svc.name}")
    bad = {"bad": BAD, "bad without its fork-only flag": strip_fork_only(BAD, ["no-such-flag-ds4"])}
    results = parse_with_vllm(argvs + list(bad.values()))
    return (dict(zip(labels, results[:len(labels)], strict=True)),
            dict(zip(bad, results[len(labels):], strict=True)))


def test_every_rendered_argv_parses_with_the_real_vllm_parser(parsed):
    # vLLM's parser judges the vLLM family; llama.cpp argvs are checked by the pinned flag registry and the real
    # llama-server (tests/llamacpp).
    rendered, _bad = parsed
    assert len(rendered) >= 3, rendered
    assert [label for label, res in rendered.items() if not res["ok"]] == []
    assert rendered["v100x8-ds41-flash-iq2/compose.yaml/engine"]["tp"] == 4
    assert rendered["v100x8-ds41-flash-iq2/compose.yaml/engine"]["pp"] == 2


def test_the_parser_rejects_what_stock_vllm_does_not_know(parsed):
    _rendered, bad = parsed
    assert bad["bad"] == {"ok": False, "code": 2}
    # Declared fork-only, the flag is removed before parsing, and the rest parses.
    assert bad["bad without its fork-only flag"]["ok"] is True
