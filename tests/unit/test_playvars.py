"""One channel from recipe to Ansible (ds4deploy.plan.playvars): every variable a play reads comes from one function,
written once per run after the checks of its scope passed; nothing is written when one fails."""

from __future__ import annotations

import shutil

import pytest
import yaml

from ds4deploy.cli import main
from ds4deploy.core.errors import UserError
from ds4deploy.core.keys import KEY_PATTERN, KEY_RULE
from ds4deploy.plan import playvars
from ds4deploy.plan.inventory import read_inventory
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.render import compose as render

LOCAL = REPO_ROOT / "ansible" / "inventories" / "local.yml"
TWO = REPO_ROOT / "ansible" / "inventories" / "two-node-local.yml"
GX10 = "gx10x2-ds4-flash-fp8"
GX10_HOSTS = {"a": {"ds4_node_rank": 0, "ansible_host": "10.0.0.1",
                    "ds4_rails": {"rail0": {"address": "10.100.184.1", "mtu": 9000},
                                  "rail1": {"address": "10.100.185.1", "mtu": 9000}}},
              "b": {"ds4_node_rank": 1, "ansible_host": "10.0.0.2",
                    "ds4_rails": {"rail0": {"address": "10.100.184.2", "mtu": 9000},
                                  "rail1": {"address": "10.100.185.2", "mtu": 9000}}}}


def test_play_vars_are_the_committed_render_plus_provisioning_plus_the_plan():
    recipe = load_recipe("cpu-2node-tp")
    got = playvars.play_vars(recipe, read_inventory(TWO).hosts)
    committed = yaml.safe_load((render.COMPOSE_DIR / "cpu-2node-tp" / "deploy-vars.yml").read_text())
    assert {k: got[k] for k in committed} == committed
    assert {k: got[k] for k in playvars.provision_vars(recipe)} == playvars.provision_vars(recipe)
    assert got["ds4_node_plan"]["node-b"]["role"] == "worker"
    assert got["ds4_node_plan"]["node-b"]["launch_env"]["DS4_NODE_RANK"] == "1"
    assert got["ds4_node"] == "{{ ds4_node_plan[inventory_hostname] }}"
    assert got["ds4_key_pattern"] == KEY_PATTERN  # the preflight's key form (tests/unit/test_keys.py)
    assert got["ds4_key_rule"] == KEY_RULE == "32 to 1024 characters of A-Z a-z 0-9 _ -"  # and its messages
    # Provisioning needs no node plan (the test hosts carry no ranks).
    assert "ds4_node_plan" not in playvars.play_vars(recipe, {}, "provision")


def test_provision_vars_gx10():
    v = playvars.provision_vars(load_recipe(GX10))
    assert [r["netdev"] for r in v["ds4_fabric_rails"]] == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert [r["hcas"] for r in v["ds4_fabric_rails"]] == [["rocep1s0f1"], ["roceP2p1s0f1"]]
    assert {r["prefix"] for r in v["ds4_fabric_rails"]} == {24} and v["ds4_fabric_master_port"] == 25000
    assert v["ds4_driver_min_version"] == "580.65.06" and v["ds4_memlock_unlimited"] is True
    assert v["ds4_known_bad_kernels"][0]["release"] == "7.0.0-1019-nvidia"
    cpu = playvars.provision_vars(load_recipe("cpu"))
    assert cpu["ds4_fabric_rails"] == [] and cpu["ds4_driver_min_version"] is None


def test_written_once_and_only_rewritten_when_it_changes(tmp_path):
    recipe = load_recipe("cpu")
    hosts = read_inventory(LOCAL).hosts
    path = playvars.write_play_vars(recipe, hosts, "operate", "local.yml", dest_dir=tmp_path)
    assert path == tmp_path / "cpu.operate.yml"
    data = yaml.safe_load(path.read_text())
    assert data["ds4_node_plan"] == {"localhost": {**data["ds4_node_plan"]["localhost"], "role": "single"}}
    before = path.stat().st_mtime_ns
    assert playvars.write_play_vars(recipe, hosts, "operate", "local.yml", dest_dir=tmp_path) == path
    assert path.stat().st_mtime_ns == before


def test_a_rail_address_twice_is_refused_before_anything_is_written(tmp_path):
    hosts = {**GX10_HOSTS, "b": {**GX10_HOSTS["b"], "ds4_rails": {**GX10_HOSTS["b"]["ds4_rails"],
                                                                   "rail0": {"address": "10.100.184.1", "mtu": 9000}}}}
    playvars.write_play_vars(load_recipe(GX10), GX10_HOSTS, "provision", "inv", dest_dir=tmp_path)
    shutil.rmtree(tmp_path)
    with pytest.raises(UserError) as err:
        playvars.write_play_vars(load_recipe(GX10), hosts, "provision", "inv", dest_dir=tmp_path)
    assert "nothing was changed on any host" in err.value.cause
    assert "preflight rails-addresses: b: ds4_rails.rail0.address = 10.100.184.1 is also given to a (rail0)" in \
        err.value.cause
    assert not tmp_path.exists()


def test_a_gpu_setting_the_datasheet_refuses_stops_deploy_but_not_operate(tmp_path):
    data = yaml.safe_load((REPO_ROOT / "recipes" / "v100x8-ds41-flash-iq2.yaml").read_text())
    data["hardware"]["gpus"]["graphics_clock_lock_mhz"] = 1600
    path = tmp_path / "v100x8-ds41-flash-iq2.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    hosts = read_inventory(LOCAL).hosts
    with pytest.raises(UserError, match=r"1600 MHz, but .* runs at most 1530 MHz"):
        playvars.write_play_vars(recipe, hosts, "provision", "local.yml", dest_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # A deployed stack can always be looked at, stopped or restarted.
    assert playvars.write_play_vars(recipe, hosts, "operate", "local.yml", dest_dir=tmp_path / "out").is_file()


def test_a_stale_render_stops_a_deploy(tmp_path, monkeypatch):
    shutil.copytree(render.COMPOSE_DIR / "cpu", tmp_path / "compose" / "cpu")
    vars_file = tmp_path / "compose" / "cpu" / "deploy-vars.yml"
    vars_file.write_text(vars_file.read_text().replace("ds4_port: 8000", "ds4_port: 8001"))
    monkeypatch.setattr(render, "COMPOSE_DIR", tmp_path / "compose")
    with pytest.raises(UserError, match=r"committed renders are stale:\n  compose/cpu/deploy-vars.yml differs") as err:
        playvars.write_play_vars(load_recipe("cpu"), read_inventory(LOCAL).hosts, "deploy", "local.yml",
                                 dest_dir=tmp_path / "out")
    assert err.value.code == 1 and not (tmp_path / "out").exists()


def test_cli_prints_the_file(capsys):
    assert main(["vars", "cpu", "--inventory", str(LOCAL), "--scope", "operate"]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(playvars.VARS_DIR / "cpu.operate.yml")
    assert main(["vars", "cpu-2node-tp", "--inventory", str(LOCAL), "--scope", "operate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no head in the inventory") and "\nfix: " in err


def test_a_failing_preflight_rule_prints_its_table_and_the_message(tmp_path, capsys):
    # The e2e case (tests/e2e/test_bad_input.py) without a deploy: k = 3 on the GB10 image breaks two rules.
    data = yaml.safe_load((REPO_ROOT / "recipes" / "cpu.yaml").read_text())
    data["engine"]["flavor"] = "gb10-community"
    data["serving"]["speculative"] = {"method": "dspark", "num_speculative_tokens": 3}
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["vars", str(path), "--inventory", str(LOCAL), "--scope", "provision"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "gb10-dspark-k5" in out.err and "cudagraph-capture-size" in out.err and " passed, 2 failed" in out.err
    assert "error: 2 problem(s) with recipe cpu" in out.err and "\nfix: " in out.err
