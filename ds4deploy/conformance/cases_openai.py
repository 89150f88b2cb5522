"""The OpenAI chat-completion cases: content, usage, finish reasons, sampling, tool calls with enum arguments,
guided JSON and the reasoning field (`ds4deploy.conformance.common` says what a case and a verdict are)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from ds4deploy.bench.stream import error_text
from ds4deploy.conformance.common import (
    ASK_WEATHER,
    FAIL,
    FINDING,
    MODEL,
    PASS,
    PROMPT,
    SEED,
    THINK_TAGS,
    TOOL_MAX_TOKENS,
    TOOLS,
    Choice,
    Context,
    Mode,
    Outcome,
    chat,
    markers_in,
    openai_tools,
    sse,
    usage_text,
)

# --- OpenAI chat -----------------------------------------------------------------------------------------------


LONG_PROMPT = [{"role": "user", "content": "Count from 1 to 200, one number per line."}]


def chat_basic(ctx: Context, mode: Mode) -> Outcome:
    """Content and usage: prompt and completion tokens counted, total = their sum, a finish_reason; streamed, the
    usage chunk arrives once."""
    r = chat(ctx, mode, PROMPT)
    c, u, bad = r.first, r.usage, list(r.problems)
    if u is None:
        bad.append("no usage")
    elif not (u.prompt_tokens > 0 and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens
              + u.completion_tokens):
        bad.append(f"usage does not add up: {usage_text(u)}")
    if c.finish not in ("stop", "length"):
        bad.append(f"finish_reason {c.finish!r}")
    if mode.stream and r.usage_chunks != 1:
        bad.append(f"{r.usage_chunks} usage chunks")
    if leaked := markers_in(c.content):
        bad.append(f"markers in content: {leaked}")
    ev = f"{len(c.content)} chars, finish={c.finish}, {usage_text(u)}"
    return Outcome(FAIL, "; ".join(bad) + f" ({ev})") if bad else Outcome(PASS, ev)


def chat_include_usage(ctx: Context, mode: Mode) -> Outcome:
    """Raw SSE: with ``stream_options.include_usage`` exactly one chunk carries usage, with empty choices, right
    before ``[DONE]``; without it no chunk carries usage; ``[DONE]`` ends both streams."""
    body = {"model": ctx.model, "messages": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True,
            **ctx.template_kwargs(mode)}
    bad, ev = [], []
    for include in (True, False):
        b = {**body, "stream_options": {"include_usage": True}} if include else body
        with ctx.http.stream("POST", "/v1/chat/completions", json=b) as resp:
            if resp.status_code != 200:
                return Outcome(FAIL, error_text(resp.read(), resp.status_code))
            datas = [d for _e, d in sse(resp)]
        if not datas or datas[-1] != "[DONE]":
            bad.append(f"include_usage={include}: stream does not end with [DONE]")
            continue
        chunks = [json.loads(d) for d in datas[:-1]]
        with_usage = [i for i, ch in enumerate(chunks) if ch.get("usage")]
        if include:
            if len(with_usage) != 1:
                bad.append(f"include_usage: {len(with_usage)} usage chunks")
            elif with_usage[0] != len(chunks) - 1:
                bad.append("include_usage: the usage chunk is not the last before [DONE]")
            elif chunks[-1].get("choices"):
                bad.append("include_usage: the usage chunk has non-empty choices")
            ev.append(f"{len(chunks)} chunks, usage once, last, choices [] then [DONE]")
        else:
            if with_usage:
                bad.append(f"without include_usage: {len(with_usage)} chunks carry usage")
            ev.append(f"without: {len(chunks)} chunks, none with usage")
    return Outcome(FAIL, "; ".join(bad)) if bad else Outcome(PASS, "; ".join(ev))


def chat_finish_length(ctx: Context, mode: Mode) -> Outcome:
    """A long answer cut at max_tokens ends with finish_reason ``length`` and exactly max_tokens tokens."""
    n = 5
    r = chat(ctx, mode, LONG_PROMPT, max_tokens=n)
    c, u = r.first, r.usage
    ev = f"finish={c.finish}, {usage_text(u)}"
    if r.problems:
        return Outcome(FAIL, "; ".join(r.problems))
    if c.finish == "length" and u is not None and u.completion_tokens == n:
        return Outcome(PASS, ev)
    if c.finish == "stop" and u is not None and u.completion_tokens < n:
        return Outcome(MODEL, f"the model ended its answer within {n} tokens ({ev})")
    return Outcome(FAIL, f"expected finish_reason length with {n} tokens: {ev}")


def chat_finish_stop(ctx: Context, mode: Mode) -> Outcome:
    """An answer the model ends itself: finish_reason ``stop``, fewer tokens than max_tokens."""
    n = 256
    r = chat(ctx, mode, PROMPT, max_tokens=n)
    c, u = r.first, r.usage
    ev = f"finish={c.finish}, {usage_text(u)}"
    if r.problems:
        return Outcome(FAIL, "; ".join(r.problems))
    if c.finish == "stop" and u is not None and u.completion_tokens < n:
        return Outcome(PASS, ev)
    if c.finish == "length":
        return Outcome(MODEL, f"the model did not end its answer within {n} tokens (no end-of-turn token; {ev})")
    return Outcome(FAIL, f"unexpected finish_reason: {ev}")


def chat_stop_sequence(ctx: Context, mode: Mode) -> Outcome:
    """``stop``: the greedy answer is cut before the first occurrence of a string taken from that same answer, the
    string itself is not returned, finish_reason is ``stop``."""
    base = chat(ctx, Mode(False, mode.thinking), LONG_PROMPT, max_tokens=24).first.content
    probe = base[len(base) // 3: len(base) // 3 + 2] or base[:1]
    if not probe:
        return Outcome(MODEL, "the model's greedy answer is empty: nothing to stop on")
    r = chat(ctx, mode, LONG_PROMPT, max_tokens=24, stop=[probe])
    c, want = r.first, base[: base.index(probe)]
    ev = f"stop={probe!r}: {len(c.content)} chars, finish={c.finish}"
    if r.problems:
        return Outcome(FAIL, "; ".join(r.problems))
    if c.content == want and c.finish == "stop":
        return Outcome(PASS, ev)
    return Outcome(FAIL, f"expected {want!r} with finish stop, got {c.content!r} ({ev})")


def chat_n(ctx: Context, mode: Mode) -> Outcome:
    """``n`` = 2 (sampled: vLLM refuses n > 1 with greedy sampling): two choices (index 0 and 1), each with its own
    finish_reason; usage counts both."""
    r = chat(ctx, mode, PROMPT, max_tokens=8, n=2, temperature=1.0)
    bad = list(r.problems)
    if sorted(r.choices) != [0, 1]:
        bad.append(f"choice indexes {sorted(r.choices)}")
    if any(c.finish not in ("stop", "length") for c in r.choices.values()):
        bad.append(f"finish reasons {[c.finish for c in r.choices.values()]}")
    if r.usage is None or r.usage.completion_tokens < 2:
        bad.append(f"usage {usage_text(r.usage)}")
    ev = f"{len(r.choices)} choices, {usage_text(r.usage)}"
    return Outcome(FAIL, "; ".join(bad) + f" ({ev})") if bad else Outcome(PASS, ev)


def chat_seed(ctx: Context, mode: Mode) -> Outcome:
    """Sampling (temperature 1) with a fixed ``seed``: the same request twice gives the same text."""
    a, b = (chat(ctx, mode, PROMPT, max_tokens=16, temperature=1.0).first.content for _ in range(2))
    if a == b:
        return Outcome(PASS, f"identical {len(a)}-char answers at temperature 1, seed {SEED}")
    return Outcome(FAIL, f"seed {SEED} gave different text: {a[:40]!r} vs {b[:40]!r}")


def chat_greedy(ctx: Context, mode: Mode) -> Outcome:
    """Greedy: the same request twice gives the same text, and the streamed answer equals the non-streamed one."""
    a = chat(ctx, Mode(False, mode.thinking), PROMPT)
    b = chat(ctx, Mode(False, mode.thinking), PROMPT)
    s = chat(ctx, Mode(True, mode.thinking), PROMPT)
    texts = [x.first.reasoning + x.first.content for x in (a, b, s)]
    if len(set(texts)) == 1:
        return Outcome(PASS, f"3 identical {len(texts[0])}-char answers (2 non-streamed, 1 streamed)")
    return Outcome(FAIL, f"answers differ: {[t[:30] for t in texts]}")


def chat_over_context(ctx: Context, mode: Mode) -> Outcome:
    """``max_tokens`` above the context: a 400 (or 422) with a message, not a 500, streamed or not."""
    if not ctx.max_model_len:
        return Outcome(FINDING, "the server does not report max_model_len in /v1/models: not tested")
    body = {"model": ctx.model, "messages": PROMPT, "max_tokens": ctx.max_model_len + 1, "stream": bool(mode.stream)}
    r = ctx.http.post("/v1/chat/completions", json=body)
    msg = error_text(r.content, r.status_code)
    if r.status_code in (400, 422) and msg != f"HTTP {r.status_code}: ":
        return Outcome(PASS, f"max_tokens {ctx.max_model_len + 1}: {msg[:160]}")
    return Outcome(FAIL, f"max_tokens {ctx.max_model_len + 1} above the {ctx.max_model_len}-token context: {msg[:200]}")


# --- tool calls ------------------------------------------------------------------------------------------------


# OpenAI's convention, which vLLM follows (vllm/entrypoints/openai/chat_completion/serving.py: "tool_calls" for auto
# or required tool calls, "stop" for named tool calls).
NAMED_FINISH = ("tool_calls", "stop")


def check_calls(c: Choice, names: list[str], named: bool = False) -> list[str]:
    """Problems with the tool calls of a choice: unknown function, arguments that are not one JSON object valid
    against the tool's schema, a missing id, or a finish_reason other than ``tool_calls`` (``stop`` too for a
    `named` tool_choice, `NAMED_FINISH`)."""
    bad = []
    for i, call in sorted(c.calls.items()):
        if call.name not in names:
            bad.append(f"call {i}: unknown function {call.name!r}")
            continue
        if not call.id:
            bad.append(f"call {i}: no id")
        try:
            args = json.loads(call.arguments)
        except json.JSONDecodeError as exc:
            bad.append(f"call {i}: arguments are not JSON ({exc.msg}): {call.arguments[:80]!r}")
            continue
        try:
            jsonschema.validate(args, TOOLS[call.name]["parameters"])
        except jsonschema.ValidationError as exc:
            bad.append(f"call {i}: arguments {call.arguments[:80]!r} break {call.name}'s schema: {exc.message}")
    if c.calls and c.finish not in (NAMED_FINISH if named else ("tool_calls",)):
        bad.append(f"finish_reason {c.finish!r} with {len(c.calls)} tool call(s)")
    if not c.calls and c.finish == "tool_calls":
        bad.append("finish_reason tool_calls without a tool call")
    if leaked := markers_in(c.content):
        bad.append(f"parser markers in content: {leaked}")
    return bad


def _calls_text(c: Choice) -> str:
    return ", ".join(f"{x.name}({x.arguments})" for _i, x in sorted(c.calls.items())) or "no call"


def _tool_case(ctx: Context, mode: Mode, key: str, names: list[str], tool_choice: Any, forced: bool,
               parallel: bool = False) -> Outcome:
    """Shared body of the tool-call cases. Forced choices must produce valid calls; streamed calls must join to
    exactly the non-streamed ones of the same thinking mode (memoised under `key`)."""
    r = chat(ctx, mode, [{"role": "user", "content": ASK_WEATHER}], max_tokens=TOOL_MAX_TOKENS,
             tools=openai_tools(names), tool_choice=tool_choice, parallel_tool_calls=parallel)
    c = r.first
    named = isinstance(tool_choice, dict)
    bad = r.problems + check_calls(c, names, named)
    if tool_choice == "none" and c.calls:
        bad.append(f"tool_choice none, yet {len(c.calls)} call(s)")
    if forced and not c.calls:
        bad.append(f"tool_choice {json.dumps(tool_choice)} gave no call (finish={c.finish}, "
                   f"content {c.content[:60]!r})")
    if named and any(x.name != tool_choice["function"]["name"] for x in c.calls.values()):
        bad.append(f"named {tool_choice['function']['name']}, called {[x.name for x in c.calls.values()]}")
    if not parallel and len(c.calls) > 1:
        bad.append(f"parallel_tool_calls false, yet {len(c.calls)} calls")
    memo_key = (key, mode.thinking)
    shown = [(x.name, x.arguments) for _i, x in sorted(c.calls.items())]
    same = ""
    if not mode.stream:
        ctx.memo[memo_key] = shown
    elif memo_key in ctx.memo:
        # Compared as JSON: vLLM streams the model's argument text as generated and re-serialises the non-streamed
        # arguments (json.dumps spacing), so the strings may differ in whitespace alone. A fragment sent twice or
        # lost changes the parsed object (or breaks the JSON, caught above).
        before = ctx.memo[memo_key]
        if [(n, loads_or_text(a)) for n, a in shown] != [(n, loads_or_text(a)) for n, a in before]:
            bad.append(f"streamed calls {shown} differ from the non-streamed {before}")
        else:
            same = " = non-streamed" + (" (as JSON; whitespace differs)" if shown != before else ", byte for byte")
    ev = f"{_calls_text(c)}, finish={c.finish}" + (" (OpenAI's convention for a named tool_choice)"
                                                     if named and c.finish == "stop" else "")
    if bad:
        return Outcome(FAIL, "; ".join(bad) + f" ({ev})")
    if not forced and tool_choice != "none" and not c.calls:
        return Outcome(MODEL, f"the model answered in text without choosing a tool; no parser markers in content, "
                              f"finish={c.finish} (choosing a tool by itself is the model's skill)")
    if parallel and len(c.calls) < 2:
        return Outcome(MODEL, f"the model made {len(c.calls)} call(s), valid ({ev}); more than one is its choice")
    return Outcome(PASS, ev + same)


def loads_or_text(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def tools_none(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` none with tools offered: text only, no call, finish_reason not ``tool_calls``."""
    return _tool_case(ctx, mode, "none", ["get_weather"], "none", forced=False)


def tools_auto(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` auto: whether the model calls is its choice (model-dependent when it does not); a call it
    makes must be valid, and text must carry no parser markers."""
    return _tool_case(ctx, mode, "auto", ["get_weather", "get_time"], "auto", forced=False)


def tools_required_one(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` required, one tool: a valid call, arguments schema-valid, finish_reason ``tool_calls``."""
    return _tool_case(ctx, mode, "required1", ["get_weather"], "required", forced=True)


def tools_required_several(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` required among three tools: one valid call of one of them."""
    return _tool_case(ctx, mode, "required3", list(TOOLS), "required", forced=True)


def tools_named(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` naming one of three tools: a valid call of exactly that one."""
    choice = {"type": "function", "function": {"name": "get_time"}}
    return _tool_case(ctx, mode, "named", list(TOOLS), choice, forced=True)


def tools_parallel(ctx: Context, mode: Mode) -> Outcome:
    """``parallel_tool_calls`` true with ``required``: every call valid, ids distinct; more than one call is the
    model's choice."""
    return _tool_case(ctx, mode, "parallel", list(TOOLS), "required", forced=True, parallel=True)


def tools_result_turn(ctx: Context, mode: Mode) -> Outcome:
    """A second turn carrying the assistant's call and the tool's result is accepted and answered."""
    messages = [
        {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 18, "sky": "clear"}'},
    ]
    r = chat(ctx, mode, messages, tools=openai_tools(["get_weather"]))
    c = r.first
    bad = r.problems + check_calls(c, ["get_weather"])
    if r.usage is None or r.usage.completion_tokens < 1:
        bad.append(f"no answer ({usage_text(r.usage)})")
    ev = f"answered: {len(c.content)} chars, {_calls_text(c)}, finish={c.finish}, {usage_text(r.usage)}"
    return Outcome(FAIL, "; ".join(bad) + f" ({ev})") if bad else Outcome(PASS, ev)


def chat_guided_json(ctx: Context, mode: Mode) -> Outcome:
    """``response_format`` json_schema (guided JSON): the content parses and is valid against the schema, on any
    model."""
    schema = TOOLS["get_weather"]["parameters"]
    rf = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}
    r = chat(ctx, mode, [{"role": "user", "content": "Pick a city as JSON."}], max_tokens=TOOL_MAX_TOKENS,
             response_format=rf)
    c = r.first
    try:
        jsonschema.validate(json.loads(c.content), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return Outcome(FAIL, f"content {c.content[:80]!r} is not schema-valid JSON: {exc} (finish={c.finish})")
    if r.problems:
        return Outcome(FAIL, "; ".join(r.problems))
    return Outcome(PASS, f"{c.content}, finish={c.finish}")


# --- reasoning -------------------------------------------------------------------------------------------------


def reasoning_field(ctx: Context, mode: Mode) -> Outcome:
    """Thinking on: reasoning only in the reasoning field, no think tags in content, streamed reasoning + content
    equal to the non-streamed message. Thinking off: no reasoning. Model-dependent when no reasoning appears at
    all with thinking on (a server without a reasoning parser, or a model that does not think)."""
    r = chat(ctx, mode, PROMPT, max_tokens=64)
    c = r.first
    bad = list(r.problems)
    tags = [t for t in THINK_TAGS if t in c.content]
    if tags:
        bad.append(f"think tags in content: {tags}")
    if mode.thinking is False and c.reasoning:
        bad.append(f"thinking off, yet {len(c.reasoning)} chars of reasoning")
    key = ("reasoning", mode.thinking)
    if not mode.stream:
        ctx.memo[key] = (c.reasoning, c.content)
    elif key in ctx.memo and ctx.memo[key] != (c.reasoning, c.content):
        bad.append("streamed reasoning/content differ from the non-streamed message")
    ev = f"reasoning {len(c.reasoning)} chars, content {len(c.content)} chars"
    if bad:
        return Outcome(FAIL, "; ".join(bad) + f" ({ev})")
    if mode.thinking and not c.reasoning:
        return Outcome(MODEL, f"no reasoning text came back ({ev}): the server has no reasoning parser or the model "
                              "did not think; checked: no think tags in content, streamed = non-streamed")
    return Outcome(PASS, ev + (", streamed = non-streamed" if mode.stream else ""))
