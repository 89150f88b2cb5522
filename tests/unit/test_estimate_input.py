"""Bad input to `ds4deploy estimate` and the files it and `ds4deploy recipe index` read, found by fuzzing, as
regression tests through the real CLI.

Each case runs the CLI in a subprocess, from a scratch directory, on the code of the checkout that holds this file
(PYTHONPATH), and must end with one clean refusal: exit 2, an ``error:`` and a ``fix:`` line naming the cause, no
traceback, nothing written. A case that used to hang runs under a 60 s timeout (a hang fails the test); the one that
used to eat memory runs under an address-space limit.

1. `estimate` options bounded by their meaning: --acceptance a probability, --context within max_model_len,
   --prompt + --output within max_model_len, --sessions within `constants.MAX_SESSIONS`, and the simulation's work
   within `constants.MAX_SIM_WORK`.
2. The manifest (`model.manifest.check_manifest`), the calibration file (`plan.estimate.read_calibration`) and a
   bench run given to --calibrate (`plan.estimate.calibrate.run_cells`) checked in one place each.
3. Numbers the estimator computes from a recipe's hardware figures never reach its arithmetic as inf or NaN.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
SM86, V100 = "rtx3090x2-xeon-ds4-flash", "v100x8-ds41-flash-iq2"
# A hang fails the test instead of the run (each case below finishes in a few seconds when it is refused).
HANG_S = 60
# The address space the memory case may take: the CLI needs about 0.3 GiB; --sessions 3000000 used to take
# gigabytes before it was refused.
MEMORY_LIMIT = 2 * 2**30


def cli(*args: str, cwd: Path, recipes: Path | None = None, memory: int | None = None) -> subprocess.CompletedProcess:
    """The real CLI of this checkout in a subprocess, from `cwd`, with `recipes` as DS4_RECIPES_DIR."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DS4_COMPOSE_DIR": str(cwd / "out"), "DS4_CACHE_DIR": str(cwd / "cache")}
    if recipes is not None:
        env["DS4_RECIPES_DIR"] = str(recipes)

    def limit() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, check=False, timeout=HANG_S, preexec_fn=limit)


def refused(p: subprocess.CompletedProcess, *needles: str) -> None:
    """One clean refusal: exit 2, `error:` and `fix:` lines, every needle in the message, no traceback."""
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "error: " in p.stderr and "\nfix: " in p.stderr, p.stderr
    for needle in needles:
        assert needle in p.stderr, (needle, p.stderr)


@pytest.fixture
def recipes(tmp_path) -> Path:
    """A recipe folder holding a copy of recipes/cpu.yaml (and of the sm86 recipe), for the bad file beside it."""
    out = tmp_path / "recipes"
    out.mkdir()
    for name in ("cpu", SM86):
        shutil.copy(RECIPES / f"{name}.yaml", out)
    return out


# --- 1. estimate options --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "needles"), [
    ([SM86, "--acceptance", "nan"], ["--acceptance nan", "from 0 to 1"]),  # used to hang
    ([SM86, "--acceptance", "-1"], ["--acceptance -1", "from 0 to 1"]),  # used to hang
    ([SM86, "--acceptance", "1.5"], ["--acceptance 1.5", "from 0 to 1"]),  # used to print 20.78 tokens per round
    (["cpu", "--context", "-5"], ["--context -5", "serving.max_model_len"]),  # used to be taken as the default
    (["cpu", "--context", "70000"], ["--context 70000", "1 to 65,536"]),
    (["cpu", "--prompt", "99999999999"], ["--prompt 99,999,999,999", "serving.max_model_len 65,536"]),  # hang
    (["cpu", "--prompt", "64000", "--output", "2000"], ["66,000 tokens", "at most 65,536"]),
    (["cpu", "--sessions", "100000000000000000000"], ["more than the 1,024 sessions"]),  # used to hang
    # Within every single bound, but 1,024 sessions of 60,000 tokens out: too long to simulate.
    (["cpu", "--sessions", "1024", "--prompt", "1000", "--output", "60000"], ["constants.MAX_SIM_WORK"]),
], ids=lambda v: "_".join(v) if isinstance(v, list) and v and v[0] in ("cpu", SM86) else "")
def test_estimate_options_out_of_their_bounds_are_refused(tmp_path, args, needles):
    refused(cli("estimate", *args, cwd=tmp_path), *needles)


def test_a_million_sessions_are_refused_before_they_take_memory(tmp_path):
    refused(cli("estimate", "cpu", "--sessions", "3000000", cwd=tmp_path, memory=MEMORY_LIMIT),
            "--sessions 3,000,000", "only wait in the engine's queue")


def test_the_bounds_themselves_are_accepted(tmp_path):
    # The control of the refusals above: the values at each bound still give an estimate.
    for args in ([SM86, "--acceptance", "0"], [SM86, "--acceptance", "1"], ["cpu", "--context", "65536"],
                 ["cpu", "--prompt", "63488", "--output", "2048"]):
        p = cli("estimate", *args, cwd=tmp_path)
        assert p.returncode == 0, (args, p.stderr)
        assert "decode: " in p.stdout
    p = cli("estimate", SM86, "--acceptance", "1", cwd=tmp_path)
    assert "6.00 tokens per decode round" in p.stdout  # k = 5 drafts, every one accepted


def test_more_sessions_than_a_pipelined_engine_runs_at_once_finish(tmp_path):
    # The V100 recipe runs pipeline 2 with max_num_seqs 1: the second session waited for a request it could not run
    # while the first crossed the second stage, and the simulation never ended.
    p = cli("estimate", V100, "--sessions", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "2 session(s)" in p.stdout and "TTFT" in p.stdout


# --- 2. manifest, calibration and bench-run files -------------------------------------------------------------------


def _manifest(edit) -> str:
    data = json.loads((RECIPES / "cpu.manifest.json").read_text())
    edit(data)
    return json.dumps(data)


def _set_size(value):
    def edit(data: dict) -> None:
        data["files"]["model.safetensors"]["size"] = value
    return edit


def _set_entry(data: dict) -> None:
    data["files"]["model.safetensors"] = "model.safetensors"


@pytest.mark.parametrize(("text", "command", "needles"), [
    ("[]", "estimate", ["cpu.manifest.json is not a JSON object"]),
    (_manifest(_set_entry), "estimate", ["model.safetensors is 'model.safetensors', not an object"]),
    (_manifest(_set_size("5382640")), "preflight", ["has size '5382640', not an integer"]),
    (_manifest(_set_size("5382640")), "estimate", ["has size '5382640', not an integer"]),
    (_manifest(_set_size(10**400)), "recipe index", ["not an integer number of bytes from 0 to 9,007,199,254,740,991"]),
    (_manifest(_set_size(True)), "estimate", ["has size True"]),
    (_manifest(_set_size(True)), "recipe index", ["has size True"]),
    (_manifest(_set_size(-1)), "estimate", ["has size -1"]),
], ids=["list", "entry-string", "size-string-preflight", "size-string", "size-401-digits-index", "size-true",
        "size-true-index", "size-negative"])
def test_a_manifest_of_the_wrong_shape_is_refused(tmp_path, recipes, text, command, needles):
    if command == "preflight":  # preflight checks the rendered stack first: render it while nothing is wrong
        assert cli("render", "cpu", cwd=tmp_path, recipes=recipes).returncode == 0
    (recipes / "cpu.manifest.json").write_text(text)
    args = ["recipe", "index"] if command == "recipe index" else [command, "cpu"]
    refused(cli(*args, cwd=tmp_path, recipes=recipes), *needles)
    assert not (recipes / "README.md").exists(), "a refused index was written"


@pytest.mark.parametrize(("text", "needles"), [
    ("[]", ["cpu.calibration.json is not a calibration", "not a JSON object"]),
    ('{"constants": 5, "run": "x"}', ["constants = 5", "hardware_class: Field required"]),
    ('{"hardware_class": "cpu-x86", "constants": {"t_round_s": "fast"}, "run": "x"}',
     ["constants.t_round_s = 'fast': Input should be a valid number"]),
    ('{"hardware_class": "cpu-x86", "run": "x", "constants": {"t_round_s": 0, "t_req_s": 0, "tflops": 0}}',
     ["constants.t_round_s = 0: Input should be greater than 0", "constants.tflops = 0"]),
    ('{"hardware_class": "cpu-x86", "run": "x", "constants": {"t_round_s": 1e400}}', ["constants.t_round_s = inf"]),
    ('{"hardware_class": "cpu-x86", "run": "x", "constants": {"t_round_s": true}}', ["constants.t_round_s = True"]),
    ('{"hardware_class": "sm70-v100", "run": "x", "constants": {"t_round_s": 0.01}}',
     ["fitted for hardware class 'sm70-v100'", "class 'cpu-x86'"]),
], ids=["list", "constants-not-object", "constant-string", "constants-zero", "constant-inf", "constant-bool",
        "other-class"])
@pytest.mark.parametrize("command", ["estimate", "recipe index"])
def test_a_calibration_of_the_wrong_shape_is_refused(tmp_path, recipes, text, needles, command):
    (recipes / "cpu.calibration.json").write_text(text)
    args = ["recipe", "index"] if command == "recipe index" else ["estimate", "cpu"]
    refused(cli(*args, cwd=tmp_path, recipes=recipes), *needles, "--calibrate <run.json> --write")
    assert not (recipes / "README.md").exists(), "a refused index was written"


CELL = {"valid": True, "spec": {"prompt_tokens": 256, "concurrency": 1}, "ttft_s": 0.05, "aggregate_tok_s": 400.0}


@pytest.mark.parametrize(("run", "cell", "needles"), [
    ({"cells": 5}, None, ["run.json is not a bench run", "cells = 5: Input should be a valid list"]),
    ({"cells": ["c1"]}, {"valid": True}, ["c1.json is not a bench cell record", "needs its spec"]),
    ({"cells": ["c1"]}, "{not json", ["c1.json is not valid JSON"]),
    ("[" * 100_000, None, ["run.json", "nested"]),
    ({"cells": ["../../outside"]}, None, ["cells[0] = '../../outside'"]),
    ({"cells": ["c1"]}, {**CELL, "spec": {"prompt_tokens": "256", "concurrency": 1}},
     ["spec.prompt_tokens = '256'"]),
    ({"cells": ["c1"], "max_tokens": 64}, {**CELL, "spec": {"prompt_tokens": 256, "concurrency": 10**9}},
     ["cell c1: 1,000,000,000 sessions are more than the 1,024"]),
    ({"cells": ["c1"], "max_tokens": 64}, {**CELL, "spec": {"prompt_tokens": 10**9, "concurrency": 1}},
     ["1,000,000,000 prompt + 64 output tokens is longer than serving.max_model_len"]),
    ({"cells": ["c1"], "max_tokens": True}, CELL, ["max_tokens = True"]),
], ids=["cells-not-list", "cell-without-spec", "cell-not-json", "nested", "cell-id-path", "spec-string",
        "concurrency-huge", "prompt-huge", "max-tokens-bool"])
def test_a_bench_run_of_the_wrong_shape_is_refused_and_nothing_is_written(tmp_path, recipes, run, cell, needles):
    folder = tmp_path / "run"
    (folder / "cells").mkdir(parents=True)
    (folder / "run.json").write_text(run if isinstance(run, str) else json.dumps(run))
    if cell is not None:
        (folder / "cells" / "c1.json").write_text(cell if isinstance(cell, str) else json.dumps(cell))
    p = cli("estimate", "cpu", "--calibrate", str(folder / "run.json"), "--write", cwd=tmp_path, recipes=recipes)
    refused(p, *needles)
    assert not (recipes / "cpu.calibration.json").exists(), "a refused calibration was written"


# --- 3. hardware numbers that overflow the estimator's arithmetic ----------------------------------------------------


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("    memory_gib:", "1.0e+300", "hardware.gpus.memory_gib 1e+300 GiB"),
    ("  size_on_disk_gb:", "1.0e+300", "model.size_on_disk_gb 1e+300 GB"),
], ids=["memory_gib", "size_on_disk_gb"])
def test_hardware_numbers_that_overflow_are_refused_not_divided(tmp_path, recipes, key, value, needle):
    path = recipes / f"{SM86}.yaml"
    lines = path.read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith(key))
    lines[at] = f"{key} {value}"
    path.write_text("\n".join(lines) + "\n")
    p = cli("estimate", SM86, cwd=tmp_path, recipes=recipes)
    # The recipe loader may refuse such a number itself; either way one clean message, never a traceback.
    refused(p)
    if "problem(s) in the recipe" not in p.stderr:
        assert needle in p.stderr and "the estimator cannot count with it" in p.stderr, p.stderr
    index = cli("recipe", "index", cwd=tmp_path, recipes=recipes)
    assert "Traceback" not in index.stderr and index.returncode in (0, 2), index.stderr


def test_a_kv_space_that_is_not_a_number_is_refused(tmp_path, recipes):
    path = recipes / "cpu.yaml"
    path.write_text(path.read_text().replace('VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "nan"'))
    refused(cli("estimate", "cpu", cwd=tmp_path, recipes=recipes),
            "engine.env.VLLM_CPU_KVCACHE_SPACE (GiB) = 'nan' is not a finite number > 0")


def test_the_committed_constants_have_the_shape_a_calibration_file_must_have():
    # One shape for calibrated constants (constants.Fitted), whether committed per class or fitted by an owner.
    from ds4deploy.plan.estimate import constants as C

    for cls, spec in C.HARDWARE.items():
        assert C.Fitted.model_validate(spec["fitted"]).constants() == spec["fitted"], cls
