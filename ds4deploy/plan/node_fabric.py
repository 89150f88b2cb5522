"""Each node's own rail names: the recipe's fabric with the inventory's per-node netdev and HCA overrides.

The recipe names one cabling (recipes/gx10x2-ds4-flash-fp8.yaml: the f1 port, ``enp1s0f1np1`` / ``rocep1s0f1``
and ``enP2p1s0f1np1`` / ``roceP2p1s0f1``). A GX10 owner may cable either port pair, and the two nodes need not
match (the f0 pair is ``enp1s0f0np0`` / ``rocep1s0f0`` and ``enP2p1s0f0np0`` / ``roceP2p1s0f0``;
docs/sources.md#gx10-pair). So a host may override, per rail, the names the recipe gives, beside its rail
address in the inventory::

    ds4_rails:
      rail0: {address: 10.100.184.2, netdev: enp1s0f0np0, hcas: [rocep1s0f0]}
      rail1: {address: 10.100.185.2, netdev: enP2p1s0f0np0, hcas: [roceP2p1s0f0]}

Everything per node follows these names: the rails role (netplan, MTU, addresses), the rail and fabric checks,
the RoCE v2 GID index (module ds4_gid_index), and the node's launch env (`launch_env`: NCCL_IB_HCA and the socket
interface of NCCL, Gloo and torch), which the stack role writes into the node's own ``.env``.

Subnet and MTU stay the recipe's: the two ends of a rail must agree on them. An override HCA list replaces the
rail's HCAs position by position, so fabric.nccl_ib_hca maps to the node's own HCAs the same way.
"""

from __future__ import annotations

import ipaddress
import re

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import HCA_RE, HCA_RULE, NETDEV_RE, NETDEV_RULE, Rail, Recipe

# What a host may give per rail: facts about it (address; mtu, read by the preflight rule rails-mtu-hosts) and the
# names it overrides.
FACT_KEYS = ("address", "mtu")
OVERRIDE_KEYS = ("netdev", "hcas")
# One rule for netdev and HCA names, the recipe's rails and a node's overrides alike (ds4deploy.recipe.schema.NETDEV_RE,
# HCA_RE: the sources are there).
_NETDEV = re.compile(NETDEV_RE)
_HCA = re.compile(HCA_RE)
SRC_PORTS = "docs/sources.md#gx10-pair"
EXAMPLE = ("ds4_rails: {rail0: {address: a.b.c.d, netdev: enp1s0f0np0, hcas: [rocep1s0f0]}} "
           "(names from `ibdev2netdev` or `rdma link show` on the node)")


def host_problems(recipe: Recipe, host: str, hostvars: dict) -> list[str]:
    """What is wrong with one host's per-rail overrides (``ds4_rails``) for `recipe`; empty when all is well.

    Refused: ``ds4_rails`` that is not a mapping, a rail the recipe does not have, an entry that is not a mapping
    or has a key other than `FACT_KEYS` / `OVERRIDE_KEYS`, a netdev or HCA that is not a valid name, an HCA list
    whose length differs from the recipe rail's, a name given for some rails of the recipe but not all (a node's
    rails are the twin functions of the port it is cabled on, so all or none move), and one netdev or HCA on two
    rails of the host. A recipe without a fabric takes no overrides.
    """
    facts = hostvars.get("ds4_rails")
    if facts is None:
        return []
    where = f"{host}: ds4_rails"
    if not isinstance(facts, dict):
        return [f"{where} is {type(facts).__name__}, not a mapping of rail name to {{address, netdev, hcas}}"]
    rails = {r.name: r for r in recipe.fabric.rails} if recipe.fabric is not None else {}
    if not rails:
        given = sorted(n for n, v in facts.items() if isinstance(v, dict) and set(v) & set(OVERRIDE_KEYS))
        return [f"{where}.{n} overrides rail names, but recipe {recipe.name} has no fabric" for n in given]
    out: list[str] = []
    for name, entry in facts.items():
        entry = {} if entry is None else entry
        if name not in rails:
            out.append(f"{where}.{name}: recipe {recipe.name} has no rail {name!r} (its rails: "
                       f"{', '.join(rails)})")
            continue
        if not isinstance(entry, dict):
            out.append(f"{where}.{name} is {entry!r}, not a mapping {{address, netdev, hcas}}")
            continue
        unknown = sorted(set(entry) - set(FACT_KEYS) - set(OVERRIDE_KEYS))
        if unknown:
            out.append(f"{where}.{name} has unknown key(s) {', '.join(map(str, unknown))} (known: "
                       f"{', '.join(FACT_KEYS + OVERRIDE_KEYS)})")
        if "netdev" in entry and not (isinstance(entry["netdev"], str) and _NETDEV.match(entry["netdev"])):
            out.append(f"{where}.{name}.netdev {entry['netdev']!r} is not {NETDEV_RULE}")
        if "hcas" in entry:
            hcas, want = entry["hcas"], rails[name].hcas
            if not isinstance(hcas, list) or not all(isinstance(h, str) for h in hcas):
                out.append(f"{where}.{name}.hcas {hcas!r} is not a list of HCA names")
            elif len(hcas) != len(want):
                out.append(f"{where}.{name}.hcas lists {len(hcas)} HCA(s) ({', '.join(hcas) or 'none'}), but the "
                           f"recipe's rail {name} has {len(want)} ({', '.join(want)}): the override replaces them "
                           "one for one")
            else:
                out += [f"{where}.{name}.hcas: {h!r} is not {HCA_RULE}" for h in hcas if not _HCA.match(h)]
    for key in OVERRIDE_KEYS:
        given = [n for n in rails if isinstance(facts.get(n), dict) and key in facts[n]]
        if given and len(given) != len(rails):
            out.append(f"{where} gives {key} for {len(given)} of the recipe's {len(rails)} rails ({', '.join(given)}; "
                       f"not {', '.join(n for n in rails if n not in given)}): a node's rails are the twin functions "
                       f"of the port it is cabled on, so give {key} for every rail or for none")
    if out:
        return out
    own = node_rails(recipe, host, hostvars, checked=True)
    for kind, names in (("netdev", [(r.name, r.netdev) for r in own]),
                        ("HCA", [(r.name, h) for r in own for h in r.hcas])):
        seen: dict[str, str] = {}
        for rail, value in names:
            if value in seen:
                where_else = f"twice on rail {rail}" if seen[value] == rail else f"on rails {seen[value]} and {rail}"
                out.append(f"{host}: {kind} {value} is {where_else}: every rail of a node needs its own {kind}")
            seen.setdefault(value, rail)
    return out


def check_hosts(recipe: Recipe, hosts: dict[str, dict], inventory: str = "the inventory") -> None:
    """Refuse an inventory whose per-rail overrides are wrong on any host: one message listing every problem.

    Raises:
        UserError: `host_problems` found something on at least one host (nothing has been changed then).
    """
    problems = [p for name, hv in hosts.items() for p in host_problems(recipe, name, hv)]
    if problems:
        raise UserError(f"{len(problems)} problem(s) with the rail names in {inventory} for recipe {recipe.name}, "
                        "nothing was changed on any host:\n  " + "\n  ".join(problems),
                        "give each rail the node's own names, the same count as the recipe's rail: " + EXAMPLE
                        + f"; or leave netdev/hcas out to use the recipe's ({SRC_PORTS})")


def node_rails(recipe: Recipe, host: str, hostvars: dict, checked: bool = False) -> list[Rail]:
    """The recipe's rails as `host` has them: its ``ds4_rails.<rail>.netdev`` / ``.hcas`` replace the recipe's.

    Args:
        recipe: the recipe; no fabric gives ``[]``.
        host: the inventory host name (for the message).
        hostvars: the host's inventory variables.
        checked: the caller has already run `host_problems` for this host.

    Raises:
        UserError: the host's overrides are wrong (`host_problems`).
    """
    if recipe.fabric is None:
        return []
    if not checked:
        problems = host_problems(recipe, host, hostvars)
        if problems:
            raise UserError(f"{host}: wrong rail names in the inventory: " + "; ".join(problems),
                            "give each rail the node's own names, the same count as the recipe's rail: " + EXAMPLE)
    facts = hostvars.get("ds4_rails") or {}
    out = []
    for rail in recipe.fabric.rails:
        entry = facts.get(rail.name) or {}
        out.append(rail.model_copy(update={"netdev": entry.get("netdev", rail.netdev),
                                           "hcas": list(entry.get("hcas", rail.hcas))}))
    return out


def nccl_ib_hca(recipe: Recipe, rails: list[Rail]) -> list[str]:
    """fabric.nccl_ib_hca in the node's own names: each recipe HCA becomes the node's HCA at the same position of
    the same rail (`node_rails`). Empty without a fabric."""
    if recipe.fabric is None:
        return []
    own = {hca: mine.hcas[i] for rail, mine in zip(recipe.fabric.rails, rails, strict=True)
           for i, hca in enumerate(rail.hcas)}
    return [own[hca] for hca in recipe.fabric.nccl_ib_hca]


def launch_env(recipe: Recipe, rails: list[Rail]) -> dict[str, str]:
    """The node's own interface names for its ``.env`` (the render refers to them,
    `ds4deploy.render.compose.node_files`):

    - ``DS4_NCCL_IB_HCA``: `nccl_ib_hca`, comma-separated (NCCL_IB_HCA);
    - ``DS4_SOCKET_IFNAME``: the node's first-rail netdev (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
      TP_SOCKET_IFNAME; docs/sources.md#sm121-nccl-env).

    Empty without a fabric.
    """
    if recipe.fabric is None:
        return {}
    return {"DS4_NCCL_IB_HCA": ",".join(nccl_ib_hca(recipe, rails)), "DS4_SOCKET_IFNAME": rails[0].netdev}


def as_ansible(rails: list[Rail]) -> list[dict]:
    """Rails as the Ansible roles and the module ds4_gid_index read them: ``{name, netdev, hcas, subnet, prefix,
    mtu}`` (prefix: the subnet's prefix length, for netplan and iproute2)."""
    return [{"name": r.name, "netdev": r.netdev, "hcas": list(r.hcas), "subnet": r.subnet,
             "prefix": ipaddress.ip_network(r.subnet).prefixlen, "mtu": r.mtu} for r in rails]
