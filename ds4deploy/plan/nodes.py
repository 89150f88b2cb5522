"""Multi-node plans: which inventory host is the head and which are workers, and each node's launch facts.

A multi-node recipe (``hardware.nodes > 1``) is deployed to an inventory whose hosts carry::

    ds4_node_rank: 0          # 0 = head (serves the API, started last); 1..n-1 = headless workers (started first)
    ds4_host_ip: 10.0.0.1     # this node's address on the inter-node network; default: its first rail's address

`plan` validates that inventory against the recipe before anything is started and returns one `Node` per host,
with the launch facts its compose file needs. "Launch facts" are a node's per-node environment: the variables
that differ between the nodes of one deployment and are written to each node's ``.env`` for docker compose
(DS4_NODE_RANK, the node's rank in the tensor/pipeline-parallel group; DS4_MASTER_ADDR, the head's address for the
torch.distributed rendezvous; DS4_HOST_IP, the node's own address; on a fabric, DS4_NCCL_IB_HCA and
DS4_SOCKET_IFNAME, the node's own HCA and interface names (`ds4deploy.plan.node_fabric`: the inventory may override the
recipe's per node); and DS4_NCCL_IB_GID_INDEX, resolved on the node). Why each check exists:

- the worker binds the head's address unless each node gets its own VLLM_HOST_IP (docs/sources.md#sm121-nccl-env), so
  two nodes with one address, or a node without one, are refused;
- a node listed twice would be started twice on one machine, the second copy fighting the first for the GPUs and
  the master port; only recipes whose nodes are containers on a Docker network (``serving.network_mode: bridge``,
  the CI two-node CPU stack) may place two nodes on one machine;
- exactly one head: the head owns the master port and the API; without one the workers wait forever.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.plan import node_fabric
from ds4deploy.plan.inventory import read_inventory
from ds4deploy.recipe.schema import Recipe


@dataclass(frozen=True)
class Node:
    """One node of a multi-node deployment.

    Attributes:
        name: inventory host name.
        rank: node rank; 0 is the head.
        role: ``head`` or ``worker`` (``single`` for every host of a one-node recipe).
        host_ip: the node's address on the inter-node network (exported to the engine as VLLM_HOST_IP).
        master_addr: the head's host_ip (every node's DS4_MASTER_ADDR).
        compose_file: the rendered file this node starts (``compose.head.yaml`` / ``compose.worker.yaml``).
        machine: where the node runs (ansible_host or the name), used to spot a machine listed twice.
        cpu_bind: cores this node's CPU engine binds to (inventory ``ds4_cpu_bind``; None = vLLM's "auto").
        nccl_ib_hca: this node's NCCL_IB_HCA (its own HCA names, comma-separated); None without a fabric.
        socket_ifname: this node's socket interface for NCCL, Gloo and torch (its first-rail netdev); None without
            a fabric.
    """

    name: str
    rank: int
    role: str
    host_ip: str
    master_addr: str
    compose_file: str
    machine: str
    cpu_bind: str | None = None
    nccl_ib_hca: str | None = None
    socket_ifname: str | None = None

    def launch_env(self) -> dict[str, str]:
        """The per-node variables the rendered compose file requires (``${DS4_...:?}``); empty for ``single``."""
        if self.role == "single":
            return {}
        env = {"DS4_NODE_RANK": str(self.rank), "DS4_MASTER_ADDR": self.master_addr, "DS4_HOST_IP": self.host_ip}
        if self.cpu_bind is not None:
            env["DS4_CPU_BIND"] = self.cpu_bind
        if self.nccl_ib_hca is not None:
            env["DS4_NCCL_IB_HCA"] = self.nccl_ib_hca
        if self.socket_ifname is not None:
            env["DS4_SOCKET_IFNAME"] = self.socket_ifname
        return env


def head_of(nodes: list[Node]) -> Node:
    """The node whose engine serves the API: the head of a node group, or the one node of a one-node recipe (the
    first, for a list of replicas).

    Raises:
        StopIteration: `nodes` holds neither (an empty list, or workers only).
    """
    return next(n for n in nodes if n.role in ("head", "single"))


def _host_ip(name: str, hv: dict, recipe: Recipe) -> str | None:
    """The node's address for VLLM_HOST_IP / the master address: ds4_host_ip, else its address on the recipe's
    first rail (the netdev NCCL/GLOO/TP_SOCKET_IFNAME name, `ds4deploy.render.compose`), not on whichever rail the
    inventory happens to list first."""
    ip = hv.get("ds4_host_ip")
    if ip is None:
        rails = hv.get("ds4_rails") or {}
        first_rail = recipe.fabric.rails[0].name if recipe.fabric is not None else None
        if isinstance(rails, dict) and first_rail in rails:
            first = rails[first_rail]
        else:
            first = next(iter(rails.values()), {}) if isinstance(rails, dict) else {}
        ip = (first or {}).get("address")
        if ip:
            ip = str(ip).split("/")[0]
    if ip is None:
        return None
    try:
        return str(ipaddress.ip_address(str(ip)))
    except ValueError:
        raise UserError(f"inventory host {name}: ds4_host_ip '{ip}' is not an IP address",
                        "set ds4_host_ip to the node's address on the inter-node network, e.g. 10.0.0.1") from None


def plan(recipe: Recipe, hosts: dict[str, dict]) -> list[Node]:
    """Validate an inventory's hosts against a multi-node recipe and return the nodes, head first.

    Args:
        recipe: a recipe with ``hardware.nodes > 1``.
        hosts: host name -> host vars (`ds4deploy.plan.inventory.read_inventory`).
    Returns:
        Nodes sorted by rank (head first).
    Raises:
        UserError: wrong node count, missing or duplicate rank, no head, a node without an address, two nodes
        with one address, one machine listed twice (unless the recipe's nodes are containers), wrong per-node
        rail names (`ds4deploy.plan.node_fabric.check_hosts`).
    """
    n = recipe.hardware.nodes
    node_fabric.check_hosts(recipe, hosts)
    if n == 1:
        # A one-node recipe: every inventory host runs its own complete stack (compose.yaml).
        return [Node(name, 0, "single", "", "", "compose.yaml", name) for name in sorted(hosts)]
    if hosts and not any(hv.get("ds4_node_rank") == 0 for hv in hosts.values()):
        raise UserError(f"no head in the inventory: none of {', '.join(sorted(hosts))} has ds4_node_rank 0",
                        "add the head node (the one that serves the API) with ds4_node_rank: 0")
    if len(hosts) != n:
        raise UserError(f"recipe '{recipe.name}' runs on {n} nodes but the inventory has {len(hosts)} host(s): "
                        f"{', '.join(sorted(hosts)) or 'none'}",
                        f"list exactly {n} hosts, each with ds4_node_rank (0 = head) and ds4_host_ip")
    ranks: dict[int, str] = {}
    for name, hv in sorted(hosts.items()):
        r = hv.get("ds4_node_rank")
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < n:
            raise UserError(f"inventory host {name} has ds4_node_rank {r!r}; a {n}-node recipe needs 0..{n - 1}",
                            "give every host a distinct ds4_node_rank: 0 for the head, 1.. for the workers")
        if r in ranks:
            raise UserError(f"inventory hosts {ranks[r]} and {name} both have ds4_node_rank {r}",
                            "give every host a distinct ds4_node_rank: 0 for the head, 1.. for the workers")
        ranks[r] = name
    ips: dict[str, str] = {}
    machines: dict[str, str] = {}
    nodes_by_rank: dict[int, tuple[str, str, str, str | None, dict[str, str]]] = {}
    for r, name in sorted(ranks.items()):
        hv = hosts[name]
        ip = _host_ip(name, hv, recipe)
        if ip is None:
            raise UserError(f"inventory host {name} has no ds4_host_ip (and no ds4_rails address to take it from)",
                            "set ds4_host_ip to the node's address on the inter-node network (each node its own: "
                            "a worker given the head's address binds the head's IP)")
        net = recipe.container.node_network
        if net is not None and ipaddress.ip_address(ip) not in ipaddress.ip_network(net.subnet):
            raise UserError(f"inventory host {name} has ds4_host_ip {ip}, outside the node network {net.name} "
                            f"({net.subnet}): the other nodes could not reach it",
                            f"pick an address in {net.subnet} (not its network or gateway address)")
        if ip in ips:
            raise UserError(f"inventory hosts {ips[ip]} and {name} both have address {ip}",
                            "give each node its own ds4_host_ip")
        ips[ip] = name
        machine = f"{hv.get('ansible_host', name)}:{hv.get('ansible_port', 22)}"
        if hv.get("ansible_connection") == "local":
            machine = "localhost (ansible_connection: local)"
        if machine in machines and recipe.serving.network_mode != "bridge":
            raise UserError(f"inventory hosts {machines[machine]} and {name} are the same machine ({machine})",
                            "list each node once, with its own ansible_host")
        machines.setdefault(machine, name)
        bind = hv.get("ds4_cpu_bind")
        if bind is not None and (isinstance(bind, bool) or not CPU_BIND_RE.fullmatch(str(bind))):
            # It becomes one line of the stack's .env (DS4_CPU_BIND=...): a newline there would add a variable, and
            # white space, quotes or '$' would change how compose reads the line. What the list means is the
            # engine's to judge (vLLM parses it at start; a deploy that fails there keeps every node's evidence).
            raise UserError(f"inventory host {name} has ds4_cpu_bind {str(bind)!r}, which cannot be one value of "
                            "the stack's .env", "set it as vLLM's VLLM_CPU_OMP_THREADS_BIND takes it: auto, all, "
                            "nobind, or core ids and ranges (0-31, 0,2,4; '|' between tensor-parallel ranks: "
                            "0-31|32-63)")
        fabric = node_fabric.launch_env(recipe, node_fabric.node_rails(recipe, name, hv, checked=True))
        nodes_by_rank[r] = (name, ip, machine, None if bind is None else str(bind), fabric)
    master = nodes_by_rank[0][1]
    return [Node(name, r, "head" if r == 0 else "worker", ip, master,
                 "compose.head.yaml" if r == 0 else "compose.worker.yaml", machine, bind,
                 fabric.get("DS4_NCCL_IB_HCA"), fabric.get("DS4_SOCKET_IFNAME"))
            for r, (name, ip, machine, bind, fabric) in sorted(nodes_by_rank.items())]


# The characters of vLLM's VLLM_CPU_OMP_THREADS_BIND (vLLM docs, CPU installation, "Related runtime environment
# variables": auto, all, nobind, or CPU id lists per tensor-parallel rank, 0-31|32-63, ids and ranges separated by
# ','), up to 1,024 of them: what one plain line of an env file can carry.
CPU_BIND_RE = re.compile(r"[A-Za-z0-9|,-]{1,1024}")


def plan_from_inventory(recipe: Recipe, inventory: Path) -> list[Node]:
    """`plan` for a YAML inventory file."""
    return plan(recipe, read_inventory(inventory).hosts)


def as_facts(nodes: list[Node]) -> dict[str, dict]:
    """Host name -> node facts (JSON-ready), what the playbook reads per host."""
    return {node.name: {**asdict(node), "launch_env": node.launch_env()} for node in nodes}
