"""What every conformance case shares: verdicts, modes, the server context and its clients, collecting a chat
completion (streamed or not) into one shape, the raw-HTTP helpers of the Messages API, and `Case`.

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

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai

from ds4deploy.bench.stream import error_text

PASS, FAIL, MODEL, FINDING = "pass", "fail", "model-dependent", "finding"
# The evidence of a row whose SDK stream helper asserted (`ds4deploy.conformance.runner.run_case`): anthropic's
# MessageStream.get_final_message asserts that a message_start came (anthropic/lib/streaming/_messages.py). The
# llama.cpp rule "stream-without-message-start" (engine_rules) matches this text.
NO_MESSAGE_START_SDK = ("the client's stream helper could not build the message (AssertionError{detail}): the stream "
                        "lacked an event it needs, e.g. no message_start")
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
PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]


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
        headers: sent with every request of the SDK clients and `http` besides the key (``--header``: a gateway's
            session header keeps the whole matrix on one backend, as one Claude Code session is kept).
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
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.oai = openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key or "none", timeout=self.timeout_s,
                                 max_retries=0, default_headers=self.headers or None)
        # Bearer (auth_token), as vLLM checks it; api_key would send x-api-key, which vLLM refuses.
        self.anth = anthropic.Anthropic(base_url=self.url, api_key=None, auth_token=self.key or "none",
                                        timeout=self.timeout_s, max_retries=0, default_headers=self.headers or None)
        self.http = httpx.Client(base_url=self.url, headers={**self.headers, **self.auth()}, timeout=self.timeout_s)

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


def reasoning_of(obj: Any) -> str:
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
            c.reasoning = reasoning_of(ch.message)
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
            c.reasoning += reasoning_of(d)
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


def usage_text(u: Any) -> str:
    return f"usage {u.prompt_tokens}+{u.completion_tokens}={u.total_tokens}" if u is not None else "no usage"


def markers_in(text: str) -> list[str]:
    return [m for m in MARKERS if m in text]




# --- shared by the case modules ------------------------------------------------------------------------------


def msg_body(ctx: Context, **kw) -> dict:
    return {"model": ctx.model, "max_tokens": TEXT_MAX_TOKENS, "messages": PROMPT, **kw}


def anth_stream_events(ctx: Context, body: dict, path: str = "/v1/messages",
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


def anth_post(ctx: Context, body: dict, headers: dict | None = None, path: str = "/v1/messages") -> httpx.Response:
    return ctx.http.post(path, json=body, headers={"anthropic-version": "2023-06-01", **(headers or {})})


def works_or_4xx(r: httpx.Response, what: str, ok_check: Callable[[dict], str] | None = None) -> Outcome:
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


def merge(outs: list[Outcome]) -> Outcome:
    """One outcome of several sub-checks: the worst verdict (fail > finding > model-dependent > pass), all
    evidence."""
    rank = {FAIL: 3, FINDING: 2, MODEL: 1, PASS: 0}
    worst = max(outs, key=lambda o: rank[o.verdict]).verdict
    return Outcome(worst, "; ".join(o.evidence for o in outs))


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
        return " ".join((self.run.__doc__ or "").strip().split("\n\n")[0].split())


THINK_MODES = [Mode(None, False), Mode(None, True)]
