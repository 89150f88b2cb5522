"""The engine family's rules (ds4deploy.conformance.engine_rules) on the rows a real conformance run gave: the
cpu-llamacpp stack (llama.cpp 0c1e570, the tiny deepseek4 GGUF) as the matrix judged it by vLLM's contract, before
the llama.cpp rules (fixtures/conformance/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4deploy.conformance import engine_rules
from ds4deploy.conformance.cases_anthropic import event_order_problems
from ds4deploy.conformance.common import FAIL, FINDING, MODEL, PASS, Case, Mode
from ds4deploy.conformance.report import exit_code, markdown
from ds4deploy.conformance.runner import run_case

FIX = Path(__file__).parent / "fixtures" / "conformance"


@pytest.fixture(scope="module")
def captured() -> dict:
    return json.loads((FIX / "llamacpp-0c1e570-cpu-rows.json").read_text())


def _row(rows: list[dict], case: str, mode: str | None = None, verdict: str = FAIL) -> dict:
    return next(r for r in rows if r["case"].startswith(case) and (mode is None or r["mode"] == mode)
                and r["verdict"] == verdict)


# The two rows of the capture whose Messages stream ended on llama-server's error event: the cases did not yet
# record what the event said, so nothing shows it was the parser's (they now do: `error event: <message>`).
CUT_SHORT = {("messages.args.unicode", "stream+think"), ("messages.args.json_string", "stream+think")}


def test_vllm_contract_fails_the_llamacpp_stack_and_its_rules_pass_it(captured):
    """By vLLM's contract 112 real llama.cpp rows fail (what the CLI reported before the family rules); judged by
    llama.cpp's rules only the two streams cut short by an error event it cannot attribute still fail, and every
    re-judged row names its rule, its cause, its source and the case's own evidence."""
    raw = captured["results"]
    assert exit_code(raw) == 1 and sum(r["verdict"] == FAIL for r in raw) == 112
    judged = engine_rules.apply("llamacpp", raw)
    assert {(r["case"], r["mode"]) for r in judged if r["verdict"] == FAIL} == CUT_SHORT
    assert exit_code([r for r in judged if (r["case"], r["mode"]) not in CUT_SHORT]) == 0
    rules = {r.name: r for r in engine_rules.LLAMACPP.rules}
    for before, after in zip(raw, judged, strict=True):
        assert (after["case"], after["mode"]) == (before["case"], before["mode"])
        if before["verdict"] == FAIL and (before["case"], before["mode"]) not in CUT_SHORT:
            rule = rules[after["rule"]]
            assert after["verdict"] == rule.verdict and after["raw_verdict"] == FAIL
            assert after["raw_evidence"] == before["evidence"]
            assert after["evidence"].startswith(rule.cause) and before["evidence"] in after["evidence"]
            assert rule.source in after["evidence"]
        else:
            assert after == before
    used = {r.get("rule") for r in judged}
    # The captured run had no stream without message_start: that rule has its own test below.
    assert used - {None} == set(rules) - {"stream-without-message-start"}


def test_a_stream_cut_short_is_the_model_choice_only_when_the_error_event_is_the_parser_s(captured):
    """A real Messages stream that ended on llama-server's error event: with the event's message recorded and it
    the DeepSeek parser's, the row is `unparsed-model-output`; any other message, or none, and it fails."""
    row = next(r for r in captured["results"] if (r["case"], r["mode"]) in CUT_SHORT)
    head, tail = row["evidence"].split("; ", 1)
    for message, verdict in (("The model produced output that does not match the expected peg-native format", MODEL),
                             ("Internal Server Error", FAIL), ("failed to decode the batch", FAIL)):
        ev = f"{head}; error event: {message}; {tail}"
        out = engine_rules.judge_row(engine_rules.LLAMACPP, {**row, "evidence": ev})
        assert out["verdict"] == verdict, (message, out)
        assert verdict == FAIL or out["rule"] == "unparsed-model-output"


def test_a_contract_failure_inside_a_model_choice_case_still_fails(captured):
    """A real no-call row of a model-choice case with one more problem joined to it (a usage chunk missing, a 502
    from the front door) is no model choice: it stays a fail, with the case's own evidence."""
    row = _row(captured["results"], "tools.named")
    assert engine_rules.judge_row(engine_rules.LLAMACPP, row)["verdict"] == MODEL
    for extra in ("usage chunk missing", "HTTP 502: the engine behind the front door is not answering"):
        bad = {**row, "evidence": f"{row['evidence']}; {extra}"}
        out = engine_rules.judge_row(engine_rules.LLAMACPP, bad)
        assert out["verdict"] == FAIL and out["evidence"] == bad["evidence"] and "rule" not in out
        bad = {**row, "evidence": f"{extra}; {row['evidence']}"}
        assert engine_rules.judge_row(engine_rules.LLAMACPP, bad)["verdict"] == FAIL
    alone = {**row, "evidence": "HTTP 500: Internal Server Error"}
    assert engine_rules.judge_row(engine_rules.LLAMACPP, alone)["verdict"] == FAIL


def test_a_forced_row_must_pass_and_a_difference_needs_its_own_evidence(captured):
    rows = captured["results"]
    forced = next(r for r in rows if (r["case"], r["mode"]) in engine_rules.LLAMACPP.forced)
    assert forced["verdict"] == PASS and engine_rules.judge_row(engine_rules.LLAMACPP, forced) == forced
    for v in (MODEL, FAIL, FINDING):
        out = engine_rules.judge_row(engine_rules.LLAMACPP, {**forced, "verdict": v, "evidence": "no JSON"})
        assert out["verdict"] == FAIL and out["rule"] == "forced" and "must pass" in out["evidence"]
    over = _row(rows, "chat.max_tokens_over_context")
    assert engine_rules.judge_row(engine_rules.LLAMACPP, over)["verdict"] == FINDING
    for evidence in ("max_tokens 8193 above the 8192-token context: HTTP 500: Internal Server Error", "HTTP 502"):
        assert engine_rules.judge_row(engine_rules.LLAMACPP, {**over, "evidence": evidence})["verdict"] == FAIL
    # A rule is for its own cases only: the same no-call evidence on a case that is no model choice fails.
    call = _row(rows, "tools.required_one")
    assert engine_rules.judge_row(engine_rules.LLAMACPP, {**call, "case": "tools.auto"})["verdict"] == FAIL


def test_a_stream_without_message_start_is_llama_server_s_named_finding():
    """The SDK stream helper's AssertionError (no message_start: llama-server holds back a first token that ends
    inside a UTF-8 character) is a finding of the llama.cpp family on a streamed Anthropic row only; the same
    evidence on a non-streamed row, or other evidence on a streamed one, still fails."""

    def no_start(ctx, mode):
        raise AssertionError("Expected message_start")

    row = run_case(None, Case("messages.text", "anthropic", [Mode(True, False)], no_start), Mode(True, False))
    assert row["verdict"] == FAIL
    out = engine_rules.judge_row(engine_rules.LLAMACPP, row)
    assert out["verdict"] == FINDING and out["rule"] == "stream-without-message-start", out
    assert "n_decoded == 1" in out["evidence"] and out["raw_evidence"] == row["evidence"]
    for bad in ({**row, "mode": "no-stream+no-think"}, {**row, "evidence": "HTTP 500: boom"},
                {**row, "case": "chat.text"}):
        assert engine_rules.judge_row(engine_rules.LLAMACPP, bad)["verdict"] == FAIL, bad
    assert engine_rules.judge_row(engine_rules.rules_for("vllm"), row)["verdict"] == FAIL
    # The same stream read as raw HTTP: the event-order checker names the missing message_start once, and checks the
    # blocks from the first event on; with nothing else wrong that is the rule's finding, with more it fails.
    events = [{"type": "content_block_start", "index": 0}, {"type": "content_block_delta", "index": 0},
              {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
              {"type": "message_stop"}]
    problems = event_order_problems(events)
    assert problems == ["first event ['content_block_start'], not message_start"], problems
    raw = {"case": "messages.stream_events", "api": "http", "mode": "stream", "verdict": FAIL,
           "evidence": "; ".join(problems)}
    assert engine_rules.judge_row(engine_rules.LLAMACPP, raw)["verdict"] == FINDING
    worse = event_order_problems([*events[:1], {"type": "content_block_delta", "index": 1}, *events[1:]])
    assert len(worse) == 2
    assert engine_rules.judge_row(engine_rules.LLAMACPP, {**raw, "evidence": "; ".join(worse)})["verdict"] == FAIL


def test_vllm_and_unknown_families_judge_by_the_cases_alone(captured):
    raw = captured["results"]
    assert engine_rules.apply("vllm", raw) == raw
    assert engine_rules.apply("sglang", raw) == raw


def test_the_markdown_lists_the_rules_with_their_sources(captured):
    judged = engine_rules.apply("llamacpp", captured["results"])
    meta = {**{k: captured[k] for k in ("target", "server_version", "model", "max_model_len", "url", "recipe",
                                        "recipe_sha256", "clients", "date", "duration_s")}}
    md = markdown(meta, judged, {}, engine_rules.LLAMACPP)
    assert "## Judged by the llamacpp family's rules" in md
    for rule in engine_rules.LLAMACPP.rules:
        assert f"`{rule.name}`" in md and rule.source.replace("|", "\\|") in md


def test_the_family_is_read_from_a_real_v1_models_answer():
    from ds4deploy.engines import family_of_models

    fix = Path(__file__).parent / "fixtures" / "engines"
    assert family_of_models(json.loads((fix / "llamacpp-0c1e570-v1-models.json").read_text())) == "llamacpp"
    assert family_of_models(json.loads((fix / "vllm-0.32.0-cpu-v1-models.json").read_text())) == "vllm"
    assert family_of_models({"data": [{"id": "x", "owned_by": "someone"}]}) is None
    assert family_of_models(["not", "a", "list body"]) is None


def test_every_llamacpp_recipe_pins_the_commit_the_rules_were_read_at():
    """The llama.cpp rules cite that commit's code: a recipe pinning another llama.cpp must have them re-read (and
    LLAMACPP_COMMIT moved) before its matrix is judged by them."""
    from ds4deploy.recipe.load import load_recipe
    from ds4deploy.recipe.paths import REPO_ROOT

    pins = {p.stem: load_recipe(p.stem).engine.version for p in (REPO_ROOT / "recipes").glob("*.yaml")
            if load_recipe(p.stem).engine.family == "llamacpp"}
    assert pins, "no llama.cpp recipe found"
    assert {name: v for name, v in pins.items() if v != f"git-{engine_rules.LLAMACPP_COMMIT}"} == {}
