"""The row model of every host/rail/fabric check, the exit code and the per-host tables.

Verdicts: ``pass``; ``fail`` (the check ran and the host is wrong: remediation says what to do); ``skip`` (the
check does not apply: the host lacks the hardware or the recipe does not ask for it; `measured` gives the reason,
e.g. "skipped: no RDMA device"); ``error`` (the check could not run: a command was missing, the host did not
answer). Exit codes follow NVIDIA deepops validation scripts (docs/sources.md#deepops-exit-codes): 0 all passed (skips
allowed), 1 at least one check failed, 2 nothing failed but at least one check could not run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"
VERDICTS = (PASS, FAIL, SKIP, ERROR)


@dataclass(frozen=True)
class Row:
    """One check on one host.

    Attributes:
        host: inventory host name.
        check: dotted check name, ``<group>.<what>[.<item>]`` (``rails.mtu.rail0``, ``gpu.power_limit``).
        expected: what the recipe asks for, with units (``9000``, ``150 W``, ``>= 90 Gb/s``).
        measured: what the host reports, with units; for a skip, the reason.
        verdict: one of pass, fail, skip, error.
        remediation: what to do when the verdict is fail or error (empty for pass/skip).
        source: where the expectation comes from (recipe key, docs/sources.md#<anchor>, report).
    """

    host: str
    check: str
    expected: str
    measured: str
    verdict: str
    remediation: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")

    @property
    def group(self) -> str:
        """The check group: the part of `check` before the first dot (gpu, memory, rails, fabric, ...)."""
        return self.check.split(".", 1)[0]


def skip(host: str, check: str, expected: str, reason: str, source: str = "") -> Row:
    """A ``skip`` row whose measured column reads ``skipped: <reason>``."""
    return Row(host, check, expected, f"skipped: {reason}", SKIP, "", source)


def exit_code(rows: Iterable[Row]) -> int:
    """0 when every row passed or was skipped, 1 when any failed, else 2 when any could not run."""
    verdicts = {row.verdict for row in rows}
    if FAIL in verdicts:
        return 1
    if ERROR in verdicts:
        return 2
    return 0


def counts(rows: Iterable[Row]) -> dict[str, int]:
    """Number of rows per verdict (every verdict present, zero included)."""
    out = dict.fromkeys(VERDICTS, 0)
    for row in rows:
        out[row.verdict] += 1
    return out


def print_tables(rows: list[Row], title: str, width: int = 160, console=None) -> None:
    """Print one rich table per host (check, expected, measured, verdict, remediation) and a summary line.

    Args:
        rows: rows of all hosts, in check order; hosts appear in first-seen order.
        title: prefix of each table title (e.g. the recipe name).
        width: console width in columns.
        console: a `rich.console.Console` to print on (tests pass one that records); default stdout.
    """
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=width)
    style = {PASS: "green", FAIL: "bold red", SKIP: "yellow", ERROR: "bold magenta"}
    hosts = list(dict.fromkeys(row.host for row in rows))
    for host in hosts:
        table = Table(title=f"{title}: {host}", expand=False)
        for col in ("check", "expected", "measured", "verdict", "remediation"):
            table.add_column(col, overflow="fold")
        for row in (r for r in rows if r.host == host):
            table.add_row(row.check, row.expected, row.measured, f"[{style[row.verdict]}]{row.verdict}[/]",
                          row.remediation)
        console.print(table)
    n = counts(rows)
    console.print(f"{n[PASS]} passed, {n[FAIL]} failed, {n[SKIP]} skipped, {n[ERROR]} could not check "
                  f"({len(hosts)} host(s))")
