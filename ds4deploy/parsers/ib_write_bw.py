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
from dataclasses import dataclass

from ds4deploy.errors import UserError

# 10^9 bit/s per MiB/s: 2^20 bytes * 8 bits / 10^9.
_GBIT_PER_MIB = 1048576 * 8 / 1e9

_RESULT_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec)\]\s+BW average\[(Gb/sec|MB/sec)\]\s+MsgRate\[Mpps\]"
)
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s*$")
_SEPARATOR = re.compile(r"^\s*-{20,}\s*$")
_TITLE = re.compile(r"^\s*(\S.*(?:BW|Latency) Test)\s*$")
_PAIR = re.compile(r"([A-Za-z][\w*.-]*(?: [\w*.-]+)*)\s*:\s*(\S+)")
_WARNING_HINTS = ("warning", "conflicting cpu frequency", "requested mtu", "changing to active mtu")

FIX_RERUN = (
    "rerun ib_write_bw with --report_gbits and capture its whole stdout (server started first, client "
    "pointed at the peer's rail address); see `ib_write_bw --help`"
)


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
    """

    size_bytes: int
    iterations: int
    bw_peak_gbit_s: float | None
    bw_avg_gbit_s: float
    msg_rate_mpps: float


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

    @property
    def bw_avg_gbit_s(self) -> float:
        """Average bandwidth of the last row in Gb/s (the final report of a single-size run)."""
        return self.rows[-1].bw_avg_gbit_s

    @property
    def bw_peak_gbit_s(self) -> float | None:
        """Peak bandwidth of the last row in Gb/s, or ``None`` when perftest did not measure a peak."""
        return self.rows[-1].bw_peak_gbit_s

    @property
    def peak_measured(self) -> bool:
        """Whether any row carries a measured peak (False for ``-D``/``--run_infinitely`` runs)."""
        return any(row.bw_peak_gbit_s is not None for row in self.rows)


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


def parse_ib_write_bw(text: str) -> IbWriteBwResult:
    """Parse the stdout(+stderr) of one ``ib_write_bw`` run.

    Args:
        text: captured output, either side (server or client), any perftest version that prints the
            ``#bytes #iterations BW peak[...] BW average[...] MsgRate[Mpps]`` table.

    Returns:
        `IbWriteBwResult`; bandwidths in Gb/s (10^9 bit/s) whatever the tool printed.

    Raises:
        UserError: the text is not a perftest bandwidth run (no result table, or a latency test), or it
            stops before or inside the first result row (truncated capture, crashed peer).
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if _RESULT_HEADER.search(line)), None)
    title_at = next((i for i, line in enumerate(lines) if _TITLE.match(line)), None)
    if header_at is None:
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
    peak_unit, avg_unit = _RESULT_HEADER.search(lines[header_at]).groups()
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
    rows: list[PerftestRow] = []
    for number, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        if _SEPARATOR.match(line):
            break
        match = _ROW.match(line)
        if match:
            size, iters, peak, avg, rate = match.groups()
            peak_value = float(peak) * factor
            rows.append(
                PerftestRow(
                    size_bytes=int(size),
                    iterations=int(iters),
                    bw_peak_gbit_s=None if float(peak) == 0.0 else peak_value,
                    bw_avg_gbit_s=float(avg) * factor,
                    msg_rate_mpps=float(rate),
                )
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
    )
