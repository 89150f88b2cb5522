"""Stand-in engine for the rehearsal (tests/rehearse): installed as /usr/bin/tini in an image tagged as a recipe's
engine image, so the render's own entrypoint (``/usr/bin/tini --``) runs it with the render's whole command.
Standard library only: the image is Debian with python3, not the engine's (tests/rehearse/standin/Dockerfile).

It checks what the container got against the render (/etc/ds4-rehearse/expect.json, written by
tests/rehearse/expect.py from compose/<recipe>/):
- argv: the rendered command of one node role, word for word, ``${VAR...}`` words matched as values (node rank,
  master address); it reports the engine's own arguments (the words after the engine's entrypoint), which the
  rehearsal parses with vLLM's parser on the host (tests/support/vllm_parser.py);
- environment: every rendered variable with its value (placeholders as values), VLLM_API_KEY from the env_file, and
  NVIDIA_VISIBLE_DEVICES=all, which Docker's nvidia device driver sets for the GPU reservation (moby
  daemon/nvidia_linux.go, setNvidiaGPUs: Count -1 -> "all");
- mounts: /model read-only with the model's files, the cache volume; devices (character devices under each rendered
  device path); ulimits (memlock, stack).
It prints one line ``ds4-rehearse-check {json}`` and exits 1 when a check failed; given ``--help`` last (the deploy's
argument check of a llama.cpp recipe), it checks the rest and exits 0. Otherwise a head answers
GET /health, GET /v1/models (the served name) and POST /v1/completions (one token) on the rendered --host/--port
and listens on the master port; a headless worker logs the line vLLM's headless path logs (the deploy's ready
marker) and waits.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EXPECT = Path("/etc/ds4-rehearse/expect.json")
PLACEHOLDER = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")


def _match(rendered: str, actual: str, values: dict[str, str]) -> bool:
    """True when `actual` is `rendered` with each ${VAR...} replaced by one value (recorded in `values`)."""
    names = PLACEHOLDER.findall(rendered)
    if not names:
        return rendered == actual
    # PLACEHOLDER.split yields [text, name, text, name, ...] (one group): rebuild as text (.+?) text ...
    parts = PLACEHOLDER.split(rendered)
    pattern = "".join(re.escape(p) if i % 2 == 0 else "(.+?)" for i, p in enumerate(parts))
    m = re.fullmatch(pattern, actual)
    if not m:
        return False
    for name, value in zip(names, m.groups(), strict=True):
        if values.setdefault(name, value) != value:
            return False
    return True


def check_argv(argv: list[str], expect: dict, values: dict[str, str]) -> tuple[str | None, list[str]]:
    """The role whose rendered command `argv` is, and the problems (empty: argv is exactly one role's command)."""
    for role, spec in expect["roles"].items():
        trial: dict[str, str] = {}
        cmd = spec["command"]
        if len(cmd) == len(argv) and all(_match(r, a, trial) for r, a in zip(cmd, argv, strict=True)):
            values.update(trial)
            return role, []
    return None, [f"argv is no role's rendered command: {argv}"]


def check_env(spec: dict, values: dict[str, str]) -> list[str]:
    problems = []
    for key, rendered in spec["environment"].items():
        actual = os.environ.get(key)
        if actual is None or not _match(rendered, actual, values):
            problems.append(f"env {key}={actual!r}, rendered {rendered!r}")
    if not os.environ.get("VLLM_API_KEY", "").startswith("ds4-") and spec["api_key"]:
        problems.append("env VLLM_API_KEY missing (the env_file of the render)")
    if spec["gpus"] and os.environ.get("NVIDIA_VISIBLE_DEVICES") != "all":
        problems.append(f"GPU reservation: NVIDIA_VISIBLE_DEVICES={os.environ.get('NVIDIA_VISIBLE_DEVICES')!r}, "
                        "expected 'all' (Docker's nvidia device driver, count: all)")
    return problems


def _mounts() -> dict[str, list[str]]:
    """Mount point -> its options (from /proc/self/mountinfo: field 5 is the mount point, 6 the options)."""
    out = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        out[f[4]] = f[5].split(",")
    return out


def check_mounts(spec: dict, model_files: list[str]) -> list[str]:
    problems, mounts = [], _mounts()
    for target, mode in spec["volumes"].items():
        if target not in mounts:
            problems.append(f"mount {target} missing")
        elif mode == "ro" and "ro" not in mounts[target]:
            problems.append(f"mount {target} is not read-only ({','.join(mounts[target])})")
    for name in model_files:
        if not (Path("/model") / name).is_file():
            problems.append(f"model file /model/{name} missing")
    for dev in spec["devices"]:
        path = Path(dev)
        nodes = [p for p in path.rglob("*") if stat.S_ISCHR(p.stat().st_mode)] if path.is_dir() else []
        if not nodes:
            problems.append(f"device {dev}: no character device inside the container")
    # The OCI spec's own rlimits when the nodes' runtime had to lower one (tests/rehearse/standin/runc-rehearse).
    requested = json.loads(os.environ.get("DS4_REHEARSE_OCI_RLIMITS", "{}"))
    for name, want in spec["ulimits"].items():
        kind = {"memlock": "RLIMIT_MEMLOCK", "stack": "RLIMIT_STACK"}[name]
        soft, hard = resource.getrlimit(getattr(resource, kind))
        if kind in requested:
            soft, hard = requested[kind]
            # OCI rlimits are uint64: unlimited is 2**64 - 1
            soft, hard = [resource.RLIM_INFINITY if v >= 2**63 - 1 else v for v in (soft, hard)]
        want = resource.RLIM_INFINITY if want == -1 else want
        if (soft, hard) != (want, want):
            problems.append(f"ulimit {name} {soft}/{hard}, rendered {want}")
    return problems


def _flag(args: list[str], name: str, default: str | None = None) -> str | None:
    return args[args.index(name) + 1] if name in args else default


def serve(host: str, port: int, served: str, key: str | None) -> None:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self):
            if self.path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/v1/models" and self._authorized():
                self._send(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
            elif self.path != "/v1/models":
                self._send(404, {"error": "not found"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path in ("/v1/completions", "/v1/chat/completions") and self._authorized():
                self._send(200, {"id": "rehearse", "object": "text_completion", "model": served,
                                 "choices": [{"index": 0, "text": ".", "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
            elif self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, {"error": "not found"})

        def log_message(self, *args):
            pass

    ThreadingHTTPServer((host, port), Handler).serve_forever()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    # The deploy's argument check of a llama.cpp recipe runs the container's command with --help appended
    # (ds4deploy.engines.llamacpp.argv_check_entrypoint), in a container without the key, the cache volume or a
    # network (ds4deploy.render.compose.engine_check): its argv is checked, then answered as llama-server answers
    # --help, exit 0, nothing served.
    usage = argv[-1:] == ["--help"]
    if usage:
        argv = argv[:-1]
    expect = json.loads(EXPECT.read_text())
    values: dict[str, str] = {}
    role, problems = check_argv(argv, expect, values)
    report: dict = {"role": role, "argv": argv}
    if role is not None and not usage:
        spec = expect["roles"][role]
        report["engine_args"] = argv[spec["engine_args_from"]:]
        problems += check_env(spec, values)
        problems += check_mounts(spec, expect["model_files"])
        report["values"] = values
        report["nvidia_visible_devices"] = os.environ.get("NVIDIA_VISIBLE_DEVICES")
    report["problems"] = problems
    print("ds4-rehearse-check " + json.dumps(report, sort_keys=True), flush=True)
    if problems:
        return 1
    if usage:
        print("usage: llama-server [options] (rehearsal stand-in: the arguments match the render)", flush=True)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    spec = expect["roles"][role]
    if spec["worker"]:
        # vLLM's headless path logs this (entrypoints/cli/serve.py), the deploy's ready marker for a worker.
        print(f"{expect['worker_ready_log']} (rehearsal stand-in, node rank {values.get('DS4_NODE_RANK')})",
              flush=True)
        while True:
            time.sleep(3600)
    if expect["master_port"]:
        # The head's rendezvous store listens on the master port, as the engine's does at start-up; a port still
        # held by another process fails here as it would fail the engine.
        try:
            master = socket.create_server(("0.0.0.0", expect["master_port"]))
        except OSError as exc:
            print(f"ds4-rehearse-fatal the master port {expect['master_port']} is taken ({exc}): the engine's "
                  "rendezvous store could not listen", flush=True)
            return 1

        def accept() -> None:
            while True:
                master.accept()[0].close()

        threading.Thread(target=accept, daemon=True).start()
    host = _flag(report["engine_args"], "--host", "0.0.0.0")
    port = int(_flag(report["engine_args"], "--port", "8000"))
    print(f"stand-in engine serving {expect['served_name']} on {host}:{port}", flush=True)
    serve(host, port, expect["served_name"], os.environ.get("VLLM_API_KEY") if spec["api_key"] else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
