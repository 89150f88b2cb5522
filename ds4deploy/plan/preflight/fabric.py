"""Fabric: rails, subnets, MTU and addresses of the nodes' RDMA links."""

from __future__ import annotations

import ipaddress

from ds4deploy.plan.check_inputs import rail_problems
from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe


@rule("rails-distinct-subnets", "each RoCE rail on its own subnet",
      "docs/sources.md#gx10-roce-checklist: rails on one subnet pin routing to one rail (~110 Gb/s instead of 196)",
      lambda r: r.fabric is not None)
def _subnets(r: Recipe, hosts):
    nets = [ipaddress.ip_network(x.subnet) for x in r.fabric.rails]
    nums = ", ".join(f"{x.name} {x.subnet}" for x in r.fabric.rails)
    for i, a in enumerate(nets):
        for b in nets[i + 1:]:
            if a.overlaps(b):
                return "fail", nums, "give every rail its own /24 (e.g. 192.168.100.0/24 and 192.168.101.0/24)"
    return "pass", nums, ""


@rule("rails-mtu-recipe", "rails use MTU 9000", "docs/sources.md#rail-netplan: mtu 9000",
      lambda r: r.fabric is not None)
def _mtu_recipe(r: Recipe, hosts):
    nums = ", ".join(f"{x.name} {x.mtu}" for x in r.fabric.rails)
    if all(x.mtu == 9000 for x in r.fabric.rails):
        return "pass", nums, ""
    return "fail", nums, "set fabric.rails[].mtu to 9000"


def _rail_facts(r: Recipe, hosts: dict[str, dict], key: str):
    """(host, rail, value of ds4_rails.<rail>.<key>) for every host and rail of the recipe, and the 'unknown'
    verdict to return instead when there are no host facts or any host lacks the value (else None)."""
    facts = [(h, rail.name, (hf.get("ds4_rails") or {}).get(rail.name, {}).get(key))
             for h, hf in hosts.items() for rail in r.fabric.rails]
    if not hosts:
        fix = f"pass --inventory with ds4_rails: {{<rail>: {{{key}: ...}}}} per host"
        return facts, ("unknown", "no host facts", fix)
    missing = [f"{h}/{rail}" for h, rail, value in facts if value is None]
    if missing:
        return facts, ("unknown", f"no ds4_rails.<rail>.{key} for {', '.join(missing)}", "add it to the inventory")
    return facts, None


@rule("rails-mtu-hosts", "MTU 9000 on both ends of every rail",
      "docs/sources.md#jumbo-frames: verify jumbo frames end to end (don't-fragment ping of MTU-28 bytes)",
      lambda r: r.fabric is not None)
def _mtu_hosts(r: Recipe, hosts):
    facts, unknown = _rail_facts(r, hosts, "mtu")
    if unknown:
        return unknown
    want = {x.name: x.mtu for x in r.fabric.rails}
    nums = ", ".join(f"{h}/{rail} {mtu}" for h, rail, mtu in facts)
    bad = [f"{h}/{rail}" for h, rail, mtu in facts if mtu != want[rail]]
    if bad:
        return "fail", nums, f"set MTU {r.fabric.rails[0].mtu} on {', '.join(bad)} (netplan mtu: 9000)"
    return "pass", nums, ""


@rule("rails-addresses", "every node has an IPv4 inside each rail's subnet, no address twice",
      "docs/sources.md#gx10-roce-checklist: both ports need an IP (the GID is derived from it)",
      lambda r: r.fabric is not None)
def _rail_addrs(r: Recipe, hosts):
    if not hosts:
        return "unknown", "no host facts", "pass --inventory with ds4_rails: {<rail>: {address: ...}} per host"
    problems = rail_problems(r, hosts)
    if problems:
        return "fail", "; ".join(problems), ("give every host an address per rail in the rail's subnet (ds4_rails: "
                                              "{<rail>: {address: a.b.c.d}}), each address once")
    return "pass", ", ".join(f"{h} {(hf.get('ds4_rails') or {})[x.name]['address']}"
                             for h, hf in hosts.items() for x in r.fabric.rails), ""


@rule("nccl-ib-hca-twins", "NCCL_IB_HCA names the HCA of every rail (on GB10: both twin HCAs of the cabled port)",
      "docs/sources.md#sm121-nccl-env: NCCL_IB_HCA lists both twin HCAs of the port; one HCA = half the bandwidth",
      lambda r: r.fabric is not None)
def _twins(r: Recipe, hosts):
    from ds4deploy.engines.vllm import engine_env

    env = [x for x in engine_env(r).get("NCCL_IB_HCA", "").split(",") if x]
    need = [h for rail in r.fabric.rails for h in rail.hcas]
    missing = [h for h in need if h not in env]
    nums = f"NCCL_IB_HCA={','.join(env) or '(unset)'}; rails need {need}"
    if not missing:
        return "pass", nums, ""
    return "fail", nums, f"add {', '.join(missing)} to fabric.nccl_ib_hca"


@rule("kernel-known-bad", "no node runs a kernel release the recipe knows to be broken",
      "the recipe's hardware.known_bad_kernels (each entry cites its report)",
      lambda r: bool(r.hardware.known_bad_kernels))
def _kernel(r: Recipe, hosts):
    if not hosts:
        return "unknown", "no host facts", "pass --inventory with ds4_kernel (uname -r) per host"
    out = []
    for h, facts in hosts.items():
        k = facts.get("ds4_kernel")
        if k is None:
            return "unknown", f"{h} has no ds4_kernel", "add ds4_kernel (uname -r) to the inventory"
        for bad in r.hardware.known_bad_kernels:
            if str(k).startswith(bad.release):
                return "fail", f"{h} runs {k}", f"boot another kernel: {bad.reason} ({bad.source})"
        out.append(f"{h} {k}")
    return "pass", ", ".join(out), ""
