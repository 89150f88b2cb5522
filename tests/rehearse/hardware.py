"""The hardware a rehearsal stand-in node stands in for, as files the node's namespaces show in place of this
machine's (tests/rehearse/nodes.py mounts them):

- GPUs: gpus.json for the stand-in nvidia-smi, from captured real ``nvidia-smi --query-gpu`` output of the recipe's
  GPU model (tests/unit/fixtures/parsers, provenance in its SOURCES.md), one row per GPU of hardware.gpus.count;
  the compute capability, which no GB10 or V100 capture here holds, from NVIDIA's published table (DATASHEET);
- CPU and RAM: /proc/cpuinfo and /proc/meminfo with the recipe's minimum cores, flags and RAM (this machine's own
  first CPU entry, repeated; on an aarch64 recipe a ``Features`` line), and machine.json with its architecture;
- NUMA: /sys/devices/system/node/node<i>/meminfo for a recipe with several NUMA nodes;
- RoCE: a GID-table tree per node following the recipe's rails (tests/support/gid_trees.py: the published GB10 table,
  its addresses changed to the node's rail addresses).
These are the recipe's stated minimums, not measurements: they let the preflight pass as on the real machine.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
from pathlib import Path

from ds4deploy.recipe.schema import Recipe
from tests.support import gid_trees

PARSERS = gid_trees.REPO / "tests" / "unit" / "fixtures" / "parsers"
# Captured nvidia-smi output per GPU model (hardware.gpus.model).
CAPTURES = {
    "Tesla V100-SXM2-32GB": ["nvidia_smi-dsh-gpu-v100.txt"],
    "NVIDIA GeForce RTX 3090": ["nvidia_smi-qwen36-rtx3090-identity.txt", "nvidia_smi-qwen36-rtx3090-clocks.txt"],
    "NVIDIA GB10": ["nvidia_smi-smart-city-gb10.txt"],
}
# Fields no capture of that model holds, from NVIDIA's published table instead: compute capability per GPU
# (https://developer.nvidia.com/cuda-gpus; CUDA Programming Guide 5.1 "Compute Capabilities": V100 7.0, GB10 12.1),
# printed as nvidia-smi prints compute_cap ("major.minor", as in the captured RTX 3090 rows: "8.6"). The preflight
# compares it with the recipe's hardware.gpus.arch, so it must not be derived from the recipe.
DATASHEET = {
    "Tesla V100-SXM2-32GB": {"compute_cap": "7.0"},
    "NVIDIA GB10": {"compute_cap": "12.1"},
}
UNIT = re.compile(r"^(?P<name>[^\[]+?)(?: \[(?P<unit>[^\]]+)\])?$")


def gpu_table(recipe: Recipe) -> dict:
    """{"count", "sources", "fields": {name: {"unit", "values": [one per GPU]}}} for the stand-in nvidia-smi.

    A capture with fewer rows than the recipe's GPUs (one clock line for two RTX 3090s) repeats its last row; the
    table says so in "repeated".
    Raises:
        KeyError: no capture of the recipe's GPU model.
    """
    count = recipe.hardware.gpus.count
    table: dict = {"count": count, "sources": list(CAPTURES[recipe.hardware.gpus.model]), "fields": {}, "repeated": []}
    for name in table["sources"]:
        lines = [ln for ln in (PARSERS / name).read_text().splitlines() if ln.strip()]
        header = [UNIT.match(h.strip()).groupdict() for h in lines[0].split(", ")]
        rows = [ln.split(", ") for ln in lines[1:]]
        if len(rows) < count:
            table["repeated"].append(f"{name}: {len(rows)} row(s) for {count} GPUs, the last one repeated")
            rows += [rows[-1]] * (count - len(rows))
        for col, h in enumerate(header):
            table["fields"].setdefault(h["name"], {"unit": h["unit"], "values": [r[col] for r in rows[:count]]})
    for name, value in DATASHEET.get(recipe.hardware.gpus.model, {}).items():
        if name not in table["fields"]:
            table["fields"][name] = {"unit": None, "values": [value] * count}
            table["sources"].append(f"{name}: NVIDIA's compute capability table (no capture has it)")
    return table


def cpuinfo(recipe: Recipe) -> str:
    """/proc/cpuinfo of a machine with the recipe's minimum cores and its CPU flags."""
    cpu = recipe.hardware.cpu
    n = cpu.min_cores
    if cpu.arch == "aarch64":
        block = ("processor\t: {i}\nBogoMIPS\t: 2000.00\nFeatures\t: " + " ".join(["fp", *cpu.flags])
                 + "\nCPU implementer\t: 0x41\nCPU architecture: 8\n")
        return "\n".join(block.format(i=i) for i in range(n)) + "\n"
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    lines = []
    for ln in first.splitlines():
        key = ln.split(":")[0].strip()
        if key == "flags":
            have = ln.split(":", 1)[1].split()
            ln = "flags\t\t: " + " ".join(have + [f for f in cpu.flags if f not in have])
        elif key in ("cpu cores", "siblings"):
            ln = f"{key}\t: {n}"
        lines.append(ln)
    text = "\n".join(lines)
    out = []
    for i in range(n):
        block = re.sub(r"^processor\s*:.*$", f"processor\t: {i}", text, flags=re.M)
        block = re.sub(r"^core id\s*:.*$", f"core id\t\t: {i}", block, flags=re.M)
        block = re.sub(r"^(apicid|initial apicid)\s*:.*$", rf"\g<1>\t: {i}", block, flags=re.M)
        out.append(block)
    return "\n\n".join(out) + "\n\n"


def ram_kib(recipe: Recipe) -> int:
    """The stand-in's RAM (KiB): the recipe's minimum plus 5 %. Split over its NUMA nodes it also covers
    hardware.ram_per_numa_gib, which the schema keeps within min_ram_gib / numa_nodes
    (ds4deploy.recipe.schema.Hardware)."""
    return int(recipe.hardware.min_ram_gib * 1.05 * 1024 * 1024)


def meminfo(recipe: Recipe) -> str:
    """/proc/meminfo of this machine with MemTotal/MemFree/MemAvailable set to the stand-in's RAM."""
    kib = ram_kib(recipe)
    text = Path("/proc/meminfo").read_text()
    for key in ("MemTotal", "MemFree", "MemAvailable"):
        text = re.sub(rf"^{key}:\s+\d+ kB$", f"{key}:{kib:>16} kB", text, flags=re.M)
    return text


def numa_tree(recipe: Recipe, dest: Path) -> Path | None:
    """A /sys/devices/system/node stand-in with the recipe's NUMA nodes (RAM split evenly), or None for one node."""
    nodes = recipe.hardware.numa_nodes
    if nodes <= 1:
        return None
    per = ram_kib(recipe) // nodes
    for i in range(nodes):
        (dest / f"node{i}").mkdir(parents=True, exist_ok=True)
        (dest / f"node{i}" / "meminfo").write_text(f"Node {i} MemTotal:       {per} kB\nNode {i} MemFree:        "
                                                   f"{per} kB\n")
    (dest / "online").write_text(f"0-{nodes - 1}\n")
    (dest / "possible").write_text(f"0-{nodes - 1}\n")
    return dest


def _mapped(address: str) -> str:
    """The IPv4-mapped GID of `address` as sysfs prints it (0000:0000:0000:0000:0000:ffff:0a64:b801)."""
    packed = ipaddress.IPv6Address(f"::ffff:{address}").packed
    return ":".join(packed[i:i + 2].hex() for i in range(0, 16, 2))


def gid_tree(rails: dict[str, str], dest: Path, moved_to: int | None = None) -> Path:
    """The published GB10 GID table (spark-0e68) readdressed to this node's rail addresses (rail name -> IPv4);
    with `moved_to`, the RoCE v2 slots of both HCAs moved from index 3 to that index (a node whose index differs).

    Returns `dest`, a sysfs root for ds4_sysfs_root.
    """
    published = {name: spec["address"] for name, spec in gid_trees.GB10_RAILS.items()}
    if dest.exists():
        shutil.rmtree(dest)
    hcas = ["rocep1s0f1", "roceP2p1s0f1"]
    if moved_to is None:
        shutil.copytree(gid_trees.GB10, dest)
    else:
        gid_trees.moved_slot(gid_trees.GB10, dest, hcas, 3, moved_to)
    swaps = {_mapped(published[r]): _mapped(a) for r, a in rails.items()}
    for f in (dest / "class" / "infiniband").glob("*/ports/*/gids/*"):
        text = f.read_text()
        if text.strip() in swaps:
            f.write_text(swaps[text.strip()] + "\n")
    return dest


def write_node_files(recipe: Recipe, dest: Path) -> dict[str, Path | None]:
    """Write every hardware stand-in file of one node of `recipe` into `dest`; returns their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "bin").mkdir(exist_ok=True)
    if recipe.hardware.gpus.count:  # a CPU host has no nvidia-smi (`nodes.up` installs the stand-in with GPUs only)
        (dest / "bin" / "gpus.json").write_text(json.dumps(gpu_table(recipe), indent=1))
    (dest / "cpuinfo").write_text(cpuinfo(recipe))
    (dest / "meminfo").write_text(meminfo(recipe))
    (dest / "machine.json").write_text(json.dumps({"architecture": recipe.hardware.cpu.arch}))
    return {"cpuinfo": dest / "cpuinfo", "meminfo": dest / "meminfo", "numa": numa_tree(recipe, dest / "numa")}
