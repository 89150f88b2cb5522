"""Engine replicas per node for CPU-expert recipes: how many engine instances one node runs.

An "instance" (the recipe's ``instances:`` section) is one engine replica: a complete copy of the model served by
its own vLLM process on its own port (``serving.port + i``), bound to NUMA node i with ``numactl --membind=i
--cpunodebind=i`` so its CPU threads and the expert weights it keeps in system RAM stay on that node's local
memory. At most one replica per NUMA node; the replicas share nothing (no tensor or pipeline parallelism between
them), each is its own API endpoint (`ds4deploy.render.compose.node_files`).
"""

from __future__ import annotations

from ds4deploy.recipe.schema import Recipe

GIB_PER_GB = 1e9 / 2**30  # 1 GB = 0.9313 GiB


def instance_count(r: Recipe) -> tuple[int, str]:
    """How many engine replicas (instances, one per NUMA node at most) a CPU-expert recipe runs on one node, and why.

    count = min(NUMA nodes whose RAM holds one instance (instance i is bound to NUMA node i, so at most one per
    node), floor(1 / gpu_memory_utilization) (vLLM reserves that fraction of each GPU per instance),
    floor(GPU memory / VRAM per instance), instances.max_count). Sizes: RAM in GB (docs/sources.md#rtx3090-xeon: ~170 GB
    per instance), GPU memory in GiB.
    """
    i, h = r.instances, r.hardware
    if i is None:
        return 1, "one instance"
    per_numa_gb = (h.ram_per_numa_gib or 0) / GIB_PER_GB
    by_ram = h.numa_nodes if per_numa_gb >= i.ram_gb_each else 0
    by_util = int(1 // r.serving.gpu_memory_utilization)
    by_vram = int((h.gpus.memory_gib or 0) // i.vram_gib_each) if h.gpus.count else by_ram
    count = min(by_ram, by_util, by_vram, i.max_count or by_ram)
    why = (f"RAM: {h.numa_nodes} NUMA nodes of {per_numa_gb:.0f} GB, {i.ram_gb_each} GB each -> {by_ram}; "
           f"GPU share: floor(1 / {r.serving.gpu_memory_utilization}) = {by_util}; "
           f"VRAM: floor({h.gpus.memory_gib} GiB / {i.vram_gib_each} GiB) = {by_vram}")
    return count, why
