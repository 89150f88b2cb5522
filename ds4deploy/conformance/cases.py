"""The conformance cases: what an OpenAI or Anthropic client (and a coding agent behind one) relies on.

Each case is a function ``(ctx, mode) -> Outcome`` run once per `Mode` it lists (stream on/off x thinking on/off,
where thinking is the chat template switch the recipe names in ``benchmark.thinking_kwargs``). Verdicts:

- ``pass``: the behaviour was seen and is right.
- ``fail``: the server broke the contract (a 500, arguments sent twice, a usage chunk missing, ...).
- ``model-dependent``: the behaviour depends on what the model chooses to generate and this model did not show it
  (the tiny random-weight model never picks a tool by itself); the reason is in the evidence, and everything the
  case could check regardless was checked. Never used for forced modes (``tool_choice`` required or named): those
  constrain the output with a grammar and must pass on every model.
- ``finding``: works as the server is built, but an owner must know it (a route answering without a key, a coding
  agent's request refused with a 4xx, ``/metrics`` open on a non-loopback bind).

Requests are greedy (``temperature`` 0, fixed ``seed``) so a streamed answer can be compared with the non-streamed
one token for token. Every request sets ``max_tokens``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import jsonschema
import openai

from ds4deploy.bench.stream import error_text

PASS, FAIL, MODEL, FINDING = "pass", "fail", "model-dependent", "finding"
VERDICTS = (PASS, FAIL, MODEL, FINDING)

SEED = 1234
# Text that only a tool-call or reasoning parser (or a chat template) emits; none may reach `content`. Hermes/Qwen
# (<tool_call>, <think>), ChatML, DeepSeek V3/V4 (full-width bars), Mistral ([TOOL_CALLS]), Llama 3 (<|python_tag|>).
MARKERS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_start|>", "<|im_end|>",
           "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5cDSML\uff5c",
           "[TOOL_CALLS]", "<|python_tag|>")
THINK_TAGS = ("<think>", "</think>")

# Enum and boolean arguments only: a random-weight model under a JSON grammar closes them in a few tokens, where a
# free string could run to max_tokens.
TOOLS: dict[str, dict] = {
    "get_weather": {
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
                       "required": ["city"], "additionalProperties": False},
    },
    "get_time": {
        "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                       "required": ["zone"], "additionalProperties": False},
    },
    "set_units": {
        "description": "Switch the answer's units",
        "parameters": {"type": "object", "properties": {"metric": {"type": "boolean"}},
                       "required": ["metric"], "additionalProperties": False},
    },
}
ASK_WEATHER = "What is the weather in Paris? Use the tool."
TOOL_MAX_TOKENS = 128
TEXT_MAX_TOKENS = 32


def openai_tools(names: list[str]) -> list[dict]:
    """`TOOLS` entries in the OpenAI ``tools`` shape."""
    return [{"type": "function", "function": {"name": n, **TOOLS[n]}} for n in names]


def anthropic_tools(names: list[str]) -> list[dict]:
    """`TOOLS` entries in the Anthropic ``tools`` shape (``input_schema``)."""
    return [{"name": n, "description": TOOLS[n]["description"], "input_schema": TOOLS[n]["parameters"]}
            for n in names]


@dataclass(frozen=True)
class Mode:
    """One cell of the mode matrix. None: the dimension does not apply to the case (left at the server default)."""

    stream: bool | None = None
    thinking: bool | None = None

    @property
    def label(self) -> str:
        """``stream``/``no-stream`` and ``think``/``no-think``, joined by ``+``; ``-`` when neither applies."""
        parts = []
        if self.stream is not None:
            parts.append("stream" if self.stream else "no-stream")
        if self.thinking is not None:
            parts.append("think" if self.thinking else "no-think")
        return "+".join(parts) or "-"


ALL_MODES = [Mode(s, t) for t in (False, True) for s in (False, True)]  # non-streamed first: streams compare to it
STREAM_MODES = [Mode(False), Mode(True)]
ONE = [Mode()]


@dataclass
class Outcome:
    """A case's verdict in one mode and the evidence for it (numbers, the server's message)."""

    verdict: str
    evidence: str


@dataclass
class Context:
    """What every case needs: the server, its clients and facts about it.

    Attributes:
        url: base URL without ``/v1``.
        key: the API key (None: the server takes none).
        model: served model name.
        max_model_len: the server's context in tokens (from /v1/models or the recipe).
        thinking_kwargs: ``chat_template_kwargs`` names that switch thinking.
        bind_loopback: whether the server listens on loopback only (None: not known).
        bind_source: where `bind_loopback` came from, for the evidence.
        shapes: recorded request shapes to replay (`ds4deploy.conformance.record.Shape`).
        memo: results of earlier modes (the non-streamed answer a streamed one must equal).
    """

    url: str
    key: str | None
    model: str
    max_model_len: int | None
    thinking_kwargs: list[str]
    bind_loopback: bool | None
    bind_source: str
    shapes: list = field(default_factory=list)
    timeout_s: float = 120.0
    memo: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.oai = openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key or "none", timeout=self.timeout_s,
                                 max_retries=0)
        # Bearer (auth_token), as vLLM checks it; api_key would send x-api-key, which vLLM refuses.
        self.anth = anthropic.Anthropic(base_url=self.url, api_key=None, auth_token=self.key or "none",
                                        timeout=self.timeout_s, max_retries=0)
        self.http = httpx.Client(base_url=self.url, headers=self.auth(), timeout=self.timeout_s)

    def auth(self) -> dict[str, str]:
        """The bearer header of the key (empty without a key)."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def close(self) -> None:
        """Close the clients' connection pools."""
        self.http.close()
        self.oai.close()
        self.anth.close()

    def template_kwargs(self, mode: Mode) -> dict:
        """``extra_body`` switching thinking per the mode (empty when the mode leaves it at the server default)."""
        if mode.thinking is None:
            return {}
        return {"chat_template_kwargs": {k: mode.thinking for k in self.thinking_kwargs}}


# --- collecting an answer, streamed or not ---------------------------------------------------------------------


@dataclass
class Call:
    """One tool call as the client assembled it; `names`/`ids` count how often the stream sent each."""

    id: str | None = None
    name: str | None = None
    arguments: str = ""
    names: int = 0
    ids: int = 0


@dataclass
class Choice:
    """One choice of a chat completion, streamed or not, in one shape."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, Call] = field(default_factory=dict)
    finish: str | None = None
    finishes: int = 0


@dataclass
class Reply:
    """A chat completion as the client saw it: choices by index, usage, and stream anomalies found on the way."""

    choices: dict[int, Choice] = field(default_factory=dict)
    usage: Any = None
    usage_chunks: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def first(self) -> Choice:
        """Choice 0 (an empty one when the server sent none)."""
        return self.choices.get(0, Choice())


def _reasoning(obj: Any) -> str:
    """The reasoning text of a message or delta: ``reasoning`` (vLLM >= 0.10) or ``reasoning_content``."""
    extra = getattr(obj, "model_extra", None) or {}
    return extra.get("reasoning") or extra.get("reasoning_content") or ""


def collect(resp: Any, stream: bool) -> Reply:
    """A `Reply` from an OpenAI SDK chat completion (`stream` False) or its chunk iterator (True). While streaming
    it records what a client must never see: a function name or a call id sent twice, a finish_reason twice."""
    out = Reply()
    if not stream:
        for ch in resp.choices:
            c = out.choices.setdefault(ch.index, Choice())
            c.content = ch.message.content or ""
            c.reasoning = _reasoning(ch.message)
            for i, tc in enumerate(ch.message.tool_calls or []):
                c.calls[i] = Call(tc.id, tc.function.name, tc.function.arguments or "", 1, 1)
            c.finish, c.finishes = ch.finish_reason, 1
        out.usage, out.usage_chunks = resp.usage, int(resp.usage is not None)
        return out
    for chunk in resp:
        if chunk.usage is not None:
            out.usage = chunk.usage
            out.usage_chunks += 1
            if chunk.choices:
                out.problems.append("the usage chunk also carries choices")
        for ch in chunk.choices:
            c = out.choices.setdefault(ch.index, Choice())
            d = ch.delta
            c.content += d.content or ""
            c.reasoning += _reasoning(d)
            for tc in d.tool_calls or []:
                call = c.calls.setdefault(tc.index, Call())
                if tc.id:
                    call.ids += 1
                    if call.id and call.id != tc.id:
                        out.problems.append(f"tool call {tc.index} got a second id ({call.id} then {tc.id})")
                    call.id = call.id or tc.id
                if tc.function is not None and tc.function.name:
                    call.names += 1
                    if call.names > 1:
                        out.problems.append(f"tool call {tc.index}: function name sent {call.names} times")
                    call.name = call.name or tc.function.name
                if tc.function is not None and tc.function.arguments:
                    call.arguments += tc.function.arguments
            if ch.finish_reason:
                c.finish = ch.finish_reason
                c.finishes += 1
                if c.finishes > 1:
                    out.problems.append(f"choice {ch.index}: finish_reason sent {c.finishes} times")
    return out


def chat(ctx: Context, mode: Mode, messages: list[dict], max_tokens: int = TEXT_MAX_TOKENS, **kw) -> Reply:
    """One greedy chat completion through the OpenAI SDK in `mode` (streamed with ``include_usage``)."""
    extra = {**ctx.template_kwargs(mode), **kw.pop("extra_body", {})}
    args = {"model": ctx.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": SEED, **kw}
    if extra:
        args["extra_body"] = extra
    if mode.stream:
        return collect(ctx.oai.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}),
                       True)
    return collect(ctx.oai.chat.completions.create(**args), False)


def sse(resp: httpx.Response) -> Iterator[tuple[str | None, str]]:
    """(event name, data) of each server-sent event of a streamed httpx response (comments and blank lines
    skipped); the event name is None when the server sent only ``data:``."""
    event: str | None = None
    data: list[str] = []
    for line in resp.iter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        yield event, "\n".join(data)


def _usage(u: Any) -> str:
    return f"usage {u.prompt_tokens}+{u.completion_tokens}={u.total_tokens}" if u is not None else "no usage"


def _markers(text: str) -> list[str]:
    return [m for m in MARKERS if m in text]


# --- OpenAI chat -----------------------------------------------------------------------------------------------


PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]
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
        bad.append(f"usage does not add up: {_usage(u)}")
    if c.finish not in ("stop", "length"):
        bad.append(f"finish_reason {c.finish!r}")
    if mode.stream and r.usage_chunks != 1:
        bad.append(f"{r.usage_chunks} usage chunks")
    if leaked := _markers(c.content):
        bad.append(f"markers in content: {leaked}")
    ev = f"{len(c.content)} chars, finish={c.finish}, {_usage(u)}"
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
    ev = f"finish={c.finish}, {_usage(u)}"
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
    ev = f"finish={c.finish}, {_usage(u)}"
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
        bad.append(f"usage {_usage(r.usage)}")
    ev = f"{len(r.choices)} choices, {_usage(r.usage)}"
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


def _check_calls(c: Choice, names: list[str], named: bool = False) -> list[str]:
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
    if leaked := _markers(c.content):
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
    bad = r.problems + _check_calls(c, names, named)
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
        if [(n, _loads(a)) for n, a in shown] != [(n, _loads(a)) for n, a in before]:
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


def _loads(text: str):
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
    bad = r.problems + _check_calls(c, ["get_weather"])
    if r.usage is None or r.usage.completion_tokens < 1:
        bad.append(f"no answer ({_usage(r.usage)})")
    ev = f"answered: {len(c.content)} chars, {_calls_text(c)}, finish={c.finish}, {_usage(r.usage)}"
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


# --- Anthropic /v1/messages ------------------------------------------------------------------------------------


def _msg_body(ctx: Context, **kw) -> dict:
    return {"model": ctx.model, "max_tokens": TEXT_MAX_TOKENS, "messages": PROMPT, **kw}


def _anth_stream_events(ctx: Context, body: dict, path: str = "/v1/messages",
                        headers: dict | None = None) -> tuple[int, list[dict], str]:
    """POST a streamed Messages request; (status, the parsed events, the error text when not 200)."""
    hdr = {"anthropic-version": "2023-06-01", **(headers or {})}
    with ctx.http.stream("POST", path, json={**body, "stream": True}, headers=hdr) as resp:
        if resp.status_code != 200:
            return resp.status_code, [], error_text(resp.read(), resp.status_code)
        events = []
        for name, data in sse(resp):
            ev = json.loads(data)
            if name is not None and name != ev.get("type"):
                ev["_event_name_mismatch"] = name
            events.append(ev)
    return 200, events, ""


def event_order_problems(events: list[dict]) -> list[str]:
    """What is wrong with the order of a Messages stream: message_start first, each content block as
    content_block_start, deltas of its own index, content_block_stop, then message_delta (stop_reason and
    usage.output_tokens) and message_stop last; ``ping`` anywhere. Returns the problems (empty: in order)."""
    bad = []
    evs = [e for e in events if e.get("type") != "ping"]
    if any("_event_name_mismatch" in e for e in events):
        bad.append("an SSE event name differs from its data's type")
    types = [e.get("type") for e in evs]
    if not types or types[0] != "message_start":
        bad.append(f"first event {types[:1]}, not message_start")
    if len(types) < 2 or types[-1] != "message_stop" or types[-2] != "message_delta":
        bad.append(f"stream ends {types[-2:]}, not message_delta, message_stop")
    open_block = None
    seen_blocks = []
    for e in evs[1:-2]:
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
    for label, body in (("text", _msg_body(ctx, temperature=0)),
                        ("tool_use", _msg_body(ctx, temperature=0, max_tokens=TOOL_MAX_TOKENS,
                                               messages=[{"role": "user", "content": ASK_WEATHER}],
                                               tools=anthropic_tools(["get_weather"]),
                                               tool_choice={"type": "tool", "name": "get_weather"}))):
        status, events, err = _anth_stream_events(ctx, body)
        if status != 200:
            bad.append(f"{label}: {err}")
            continue
        bad += [f"{label}: {p}" for p in event_order_problems(events)]
        ev_all.append(f"{label}: {len(events)} events in order")
    return Outcome(FAIL, "; ".join(bad)) if bad else Outcome(PASS, "; ".join(ev_all))


def _tool_use(ctx: Context, mode: Mode, key: str, names: list[str], tool_choice: dict) -> Outcome:
    """Forced tool_use through raw HTTP: a tool_use block with a schema-valid input, stop_reason ``tool_use``;
    streamed, the input_json_delta fragments join to exactly the non-streamed input."""
    body = _msg_body(ctx, temperature=0, max_tokens=TOOL_MAX_TOKENS, tools=anthropic_tools(names),
                     tool_choice=tool_choice, messages=[{"role": "user", "content": ASK_WEATHER}])
    hdr = {"anthropic-version": "2023-06-01"}
    bad: list[str] = []
    if mode.stream:
        status, events, err = _anth_stream_events(ctx, body)
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


def _anth_post(ctx: Context, body: dict, headers: dict | None = None, path: str = "/v1/messages") -> httpx.Response:
    return ctx.http.post(path, json=body, headers={"anthropic-version": "2023-06-01", **(headers or {})})


def _works_or_4xx(r: httpx.Response, what: str, ok_check: Callable[[dict], str] | None = None) -> Outcome:
    """2xx: pass (when `ok_check` returns no problem); 4xx with a message: finding (the refusal, documented in the
    report); 5xx or a 4xx without a message: fail."""
    if r.status_code == 200:
        problem = ok_check(r.json()) if ok_check else ""
        if problem:
            return Outcome(FAIL, f"{what}: {problem}")
        return Outcome(PASS, f"{what}: 200")
    msg = error_text(r.content, r.status_code)
    if 400 <= r.status_code < 500 and msg.split(": ", 1)[-1].strip():
        return Outcome(FINDING, f"{what}: refused, {msg[:220]}")
    return Outcome(FAIL, f"{what}: {msg[:220]}")


def messages_tool_result(ctx: Context, mode: Mode) -> Outcome:
    """A tool_result turn (assistant tool_use, then the user's tool_result block) is accepted and answered."""
    messages = [
        {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": '{"temperature_c": 18}'}]}]},
    ]
    body = _msg_body(ctx, temperature=0, tools=anthropic_tools(["get_weather"]), messages=messages)
    if mode.stream:
        status, events, err = _anth_stream_events(ctx, body)
        if status != 200:
            return Outcome(FAIL, err)
        bad = event_order_problems(events)
        return Outcome(FAIL, "; ".join(bad)) if bad else Outcome(PASS, f"{len(events)} events in order")
    r = _anth_post(ctx, body)
    if r.status_code != 200:
        return Outcome(FAIL, error_text(r.content, r.status_code))
    msg = r.json()
    return Outcome(PASS, f"stop_reason={msg.get('stop_reason')}, usage {msg['usage']['input_tokens']} in / "
                         f"{msg['usage']['output_tokens']} out")


def _input_tokens(ctx: Context, body: dict) -> int | None:
    r = _anth_post(ctx, {**body, "max_tokens": 1})
    return r.json()["usage"]["input_tokens"] if r.status_code == 200 else None


SYSTEM_TEXT = "You are a terse assistant. Answer in French, in one sentence."


def messages_system(ctx: Context, mode: Mode) -> Outcome:
    """``system`` as a string and as text blocks with ``cache_control``: both accepted, both reach the prompt
    (input tokens grow by the same amount over the request without a system prompt)."""
    base = _input_tokens(ctx, _msg_body(ctx))
    as_str = _input_tokens(ctx, _msg_body(ctx, system=SYSTEM_TEXT))
    blocks = [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}}]
    as_blocks = _input_tokens(ctx, _msg_body(ctx, system=blocks))
    ev = f"input tokens: none {base}, string {as_str}, blocks+cache_control {as_blocks}"
    if None in (base, as_str, as_blocks):
        r = _anth_post(ctx, _msg_body(ctx, system=blocks))
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
    r = _anth_post(ctx, _msg_body(ctx, messages=inside, max_tokens=1))
    out = _works_or_4xx(r, "system entry inside messages")
    if out.verdict != PASS:
        return out
    without = _input_tokens(ctx, _msg_body(ctx, messages=convo))
    with_ = r.json()["usage"]["input_tokens"]
    if without is not None and with_ <= without:
        return Outcome(FINDING, f"accepted (200) but dropped: input tokens {with_} with the system entry, {without} "
                                "without (the chat template renders system only in first position)")
    return Outcome(PASS, f"accepted and rendered: input tokens {with_} with, {without} without")


def messages_metadata(ctx: Context, mode: Mode) -> Outcome:
    """``metadata.user_id`` (sent by coding agents): accepted, or a 4xx with a message."""
    return _works_or_4xx(_anth_post(ctx, _msg_body(ctx, metadata={"user_id": "conformance"})), "metadata.user_id")


def messages_thinking(ctx: Context, mode: Mode) -> Outcome:
    """``thinking`` blocks (enabled with a budget, and adaptive): each accepted (thinking text only in thinking
    blocks), or a 4xx with a message; never a 500."""
    outs = []
    # Anthropic's API: budget_tokens >= 1024 and < max_tokens (docs.anthropic.com, extended thinking).
    for label, thinking in (("enabled", {"type": "enabled", "budget_tokens": 1024}),
                            ("adaptive", {"type": "adaptive"})):
        body = _msg_body(ctx, max_tokens=1280, thinking=thinking)
        outs.append(_works_or_4xx(_anth_post(ctx, body), f"thinking {label}", _thinking_problem))
    return _merge(outs)


def _thinking_problem(msg: dict) -> str:
    texts = "".join(b.get("text", "") for b in msg.get("content", []) if b.get("type") == "text")
    tags = [t for t in THINK_TAGS if t in texts]
    return f"think tags in text blocks: {tags}" if tags else ""


def _merge(outs: list[Outcome]) -> Outcome:
    """One outcome of several sub-checks: the worst verdict (fail > finding > model-dependent > pass), all
    evidence."""
    rank = {FAIL: 3, FINDING: 2, MODEL: 1, PASS: 0}
    worst = max(outs, key=lambda o: rank[o.verdict]).verdict
    return Outcome(worst, "; ".join(o.evidence for o in outs))


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
        outs.append(_works_or_4xx(_anth_post(ctx, body, shape.headers, shape.path), f"{shape.name} as recorded"))
        if ctx.max_model_len and body.get("max_tokens", 0) > ctx.max_model_len // 4:
            body["max_tokens"] = max(1, ctx.max_model_len // 4)
            outs.append(_works_or_4xx(_anth_post(ctx, body, shape.headers, shape.path),
                                      f"{shape.name} with max_tokens {body['max_tokens']}"))
    return _merge(outs)


# --- auth and exposure -----------------------------------------------------------------------------------------

# Routes that generate tokens in vLLM's OpenAI-compatible server (vllm/entrypoints/openai/api_server.py and the
# SageMaker-style /invocations of vllm/entrypoints/sagemaker); a 404 means the server does not serve the route.
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/invocations")
# Routes that answer without generating; reachable from the network only when the bind is not loopback.
INFO_ROUTES = (("GET", "/health"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/load"), ("GET", "/ping"),
               ("POST", "/tokenize"), ("POST", "/detokenize"))


def _route_body(ctx: Context, route: str) -> dict:
    if route == "/v1/completions":
        return {"model": ctx.model, "prompt": "hi", "max_tokens": 2}
    if route == "/v1/responses":
        return {"model": ctx.model, "input": "hi", "max_output_tokens": 16}
    return {"model": ctx.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def auth_routes(ctx: Context, mode: Mode) -> Outcome:
    """Every generation route refuses a request without a key and with a wrong key (401). A route answering 200
    without the key is a finding on a loopback bind (only this host reaches it) and a fail otherwise."""
    if not ctx.key:
        return Outcome(FINDING, "the server takes no API key: every route answers whoever reaches it "
                                f"({ctx.bind_source})")
    open_, checked = [], []
    for route in GENERATION_ROUTES:
        codes = []
        for hdr in ({}, {"Authorization": "Bearer not-the-key"}):
            r = httpx.post(f"{ctx.url}{route}", json=_route_body(ctx, route), headers=hdr, timeout=ctx.timeout_s)
            codes.append(r.status_code)
        if codes == [404, 404]:
            continue
        checked.append(f"{route} {codes[0]}/{codes[1]}")
        if any(c != 401 for c in codes):
            open_.append(f"{route} answered {codes[0]} without a key, {codes[1]} with a wrong one")
    if not open_:
        return Outcome(PASS, "401 without / with a wrong key: " + ", ".join(checked))
    verdict = FINDING if ctx.bind_loopback else FAIL
    return Outcome(verdict, "; ".join(open_) + f" ({ctx.bind_source})")


def auth_anthropic_header(ctx: Context, mode: Mode) -> Outcome:
    """The key as Anthropic clients send it: ``Authorization: Bearer`` (ANTHROPIC_AUTH_TOKEN) must work;
    ``x-api-key`` (ANTHROPIC_API_KEY) is either accepted or refused with 401 and a message, as the README says."""
    if not ctx.key:
        return Outcome(PASS, "the server takes no API key")
    body = _msg_body(ctx, max_tokens=2)
    bearer = _anth_post(ctx, body)
    if bearer.status_code != 200:
        return Outcome(FAIL, f"bearer key refused: {error_text(bearer.content, bearer.status_code)}")
    r = httpx.post(f"{ctx.url}/v1/messages", json=body, timeout=ctx.timeout_s,
                   headers={"anthropic-version": "2023-06-01", "x-api-key": ctx.key})
    if r.status_code == 200:
        return Outcome(PASS, "bearer 200, x-api-key 200")
    if r.status_code == 401:
        return Outcome(PASS, f"bearer 200; x-api-key refused as documented ({error_text(r.content, 401)[:120]}): "
                             "Claude Code needs ANTHROPIC_AUTH_TOKEN")
    return Outcome(FAIL, f"x-api-key: {error_text(r.content, r.status_code)}")


def exposure(ctx: Context, mode: Mode) -> Outcome:
    """Routes that answer without a key (/health, /metrics, /tokenize, ...): fine on a loopback bind, a finding
    naming them when the server is reachable from the network."""
    answered = []
    for method, route in INFO_ROUTES:
        body = {"model": ctx.model, "prompt": "hi"} if route == "/tokenize" else {"model": ctx.model, "tokens": [1]}
        r = httpx.request(method, f"{ctx.url}{route}", json=body if method == "POST" else None, timeout=ctx.timeout_s)
        if r.status_code == 200:
            answered.append(route)
    listed = ", ".join(answered) or "none"
    if ctx.bind_loopback:
        return Outcome(PASS, f"without a key: {listed}; loopback only ({ctx.bind_source})")
    return Outcome(FINDING, f"answer anyone who reaches the port without a key: {listed} ({ctx.bind_source})")


@dataclass(frozen=True)
class Case:
    """A named check, the API it speaks, its modes and its function."""

    name: str
    api: str  # openai | anthropic | http
    modes: list[Mode]
    run: Callable[[Context, Mode], Outcome]

    @property
    def doc(self) -> str:
        """The first sentence of the case function's docstring."""
        return (self.run.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")


THINK_MODES = [Mode(None, False), Mode(None, True)]
CASES: list[Case] = [
    Case("chat.basic", "openai", ALL_MODES, chat_basic),
    Case("chat.include_usage", "http", [Mode(True, False)], chat_include_usage),
    Case("chat.finish_length", "openai", STREAM_MODES, chat_finish_length),
    Case("chat.finish_stop", "openai", ALL_MODES, chat_finish_stop),
    Case("chat.stop_sequence", "openai", ALL_MODES, chat_stop_sequence),
    Case("chat.n", "openai", STREAM_MODES, chat_n),
    Case("chat.seed", "openai", STREAM_MODES, chat_seed),
    Case("chat.greedy", "openai", THINK_MODES, chat_greedy),
    Case("chat.max_tokens_over_context", "http", STREAM_MODES, chat_over_context),
    Case("chat.guided_json", "openai", ALL_MODES, chat_guided_json),
    Case("tools.none", "openai", ALL_MODES, tools_none),
    Case("tools.auto", "openai", ALL_MODES, tools_auto),
    Case("tools.required_one", "openai", ALL_MODES, tools_required_one),
    Case("tools.required_several", "openai", ALL_MODES, tools_required_several),
    Case("tools.named", "openai", ALL_MODES, tools_named),
    Case("tools.parallel", "openai", ALL_MODES, tools_parallel),
    Case("tools.result_turn", "openai", ALL_MODES, tools_result_turn),
    Case("reasoning.field", "openai", ALL_MODES, reasoning_field),
    Case("messages.text", "anthropic", STREAM_MODES, messages_text),
    Case("messages.stream_events", "http", [Mode(True)], messages_stream_events),
    Case("messages.tool_named", "http", STREAM_MODES, messages_tool_named),
    Case("messages.tool_any", "http", STREAM_MODES, messages_tool_any),
    Case("messages.tool_result", "http", STREAM_MODES, messages_tool_result),
    Case("messages.system", "http", ONE, messages_system),
    Case("messages.system_in_messages", "http", ONE, messages_system_in_messages),
    Case("messages.metadata", "http", ONE, messages_metadata),
    Case("messages.thinking", "http", ONE, messages_thinking),
    Case("messages.recorded_shapes", "http", ONE, messages_recorded_shapes),
    Case("auth.generation_routes", "http", ONE, auth_routes),
    Case("auth.anthropic_header", "http", ONE, auth_anthropic_header),
    Case("exposure.keyless_routes", "http", ONE, exposure),
]
