"""Parse perftest ``ib_write_bw`` output (client or server side) into numbers with units.

The shape parsed (perftest 4.x-24.x, as captured on DGX Spark, DGX/OpenShift and k8s hosts; see
tests/unit/fixtures/parsers/SOURCES.md)::

     WARNING: BW peak won't be measured in this run.          <- optional lines before the banner
    ---------------------------------------------------------------------------------------
                        RDMA_Write BW Test
     Dual-port       : OFF          Device         : rocep1s0f0
     ...                                                       <- "Key : Value" header, 1-2 pairs per line
     GID index       : 3                                       <- absent with rdma_cm (-R)
    ---------------------------------------------------------------------------------------
     local address: ... / GID: ...
    ---------------------------------------------------------------------------------------
     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
    Conflicting CPU frequency values detected: ...             <- warnings can sit here
     65536      882805           0.00               92.57                0.176554
     65536      882802           0.00               92.57                0.176554   <- --run_infinitely repeats rows

Units: perftest divides bytes/s by 125,000,000 for ``[Gb/sec]`` (10^9 bit/s) and by 0x100000 for ``[MB/sec]``
(so "MB" is MiB = 2^20 bytes); source: perftest ``src/perftest_parameters.c`` ``print_report_bw``,
``format_factor = (report_fmt == MBS) ? 0x100000 : 125000000``. Both are returned as Gb/s (10^9 bit/s) here;
`IbWriteBwResult.reported_unit` says which one the tool printed.

With ``-D <seconds>`` or ``--run_infinitely`` perftest sets ``noPeak`` and prints 0.00 in the peak column
(same source, ``location_arr = noPeak ? 0 : ...``; it also prints "WARNING: BW peak won't be measured in this
run."). A printed 0.00 peak therefore means "not measured": it is returned as ``None``, never as 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ds4deploy.core.errors import UserError

# 10^9 bit/s per MiB/s: 2^20 bytes * 8 bits / 10^9.
_GBIT_PER_MIB = 1048576 * 8 / 1e9

_RESULT_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec)\]\s+BW average\[(Gb/sec|MB/sec)\]\s+MsgRate\[Mpps\]"
    r"(?P<extra>.*)$"
)
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_SEPARATOR = re.compile(r"^\s*-{20,}\s*$")
_TITLE = re.compile(r"^\s*(\S.*(?:BW|Latency) Test)\s*$")
_PAIR = re.compile(r"([A-Za-z][\w*.-]*(?: [\w*.-]+)*)\s*:\s*(\S+)")
_WARNING_HINTS = ("warning", "conflicting cpu frequency", "requested mtu", "changing to active mtu")

FIX_RERUN = (
    "rerun ib_write_bw with --report_gbits and capture its whole stdout (server started first, client "
    "pointed at the peer's rail address); see `ib_write_bw --help`"
)

# perftest's own failure lines, by cause, with the fix for that cause. The texts are perftest's (linux-rdma/perftest
# src/perftest_communication.c and perftest_resources.c); captures in tests/unit/fixtures/parsers/SOURCES.md.
PERFTEST_FAILURES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("no RDMA device", ("did not detect devices", "unable to find the infiniband/roce device",
                        "if device exists, check if driver is up", "no ib devices found",
                        "couldn't get context for the device"),
     "no RDMA device is visible where ib_write_bw ran: load the driver (`modprobe mlx5_ib`) and check "
     "`ibv_devices` / `rdma link show`; inside a container pass /dev/infiniband; the device given with -d must be "
     "one of those listed"),
    ("TCP connection to the server", ("couldn't connect to", "unable to open file descriptor for socket",
                                      "unable to init the socket connection"),
     "the client could not reach the ib_write_bw server over TCP (perftest exchanges the RDMA connection data over "
     "a TCP socket first): start the server before the client with the same -p port, point the client at the "
     "server's rail address, check that address answers (`ping -I <rail netdev> <address>`) and that no firewall "
     "drops the port"),
    ("rdma_cm connection", ("rdma cm event error", "failed to handle rdma cm event", "failed to connect rdma cm",
                            "unable to perform rdma_client function", "rdma_cm_event_rejected",
                            "rdma_cm_event_unreachable", "rdma_cm_event_addr_error", "rdma_cm_event_route_error"),
     "rdma_cm (-R) could not connect: it resolves the peer through the IP address of an RDMA netdev, so use the "
     "server's rail address (not a host name or a management address), give both rail netdevs their addresses, "
     "and run the server with -R too (REJECTED: nothing listened on that port)"),
    ("RDMA connection after the TCP exchange", ("couldn't read remote address", "failed to exchange data between",
                                                "failed to modify qp to rts", "failed to modify qp to rtr",
                                                "unable to connect the hca's through the link"),
     "the peers exchanged their connection data but the RDMA connection failed: give each side its own RoCE v2 "
     "GID index with -x (resolve it per node with `ds4deploy fabric gid-index --hca <hca> --ipv4 <address>`), "
     "and check that both rail addresses are in one subnet with the same MTU"),
    ("RDMA resources", ("unable to create qp", "failed to create qp", "couldn't create ib resources",
                        "couldn't allocate mr", "failed to create mr", "couldn't create cq"),
     "ib_write_bw could not create its RDMA resources: lift the locked-memory limit (`ulimit -l unlimited`; in a "
     "container --ulimit memlock=-1 and CAP_IPC_LOCK) and check the device supports the options given (queue "
     "pairs -q, inline size -I)"),
)


def perftest_failure(lines: list[str]) -> UserError | None:
    """The `UserError` for output in which perftest reported its own failure, quoting its lines, or None.

    Args:
        lines: the captured output's lines.
    Returns:
        A UserError whose cause names the kind of failure and quotes perftest's failure lines (at most 4), and
        whose fix addresses that kind; None when no line is one of perftest's failure messages.
    """
    for kind, needles, fix in PERFTEST_FAILURES:
        quoted = [line.strip() for line in lines if any(n in line.lower() for n in needles)]
        if quoted:
            shown = "; ".join(f"'{q}'" for q in quoted[:4])
            return UserError(f"ib_write_bw failed ({kind}) before printing a result table: {shown}", fix)
    return None


@dataclass(frozen=True)
class PerftestRow:
    """One result row of the bandwidth table.

    Attributes:
        size_bytes: message size (``#bytes``).
        iterations: ``#iterations`` (for ``-D`` runs: iterations completed in the duration).
        bw_peak_gbit_s: peak bandwidth in Gb/s (10^9 bit/s); ``None`` when perftest did not measure it
            (it prints 0.00 for ``-D``/``--run_infinitely`` runs).
        bw_avg_gbit_s: average bandwidth in Gb/s (10^9 bit/s), converted from MiB/s when the run lacked
            ``--report_gbits``.
        msg_rate_mpps: message rate in millions of messages per second.
        extra: further result columns the run asked for, header name -> value as printed, e.g.
            ``{"CPU_Util[%]": 4.0}`` with ``--cpu_util``.
    """

    size_bytes: int
    iterations: int
    bw_peak_gbit_s: float | None
    bw_avg_gbit_s: float
    msg_rate_mpps: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_util_pct(self) -> float | None:
        """CPU utilisation in percent (``--cpu_util``'s ``CPU_Util[%]`` column), None when not printed."""
        return self.extra.get("CPU_Util[%]")


@dataclass(frozen=True)
class IbWriteBwResult:
    """Parsed ``ib_write_bw`` run.

    Attributes:
        test: banner title, e.g. ``"RDMA_Write BW Test"`` or ``"RDMA_Write Bidirectional BW Test"``.
        device: ``Device`` header field (RDMA device name, e.g. ``rocep1s0f0``), or ``None`` if not printed.
        transport: ``Transport type`` (perftest prints ``IB`` for RoCE too).
        link_type: ``Link type`` (``Ethernet`` for RoCE, ``IB`` for InfiniBand or ``--force-link IB``).
        gid_index: ``GID index`` (absent when the connection used rdma_cm, ``-R``).
        mtu_bytes: ``Mtu`` in bytes (the RDMA path MTU, at most 4096 - not the netdev MTU of 9000).
        num_qps: ``Number of qps``.
        reported_unit: the unit the tool printed, ``"Gb/sec"`` or ``"MB/sec"`` (MiB/s).
        values_unit: the unit the values are in, by `MsgRate x #bytes` (`_unit_by_msg_rate`): the printed unit,
            except for a side that printed ``[MB/sec]`` over Gb/s values (only the peer passed
            ``--report_gbits``), which is then read as Gb/s and named in `warnings`.
        rows: result rows in output order (several for ``-a`` sweeps or ``--run_infinitely``).
        warnings: warning lines seen anywhere in the output, stripped, in order.
    """

    test: str
    device: str | None
    transport: str | None
    link_type: str | None
    gid_index: int | None
    mtu_bytes: int | None
    num_qps: int | None
    reported_unit: str
    rows: tuple[PerftestRow, ...]
    warnings: tuple[str, ...]
    values_unit: str = ""

    def __post_init__(self) -> None:
        if not self.values_unit:
            object.__setattr__(self, "values_unit", self.reported_unit)

    @property
    def bw_avg_gbit_s(self) -> float:
        """Average bandwidth of the last row in Gb/s (the final report of a single-size run)."""
        return self.rows[-1].bw_avg_gbit_s

    @property
    def bw_peak_gbit_s(self) -> float | None:
        """Peak bandwidth of the last row in Gb/s, or ``None`` when perftest did not measure a peak."""
        return self.rows[-1].bw_peak_gbit_s



def _header_fields(lines: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        for key, value in _PAIR.findall(line.replace("\t", "  ")):
            fields.setdefault(key.strip(), value)
    return fields


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"\d+", value)
    return int(match.group(0)) if match else None


def _is_warning(line: str) -> bool:
    low = line.lower()
    return any(hint in low for hint in _WARNING_HINTS)


# Bandwidth and message rate come from the same byte count and time (perftest print_report_bw: MsgRate is the
# average bandwidth in bytes/s divided by the message size), so avg_bw ~= MsgRate[Mpps] x 10^6 x #bytes. Both are
# printed rounded (2 and 6 decimals): a row is judged only when its MsgRate has at least 3 significant digits
# (>= 0.001 Mpps), and a unit is taken when it agrees within 5 % while the other is off by more than 20 %. The two
# units differ by a factor of 8 x 2^20 / 10^9 = 8.39 (MiB/s vs Gb/s), so they can never both agree.
_UNIT_AGREE = 0.05
_UNIT_DISAGREE = 0.20


def _unit_by_msg_rate(rows: list[str], printed: str, extra: int) -> str:
    """The unit the bandwidth values of a result table are in, judged from the first row whose MsgRate is precise
    enough: `printed`, or the other unit when only it agrees with MsgRate x #bytes. `printed` when no row tells.

    Raises:
        UserError: the values agree with neither unit (not one run's table, or hand-edited numbers).
    """
    for line in rows:
        values = line.split()
        if _SEPARATOR.match(line):
            break
        if len(values) != 5 + extra or not all(_NUMBER.match(v) for v in values):
            continue
        size, avg, rate = int(float(values[0])), float(values[3]), float(values[4])
        if rate < 0.001 or size <= 0 or avg <= 0:
            continue
        implied_gbit = rate * 1e6 * size * 8 / 1e9
        as_unit = {"Gb/sec": avg, "MB/sec": avg * _GBIT_PER_MIB}
        off = {u: abs(v - implied_gbit) / implied_gbit for u, v in as_unit.items()}
        other = "MB/sec" if printed == "Gb/sec" else "Gb/sec"
        if off[printed] <= _UNIT_DISAGREE:
            return printed
        if off[other] <= _UNIT_AGREE:
            return other
        raise UserError(
            f"ib_write_bw row {line.strip()!r}: the bandwidth {avg} agrees with MsgRate x #bytes "
            f"({rate} Mpps x {size} B = {implied_gbit:.2f} Gb/s) neither as Gb/sec nor as MB/sec: these are not "
            "one run's numbers", FIX_RERUN)
    return printed


def parse_ib_write_bw(text: str) -> IbWriteBwResult:
    """Parse the stdout(+stderr) of one ``ib_write_bw`` run.

    Args:
        text: captured output, either side (server or client), any perftest version that prints the
            ``#bytes #iterations BW peak[...] BW average[...] MsgRate[Mpps]`` table, with any further columns
            the run asked for after MsgRate (``CPU_Util[%]`` with ``--cpu_util``), read into `PerftestRow.extra`.

    Returns:
        `IbWriteBwResult`; bandwidths in Gb/s (10^9 bit/s) whatever the tool printed. The unit of the values is
        checked against MsgRate x #bytes (`_unit_by_msg_rate`): a server side printing ``[MB/sec]`` over Gb/s
        values is read as Gb/s, and says so in `IbWriteBwResult.warnings`.

    Raises:
        UserError: perftest printed its own failure lines and no table (the cause quotes them and names the
            kind: no device, TCP connection, rdma_cm, RDMA connection, resources; the fix addresses that kind);
            the text is not a perftest bandwidth run (no result table, or a latency test); or it stops before or
            inside the first result row (truncated capture, crashed peer).
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if _RESULT_HEADER.search(line)), None)
    title_at = next((i for i, line in enumerate(lines) if _TITLE.match(line)), None)
    if header_at is None:
        failure = perftest_failure(lines)
        if failure is not None:
            raise failure
        if title_at is not None and "Latency" in lines[title_at]:
            raise UserError(
                f"expected ib_write_bw bandwidth output, got a perftest latency test ({lines[title_at].strip()!r})",
                "run ib_write_bw (not ib_write_lat) for the bandwidth check; " + FIX_RERUN,
            )
        if title_at is not None:
            raise UserError(
                "ib_write_bw output stops before its result table (no '#bytes #iterations BW peak[...]' line): "
                "the run was cut short or the peer never connected",
                FIX_RERUN,
            )
        raise UserError(
            "expected ib_write_bw output (a '#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] "
            "MsgRate[Mpps]' table), found none",
            FIX_RERUN,
        )
    header = _RESULT_HEADER.search(lines[header_at])
    peak_unit, avg_unit = header.group(1), header.group(2)
    extra_names = header.group("extra").split()
    if peak_unit != avg_unit:
        raise UserError(f"ib_write_bw result header mixes units {peak_unit} and {avg_unit}", FIX_RERUN)
    factor = 1.0 if avg_unit == "Gb/sec" else _GBIT_PER_MIB

    banner: list[str] = []
    if title_at is not None and title_at < header_at:
        for line in lines[title_at + 1 : header_at]:
            if _SEPARATOR.match(line):
                break
            banner.append(line)
    fields = _header_fields(banner)

    warnings = [line.strip() for line in lines[:header_at] if _is_warning(line)]
    values_unit = _unit_by_msg_rate(lines[header_at + 1:], avg_unit, len(extra_names))
    if values_unit != avg_unit:
        factor = 1.0 if values_unit == "Gb/sec" else _GBIT_PER_MIB
        warnings.append(f"the header says [{avg_unit}] but MsgRate x #bytes says the values are {values_unit} "
                        f"(one side ran with --report_gbits, the other without): read as {values_unit}")
    rows: list[PerftestRow] = []
    for number, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        if _SEPARATOR.match(line):
            break
        values = line.split()
        if values and all(_NUMBER.match(f) for f in values) and len(values) == 5 + len(extra_names) \
                and values[0].isdigit() and values[1].isdigit():
            size, iters, peak, avg, rate = values[:5]
            peak_value = float(peak) * factor
            rows.append(
                PerftestRow(
                    size_bytes=int(size),
                    iterations=int(iters),
                    bw_peak_gbit_s=None if float(peak) == 0.0 else peak_value,
                    bw_avg_gbit_s=float(avg) * factor,
                    msg_rate_mpps=float(rate),
                    extra={name: float(v) for name, v in zip(extra_names, values[5:], strict=True)},
                )
            )
        elif re.match(r"^\s*\d", line) and len(values) > 5 + len(extra_names):
            raise UserError(
                f"ib_write_bw result line {number} has {len(values)} values where its header names "
                f"{5 + len(extra_names)} columns ({line.strip()!r})",
                FIX_RERUN,
            )
        elif re.match(r"^\s*\d", line):
            raise UserError(
                f"ib_write_bw result line {number} is incomplete ({line.strip()!r}): the capture was cut mid-row",
                FIX_RERUN,
            )
        elif line.strip():
            warnings.append(line.strip())
    if not rows:
        raise UserError(
            "ib_write_bw printed its result header but no result row: the run was cut short", FIX_RERUN
        )
    return IbWriteBwResult(
        test=lines[title_at].strip() if title_at is not None else "",
        device=fields.get("Device"),
        transport=fields.get("Transport type"),
        link_type=fields.get("Link type"),
        gid_index=_int_or_none(fields.get("GID index")),
        mtu_bytes=_int_or_none(fields.get("Mtu")),
        num_qps=_int_or_none(fields.get("Number of qps")),
        reported_unit=avg_unit,
        rows=tuple(rows),
        warnings=tuple(warnings),
        values_unit=values_unit,
    )
