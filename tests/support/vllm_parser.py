"""vLLM's own CLI parser on engine argvs, run in the host engine venv (.cache/engine-venv: the cpu recipe's engine
pins, which `make unit` and `make rehearse` create with `ds4deploy engine-venv --recipe cpu`): how the tests check
an argv the way `vllm serve` reads it without starting an engine (tests/unit/test_engine_parser.py on every
recipe's render, tests/rehearse on the argv each stand-in engine container was given)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import textwrap

import pytest

from ds4deploy.build.engine_venv import ENGINE_PYTHON

# One JSON list of argvs per input line -> one output line MARK + the JSON list of results (vLLM imported once).
MARK = "ds4-vllm-parsed "
PARSE = textwrap.dedent(f"""
    import json, sys
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = make_arg_parser(FlexibleArgumentParser())
    for line in sys.stdin:
        out = []
        for argv in json.loads(line):
            try:
                ns = parser.parse_args(argv)
                out.append({{"ok": True, "tp": ns.tensor_parallel_size, "pp": ns.pipeline_parallel_size,
                            "headless": bool(getattr(ns, "headless", False))}})
            except SystemExit as exc:
                out.append({{"ok": False, "code": exc.code}})
        print({MARK!r} + json.dumps(out), flush=True)
""")


def strip_fork_only(argv: list[str], fork_only: list[str]) -> list[str]:
    """`argv` without the flags in `fork_only` (a recipe's engine.fork_only_flags: flags of an engine fork that stock
    vLLM's parser does not know) and the value after each one that takes a value."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.lstrip("-") in fork_only:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(a)
    return out


def _need_venv() -> None:
    if not ENGINE_PYTHON.is_file():
        pytest.fail(f"no engine venv at {ENGINE_PYTHON.parent.parent}. Fix: `make unit` or `make rehearse` (they "
                    "create it), or `ds4deploy engine-venv --recipe cpu`.")


def _results(stdout: str) -> list[dict]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    assert lines, stdout[-2000:]
    return json.loads(lines[-1][len(MARK):])


def parse_with_vllm(argvs: list[list[str]]) -> list[dict]:
    """Each argv (the words after `vllm serve`) parsed by vLLM's parser, in one engine-venv process: per argv
    {"ok": True, "tp", "pp", "headless"} or {"ok": False, "code": <the parser's exit code, 2 for an unknown flag>}.
    Fails the test (with the fix) when the engine venv is missing."""
    _need_venv()
    p = subprocess.run([str(ENGINE_PYTHON), "-c", PARSE], input=json.dumps(argvs) + "\n", capture_output=True,
                       text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    return _results(p.stdout)


class VllmParser:
    """`parse_with_vllm` in one engine-venv process kept open (vLLM is imported once: about 10-20 s on the 2-core
    host), for callers that parse at several moments (the rehearsal, once per recipe). Close it with `close`."""

    def __init__(self) -> None:
        _need_venv()
        self.stderr = tempfile.TemporaryFile(mode="w+")  # the parser's usage lines, and an import error's traceback
        self.proc = subprocess.Popen([str(ENGINE_PYTHON), "-c", PARSE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)

    def _ended(self) -> str:
        self.stderr.seek(0)
        return f"vLLM's parser process ended (exit {self.proc.wait()}): {self.stderr.read()[-2000:]}"

    def parse(self, argvs: list[list[str]]) -> list[dict]:
        """As `parse_with_vllm`."""
        try:
            self.proc.stdin.write(json.dumps(argvs) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pytest.fail(self._ended())
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        pytest.fail(self._ended())

    def close(self) -> None:
        """End the process (killed when it does not end within 60 s)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()
