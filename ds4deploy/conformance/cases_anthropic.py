"""The Anthropic Messages cases (`/v1/messages`): text through the SDK, the raw event order of a stream, forced
tool_use with enum arguments, tool_result turns, system prompts, metadata, thinking and the recorded coding-agent
request shapes."""

from __future__ import annotations

import copy
import json

import jsonschema

from ds4deploy.bench.stream import error_text
from ds4deploy.conformance.common import (
    ASK_WEATHER,
    FAIL,
    FINDING,
    PASS,
    PROMPT,
    TEXT_MAX_TOKENS,
    THINK_TAGS,
    TOOL_MAX_TOKENS,
    TOOLS,
    Context,
    Mode,
    Outcome,
    anth_post,
    anth_stream_events,
    anthropic_tools,
    merge,
    msg_body,
    works_or_4xx,
)

# --- Anthropic /v1/messages ------------------------------------------------------------------------------------


def event_order_problems(events: list[dict]) -> list[str]:
    """What is wrong with the order of a Messages stream: message_start first, each content block as
    content_block_start, deltas of its own index, content_block_stop, then message_delta (stop_reason and
    usage.output_tokens) and message_stop last; ``ping`` anywhere. Returns the problems (empty: in order)."""
    bad = []
    evs = [e for e in events if e.get("type") != "ping"]
    if any("_event_name_mismatch" in e for e in events):
        bad.append("an SSE event name differs from its data's type")
    # An error event, with what it says: Anthropic's {"type": "error", "error": {"message"}}, or llama-server's
    # `event: error` carrying {"code", "message", "type": "server_error"} (tools/server/server-context.cpp at the
    # pinned llama.cpp commit).
    for e in evs:
        if e.get("type") in ("error", "server_error"):
            err = e["error"] if isinstance(e.get("error"), dict) else e
            bad.append(f"error event: {str(err.get('message') or err)[:200]}")
    types = [e.get("type") for e in evs]
    started = bool(types) and types[0] == "message_start"
    if not started:
        # One problem, not one per later event: the blocks are then checked from the first event on.
        bad.append(f"first event {types[:1]}, not message_start")
    if len(types) < 2 or types[-1] != "message_stop" or types[-2] != "message_delta":
        bad.append(f"stream ends {types[-2:]}, not message_delta, message_stop")
    open_block = None
    seen_blocks = []
    for e in evs[1 if started else 0:-2]:
        t = e.get("type")
        if t == "content_block_start":
            if open_block is not None:
                bad.append(f"block {e.get('index')} starts before block {open_block} stops")
            open_block = e.get("index")
            seen_blocks.append(open_block)
        elif t == "content_block_delta":
            if e.get("index") != open_block:
                bad.append(f"delta for block {e.get('index')} while block {open_block} is open")
        elif t == "content_block_stop":
            if e.get("index") != open_block:
                bad.append(f"stop for block {e.get('index')} while block {open_block} is open")
            open_block = None
        else:
            bad.append(f"unexpected {t} between message_start and message_delta")
    if open_block is not None:
        bad.append(f"block {open_block} never stops")
    if seen_blocks != list(range(len(seen_blocks))):
        bad.append(f"block indexes {seen_blocks}")
    delta = next((e for e in evs if e.get("type") == "message_delta"), {})
    if not (delta.get("delta") or {}).get("stop_reason"):
        bad.append("message_delta has no stop_reason")
    if (delta.get("usage") or {}).get("output_tokens") is None:
        bad.append("message_delta has no usage.output_tokens")
    return bad


def messages_text(ctx: Context, mode: Mode) -> Outcome:
    """Text through the Anthropic SDK: a text block, usage, a stop_reason; streamed, the SDK's text stream equals
    the final message's text."""
    kw = {"model": ctx.model, "max_tokens": TEXT_MAX_TOKENS, "messages": PROMPT}
    if mode.stream:
        with ctx.anth.messages.stream(**kw) as s:
            text = "".join(s.text_stream)
            msg = s.get_final_message()
        if text != "".join(b.text for b in msg.content if b.type == "text"):
            return Outcome(FAIL, "the streamed text differs from the final message")
    else:
        msg = ctx.anth.messages.create(**kw)
    bad = []
    if not msg.content or msg.content[0].type != "text":
        bad.append(f"content blocks {[b.type for b in msg.content]}")
    if msg.stop_reason not in ("end_turn", "max_tokens"):
        bad.append(f"stop_reason {msg.stop_reason!r}")
    if not (msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0):
        bad.append(f"usage {msg.usage.input_tokens} in / {msg.usage.output_tokens} out")
    ev = f"stop_reason={msg.stop_reason}, usage {msg.usage.input_tokens} in / {msg.usage.output_tokens} out"
    return Outcome(FAIL, "; ".join(bad) + f" ({ev})") if bad else Outcome(PASS, ev)


def messages_stream_events(ctx: Context, mode: Mode) -> Outcome:
    """Raw SSE of a streamed Messages request, text and forced tool_use: the event order a client's parser
    expects."""
    ev_all, bad = [], []
    for label, body in (("text", msg_body(ctx, temperature=0)),
                        ("tool_use", msg_body(ctx, temperature=0, max_tokens=TOOL_MAX_TOKENS,
                                               messages=[{"role": "user", "content": ASK_WEATHER}],
                                               tools=anthropic_tools(["get_weather"]),
                                               tool_choice={"type": "tool", "name": "get_weather"}))):
        status, events, err = anth_stream_events(ctx, body)
        if status != 200:
            bad.append(f"{label}: {err}")
            continue
        bad += [f"{label}: {p}" for p in event_order_problems(events)]
        ev_all.append(f"{label}: {len(events)} events in order")
    return Outcome(FAIL, "; ".join(bad)) if bad else Outcome(PASS, "; ".join(ev_all))


def _tool_use(ctx: Context, mode: Mode, key: str, names: list[str], tool_choice: dict) -> Outcome:
    """Forced tool_use through raw HTTP: a tool_use block with a schema-valid input, stop_reason ``tool_use``;
    streamed, the input_json_delta fragments join to exactly the non-streamed input."""
    body = msg_body(ctx, temperature=0, max_tokens=TOOL_MAX_TOKENS, tools=anthropic_tools(names),
                     tool_choice=tool_choice, messages=[{"role": "user", "content": ASK_WEATHER}])
    hdr = {"anthropic-version": "2023-06-01"}
    bad: list[str] = []
    if mode.stream:
        status, events, err = anth_stream_events(ctx, body)
        if status != 200:
            return Outcome(FAIL, err)
        bad += event_order_problems(events)
        blocks: dict[int, dict] = {}
        for e in events:
            if e.get("type") == "content_block_start":
                blocks[e["index"]] = {**e["content_block"], "_json": ""}
            elif e.get("type") == "content_block_delta" and e["delta"].get("type") == "input_json_delta":
                blocks[e["index"]]["_json"] += e["delta"].get("partial_json", "")
        uses = []
        for b in blocks.values():
            if b.get("type") == "tool_use":
                try:
                    uses.append((b.get("name"), json.loads(b["_json"] or "{}"), b.get("id")))
                except json.JSONDecodeError as exc:
                    bad.append(f"input_json_delta fragments do not join to JSON ({exc.msg}): {b['_json'][:80]!r}")
        stop = next((e["delta"].get("stop_reason") for e in events if e.get("type") == "message_delta"), None)
    else:
        r = ctx.http.post("/v1/messages", json=body, headers=hdr)
        if r.status_code != 200:
            return Outcome(FAIL, error_text(r.content, r.status_code))
        msg = r.json()
        uses = [(b.get("name"), b.get("input"), b.get("id")) for b in msg["content"] if b.get("type") == "tool_use"]
        stop = msg.get("stop_reason")
    if not uses:
        bad.append(f"tool_choice {json.dumps(tool_choice)} gave no tool_use block")
    for name, inp, uid in uses:
        if name not in names:
            bad.append(f"unknown tool {name!r}")
            continue
        if not uid:
            bad.append("tool_use without id")
        try:
            jsonschema.validate(inp, TOOLS[name]["parameters"])
        except jsonschema.ValidationError as exc:
            bad.append(f"input {inp} breaks {name}'s schema: {exc.message}")
    if tool_choice.get("type") == "tool" and any(u[0] != tool_choice["name"] for u in uses):
        bad.append(f"named {tool_choice['name']}, got {[u[0] for u in uses]}")
    if uses and stop != "tool_use":
        bad.append(f"stop_reason {stop!r} with a tool_use block")
    shown = [(n, i) for n, i, _ in uses]
    memo_key = (key, mode.thinking)
    if not mode.stream:
        ctx.memo[memo_key] = shown
    elif memo_key in ctx.memo and ctx.memo[memo_key] != shown:
        bad.append(f"streamed input {shown} differs from the non-streamed {ctx.memo[memo_key]}")
    ev = f"{', '.join(f'{n}({json.dumps(i)})' for n, i in shown) or 'no tool_use'}, stop_reason={stop}"
    if bad:
        return Outcome(FAIL, "; ".join(bad) + f" ({ev})")
    return Outcome(PASS, ev + (" = non-streamed" if mode.stream and memo_key in ctx.memo else ""))


def messages_tool_named(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` {type: tool, name}: a tool_use of that tool; streamed input = non-streamed."""
    return _tool_use(ctx, mode, "m-named", list(TOOLS), {"type": "tool", "name": "get_weather"})


def messages_tool_any(ctx: Context, mode: Mode) -> Outcome:
    """``tool_choice`` {type: any} among three tools: one valid tool_use; streamed input = non-streamed."""
    return _tool_use(ctx, mode, "m-any", list(TOOLS), {"type": "any"})


def messages_tool_result(ctx: Context, mode: Mode) -> Outcome:
    """A tool_result turn (assistant tool_use, then the user's tool_result block) is accepted and answered."""
    messages = [
        {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": '{"temperature_c": 18}'}]}]},
    ]
    body = msg_body(ctx, temperature=0, tools=anthropic_tools(["get_weather"]), messages=messages)
    if mode.stream:
        status, events, err = anth_stream_events(ctx, body)
        if status != 200:
            return Outcome(FAIL, err)
        bad = event_order_problems(events)
        return Outcome(FAIL, "; ".join(bad)) if bad else Outcome(PASS, f"{len(events)} events in order")
    r = anth_post(ctx, body)
    if r.status_code != 200:
        return Outcome(FAIL, error_text(r.content, r.status_code))
    msg = r.json()
    return Outcome(PASS, f"stop_reason={msg.get('stop_reason')}, usage {msg['usage']['input_tokens']} in / "
                         f"{msg['usage']['output_tokens']} out")


def _input_tokens(ctx: Context, body: dict) -> int | None:
    """Every prompt token of the request: ``input_tokens`` plus ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``, which the Messages API counts apart from it ("total input tokens" is their sum:
    https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching, "Tracking cache performance"). A server
    with a prompt cache reports the repeated part as a cache read (llama-server reuses a slot's cached prefix; vLLM's
    vllm/entrypoints/anthropic/serving.py subtracts cached tokens from ``input_tokens`` too), so ``input_tokens``
    alone shrinks on the second of two similar requests. None when the request is refused."""
    r = anth_post(ctx, {**body, "max_tokens": 1})
    if r.status_code != 200:
        return None
    usage = r.json()["usage"]
    return usage["input_tokens"] + sum(usage.get(k) or 0 for k in ("cache_read_input_tokens",
                                                                    "cache_creation_input_tokens"))


SYSTEM_TEXT = "You are a terse assistant. Answer in French, in one sentence."


def messages_system(ctx: Context, mode: Mode) -> Outcome:
    """``system`` as a string and as text blocks with ``cache_control``: both accepted, both reach the prompt
    (input tokens grow by the same amount over the request without a system prompt)."""
    base = _input_tokens(ctx, msg_body(ctx))
    as_str = _input_tokens(ctx, msg_body(ctx, system=SYSTEM_TEXT))
    blocks = [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}}]
    as_blocks = _input_tokens(ctx, msg_body(ctx, system=blocks))
    ev = f"input tokens: none {base}, string {as_str}, blocks+cache_control {as_blocks}"
    if None in (base, as_str, as_blocks):
        r = anth_post(ctx, msg_body(ctx, system=blocks))
        return Outcome(FAIL, f"{ev}; {error_text(r.content, r.status_code)}")
    if not (as_str > base and as_blocks > base):
        return Outcome(FAIL, f"the system prompt does not reach the model ({ev})")
    return Outcome(PASS, ev)


def messages_system_in_messages(ctx: Context, mode: Mode) -> Outcome:
    """A ``system`` entry inside ``messages`` (coding agents send one): accepted or a 4xx, never a 500; if accepted,
    its text must reach the prompt (a finding when it is silently dropped)."""
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "again"}]
    inside = [*convo[:2], {"role": "system", "content": SYSTEM_TEXT}, convo[2]]
    r = anth_post(ctx, msg_body(ctx, messages=inside, max_tokens=1))
    out = works_or_4xx(r, "system entry inside messages")
    if out.verdict != PASS:
        return out
    without = _input_tokens(ctx, msg_body(ctx, messages=convo))
    with_ = r.json()["usage"]["input_tokens"]
    if without is not None and with_ <= without:
        return Outcome(FINDING, f"accepted (200) but dropped: input tokens {with_} with the system entry, {without} "
                                "without (the chat template renders system only in first position)")
    return Outcome(PASS, f"accepted and rendered: input tokens {with_} with, {without} without")


def messages_metadata(ctx: Context, mode: Mode) -> Outcome:
    """``metadata.user_id`` (sent by coding agents): accepted, or a 4xx with a message."""
    return works_or_4xx(anth_post(ctx, msg_body(ctx, metadata={"user_id": "conformance"})), "metadata.user_id")


def messages_thinking(ctx: Context, mode: Mode) -> Outcome:
    """``thinking`` blocks (enabled with a budget, and adaptive): each accepted (thinking text only in thinking
    blocks), or a 4xx with a message; never a 500."""
    outs = []
    # Anthropic's API: budget_tokens >= 1024 and < max_tokens (docs.anthropic.com, extended thinking).
    for label, thinking in (("enabled", {"type": "enabled", "budget_tokens": 1024}),
                            ("adaptive", {"type": "adaptive"})):
        body = msg_body(ctx, max_tokens=1280, thinking=thinking)
        outs.append(works_or_4xx(anth_post(ctx, body), f"thinking {label}", _thinking_problem))
    return merge(outs)


def _thinking_problem(msg: dict) -> str:
    texts = "".join(b.get("text", "") for b in msg.get("content", []) if b.get("type") == "text")
    tags = [t for t in THINK_TAGS if t in texts]
    return f"think tags in text blocks: {tags}" if tags else ""


def messages_recorded_shapes(ctx: Context, mode: Mode) -> Outcome:
    """Every recorded coding-agent request (ds4deploy/data/agent_shapes/ and ``--shapes``), replayed with the
    served model name: as recorded (``max_tokens`` too), and with ``max_tokens`` fitted to the context so the rest
    of the shape is tried. Each works or gets a 4xx with a message (a finding naming the refusal), never a 500."""
    if not ctx.shapes:
        return Outcome(PASS, "no recorded shapes to replay")
    outs = []
    for shape in ctx.shapes:
        body = copy.deepcopy(shape.body)
        body["model"] = ctx.model
        body.pop("stream", None)
        outs.append(works_or_4xx(anth_post(ctx, body, shape.headers, shape.path), f"{shape.name} as recorded"))
        if ctx.max_model_len and body.get("max_tokens", 0) > ctx.max_model_len // 4:
            body["max_tokens"] = max(1, ctx.max_model_len // 4)
            outs.append(works_or_4xx(anth_post(ctx, body, shape.headers, shape.path),
                                      f"{shape.name} with max_tokens {body['max_tokens']}"))
    return merge(outs)
