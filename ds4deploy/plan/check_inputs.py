"""Bad input, caught on the control host before any host is changed (`ds4deploy.plan.playvars` runs both at the start).

- `rail_problems(recipe, hosts)`: an inventory host without an address for one of the recipe's rails
  (``ds4_rails.<rail>.address``, the inventory shape `ds4deploy.plan.preflight` documents), an address that is not IPv4
  or not a host address inside the rail's subnet, or one address given twice (two nodes or two rails). The one
  copy of this rule: the preflight rule rails-addresses reports it.
- `gpu_request_problems(recipe)`: GPU clocks or a power limit the GPU model cannot do, judged against
  `GPU_DATASHEET` (the gpu_tuning role checks again against ``nvidia-smi`` on hosts that have the GPU, before
  changing anything).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ds4deploy.plan import node_fabric
from ds4deploy.recipe.schema import Recipe


@dataclass(frozen=True)
class GpuDatasheet:
    """What one GPU model can do. MHz and W; ``None`` where the vendor publishes no number.

    Attributes:
        max_graphics_mhz: highest graphics clock the GPU runs at (a lock above it cannot be honoured).
        boost_mhz: the vendor's rated boost clock.
        max_power_limit_w: highest power limit ``nvidia-smi -pl`` accepts (the board power).
        power_limit_settable: False where NVML reports the power limit N/A (GB10).
        source: where the numbers come from.
    """

    max_graphics_mhz: int | None
    boost_mhz: int | None
    max_power_limit_w: int | None
    power_limit_settable: bool
    source: str


# Keyed by a substring of hardware.gpus.model / nvidia-smi's name, matched case-insensitively.
GPU_DATASHEET: dict[str, GpuDatasheet] = {
    "V100-SXM2": GpuDatasheet(
        max_graphics_mhz=1530, boost_mhz=1530, max_power_limit_w=300, power_limit_settable=True,
        source="NVIDIA Tesla V100 datasheet: V100 SXM2 GPU Boost clock 1530 MHz, max power 300 W "
               "(docs/sources.md#v100x8 locks 1522 MHz at 150 W, inside both)",
    ),
    "RTX 3090": GpuDatasheet(
        max_graphics_mhz=2100, boost_mhz=1695, max_power_limit_w=350, power_limit_settable=True,
        source="NVIDIA GeForce RTX 3090 specifications: boost clock 1.70 GHz (1695 MHz), 350 W graphics card "
               "power; nvidia-smi clocks.max.graphics 2100 MHz and power.max_limit 350 W on a real 3090 "
               "(tests/unit/fixtures/parsers/nvidia_smi-qwen36-rtx3090-clocks.txt)",
    ),
    "GB10": GpuDatasheet(
        max_graphics_mhz=None, boost_mhz=None, max_power_limit_w=None, power_limit_settable=False,
        source="NVIDIA publishes no GB10 graphics clock (the DGX Spark spec page gives only FP4 TOPS; see "
               "huggingface/huggingface.js PR #1861); an SM clock of 2528 MHz was captured "
               "(tests/unit/fixtures/parsers/nvidia_smi-smart-city-gb10.txt) and caps up to 2800 MHz were "
               "accepted (docs/sources.md#gx10-clock-caps); NVML reports the power limit N/A "
               "(docs/sources.md#nvml-gb10)",
    ),
}

# Lowest driver per CUDA major version the engine image is built with (CUDA minor version compatibility).
DRIVER_FOR_CUDA: dict[str, tuple[str, str]] = {
    "12": ("525.60.13", "CUDA 12.x minor version compatibility: driver >= 525.60.13 (CUDA Toolkit release notes)"),
    "13": ("580.65.06", "CUDA 13.0 GA needs driver >= 580.65.06 (CUDA Toolkit 13.0 release notes, Table 3); "
                        "CUDA 13.x ships with the r580 branch"),
}


def datasheet_for(model: str | None) -> GpuDatasheet | None:
    """The `GPU_DATASHEET` entry whose key is in `model` (case-insensitive), else None."""
    if not model:
        return None
    return next((sheet for key, sheet in GPU_DATASHEET.items() if key.lower() in model.lower()), None)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"580.126.09"`` -> ``(580, 126, 9)``; non-numeric parts are dropped."""
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def gpu_request_problems(recipe: Recipe, max_graphics_mhz: int | None = None,
                         max_power_limit_w: float | None = None, what: str = "datasheet") -> list[str]:
    """Problems with the recipe's GPU settings on this GPU model.

    Args:
        recipe: the recipe (hardware.gpus power_limit_w, graphics_clock_lock_mhz, graphics_clock_cap_mhz).
        max_graphics_mhz: the GPU's highest graphics clock from nvidia-smi (``clocks.max.graphics``); default:
            the datasheet value for hardware.gpus.model.
        max_power_limit_w: ``power.max_limit`` from nvidia-smi; default: the datasheet value.
        what: where the limits came from, for the message ("datasheet", "nvidia-smi on <host>").

    Returns:
        One sentence per problem (empty when the request is possible or nothing is known to refuse it).
    """
    g = recipe.hardware.gpus
    sheet = datasheet_for(g.model)
    max_mhz = max_graphics_mhz if max_graphics_mhz is not None else (sheet.max_graphics_mhz if sheet else None)
    max_w = max_power_limit_w if max_power_limit_w is not None else (sheet.max_power_limit_w if sheet else None)
    src = f" ({sheet.source})" if sheet and what == "datasheet" else ""
    out = []
    for key, mhz in (("graphics_clock_lock_mhz", g.graphics_clock_lock_mhz),
                     ("graphics_clock_cap_mhz", g.graphics_clock_cap_mhz)):
        if mhz is not None and max_mhz is not None and key.endswith("lock_mhz") and mhz > max_mhz:
            out.append(f"hardware.gpus.{key} = {mhz} MHz, but {g.model} runs at most {max_mhz} MHz per the "
                       f"{what}{src}: a lock above the maximum cannot be honoured")
    if g.graphics_clock_lock_mhz and g.graphics_clock_cap_mhz and g.graphics_clock_cap_mhz < g.graphics_clock_lock_mhz:
        out.append(f"hardware.gpus.graphics_clock_cap_mhz {g.graphics_clock_cap_mhz} MHz is below the lock "
                   f"{g.graphics_clock_lock_mhz} MHz")
    if g.power_limit_w is not None:
        if sheet is not None and not sheet.power_limit_settable and what == "datasheet":
            out.append(f"hardware.gpus.power_limit_w = {g.power_limit_w} W, but {g.model} has no settable power "
                       f"limit ({sheet.source})")
        elif max_w is not None and g.power_limit_w > max_w:
            out.append(f"hardware.gpus.power_limit_w = {g.power_limit_w} W, above {g.model}'s maximum {max_w:g} W "
                       f"per the {what}{src}")
    return out


def rail_problems(recipe: Recipe, hosts: dict[str, dict]) -> list[str]:
    """Problems with the inventory's rail addresses for a fabric recipe (none for a recipe without fabric).

    Each host needs ``ds4_rails.<rail>.address`` for every rail of the recipe: an IPv4 host address inside the
    rail's subnet, used by no other host or rail (docs/sources.md#gx10-roce-checklist: both ports need an IP, the
    GID is derived from it); and the host's netdev/HCA overrides must be right (`ds4deploy.plan.node_fabric`). The
    preflight rule rails-addresses reports these problems.
    """
    if recipe.fabric is None:
        return []
    out: list[str] = []
    seen: dict[ipaddress.IPv4Address, str] = {}
    for host, hv in hosts.items():
        named = node_fabric.host_problems(recipe, host, hv)
        out += named
        facts = hv.get("ds4_rails") if isinstance(hv.get("ds4_rails"), dict) else {}
        rails = recipe.fabric.rails if named else node_fabric.node_rails(recipe, host, hv, checked=True)
        for rail in rails:
            net = ipaddress.ip_network(rail.subnet)
            entry = facts.get(rail.name)
            raw = entry.get("address") if isinstance(entry, dict) else None
            where = f"{host}: ds4_rails.{rail.name}.address"
            if raw is None:
                out.append(f"{where} is missing (rail {rail.name} on {rail.netdev}, subnet {net})")
                continue
            try:
                addr = ipaddress.IPv4Address(str(raw))
            except ValueError:
                out.append(f"{where} = {raw!r} is not an IPv4 address")
                continue
            if addr not in net or addr in (net.network_address, net.broadcast_address):
                out.append(f"{where} = {addr} is not a host address in {net}")
            if addr in seen:
                out.append(f"{where} = {addr} is also given to {seen[addr]}: every node and rail needs its own")
            else:
                seen[addr] = f"{host} ({rail.name})"
    return out
