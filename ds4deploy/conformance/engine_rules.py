"""Judging the conformance matrix by the engine family's own rules: what a family's engine forces, what is the
model's choice on it, and where it answers differently from vLLM by design.

The cases (`ds4deploy.conformance.cases`) are written to vLLM's contract: a ``tool_choice`` required or named is
forced by a grammar from the first token, a ``max_tokens`` above the context is refused, and so on. Another engine
family keeps the same client contract but forces less, or answers some requests differently by design. Its rules
live here, one `FamilyRules` per family, each rule with its source at the engine's pinned commit, and
`apply` re-judges the matrix's rows with them:

- a row the family forces (`FamilyRules.forced`) must pass: any other verdict is a ``fail`` that says so;
- a ``fail`` row whose case is the model's choice on this engine, or a named engine difference, gets the rule's
  verdict (``model-dependent`` or ``finding``) only when EVERY problem in its evidence (the case joins several with
  "; ") is what the rule names: a contract failure inside such a case (a usage chunk missing, an HTTP 502, a crash)
  still fails;
- every other row is left as the cases judged it.

A re-judged row keeps what the case saw: ``raw_verdict`` and ``raw_evidence`` (the case's own), ``rule`` (the rule's
name), and its evidence prefixed by the rule's cause. The vLLM family has no rules: the cases are its contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ds4deploy.conformance.common import FAIL, FINDING, MODEL, NO_MESSAGE_START_SDK, PASS

# The llama.cpp tree every llama.cpp image is built from (docs/sources.md#llamacpp-source); the files named below
# are read at this commit.
LLAMACPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


@dataclass(frozen=True)
class Rule:
    """One way a family's engine answers a case differently from the cases' (vLLM's) contract.

    `cases`: case-name prefixes it applies to; `modes`: mode labels it applies to (empty: all); `problem`: a regex
    for ONE problem the rule explains (model text inside it as the case quotes it, `REPR`; never a free ``.*``, so a
    match cannot run across the ``"; "`` that joins problems): the row's whole evidence must be such problems
    joined by ``"; "``; `requires`: a regex one of them must match as well (None: none); `verdict`:
    ``model-dependent`` or ``finding``; `cause`: what the report says, in the engine's terms; `source`: where the
    behaviour is in the engine's code at its pinned commit."""

    name: str
    cases: tuple[str, ...]
    problem: re.Pattern
    verdict: str
    cause: str
    source: str
    modes: tuple[str, ...] = ()
    requires: re.Pattern | None = None

    def covers(self, case: str, mode: str) -> bool:
        """True when this rule is about `case` in `mode`."""
        return case.startswith(self.cases) and (not self.modes or mode in self.modes)

    def explains(self, evidence: str) -> bool:
        """True when every problem of `evidence` is one this rule names (and `requires` is among them)."""
        one = self.problem.pattern
        if re.fullmatch(f"(?:{one})(?:; (?:{one}))*", evidence) is None:
            return False
        return self.requires is None or self.requires.search(evidence) is not None


@dataclass(frozen=True)
class FamilyRules:
    """A family's rules: `engine` (name and pinned commit, for the report), `forced` (``(case, mode)`` rows its
    grammar forces from the first token, with `forced_source`), `rules` (in order; the first that matches a row
    judges it)."""

    family: str
    engine: str
    forced: frozenset[tuple[str, str]] = frozenset()
    forced_source: str = ""
    rules: tuple[Rule, ...] = field(default=())


# A Python repr of model text, as the cases quote it (``{text!r}``): single or double quotes, escapes inside.
REPR = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""


def _any(*parts: str) -> re.Pattern:
    return re.compile("|".join(f"(?:{p})" for p in parts))


# --- llama.cpp ---------------------------------------------------------------------------------------------------
#
# llama.cpp's DeepSeek V3.2/V4 handler (common/chat.cpp selects it for a template with `dsml_token`, the V4 Flash
# template's) builds the tool-call grammar in common/parsers/deepseek.cpp as
# `generation_prompt + reasoning + content_before_tools + tool_calls + end`: the content before the DSML block is
# free text, and with thinking on the reasoning block runs free too. Under tool_choice required the call is therefore
# the model's choice, as under auto; a random-weight model writes text until max_tokens and never opens the block.
# A named tool_choice (an object) is not read at all: llama-server logs "Wrong type supplied for parameter
# 'tool_choice', using default value" (tools/server/server-common.h, json_value). Only a
# response_format with thinking off is forced from the first token (`reasoning + response_format + end`, thinking
# off: no reasoning block).
# The cases whose call (or JSON answer under thinking) is the model's choice on llama.cpp, by the grammar above.
_CALL_CASES = ("tools.required_one", "tools.required_several", "tools.named", "tools.parallel", "messages.tool_named",
               "messages.tool_any", "args.", "messages.args.", "replay.openai.args_", "replay.anthropic",
               "chat.guided_json")
# How the cases say a call was not made, one problem each (ds4deploy/conformance/cases_openai.py _tool_case,
# cases_anthropic.py, arguments.py, replay.py; chat_guided_json for the JSON answer).
_ARGS = r"(?:(?:messages\.)?args\.\w+ \[[^\]]*\]: )?"
_NO_BYTES = r"(?: \(\w+: 0 bytes of (?:arguments|input), (?:finish|stop_reason)=\w+(?:, usage \d+\+\d+=\d+)?\))?"
_NO_CALL = (
    rf"tool_choice [^;]*? gave no call \(finish=\w+, content {REPR}\)(?: \(no call, finish=\w+\))?",
    r"tool_choice [^;]*? gave no tool_use block(?: \(no tool_use, stop_reason=\w+\))?",
    rf"{_ARGS}0 (?:tool calls|tool_use blocks), want exactly 1 of \w+{_NO_BYTES}",
    rf"(?:finish_reason|stop_reason) '(?:length|max_tokens|stop|end_turn)'{_NO_BYTES}",
    r"replay\.[\w.]+ \[[^\]]*\]: (?:calls|tool_use blocks) \[\], want exactly one \w+(?: \([^;]*\))?",
    rf"content {REPR} is not schema-valid JSON: [^;]*\(finish=\w+\)",
)
# llama-server answers 500 when its chat parser cannot read what the model wrote (common/chat.cpp,
# common_chat_parse: logs "unparsed <format> output" and throws "The model produced output that does not match
# the expected <format> format"): a random model's unclosed <think> block at max_tokens. Streamed, the Messages API
# ends on that error event (its message as the case records it) and what a stream cut short lacks.
_UNPARSED_MSG = "The model produced output that does not match the expected peg-native format"
_UNPARSED = (
    rf"{_ARGS}(?:HTTP 500: (?:Error code: 500 - )?|APIError: )?{_UNPARSED_MSG}",
    rf"{_ARGS}an SSE event name differs from its data's type",
    rf"error event: {_UNPARSED_MSG}",
    r"stream ends \[[^\]]*\], not message_delta, message_stop",
    r"block \d+ never stops",
    r"message_delta has no stop_reason",
    r"message_delta has no usage\.output_tokens",
    rf"(?:finish_reason|stop_reason) None{_NO_BYTES}",
    *_NO_CALL,
)

LLAMACPP = FamilyRules(
    family="llamacpp",
    engine=f"llama.cpp {LLAMACPP_COMMIT[:12]}",
    forced=frozenset({("chat.guided_json", "no-stream+no-think"), ("chat.guided_json", "stream+no-think")}),
    forced_source="common/parsers/deepseek.cpp: a response_format with thinking off is the whole output's grammar",
    rules=(
        Rule(name="tool-call-free-text-first",
             cases=_CALL_CASES,
             problem=_any(*_NO_CALL),
             verdict=MODEL,
             cause="llama.cpp's DeepSeek V4 grammar lets free text (and a free reasoning block) come before the "
                   "DSML tool-call block, and reads no named tool_choice, so a call (or JSON under thinking) is "
                   "the model's choice here; this model made none",
             source="common/parsers/deepseek.cpp (content_before_tools + tool_calls), common/chat.cpp (the "
                    "DeepSeek V3.2/V4 format picked for a template with dsml_token), tools/server/server-common.h "
                    "(a tool_choice of the wrong type: the default)"),
        Rule(name="unparsed-model-output",
             cases=_CALL_CASES,
             problem=_any(*_UNPARSED),
             requires=re.compile(re.escape(_UNPARSED_MSG)),
             verdict=MODEL,
             cause="llama-server answers 500 when its DeepSeek parser cannot read the model's output (an "
                   "unclosed <think> block at max_tokens); the model's choice, not a crash",
             source="common/chat.cpp common_chat_parse (\"does not match the expected ... format\")"),
        Rule(name="max-tokens-capped",
             cases=("chat.max_tokens_over_context",),
             # the case returns this one problem alone, the answer's first 200 bytes after it (model text: any byte)
             problem=re.compile(r"max_tokens \d+ above the \d+-token context: HTTP 200: .*"),
             verdict=FINDING,
             cause="llama-server caps max_tokens above the context at the slot's context and answers 200 (vLLM "
                   "refuses with 400)",
             source="tools/server/server-context.cpp n_ctx_slot() (\"the capping itself is done in n_ctx_slot()\")"),
        Rule(name="think-tags-kept",
             cases=("reasoning.field",),
             problem=re.compile(r"think tags in content: \['<think>'\](?: \(reasoning 0 chars, content \d+ chars\))?"),
             verdict=FINDING,
             cause="the recipe turns llama-server's reasoning extraction off (engine.llamacpp.reasoning: off, "
                   "-rea off), so with the template's thinking on <think> stays in content",
             source="common/arg.cpp -rea/--reasoning (ds4deploy/engines/llamacpp_flags.json); "
                    "engine.llamacpp.reasoning in the recipe"),
        Rule(name="stream-reasoning-with-extraction-off",
             cases=("reasoning.field",),
             modes=("stream+think",),
             problem=_any(r"think tags in content: \['<think>'\]",
                          r"streamed reasoning/content differ from the non-streamed message "
                          r"\(reasoning \d+ chars, content \d+ chars\)"),
             requires=re.compile(r"streamed reasoning/content differ"),
             verdict=FINDING,
             cause="with reasoning extraction off (-rea off) and the template's thinking on, llama-server's stream "
                   "sends part of the <think> block as reasoning deltas while the non-streamed answer keeps it all "
                   "in content: a streaming client sees reasoning the final message lacks",
             source="measured on cpu-llamacpp, 2026-12-02 (tests/unit/fixtures/conformance/"
                    "llamacpp-0c1e570-cpu-rows.json); not traced to a line of the source"),
        Rule(name="stream-without-message-start",
             cases=("messages.", "replay.anthropic"),
             modes=("stream", "stream+no-think", "stream+think"),
             # through the SDK: its stream helper's AssertionError (common.NO_MESSAGE_START_SDK, any detail); in raw
             # HTTP: the event-order checker's first problem (cases_anthropic.event_order_problems), alone
             problem=_any(re.escape(NO_MESSAGE_START_SDK).replace(re.escape("{detail}"), r"[^)]*"),
                          r"first event \['content_block_start'\], not message_start"),
             verdict=FINDING,
             cause="llama-server sends message_start only with the partial result of the first generated token; "
                   "when that token ends inside a UTF-8 character the partial is held back, so the stream starts "
                   "without message_start and the Anthropic SDK's stream helper (Claude Code's) cannot build the "
                   "message. Seen with the tiny random model's byte tokens; a real model's first token can end "
                   "inside a character too (byte-level BPE)",
             source="tools/server/server-task.cpp server_task_result_cmpl_partial::to_json_anthropic "
                    "(first = n_decoded == 1); tools/server/server-context.cpp process_token (no partial while the "
                    "text ends in an incomplete UTF-8 character)"),
        Rule(name="tokenize-content-only",
             cases=("replay.openai.prompt",),
             problem=re.compile(rf"(?:replay\.openai\.prompt: )?the [\w-]+ result \({REPR}\) is not in the prompt"),
             verdict=FINDING,
             cause="the check reads the rendered prompt with vLLM's chat /tokenize (messages in); llama-server's "
                   "/tokenize takes a \"content\" string only, so the prompt it returns lacks the results",
             source="tools/server/server-context.cpp post_tokenize (reads body[\"content\"] only)"),
    ),
)

FAMILIES: dict[str, FamilyRules] = {"vllm": FamilyRules(family="vllm", engine="vLLM"), "llamacpp": LLAMACPP}


def rules_for(family: str) -> FamilyRules:
    """The rules of engine family `family` (``vllm``: none; an unknown family: none, the cases judge alone)."""
    return FAMILIES.get(family) or FamilyRules(family=family, engine=family)


def judge_row(fr: FamilyRules, row: dict) -> dict:
    """`row` (a matrix result: case, mode, verdict, evidence, ...) judged by `fr`; a new dict, the input untouched.
    See the module docstring for the order of the rules."""
    case, mode, verdict, evidence = row["case"], row["mode"], row["verdict"], row["evidence"]
    if (case, mode) in fr.forced:
        if verdict == PASS:
            return dict(row)
        return {**row, "verdict": FAIL, "raw_verdict": verdict, "raw_evidence": evidence, "rule": "forced",
                "evidence": f"forced by {fr.engine}'s grammar ({fr.forced_source}), must pass: {evidence}"}
    if verdict != FAIL:
        return dict(row)
    for rule in fr.rules:
        if rule.covers(case, mode) and rule.explains(evidence):
            return {**row, "verdict": rule.verdict, "raw_verdict": verdict, "raw_evidence": evidence, "rule": rule.name,
                    "evidence": f"{rule.cause} [{fr.engine} {rule.source}]: {evidence}"}
    return dict(row)


def apply(family: str, results: list[dict]) -> list[dict]:
    """Every row of `results` judged by `family`'s rules (`judge_row`), in order."""
    fr = rules_for(family)
    return [judge_row(fr, r) for r in results]
