"""A node's RoCE v2 GID index from its own GID table: the shared parser's `resolve_rails` (what the Ansible module
ds4_gid_index runs on each node, ansible/library/ds4_gid_index.py) on the real fixture trees, with the rails as the
module gets them (`ds4deploy.plan.playvars.provision_vars`); and the GID dump the fabric checks run over a target, for
real by sh, under any sysfs root. tests/hosts/test_gid_launch_env.py runs the module itself with ansible-playbook."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest
import yaml

from ds4deploy.checks import fabric
from ds4deploy.core.errors import UserError
from ds4deploy.parsers import gid_table
from ds4deploy.parsers.gid_table import GidTableError, resolve_rails
from ds4deploy.parsers.gids import read_gid_table, roce_v2_gid_index
from ds4deploy.plan.playvars import provision_vars
from ds4deploy.recipe.load import load_recipe
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


def resolve(recipe, root: Path, addresses: dict) -> dict:
    """What the module does on a node whose sysfs is `root`: read the table there, resolve the recipe's rails."""
    return resolve_rails(gid_table.read_gid_table(root), provision_vars(recipe)["ds4_fabric_rails"], addresses,
                         str(root))


def test_parser_is_the_module_utils_file():
    # One parser: ds4deploy's is the very file the module ships to the nodes.
    shared = trees.REPO / "ansible" / "module_utils" / "ds4_gids.py"
    assert Path(gid_table.__file__).resolve() == shared.resolve()
    assert "ansible.module_utils.ds4_gids import" in (trees.REPO / "ansible/library/ds4_gid_index.py").read_text()


def test_resolve_gb10(gb10_recipe):
    got = resolve(gb10_recipe, trees.GB10, trees.GB10_RAILS)
    assert got == {"gid_index": 3, "hcas": [
        {"rail": "rail0", "hca": "rocep1s0f1", "address": "10.100.184.1", "gid_index": 3},
        {"rail": "rail1", "hca": "roceP2p1s0f1", "address": "10.100.185.1", "gid_index": 3},
    ]}


def test_each_node_gets_its_own_index(gb10_recipe, tmp_path):
    # The peer: spark-0e68's real table with only the slot index moved 3 -> 4 on both HCAs (3 on one GB10, 4 on
    # its peer: MiaAI-Lab GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR #26).
    peer = trees.moved_slot(trees.GB10, tmp_path / "peer", ["rocep1s0f1", "roceP2p1s0f1"], 3, 4)
    a = resolve(gb10_recipe, trees.GB10, trees.GB10_RAILS)
    b = resolve(gb10_recipe, peer, trees.GB10_RAILS)
    assert (a["gid_index"], b["gid_index"]) == (3, 4)


def test_k8s_pod_index_is_read_not_assumed(tmp_path):
    recipe = load_recipe(trees.fixture_recipe(tmp_path, trees.K8S_FABRIC_RAILS, "k8s-pod"))
    assert resolve(recipe, trees.K8S, trees.K8S_RAILS)["gid_index"] == 7


def test_hcas_of_one_node_with_different_indexes_stop(gb10_recipe, tmp_path):
    # spark-0e68's real table with only roceP2p1s0f1's slot moved 3 -> 4: its two HCAs now disagree.
    odd = trees.moved_slot(trees.GB10, tmp_path / "odd", ["roceP2p1s0f1"], 3, 4)
    with pytest.raises(GidTableError) as err:
        resolve(gb10_recipe, odd, trees.GB10_RAILS)
    cause, fix = err.value.cause, err.value.fix
    assert cause.startswith("the RoCE v2 GID indexes of its HCAs differ")
    assert "rocep1s0f1=3 (rail0 10.100.184.1)" in cause and "roceP2p1s0f1=4 (rail1 10.100.185.1)" in cause
    assert "netplan identical on every port" in fix and "NCCL_IB_ROCE_VERSION_NUM=2" in fix


@pytest.mark.parametrize("make_root", [lambda tmp: tmp / "nothing", lambda tmp: tmp / "empty"])
def test_no_rdma_device_stops(gb10_recipe, tmp_path, make_root):
    (tmp_path / "empty" / "class" / "infiniband").mkdir(parents=True)
    root = make_root(tmp_path)
    with pytest.raises(GidTableError, match=r"^no RDMA device: no GID table under .*class/infiniband, but the recipe "
                       "runs NCCL over RoCE HCAs rocep1s0f1, roceP2p1s0f1"):
        resolve(gb10_recipe, root, trees.GB10_RAILS)


def test_missing_rail_address_and_wrong_address(gb10_recipe):
    with pytest.raises(GidTableError, match=r"^no ds4_rails.rail1.address in the inventory"):
        resolve(gb10_recipe, trees.GB10, {"rail0": trees.GB10_RAILS["rail0"]})
    wrong = {**trees.GB10_RAILS, "rail0": {"address": "10.100.184.2"}}
    with pytest.raises(GidTableError, match=r"^no RoCE v2 GID on rocep1s0f1 is ::ffff:10.100.184.2"):
        resolve(gb10_recipe, trees.GB10, wrong)


def test_recipe_without_fabric_needs_nothing(tmp_path):
    # No rails: nothing is read (the root does not even exist) and there is no index.
    assert resolve(load_recipe("cpu"), tmp_path / "none", {}) == {"gid_index": None, "hcas": []}


def test_an_unreadable_gid_file_names_its_path(tmp_path):
    import shutil

    root = tmp_path / "sys"
    shutil.copytree(trees.GB10, root)
    slot = root / "class" / "infiniband" / "rocep1s0f1" / "ports" / "1" / "gids" / "3"
    slot.unlink()
    slot.mkdir()  # a read that fails with something else than EINVAL (here: EISDIR)
    with pytest.raises(GidTableError) as exc:
        gid_table.read_gid_table(root)
    assert exc.value.cause.startswith(f"cannot read {slot}")
    # ds4deploy's re-export raises its UserError with the same cause and fix.
    with pytest.raises(UserError) as user:
        read_gid_table(root)
    assert (user.value.cause, user.value.fix) == (exc.value.cause, exc.value.fix)


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


