"""Parse iproute2 ``rdma link show`` (text) and ``rdma -j link show`` (JSON).

Formats, from iproute2 ``rdma/link.c``:

- current text (iproute2 5.x/6.x): ``link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev p1p1 ``
  (note the trailing space after each value; ``-d`` adds ``netdev_index N`` and a ``caps: <...>`` line);
- early text (iproute2 4.1x): ``1/1: mlx5_0/1: state ACTIVE physical_state LINK_UP netdev ens4f0``;
- JSON: a list of objects with ``ifindex``, ``ifname`` (``"mlx5_0"`` with ``port``, or ``"mlx5_0/1"`` in
  early versions), ``state``, ``physical_state``, ``netdev``, ``netdev_index``.

States (same source): ``state`` is one of NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER; ``physical_state`` one
of NOP, SLEEP, POLLING, DISABLED, ARMED, LINK_UP, LINK_ERROR_RECOVER, PHY_TEST, ... . A usable rail is
``ACTIVE`` + ``LINK_UP``. Empty output means "no RDMA device", not an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ds4deploy.errors import UserError

_NAME = re.compile(r"^(?:link\s+|\d+/\d+:\s+)(?P<dev>[^/\s]+)/(?P<port>\d+):?(?P<rest>(?:\s.*)?)$")
_KEYS = ("subnet_prefix", "lid", "sm_lid", "lmc", "state", "physical_state", "netdev", "netdev_index")
FIX = "run `rdma link show` (iproute2) on the host and capture its whole output"


@dataclass(frozen=True)
class RdmaLink:
    """One RDMA port.

    Attributes:
        device: RDMA device (``rocep1s0f1``, ``mlx5_0``, ``rxe_0``).
        port: port number.
        state: logical state (``ACTIVE``, ``DOWN``, ...).
        physical_state: physical state (``LINK_UP``, ``DISABLED``, ``POLLING``, ...).
        netdev: the Ethernet interface behind a RoCE port, ``None`` when none is reported (IB, or unbound).
    """

    device: str
    port: int
    state: str
    physical_state: str
    netdev: str | None

    @property
    def is_up(self) -> bool:
        """True when the port is ACTIVE with physical state LINK_UP (usable for RDMA traffic)."""
        return self.state == "ACTIVE" and self.physical_state == "LINK_UP"


def parse_rdma_link_text(text: str) -> list[RdmaLink]:
    """Parse ``rdma link show`` text output.

    Args:
        text: captured stdout; ``-d`` continuation lines (``caps: <...>``) are ignored.

    Returns:
        Links in output order; ``[]`` for empty output (no RDMA device).

    Raises:
        UserError: a line that is not a link line (wrong tool), or a link line without ``state`` /
            ``physical_state`` (cut short).
    """
    links: list[RdmaLink] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or (line[:1].isspace() and line.strip().startswith("caps:")):
            continue
        match = _NAME.match(line.strip())
        if not match:
            raise UserError(
                f"expected `rdma link show` output ('link <dev>/<port> state ... physical_state ...'), "
                f"line {number} is {line.strip()!r}",
                FIX,
            )
        tokens = match["rest"].split()
        values = {key: value for key, value in zip(tokens[::2], tokens[1::2], strict=False) if key in _KEYS}
        if "state" not in values or "physical_state" not in values:
            raise UserError(
                f"`rdma link show` line {number} for {match['dev']}/{match['port']} lacks state/physical_state "
                f"({line.strip()!r}): the output was cut short",
                FIX,
            )
        links.append(
            RdmaLink(
                device=match["dev"],
                port=int(match["port"]),
                state=values["state"],
                physical_state=values["physical_state"],
                netdev=values.get("netdev"),
            )
        )
    return links


def parse_rdma_link_json(text: str) -> list[RdmaLink]:
    """Parse ``rdma -j link show`` JSON output.

    Args:
        text: captured stdout, a JSON array of link objects (see module docstring for the keys).

    Returns:
        Links in output order; ``[]`` for an empty array or empty output.

    Raises:
        UserError: not JSON, not a list of objects, or an object without ``ifname``/``state``/``physical_state``.
    """
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"expected `rdma -j link show` JSON, got unparseable text ({exc.msg} at line {exc.lineno})", FIX
        ) from exc
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise UserError("expected `rdma -j link show` JSON: a list of link objects", FIX)
    links: list[RdmaLink] = []
    for position, item in enumerate(data):
        missing = [key for key in ("ifname", "state", "physical_state") if key not in item]
        if missing:
            raise UserError(f"`rdma -j link show` entry {position} lacks {', '.join(missing)}: {item}", FIX)
        name = str(item["ifname"])
        device, _, port_text = name.partition("/")
        port = item.get("port", port_text or None)
        if port is None:
            raise UserError(f"`rdma -j link show` entry {position} ({name}) has no port number", FIX)
        links.append(
            RdmaLink(
                device=device,
                port=int(port),
                state=str(item["state"]),
                physical_state=str(item["physical_state"]),
                netdev=str(item["netdev"]) if item.get("netdev") else None,
            )
        )
    return links
