"""Parse nccl-tests ``*_perf`` output (``all_reduce_perf`` and friends) into rows and the average bus bandwidth.

Table shape (nccl-tests 2.x; columns as UPSTREAM.md "Tools and formats")::

    #                                      out-of-place                     in-place
    #   size    count   type  redop  root    time  algbw  busbw #wrong    time  algbw  busbw #wrong
    #    (B) (elements)                    (us) (GB/s) (GB/s)            (us) (GB/s) (GB/s)
       8192     2048  float    sum    -1   35.15   0.23   0.23      0   30.33   0.27   0.27      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 36.2205

Units as nccl-tests prints them: time in microseconds; algbw/busbw in GB/s with GB = 10^9 bytes
(nccl-tests doc/PERFORMANCE.md: algbw = S / t, busbw = algbw x correction factor, 2(n-1)/n for all-reduce).
``#wrong`` is ``N/A`` when validation is off (``-c 0``) and for sendrecv's in-place half; it becomes ``None``.
Lines that are not part of the table (``NCCL INFO`` logs, ``NCCL version``, MPI warnings) are skipped, also
when they sit between rows. Output of nccl-tests 1.x (no ``root`` column, ``error`` instead of ``#wrong``) is
refused: the fabric check relies on ``NCCL_TESTS_MIN_BW``, which only 2.x honours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ds4deploy.errors import UserError

_HEADER = re.compile(
    r"^\s*#\s*size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw\s+#wrong\s+time\s+algbw\s+busbw\s+#wrong"
)
_LEGACY_HEADER = re.compile(r"^\s*#\s*size\s+count\s+type\s+redop\s+time\s+algbw\s+busbw\s+error\b")
_NUM = r"(\d+(?:\.\d+)?)"
_WRONG = r"(\d+|N/A)"
_ROW = re.compile(
    rf"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_WRONG}\s+"
    rf"{_NUM}\s+{_NUM}\s+{_NUM}\s+{_WRONG}\s*$"
)
_AVG = re.compile(r"^\s*#\s*Avg bus bandwidth\s*:\s*(\d+(?:\.\d+)?)")
_OOB = re.compile(r"^\s*#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_RANK = re.compile(
    r"^\s*#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]+)\]\s+(.+?)\s*$"
)
_NCCL_VERSION = re.compile(r"^\s*NCCL version (\S+)")
_TESTS_VERSION = re.compile(r"^\s*#\s*nccl-tests version (\S+)")
FIX = (
    "rerun the nccl-tests binary (e.g. all_reduce_perf -b 8 -e 8G -f 2) to completion and capture its whole "
    "stdout, up to the '# Avg bus bandwidth' line"
)


@dataclass(frozen=True)
class NcclRow:
    """One message size of an nccl-tests table.

    Attributes:
        size_bytes: message size in bytes.
        count: element count.
        dtype: element type (``float``, ``bfloat16``, ...).
        redop: reduction (``sum``, ``none``, ...).
        root: root rank (-1 when the collective has none).
        oop_time_us, oop_algbw_gbyte_s, oop_busbw_gbyte_s, oop_wrong: out-of-place time (us), algorithm and
            bus bandwidth (GB/s, 10^9 bytes/s) and wrong-element count (``None`` for ``N/A``).
        ip_time_us, ip_algbw_gbyte_s, ip_busbw_gbyte_s, ip_wrong: the same for the in-place run.
    """

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    oop_time_us: float
    oop_algbw_gbyte_s: float
    oop_busbw_gbyte_s: float
    oop_wrong: int | None
    ip_time_us: float
    ip_algbw_gbyte_s: float
    ip_busbw_gbyte_s: float
    ip_wrong: int | None


@dataclass(frozen=True)
class NcclRank:
    """A ``#  Rank N Group G Pid P on HOST device D [BUS] GPU NAME`` line."""

    rank: int
    pid: int
    host: str
    device: int
    bus_id: str
    gpu_name: str


@dataclass(frozen=True)
class NcclTestsResult:
    """Parsed nccl-tests run.

    Attributes:
        rows: table rows in output order.
        avg_busbw_gbyte_s: the ``# Avg bus bandwidth`` value in GB/s (10^9 bytes/s), ``None`` only when the
            caller allowed a missing footer.
        out_of_bounds: the ``# Out of bounds values`` count, or ``None`` if not printed.
        out_of_bounds_ok: True for ``OK``, False for ``FAILED``, ``None`` if not printed.
        ranks: rank lines, in output order.
        nccl_version: from the ``NCCL version X`` line, if printed.
        nccl_tests_version: from ``# nccl-tests version X`` (2.17+), if printed.
    """

    rows: tuple[NcclRow, ...]
    avg_busbw_gbyte_s: float | None
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    ranks: tuple[NcclRank, ...]
    nccl_version: str | None
    nccl_tests_version: str | None

    @property
    def max_busbw_gbyte_s(self) -> float:
        """Largest out-of-place or in-place bus bandwidth over all rows, in GB/s."""
        return max(max(row.oop_busbw_gbyte_s, row.ip_busbw_gbyte_s) for row in self.rows)


def _wrong(value: str) -> int | None:
    return None if value == "N/A" else int(value)


def parse_nccl_tests(text: str, require_avg: bool = True) -> NcclTestsResult:
    """Parse one nccl-tests run.

    Args:
        text: captured stdout of ``all_reduce_perf`` (or another ``*_perf`` binary), MPI noise included.
        require_avg: refuse output without the ``# Avg bus bandwidth`` footer (the default: a run that
            stopped early must not pass). False accepts a table quoted without its footer.

    Returns:
        `NcclTestsResult`.

    Raises:
        UserError: no nccl-tests table header (wrong tool), the 1.x table layout, a row cut short, no rows,
            or no ``# Avg bus bandwidth`` line while ``require_avg`` is set.
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    if header_at is None:
        if any(_LEGACY_HEADER.match(line) for line in lines):
            raise UserError(
                "nccl-tests output has the 1.x layout (no 'root' column, 'error' instead of '#wrong')",
                "build nccl-tests 2.x (github.com/NVIDIA/nccl-tests) and rerun; the check needs NCCL_TESTS_MIN_BW",
            )
        raise UserError(
            "expected nccl-tests output (a '#  size count type redop root time algbw busbw #wrong ...' header), "
            "found none",
            FIX,
        )
    ranks: list[NcclRank] = []
    nccl_version = tests_version = None
    for line in lines[:header_at]:
        if match := _RANK.match(line):
            ranks.append(
                NcclRank(int(match[1]), int(match[2]), match[3], int(match[4]), match[5], match[6])
            )
        elif match := _NCCL_VERSION.match(line):
            nccl_version = match[1]
        elif match := _TESTS_VERSION.match(line):
            tests_version = match[1]
    rows: list[NcclRow] = []
    avg = oob = oob_ok = None
    for number, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        if match := _ROW.match(line):
            g = match.groups()
            rows.append(
                NcclRow(
                    size_bytes=int(g[0]), count=int(g[1]), dtype=g[2], redop=g[3], root=int(g[4]),
                    oop_time_us=float(g[5]), oop_algbw_gbyte_s=float(g[6]), oop_busbw_gbyte_s=float(g[7]),
                    oop_wrong=_wrong(g[8]),
                    ip_time_us=float(g[9]), ip_algbw_gbyte_s=float(g[10]), ip_busbw_gbyte_s=float(g[11]),
                    ip_wrong=_wrong(g[12]),
                )
            )
        elif match := _AVG.match(line):
            avg = float(match[1])
        elif match := _OOB.match(line):
            oob, oob_ok = int(match[1]), match[2] == "OK"
        elif match := _NCCL_VERSION.match(line):
            nccl_version = nccl_version or match[1]
        elif re.match(r"^\s*\d+(\s|$)", line):
            raise UserError(
                f"nccl-tests row at line {number} is incomplete ({line.strip()!r}): the run stopped mid-table",
                FIX,
            )
    if not rows:
        raise UserError("nccl-tests printed its table header but no result row", FIX)
    if avg is None and require_avg:
        raise UserError(
            f"nccl-tests output ends after {len(rows)} rows without the '# Avg bus bandwidth' line: the run "
            "did not finish",
            FIX,
        )
    return NcclTestsResult(
        rows=tuple(rows),
        avg_busbw_gbyte_s=avg,
        out_of_bounds=oob,
        out_of_bounds_ok=oob_ok,
        ranks=tuple(ranks),
        nccl_version=nccl_version,
        nccl_tests_version=tests_version,
    )
