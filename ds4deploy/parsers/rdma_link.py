"""Parse iproute2 ``rdma link show`` (text, what the checks run) and MLNX_OFED's ``ibdev2netdev``.

Formats, from iproute2 ``rdma/link.c``:

- current text (iproute2 5.x/6.x): ``link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev p1p1 ``
  (note the trailing space after each value; ``-d`` adds ``netdev_index N`` and a ``caps: <...>`` line);
- early text (iproute2 4.1x): ``1/1: mlx5_0/1: state ACTIVE physical_state LINK_UP netdev ens4f0``.

States (same source): ``state`` is one of NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER; ``physical_state`` one
of NOP, SLEEP, POLLING, DISABLED, ARMED, LINK_UP, LINK_ERROR_RECOVER, PHY_TEST, ... . A usable rail is
``ACTIVE`` + ``LINK_UP``. Empty output means "no RDMA device", not an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ds4deploy.core.errors import UserError

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


_IBDEV = re.compile(r"^(?P<dev>\S+) port (?P<port>\d+) ==> (?P<netdev>\S+) \((?P<carrier>Up|Down|NA)\)$")
_IBDEV_V = re.compile(r"^\S+ (?P<dev>\S+) \(.*\bport (?P<port>\d+) \((?P<state>[A-Z_]+|NA)\s*\) ==> "
                      r"(?P<netdev>\S+) \((?P<carrier>Up|Down|NA)\)$")
FIX_IBDEV = "run `ibdev2netdev` (MLNX_OFED / mlnx-tools) on the host and capture its whole output"


@dataclass(frozen=True)
class NetdevMapping:
    """One line of ``ibdev2netdev``: an RDMA port, its netdev and whether that netdev has carrier.

    Attributes:
        device: RDMA device (``rocep1s0f1``, ``mlx5_0``).
        port: port number.
        netdev: the network interface of the port.
        carrier: ``Up``, ``Down`` or ``NA`` as printed (the netdev's carrier, ``/sys/class/net/<netdev>/carrier``).
        port_state: the RDMA port state (``ACTIVE``, ``DOWN``, ...) with ``-v``; None without it.
    """

    device: str
    port: int
    netdev: str
    carrier: str
    port_state: str | None = None

    @property
    def is_up(self) -> bool:
        """True when the netdev has carrier and (with ``-v``) the RDMA port is ACTIVE. On RoCE the port state
        follows the netdev's link (iproute2 rdma/link.c states; mlnx-tools ibdev2netdev)."""
        return self.carrier == "Up" and self.port_state in (None, "ACTIVE")

    @property
    def shown(self) -> str:
        """The state as a check row shows it, e.g. ``ACTIVE, enp1s0f1np1 Up (ibdev2netdev)``."""
        prefix = f"{self.port_state}, " if self.port_state else ""
        return f"{prefix}{self.netdev} {self.carrier} (ibdev2netdev)"


def parse_ibdev2netdev(text: str) -> list[NetdevMapping]:
    """Parse ``ibdev2netdev`` or ``ibdev2netdev -v`` output.

    Args:
        text: captured stdout.

    Returns:
        Mappings in output order; ``[]`` for empty output (the script prints nothing without Mellanox devices).

    Raises:
        UserError: a line in neither format (wrong tool, the pre-2017 ``<===>`` style that prints no state, or a
            line cut short).
    """
    out: list[NetdevMapping] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _IBDEV.match(line.strip()) or _IBDEV_V.match(line.strip())
        if not match:
            raise UserError(
                f"expected `ibdev2netdev` output ('<dev> port <n> ==> <netdev> (Up|Down)'), line {number} is "
                f"{line.strip()!r}",
                FIX_IBDEV,
            )
        groups = match.groupdict()
        out.append(NetdevMapping(groups["dev"], int(groups["port"]), groups["netdev"], groups["carrier"],
                                 groups.get("state")))
    return out
