"""Parse nccl-tests ``*_perf`` output (``all_reduce_perf`` and friends) into rows and the average bus bandwidth.

Table shape (nccl-tests 2.x; docs/sources.md#nccl-tests-format)::

    #                                      out-of-place                     in-place
    #   size    count   type  redop  root    time  algbw  busbw #wrong    time  algbw  busbw #wrong
    #    (B) (elements)                    (us) (GB/s) (GB/s)            (us) (GB/s) (GB/s)
       8192     2048  float    sum    -1   35.15   0.23   0.23      0   30.33   0.27   0.27      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 36.2205

Units as nccl-tests prints them: time in microseconds; algbw/busbw in GB/s with GB = 10^9 bytes
(nccl-tests doc/PERFORMANCE.md: algbw = S / t, busbw = algbw x correction factor, 2(n-1)/n for all-reduce).
``#wrong`` is the count of wrong elements, printed with ``%6g`` (so large counts read ``1.04858e+06``); it is
``N/A`` when validation is off (``-c 0``) and for sendrecv's in-place half, and becomes ``None``.
Lines that are not part of the table (``NCCL INFO`` logs, ``NCCL version``, MPI warnings, Open MPI's "N more
processes have sent help message ...") are skipped, also when they sit between rows; a line is a row cut short
only when every field it has fits its column. A run that failed quotes nccl-tests' own ``Test NCCL failure
<file>:<line> '<reason>'`` line as the cause.

Layouts, by the nccl-tests releases that print them (NVIDIA/nccl-tests src/common.cu and src/util.cu at each tag):

- 2.13.0 and later: the table above, read. ``--report_cputime`` (``-C``) names the time columns ``cputime``;
  ``--report_timestamps`` (``-S``, 2.18.0 and later) appends a ``timestamp`` column (``%Y-%m-%d %H:%M:%S``); both
  are read.
- 2.0.0 to 2.11.0 (2019-2021): ``size count type redop time algbw busbw error ...``, no ``root``; ``error`` is the
  largest numeric error of the size, not a count of wrong elements. Refused: a run with corrupt data cannot be told
  from a clean one.
- 1.0.0 (2018): ``bytes N type op time algbw busbw res ...``, footer lines without ``#``. Refused for the same
  reason.
- 2.19.6 and later with ``--per_iter_timing`` (``-I``): ``i_min i_max i_p99 i_cv%`` after each ``#wrong``. Refused
  with the flag to drop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ds4deploy.core.errors import UserError

_HEADER = re.compile(
    r"^\s*#\s*size\s+count\s+type\s+redop\s+root\s+(?:cpu)?time\s+algbw\s+busbw\s+#wrong\s+(?:cpu)?time\s+algbw"
    r"\s+busbw\s+#wrong(?:\s+timestamp)?\s*$"
)
_NUM = r"(\d+(?:\.\d+)?)"
_WRONG = r"(\d+(?:\.\d+)?(?:e\+?\d+)?|N/A)"
_ROW = re.compile(
    rf"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_WRONG}\s+"
    rf"{_NUM}\s+{_NUM}\s+{_NUM}\s+{_WRONG}(?:\s+\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d)?\s*$"
)
# Layouts this parser refuses: (header pattern, which releases print it, what to do). See the module docstring.
_REFUSED_LAYOUTS = (
    (re.compile(r"^\s*#\s*size\s+count\s+type\s+(?:\S+\s+)?time\s+algbw\s+busbw\s+error\b"),
     "the layout of nccl-tests 2.0.0 to 2.11.0 (no 'root' column; 'error' is the largest numeric error, not a count "
     "of wrong elements)",
     "build nccl-tests 2.13.0 or later (github.com/NVIDIA/nccl-tests), whose '#wrong' column counts the wrong "
     "elements the check fails on, and rerun"),
    (re.compile(r"^\s*#\s*bytes\s+N\s+type\s+op\s+time\s+algbw\s+busbw\s+res\b"),
     "the layout of nccl-tests 1.0.0 (2018: 'bytes N type op ... res', no count of wrong elements)",
     "build nccl-tests 2.13.0 or later (github.com/NVIDIA/nccl-tests), whose '#wrong' column counts the wrong "
     "elements the check fails on, and rerun"),
    (re.compile(r"#wrong\s+i_min\s+i_max"),
     "the per-iteration layout of nccl-tests 2.19.6 and later run with -I/--per_iter_timing",
     "rerun without -I (--per_iter_timing); the check reads the plain table"),
)
_AVG = re.compile(r"^\s*#\s*Avg bus bandwidth\s*:\s*(\d+(?:\.\d+)?)")
_OOB = re.compile(r"^\s*#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_RANK = re.compile(
    r"^\s*#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]+)\]\s+(.+?)\s*$"
)
_NCCL_VERSION = re.compile(r"^\s*NCCL version (\S+)")
_TESTS_VERSION = re.compile(r"^\s*#\s*nccl-tests version (\S+)")
# nccl-tests' own failure line (src/common.h NCCLCHECK/CUDACHECK: "<host>: Test NCCL failure <file>:<line> '<NCCL
# error string> / <ncclGetLastError>'", older releases without the host and the " / <last error>" part), e.g.
# "dell03: Test NCCL failure common.cu:1012 'internal error - please report this issue to the NCCL developers / '"
# (NVIDIA/nccl-tests issue #275) or "Test CUDA failure common.cu:730 'unknown error'" (issue #66).
_TEST_FAILURE = re.compile(r"Test (NCCL|CUDA) failure (\S+) '(.*)'")
# Lines a row-shaped line must match field by field to be a row cut short: size, count, type, redop, root, then
# numbers. Open MPI's "8 more processes have sent help message help-mtl-ofi.txt / OFI call fail" also starts
# with a number, but its second word is not a count: it is noise (Open MPI aggregates repeated help messages,
# orte_base_help_aggregate), not a row.
_ROW_PREFIX = (r"\d+", r"\d+", r"[A-Za-z_][\w]*", r"[A-Za-z_][\w]*", r"-?\d+")
FIX_NCCL_FAILURE = (
    "the collective failed inside NCCL/CUDA before the table finished: rerun with NCCL_DEBUG=WARN (INFO for the "
    "whole setup) to see which transport, HCA or GPU failed, fix that (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, "
    "NCCL_IB_GID_INDEX, GPU health), then rerun the test"
)
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
    def wrong_elements(self) -> int:
        """Wrong elements over every row, out-of-place and in-place (``N/A`` counts as 0; %6g counts are rounded)."""
        return sum(w or 0 for row in self.rows for w in (row.oop_wrong, row.ip_wrong))

    @property
    def data_corrupt(self) -> bool:
        """True when nccl-tests found wrong results: a non-zero ``#wrong`` or out-of-bounds count, or FAILED."""
        return self.wrong_elements > 0 or bool(self.out_of_bounds) or self.out_of_bounds_ok is False


def _wrong(value: str) -> int | None:
    # %6g: counts of a million or more print as 1.04858e+06 (6 significant digits, so the count is rounded).
    return None if value == "N/A" else int(float(value))


def _failure(lines: list[str], what: str) -> UserError | None:
    """A `UserError` quoting nccl-tests' own failure line(s) as the cause of `what`, or None when there is none."""
    found = [m for line in lines if (m := _TEST_FAILURE.search(line))]
    if not found:
        return None
    reasons = list(dict.fromkeys(f"{m[1]} failure at {m[2]}: '{m[3].strip().removesuffix('/').strip()}'"
                                 for m in found))
    return UserError(f"{what}: nccl-tests reported " + "; ".join(reasons[:3]), FIX_NCCL_FAILURE)


def _cut_row(line: str) -> bool:
    """Whether `line` is the start of a table row cut short (each field fits its column), not noise that happens to
    start with a number."""
    fields = line.split()
    if not fields or len(fields) >= 13:
        return False
    pattern = _ROW_PREFIX + (r"[\d.]+(?:e\+?\d+)?|N/A",) * 8
    return all(re.fullmatch(p, f) for p, f in zip(pattern, fields, strict=False))


def parse_nccl_tests(text: str, require_avg: bool = True) -> NcclTestsResult:
    """Parse one nccl-tests run.

    Args:
        text: captured stdout of ``all_reduce_perf`` (or another ``*_perf`` binary), MPI noise included.
        require_avg: refuse output without the ``# Avg bus bandwidth`` footer (the default: a run that
            stopped early must not pass). False accepts a table quoted without its footer.

    Returns:
        `NcclTestsResult`.

    Raises:
        UserError: no nccl-tests table header (wrong tool), a refused layout (named with the nccl-tests releases
            that print it), a row cut short, no rows, or no ``# Avg bus bandwidth`` line while ``require_avg``
            is set.
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    if header_at is None:
        failure = _failure(lines, "nccl-tests printed no result table")
        if failure is not None:
            raise failure
        for pattern, layout, fix in _REFUSED_LAYOUTS:
            if any(pattern.search(line) for line in lines):
                raise UserError(f"nccl-tests output has {layout}", fix)
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
        elif _cut_row(line):
            failure = _failure(lines[number - 1:], f"nccl-tests row at line {number} is incomplete ({line.strip()!r})")
            if failure is not None:
                raise failure
            raise UserError(
                f"nccl-tests row at line {number} is incomplete ({line.strip()!r}): the run stopped mid-table",
                FIX,
            )
    if not rows:
        raise _failure(lines, "nccl-tests printed its table header but no result row") or UserError(
            "nccl-tests printed its table header but no result row", FIX)
    if avg is None and require_avg:
        failure = _failure(lines, f"nccl-tests output ends after {len(rows)} rows without the '# Avg bus bandwidth' "
                                  "line")
        if failure is not None:
            raise failure
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
