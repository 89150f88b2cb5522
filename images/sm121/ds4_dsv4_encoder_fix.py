#!/usr/bin/env python3
"""Replayed tool-call arguments given as a JSON object encode like the same arguments given as a JSON string.

The DeepSeek-V4-Flash-0731 checkpoint's encoding/encoding_dsv4.py (installed as vLLM's deepseek_v4 encoder by
ds4-dsv4-encoder) parses a replayed tool call's ``arguments`` with ``json.loads`` whatever its type; an OpenAI-style
client that replays them as an object makes that raise, and the encoder then writes the whole object as one
parameter named ``arguments``. The model imitates that history and coding agents break after their first tool turn
(MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark issue 21, docs/PATCHES.md at 489af958, fixed there at start by
patches/hotfix-encoding-dsv4-issue21.py). vLLM's own encoder in the image handles both types.

The fix, in our words: `apply` appends to the installed encoder a wrapper of its ``encode_arguments_to_dsml`` that
serialises non-string arguments to JSON before the checkpoint's code parses them, so an object and its JSON text
take the same path. The module's other functions look the name up at call time, so they use the wrapper. Applying
twice changes nothing (the wrapper marks itself).

Self-test (both subcommands, fail-closed, exit 1 with the cause): a replayed call whose arguments are an object
must encode exactly as the same call with JSON-string arguments, with one parameter per argument key (never a single
wrapped ``arguments`` parameter); and vLLM's unpatched encoder (``--reference``, the image's own
vllm/tokenizers/deepseek_v4_encoding.py saved at build) must encode the object call the same way too when it encodes
the string call the same way as the installed encoder (the two files can format differently; then only the first
check applies and the difference is reported).

Usage:
    ds4_dsv4_encoder_fix.py apply <installed encoder.py> --reference <vLLM's encoder.py>
    ds4_dsv4_encoder_fix.py self-test --reference <vLLM's encoder.py>   (build time: the wrapper on a stand-in
                                                                         encoder with the checkpoint's fault)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

MARK = "# ds4deploy: replayed object tool arguments (ds4_dsv4_encoder_fix.py)"
WRAPPER = f'''

{MARK}
def _ds4_object_arguments(encode):
    import json as _json

    def encode_arguments_to_dsml(tool_call):
        arguments = tool_call.get("arguments")
        if not isinstance(arguments, str):
            tool_call = dict(tool_call, arguments=_json.dumps(arguments, ensure_ascii=False))
        return encode(tool_call)

    encode_arguments_to_dsml.ds4_object_arguments = True
    return encode_arguments_to_dsml


if not getattr(encode_arguments_to_dsml, "ds4_object_arguments", False):
    encode_arguments_to_dsml = _ds4_object_arguments(encode_arguments_to_dsml)
'''

# A replayed call as an OpenAI-compatible client sends it back: a string, a number, a nested object.
CALL_ARGS = {"path": "src/app.py", "line": 42, "options": {"create": True, "mode": "w"}}

# Build-time stand-in with the checkpoint's fault (our own code): always json.loads, wrap on failure.
FAULTY_STANDIN = '''
import json


def encode_arguments_to_dsml(tool_call):
    try:
        arguments = json.loads(tool_call["arguments"])
    except Exception:
        arguments = {"arguments": tool_call["arguments"]}
    return "\\n".join(f'<parameter name="{k}">{json.dumps(v)}</parameter>' for k, v in arguments.items())
'''


class SelfTestFailed(Exception):
    """The encoder does not encode a replayed object argument as it should; the message says how."""


def load(path: Path, name: str):
    """Import `path` as a fresh module named `name` (not through vllm's package, so nothing else is imported)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SelfTestFailed(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "encode_arguments_to_dsml", None)):
        raise SelfTestFailed(f"{path} has no encode_arguments_to_dsml(tool_call): not a DeepSeek-V4 encoder")
    return module


def patch_file(path: Path) -> bool:
    """Append the wrapper to `path` unless it is there; True when the file changed."""
    text = path.read_text(encoding="utf-8")
    if MARK in text:
        return False
    path.write_text(text.rstrip("\n") + "\n" + WRAPPER, encoding="utf-8")
    return True


def encode(module, arguments) -> str:
    return module.encode_arguments_to_dsml({"name": "write_file", "arguments": arguments})


def check(installed, reference=None) -> str:
    """The self-test (module docstring) on imported modules; returns a one-line report.

    Raises:
        SelfTestFailed: an object argument does not encode as its JSON text does, or wraps into one parameter, or
            encodes differently from vLLM's encoder where the string form agrees.
    """
    import json

    as_text = encode(installed, json.dumps(CALL_ARGS))
    as_object = encode(installed, CALL_ARGS)
    if as_object != as_text:
        raise SelfTestFailed(f"an object argument encodes as {as_object!r}, its JSON text as {as_text!r}")
    if 'name="arguments"' in as_object:
        raise SelfTestFailed(f"the arguments are wrapped into one parameter: {as_object!r}")
    if reference is None:
        return "object and JSON-string arguments encode the same"
    if encode(reference, json.dumps(CALL_ARGS)) != as_text:
        return "object and JSON-string arguments encode the same (vLLM's own encoder formats differently)"
    if encode(reference, CALL_ARGS) != as_object:
        raise SelfTestFailed("vLLM's unpatched encoder encodes the object argument differently: "
                             f"{encode(reference, CALL_ARGS)!r} vs {as_object!r}")
    return "object arguments encode as vLLM's unpatched encoder encodes them"


def build_self_test(reference: Path) -> str:
    """At image build: the wrapper leaves vLLM's encoder unchanged and fixes a stand-in with the checkpoint's fault."""
    with tempfile.TemporaryDirectory() as tmp:
        stock = Path(tmp) / "stock.py"
        stock.write_bytes(reference.read_bytes())
        patch_file(stock)
        ref = load(reference, "ds4_reference_encoder")
        patched = load(stock, "ds4_patched_stock")
        if encode(patched, CALL_ARGS) != encode(ref, CALL_ARGS):
            raise SelfTestFailed("the wrapper changes what vLLM's own encoder writes for object arguments")
        faulty = Path(tmp) / "faulty.py"
        faulty.write_text(FAULTY_STANDIN, encoding="utf-8")
        if 'name="arguments"' not in encode(load(faulty, "ds4_faulty"), CALL_ARGS):
            raise SelfTestFailed("the stand-in does not show the fault it stands in for")
        patch_file(faulty)
        check(load(faulty, "ds4_faulty_patched"))
    return "wrapper leaves vLLM's encoder unchanged and fixes the faulty stand-in"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply")
    a.add_argument("encoder", type=Path)
    a.add_argument("--reference", type=Path, required=True)
    t = sub.add_parser("self-test")
    t.add_argument("--reference", type=Path, required=True)
    ns = parser.parse_args(argv)
    try:
        if ns.cmd == "self-test":
            print(f"ds4_dsv4_encoder_fix: self-test passed: {build_self_test(ns.reference)}")
            return 0
        original = ns.encoder.read_bytes()
        load(ns.encoder, "ds4_unpatched_encoder")  # an encoder at all, before anything is written
        changed = patch_file(ns.encoder)
        try:
            report = check(load(ns.encoder, "ds4_installed_encoder"), load(ns.reference, "ds4_reference_encoder"))
        except Exception:
            if changed:
                ns.encoder.write_bytes(original)
            raise
        print(f"ds4_dsv4_encoder_fix: {'patched' if changed else 'already patched'} {ns.encoder}; {report}")
        return 0
    except Exception as exc:  # any failure to import or encode stops the container, with its cause
        cause = exc if isinstance(exc, SelfTestFailed) else f"{type(exc).__name__}: {exc}"
        print(f"error: ds4_dsv4_encoder_fix {ns.cmd}: {cause}", file=sys.stderr)
        print("fix: use the checkpoint's own encoding/encoding_dsv4.py and the engine image this recipe pins; "
              "the container does not start with an encoder that corrupts replayed tool calls", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
