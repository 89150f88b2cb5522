"""Address helpers shared by the renders, the CLI and the checks."""

from __future__ import annotations

import ipaddress
import re

# A host name (RFC 1123 section 2.1, RFC 1035 section 2.3.4): dot-separated labels of 1-63 letters, digits and
# '-', neither starting nor ending with '-', 253 characters in all.
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
HOSTNAME_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")


def no_server_there(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether no server can listen on or answer from `ip`: a multicast address or the IPv4 limited broadcast
    address (RFC 919, 255.255.255.255)."""
    return ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255")


def same_host(host: str) -> str:
    """One spelling per host, for telling whether two spellings name one: an address in its compressed form
    (fd00:0::1 is fd00::1), localhost as 127.0.0.1, a host name in lower case without its final dot."""
    if host.lower() == "localhost":
        return "127.0.0.1"
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower().rstrip(".")


def destination_problem(host: str) -> str | None:
    """Why `host` cannot be where a connection goes (None when it can): not an IP address or RFC 1123 host name
    (``a..b``, ``-``), a dotted number that is no IPv4 address (``999.1.1.1``), or an address no server answers
    from (unspecified 0.0.0.0/::, multicast, the IPv4 broadcast address)."""
    if "%" in host:
        return f"{host!r} has a zone index (%<interface>), which nginx's upstream and a URL cannot carry"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if re.fullmatch(r"[0-9.]+", host):
            return f"{host!r} is not an IPv4 address"
        if not HOSTNAME_RE.fullmatch(host):
            return f"{host!r} is neither an IP address nor a host name (RFC 1123: labels of letters, digits and '-')"
        return None
    if ip.is_unspecified or no_server_there(ip):
        return f"{host} is an unspecified, multicast or broadcast address: no server answers from it"
    return None


def url_host(addr: str) -> str:
    """An address as it appears in a URL or a compose port mapping: IPv6 in brackets (``[::1]``), else as is."""
    try:
        return f"[{addr}]" if ipaddress.ip_address(addr).version == 6 else addr
    except ValueError:
        return addr  # a host name


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and a loopback address (127.0.0.0/8, ::1); False for any other address or host name."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_url(addr: str, port: int) -> str:
    """``http://<addr>:<port>`` with IPv6 bracketed; the unspecified address (0.0.0.0, ::) maps to loopback. `addr`
    may be a host name (``gx10-a.lan``), used as is."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return f"http://{addr}:{port}"
    if ip.is_unspecified:
        addr = "127.0.0.1" if ip.version == 4 else "::1"
    return f"http://{url_host(addr)}:{port}"


def listens_only_on(listening: list[str], address: str, port: int) -> tuple[bool, list[str]]:
    """Whether TCP `port` is bound exactly where the recipe says, from testinfra's ``get_listening_sockets()``.

    Args:
        listening: socket URLs as testinfra lists them (``tcp://0.0.0.0:8000``, ``tcp://:::8000``, ``unix://...``).
        address: the recipe's ``serving.bind_address``.
        port: the published port.
    Returns:
        (ok, the ``tcp://`` entries on `port`). A dual-stack ``::`` bind is one socket that ``ss`` prints as
        ``*:<port>`` and testinfra lists twice, as ``tcp://:::<port>`` and ``tcp://0.0.0.0:<port>``
        (testinfra ``modules/socket.py``, ``if host == "*"``): for ``::`` those two entries are the one bind.
        Every other address must be the only entry.
    """
    bound = [s for s in listening if s.startswith("tcp://") and s.rsplit(":", 1)[-1] == str(port)]
    hosts = set()
    for entry in bound:
        host = entry.removeprefix("tcp://").rsplit(":", 1)[0]
        try:
            hosts.add(ipaddress.ip_address(host))
        except ValueError:
            hosts.add(host)
    want = ipaddress.ip_address(address)
    if want == ipaddress.ip_address("::"):
        return hosts in ({want}, {want, ipaddress.ip_address("0.0.0.0")}), bound  # noqa: S104 (read, not bound)
    return hosts == {want} and len(bound) == 1, bound
