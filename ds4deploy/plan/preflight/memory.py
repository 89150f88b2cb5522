"""Memory and shape: weights, KV and overhead against each GPU; parallel layout against the model."""

from __future__ import annotations

from ds4deploy.plan.preflight.rulebook import _gib, rule
from ds4deploy.recipe.schema import Recipe


@rule("fit-gpu-memory", "weights + KV + overhead fit on each GPU within gpu_memory_utilization",
      "docs/sources.md#v100x8, #gx10-pair, #rtx3090-xeon memory figures; vLLM sizes its budget as "
      "gpu_memory_utilization x GPU memory",
      lambda r: r.memory is not None and r.hardware.gpus.count > 0)
def _fit(r: Recipe, hosts):
    m, g = r.memory, r.hardware.gpus
    if g.memory_gib is None:
        return "unknown", "hardware.gpus.memory_gib is not set", "add the usable GiB per GPU to the recipe"
    # tensor x pipeline is the whole world size, across nodes too (--nnodes): each rank holds 1/ranks of the weights.
    ranks = r.parallelism.tensor * r.parallelism.pipeline
    weights_gb = m.weights_on_gpu_gb / ranks
    kv = r.kv_cache_gib_per_gpu
    need = _gib(weights_gb) + kv + m.overhead_gib_per_gpu
    budget = g.memory_gib * r.serving.gpu_memory_utilization
    nums = (f"per GPU: weights {weights_gb:.2f} GB ({_gib(weights_gb):.2f} GiB) + KV {kv:g} GiB + "
            f"overhead {m.overhead_gib_per_gpu} GiB = {need:.2f} GiB; budget {r.serving.gpu_memory_utilization} x "
            f"{g.memory_gib} GiB = {budget:.2f} GiB")
    if need <= budget:
        return "pass", nums, ""
    return "fail", nums, ("use more GPUs (tensor/pipeline), a smaller quant, a shorter max_model_len, or a higher "
                          "gpu_memory_utilization if the platform allows it")


@rule("parallel-shape", "tensor x pipeline x nodes equals the GPUs the recipe has",
      "vLLM: world size = tensor_parallel_size x pipeline_parallel_size over all nodes",
      lambda r: r.hardware.gpus.count > 0)
def _shape(r: Recipe, hosts):
    p, g = r.parallelism, r.hardware.gpus
    ranks = p.tensor * p.pipeline
    gpus = g.count * (r.hardware.nodes if r.instances is None else 1)
    if r.instances is None:
        nums = (f"tensor {p.tensor} x pipeline {p.pipeline} = {ranks} ranks; {g.count} GPUs x {r.hardware.nodes} "
                f"nodes = {gpus}")
    else:
        nums = f"per instance: tensor {p.tensor} x pipeline {p.pipeline} = {ranks} ranks; {g.count} GPUs per node"
    if ranks == gpus:
        return "pass", nums, ""
    return "fail", nums, "set parallelism.tensor x parallelism.pipeline to the GPU count (per node x nodes)"
