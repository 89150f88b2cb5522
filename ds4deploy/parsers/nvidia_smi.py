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

What users paste is more often the plain ``nvidia-smi`` table or ``nvidia-smi -q``; `parse_query_gpu` reads both
too (`parse_table`, `parse_q`) into the same keys, for the fields each shows (the table has no compute capability
or clock limits: those are ``None``, never guessed). Persistence reads ``Enabled``/``Disabled`` as the CSV prints
it (the table's ``On``/``Off``).
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


# The plain table, layouts of drivers 4xx-5xx (NVIDIA nvidia-smi documentation, "nvidia-smi" default output; captures
# in tests/unit/fixtures/parsers/SOURCES.md). First line of a GPU: "|   0  Tesla V100-SXM2-32GB   On  |
# 00000000:1A:00.0 Off |   0 |"; second: "| N/A   40C    P0   43W / 300W |   0MiB / 32768MiB |   0%   Default |".
_TABLE_BANNER = re.compile(r"\|\s*NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s*(?P<driver>\S+)")
_TABLE_GPU = re.compile(
    r"^\|\s+(?P<index>\d+)\s+(?P<name>\S.*?)\s+(?P<pm>On|Off)\s*\|\s*(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)"
    r"\s+(?P<disp>\S+)\s*\|")
_TABLE_USAGE = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+?)C?\s+(?P<perf>P\d+|N/A)\s+(?P<draw>\S+?)W?\s*/\s*(?P<cap>\S+?)W?\s*\|"
    r"\s*(?P<used>\S+?)(?:MiB)?\s*/\s*(?P<total>\S+?)(?:MiB)?\s*\|\s*(?P<util>\S+?)%?\s+(?P<mode>\S+)\s*\|")


def _num(value: str, kind: type) -> Any:
    value = value.strip()
    if value in UNAVAILABLE or value in ("N/A", "Not Supported", "[N/A]"):
        return None
    try:
        return kind(float(value)) if kind is int else kind(value)
    except ValueError:
        return None


def parse_table(text: str) -> list[dict[str, Any]]:
    """Read the plain ``nvidia-smi`` table: per GPU index, name (as printed: old layouts cut long names with
    ``...``), persistence_mode (``Enabled``/``Disabled``), pci_bus_id, temperature_gpu_c, pstate, power_draw_w,
    power_limit_w (the cap after the slash, W), memory_used_mib, memory_total_mib, utilization_gpu_pct,
    compute_mode, and driver_version from the banner. ``N/A`` values are None.

    Raises:
        UserError: the banner is there but a GPU's two lines are not (a capture cut mid-table).
    """
    lines = text.splitlines()
    banner = next((m for line in lines if (m := _TABLE_BANNER.search(line))), None)
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        gpu = _TABLE_GPU.match(line)
        if not gpu:
            continue
        usage = _TABLE_USAGE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if usage is None:
            raise UserError(f"nvidia-smi table: GPU {gpu['index']} has no usage line after {line.strip()!r}: the "
                            "capture was cut mid-table", "capture the whole `nvidia-smi` output again")
        rows.append({
            "index": int(gpu["index"]), "name": gpu["name"].strip(),
            "persistence_mode": "Enabled" if gpu["pm"] == "On" else "Disabled",
            "pci_bus_id": gpu["bus"], "driver_version": banner["driver"] if banner else None,
            "fan_speed_pct": _num(usage["fan"].rstrip("%"), int), "temperature_gpu_c": _num(usage["temp"], int),
            "pstate": None if usage["perf"] == "N/A" else usage["perf"],
            "power_draw_w": _num(usage["draw"], float), "power_limit_w": _num(usage["cap"], float),
            "memory_used_mib": _num(usage["used"], int), "memory_total_mib": _num(usage["total"], int),
            "utilization_gpu_pct": _num(usage["util"], int), "compute_mode": usage["mode"],
        })
    return rows


# `nvidia-smi -q`: "Key : Value" lines, indented by section (4 spaces per level); each GPU starts at a line
# "GPU 00000000:1A:00.0". Paths (section/.../key) -> our key, unit type.
_Q_FIELDS: dict[str, tuple[str, type]] = {
    "Product Name": ("name", str),
    "Persistence Mode": ("persistence_mode", str),
    "GPU UUID": ("uuid", str),
    "Minor Number": ("minor_number", int),
    "Performance State": ("pstate", str),
    "Compute Mode": ("compute_mode", str),
    "FB Memory Usage/Total": ("memory_total_mib", int),
    "FB Memory Usage/Used": ("memory_used_mib", int),
    "Utilization/Gpu": ("utilization_gpu_pct", int),
    "Temperature/GPU Current Temp": ("temperature_gpu_c", int),
    "Power Readings/Power Draw": ("power_draw_w", float),
    "Power Readings/Power Limit": ("power_limit_w", float),
    "Power Readings/Max Power Limit": ("power_max_limit_w", float),
    # Drivers 530+ name the section "GPU Power Readings" and the set limit "Current Power Limit".
    "GPU Power Readings/Power Draw": ("power_draw_w", float),
    "GPU Power Readings/Current Power Limit": ("power_limit_w", float),
    "GPU Power Readings/Max Power Limit": ("power_max_limit_w", float),
    "Max Clocks/Graphics": ("clocks_max_graphics_mhz", int),
    "Clocks/Graphics": ("clocks_current_graphics_mhz", int),
}
_Q_GPU = re.compile(r"^GPU\s+(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
_Q_PAIR = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_Q_SECTION = re.compile(r"^(?P<indent>\s*)(?P<key>\S[^:]*?)\s*$")


def parse_q(text: str) -> list[dict[str, Any]]:
    """Read ``nvidia-smi -q``: per GPU section, the `_Q_FIELDS` values (units stripped: MiB, W, MHz, %, C) plus
    index (order of the sections), pci_bus_id, and driver_version from the top. ``N/A`` values are None.

    Raises:
        UserError: ``Attached GPUs : N`` says more GPUs than sections printed (a capture cut short).
    """
    top: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        gpu = _Q_GPU.match(line)
        if gpu:
            rows.append({"index": len(rows), "pci_bus_id": gpu["bus"]})
            stack = []
            continue
        pair = _Q_PAIR.match(line)
        section = None if pair else _Q_SECTION.match(line)
        indent = len((pair or section)["indent"]) if (pair or section) else 0
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if section:
            stack.append((indent, section["key"]))
            continue
        if not pair:
            continue
        if not rows:
            top[pair["key"]] = pair["value"]
            continue
        path = "/".join([s for _, s in stack] + [pair["key"]])
        if path in _Q_FIELDS:
            key, kind = _Q_FIELDS[path]
            value = re.sub(r"\s*(MiB|W|MHz|%|C)$", "", pair["value"])
            rows[-1][key] = value if kind is str else _num(value, kind)
    attached = _num(top.get("Attached GPUs", ""), int)
    if attached is not None and attached != len(rows):
        raise UserError(f"nvidia-smi -q says Attached GPUs : {attached} but prints {len(rows)} GPU section(s): the "
                        "capture was cut short", "capture the whole `nvidia-smi -q` output again")
    for row in rows:
        row["driver_version"] = top.get("Driver Version")
    return rows


def _project(rows: list[dict[str, Any]], fields: list[str] | None) -> list[dict[str, Any]]:
    """Rows of `parse_table`/`parse_q` with the keys `fields` would have in CSV (missing ones None)."""
    if fields is None:
        return rows
    keys = [_spec(f, None)[0] for f in fields]
    return [{k: row.get(k) for k in keys} for row in rows]


def parse_query_gpu(text: str, fields: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu`` CSV output, or the plain ``nvidia-smi`` table / ``nvidia-smi -q`` a user
    pasted (`parse_table`, `parse_q`: the same keys, None for what that format does not show).

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
    if "==============NVSMI LOG==============" in text:
        rows = parse_q(text)
        if not rows:
            raise UserError("nvidia-smi -q output lists no GPU section", "capture the whole `nvidia-smi -q` output")
        return _project(rows, fields)
    if _TABLE_BANNER.search(text) or any(_TABLE_GPU.match(line) for line in lines):
        rows = parse_table(text)
        if not rows:
            raise UserError("the plain nvidia-smi table lists no GPU (\"No devices were found\", or a capture cut "
                            "before the first GPU)", "capture the whole `nvidia-smi` output again")
        return _project(rows, fields)
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
