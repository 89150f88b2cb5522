"""h25 device probe: run llama-server with a GPU recipe's argv on the tiny deepseek4 GGUF, both APIs, a tool call,
/metrics, /slots, a small timed run, with the bench's NVML telemetry sampling. Writes JSON + server logs to OUT."""
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

server, gguf_dir, out, build_s = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
part1 = sorted(gguf_dir.glob("*-00001-of-*.gguf"))[0]
try:
    from ds4deploy.bench.telemetry import Sampler, open_source
    src, why = open_source()
except Exception as exc:  # noqa: BLE001
    Sampler, src, why = None, None, f"telemetry import failed: {exc!r}"
print("telemetry:", why, flush=True)
KEY = "h25-probe-key"
NT = {"enable_thinking": False, "thinking": False}
PORT = 8099


def call(path, body=None, headers=None, timeout=120):
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers=h, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
          "parameters": {"type": "object", "properties": {"celsius": {"type": "boolean"}},
                         "required": ["celsius"]}}}]
ATOOLS = [{"name": "get_weather", "description": "weather of a city",
           "input_schema": TOOLS[0]["function"]["parameters"]}]


def run(label, extra):
    argv = [server, "-m", str(part1), "--host", "127.0.0.1", "--port", str(PORT), "-a", "ds4-tiny", "--jinja",
            "-c", "8192", "-np", "1", "--metrics", "--slots", *extra]
    res = {"label": label, "argv": argv[1:]}
    log = open(out / f"server-{label}.log", "w")
    t0 = time.time()
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={"LLAMA_API_KEY": KEY, "PATH": "/usr/bin:/bin"})
    try:
        while time.time() - t0 < 120:
            if p.poll() is not None:
                res["exit"] = p.returncode
                return res
            try:
                if call("/health", timeout=2)[0] == 200:
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.5)
        res["ready_s"] = round(time.time() - t0, 2)
        st, b = call("/v1/chat/completions", {"model": "ds4-tiny", "messages": [{"role": "user", "content": "Hello"}],
                                              "max_tokens": 16, "temperature": 0, "chat_template_kwargs": NT})
        res["chat"] = {"status": st, "body": json.loads(b) if st == 200 else b}
        st, b = call("/v1/messages", {"model": "ds4-tiny", "max_tokens": 16,
                                       "messages": [{"role": "user", "content": "Hello"}], "chat_template_kwargs": NT},
                     headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
        res["messages"] = {"status": st, "body": json.loads(b) if st == 200 else b}
        st, b = call("/v1/chat/completions", {"model": "ds4-tiny", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                                              "tools": TOOLS, "tool_choice": "required", "max_tokens": 64, "temperature": 0,
                                              "chat_template_kwargs": NT})
        res["tool_call_openai"] = {"status": st, "body": json.loads(b) if st == 200 else b}
        st, b = call("/v1/messages", {"model": "ds4-tiny", "max_tokens": 64, "tools": ATOOLS,
                                       "tool_choice": {"type": "any"}, "chat_template_kwargs": NT,
                                       "messages": [{"role": "user", "content": "Weather in Oslo?"}]})
        res["tool_call_anthropic"] = {"status": st, "body": json.loads(b) if st == 200 else b}
        # timed: 3 greedy requests, ~512-token prompt, 128 output tokens; llama-server's own timings
        prompt = " ".join(f"word{i}" for i in range(170))
        cells = []
        sampler = Sampler(src, why) if Sampler else None
        if sampler:
            sampler.__enter__()
        t1 = time.time()
        for i in range(3):
            st, b = call("/v1/chat/completions", {"model": "ds4-tiny", "messages": [{"role": "user", "content": f"{i} {prompt}"}],
                                                  "max_tokens": 128, "temperature": 0, "ignore_eos": True,
                                                  "chat_template_kwargs": NT})
            d = json.loads(b)
            cells.append({"usage": d.get("usage"), "timings": d.get("timings")})
        wall = time.time() - t1
        out_tok = sum(c["usage"]["completion_tokens"] for c in cells)
        if sampler:
            sampler.__exit__(None, None, None)
            res["telemetry"] = sampler.cell_summary(out_tok / wall)
        res["timed"] = {"cells": cells, "wall_s": round(wall, 3), "output_tok_s": round(out_tok / wall, 1)}
        res["metrics"] = [ln for ln in call("/metrics")[1].splitlines() if ln.startswith("llamacpp:")]
        st, b = call("/slots")
        res["slots"] = {"status": st, "n": len(json.loads(b)) if st == 200 else b}
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()
    return res


results = {"build_wall_s": build_s, "model_parts": sorted(x.name for x in gguf_dir.glob("*.gguf")), "telemetry_source": why,
           "runs": [run("gpu-v100-argv", ["-ngl", "999", "-sm", "layer", "-fa", "1", "-b", "2048", "-ub", "1024",
                                          "--cache-type-k", "f16", "--cache-type-v", "f16"]),
                    run("cpu-same-argv-ngl0", ["-ngl", "0", "-fa", "1", "-b", "2048", "-ub", "1024",
                                               "--cache-type-k", "f16", "--cache-type-v", "f16"])]}
# planted wrong model path: must fail before serving
bad = subprocess.run([server, "-m", "/nonexistent/model-00001-of-00005.gguf", "--port", str(PORT + 1)],
                     capture_output=True, text=True, timeout=60)
results["wrong_path"] = {"exit": bad.returncode, "tail": (bad.stdout + bad.stderr)[-600:]}
(out / "llamacpp-h200.json").write_text(json.dumps(results, indent=2))
for r in results["runs"]:
    print(r["label"], "exit" in r and f"EXITED {r['exit']}" or "", {k: (v.get("status") if isinstance(v, dict) else None)
          for k, v in r.items() if k in ("chat", "messages", "tool_call_openai", "tool_call_anthropic")},
          r.get("timed", {}).get("output_tok_s"), (r.get("telemetry") or {}).get("power_w_mean"))
print("wrong path exit", results["wrong_path"]["exit"])
