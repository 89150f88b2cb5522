"""Fabric checks: RDMA links, the per-node RoCE v2 GID index, ib_write_bw between two nodes, nccl-tests.

A host without ``/sys/class/infiniband/*`` reports every fabric row as "skipped: no RDMA device", never pass.
Every host is checked on its own HCA names (`ds4deploy.plan.node_fabric.node_rails`: the inventory may override the
recipe's per node, e.g. one node cabled on the f0 port and its peer on f1).

ib_write_bw (perftest) runs with the flags of docs/sources.md#rail-bandwidth: ``ib_write_bw -d <hca> -x <gid index> -F
--report_gbits -D <seconds> -p <port> [<server address>]``. The server side starts first in the background on
the head node under coreutils ``timeout`` (so it ends even when no client comes); the client runs on the peer;
afterwards the server is stopped by its own process id and its files are removed, also when the client failed.
Results are parsed by `ds4deploy.parsers.ib_write_bw` (Gb/s = 10^9 bit/s).

Thresholds: fabric.min_rail_gbit_s per rail (docs/sources.md#rail-bandwidth: ~92-112 Gb/s per rail), twice that
with both rails at once (docs/sources.md#gx10-degraded-link: 196.02 Gb/s both rails). A result between 8 and 25 Gb/s is
the ConnectX-7 degraded state (docs/sources.md#gx10-degraded-link: 13.26 Gb/s with every counter clean;
NVIDIA/dgx-spark-playbooks PR #108 `check-connectx-bandwidth` gives 8-25 Gb/s its own status): only a full AC power-off
and discharge fixes it, a reboot does not.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from ds4deploy.checks.report import ERROR, FAIL, PASS, Row, skip
from ds4deploy.checks.target import Target
from ds4deploy.core.errors import UserError
from ds4deploy.parsers.gids import NO_RDMA, GidEntry, read_gid_table, roce_v2_gid_index
from ds4deploy.parsers.ib_write_bw import parse_ib_write_bw
from ds4deploy.parsers.nccl_tests import parse_nccl_tests
from ds4deploy.parsers.rdma_link import parse_ibdev2netdev, parse_rdma_link_text
from ds4deploy.plan.node_fabric import nccl_ib_hca, node_rails
from ds4deploy.recipe.schema import Rail, Recipe

SRC_BW = "recipe fabric.min_rail_gbit_s; docs/sources.md#gx10-degraded-link: 108.33 Gb/s per rail, 196.02 both"
# The degraded ConnectX-7 band, Gb/s: NVIDIA/dgx-spark-playbooks PR #108 (check-connectx-bandwidth status 2).
DEGRADED_GBIT_S = (8.0, 25.0)
DEGRADED_FIX = ("ConnectX-7 degraded state (~13 Gb/s with clean counters, docs/sources.md#gx10-degraded-link): "
                "power both nodes off at the wall, unplug them and let them discharge, then power on; a reboot does "
                "not fix it (13.26 -> 108.33 Gb/s per rail after a full AC power-off)")
# ib_write_bw duration (-D, s) and the server's own time limit (s): the server must outlive the client's
# connection set-up and run, and end by itself when the client never comes.
IB_DURATION_S = 10
IB_SERVER_TIMEOUT_S = 60
IB_BASE_PORT = 18515  # perftest's default port; rail i uses IB_BASE_PORT + i
# NCCL bus bandwidth expected per Gb/s of RDMA write bandwidth: docs/sources.md#gx10-roce-checklist, 21.6 GB/s busbw
# over both rails where ib_write_bw gave 196.02 Gb/s (24.5 GB/s), i.e. 0.88; ds4deploy asks for 0.85 x the rails'
# minimum.
NCCL_BUSBW_PER_RDMA = 0.85
EINVAL_MARK = "#EINVAL"
# nccl-tests checks every result (validation on by default): a non-zero #wrong or out-of-bounds count means the
# collective delivered wrong data, whatever the bandwidth. Reports: NVIDIA/nccl-tests #7 and #131; NCCL's
# troubleshooting guide, GPU Direct section, on point-to-point PCI messages that fail.
NCCL_WRONG_SRC = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#gpu-direct; "
                  "https://github.com/NVIDIA/nccl-tests/issues/131")
NCCL_WRONG_FIX = ("NCCL delivered wrong data: do not serve on this fabric. Rerun with NCCL_DEBUG=INFO to see the "
                  "transport; isolate GPUDirect RDMA with NCCL_NET_GDR_LEVEL=LOC and peer-to-peer with "
                  "NCCL_P2P_DISABLE=1; disable PCIe ACS / the IOMMU as NCCL's troubleshooting guide describes; "
                  "update NCCL, the driver and the NIC firmware")

def gid_dump_command(sysfs: str | Path = "/sys") -> str:
    """The shell command that dumps every GID slot's gid, type and ndev under ``<sysfs>/class/infiniband``.

    One line per file, ``<path>\\t<value>``; ``<path>\\t#EINVAL`` when the read fails with EINVAL (an empty slot,
    see `ds4deploy.parsers.gids`), ``<path>\\t#ERR <text>`` for any other failed read; no output when the node has
    no RDMA device. Read-only; POSIX sh. The fabric checks (`ds4deploy check run`) run it over their target, which
    reaches the node by ssh or a network namespace; the deploy reads the table on the node itself instead (the
    Ansible module ds4_gid_index, ansible/library/ds4_gid_index.py, with the same parser).

    Args:
        sysfs: the sysfs root on the node (``/sys``; tests point it at a fixture tree laid out the same way).
    """
    base = shlex.quote(str(sysfs).rstrip("/")) + "/class/infiniband/*/ports/*"
    return (
        f"for f in {base}/gids/* {base}/gid_attrs/types/* {base}/gid_attrs/ndevs/*; do [ -e \"$f\" ] || continue; "
        "if v=$(cat \"$f\" 2>&1); then printf '%s\\t%s\\n' \"$f\" \"$v\"; "
        "else case \"$v\" in *'Invalid argument'*) printf '%s\\t#EINVAL\\n' \"$f\";; "
        "*) printf '%s\\t#ERR %s\\n' \"$f\" \"$v\";; esac; fi; done"
    )


# The dump of this host's /sys, as the fabric checks run it.
_GID_DUMP = gid_dump_command()


def rdma_devices(target: Target) -> list[str]:
    """RDMA device names under /sys/class/infiniband on the host ([] when there is none)."""
    out = target.run("ls /sys/class/infiniband 2>/dev/null")
    return out.stdout.split() if out.ok else []


def gid_table_from_dump(dump: str, sysfs: str | Path = "/sys") -> list[GidEntry]:
    """Rebuild a host's GID table from `gid_dump_command` output and read it with `read_gid_table`.

    Args:
        dump: lines ``<sysfs>/class/infiniband/<hca>/ports/<p>/<file>\\t<value>``; ``#EINVAL`` marks a read that
            failed with EINVAL on the host, ``#ERR <text>`` any other failed read. Other lines are ignored.
        sysfs: the root the dump was taken under (the ``sysfs`` given to `gid_dump_command`).

    Raises:
        UserError: a read failed with something other than EINVAL (as `read_gid_table` does), or a malformed GID;
            the message names the host's path under `sysfs`, not the temporary copy it was read from.
    """
    import errno

    prefix = str(sysfs).rstrip("/") + "/"
    with tempfile.TemporaryDirectory(prefix="ds4deploy-gids-") as tmp:
        root = Path(tmp)
        for line in dump.splitlines():
            path, sep, value = line.partition("\t")
            if not sep or not path.startswith(prefix + "class/infiniband/") or "/../" in path:
                continue
            dest = root / path.removeprefix(prefix)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(value + "\n")

        def reader(path: Path) -> str:
            text = path.read_text()
            if text.strip() == EINVAL_MARK:
                raise OSError(errno.EINVAL, "Invalid argument", str(path))
            if text.startswith("#ERR"):
                raise OSError(errno.EIO, text[5:].strip(), str(path))
            return text

        try:
            return read_gid_table(root, read=reader)
        except UserError as exc:
            # Name the host's own path, not this temporary copy of its tree.
            raise UserError(exc.cause.replace(str(root), prefix.rstrip("/")), exc.fix, exc.code) from exc


def host_gid_table(target: Target) -> list[GidEntry]:
    """The host's GID table, read from its /sys over the target.

    Raises:
        UserError: the dump could not run, or a slot could not be read (see `gid_table_from_dump`).
    """
    out = target.run(_GID_DUMP, timeout=120)
    if not out.ok:
        raise UserError(f"could not read the GID table on {target.name}: {out.stderr.strip()[:200]}",
                        "run the check as root on the host")
    return gid_table_from_dump(out.stdout)


def _rail_ipv4(hostvars: dict, rail: Rail) -> str | None:
    return ((hostvars.get("ds4_rails") or {}).get(rail.name) or {}).get("address")


def port_states(target: Target) -> tuple[dict[str, tuple[bool, str]] | None, str]:
    """Each RDMA device's port state on the host: ``{hca: (usable, state as shown)}`` and the tool that said so.

    Reads ``rdma link show`` (iproute2); where that tool is missing, fails or lists no port (MLNX_OFED hosts with an
    old iproute2), reads ``ibdev2netdev`` instead. Returns ``(None, why)`` when neither answers, `why` quoting both.
    """
    out = target.run("rdma link show")
    if out.ok:
        try:
            links = parse_rdma_link_text(out.stdout)
        except UserError as exc:
            first = exc.cause
        else:
            if links:
                return {x.device: (x.is_up, f"{x.state} / {x.physical_state}") for x in links}, "rdma link show"
            first = "`rdma link show` listed no port"
    else:
        first = f"`rdma link show`: {out.stderr.strip()[:160] or f'exit {out.rc}'}"
    alt = target.run("ibdev2netdev")
    if not alt.ok:
        return None, f"{first}; `ibdev2netdev`: {alt.stderr.strip()[:100] or f'exit {alt.rc}'}"
    try:
        mapped = parse_ibdev2netdev(alt.stdout)
    except UserError as exc:
        return None, f"{first}; {exc.cause}"
    if not mapped:
        return None, f"{first}; `ibdev2netdev` listed no port"
    return {m.device: (m.is_up, m.shown) for m in mapped}, "ibdev2netdev"


def check_fabric_node(target: Target, recipe: Recipe, hostvars: dict) -> list[Row]:
    """Per-node fabric rows: RDMA link state and RoCE v2 GID index of every HCA of every rail.

    Returns:
        ``fabric.link.<hca>`` and ``fabric.gid.<hca>`` rows; skips when the recipe has no fabric or the host has no
        RDMA device.
    """
    host = target.name
    if recipe.fabric is None:
        return [skip(host, "fabric", "no fabric", f"recipe {recipe.name} has no fabric section")]
    hcas = [(rail, hca) for rail in node_rails(recipe, host, hostvars) for hca in rail.hcas]
    if not rdma_devices(target):
        return [skip(host, f"fabric.{kind}.{hca}", "RDMA port", NO_RDMA) for _, hca in hcas for kind in ("link", "gid")]
    rows: list[Row] = []
    links, why = port_states(target)
    for _rail, hca in hcas:
        if links is None:
            rows.append(Row(host, f"fabric.link.{hca}", "ACTIVE / LINK_UP", why, ERROR,
                            "install iproute2 with the rdma tool (or MLNX_OFED's ibdev2netdev); run as root"))
            continue
        link = links.get(hca)
        if link is None:
            rows.append(Row(host, f"fabric.link.{hca}", "ACTIVE / LINK_UP", f"no RDMA device {hca} ({why})", FAIL,
                            "check this host's rail HCAs (the recipe's fabric.rails[].hcas, or the inventory's "
                            "ds4_rails.<rail>.hcas for this host) against `rdma link show` / `ibdev2netdev`"))
        else:
            up, shown = link
            rows.append(Row(host, f"fabric.link.{hca}", "ACTIVE / LINK_UP", shown, PASS if up else FAIL,
                            "" if up else "bring the port up (cable, `ip link set <netdev> up`)",
                            "iproute2 rdma/link.c states; mlnx-tools ibdev2netdev"))
    try:
        table = host_gid_table(target)
    except UserError as exc:
        return rows + [Row(host, f"fabric.gid.{hca}", "RoCE v2 GID", exc.cause, ERROR, exc.fix) for _, hca in hcas]
    for rail, hca in hcas:
        ipv4 = _rail_ipv4(hostvars, rail)
        if ipv4 is None:
            rows.append(Row(host, f"fabric.gid.{hca}", "RoCE v2 GID of the rail address", "no rail address", ERROR,
                            f"add ds4_rails.{rail.name}.address to the inventory"))
            continue
        try:
            index = roce_v2_gid_index(table, hca, ipv4)
        except UserError as exc:
            rows.append(Row(host, f"fabric.gid.{hca}", f"RoCE v2 GID ::ffff:{ipv4}", exc.cause, FAIL, exc.fix,
                            "docs/sources.md#gid-resolution"))
        else:
            rows.append(Row(host, f"fabric.gid.{hca}", f"RoCE v2 GID ::ffff:{ipv4}", f"index {index}", PASS, "",
                            "resolved on this node (the index differs per node and moves after reboots)"))
    return rows


def bandwidth_verdict(gbit_s: float, minimum: float) -> tuple[str, str]:
    """(verdict, remediation) for a measured ib_write_bw average against `minimum` Gb/s."""
    if gbit_s >= minimum:
        return PASS, ""
    low, high = DEGRADED_GBIT_S
    if low <= gbit_s <= high:
        return FAIL, DEGRADED_FIX
    return FAIL, ("below the recipe's minimum: check MTU 9000 on both ends, that the rail's HCA and GID index are "
                  "right, PCIe link width (`lspci -vv`), and pause/error counters (`ethtool -S`)")


def _start_servers(server: Target, jobs: list[tuple[str, int, int]]) -> list[str]:
    """Start one ib_write_bw server per (hca, gid index, port) in the background; returns their pid files."""
    pidfiles = []
    for hca, gid, port in jobs:
        base = f"/tmp/ds4deploy-ibbw-{port}"  # noqa: S108 (on the node; removed in _stop_servers)
        cmd = (f"timeout {IB_SERVER_TIMEOUT_S} ib_write_bw -d {shlex.quote(hca)} -x {gid} -F --report_gbits "
               f"-D {IB_DURATION_S} -p {port}")
        server.run(f"nohup sh -c {shlex.quote(cmd)} > {base}.log 2>&1 & echo $! > {base}.pid", timeout=15)
        pidfiles.append(f"{base}.pid")
    time.sleep(1.0)  # the server must listen before the client connects
    return pidfiles


def _stop_servers(server: Target, pidfiles: Iterable[str]) -> None:
    """Stop the servers started by `_start_servers` by process id (never by name) and remove their files."""
    for pidfile in pidfiles:
        base = pidfile.removesuffix(".pid")
        server.run(f"p=$(cat {pidfile} 2>/dev/null); [ -n \"$p\" ] && kill \"$p\" 2>/dev/null; "
                   f"pkill -P \"$p\" 2>/dev/null; rm -f {pidfile} {base}.log; true", timeout=15)


def run_ib_write_bw(server: Target, client: Target, jobs: list[tuple[str, int, str, str, int, int]]) -> list:
    """Run ib_write_bw pairs at once: each job (server hca, server gid, server address, client hca, client gid,
    port); the two ends of a rail may have different HCA names (`ds4deploy.plan.node_fabric`).

    Returns:
        Per job, the parsed `IbWriteBwResult` or the `UserError`/text explaining why there is none.
    """
    pidfiles = _start_servers(server, [(shca, sgid, port) for shca, sgid, _addr, _chca, _cgid, port in jobs])
    try:
        cmds = [f"timeout {IB_SERVER_TIMEOUT_S} ib_write_bw -d {shlex.quote(chca)} -x {cgid} -F --report_gbits "
                f"-D {IB_DURATION_S} -p {port} {shlex.quote(addr)}" for _shca, _sgid, addr, chca, cgid, port in jobs]
        # All clients in one shell so both rails load the fabric at the same time; outputs split by a marker.
        line = " & ".join(f"( {c} > /tmp/ds4deploy-ibbw-client-{j[5]}.log 2>&1 )" for c, j in zip(cmds, jobs,
                                                                                                  strict=True))
        line += " ; wait; " + "; ".join(f"echo '==== {j[5]}'; cat /tmp/ds4deploy-ibbw-client-{j[5]}.log; "
                                        f"rm -f /tmp/ds4deploy-ibbw-client-{j[5]}.log" for j in jobs)
        out = client.run(line, timeout=IB_SERVER_TIMEOUT_S + 30)
    finally:
        _stop_servers(server, pidfiles)
    parts = {}
    current = None
    for text_line in out.stdout.splitlines():
        if text_line.startswith("==== "):
            current = int(text_line[5:])
            parts[current] = []
        elif current is not None:
            parts[current].append(text_line)
    results = []
    for job in jobs:
        text = "\n".join(parts.get(job[5], []))
        try:
            results.append(parse_ib_write_bw(text))
        except UserError as exc:
            results.append(exc)
    return results


def check_bandwidth(server: Target, server_vars: dict, client: Target, client_vars: dict,
                    recipe: Recipe) -> list[Row]:
    """ib_write_bw from `client` to `server`, per rail and then both rails at once (rows on the client's host), each
    end on its own first HCA of the rail (`ds4deploy.plan.node_fabric.node_rails`)."""
    host = client.name
    if recipe.fabric is None:
        return [skip(host, "fabric.ib_write_bw", "no fabric", f"recipe {recipe.name} has no fabric section")]
    rails = recipe.fabric.rails
    names = [f"fabric.ib_write_bw.{r.name}" for r in rails] + ["fabric.ib_write_bw.all_rails"]
    minimum = recipe.fabric.min_rail_gbit_s
    expects = [f">= {minimum:g} Gb/s"] * len(rails) + [f">= {minimum * len(rails):g} Gb/s"]
    for t in (server, client):
        if not rdma_devices(t):
            return [skip(host, n, e, f"{NO_RDMA} on {t.name}") for n, e in zip(names, expects, strict=True)]
    for t in (server, client):
        if not t.run("command -v ib_write_bw").ok:
            return [Row(host, n, e, f"ib_write_bw not installed on {t.name}", ERROR, "install perftest")
                    for n, e in zip(names, expects, strict=True)]
    try:
        stable, ctable = host_gid_table(server), host_gid_table(client)
    except UserError as exc:
        return [Row(host, n, e, exc.cause, ERROR, exc.fix) for n, e in zip(names, expects, strict=True)]
    jobs = []
    theirs, mine = node_rails(recipe, server.name, server_vars), node_rails(recipe, host, client_vars)
    for i, rail in enumerate(rails):
        shca, chca = theirs[i].hcas[0], mine[i].hcas[0]
        saddr, caddr = _rail_ipv4(server_vars, rail), _rail_ipv4(client_vars, rail)
        try:
            jobs.append((shca, roce_v2_gid_index(stable, shca, saddr or ""), saddr,
                         chca, roce_v2_gid_index(ctable, chca, caddr or ""), IB_BASE_PORT + i))
        except UserError as exc:
            return [Row(host, n, e, exc.cause, ERROR, exc.fix) for n, e in zip(names, expects, strict=True)]
    rows = []
    for job, name, expected in zip(jobs, names, expects, strict=False):
        rows.append(_bw_row(host, name, expected, run_ib_write_bw(server, client, [job])[0], minimum, server.name))
    together = run_ib_write_bw(server, client, jobs)
    failed = [r for r in together if isinstance(r, UserError)]
    if failed:
        rows.append(Row(host, names[-1], expects[-1], failed[0].cause, ERROR, failed[0].fix, SRC_BW))
    else:
        total = sum(r.bw_avg_gbit_s for r in together)
        verdict, fix = bandwidth_verdict(total / len(together), minimum)
        rows.append(Row(host, names[-1], expects[-1], " + ".join(f"{r.bw_avg_gbit_s:.2f}" for r in together)
                        + f" = {total:.2f} Gb/s", verdict, fix, SRC_BW))
    return rows


def _bw_row(host: str, name: str, expected: str, result, minimum: float, server: str) -> Row:
    if isinstance(result, UserError):
        return Row(host, name, expected, result.cause, ERROR, f"{result.fix} (server {server})", SRC_BW)
    verdict, fix = bandwidth_verdict(result.bw_avg_gbit_s, minimum)
    return Row(host, name, expected, f"{result.bw_avg_gbit_s:.2f} Gb/s ({result.device})", verdict, fix, SRC_BW)


def nccl_min_busbw_gbyte_s(recipe: Recipe) -> float:
    """The all-reduce bus bandwidth (GB/s) the fabric must give: NCCL_BUSBW_PER_RDMA x rails x min_rail / 8."""
    assert recipe.fabric is not None
    return NCCL_BUSBW_PER_RDMA * len(recipe.fabric.rails) * recipe.fabric.min_rail_gbit_s / 8


def check_nccl(head: Target, hosts: dict[str, dict], recipe: Recipe) -> list[Row]:
    """nccl-tests all_reduce_perf across `hosts` (mpirun from `head`), where nccl-tests and mpirun are installed.

    Args:
        head: the host mpirun starts from.
        hosts: host name -> inventory variables, one rank per host.
        recipe: the recipe (its fabric).

    Runs with ``NCCL_TESTS_MIN_BW`` set to the expected bus bandwidth so nccl-tests itself fails a slow run, and
    each host's own NCCL_IB_HCA (`ds4deploy.plan.node_fabric.nccl_ib_hca`): one mpirun app context per host, whose
    program is ``env NCCL_IB_HCA=... all_reduce_perf``, so each rank gets its node's names (Open MPI's MPMD form,
    ``mpirun <context> : <context>``, https://docs.open-mpi.org/en/main/man-openmpi/man1/mpirun.1.html).
    """
    host = head.name
    if recipe.fabric is None:
        return [skip(host, "fabric.nccl_all_reduce", "no fabric", f"recipe {recipe.name} has no fabric section")]
    need = nccl_min_busbw_gbyte_s(recipe)
    expected = f">= {need:.1f} GB/s bus bandwidth"
    if not rdma_devices(head):
        return [skip(host, "fabric.nccl_all_reduce", expected, NO_RDMA)]
    if not head.run("command -v all_reduce_perf && command -v mpirun").ok:
        return [skip(host, "fabric.nccl_all_reduce", expected, "nccl-tests (all_reduce_perf) or mpirun not installed")]
    contexts = [f"-np 1 -H {shlex.quote(name)} env "
                f"NCCL_IB_HCA={shlex.quote(','.join(nccl_ib_hca(recipe, node_rails(recipe, name, hv))))} "
                f"NCCL_TESTS_MIN_BW={need:.2f} all_reduce_perf -b 1G -e 1G -f 2 -g 1" for name, hv in hosts.items()]
    out = head.run("mpirun --allow-run-as-root " + " : ".join(contexts), timeout=600)
    try:
        result = parse_nccl_tests(out.stdout)
    except UserError as exc:
        return [Row(host, "fabric.nccl_all_reduce", expected, exc.cause, ERROR, exc.fix)]
    if result.data_corrupt:
        bad = [r for r in result.rows if (r.oop_wrong or 0) + (r.ip_wrong or 0) > 0]
        where = f" in {len(bad)} of {len(result.rows)} sizes from {bad[0].size_bytes} B" if bad else ""
        return [Row(host, "fabric.nccl_all_reduce", f"{expected}, 0 wrong elements",
                    f"wrong results: {result.wrong_elements:,} wrong elements{where}, out-of-bounds "
                    f"{result.out_of_bounds}", FAIL, NCCL_WRONG_FIX, NCCL_WRONG_SRC)]
    got = result.avg_busbw_gbyte_s or 0.0
    ok = got >= need and out.ok
    return [Row(host, "fabric.nccl_all_reduce", expected, f"{got:.2f} GB/s avg bus bandwidth",
                PASS if ok else FAIL, "" if ok else "run the ib_write_bw rows first; check NCCL_IB_HCA names both "
                "twin HCAs of every rail and the GID index per node",
                "docs/sources.md#gx10-roce-checklist: NCCL over both rails 21.6 GB/s")]


def resolve_gid_index(hca: str, ipv4: str, sysfs: str | Path = "/sys") -> int:
    """The RoCE v2 GID index of `ipv4` on `hca`, read from this machine's sysfs (``ds4deploy fabric gid-index``).

    Raises:
        UserError: no RDMA device under `sysfs`, or the address is not (or more than once) a RoCE v2 GID of `hca`.
    """
    table = read_gid_table(sysfs)
    if not table and not (Path(sysfs) / "class" / "infiniband").is_dir():
        raise UserError(f"{NO_RDMA}: {sysfs}/class/infiniband does not exist",
                        "run this on a node with its RDMA (RoCE) ports, with the mlx5_ib module loaded")
    return roce_v2_gid_index(table, hca, ipv4)
