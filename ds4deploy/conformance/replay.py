"""Multi-turn replay: conversations sent the way coding agents send them, several rounds deep.

An agent's request carries every earlier turn: its own tool calls (arguments as a JSON string, as the OpenAI SDK
sends them, or as an object, as some agents do), the tools' results (plain text, JSON, content-part lists), parallel
calls answered out of order, and on the Anthropic API tool_use / tool_result blocks, the thinking blocks of earlier
turns kept in place and ``cache_control`` marks. A server that re-encodes a replayed argument (an object rendered
as a wrapped JSON string, a string parsed twice) or drops a turn breaks the agent from the second turn on, which a
one-turn test never sees.

Each replay ends with a forced call whose arguments the schema pins (`ds4deploy.conformance.arguments`), so the
answer is checked byte for byte on any model, in every stream x thinking mode, through both APIs. The rendered
prompt itself is compared through vLLM's ``/tokenize`` (arguments as a string vs as an object must render the
same prompt). The recorded Claude Code request (ds4deploy/data/agent_shapes/) is replayed extended by a tool round
with its own Bash tool.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

from ds4deploy.bench.stream import error_text
from ds4deploy.conformance.arguments import (
    ARG_CASES,
    ArgCase,
    anthropic_round,
    compare_arguments,
    compare_texts,
    diff_text,
    leaks,
)
from ds4deploy.conformance.cases_anthropic import event_order_problems
from ds4deploy.conformance.cases_openai import NAMED_FINISH
from ds4deploy.conformance.common import (
    ALL_MODES,
    FAIL,
    FINDING,
    MARKERS,
    PASS,
    STREAM_MODES,
    Case,
    Context,
    Mode,
    Outcome,
    anth_post,
    anth_stream_events,
    chat,
    merge,
    msg_body,
    usage_text,
    works_or_4xx,
)

FINAL = next(c for c in ARG_CASES if c.name == "shell_tail")  # the forced last call: a command ending in 2>&1
SHELL = next(c for c in ARG_CASES if c.name == "shell")
READ_FILE = {"name": "read_file", "description": "Read a file of the repository",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
# What the tools answered in the earlier rounds: text with a traceback, JSON, and a file with quotes and unicode.
RESULT_TEXT = ("FAILED tests/test_app.py::test_parse - AssertionError: assert 'a\\tb' == 'a b'\n"
               "E   + where 'a\\tb' = parse(\"a\\tb\")\n2 failed, 41 passed in 3.20s\n")
RESULT_JSON = json.dumps({"path": "tests/test_app.py", "lines": 120, "sha": "9f2c1e", "tags": ["unit", "fast"],
                          "ok": False, "skipped": None})
RESULT_FILE = "def parse(s: str) -> str:\n    return s.replace(\"\\t\", \" \")  # caf\u00e9 \u2713\n"
ROUND_3_ARGS = ({"path": "src/app.py"}, {"path": "tests/test_app.py"})
ASK = "Fix the failing test."
AGAIN = f"Now run it again: call {FINAL.tool} with the arguments its schema gives."


def _args(value: dict, as_object: bool) -> str | dict:
    return value if as_object else json.dumps(value, ensure_ascii=False)


def openai_conversation(as_object: bool) -> list[dict]:
    """Three rounds as an OpenAI-API agent replays them: a shell call and its text result, two parallel read_file
    calls answered out of order (the second first; one result as JSON, one as a list of text parts), then the user's
    next request. `as_object`: the assistant's arguments as objects instead of JSON strings."""
    a, b = ROUND_3_ARGS
    return [
        {"role": "system", "content": "You are a coding agent working in /srv/app."},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_r1", "type": "function",
             "function": {"name": SHELL.tool, "arguments": _args(SHELL.args, as_object)}}]},
        {"role": "tool", "tool_call_id": "call_r1", "content": RESULT_TEXT},
        {"role": "assistant", "content": "Two files to read.", "tool_calls": [
            {"id": "call_r2a", "type": "function", "function": {"name": "read_file", "arguments": _args(a, as_object)}},
            {"id": "call_r2b", "type": "function", "function": {"name": "read_file", "arguments": _args(b, as_object)}},
        ]},
        {"role": "tool", "tool_call_id": "call_r2b", "content": RESULT_JSON},
        {"role": "tool", "tool_call_id": "call_r2a", "content": [{"type": "text", "text": RESULT_FILE}]},
        {"role": "user", "content": AGAIN},
    ]


def _tools() -> list[dict]:
    # SHELL and FINAL share the tool name run_shell; the schema offered is FINAL's (the forced answer), the history's
    # call of it carried other arguments, as an agent's history does.
    return [FINAL.openai_tool(), {"type": "function", "function": READ_FILE}]


def _check_forced_call(ctx: Context, mode: Mode, case: ArgCase, reply, key: tuple) -> list[str]:
    c = reply.first
    bad = [f"sent twice: {p}" if "times" in p else p for p in reply.problems]
    calls = [x for _i, x in sorted(c.calls.items())]
    if len(calls) != 1 or calls[0].name != case.tool:
        bad.append(f"calls {[x.name for x in calls]}, want exactly one {case.tool}")
    for x in calls[:1]:
        if p := compare_arguments("arguments", x.arguments, case.args):
            bad.append(p)
        if not mode.stream:
            ctx.memo[key] = x.arguments
        elif key in ctx.memo and (p := compare_texts("streamed arguments vs the non-streamed", x.arguments,
                                                      ctx.memo[key])):
            bad.append(p)
    if c.finish not in NAMED_FINISH:
        bad.append(f"finish_reason {c.finish!r}")
    for name, text in (("content", c.content), ("reasoning", c.reasoning)):
        if found := leaks(text, case, MARKERS):
            bad.append(f"{name} carries {found}")
    return bad


def _openai_replay(as_object: bool) -> Callable[[Context, Mode], Outcome]:
    shape = "objects" if as_object else "JSON strings"

    def run(ctx: Context, mode: Mode) -> Outcome:
        label = f"replay.openai.args_{'object' if as_object else 'string'} [{mode.label}]"
        try:
            r = chat(ctx, mode, openai_conversation(as_object), max_tokens=256, tools=_tools(),
                     tool_choice={"type": "function", "function": {"name": FINAL.tool}})
        except Exception as exc:  # an SDK status error: a 4xx for the object form is a finding, never a 5xx
            status = getattr(exc, "status_code", None)
            if as_object and status is not None and 400 <= status < 500:
                return Outcome(FINDING, f"arguments replayed as objects refused: HTTP {status}: "
                                        f"{str(getattr(exc, 'message', exc))[:200]} (agents that send objects break)")
            raise
        bad = _check_forced_call(ctx, mode, FINAL, r, ("replay-openai", as_object, mode.thinking))
        prompt_key = ("replay-openai-prompt", mode.thinking)
        prompt = r.usage.prompt_tokens if r.usage is not None else None
        if not as_object:
            ctx.memo[prompt_key] = prompt
        elif ctx.memo.get(prompt_key) not in (None, prompt):
            bad.append(f"the prompt is {prompt} tokens with arguments as objects, {ctx.memo[prompt_key]} as JSON "
                       "strings: the server renders replayed arguments differently (see replay.openai.prompt)")
        ev = f"3 rounds, arguments as {shape}: {FINAL.tool} forced, {usage_text(r.usage)}"
        if bad:
            return Outcome(FAIL, f"{label}: " + "; ".join(bad) + f" ({ev})")
        return Outcome(PASS, ev + (", streamed = non-streamed" if mode.stream else ", arguments exact"))

    run.__doc__ = (f"A three-round OpenAI conversation replayed with the assistant's arguments as {shape} (parallel "
                   "calls answered out of order, results as text, JSON and content parts): accepted, the forced "
                   "call exact and streamed = non-streamed, nothing in content or reasoning"
                   + (", and the same prompt size as with JSON strings." if as_object else "."))
    return run


def _tokenize(ctx: Context, messages: list[dict], mode: Mode) -> tuple[list[int] | None, str]:
    body = {"model": ctx.model, "messages": messages, "tools": _tools(), "add_generation_prompt": True,
            **ctx.template_kwargs(mode)}
    r = ctx.http.post("/tokenize", json=body)
    if r.status_code != 200:
        return None, error_text(r.content, r.status_code)
    return r.json().get("tokens"), ""


def _detokenize(ctx: Context, tokens: list[int]) -> str:
    r = ctx.http.post("/detokenize", json={"model": ctx.model, "tokens": tokens})
    return r.json().get("prompt", "") if r.status_code == 200 else ""


def replay_openai_prompt(ctx: Context, mode: Mode) -> Outcome:
    """The rendered prompt (vLLM's ``/tokenize`` of the conversation): every tool result reaches it, no argument is
    wrapped in a second JSON string, and arguments replayed as objects render exactly as JSON strings do (a finding
    when the server refuses objects)."""
    as_str, err = _tokenize(ctx, openai_conversation(False), mode)
    if as_str is None:
        return Outcome(FINDING, f"/tokenize not usable, the rendered prompt is not checked: {err[:200]}")
    text_str = _detokenize(ctx, as_str)
    as_obj, obj_err = _tokenize(ctx, openai_conversation(True), mode)
    text_obj = _detokenize(ctx, as_obj) if as_obj is not None else None
    bad = []
    if as_obj is not None and as_str != as_obj:
        bad.append(diff_text("prompt with arguments as objects vs as JSON strings", text_obj, text_str)
                   or f"token ids differ ({len(as_obj)} vs {len(as_str)})")
    for what, piece in (("the text result", RESULT_TEXT.splitlines()[0]), ("the JSON result", '"sha": "9f2c1e"'),
                        ("the content-part result", RESULT_FILE.splitlines()[0])):
        if piece not in text_str:
            bad.append(f"{what} ({piece[:40]!r}) is not in the prompt")
    wrapped = json.dumps(json.dumps(ROUND_3_ARGS[0]))[1:-1]
    for name, text in (("JSON strings", text_str), ("objects", text_obj)):
        if text is not None and wrapped in text:
            bad.append(f"arguments replayed as {name} reach the prompt wrapped in a second JSON string "
                       f"({wrapped[:40]!r})")
    if bad:
        return Outcome(FAIL, "replay.openai.prompt: " + "; ".join(bad))
    ev = f"{len(as_str)} prompt tokens; every tool result rendered, no argument wrapped twice"
    if as_obj is None:
        return Outcome(FINDING, f"{ev} (arguments as JSON strings); arguments as objects refused: {obj_err[:160]}")
    return Outcome(PASS, ev + "; objects render the same prompt as JSON strings")


# --- Anthropic -------------------------------------------------------------------------------------------------

def anthropic_conversation() -> tuple[list[dict], list[dict]]:
    """(system blocks, messages) as Claude Code replays three rounds: thinking blocks (with their signature) kept in
    each assistant turn, a shell tool_use and its text result, two parallel read_file tool_use blocks answered out
    of order (one result a string, one a list of text blocks with JSON), ``cache_control`` on the system prompt and
    on the last result, then the user's next request."""
    a, b = ROUND_3_ARGS
    system = [{"type": "text", "text": "You are a coding agent working in /srv/app.",
               "cache_control": {"type": "ephemeral"}}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": ASK}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Run the tests first to see what fails.", "signature": "c2lnLTE="},
            {"type": "text", "text": "Running the tests."},
            {"type": "tool_use", "id": "toolu_r1", "name": SHELL.tool, "input": SHELL.args}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r1", "content": RESULT_TEXT}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Read the code and the test.", "signature": "c2lnLTI="},
            {"type": "tool_use", "id": "toolu_r2a", "name": "read_file", "input": a},
            {"type": "tool_use", "id": "toolu_r2b", "name": "read_file", "input": b}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_r2b", "content": [{"type": "text", "text": RESULT_JSON}]},
            {"type": "tool_result", "tool_use_id": "toolu_r2a", "content": RESULT_FILE,
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": AGAIN}]},
    ]
    return system, messages


def replay_anthropic(ctx: Context, mode: Mode) -> Outcome:
    """A three-round Messages conversation as Claude Code replays it (thinking blocks kept, tool_use / tool_result
    blocks, parallel calls answered out of order, ``cache_control``): accepted, the forced tool_use exact, streamed
    input = non-streamed, nothing of it in text or thinking blocks."""
    system, messages = anthropic_conversation()
    tools = [FINAL.anthropic_tool(), {"name": "read_file", "description": READ_FILE["description"],
                                      "input_schema": READ_FILE["parameters"]}]
    body = msg_body(ctx, temperature=0, max_tokens=256, system=system, messages=messages, tools=tools,
                    tool_choice={"type": "tool", "name": FINAL.tool}, **ctx.template_kwargs(mode))
    label = f"replay.anthropic [{mode.label}]"
    got = anthropic_round(ctx, body, mode.stream)
    if isinstance(got, str):
        return Outcome(FAIL, f"{label}: {got}")
    bad, uses, inputs, texts = list(got.problems), got.uses, got.inputs, got.texts
    if len(uses) != 1 or uses[0].get("name") != FINAL.tool:
        bad.append(f"tool_use blocks {[u.get('name') for u in uses]}, want exactly one {FINAL.tool}")
    key = ("replay-anthropic", mode.thinking)
    for text in inputs[:1]:
        if p := compare_arguments("input", text or "{}", FINAL.args):
            bad.append(p)
        if not mode.stream:
            ctx.memo[key] = text
        elif key in ctx.memo and (p := compare_texts("streamed input vs the non-streamed", text, ctx.memo[key])):
            bad.append(p)
    for kind, text in texts.items():
        if found := leaks(text, FINAL, MARKERS):
            bad.append(f"{kind} blocks carry {found}")
    ev = f"3 rounds with thinking blocks and cache_control: {FINAL.tool} forced"
    if bad:
        return Outcome(FAIL, f"{label}: " + "; ".join(bad) + f" ({ev})")
    return Outcome(PASS, ev + (", streamed = non-streamed" if mode.stream else ", input exact"))


def _extend_recorded(body: dict) -> dict:
    """A recorded Claude Code first turn extended by one tool round with its own Bash tool: the assistant's
    thinking and tool_use (a command with quotes and 2>&1), the tool_result (with cache_control), the user's
    next words."""
    b = copy.deepcopy(body)
    b["messages"] = [*b["messages"],
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": "Run the tests.", "signature": "c2lnLTE="},
                         {"type": "tool_use", "id": "toolu_rec1", "name": "Bash",
                          "input": {"command": "cd /srv/app && make test 2>&1 | grep -E \"FAIL|Error\" | tail -20",
                                    "description": "Run the tests"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "toolu_rec1", "content": RESULT_TEXT,
                          "cache_control": {"type": "ephemeral"}},
                         {"type": "text", "text": "Fix it."}]}]
    return b


def _send(ctx: Context, mode: Mode, shape, body: dict, name: str) -> Outcome:
    """One replay of a recorded shape: streamed, the events must come in order; a refusal is `works_or_4xx`'s."""
    if mode.stream:
        status, events, _err = anth_stream_events(ctx, body, shape.path, shape.headers)
        if status == 200:
            bad = event_order_problems(events)
            return (Outcome(FAIL, f"{name}, streamed: {'; '.join(bad)}") if bad else
                    Outcome(PASS, f"{name}: {len(events)} events in order"))
    return works_or_4xx(anth_post(ctx, body, shape.headers, shape.path), name)


def replay_recorded(ctx: Context, mode: Mode) -> Outcome:
    """Each recorded Claude Code request, extended by one Bash tool round (thinking block, tool_use, tool_result
    with cache_control), replayed with the served model name and ``max_tokens`` fitted to the context, streamed and
    not: it works or gets a 4xx with a message (a finding naming the refusal), never a 5xx; streamed, the events
    come in order. Where the server refuses the recorded ``thinking`` field, the rest is replayed without it."""
    shapes = [s for s in ctx.shapes if s.path.split("?")[0] == "/v1/messages" and "Bash" in
              {t.get("name") for t in s.body.get("tools", [])}]
    if not shapes:
        return Outcome(PASS, "no recorded Claude Code shape to replay")
    outs = []
    for shape in shapes:
        body = _extend_recorded(shape.body)
        body["model"] = ctx.model
        body.pop("stream", None)
        body["max_tokens"] = min(body.get("max_tokens", 64), 64)
        name = f"{shape.name} + a Bash round"
        out = _send(ctx, mode, shape, body, f"{name}, as recorded")
        if out.verdict == FINDING and "thinking" in body:
            # the refusal is reported; the rest of the shape is tried without the refused field
            outs.append(out)
            body = {k: v for k, v in body.items() if k != "thinking"}
            out = _send(ctx, mode, shape, body, f"{name}, without its thinking field")
        outs.append(out)
    return merge(outs)


CASES: list[Case] = [
    Case("replay.openai.args_string", "openai", ALL_MODES, _openai_replay(False)),
    Case("replay.openai.args_object", "openai", ALL_MODES, _openai_replay(True)),
    Case("replay.openai.prompt", "http", [Mode(None, False), Mode(None, True)], replay_openai_prompt),
    Case("replay.anthropic", "http", ALL_MODES, replay_anthropic),
    Case("replay.recorded_shapes", "http", STREAM_MODES, replay_recorded),
]
