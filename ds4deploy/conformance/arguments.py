"""Realistic tool-call arguments, forced by the request's own schema, and the byte-exact checks on them.

A coding agent's tool calls carry shell commands with pipes and redirections, whole files, unicode, JSON inside
strings and nested objects; a parser that cuts, re-encodes, duplicates or leaks any of it breaks the agent. Each
`ArgCase` is one such argument object. Its tool's schema pins every property to that exact value (``const``), so
under guided decoding (``tool_choice`` required or named, a grammar built from the schema) even the tiny
random-weight model must emit it byte for byte: whatever differs was changed by the server, never chosen by the
model.

`first_diff` and `compare_arguments` name the first differing byte (UTF-8 offset) of two argument texts, so a
failure says where the server cut, doubled or re-encoded the arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ds4deploy.bench.stream import error_text
from ds4deploy.conformance.cases_anthropic import event_order_problems
from ds4deploy.conformance.cases_openai import NAMED_FINISH
from ds4deploy.conformance.common import (
    ALL_MODES,
    FAIL,
    MARKERS,
    PASS,
    Case,
    Context,
    Mode,
    Outcome,
    anth_post,
    anth_stream_events,
    chat,
    msg_body,
    usage_text,
)

# DeepSeek V4's tool-call markup (DSML, vllm/tokenizers/deepseek_v4_encoding.py and the checkpoint's
# encoding/encoding_dsv4.py: dsml_token "<U+FF5C>DSML<U+FF5C>", full-width bars), DeepSeek V3's special tokens (bars
# U+FF5C, spaces U+2581) and the Hermes/Qwen markup the cpu recipe's parser reads: strings that carry them must reach
# the client as data, never be taken as markup.
DSML = "\uff5cDSML\uff5c"
V3_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
V3_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
V3_SEP = "<\uff5ctool\u2581sep\uff5c>"


def _file_text(size: int) -> str:
    """About `size` characters of a text file: the bundled corpus (prose the cpu model's tokenizer was trained on,
    so it costs few tokens) wrapped as a Python module with quotes, tabs, backslashes and a trailing newline."""
    corpus = resources.files("ds4deploy.data").joinpath("corpus.txt").read_text(encoding="utf-8")
    head = ('"""Notes kept beside the deploy.\n\nQuoted: "double", \'single\', `back`; a tab:\there; '
            'a path C:\\\\srv\\\\ds4.\n"""\n\nNOTES = r"""\n')
    tail = '"""\n\n\ndef main() -> int:\n    print("done\\n")\n    return 0\n'
    body = (corpus * (size // len(corpus) + 1))[: max(0, size - len(head) - len(tail))]
    return head + body + tail


@dataclass(frozen=True)
class ArgCase:
    """One argument object a coding agent's tool call carries.

    Attributes:
        name: short name, the case is ``args.<name>``.
        tool: the tool's name.
        what: what the arguments exercise (for the report).
        args: the exact arguments object (JSON-compatible; key order is the order the schema lists them).
        live: also sent to the server (False: too long for the cpu recipe's output cap, offline parsers only).
    """

    name: str
    tool: str
    what: str
    args: dict[str, Any]
    live: bool = True

    def schema(self) -> dict:
        """The tool's parameter schema: every property ``const`` to its value, all required, nothing else."""
        return {"type": "object", "properties": {k: {"type": json_type(v), "const": v} for k, v in self.args.items()},
                "required": list(self.args), "additionalProperties": False}

    def openai_tool(self) -> dict:
        """The tool in the OpenAI ``tools`` shape."""
        return {"type": "function", "function": {"name": self.tool, "description": self.what,
                                                 "parameters": self.schema()}}

    def anthropic_tool(self) -> dict:
        """The tool in the Anthropic ``tools`` shape."""
        return {"name": self.tool, "description": self.what, "input_schema": self.schema()}

    @property
    def text(self) -> str:
        """The arguments as compact JSON text, unicode kept (what a server that streams the model's JSON emits)."""
        return canonical(self.args)

    def needles(self) -> list[str]:
        """Distinctive pieces of the arguments (string values of 8+ characters, their first 24 characters): none may
        appear in content or reasoning."""
        out: list[str] = []

        def walk(v: Any) -> None:
            if isinstance(v, str) and len(v.strip()) >= 8:
                out.append(v[:24])
            elif isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)

        walk(self.args)
        return out


# The cpu recipe's output cap (1,024 tokens, below) holds about 1,450 bytes of JSON-escaped file text in the tiny
# model's byte-level tokens (measured: 3,000- and 1,400-character files were cut at 1,578 and 1,479 bytes of
# arguments); the live case stays well under it, the offline parsers get a file of several KB as well.
FILE_BYTES = 1000
LARGE_FILE_BYTES = 8000
ARG_CASES: list[ArgCase] = [
    ArgCase("shell", "run_shell", "a shell command: pipes, 2>&1, quotes, backslashes, a newline, $VAR and globs",
            {"command": "cd /srv/app && grep -rn \"TODO\" src/ 2>&1 | sort -u | head -n 20 > /tmp/todo.txt; "
                        "printf 'a\\tb\\n' | sed -e 's/\\\\t/ /g' && echo \"$HOME\" *.py\nmake test 2>&1 | tail -5",
             "timeout_s": 120}),
    ArgCase("shell_tail", "run_shell", "a command that ends in 2>&1 (the reported trigger of markup leaking into "
                                        "streamed arguments)",
            {"command": "ssh build@ci-runner 'cd /srv/app && git pull && make test' 2>&1"}),
    ArgCase("file", "write_file", f"a {FILE_BYTES}-character file: newlines, quotes, tabs, backslashes",
            {"path": "src/notes.py", "content": _file_text(FILE_BYTES)}),
    ArgCase("file_large", "write_file", f"a {LARGE_FILE_BYTES}-character file (offline parsers only: longer than "
                                        "the cpu recipe's output cap)",
            {"path": "src/notes.py", "content": _file_text(LARGE_FILE_BYTES)}, live=False),
    ArgCase("unicode", "post_note", "unicode: accents, CJK, emoji (astral plane, ZWJ sequence), RTL, zero-width space",
            {"text": "Gr\u00fc\u00dfe aus K\u00f6ln \u2014 \u6771\u4eac\u3067\u4f1a\u3044\u307e\u3057\u3087\u3046 "
                     "\U0001F680\U0001F468\u200D\U0001F4BB \u0645\u0631\u062d\u0628\u0627 caf\u00e9\u200b\u2713"}),
    ArgCase("json_string", "http_post", "JSON text inside a string (escaped quotes, backslashes, nested braces)",
            {"url": "http://127.0.0.1:9/hook", "body": json.dumps({"a": [1, 2, {"b": "c\"d\\e"}], "e": None,
                                                                    "f": "{not: json}"})}),
    ArgCase("nested", "configure", "nested objects and arrays, empty ones included",
            {"config": {"retries": 3, "hosts": ["a.local", "b.local"], "tls": {"verify": True, "ca": None},
                        "empty": {}}, "matrix": [[1, 2], [], [{"k": "v"}]]}),
    ArgCase("scalars", "set_limits", "numbers (negative, fraction, large), booleans and null",
            {"count": 42, "ratio": -0.125, "big": 1234567890123, "zero": 0, "enabled": True, "dry_run": False,
             "parent": None}),
    ArgCase("markup_dsml", "save_snippet", "strings carrying DeepSeek's own tool-call markup: V4 DSML, V3 tokens",
            {"dsml": f"<{DSML}tool_calls>\n<{DSML}invoke name=\"x\">\n<{DSML}parameter name=\"y\" string=\"true\">z"
                     f"</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>",
             "v3": f"{V3_CALLS_BEGIN}{V3_CALL_BEGIN}function{V3_SEP}x"}),
    ArgCase("markup_other", "save_snippet", "strings carrying Hermes/Qwen tool-call markup and think tags",
            {"hermes": "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>",
             "think": "</think> done <think>"}),
]


def json_type(value: Any) -> str:
    """The JSON Schema type of a JSON-compatible Python value (what a real tool declares beside the value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}[type(value)]


def canonical(value: Any) -> str:
    """`value` as compact JSON, unicode kept, keys in their order: the form two argument texts are compared in."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def first_diff(got: str, want: str) -> int | None:
    """The UTF-8 byte offset of the first byte where `got` and `want` differ (the shorter one's length when one is
    a prefix of the other); None when they are equal."""
    a, b = got.encode(), want.encode()
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _around(text: str, byte_off: int, width: int = 24) -> str:
    raw = text.encode()
    return raw[max(0, byte_off - width): byte_off + width].decode(errors="replace")


def diff_text(label: str, got: str, want: str) -> str | None:
    """None when equal, else ``<label>: first differing byte N of M: got '…', want '…'`` (excerpts around it)."""
    off = first_diff(got, want)
    if off is None:
        return None
    return (f"{label}: first differing byte {off} (got {len(got.encode())} bytes, want {len(want.encode())}): "
            f"got {_around(got, off)!r}, want {_around(want, off)!r}")


def compare_arguments(label: str, got_text: str, want: Any) -> str | None:
    """Whether an arguments text carries exactly `want`. Whitespace between JSON tokens may differ (vLLM
    re-serialises non-streamed arguments with ``json.dumps``'s spacing), so parsable text is compared in
    `canonical` form; text that does not parse is compared raw with ``canonical(want)``. Returns None when equal,
    else the problem naming the first differing byte."""
    want_text = canonical(want)
    try:
        got = json.loads(got_text)
    except json.JSONDecodeError as exc:
        return (diff_text(f"{label} (not JSON: {exc.msg})", got_text, want_text)
                or f"{label}: not JSON ({exc.msg})")
    if isinstance(got, dict) and isinstance(want, dict) and list(got) != list(want) and got == want:
        return None  # same object, keys in another order: JSON objects are unordered
    return diff_text(label, canonical(got), want_text)


def leaks(text: str, case: ArgCase, markers: tuple[str, ...]) -> list[str]:
    """What of the arguments or of parser markup shows up in `text` (content or reasoning): markers, and pieces of
    the case's string values."""
    found = [m for m in markers if m in text]
    found += [f"argument text {n!r}" for n in case.needles() if n in text]
    return found


def compare_texts(label: str, got: str, want: str) -> str | None:
    """Whether two argument texts carry the same JSON (compared in `canonical` form; raw against the canonical form
    of `want` when `got` does not parse). None when equal, else the problem naming the first differing byte."""
    try:
        want_value = json.loads(want)
    except json.JSONDecodeError:
        return diff_text(label, got, want)
    return compare_arguments(label, got, want_value)


# --- the live cases ---------------------------------------------------------------------------------------------

# The cpu recipe caps every request at 1,024 generated tokens (serving.default_max_tokens, vLLM's generation-config
# override); the largest live case (the file) stays within it.
ARG_MAX_TOKENS = 1024


def _ask(case: ArgCase) -> list[dict]:
    return [{"role": "user", "content": f"Call {case.tool} with the arguments its schema gives."}]


def _openai_case(case: ArgCase) -> Callable[[Context, Mode], Outcome]:
    def run(ctx: Context, mode: Mode) -> Outcome:
        r = chat(ctx, mode, _ask(case), max_tokens=ARG_MAX_TOKENS, tools=[case.openai_tool()],
                 tool_choice={"type": "function", "function": {"name": case.tool}})
        c = r.first
        bad = [f"sent twice: {p}" if "times" in p else p for p in r.problems]
        calls = [x for _i, x in sorted(c.calls.items())]
        if len(calls) != 1:
            bad.append(f"{len(calls)} tool calls, want exactly 1 of {case.tool}")
        for x in calls[:1]:
            if x.name != case.tool:
                bad.append(f"called {x.name!r}, want {case.tool}")
            if not x.id:
                bad.append("the call has no id")
            if p := compare_arguments("arguments", x.arguments, case.args):
                bad.append(p)
            key = ("args", case.name, mode.thinking)
            if not mode.stream:
                ctx.memo[key] = x.arguments
            elif key in ctx.memo and (p := compare_texts("streamed arguments vs the non-streamed",
                                                          x.arguments, ctx.memo[key])):
                bad.append(p)
        if c.finish not in NAMED_FINISH:
            bad.append(f"finish_reason {c.finish!r}")
        for field_name, text in (("content", c.content), ("reasoning", c.reasoning)):
            if found := leaks(text, case, MARKERS):
                bad.append(f"{field_name} carries {found}")
        size = len(calls[0].arguments.encode()) if calls else 0
        ev = f"{case.tool}: {size} bytes of arguments, finish={c.finish}, {usage_text(r.usage)}"
        if bad:
            return Outcome(FAIL, f"args.{case.name} [{mode.label}]: " + "; ".join(bad) + f" ({ev})")
        return Outcome(PASS, ev + (" = non-streamed" if mode.stream else " = the schema's value"))

    run.__doc__ = (f"Forced call of {case.tool}: {case.what}. The arguments equal the schema's value byte for byte "
                   "(as JSON), streamed fragments join to exactly the non-streamed arguments, nothing sent twice, "
                   "nothing of them in content or reasoning.")
    return run


def anthropic_tool_uses(events: list[dict]) -> tuple[list[dict], list[str], dict[str, str]]:
    """From the events of a streamed Messages answer: the tool_use blocks (``name``, ``id``, ``json`` = the
    input_json_delta fragments joined), what is wrong with them (a block started twice, a delta for a block never
    started), and the text of the text and thinking blocks by type."""
    blocks: dict[int, dict] = {}
    bad: list[str] = []
    texts = {"text": "", "thinking": ""}
    for e in events:
        t = e.get("type")
        if t == "content_block_start":
            if e["index"] in blocks:
                bad.append(f"sent twice: content block {e['index']} started again")
            blocks[e["index"]] = {**e["content_block"], "json": ""}
            if e["content_block"].get("type") in texts:
                texts[e["content_block"]["type"]] += e["content_block"].get(e["content_block"]["type"]) or ""
        elif t == "content_block_delta":
            d = e.get("delta", {})
            if e.get("index") not in blocks:
                bad.append(f"a delta for block {e.get('index')}, never started")
                continue
            if d.get("type") == "input_json_delta":
                blocks[e["index"]]["json"] += d.get("partial_json", "")
            elif d.get("type") == "text_delta":
                texts["text"] += d.get("text", "")
            elif d.get("type") == "thinking_delta":
                texts["thinking"] += d.get("thinking", "")
    return [b for _i, b in sorted(blocks.items()) if b.get("type") == "tool_use"], bad, texts


@dataclass(frozen=True)
class AnthropicRound:
    """One forced-tool Messages request, streamed or not: the tool_use blocks, each one's input as JSON text (the
    joined ``input_json_delta`` fragments when streamed, the canonical ``input`` otherwise), the text and thinking
    blocks' contents, the stop_reason, and what is wrong with the stream itself (event order, fragments)."""

    uses: list[dict]
    inputs: list[str]
    texts: dict[str, str]
    stop: str | None
    problems: list[str]


def anthropic_round(ctx: Context, body: dict, stream: bool) -> AnthropicRound | str:
    """Send `body` to /v1/messages (as a stream when `stream`) and read its tool_use blocks.

    Returns:
        The round, or the error text when the server did not answer 200.
    """
    if stream:
        status, events, err = anth_stream_events(ctx, body)
        if status != 200:
            return err
        uses, problems, texts = anthropic_tool_uses(events)
        stop = next((e["delta"].get("stop_reason") for e in events if e.get("type") == "message_delta"), None)
        return AnthropicRound(uses, [u["json"] for u in uses], texts, stop, event_order_problems(events) + problems)
    r = anth_post(ctx, body)
    if r.status_code != 200:
        return error_text(r.content, r.status_code)
    msg = r.json()
    uses = [b for b in msg["content"] if b.get("type") == "tool_use"]
    texts = {k: "".join(b.get(k, "") for b in msg["content"] if b.get("type") == k) for k in ("text", "thinking")}
    return AnthropicRound(uses, [canonical(u.get("input")) for u in uses], texts, msg.get("stop_reason"), [])


def _anthropic_case(case: ArgCase) -> Callable[[Context, Mode], Outcome]:
    def run(ctx: Context, mode: Mode) -> Outcome:
        body = msg_body(ctx, temperature=0, max_tokens=ARG_MAX_TOKENS, messages=_ask(case),
                        tools=[case.anthropic_tool()], tool_choice={"type": "tool", "name": case.tool},
                        **ctx.template_kwargs(mode))
        got = anthropic_round(ctx, body, mode.stream)
        if isinstance(got, str):
            return Outcome(FAIL, f"args.{case.name} [{mode.label}]: {got}")
        bad, uses, inputs, texts, stop = list(got.problems), got.uses, got.inputs, got.texts, got.stop
        if len(uses) != 1:
            bad.append(f"{len(uses)} tool_use blocks, want exactly 1 of {case.tool}")
        for u, text in list(zip(uses, inputs, strict=True))[:1]:
            if u.get("name") != case.tool:
                bad.append(f"tool_use of {u.get('name')!r}, want {case.tool}")
            if not u.get("id"):
                bad.append("the tool_use has no id")
            label = "input_json_delta fragments" if mode.stream else "input"
            if p := compare_arguments(label, text or "{}", case.args):
                bad.append(p)
            key = ("m-args", case.name, mode.thinking)
            if not mode.stream:
                ctx.memo[key] = text
            elif key in ctx.memo and (p := compare_texts("streamed input vs the non-streamed", text, ctx.memo[key])):
                bad.append(p)
        if stop != "tool_use":
            bad.append(f"stop_reason {stop!r}")
        for kind, text in texts.items():
            if found := leaks(text, case, MARKERS):
                bad.append(f"{kind} blocks carry {found}")
        ev = f"{case.tool}: {len(inputs[0].encode()) if inputs else 0} bytes of input, stop_reason={stop}"
        if bad:
            return Outcome(FAIL, f"args.{case.name} [{mode.label}]: " + "; ".join(bad) + f" ({ev})")
        return Outcome(PASS, ev + (" = non-streamed" if mode.stream else " = the schema's value"))

    run.__doc__ = (f"Forced tool_use of {case.tool}: {case.what}. The input equals the schema's value, the streamed "
                   "input_json_delta fragments join to exactly the non-streamed input, nothing sent twice, nothing "
                   "of it in text or thinking blocks.")
    return run


CASES: list[Case] = [
    *(Case(f"args.{c.name}", "openai", ALL_MODES, _openai_case(c)) for c in ARG_CASES if c.live),
    *(Case(f"messages.args.{c.name}", "http", ALL_MODES, _anthropic_case(c)) for c in ARG_CASES if c.live),
]
