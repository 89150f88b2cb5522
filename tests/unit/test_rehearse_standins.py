"""The rehearsal's stand-ins (tests/rehearse) refuse what they exist to catch: the stand-in engine's argv and
environment checks against the committed render, the stand-in nvidia-smi's answers from captured output only, and
the GID trees' addresses and indexes as the real GID parser reads them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from ds4deploy.parsers.gids import read_gid_table, roce_v2_gid_index
from ds4deploy.recipe.load import load_recipe
from tests.rehearse import hardware
from tests.rehearse.expect import expectations

STANDIN = Path(__file__).resolve().parents[1] / "rehearse" / "standin"
spec = importlib.util.spec_from_file_location("standin_engine", STANDIN / "engine.py")
engine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engine)
GX10 = "gx10x2-ds4-flash-fp8"


def _worker_argv(expect: dict) -> list[str]:
    subst = {"${DS4_NODE_RANK:?set by the deploy}": "1", "${DS4_MASTER_ADDR:?set by the deploy}": "10.100.184.1"}
    return [subst.get(a, a) for a in expect["roles"]["compose.worker.yaml"]["command"]]


def test_the_stand_in_engine_knows_the_rendered_command_and_nothing_else():
    expect = expectations(load_recipe(GX10), ["config.json"])
    values: dict[str, str] = {}
    assert engine.check_argv(_worker_argv(expect), expect, values) == ("compose.worker.yaml", [])
    assert values == {"DS4_NODE_RANK": "1", "DS4_MASTER_ADDR": "10.100.184.1"}
    changed = [("0.77" if a == "0.78" else a) for a in _worker_argv(expect)]
    role, problems = engine.check_argv(changed, expect, {})
    assert role is None and problems
    # One placeholder, two values: refused.
    assert not engine._match("${A:?x}-${A:?x}", "1-2", {})


def test_the_stand_in_engine_refuses_a_missing_variable_or_gpu_reservation(monkeypatch):
    expect = expectations(load_recipe(GX10), ["config.json"])
    spec = expect["roles"]["compose.head.yaml"]
    for key, value in spec["environment"].items():
        monkeypatch.setenv(key, value.replace("${DS4_NCCL_IB_GID_INDEX:?set by the deploy}", "3")
                           .replace("${DS4_HOST_IP:?set by the deploy}", "10.100.184.1")
                           .replace("${DS4_NCCL_IB_HCA:?set by the deploy}", "rocep1s0f1,roceP2p1s0f1")
                           .replace("${DS4_SOCKET_IFNAME:?set by the deploy}", "enp1s0f1np1"))
    monkeypatch.setenv("VLLM_API_KEY", "ds4-x")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    values: dict[str, str] = {}
    assert engine.check_env(spec, values) == []
    assert values["DS4_NCCL_IB_GID_INDEX"] == "3"
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")  # the render says "0"
    problems = engine.check_env(spec, {})
    assert any("NCCL_IB_DISABLE" in p for p in problems) and any("NVIDIA_VISIBLE_DEVICES" in p for p in problems)


def _smi(tmp_path: Path, recipe: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "gpus.json").write_text(json.dumps(hardware.gpu_table(load_recipe(recipe))))
    stub = tmp_path / "nvidia-smi"
    stub.write_bytes((STANDIN / "nvidia-smi").read_bytes())
    return subprocess.run([sys.executable, str(stub), *args], capture_output=True, text=True, check=False)


def test_the_stand_in_nvidia_smi_answers_from_captures_only(tmp_path):
    p = _smi(tmp_path, "v100x8-ds41-flash-iq2", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")
    assert p.returncode == 0
    assert p.stdout.splitlines()[5] == "5, Tesla V100-SXM2-32GB, 32764"  # the capture's odd GPU, as captured
    assert len(p.stdout.splitlines()) == 8
    p = _smi(tmp_path, "v100x8-ds41-flash-iq2", "--query-gpu=name,clocks.max.graphics", "--format=csv")
    assert p.returncode == 2 and "clocks.max.graphics" in p.stderr
    p = _smi(tmp_path, "rtx3090x2-xeon-ds4-flash", "--query-gpu=name,power.max_limit", "--format=csv")
    assert p.stdout.splitlines() == ["name, power.max_limit [W]", "NVIDIA GeForce RTX 3090, 350.00 W",
                                     "NVIDIA GeForce RTX 3090, 350.00 W"]


def test_the_stand_in_nvidia_smi_answers_the_preflights_gpu_query(tmp_path):
    # ansible/roles/preflight/tasks/gpu.yml's query: the RTX 3090's compute capability as captured, the GB10's and
    # V100's from NVIDIA's table (no capture holds it), never from the recipe's arch, which the preflight checks.
    query = ("--query-gpu=name,compute_cap", "--format=csv,noheader")
    rtx = _smi(tmp_path, "rtx3090x2-xeon-ds4-flash", *query)
    assert rtx.stdout.splitlines() == ["NVIDIA GeForce RTX 3090, 8.6"] * 2
    assert _smi(tmp_path, "gx10x2-ds4-flash-fp8", *query).stdout.splitlines() == ["NVIDIA GB10, 12.1"]
    assert _smi(tmp_path, "v100x8-ds41-flash-iq2", *query).stdout.splitlines() == ["Tesla V100-SXM2-32GB, 7.0"] * 8
    assert hardware.CAPTURES["NVIDIA GB10"] == ["nvidia_smi-smart-city-gb10.txt"]  # the table did not grow it


def test_the_gid_trees_follow_the_nodes_rail_addresses(tmp_path):
    rails = {"rail0": "10.100.184.2", "rail1": "10.100.185.2"}
    for moved, index in ((None, 3), (4, 4)):
        entries = read_gid_table(hardware.gid_tree(rails, tmp_path / f"sysfs-{index}", moved))
        assert roce_v2_gid_index(entries, "rocep1s0f1", "10.100.184.2") == index
        assert roce_v2_gid_index(entries, "roceP2p1s0f1", "10.100.185.2") == index
