"""The per-node launch env of a fabric recipe: the GID dump under any sysfs root, run for real by sh on the fixture
trees, and `ds4deploy fabric dump-command` / `launch-env` (what the preflight role runs before the model and image
roles)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from ds4deploy.checks import fabric
from ds4deploy.cli import main
from ds4deploy.errors import UserError
from ds4deploy.parsers.gids import read_gid_table, roce_v2_gid_index
from ds4deploy.recipe import load_recipe
from tests.support import gid_trees as trees
from tests.unit.parsers._fixtures import einval_reader


def dump_of(root: Path) -> str:
    """Run the one dump command under `root` with a real sh, as the node does."""
    done = subprocess.run(["sh", "-c", fabric.gid_dump_command(root)], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def gb10_recipe():
    """The real GX10 recipe: its rails are the published GB10 layout the spark-0e68 tree holds."""
    return load_recipe(trees.GX10_RECIPE)


def test_recipe_rails_are_the_published_gb10_layout(gb10_recipe):
    # Each rail's HCA carries the rail's address as a RoCE v2 GID on the rail's own netdev in the published table
    # (rocep1s0f1 <-> enp1s0f1np1 10.100.184.1, roceP2p1s0f1 <-> enP2p1s0f1np1 10.100.185.1).
    table = read_gid_table(trees.GB10, read=einval_reader)
    for rail in gb10_recipe.fabric.rails:
        address = trees.GB10_RAILS[rail.name]["address"]
        assert ipaddress.ip_address(address) in ipaddress.ip_network(rail.subnet)
        for hca in rail.hcas:
            (entry,) = [e for e in table if e.index == roce_v2_gid_index(table, hca, address) and e.hca == hca]
            assert entry.netdev == rail.netdev, (hca, entry.netdev, rail.netdev)
    assert gb10_recipe.fabric.nccl_ib_hca == ["rocep1s0f1", "roceP2p1s0f1"]


def test_dump_under_another_root_round_trips(tmp_path):
    # A root with a space proves the quoting; the table equals the direct sysfs read of the same tree.
    root = tmp_path / "with space"
    root.mkdir()
    (root / "class").symlink_to(trees.GB10 / "class")
    table = fabric.gid_table_from_dump(dump_of(root), root)
    assert table == read_gid_table(trees.GB10, read=einval_reader)
    assert sorted((e.hca, e.index) for e in table) == [("roceP2p1s0f1", 3)] + [("rocep1s0f1", i) for i in range(4)]


def test_dump_lines_of_another_root_are_ignored():
    dump = dump_of(trees.GB10)
    assert dump and fabric.gid_table_from_dump(dump, "/sys") == []


def test_host_dump_command_still_reads_sys():
    assert fabric._GID_DUMP == fabric.gid_dump_command("/sys")
    assert "for f in /sys/class/infiniband/*/ports/*/gids/* " in fabric._GID_DUMP


def test_launch_env_gb10(gb10_recipe):
    got = fabric.launch_env(gb10_recipe, "node-a", trees.GB10_RAILS, dump_of(trees.GB10), trees.GB10)
    assert got["env"] == {"DS4_NCCL_IB_GID_INDEX": "3"}
    assert got["hcas"] == [
        {"rail": "rail0", "hca": "rocep1s0f1", "address": "10.100.184.1", "gid_index": 3},
        {"rail": "rail1", "hca": "roceP2p1s0f1", "address": "10.100.185.1", "gid_index": 3},
    ]


def test_each_node_gets_its_own_index(gb10_recipe, tmp_path):
    # The peer: spark-0e68's real table with only the slot index moved 3 -> 4 on both HCAs (3 on one GB10, 4 on
    # its peer: MiaAI-Lab GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR #26).
    peer = trees.moved_slot(trees.GB10, tmp_path / "peer", ["rocep1s0f1", "roceP2p1s0f1"], 3, 4)
    a = fabric.launch_env(gb10_recipe, "node-a", trees.GB10_RAILS, dump_of(trees.GB10), trees.GB10)
    b = fabric.launch_env(gb10_recipe, "node-b", trees.GB10_RAILS, dump_of(peer), peer)
    assert (a["env"]["DS4_NCCL_IB_GID_INDEX"], b["env"]["DS4_NCCL_IB_GID_INDEX"]) == ("3", "4")


def test_k8s_pod_index_is_read_not_assumed(tmp_path):
    recipe = load_recipe(trees.fixture_recipe(tmp_path, trees.K8S_FABRIC_RAILS, "k8s-pod"))
    got = fabric.launch_env(recipe, "pod", trees.K8S_RAILS, dump_of(trees.K8S), trees.K8S)
    assert got["env"] == {"DS4_NCCL_IB_GID_INDEX": "7"}


def test_hcas_of_one_node_with_different_indexes_stop(gb10_recipe, tmp_path):
    # spark-0e68's real table with only roceP2p1s0f1's slot moved 3 -> 4: its two HCAs now disagree.
    odd = trees.moved_slot(trees.GB10, tmp_path / "odd", ["roceP2p1s0f1"], 3, 4)
    with pytest.raises(UserError) as err:
        fabric.launch_env(gb10_recipe, "node-b", trees.GB10_RAILS, dump_of(odd), odd)
    cause, fix = err.value.cause, err.value.fix
    assert cause.startswith("node-b: the RoCE v2 GID indexes of its HCAs differ")
    assert "rocep1s0f1=3 (rail0 10.100.184.1)" in cause and "roceP2p1s0f1=4 (rail1 10.100.185.1)" in cause
    assert "netplan identical on every port" in fix and "NCCL_IB_ROCE_VERSION_NUM=2" in fix
    assert fix.endswith("Nothing was started on any node.")


@pytest.mark.parametrize("make_root", [lambda tmp: tmp / "nothing", lambda tmp: tmp / "empty"])
def test_no_rdma_device_stops(gb10_recipe, tmp_path, make_root):
    (tmp_path / "empty" / "class" / "infiniband").mkdir(parents=True)
    root = make_root(tmp_path)
    with pytest.raises(UserError, match=r"^node-a: no RDMA device: no GID table under .*class/infiniband, but recipe "
                       "gx10x2-ds4-flash-fp8 runs NCCL over RoCE HCAs rocep1s0f1, roceP2p1s0f1"):
        fabric.launch_env(gb10_recipe, "node-a", trees.GB10_RAILS, dump_of(root), root)


def test_missing_rail_address_and_wrong_address(gb10_recipe):
    dump = dump_of(trees.GB10)
    with pytest.raises(UserError, match=r"^node-a: no ds4_rails.rail1.address in the inventory"):
        fabric.launch_env(gb10_recipe, "node-a", {"rail0": trees.GB10_RAILS["rail0"]}, dump, trees.GB10)
    wrong = {**trees.GB10_RAILS, "rail0": {"address": "10.100.184.2"}}
    with pytest.raises(UserError, match=r"^node-a: no RoCE v2 GID on rocep1s0f1 is ::ffff:10.100.184.2"):
        fabric.launch_env(gb10_recipe, "node-a", wrong, dump, trees.GB10)


def _gx10_with_fabric(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(trees.GX10_RECIPE.read_text())
    edit(data["fabric"])
    path = tmp_path / trees.GX10_RECIPE.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_nccl_ib_hca_outside_the_rails_is_refused_by_the_schema(tmp_path):
    # The old two-HCAs-per-rail layout named the f0 twins in NCCL_IB_HCA with no rail of their own.
    path = _gx10_with_fabric(tmp_path, lambda f: f["nccl_ib_hca"].extend(["rocep1s0f0", "roceP2p1s0f0"]))
    with pytest.raises(UserError, match=r"fabric\.nccl_ib_hca lists rocep1s0f0, roceP2p1s0f0, which no rail names"):
        load_recipe(path)


def test_hca_on_two_rails_is_refused_by_the_schema(tmp_path):
    path = _gx10_with_fabric(tmp_path, lambda f: f["rails"][1]["hcas"].append("rocep1s0f1"))
    with pytest.raises(UserError, match=r"fabric\.rails name rocep1s0f1 \(rail0, rail1\) on more than one rail"):
        load_recipe(path)


def test_recipe_without_fabric_needs_nothing():
    assert fabric.launch_env(load_recipe("cpu"), "node-a", {}, "", "/sys") == {"env": {}, "hcas": []}


def test_cli_dump_command(capsys):
    assert main(["fabric", "dump-command", "cpu"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["fabric", "dump-command", "gx10x2-ds4-flash-fp8", "--sysfs", str(trees.GB10)]) == 0
    assert capsys.readouterr().out.strip() == fabric.gid_dump_command(trees.GB10)


def test_cli_launch_env(tmp_path, capsys):
    recipe = "gx10x2-ds4-flash-fp8"
    dump = tmp_path / "dump.txt"
    dump.write_text(dump_of(trees.GB10))
    argv = ["fabric", "launch-env", str(recipe), "--node", "node-a", "--dump-file", str(dump),
            "--sysfs", str(trees.GB10)]
    assert main([*argv, "--rails", json.dumps(trees.GB10_RAILS)]) == 0
    assert json.loads(capsys.readouterr().out)["env"] == {"DS4_NCCL_IB_GID_INDEX": "3"}
    assert main([*argv, "--rails", "{rail0"]) == 2
    assert "error: --rails is not JSON" in capsys.readouterr().err
    assert main([*argv, "--rails", "[]"]) == 2
    assert "error: --rails is list, not a mapping" in capsys.readouterr().err
    assert main([*argv[:-4], "--dump-file", str(tmp_path / "missing"), "--rails", "{}"]) == 2
    assert "error: cannot read --dump-file" in capsys.readouterr().err


def test_an_unreadable_gid_file_names_the_node_and_its_own_path(gb10_recipe, tmp_path):
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(trees.GB10, root)
    slot = root / "class" / "infiniband" / "rocep1s0f1" / "ports" / "1" / "gids" / "3"
    slot.unlink()
    slot.mkdir()  # a read that fails with something else than EINVAL (here: EISDIR), through the real dump
    dump = dump_of(root)
    assert "#ERR" in dump
    with pytest.raises(UserError) as exc:
        fabric.launch_env(gb10_recipe, "node-a", trees.GB10_RAILS, dump, root)
    cause, fix = exc.value.cause, exc.value.fix
    assert cause.startswith("node-a: cannot read ") and f"{root}/class/infiniband/rocep1s0f1" in cause
    assert "ds4deploy-gids-" not in cause  # not the control host's temporary copy
    assert "node-a" in fix and fix.endswith(fabric.NOTHING_STARTED)
