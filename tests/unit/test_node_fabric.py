"""Per-node rail names (ds4deploy.plan.node_fabric): a GX10 pair whose nodes are cabled on different ports (node a on
the
recipe's f1 port, node b on f0) gets each node's own NCCL_IB_HCA, socket interface, rails and GID index, through
`ds4deploy vars` into the node plan, while the committed compose files stay the same for every node; wrong
overrides are refused with one message before anything is written."""

from __future__ import annotations

import copy
import os
import subprocess

import pytest
import yaml

from ds4deploy.checks import fabric
from ds4deploy.checks.report import SKIP
from ds4deploy.checks.target import Result, ShellTarget
from ds4deploy.cli import main
from ds4deploy.core.errors import UserError
from ds4deploy.parsers.gid_table import GidTableError, resolve_rails
from ds4deploy.parsers.gids import read_gid_table
from ds4deploy.plan import node_fabric, playvars, preflight
from ds4deploy.recipe.load import load_recipe
from ds4deploy.render import compose as render
from tests.support import gid_trees as trees
from tests.unit.parsers._fixtures import einval_reader

GX10 = "gx10x2-ds4-flash-fp8"
F0 = trees.F0_RAILS
HOSTS = {"a": {"ds4_node_rank": 0, "ansible_host": "10.0.0.1",
               "ds4_rails": {"rail0": {"address": "10.100.184.1", "mtu": 9000},
                             "rail1": {"address": "10.100.185.1", "mtu": 9000}}},
         "b": {"ds4_node_rank": 1, "ansible_host": "10.0.0.2",
               "ds4_rails": {"rail0": {"address": "10.100.184.2", "mtu": 9000, **F0["rail0"]},
                             "rail1": {"address": "10.100.185.2", "mtu": 9000, **F0["rail1"]}}}}


def _hosts(edit=None) -> dict:
    hosts = copy.deepcopy(HOSTS)
    if edit:
        edit(hosts["b"]["ds4_rails"])
    return hosts


def test_each_node_gets_its_own_names_through_the_play_vars():
    recipe = load_recipe(GX10)
    got = playvars.play_vars(recipe, _hosts(), "operate")
    env_a, env_b = (got["ds4_node_plan"][h]["launch_env"] for h in "ab")
    assert (env_a["DS4_NCCL_IB_HCA"], env_a["DS4_SOCKET_IFNAME"]) == ("rocep1s0f1,roceP2p1s0f1", "enp1s0f1np1")
    assert (env_b["DS4_NCCL_IB_HCA"], env_b["DS4_SOCKET_IFNAME"]) == ("rocep1s0f0,roceP2p1s0f0", "enp1s0f0np0")
    rails = got["ds4_fabric_node_rails"]
    assert [(r["netdev"], r["hcas"]) for r in rails["a"]] == [("enp1s0f1np1", ["rocep1s0f1"]),
                                                              ("enP2p1s0f1np1", ["roceP2p1s0f1"])]
    assert [(r["netdev"], r["hcas"]) for r in rails["b"]] == [("enp1s0f0np0", ["rocep1s0f0"]),
                                                              ("enP2p1s0f0np0", ["roceP2p1s0f0"])]
    # Subnet, prefix and MTU stay the recipe's: both ends of a rail must agree on them.
    assert [(r["subnet"], r["prefix"], r["mtu"]) for r in rails["b"]] == [
        (r["subnet"], r["prefix"], r["mtu"]) for r in got["ds4_fabric_rails"]]
    assert got["ds4_node_rails"] == "{{ ds4_fabric_node_rails[inventory_hostname] | default([]) }}"
    # The rails role runs in provision runs, which carry no node plan: each node's rails are there too.
    prov = playvars.play_vars(recipe, _hosts(), "provision")
    assert "ds4_node_plan" not in prov and prov["ds4_fabric_node_rails"] == rails
    # No fabric, no rails and no interface names in the launch env.
    cpu = playvars.play_vars(load_recipe("cpu-2node-tp"), {
        "x": {"ds4_node_rank": 0, "ds4_host_ip": "172.31.251.10"}, "y": {"ds4_node_rank": 1, "ds4_host_ip":
                                                                      "172.31.251.11"}}, "operate")
    assert cpu["ds4_fabric_node_rails"] == {} and "DS4_NCCL_IB_HCA" not in cpu["ds4_node_plan"]["y"]["launch_env"]


def test_the_committed_render_is_the_same_file_for_every_node_and_takes_the_names_from_its_env(tmp_path):
    recipe = load_recipe(GX10)
    nodes = {n["name"]: n for n in playvars.play_vars(recipe, _hosts(), "operate")["ds4_node_plan"].values()}
    compose = render.COMPOSE_DIR / GX10
    for name in ("compose.head.yaml", "compose.worker.yaml"):
        text = (compose / name).read_text()
        assert "rocep1s0f" not in text and "np1" not in text and "np0" not in text, name
    binary = render.compose_binary()
    assert binary, "no docker compose binary: run `make venv`"
    seen = {}
    for host, node in nodes.items():
        env_file = tmp_path / f"{host}.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in
                                    {**node["launch_env"], "DS4_NCCL_IB_GID_INDEX": "3"}.items()))
        done = subprocess.run([binary, "--project-directory", str(compose), "-f", str(compose / node["compose_file"]),
                               "--env-file", str(env_file), "config", "--format", "json"], capture_output=True,
                              text=True, check=False, env={**os.environ, "DS4_SECRETS_ENV": "/dev/null"})
        assert done.returncode == 0, done.stderr
        env = yaml.safe_load(done.stdout)["services"]["engine"]["environment"]
        seen[host] = (env["NCCL_IB_HCA"], env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"],
                      env["TP_SOCKET_IFNAME"])
    assert seen == {"a": ("rocep1s0f1,roceP2p1s0f1",) + ("enp1s0f1np1",) * 3,
                    "b": ("rocep1s0f0,roceP2p1s0f0",) + ("enp1s0f0np0",) * 3}
    # Without the node's .env value compose refuses to start (required interpolation), never an empty name.
    env_file = tmp_path / "missing.env"
    env_file.write_text("DS4_NODE_RANK=1\nDS4_MASTER_ADDR=10.100.184.1\nDS4_HOST_IP=10.100.184.2\n"
                        "DS4_NCCL_IB_GID_INDEX=3\nDS4_SOCKET_IFNAME=enp1s0f0np0\n")
    done = subprocess.run([binary, "--project-directory", str(compose), "-f", str(compose / "compose.worker.yaml"),
                           "--env-file", str(env_file), "config", "--quiet"], capture_output=True, text=True,
                          check=False, env={**os.environ, "DS4_SECRETS_ENV": "/dev/null"})
    assert done.returncode != 0 and "DS4_NCCL_IB_HCA" in done.stderr


BAD = {
    "unknown rail": (lambda r: r.update(rail2={"netdev": "enp1s0f0np0"}),
                     "b: ds4_rails.rail2: recipe gx10x2-ds4-flash-fp8 has no rail 'rail2' (its rails: rail0, rail1)"),
    "unknown key": (lambda r: r["rail0"].update(hca=["rocep1s0f0"]),
                    "b: ds4_rails.rail0 has unknown key(s) hca (known: address, mtu, netdev, hcas)"),
    "more HCAs than the recipe's rail": (
        lambda r: r["rail0"].update(hcas=["rocep1s0f0", "roceP2p1s0f0"]),
        "b: ds4_rails.rail0.hcas lists 2 HCA(s) (rocep1s0f0, roceP2p1s0f0), but the recipe's rail rail0 has 1 "
        "(rocep1s0f1)"),
    "no HCA": (lambda r: r["rail1"].update(hcas=[]), "b: ds4_rails.rail1.hcas lists 0 HCA(s) (none)"),
    "HCAs as a string": (lambda r: r["rail1"].update(hcas="roceP2p1s0f0"),
                         "b: ds4_rails.rail1.hcas 'roceP2p1s0f0' is not a list of HCA names"),
    "netdev too long": (lambda r: r["rail0"].update(netdev="enp1s0f0np0-rail0"),
                        "b: ds4_rails.rail0.netdev 'enp1s0f0np0-rail0' is not a network interface name"),
    "HCA with NCCL syntax": (lambda r: r["rail0"].update(hcas=["rocep1s0f0:1"]),
                             "b: ds4_rails.rail0.hcas: 'rocep1s0f0:1' is not an RDMA device name"),
    "a netdev for one rail of two": (
        lambda r: r["rail1"].pop("netdev"),
        "b: ds4_rails gives netdev for 1 of the recipe's 2 rails (rail0; not rail1): a node's rails are the twin "
        "functions of the port it is cabled on, so give netdev for every rail or for none"),
    "HCAs for one rail of two": (lambda r: r["rail0"].pop("hcas"),
                                 "b: ds4_rails gives hcas for 1 of the recipe's 2 rails (rail1; not rail0)"),
    "one netdev on two rails": (lambda r: r["rail1"].update(netdev="enp1s0f0np0"),
                                "b: netdev enp1s0f0np0 is on rails rail0 and rail1"),
    "one HCA on two rails": (lambda r: r["rail1"].update(hcas=["rocep1s0f0"]),
                             "b: HCA rocep1s0f0 is on rails rail0 and rail1"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("scope", playvars.SCOPES)
def test_wrong_overrides_are_refused_before_anything_is_written(tmp_path, case, scope):
    edit, message = BAD[case]
    with pytest.raises(UserError) as err:
        playvars.write_play_vars(load_recipe(GX10), _hosts(edit), scope, "inv.yml", dest_dir=tmp_path / "out")
    assert message in err.value.cause
    assert err.value.cause.startswith("1 problem(s) with the rail names in inv.yml")
    assert "nothing was changed on any host" in err.value.cause
    assert "netdev: enp1s0f0np0, hcas: [rocep1s0f0]" in err.value.fix
    assert not (tmp_path / "out").exists()


def test_every_problem_is_in_one_message_and_the_cli_exits_2(tmp_path, capsys):
    def two(rails):
        rails["rail0"]["hcas"] = ["a", "b"]
        rails["rail9"] = {}

    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": _hosts(two)}}))
    assert main(["vars", GX10, "--inventory", str(inventory), "--scope", "operate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 2 problem(s) with the rail names in") and "rail9" in err and "lists 2 HCA(s)" in err
    assert "\nfix: give each rail the node's own names" in err and "Traceback" not in err
    # The preflight rule that reads the rail addresses names them too (`ds4deploy preflight`).
    verdict = next(v for v in preflight.run(load_recipe(GX10), _hosts(two)) if v.rule == "rails-addresses")
    assert verdict.status == "fail" and "rail9" in verdict.numbers


def test_a_recipe_without_fabric_takes_no_name_overrides():
    hosts = {"x": {"ds4_rails": {"rail0": {"netdev": "eth1"}}}}
    problems = node_fabric.host_problems(load_recipe("cpu"), "x", hosts["x"])
    assert problems == ["x: ds4_rails.rail0 overrides rail names, but recipe cpu has no fabric"]
    # An address alone (a fact, no override) is not a problem.
    assert node_fabric.host_problems(load_recipe("cpu"), "x", {"ds4_rails": {"rail0": {"address": "1.2.3.4"}}}) == []


def test_nccl_ib_hca_maps_position_by_position(tmp_path):
    # A recipe whose NCCL_IB_HCA lists the rails' HCAs in the other order: each node's list keeps that order.
    data = yaml.safe_load(trees.GX10_RECIPE.read_text())
    data["fabric"]["nccl_ib_hca"] = ["roceP2p1s0f1", "rocep1s0f1"]
    path = tmp_path / "gx10x2-ds4-flash-fp8.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = load_recipe(path)
    rails = node_fabric.node_rails(recipe, "b", _hosts()["b"])
    assert node_fabric.nccl_ib_hca(recipe, rails) == ["roceP2p1s0f0", "rocep1s0f0"]
    assert node_fabric.launch_env(recipe, node_fabric.node_rails(recipe, "a", HOSTS["a"]))[
        "DS4_NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"


def test_the_gid_index_is_resolved_on_the_nodes_own_hcas(tmp_path):
    recipe = load_recipe(GX10)
    f0 = read_gid_table(trees.on_f0_port(trees.GB10, tmp_path / "f0"), read=einval_reader)
    rails_b = node_fabric.as_ansible(node_fabric.node_rails(recipe, "b", _hosts()["b"]))
    got = resolve_rails(f0, rails_b, trees.GB10_RAILS)
    assert got["gid_index"] == 3 and [h["hca"] for h in got["hcas"]] == ["rocep1s0f0", "roceP2p1s0f0"]
    # The recipe's names on that node: no such HCA, named with the fix.
    with pytest.raises(GidTableError, match="no GID table for HCA rocep1s0f1") as err:
        resolve_rails(f0, node_fabric.as_ansible(recipe.fabric.rails), trees.GB10_RAILS)
    assert "rocep1s0f0" in err.value.cause


class Recorder:
    """A head with an RDMA device, nccl-tests and mpirun that records the commands it is given."""

    name = "a"

    def __init__(self):
        self.commands: list[str] = []

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        self.commands.append(cmd)
        if cmd.startswith("ls /sys/class/infiniband"):
            return Result(0, "rocep1s0f1\n", "")
        if cmd.startswith("mpirun"):
            return Result(1, "", "not a real run")
        return Result(0, "/usr/bin/all_reduce_perf\n/usr/bin/mpirun\n", "")


def test_checks_use_each_hosts_own_names():
    recipe = load_recipe(GX10)
    rows = fabric.check_fabric_node(ShellTarget("b", []), recipe, _hosts()["b"])
    assert {r.check for r in rows} == {"fabric.link.rocep1s0f0", "fabric.gid.rocep1s0f0",
                                       "fabric.link.roceP2p1s0f0", "fabric.gid.roceP2p1s0f0"}
    assert {r.verdict for r in rows} == {SKIP}  # no RDMA device on this machine
    head = Recorder()
    fabric.check_nccl(head, _hosts(), recipe)
    (mpirun,) = [c for c in head.commands if c.startswith("mpirun")]
    assert "-np 1 -H a env NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 " in mpirun
    assert " : -np 1 -H b env NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0 " in mpirun


def test_an_hca_twice_on_one_rail_is_refused(tmp_path):
    # A rail with two HCAs (the schema allows it): an override may not name one HCA twice.
    data = yaml.safe_load(trees.GX10_RECIPE.read_text())
    data["fabric"]["rails"][0]["hcas"] = ["rocep1s0f1", "mlx5_2"]
    path = tmp_path / "gx10x2-ds4-flash-fp8.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    recipe = load_recipe(path)
    over = {"ds4_rails": {"rail0": {"netdev": "enp1s0f0np0", "hcas": ["rocep1s0f0", "rocep1s0f0"]},
                          "rail1": F0["rail1"]}}
    assert node_fabric.host_problems(recipe, "b", over) == [
        "b: HCA rocep1s0f0 is twice on rail rail0: every rail of a node needs its own HCA"]
    over["ds4_rails"]["rail0"]["hcas"] = ["rocep1s0f0", "mlx5_3"]
    assert node_fabric.host_problems(recipe, "b", over) == []
    assert node_fabric.nccl_ib_hca(recipe, node_fabric.node_rails(recipe, "b", over)) == ["rocep1s0f0", "roceP2p1s0f0"]
