"""ds4deploy.checks without hardware: the row model and exit codes, bad input, provisioning variables, the GID
table read over a command line (real sysfs layouts), ib_write_bw runs with clean-up (real captures), the
degraded-state diagnosis, and host checks run for real on this GPU-less, RDMA-less machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ds4deploy.checks import fabric, host, report, runner
from ds4deploy.checks.target import Result, ShellTarget, target_for
from ds4deploy.cli import main
from ds4deploy.core.errors import UserError
from ds4deploy.plan import check_inputs as inputs
from ds4deploy.plan import preflight
from ds4deploy.plan.inventory import read_inventory
from ds4deploy.recipe.load import load_recipe
from tests.unit.parsers._fixtures import SYSFS, fixture_text

REPO = Path(__file__).resolve().parents[2]
GX10 = "gx10x2-ds4-flash-fp8"


def _hosts(**rails):
    return {h: {"ds4_rails": {r: {"address": a} for r, a in addrs.items()}} for h, addrs in rails.items()}


# --- report ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("verdicts", "code"), [
    (["pass", "skip"], 0), (["pass", "fail"], 1), (["pass", "error"], 2), (["error", "fail", "skip"], 1), ([], 0),
])
def test_exit_code(verdicts, code):
    assert report.exit_code([report.Row("h", "c", "", "", v) for v in verdicts]) == code


def test_row_refuses_unknown_verdict():
    with pytest.raises(ValueError, match="verdict 'ok'"):
        report.Row("h", "c", "", "", "ok")


def test_tables_one_per_host_with_summary():
    from rich.console import Console

    console = Console(record=True, width=200)
    rows = [report.Row("a", "rails.mtu.rail0", "9000", "1500", "fail", "set mtu"), report.skip("b", "gpu.count", "1",
                                                                                               "no NVIDIA GPU")]
    report.print_tables(rows, "check x", console=console)
    text = console.export_text()
    assert "check x: a" in text and "check x: b" in text and "skipped: no NVIDIA GPU" in text
    assert "0 passed, 1 failed, 1 skipped, 0 could not check (2 host(s))" in text


# --- bad input and provisioning variables ---------------------------------------------------------------------


def test_rail_inputs_pass_for_a_good_inventory():
    hosts = _hosts(a={"rail0": "10.100.184.1", "rail1": "10.100.185.1"},
                   b={"rail0": "10.100.184.2", "rail1": "10.100.185.2"})
    assert inputs.rail_problems(load_recipe(GX10), hosts) == []


@pytest.mark.parametrize(("hosts", "message"), [
    (_hosts(a={"rail0": "10.100.184.1"}), "a: ds4_rails.rail1.address is missing"),
    (_hosts(a={"rail0": "10.100.184.1", "rail1": "10.100.185.1"}, b={"rail0": "10.100.184.1",
                                                                      "rail1": "10.100.185.2"}),
     "b: ds4_rails.rail0.address = 10.100.184.1 is also given to a (rail0)"),
    (_hosts(a={"rail0": "10.100.185.5", "rail1": "10.100.185.1"}),
     "a: ds4_rails.rail0.address = 10.100.185.5 is not a host address in 10.100.184.0/24"),
    (_hosts(a={"rail0": "10.100.184.255", "rail1": "10.100.185.1"}), "is not a host address"),
    (_hosts(a={"rail0": "fe80::1", "rail1": "10.100.185.1"}), "'fe80::1' is not an IPv4 address"),
])
def test_rail_inputs_refused(hosts, message):
    assert any(message in p for p in inputs.rail_problems(load_recipe(GX10), hosts))
    # The one copy of the rule is what the preflight rule rails-addresses reports.
    (verdict,) = [v for v in preflight.run(load_recipe(GX10), hosts) if v.rule == "rails-addresses"]
    assert verdict.status == "fail" and message in verdict.numbers


def test_recipe_without_fabric_needs_no_rail_addresses():
    assert inputs.rail_problems(load_recipe("cpu"), {"localhost": {}}) == []


def _recipe_with(tmp_path, name, **gpus):
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    data["hardware"]["gpus"].update(gpus)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_v100_clock_lock_above_the_datasheet_is_refused(tmp_path):
    ok = load_recipe("v100x8-ds41-flash-iq2")
    assert inputs.gpu_request_problems(ok) == []  # 1522 MHz lock, 150 W (docs/sources.md#v100x8)
    bad = load_recipe(_recipe_with(tmp_path, "v100x8-ds41-flash-iq2", graphics_clock_lock_mhz=1600))
    (problem,) = inputs.gpu_request_problems(bad)
    assert "1600 MHz" in problem and "at most 1530 MHz" in problem and "V100 datasheet" in problem


def test_rtx3090_power_above_board_power_and_gb10_power_limit_refused(tmp_path):
    rtx = load_recipe(_recipe_with(tmp_path, "rtx3090x2-xeon-ds4-flash", power_limit_w=400,
                                   graphics_clock_lock_mhz=2000))
    problems = inputs.gpu_request_problems(rtx)
    assert len(problems) == 1 and "400 W, above NVIDIA GeForce RTX 3090's maximum 350 W" in problems[0]
    gb10 = load_recipe(_recipe_with(tmp_path, GX10, power_limit_w=100))
    (problem,) = inputs.gpu_request_problems(gb10)
    assert "no settable power limit" in problem
    # Measured limits from nvidia-smi replace the datasheet when a GPU is there.
    assert inputs.gpu_request_problems(rtx, max_graphics_mhz=1900, max_power_limit_w=450, what="nvidia-smi") == [
        "hardware.gpus.graphics_clock_lock_mhz = 2000 MHz, but NVIDIA GeForce RTX 3090 runs at most 1900 MHz per the "
        "nvidia-smi: a lock above the maximum cannot be honoured"]


# --- fabric: GID table over a command line, on real sysfs layouts ---------------------------------------------


class FixtureSysfs:
    """A target whose shell runs for real, but with /sys/class/infiniband pointing at a fixture tree."""

    name = "fixture"

    def __init__(self, root: Path):
        self.root = root

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        real = str(self.root / "class" / "infiniband")
        done = subprocess.run(["sh", "-c", cmd.replace("/sys/class/infiniband", real)], capture_output=True,
                              text=True, check=False, timeout=timeout)
        return Result(done.returncode, done.stdout.replace(real, "/sys/class/infiniband"), done.stderr)


def test_gid_dump_round_trip_gb10():
    table = fabric.host_gid_table(FixtureSysfs(SYSFS / "gb10-spark-0e68"))
    # Slots 4-7 of rocep1s0f1 are empty (zero GID, EINVAL types) and skipped, as on the real node.
    assert sorted((e.hca, e.index) for e in table) == [("roceP2p1s0f1", 3)] + [("rocep1s0f1", i) for i in range(4)]
    from ds4deploy.parsers.gids import roce_v2_gid_index

    assert roce_v2_gid_index(table, "rocep1s0f1", "10.100.184.1") == 3
    assert roce_v2_gid_index(table, "roceP2p1s0f1", "10.100.185.1") == 3


def test_gid_dump_k8s_pod_skips_einval_slots():
    table = fabric.host_gid_table(FixtureSysfs(SYSFS / "k8s-macvlan-pod"))
    assert table and min(e.index for e in table) >= 4


def test_gid_dump_other_read_error_is_not_swallowed():
    dump = "/sys/class/infiniband/mlx5_0/ports/1/gids/0\t#ERR cat: Permission denied\n"
    with pytest.raises(UserError, match="Permission denied"):
        fabric.gid_table_from_dump(dump)


def test_cli_gid_index(capsys):
    assert main(["fabric", "gid-index", "--hca", "rocep1s0f1", "--ipv4", "10.100.184.1", "--sysfs",
                 str(SYSFS / "gb10-spark-0e68")]) == 0
    assert capsys.readouterr().out.strip() == "3"
    assert main(["fabric", "gid-index", "--hca", "rocep1s0f1", "--ipv4", "10.100.184.9", "--sysfs",
                 str(SYSFS / "gb10-spark-0e68")]) == 2
    assert "no RoCE v2 GID on rocep1s0f1 is ::ffff:10.100.184.9" in capsys.readouterr().err
    assert main(["fabric", "gid-index", "--hca", "x", "--ipv4", "10.0.0.1", "--sysfs", "/nonexistent"]) == 2
    assert "no RDMA device" in capsys.readouterr().err


# --- fabric: ib_write_bw runs and the degraded state ---------------------------------------------------------


@pytest.mark.parametrize(("gbit", "verdict", "hint"), [
    (111.71, "pass", ""), (13.26, "fail", "full AC power-off"), (8.0, "fail", "a reboot does not fix it"),
    (60.0, "fail", "below the recipe's minimum"), (26.0, "fail", "below the recipe's minimum"),
])
def test_bandwidth_verdict(gbit, verdict, hint):
    got, fix = fabric.bandwidth_verdict(gbit, 90.0)
    assert got == verdict and hint in fix


class Scripted:
    """A target that answers ib_write_bw client runs with a real capture and records every command it gets."""

    def __init__(self, name: str, client_output: str = "", client_rc: int = 0):
        self.name, self.client_output, self.client_rc, self.commands = name, client_output, client_rc, []

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        self.commands.append(cmd)
        if "==== " in cmd:  # the client line: one marker per job, then that job's output
            ports = re.findall(r"echo '==== (\d+)'", cmd)
            return Result(self.client_rc, "".join(f"==== {p}\n{self.client_output}\n" for p in ports), "")
        return Result(0, "", "")


@pytest.fixture(autouse=False)
def no_sleep(monkeypatch):
    monkeypatch.setattr(fabric.time, "sleep", lambda s: None)


def test_ib_write_bw_pair_parses_and_cleans_up(no_sleep):
    server, client = Scripted("head"), Scripted("worker", fixture_text("ib_write_bw-spark-vllm-docker-rdma-cm.txt"))
    (result,) = fabric.run_ib_write_bw(server, client, [("rocep1s0f1", 3, "192.168.101.1", "rocep1s0f0", 4, 18516)])
    assert result.bw_avg_gbit_s == pytest.approx(111.71)
    start, stop = server.commands
    assert "timeout 60 ib_write_bw -d rocep1s0f1 -x 3 -F --report_gbits -D 10 -p 18516" in start
    assert "echo $! > /tmp/ds4deploy-ibbw-18516.pid" in start
    assert 'kill "$p"' in stop and "rm -f /tmp/ds4deploy-ibbw-18516.pid" in stop and "pkill -f" not in stop
    assert "-d rocep1s0f0 -x 4 -F --report_gbits -D 10 -p 18516 192.168.101.1" in client.commands[0]


def test_ib_write_bw_servers_stopped_when_the_client_fails(no_sleep):
    class Boom(Scripted):
        def run(self, cmd, timeout=60.0):
            if "==== " in cmd:
                raise OSError("connection lost")
            return super().run(cmd, timeout)

    server = Scripted("head")
    with pytest.raises(OSError, match="connection lost"):
        fabric.run_ib_write_bw(server, Boom("worker"), [("a", 3, "192.168.100.1", "a", 3, 18515),
                                                         ("b", 3, "192.168.101.1", "b", 3, 18516)])
    stops = [c for c in server.commands if "kill" in c]
    assert len(stops) == 2 and all("rm -f" in c for c in stops)


def test_ib_write_bw_truncated_output_is_an_error_not_a_number(no_sleep):
    server, client = Scripted("head"), Scripted("worker", fixture_text("ib_write_bw-perftest-234-truncated.txt"))
    (result,) = fabric.run_ib_write_bw(server, client, [("rocep1s0f0", 3, "192.168.100.1", "rocep1s0f0", 3, 18515)])
    assert isinstance(result, UserError)


# --- real runs on this machine (no GPU, no RDMA device) ------------------------------------------------------


def test_this_machine_skips_gpu_and_rdma_rows_never_passes():
    local = ShellTarget("local", [])
    recipe = load_recipe(GX10)
    gpu = host.check_gpus(local, recipe) + host.check_container_gpus(local, recipe)
    assert gpu and {r.verdict for r in gpu} == {"skip"} and {r.measured for r in gpu} == {"skipped: no NVIDIA GPU"}
    fab = fabric.check_fabric_node(local, recipe, {"ds4_rails": {"rail0": {"address": "10.100.184.1"}}})
    assert fab and all(r.verdict == "skip" and r.measured == "skipped: no RDMA device" for r in fab)
    assert fabric.check_nccl(local, {"local": {}}, recipe)[0].measured == "skipped: no RDMA device"


def test_memory_and_kernel_checks_on_this_machine(tmp_path):
    local = ShellTarget("local", [])
    rows = host.check_memory(local, load_recipe("rtx3090x2-xeon-ds4-flash"))
    by = {r.check: r for r in rows}
    assert by["memory.numa_nodes"].verdict == "fail"  # one NUMA node here, the recipe needs 4
    assert by["memory.ram_per_numa"].verdict == "fail" and "GiB" in by["memory.ram_per_numa"].measured
    release = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    data = yaml.safe_load((REPO / "recipes" / f"{GX10}.yaml").read_text())
    data["hardware"]["known_bad_kernels"][0]["release"] = release[:3]
    path = tmp_path / f"{GX10}.yaml"
    path.write_text(yaml.safe_dump(data))
    (bad,) = host.check_kernel(local, load_recipe(path))
    assert bad.verdict == "fail" and "ibv_reg_mr" in bad.remediation
    (good,) = host.check_kernel(local, load_recipe(GX10))
    assert good.verdict == "pass" and good.measured == release


# --- transports and inventory selection ----------------------------------------------------------------------


def test_target_for_picks_the_transport():
    assert target_for("a", {"ds4_netns": "ns1"}).prefix == ["ip", "netns", "exec", "ns1"]
    assert target_for("a", {"ansible_connection": "local"}).prefix == []
    ssh = target_for("a", {"ansible_host": "10.0.0.5", "ansible_user": "ops", "ansible_port": 2222})
    assert ssh.remote and ssh.prefix[-1] == "ops@10.0.0.5" and ["-p", "2222"] == ssh.prefix[5:7]
    assert "BatchMode=yes" in ssh.prefix


def test_timeout_gives_rc_124():
    assert ShellTarget("local", []).run("sleep 5", timeout=0.5).rc == 124


def test_groups_and_limit():
    groups = read_inventory(REPO / "ansible" / "inventories" / "test-hosts.yml").groups
    assert groups["fabric_nodes"] == ["node-a", "node-b"] and groups["all"] == ["node-a", "node-b"]
    hosts = {"node-a": {}, "node-b": {}}
    assert list(runner.select_hosts(hosts, groups, "node-b")) == ["node-b"]
    with pytest.raises(UserError, match="no such host or group"):
        runner.select_hosts(hosts, groups, "node-z")
    with pytest.raises(UserError, match="unknown check group"):
        runner.run_checks(load_recipe("cpu"), {}, ("gpus",))


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2")
def test_unreachable_host_is_could_not_check(capsys, tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"gone": {"ds4_netns": "provision-does-not-exist"}}}}))
    assert main(["check", "run", "--recipe", "cpu", "--inventory", str(inv)]) == 2
    assert "could not check" in capsys.readouterr().out


def test_fabric_recipe_checks_memlock_even_when_the_recipe_does_not_ask():
    """A fabric recipe with container.memlock_unlimited: false (tests/unit/fixtures/field_recipes) used to turn the
    memlock row into a skip; RDMA needs it whatever the flag says (preflight rule rdma-memlock). The limit is set
    for real with util-linux prlimit around the check's own `ulimit -l`."""
    recipe = load_recipe(Path(__file__).parent / "fixtures" / "field_recipes" / "gx10-no-memlock.yaml")
    limited = ShellTarget("node", ["prlimit", "--memlock=65536:65536"])
    (row,) = [r for r in host.check_memory(limited, recipe) if r.check == "memory.memlock"]
    assert (row.verdict, row.measured) == ("fail", "64")
    assert "container.memlock_unlimited: true" in row.remediation
    # A recipe without RDMA that does not ask still skips.
    (row,) = [r for r in host.check_memory(limited, load_recipe("cpu")) if r.check == "memory.memlock"]
    assert row.verdict == "skip"


class NcclHead:
    """A head node with an RDMA device, nccl-tests and mpirun, whose mpirun prints `output` (a real capture)."""

    name = "head"

    def __init__(self, output: str, rc: int = 0):
        self.output, self.rc = output, rc

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        if cmd.startswith("ls /sys/class/infiniband"):
            return Result(0, "rocep1s0f1\nroceP2p1s0f1\n", "")
        if cmd.startswith("mpirun"):
            return Result(self.rc, self.output, "")
        return Result(0, "/usr/bin/all_reduce_perf\n/usr/bin/mpirun\n", "")


def test_nccl_check_fails_a_run_with_wrong_elements_whatever_its_bandwidth():
    recipe = load_recipe(GX10)  # needs 0.85 x 2 rails x 90 Gb/s / 8 = 19.1 GB/s
    h200 = fixture_text("nccl_tests-nvidia-tools-image-h200.txt")  # clean, 36.2 GB/s average
    (ok,) = fabric.check_nccl(NcclHead(h200), {"a": {}, "b": {}}, recipe)
    assert ok.verdict == "pass"
    # The same capture with one in-place #wrong count made non-zero (the first row's last column), and with the
    # out-of-bounds footer of a failed run: the bandwidth still passes, the check must not.
    first = next(line for line in h200.splitlines() if line.strip().startswith("8 "))
    one_wrong = h200.replace(first, first.rstrip()[:-1] + "7")
    (bad,) = fabric.check_nccl(NcclHead(one_wrong), {"a": {}, "b": {}}, recipe)
    assert bad.verdict == "fail" and "7 wrong elements in 1 of 32 sizes from 8 B" in bad.measured
    assert "wrong data" in bad.remediation
    oob = h200.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    (bad,) = fabric.check_nccl(NcclHead(oob), {"a": {}, "b": {}}, recipe)
    assert bad.verdict == "fail" and "out-of-bounds 3" in bad.measured
    # A real corrupt run (RTX 3090 pair, 108 out-of-bounds values): named as wrong data, not as slow.
    real = fixture_text("nccl_tests-rtx3090-inc-wrong-values.txt")
    (bad,) = fabric.check_nccl(NcclHead(real, rc=1), {"a": {}, "b": {}}, recipe)
    assert bad.verdict == "fail" and "wrong results" in bad.measured and "do not serve" in bad.remediation


class Ofed(FixtureSysfs):
    """The GB10 sysfs fixture on a host whose `rdma link show` fails (here for real: this machine has no RDMA
    netlink) and whose `ibdev2netdev` (MLNX_OFED) prints the DGX Spark playbook's capture, or is missing."""

    def __init__(self, root: Path, ibdev2netdev: str | None):
        super().__init__(root)
        self.ibdev2netdev = ibdev2netdev

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        if cmd == "ibdev2netdev":
            if self.ibdev2netdev is None:
                return Result(127, "", "sh: 1: ibdev2netdev: not found")
            return Result(0, self.ibdev2netdev, "")
        return super().run(cmd, timeout)


def test_link_rows_read_ibdev2netdev_where_rdma_link_fails():
    recipe = load_recipe(GX10)
    rails = {"ds4_rails": {"rail0": {"address": "10.100.184.1"}, "rail1": {"address": "10.100.185.1"}}}
    target = Ofed(SYSFS / "gb10-spark-0e68", fixture_text("ibdev2netdev-dgx-spark-playbooks-connect-two-sparks.txt"))
    if target.run("rdma link show").ok:
        pytest.skip("this machine answers `rdma link show`; the fallback is not exercised")
    by = {r.check: r for r in fabric.check_fabric_node(target, recipe, rails)}
    assert by["fabric.link.rocep1s0f1"].verdict == "pass"
    assert by["fabric.link.rocep1s0f1"].measured == "enp1s0f1np1 Up (ibdev2netdev)"
    assert by["fabric.link.roceP2p1s0f1"].verdict == "pass"
    assert by["fabric.gid.rocep1s0f1"].measured == "index 3"
    # The other port pair cabled: the recipe's f1 HCAs are Down -> fail, naming the netdev.
    f0 = fixture_text("ibdev2netdev-dgx-spark-playbooks-connect-two-sparks.txt").replace("(Up)", "(X)").replace(
        "(Down)", "(Up)").replace("(X)", "(Down)")
    by = {r.check: r for r in fabric.check_fabric_node(Ofed(SYSFS / "gb10-spark-0e68", f0), recipe, rails)}
    assert by["fabric.link.rocep1s0f1"].verdict == "fail"
    assert "enp1s0f1np1 Down" in by["fabric.link.rocep1s0f1"].measured
    # Neither tool: an error quoting both.
    by = {r.check: r for r in fabric.check_fabric_node(Ofed(SYSFS / "gb10-spark-0e68", None), recipe, rails)}
    row = by["fabric.link.rocep1s0f1"]
    assert row.verdict == "error" and "rdma link show" in row.measured and "ibdev2netdev" in row.measured
