"""Rail checks: every RoCE rail of the recipe on one host, and the path to each peer's address on that rail.

Per rail (``rails.<what>.<rail>``):

- ``link``: the netdev exists, is not enslaved to a bond (docs/sources.md#gx10-roce-checklist) and its operstate is
  ``up``.
- ``address``: the netdev carries exactly the inventory's address with the rail's prefix, and no address of
  another rail's subnet (docs/sources.md#gx10-roce-checklist: rails on one subnet pin routing to one rail).
- ``mtu``: the netdev MTU is the recipe's (9000; docs/sources.md#rail-netplan).
- ``speed``: link speed >= fabric.min_rail_gbit_s; skipped on virtual netdevs (veth: no physical link speed).
- ``route.<peer>``: the kernel routes the peer's rail address out of this rail's netdev.
- ``jumbo.<peer>``: a don't-fragment ping of MTU-28 bytes (20 IPv4 + 8 ICMP header bytes) reaches the peer's rail
  address (docs/sources.md#jumbo-frames); when it fails, a small ping tells "peer
  unreachable" from "jumbo frames do not pass".

Host facts come from the inventory the preflight rules read: ``ds4_rails: {<rail>: {address: a.b.c.d}}``, with
the host's own netdev names where it overrides the recipe's (``ds4_rails.<rail>.netdev``,
`ds4deploy.plan.node_fabric.node_rails`): each host is checked on its own netdevs.
"""

from __future__ import annotations

import ipaddress
import json
import shlex

from ds4deploy.checks.report import ERROR, FAIL, PASS, Row, skip
from ds4deploy.checks.target import Target
from ds4deploy.plan.node_fabric import node_rails
from ds4deploy.recipe.schema import Rail, Recipe

SRC_SUBNETS = "docs/sources.md#gx10-roce-checklist: rails on one subnet pin routing to one rail"
SRC_MTU = "recipe fabric.rails[].mtu; docs/sources.md#rail-netplan, #jumbo-frames: DF ping of MTU-28 bytes"
SRC_SPEED = "recipe fabric.min_rail_gbit_s"
IP_AND_ICMP_HEADER_BYTES = 28  # IPv4 header 20 + ICMP echo header 8: the largest DF payload is MTU - 28


def _link_facts(target: Target, netdev: str) -> dict[str, str] | None:
    """operstate, mtu, speed, physical (1/0) and master of `netdev` from /sys/class/net; None if it is missing."""
    d = shlex.quote(f"/sys/class/net/{netdev}")
    out = target.run(
        f"d={d}; [ -e $d ] || {{ echo missing=1; exit 0; }}; echo operstate=$(cat $d/operstate); "
        "echo mtu=$(cat $d/mtu); echo speed=$(cat $d/speed 2>/dev/null); "
        "if [ -e $d/device ]; then echo physical=1; else echo physical=0; fi; "
        "if [ -e $d/master ]; then echo master=$(basename $(readlink $d/master)); fi"
    )
    if not out.ok:
        raise RuntimeError(out.stderr.strip() or f"reading /sys/class/net/{netdev} failed (rc {out.rc})")
    facts = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return None if facts.get("missing") else facts


def _ipv4_addresses(target: Target, netdev: str) -> list[ipaddress.IPv4Interface]:
    """IPv4 addresses with prefix on `netdev` (``ip -j -4 addr show dev``)."""
    out = target.run(f"ip -j -4 addr show dev {shlex.quote(netdev)}")
    if not out.ok:
        raise RuntimeError(out.stderr.strip() or f"ip addr show dev {netdev} failed")
    data = json.loads(out.stdout or "[]")
    return [ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}")
            for link in data for a in link.get("addr_info", []) if a.get("family") == "inet"]


def rail_address(hostvars: dict, rail: Rail) -> str | None:
    """The inventory's address of `rail` for a host (``ds4_rails.<rail>.address``), or None."""
    return ((hostvars.get("ds4_rails") or {}).get(rail.name) or {}).get("address")


def check_rails(target: Target, recipe: Recipe, hostvars: dict, peers: dict[str, dict]) -> list[Row]:
    """All rail rows for one host.

    Args:
        target: the host.
        recipe: the recipe (its fabric.rails and min_rail_gbit_s).
        hostvars: this host's inventory variables (ds4_rails: addresses, and netdev names where they differ from
            the recipe's).
        peers: the other fabric hosts' inventory variables, by host name (their rail addresses are ping targets).

    Returns:
        Rows in rail order; a single skip row when the recipe has no fabric.

    Raises:
        UserError: a host's rail name overrides are wrong (`ds4deploy.plan.node_fabric.host_problems`).
    """
    host = target.name
    if recipe.fabric is None:
        return [skip(host, "rails", "no rails", f"recipe {recipe.name} has no fabric section")]
    rows: list[Row] = []
    subnets = {r.name: ipaddress.ip_network(r.subnet) for r in recipe.fabric.rails}
    peer_rails = {p: {r.name: r for r in node_rails(recipe, p, pv)} for p, pv in peers.items()}
    for rail in node_rails(recipe, host, hostvars):
        net = subnets[rail.name]
        want = rail_address(hostvars, rail)
        try:
            facts = _link_facts(target, rail.netdev)
        except RuntimeError as exc:
            rows.append(Row(host, f"rails.link.{rail.name}", f"{rail.netdev} up", str(exc), ERROR,
                            "check that the host answers and has /sys/class/net"))
            continue
        if facts is None:
            rows.append(Row(host, f"rails.link.{rail.name}", f"{rail.netdev} up", f"no netdev {rail.netdev}", FAIL,
                            f"check the cabling and this host's netdev for {rail.name} (the recipe's "
                            f"fabric.rails[].netdev or the inventory's ds4_rails.{rail.name}.netdev) against "
                            "`ip link`"))
            continue
        if facts.get("master"):
            rows.append(Row(host, f"rails.link.{rail.name}", f"{rail.netdev} up, not bonded",
                            f"enslaved to {facts['master']}", FAIL,
                            "remove the bond: one netplan ethernets entry per rail, no bonds (no LACP)",
                            "docs/sources.md#gx10-roce-checklist"))
        elif facts.get("operstate") != "up":
            rows.append(Row(host, f"rails.link.{rail.name}", f"{rail.netdev} up",
                            f"{rail.netdev} operstate {facts.get('operstate')}", FAIL,
                            f"bring it up (`ip link set {rail.netdev} up`, or `netplan apply`); check the cable "
                            "and the peer port"))
        else:
            rows.append(Row(host, f"rails.link.{rail.name}", f"{rail.netdev} up", f"{rail.netdev} up", PASS))

        # Address and subnet.
        expected = f"{want}/{net.prefixlen}" if want else f"an address in {net}"
        try:
            have = _ipv4_addresses(target, rail.netdev)
        except (RuntimeError, ValueError) as exc:
            rows.append(Row(host, f"rails.address.{rail.name}", expected, str(exc), ERROR, "check iproute2"))
            have = []
        else:
            foreign = [(a, other) for a in have for other, onet in subnets.items()
                       if other != rail.name and a.network.overlaps(onet)]
            shown = ", ".join(str(a) for a in have) or "no IPv4 address"
            if want is None:
                rows.append(Row(host, f"rails.address.{rail.name}", expected, shown, ERROR,
                                f"add ds4_rails.{rail.name}.address for {host} to the inventory"))
            elif foreign:
                a, other = foreign[0]
                rows.append(Row(host, f"rails.address.{rail.name}", expected,
                                f"{shown}: {a} is in {other}'s subnet {subnets[other]}", FAIL,
                                f"rails must be on different subnets: give {rail.netdev} only {expected} "
                                f"(netplan), remove {a}", SRC_SUBNETS))
            elif [str(a) for a in have] != [expected]:
                rows.append(Row(host, f"rails.address.{rail.name}", expected, shown, FAIL,
                                f"set {rail.netdev} to exactly {expected} (netplan addresses, dhcp4: false), "
                                "then `netplan apply`", "docs/sources.md#gx10-roce-checklist: both ports need an IP"))
            else:
                rows.append(Row(host, f"rails.address.{rail.name}", expected, shown, PASS))

        mtu = facts.get("mtu", "?")
        rows.append(Row(host, f"rails.mtu.{rail.name}", str(rail.mtu), mtu, PASS if mtu == str(rail.mtu) else FAIL,
                        "" if mtu == str(rail.mtu) else f"set mtu: {rail.mtu} for {rail.netdev} in netplan and "
                        f"`netplan apply` (or `ip link set {rail.netdev} mtu {rail.mtu}`)", SRC_MTU))

        min_mbit = recipe.fabric.min_rail_gbit_s * 1000
        if facts.get("physical") != "1":
            rows.append(skip(host, f"rails.speed.{rail.name}", f">= {min_mbit:.0f} Mb/s",
                             f"{rail.netdev} is a virtual netdev (no physical link speed)", SRC_SPEED))
        else:
            speed = facts.get("speed", "")
            ok = speed.lstrip("-").isdigit() and int(speed) >= min_mbit
            rows.append(Row(host, f"rails.speed.{rail.name}", f">= {min_mbit:.0f} Mb/s", f"{speed or '?'} Mb/s",
                            PASS if ok else FAIL, "" if ok else
                            "the port negotiated a lower speed: check the cable/transceiver and `ethtool "
                            f"{rail.netdev}`", SRC_SPEED))

        rows += _peer_rows(target, rail, facts, have, peers, {p: rs[rail.name] for p, rs in peer_rails.items()})
    return rows


def _peer_rows(target: Target, rail: Rail, facts: dict, have: list, peers: dict[str, dict],
               theirs: dict[str, Rail]) -> list[Row]:
    """Route and jumbo-frame rows from this host's `rail` to each peer's address on it; `theirs` is each peer's
    own view of the rail (its netdev name may differ from this host's)."""
    host, rows = target.name, []
    for peer, pv in peers.items():
        addr = rail_address(pv, rail)
        if addr is None:
            rows.append(Row(host, f"rails.jumbo.{rail.name}.{peer}", "peer address", "peer has no address",
                            ERROR, f"add ds4_rails.{rail.name}.address for {peer} to the inventory"))
            continue
        route = target.run(f"ip -j route get {shlex.quote(addr)}")
        try:
            dev = json.loads(route.stdout)[0].get("dev") if route.ok else None
        except (ValueError, IndexError):
            dev = None
        ok = dev == rail.netdev
        rows.append(Row(host, f"rails.route.{rail.name}.{peer}", f"{addr} via {rail.netdev}",
                        f"via {dev}" if dev else f"no route ({(route.stderr or route.stdout).strip()[:80]})",
                        PASS if ok else FAIL, "" if ok else
                        f"{addr} must leave through {rail.netdev}: one subnet per rail, the address on the right "
                        "netdev (rails on one subnet pin traffic to one port)", SRC_SUBNETS))
        size = int(facts.get("mtu", rail.mtu)) - IP_AND_ICMP_HEADER_BYTES
        want_size = rail.mtu - IP_AND_ICMP_HEADER_BYTES
        ping = target.run(f"ping -M do -s {want_size} -c 3 -i 0.2 -W 2 -I {shlex.quote(rail.netdev)} "
                          f"{shlex.quote(addr)}", timeout=20)
        if ping.ok:
            rows.append(Row(host, f"rails.jumbo.{rail.name}.{peer}", f"DF ping {want_size} B to {addr}",
                            "replies", PASS, "", SRC_MTU))
            continue
        if ping.rc == 127 or "not found" in ping.stderr:
            rows.append(Row(host, f"rails.jumbo.{rail.name}.{peer}", f"DF ping {want_size} B to {addr}",
                            "ping is not installed", ERROR, "install iputils-ping on the host"))
            continue
        small = target.run(f"ping -c 2 -i 0.2 -W 2 -I {shlex.quote(rail.netdev)} {shlex.quote(addr)}", timeout=15)
        if facts.get("operstate") != "up" or not have:
            why, fix = f"{rail.netdev} is down or has no address", "fix this rail's link/address rows first"
        elif small.ok:
            why = f"small pings reply, {want_size}-byte DF pings do not ({size + IP_AND_ICMP_HEADER_BYTES} MTU here)"
            fix = (f"jumbo frames do not pass end to end: set MTU {rail.mtu} on {peer}'s {theirs[peer].netdev} and "
                   "on any "
                   "switch port between them")
        else:
            why, fix = (f"{addr} does not answer at all",
                        f"check {peer}'s {theirs[peer].netdev} (up, address {addr}) and the cable")
        rows.append(Row(host, f"rails.jumbo.{rail.name}.{peer}", f"DF ping {want_size} B to {addr}", why, FAIL,
                        fix, SRC_MTU))
    return rows
