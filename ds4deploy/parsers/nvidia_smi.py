"""Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` into typed values with units.

nvidia-smi prints one CSV line per GPU, fields separated by ``", "``; with a header the first line names each
field with its unit in brackets (``power.limit [W]``, ``clocks.current.graphics [MHz]``, ``memory.total
[MiB]``, ``utilization.gpu [%]``) and values carry the unit (``350.00 W``); ``nounits`` drops both.
Unavailable values print as ``[N/A]`` (``N/A`` with ``nounits``) or ``[Not Supported]``: they become ``None``,
never 0. GB10 (DGX Spark / GX10) reports ``[N/A]`` for ``memory.total`` and ``clocks.current.memory``
(unified memory; tests/unit/fixtures/parsers/nvidia_smi-smart-city-gb10.txt) and for the power limit
(docs/sources.md#nvml-gb10).

Each row becomes a dict keyed by the field name with dots replaced by underscores plus a unit suffix:
``memory.total [MiB]`` -> ``memory_total_mib`` (int), ``power.limit [W]`` -> ``power_limit_w`` (float),
``clocks.current.graphics [MHz]`` -> ``clocks_current_graphics_mhz`` (int), ``utilization.gpu [%]`` ->
``utilization_gpu_pct`` (int), ``temperature.gpu`` -> ``temperature_gpu_c`` (int, degrees C); ``index`` is
an int; text fields (``name``, ``driver_version``, ``compute_cap``, ``pstate``, ``uuid``) stay str.
Short aliases from ``nvidia-smi --help-query-gpu`` (``clocks.gr``, ``clocks.max.mem``, ...) are mapped to
their long names so both spellings give the same key.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from ds4deploy.core.errors import UserError

UNAVAILABLE = frozenset({"[N/A]", "N/A", "[Not Supported]"})

# Aliases listed by `nvidia-smi --help-query-gpu` ("clocks.current.graphics" or "clocks.gr", ...).
ALIASES = {
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
}

# unit as printed in a header bracket -> (key suffix, value type, unit text after a value with units)
_UNITS: dict[str, tuple[str, type, str]] = {
    "W": ("_w", float, "W"),
    "MHz": ("_mhz", int, "MHz"),
    "MiB": ("_mib", int, "MiB"),
    "%": ("_pct", int, "%"),
}
# Fields printed without a bracketed unit but with a known one (nvidia-smi --help-query-gpu).
_BARE_UNITS: dict[str, tuple[str, type, str]] = {
    "temperature.gpu": ("_c", int, ""),
    "temperature.memory": ("_c", int, ""),
    "index": ("", int, ""),
    "count": ("", int, ""),
    "pcie.link.gen.current": ("", int, ""),
    "pcie.link.gen.max": ("", int, ""),
    "pcie.link.width.current": ("", int, ""),
    "pcie.link.width.max": ("", int, ""),
}
# Units implied by the field family when there is no header (noheader): nvidia-smi --help-query-gpu.
_FAMILY_UNITS = (
    ("power.", "W"),
    ("enforced.power.limit", "W"),
    ("clocks.", "MHz"),
    ("memory.total", "MiB"),
    ("memory.used", "MiB"),
    ("memory.free", "MiB"),
    ("memory.reserved", "MiB"),
    ("utilization.", "%"),
    ("fan.speed", "%"),
)
_HEADER_FIELD = re.compile(r"^(?P<field>[a-z_][a-z0-9_.]*)(?: \[(?P<unit>[^\]]+)\])?$")
FIX = "rerun `nvidia-smi --query-gpu=<fields> --format=csv` and capture its whole stdout"


def _canonical(field: str) -> str:
    return ALIASES.get(field, field)


def _spec(field: str, unit: str | None) -> tuple[str, type, str]:
    canonical = _canonical(field)
    base = canonical.replace(".", "_")
    if unit is None:
        if canonical in _BARE_UNITS:
            suffix, kind, printed = _BARE_UNITS[canonical]
            return base + suffix, kind, printed
        unit = next((u for prefix, u in _FAMILY_UNITS if canonical.startswith(prefix)), None)
    if unit is None:
        return base, str, ""
    if unit not in _UNITS:
        return base, str, ""
    suffix, kind, printed = _UNITS[unit]
    return base + suffix, kind, printed


def _value(raw: str, field: str, key: str, kind: type, unit: str) -> Any:
    value = raw.strip()
    if value in UNAVAILABLE:
        return None
    if kind is str:
        return value
    if unit and value.endswith(unit):
        value = value[: -len(unit)].strip()
    try:
        return kind(float(value)) if kind is int and "." in value else kind(value)
    except ValueError as exc:
        raise UserError(
            f"nvidia-smi field {field} ({key}) has value {raw.strip()!r}, expected a number"
            + (f" in {unit}" if unit else ""),
            FIX,
        ) from exc


def _split(line: str) -> list[str]:
    return next(csv.reader(io.StringIO(line), skipinitialspace=True))


def parse_query_gpu(text: str, fields: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu`` CSV output.

    Args:
        text: captured stdout.
        fields: the ``--query-gpu`` field list, required for ``--format=csv,noheader`` output (with or
            without ``nounits``); when given and the first line is a header, the header must name the same
            fields (aliases allowed).

    Returns:
        One dict per GPU line, keyed as described in the module docstring; unavailable values are ``None``.

    Raises:
        UserError: empty output; no header and no ``fields``; a header that does not match ``fields``; a line
            with a different number of values than fields (truncated, or output of another tool); a value
            that should be numeric but is not.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise UserError("nvidia-smi --query-gpu printed nothing (no GPU visible, or the driver failed)", FIX)
    header = [cell.strip() for cell in _split(lines[0])]
    header_fields = [_HEADER_FIELD.match(cell) for cell in header]
    has_header = all(header_fields)
    if has_header:
        names = [m["field"] for m in header_fields]
        units = [m["unit"] for m in header_fields]
        if fields is not None and [_canonical(f) for f in fields] != [_canonical(n) for n in names]:
            raise UserError(
                f"nvidia-smi header names {', '.join(names)} but the query asked for {', '.join(fields)}",
                FIX,
            )
        body = lines[1:]
    else:
        if fields is None:
            raise UserError(
                f"expected nvidia-smi --query-gpu CSV with a header line, got {lines[0].strip()!r}",
                "pass the --query-gpu field list for --format=csv,noheader output, or capture with a header",
            )
        names = list(fields)
        units = [None] * len(names)
        body = lines
    specs = [_spec(name, unit) for name, unit in zip(names, units, strict=True)]
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(body, start=2 if has_header else 1):
        cells = _split(line)
        if len(cells) != len(names):
            raise UserError(
                f"nvidia-smi line {number} has {len(cells)} values for {len(names)} fields ({line.strip()!r}): "
                "truncated output, or not nvidia-smi --query-gpu output",
                FIX,
            )
        rows.append(
            {
                key: _value(cell, name, key, kind, unit)
                for cell, name, (key, kind, unit) in zip(cells, names, specs, strict=True)
            }
        )
    if not rows:
        raise UserError("nvidia-smi printed a header but no GPU line", FIX)
    return rows
