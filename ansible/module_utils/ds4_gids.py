"""RoCE GID tables: ``show_gids`` text, the sysfs GID table, and the rail's RoCE v2 GID index.

A GID table row is (HCA, port, index, GID, RoCE version, netdev). For every IPv4 address on the netdev the
kernel adds an IPv4-mapped GID ``::ffff:a.b.c.d`` twice, once as ``IB/RoCE v1`` and once as ``RoCE v2``;
NCCL and ``ib_write_bw -x`` need the index of the RoCE v2 one. That index differs per node and can move after
a reboot, re-cabling or a netplan re-apply (seen at 3 on one GB10 and 4 on its peer: MiaAI-Lab
GLM-5.3-Flash-EXL3-2x-DGX-Sparks PR #26; at 6/7 inside k8s macvlan pods: NVIDIA/nccl #1573), so
`roce_v2_gid_index` resolves it per node from that node's own table, never from a constant.

sysfs layout read by `read_gid_table` (Linux ``drivers/infiniband/core/sysfs.c``)::

    <root>/class/infiniband/<hca>/ports/<port>/gids/<n>             "%pI6" GID, zero GID for an empty slot
    <root>/class/infiniband/<hca>/ports/<port>/gid_attrs/types/<n>  "IB/RoCE v1" | "RoCE v2"; EINVAL if empty
    <root>/class/infiniband/<hca>/ports/<port>/gid_attrs/ndevs/<n>  netdev name; EINVAL if empty/no netdev

The kernel answers reads of an unused slot's ``types``/``ndevs`` file with EINVAL "for user space
compatibility reasons" (``_show_port_gid_attr``) and prints the zero GID in ``gids/<n>`` (``show_port_gid``);
NCCL hit exactly that in containers ("read failed in ncclIbRoceGetVersionNum: Invalid argument",
NVIDIA/nccl #1573). Such slots, and zero GIDs, are skipped - not fatal.

This file is the one parser of GID tables. It runs in two places: on each node, inside the Ansible module
``ds4_gid_index`` (ansible/library/ds4_gid_index.py imports it as ``ansible.module_utils.ds4_gids``), and on the
control host as `ds4deploy.parsers.gids` (a symlink to this file, re-exported with `ds4deploy.core.errors.UserError`).
So it uses the Python standard library only and runs on the nodes' Python (3.8 or newer).
"""

from __future__ import annotations

import errno
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_ZERO_GID = ipaddress.IPv6Address("::")
_SHOW_GIDS_ROW = re.compile(
    r"^(?P<dev>\S+)\s+(?P<port>\d+)\s+(?P<index>\d+)\s+(?P<gid>[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7})\s+"
    r"(?:(?P<ipv4>\d{1,3}(?:\.\d{1,3}){3})\s+)?(?P<ver>v[12])(?:\s+(?P<ndev>\S+))?\s*$"
)
_SHOW_GIDS_HEADER = re.compile(r"^\s*DEV\s+PORT\s+INDEX\s+GID\b")
_N_GIDS = re.compile(r"^\s*n_gids_found=(\d+)\s*$")
_GID_ANYWHERE = re.compile(r"[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}")
NO_RDMA = "no RDMA device"
# NVIDIA NCCL user guide, Environment Variables: NCCL_IB_GID_INDEX "defines the Global ID index used in RoCE mode" -
# one value for every HCA of the process; NCCL_IB_ADDR_FAMILY and NCCL_IB_ROCE_VERSION_NUM (since 2.21) choose the
# GID NCCL picks per HCA "when NCCL_IB_GID_INDEX is left unset".
NCCL_ENV_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"


class GidTableError(Exception):
    """A GID table that cannot be read or does not hold the rail's address: the cause and the fix, as text.

    Args:
        cause: what is wrong, naming the HCA, the address or the sysfs file.
        fix: what to do about it on the node.
    """

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


@dataclass(frozen=True)
class GidEntry:
    """One usable GID table slot.

    Attributes:
        hca: RDMA device name (``rocep1s0f1``, ``roceP2p1s0f1``, ``mlx5_0``).
        port: port number (1 on every ConnectX-7 RoCE function).
        index: slot index - the value for ``NCCL_IB_GID_INDEX`` and ``ib_write_bw -x``.
        gid: the GID as an IPv6 address.
        roce_version: 1 (``IB/RoCE v1``) or 2 (``RoCE v2``).
        netdev: the Ethernet interface the GID belongs to, or ``None`` if the kernel reports none.
    """

    hca: str
    port: int
    index: int
    gid: ipaddress.IPv6Address
    roce_version: int
    netdev: str | None

    @property
    def ipv4(self) -> ipaddress.IPv4Address | None:
        """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else ``None`` (link-local, IPv6)."""
        return self.gid.ipv4_mapped


def _version_from_type(text: str, where: str) -> int:
    value = text.strip()
    if value == "RoCE v2":
        return 2
    if value in ("IB/RoCE v1", "RoCE v1"):
        return 1
    raise GidTableError(
        f"{where} reads {value!r}, expected 'IB/RoCE v1' or 'RoCE v2'",
        "check that the port is a RoCE port (`rdma link show`) and the mlx5/ib_core modules are loaded",
    )


def parse_show_gids(text: str) -> list[GidEntry]:
    """Parse the output of Mellanox ``show_gids`` (mlnx-tools / MLNX_OFED).

    Columns ``DEV PORT INDEX GID IPv4 VER DEV``; the IPv4 column is blank for non-IPv4 GIDs and the netdev
    column can be missing (IB ports). The trailing ``n_gids_found=N`` is checked against the rows when present.

    Args:
        text: captured stdout (a leading prompt line is tolerated).

    Returns:
        Entries in output order (indexes may be sparse, e.g. start at 4 in a container).

    Raises:
        GidTableError: no ``DEV PORT INDEX GID`` header (not show_gids output), a paste whose line breaks were
            lost (header and rows on one line), a header with neither rows nor ``n_gids_found`` (never an empty
            table silently), a row cut short, an IPv4 column that disagrees with its GID, or ``n_gids_found`` not
            matching the rows.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _SHOW_GIDS_HEADER.match(line)), None)
    if start is None:
        raise GidTableError(
            "expected show_gids output (a 'DEV PORT INDEX GID IPv4 VER DEV' header), found none",
            "run `show_gids` (from mlnx-tools) on the host, or read the table from sysfs instead",
        )
    header = lines[start]
    if _GID_ANYWHERE.search(header) or "n_gids_found" in header:
        # A paste that lost its line breaks (a blog export, a chat client): header, rows and count on one line. The
        # last column (the netdev) then runs into the next row's device name, so the columns cannot be told apart.
        count = re.search(r"n_gids_found=(\d+)", header)
        rows = f"{count.group(1)} GID row(s) and " if count else ""
        raise GidTableError(
            f"show_gids output lost its line breaks: the header, {rows}the rest are run together on one line "
            f"({header.strip()[:100]!r}...), so its columns cannot be told apart; the table could not be read",
            "capture `show_gids` again as plain text that keeps its line breaks (redirect it to a file, or paste it "
            "into a code block)",
        )
    entries: list[GidEntry] = []
    found: int | None = None
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        stripped = line.strip()
        if not stripped or stripped.startswith("---"):
            continue
        count = _N_GIDS.match(line)
        if count:
            found = int(count.group(1))
            break
        match = _SHOW_GIDS_ROW.match(stripped)
        if not match:
            raise GidTableError(
                f"show_gids line {number} is not a complete GID row ({stripped!r}): the output was cut short",
                "capture the whole `show_gids` output, up to its 'n_gids_found=N' line",
            )
        gid = ipaddress.IPv6Address(match["gid"])
        if match["ipv4"] and gid.ipv4_mapped != ipaddress.IPv4Address(match["ipv4"]):
            raise GidTableError(
                f"show_gids line {number}: IPv4 column {match['ipv4']} does not match GID {gid}",
                "capture the output again; the table changed while it was printed",
            )
        entries.append(
            GidEntry(
                hca=match["dev"],
                port=int(match["port"]),
                index=int(match["index"]),
                gid=gid,
                roce_version=int(match["ver"][1]),
                netdev=match["ndev"],
            )
        )
    if found is None and not entries:
        raise GidTableError(
            "show_gids printed its header but no GID row and no 'n_gids_found=N' line: the table could not be read "
            "(an empty table ends with n_gids_found=0)",
            "capture the whole `show_gids` output, up to its 'n_gids_found=N' line",
        )
    if found is not None and found != len(entries):
        raise GidTableError(
            f"show_gids reports n_gids_found={found} but printed {len(entries)} rows",
            "capture the whole `show_gids` output again",
        )
    return entries


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii")


def _numeric_children(directory: Path) -> list[int]:
    return sorted(int(child.name) for child in directory.iterdir() if child.name.isdigit())


def read_gid_table(root: str | Path, read: Callable[[Path], str] | None = None) -> list[GidEntry]:
    """Read every usable GID slot under ``<root>/class/infiniband``.

    Args:
        root: the sysfs mount (``/sys`` on a host) or a fixture tree laid out the same way.
        read: how to read one attribute file (default: `Path.read_text`). It must raise ``OSError`` with
            ``errno.EINVAL`` for an empty slot, as the kernel does; tests inject one.

    Returns:
        Entries sorted by (hca, port, index). Slots whose ``types``/``gids`` read fails with EINVAL and slots
        holding the zero GID are skipped; a slot whose ``ndevs`` read fails with EINVAL keeps
        ``netdev=None``. An absent ``class/infiniband`` directory (no RDMA device) gives ``[]``: the caller
        reports "skipped: no RDMA device", it must not pass.

    Raises:
        GidTableError: a read fails with anything but EINVAL (permissions, missing ``gid_attrs`` on a very old
            kernel), or a file holds something that is not a GID / GID type.
    """
    reader = read or _read_text
    base = Path(root) / "class" / "infiniband"
    if not base.is_dir():
        return []

    def attempt(path: Path) -> str | None:
        try:
            return reader(path)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise GidTableError(
                f"cannot read {path}: {exc.strerror or exc}",
                "run the check as a user that can read /sys/class/infiniband (root in the check container), "
                "with /sys mounted read-only from the host",
            ) from exc

    entries: list[GidEntry] = []
    for hca_dir in sorted(p for p in base.iterdir() if (p / "ports").is_dir()):
        for port in _numeric_children(hca_dir / "ports"):
            port_dir = hca_dir / "ports" / str(port)
            if not (port_dir / "gids").is_dir():
                continue
            for index in _numeric_children(port_dir / "gids"):
                raw_gid = attempt(port_dir / "gids" / str(index))
                if raw_gid is None:
                    continue
                try:
                    gid = ipaddress.IPv6Address(raw_gid.strip())
                except ValueError as exc:
                    raise GidTableError(
                        f"{port_dir / 'gids' / str(index)} holds {raw_gid.strip()!r}, not a GID",
                        "point the reader at a sysfs root (the directory that contains class/infiniband)",
                    ) from exc
                if gid == _ZERO_GID:
                    continue
                type_path = port_dir / "gid_attrs" / "types" / str(index)
                raw_type = attempt(type_path)
                if raw_type is None:
                    continue
                raw_ndev = attempt(port_dir / "gid_attrs" / "ndevs" / str(index))
                entries.append(
                    GidEntry(
                        hca=hca_dir.name,
                        port=port,
                        index=index,
                        gid=gid,
                        roce_version=_version_from_type(raw_type, str(type_path)),
                        netdev=raw_ndev.strip() if raw_ndev and raw_ndev.strip() else None,
                    )
                )
    return entries


def roce_v2_gid_index(entries: list[GidEntry], hca: str, ipv4: str) -> int:
    """The GID index whose GID is the rail's IPv4-mapped address (``::ffff:a.b.c.d``) as RoCE v2 on ``hca``.

    Resolve it on each node from that node's own table (`read_gid_table` / `parse_show_gids`): the index
    is not the same across nodes and moves after reboots (see module docstring for the reports).

    Args:
        entries: the node's GID table.
        hca: RDMA device of the rail, e.g. ``rocep1s0f1``.
        ipv4: the rail's IPv4 address on this node, e.g. ``"10.100.184.1"``.

    Returns:
        The index, for ``NCCL_IB_GID_INDEX`` / ``ib_write_bw -x``.

    Raises:
        GidTableError: ``ipv4`` is not an IPv4 address; no RoCE v2 slot of ``hca`` carries it (the address is
            not on the HCA's netdev, the netdev is down, or the HCA name is wrong); or several slots do
            (the same address on two netdevs/VLANs of one HCA) - the cause names the HCA and the address.
    """
    try:
        address = ipaddress.IPv4Address(ipv4)
    except ValueError as exc:
        raise GidTableError(
            f"rail address {ipv4!r} for {hca} is not an IPv4 address",
            "set the rail's IPv4 address (a.b.c.d) in the inventory",
        ) from exc
    on_hca = [entry for entry in entries if entry.hca == hca]
    matches = [entry for entry in on_hca if entry.roce_version == 2 and entry.ipv4 == address]
    mapped = f"::ffff:{address}"
    if not on_hca:
        known = sorted({entry.hca for entry in entries}) or ["none"]
        raise GidTableError(
            f"no GID table for HCA {hca} (looking for RoCE v2 GID {mapped}); HCAs with GIDs: {', '.join(known)}",
            f"check the HCA name with `rdma link show` / `ibdev2netdev` and that {hca}'s port is up",
        )
    if not matches:
        seen = ", ".join(
            f"{entry.index}={entry.gid.ipv4_mapped or entry.gid.compressed}/v{entry.roce_version}" for entry in on_hca
        )
        raise GidTableError(
            f"no RoCE v2 GID on {hca} is {mapped} (the rail address {address}); {hca} has: {seen}",
            f"put {address} on {hca}'s netdev (netplan rail config, then `ip -4 addr show`); the kernel adds the "
            "GID when the address is up",
        )
    if len(matches) > 1:
        indexes = ", ".join(str(entry.index) for entry in matches)
        netdevs = ", ".join(sorted({entry.netdev or "?" for entry in matches}))
        raise GidTableError(
            f"several RoCE v2 GIDs on {hca} are {mapped} (indexes {indexes}, netdevs {netdevs})",
            f"keep {address} on one netdev of {hca} only (no duplicate VLAN/macvlan address)",
        )
    return matches[0].index


def resolve_rails(entries: list[GidEntry], rails: list[dict], addresses: dict, root: str = "/sys") -> dict:
    """The RoCE v2 GID index of a node: every HCA of every rail resolved against the node's address on that rail.

    NCCL_IB_GID_INDEX is one value per engine process (`NCCL_ENV_DOCS`), so every HCA of the node must resolve
    to the same index. The index may differ between nodes (3 on one GB10 and 4 on its peer, see the module
    docstring): each node resolves its own, from its own table.

    Args:
        entries: the node's GID table (`read_gid_table` of ``root``).
        rails: the recipe's rails, ``[{"name": "rail0", "netdev": "enp1s0f1np1", "hcas": ["rocep1s0f1"]}, ...]``
            (other keys are ignored); empty for a recipe without a fabric.
        addresses: the node's inventory ``ds4_rails``, ``{"rail0": {"address": "10.100.184.1"}, ...}``.
        root: the sysfs root the table was read under (for the messages).

    Returns:
        ``{"gid_index": <int or None>, "hcas": [{"rail", "hca", "address", "gid_index"}, ...]}``;
        ``{"gid_index": None, "hcas": []}`` when there are no rails.

    Raises:
        GidTableError: no RDMA device (an empty table), a rail without an address, an HCA without (or with several)
            RoCE v2 GIDs of the rail address, or HCAs of one node resolving to different indexes.
    """
    wanted = [(rail, hca) for rail in rails for hca in rail.get("hcas") or []]
    if not wanted:
        return {"gid_index": None, "hcas": []}
    base = str(root).rstrip("/") + "/class/infiniband"
    if not entries:
        raise GidTableError(
            f"{NO_RDMA}: no GID table under {base}, but the recipe runs NCCL over RoCE HCAs "
            f"{', '.join(hca for _, hca in wanted)}",
            f"check the node's ConnectX ports with `rdma link show` / `ls {base}` (mlx5_ib loaded, ports cabled and "
            "up), or deploy a recipe without a fabric section to this node",
        )
    resolved = []
    for rail, hca in wanted:
        name = rail.get("name")
        address = ((addresses or {}).get(name) or {}).get("address")
        if not address:
            raise GidTableError(
                f"no ds4_rails.{name}.address in the inventory (rail {name} on {rail.get('netdev')}, HCA {hca})",
                f"give the node its address on every rail (ds4_rails: {{{name}: {{address: a.b.c.d}}}})",
            )
        index = roce_v2_gid_index(entries, hca, str(address))
        resolved.append({"rail": name, "hca": hca, "address": str(address), "gid_index": index})
    indexes = sorted({r["gid_index"] for r in resolved})
    if len(indexes) > 1:
        found = ", ".join(f"{r['hca']}={r['gid_index']} ({r['rail']} {r['address']})" for r in resolved)
        raise GidTableError(
            f"the RoCE v2 GID indexes of its HCAs differ ({found}); NCCL_IB_GID_INDEX is one value for every HCA of "
            "the engine, so some HCAs would use a wrong GID",
            "make the rail netplan identical on every port (no extra address, VLAN or macvlan on one rail netdev), "
            "re-apply it (`ansible-playbook ansible/provision.yml --tags rails`, or `netplan apply` on the node) and "
            "check each HCA with `ds4deploy fabric gid-index --hca <hca> --ipv4 <address>` on the node; or leave "
            "NCCL_IB_GID_INDEX unset so NCCL (>= 2.21) picks each HCA's GID from NCCL_IB_ADDR_FAMILY=AF_INET and "
            f"NCCL_IB_ROCE_VERSION_NUM=2 ({NCCL_ENV_DOCS}; needs a render change)",
        )
    return {"gid_index": indexes[0], "hcas": resolved}
