"""GID-table trees and recipes for the launch-env tests (unit and Ansible level).

The trees are the real published layouts under tests/unit/fixtures/sysfs (see its README). A peer whose index
moved is modelled by copying a real tree and changing only the slot index of the rail's GID (the files of slot
``old`` and slot ``new`` trade places); nothing else is changed, so the GIDs still carry spark-0e68's addresses.

The GB10 tree is read with the real recipe, recipes/gx10x2-ds4-flash-fp8.yaml: its rails are the published
layout (rail0 rocep1s0f1 on enp1s0f1np1, 10.100.184.0/24; rail1 roceP2p1s0f1 on enP2p1s0f1np1, 10.100.185.0/24).
The k8s pod tree has other HCAs and addresses, so `fixture_recipe` writes the GX10 recipe with only its
``fabric.rails`` / ``fabric.nccl_ib_hca`` pointed at them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SYSFS = REPO / "tests" / "unit" / "fixtures" / "sysfs"
GB10 = SYSFS / "gb10-spark-0e68"
K8S = SYSFS / "k8s-macvlan-pod"
GX10_RECIPE = REPO / "recipes" / "gx10x2-ds4-flash-fp8.yaml"

# spark-0e68's rail addresses as published: rail A 10.100.184.1 on rocep1s0f1, rail B 10.100.185.1 on roceP2p1s0f1.
GB10_RAILS = {"rail0": {"address": "10.100.184.1"}, "rail1": {"address": "10.100.185.1"}}
# NVIDIA/nccl #1573 pod: net1 10.152.0.12 on mlx5_0, net2 10.152.4.12 on mlx5_1 (RoCE v2 at index 7 on both).
K8S_RAILS = {"rail0": {"address": "10.152.0.12"}, "rail1": {"address": "10.152.4.12"}}
K8S_FABRIC_RAILS = [
    {"name": "rail0", "netdev": "net1", "hcas": ["mlx5_0"], "subnet": "10.152.0.0/22", "mtu": 9000},
    {"name": "rail1", "netdev": "net2", "hcas": ["mlx5_1"], "subnet": "10.152.4.0/22", "mtu": 9000},
]


def moved_slot(src: Path, dest: Path, hcas: list[str], old: int, new: int) -> Path:
    """Copy the sysfs tree `src` to `dest` and, for each HCA in `hcas`, swap GID slots `old` and `new`.

    Returns `dest` (a sysfs root). Only the slot index changes: gids/, gid_attrs/types/ and gid_attrs/ndevs/
    entries move together; a slot that did not exist in `src` does not exist after the swap either.
    """
    shutil.copytree(src, dest)
    for hca in hcas:
        port = dest / "class" / "infiniband" / hca / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            a, b, tmp = port / sub / str(old), port / sub / str(new), port / sub / "swap"
            if a.exists():
                a.rename(tmp)
            if b.exists():
                b.rename(a)
            if tmp.exists():
                tmp.rename(b)
    return dest


def fixture_recipe(dest: Path, rails: list[dict], name: str = "gx10x2-ds4-flash-fp8") -> Path:
    """Write the GX10 recipe with its fabric rails (and NCCL_IB_HCA) replaced by `rails`; returns the file."""
    data = yaml.safe_load(GX10_RECIPE.read_text())
    data["name"] = name
    data["fabric"]["rails"] = rails
    data["fabric"]["nccl_ib_hca"] = [hca for rail in rails for hca in rail["hcas"]]
    path = dest / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# The GB10 twin functions of the f1 port and those of the f0 port (docs/sources.md#gx10-pair; the recipe's fabric
# comment): HCA -> (its f0 HCA, the f0 HCA's netdev).
F1_TO_F0 = {"rocep1s0f1": ("rocep1s0f0", "enp1s0f0np0"), "roceP2p1s0f1": ("roceP2p1s0f0", "enP2p1s0f0np0")}
# The inventory's override for a node cabled on its f0 port (the recipe names the f1 port).
F0_RAILS = {"rail0": {"netdev": "enp1s0f0np0", "hcas": ["rocep1s0f0"]},
            "rail1": {"netdev": "enP2p1s0f0np0", "hcas": ["roceP2p1s0f0"]}}


def on_f0_port(src: Path, dest: Path) -> Path:
    """Copy the GB10 tree `src` to `dest` as if the node were cabled on its f0 port: each f1 HCA directory is renamed
    to its f0 twin (`F1_TO_F0`) and its slots' ndevs name the f0 netdev; GIDs and slot indexes stay as published.
    Returns `dest` (a sysfs root)."""
    shutil.copytree(src, dest)
    base = dest / "class" / "infiniband"
    for old, (new, netdev) in F1_TO_F0.items():
        (base / old).rename(base / new)
        for ndev in (base / new).glob("ports/*/gid_attrs/ndevs/*"):
            if ndev.read_text().strip() != "#EINVAL":
                ndev.write_text(netdev + "\n")
    return dest
