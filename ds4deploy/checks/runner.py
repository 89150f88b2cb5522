"""Run the host, rails and fabric checks of a recipe against an Ansible inventory (``make check``).

Hosts are reached as `ds4deploy.checks.target.target_for` says. A host that does not answer gets one ``error``
row (``reach``) and no other rows. Fabric bandwidth runs between the first reachable host (server side, the
head) and each other one (client side).
"""

from __future__ import annotations

from ds4deploy.checks import fabric, host, rails
from ds4deploy.checks.report import ERROR, PASS, Row
from ds4deploy.checks.target import CONNECT_TIMEOUT_S, Target, target_for
from ds4deploy.core.errors import UserError
from ds4deploy.plan import node_fabric
from ds4deploy.recipe.schema import Recipe

GROUPS = ("host", "rails", "fabric")


def select_hosts(hosts: dict[str, dict], groups: dict[str, list[str]], limit: str | None) -> dict[str, dict]:
    """The hosts named by `limit` (comma-separated host or group names; None: all), in inventory order.

    Raises:
        UserError: a name in `limit` is neither a host nor a group.
    """
    if not limit:
        return hosts
    wanted: list[str] = []
    for name in (n.strip() for n in limit.split(",") if n.strip()):
        if name in groups:
            wanted += groups[name]
        elif name in hosts:
            wanted.append(name)
        else:
            raise UserError(f"--limit {name}: no such host or group in the inventory",
                            f"use one of: {', '.join(sorted(set(groups) | set(hosts)))}")
    return {h: v for h, v in hosts.items() if h in wanted}


def reach(target: Target) -> Row:
    """One row saying whether the host answers a trivial command."""
    out = target.run("true", timeout=CONNECT_TIMEOUT_S + 5)
    if out.ok:
        return Row(target.name, "reach", "answers", "answers", PASS)
    return Row(target.name, "reach", "answers", (out.stderr.strip() or f"rc {out.rc}")[:200], ERROR,
               "check the address, ssh access (BatchMode: keys, no password) and that the host is up")


def run_checks(recipe: Recipe, hosts: dict[str, dict], groups: tuple[str, ...] = GROUPS,
               targets: dict[str, Target] | None = None) -> list[Row]:
    """Every selected check group against every host.

    Args:
        recipe: the recipe whose expectations apply.
        hosts: host name -> inventory variables (`ds4deploy.plan.inventory.read_inventory`).
        groups: any of ``host``, ``rails``, ``fabric``.
        targets: transports by host name (default: `target_for` each host).

    Returns:
        Rows, host by host, in the order of `groups`.

    Raises:
        UserError: an unknown group name, or wrong per-node rail names (`ds4deploy.plan.node_fabric.check_hosts`).
    """
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise UserError(f"unknown check group(s): {', '.join(unknown)}", f"use any of: {', '.join(GROUPS)}")
    node_fabric.check_hosts(recipe, hosts)
    targets = targets or {name: target_for(name, hv) for name, hv in hosts.items()}
    rows: list[Row] = []
    up: list[str] = []
    for name in hosts:
        row = reach(targets[name])
        rows.append(row)
        if row.verdict == PASS:
            up.append(name)
    for name in up:
        t, hv = targets[name], hosts[name]
        if "host" in groups:
            rows += host.check_host(t, recipe)
        if "rails" in groups:
            peers = {p: hosts[p] for p in hosts if p != name and hosts[p].get("ds4_rails")}
            rows += rails.check_rails(t, recipe, hv, peers)
        if "fabric" in groups:
            rows += fabric.check_fabric_node(t, recipe, hv)
    if "fabric" in groups and up:
        head = up[0]
        for other in up[1:]:
            rows += fabric.check_bandwidth(targets[head], hosts[head], targets[other], hosts[other], recipe)
        rows += fabric.check_nccl(targets[head], {name: hosts[name] for name in up}, recipe)
    order = {name: i for i, name in enumerate(hosts)}
    return sorted(rows, key=lambda r: order.get(r.host, len(order)))
