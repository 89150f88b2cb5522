"""Address helpers shared by the renders, the CLI and the checks."""

from __future__ import annotations

import ipaddress


def url_host(addr: str) -> str:
    """An address as it appears in a URL or a compose port mapping: IPv6 in brackets (``[::1]``), else as is."""
    try:
        return f"[{addr}]" if ipaddress.ip_address(addr).version == 6 else addr
    except ValueError:
        return addr  # a host name


def base_url(addr: str, port: int) -> str:
    """``http://<addr>:<port>`` with IPv6 bracketed; the unspecified address (0.0.0.0, ::) maps to loopback."""
    ip = ipaddress.ip_address(addr)
    if ip.is_unspecified:
        addr = "127.0.0.1" if ip.version == 4 else "::1"
    return f"http://{url_host(addr)}:{port}"
