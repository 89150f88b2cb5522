"""Feed a pinned vLLM's own tool-call and reasoning parsers with model output in the model family's markup, whole
and token by token, exactly as its chat-completion server does (``ParserManager.get_parser`` -> ``parse`` for a
non-streamed answer, ``parse_delta`` per generated token for a streamed one).

Runs INSIDE an engine environment (the pinned vLLM importable), so it uses the standard library and vllm only; the
project starts it as ``<engine python> parser_probe.py`` with a JSON job on stdin and reads one JSON line of results
from stdout (`ds4deploy.conformance.pinned_parsers`).

Job: ``{"family": "deepseek_v4", "tool_parser": ..., "reasoning_parser": ..., "cases": [{"name", "tool", "args",
"schema"}], "chunkings": ["tokens", "chars"]}``.

The model output of a case is written with the pinned engine's own encoder (``vllm/tokenizers/
deepseek_v4_encoding.py``: ``encode_arguments_to_dsml`` and its tool-call templates), the format the model was
trained to emit. The tokenizer is a stand-in: the real one is a multi-GB download; the parsers ask it only for the
ids of their special tokens (``get_vocab``), which it gives for ``<think>``, ``</think>`` and the end-of-sentence
token. "tokens" chunking splits the DSML token (DSML between full-width bars) and the think tags as single tokens
and the rest into word, space and punctuation pieces (as a BPE does); "chars" feeds one character at a time.
"""

from __future__ import annotations

import json
import re
import sys
import traceback

SPECIALS = {"<think>": 128821, "</think>": 128822, "<\uff5cend\u2581of\u2581sentence\uff5c>": 1}
DSML = "\uff5cDSML\uff5c"


class StandInTokenizer:
    """What the parsers ask of a tokenizer: the vocabulary (special tokens only) and decoding of those ids."""

    def get_vocab(self) -> dict[str, int]:
        return dict(SPECIALS)

    def convert_ids_to_tokens(self, ids):
        inv = {v: k for k, v in SPECIALS.items()}
        return [inv.get(i, "x") for i in ids]

    def decode(self, ids, **_kw):
        return "".join(self.convert_ids_to_tokens(ids))

    def encode(self, text, **_kw):
        return [SPECIALS.get(text, 1000)]

    @property
    def vocab(self):
        return self.get_vocab()

    all_special_tokens = tuple(SPECIALS)
    all_special_ids = tuple(SPECIALS.values())
    eos_token_id = 1


_PIECE = re.compile(rf"{re.escape(DSML)}|</?think>|\w+|\s+|[^\w\s]", re.UNICODE)


def chunks(text: str, how: str) -> list[tuple[str, int]]:
    """(text, token id) pieces of `text`: "tokens" (special tokens whole, words, spaces, punctuation) or "chars"
    (one character each, specials still whole)."""
    if how.startswith("width:"):  # fixed-width pieces between the special tokens
        n, out = int(how.split(":")[1]), []
        for part in re.split(rf"({re.escape(DSML)}|</?think>)", text):
            if part in SPECIALS or part == DSML:
                out.append((part, SPECIALS.get(part, 2000)))
            else:
                out += [(part[i:i + n], 3000) for i in range(0, len(part), n)]
        return out
    if how == "chars":
        out, i = [], 0
        while i < len(text):
            for sp in (*SPECIALS, DSML):
                if text.startswith(sp, i):
                    out.append((sp, SPECIALS.get(sp, 2000)))
                    i += len(sp)
                    break
            else:
                out.append((text[i], 3000))
                i += 1
        return out
    return [(m.group(0), SPECIALS.get(m.group(0), 2000 if m.group(0) == DSML else 3000))
            for m in _PIECE.finditer(text)]


def model_output(enc, case: dict, thinking: bool) -> str:
    """The text the model emits for one call of `case` (DeepSeek V4 format, the engine's own encoder)."""
    call = {"name": case["tool"], "arguments": case["args"]}
    invoke = enc.tool_call_template.format(dsml_token=enc.dsml_token, name=case["tool"],
                                           arguments=enc.encode_arguments_to_dsml(call))
    block = enc.tool_calls_template.format(dsml_token=enc.dsml_token, tool_calls=invoke,
                                           tc_block_name=enc.tool_calls_block_name)
    reasoning = "The user wants this run; I call the tool.</think>" if thinking else ""
    return reasoning + "\n\n" + block


def _request(protocol, case: dict, thinking: bool):
    tool = {"type": "function", "function": {"name": case["tool"], "description": "x",
                                             "parameters": case["schema"]}}
    return protocol.ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "go"}], tools=[tool], tool_choice="auto",
        chat_template_kwargs={"thinking": thinking, "enable_thinking": thinking})


def _calls(tool_calls) -> list[dict]:
    return [{"name": tc.name if hasattr(tc, "name") else tc.function.name,
             "arguments": tc.arguments if hasattr(tc, "arguments") else tc.function.arguments}
            for tc in (tool_calls or [])]


def run_case(ParserManager, protocol, enc, cfg: dict, case: dict, thinking: bool, how: str) -> dict:
    tok = StandInTokenizer()
    parser_cls = ParserManager.get_parser(tool_parser_name=cfg["tool_parser"],
                                          reasoning_parser_name=cfg["reasoning_parser"], enable_auto_tools=True,
                                          model_name="deepseek-ai/DeepSeek-V4-Flash")
    text = model_output(enc, case, thinking)
    prompt_ids = [SPECIALS["<think>"]] if thinking else [SPECIALS["</think>"]]
    kwargs = {"thinking": thinking, "enable_thinking": thinking}
    out: dict = {"case": case["name"], "thinking": thinking, "chunking": how}
    # whole (non-streamed)
    req = _request(protocol, case, thinking)
    p = parser_cls(tok, req.tools, chat_template_kwargs=kwargs, model_config=None)
    req = p.adjust_request(req)
    reasoning, content, calls = p.parse(text, req, enable_auto_tools=True,
                                        model_output_token_ids=[i for _t, i in chunks(text, "tokens")])
    out["whole"] = {"reasoning": reasoning or "", "content": content or "", "calls": _calls(calls)}
    # streamed, one token at a time
    req = _request(protocol, case, thinking)
    p = parser_cls(tok, req.tools, chat_template_kwargs=kwargs, model_config=None)
    req = p.adjust_request(req)
    pieces = chunks(text, how)
    stream = {"reasoning": "", "content": "", "calls": {}, "fragments": [], "names": 0}
    fed = ""
    for n, (piece, tid) in enumerate(pieces):
        fed += piece
        d = p.parse_delta(piece, [tid], req, prompt_token_ids=prompt_ids, finished=n == len(pieces) - 1)
        if d is None:
            continue
        stream["reasoning"] += d.reasoning or ""
        stream["content"] += d.content or ""
        for tc in d.tool_calls or []:
            c = stream["calls"].setdefault(str(tc.index), {"name": None, "arguments": ""})
            if tc.function is not None and tc.function.name:
                stream["names"] += 1
                c["name"] = c["name"] or tc.function.name
            if tc.function is not None and tc.function.arguments:
                c["arguments"] += tc.function.arguments
                # where in the model output this fragment came out (characters fed so far)
                stream["fragments"].append([len(fed), len(tc.function.arguments)])
    stream["calls"] = [stream["calls"][k] for k in sorted(stream["calls"], key=int)]
    out["stream"] = stream
    out["text"] = text
    return out


def main() -> int:
    job = json.load(sys.stdin)
    import vllm
    from vllm.parser import ParserManager

    try:
        from vllm.entrypoints.openai.chat_completion import protocol
    except ImportError:  # older layout
        from vllm.entrypoints.openai import protocol
    from vllm.tokenizers import deepseek_v4_encoding as enc

    results, errors = [], []
    for case in job["cases"]:
        for thinking in (False, True):
            for how in job.get("chunkings", ["tokens", "chars"]):
                try:
                    results.append(run_case(ParserManager, protocol, enc, job, case, thinking, how))
                except Exception:
                    errors.append({"case": case["name"], "thinking": thinking, "chunking": how,
                                   "error": traceback.format_exc()[-1500:]})
    print(json.dumps({"vllm": vllm.__version__, "results": results, "errors": errors}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
