"""Instances, model and benchmark: engine replicas per node, model pins and downloads, the bench's limits."""

from __future__ import annotations

from ds4deploy.core.errors import UserError
from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.instances import instance_count
from ds4deploy.recipe.schema import Recipe


@rule("instances-fit", "at least one engine instance fits a NUMA node's RAM and the GPUs' memory",
      "docs/sources.md#rtx3090-xeon: ~170 GB system RAM per instance pinned to one NUMA node; 6.6 GB VRAM per card",
      lambda r: r.instances is not None)
def _instances(r: Recipe, hosts):
    if r.hardware.ram_per_numa_gib is None:
        return "unknown", "hardware.ram_per_numa_gib is not set", "add RAM per NUMA node (GiB) to the recipe"
    count, why = instance_count(r)
    per_instance_gib = r.serving.gpu_memory_utilization * (r.hardware.gpus.memory_gib or 0)
    nums = f"{count} instance(s): {why}; each may use {per_instance_gib:.1f} GiB per GPU"
    if count < 1:
        return "fail", nums, "add RAM per NUMA node or use a smaller model"
    if per_instance_gib < r.instances.vram_gib_each:
        return "fail", nums, "raise serving.gpu_memory_utilization to cover instances.vram_gib_each"
    if count * r.serving.gpu_memory_utilization > 1:
        return "fail", nums, "lower the instance count (instances.max_count) or gpu_memory_utilization"
    return "pass", nums, ""


@rule("model-pin", "the model is pinned to one full 40-hex commit, and the committed manifest records that commit",
      "docs/sources.md#gx10-pair: revision 9e165c30 verified file by file; only a full commit names exactly one tree",
      lambda r: r.model.source == "hub")
def _pin(r: Recipe, hosts):
    """A full commit passes (with no manifest the deploy locks one on its first fetch). A 7-39 hex prefix passes
    only when the committed manifest records the full commit it resolved to (`ds4deploy model lock`); this rule
    reads no network, so a prefix without one fails with that command as the fix."""
    from ds4deploy.model.manifest import load_manifest, manifest_path

    rev = r.model.revision or ""
    path = manifest_path(r)
    lock = (f"run `ds4deploy model lock {r.base_name}` (resolves the pin against the hub's commits and writes "
            f"{path.name}) ")
    if not path.is_file():
        if len(rev) == 40:
            return "pass", f"{r.model.repo_id}@{rev}; no {path.name} yet: the first fetch writes it", ""
        return "fail", (f"{r.model.repo_id}@{rev} is a prefix of {len(rev)} hex digits and no {path.name} records "
                        "its commit"), lock + "and commit it, or pin the full 40-hex commit in model.revision"
    try:
        recorded = str(load_manifest(r).get("revision") or "")
    except UserError as exc:
        return "fail", exc.cause, exc.fix
    if len(recorded) != 40 or not recorded.startswith(rev):
        return "fail", f"model.revision {rev}, but {path.name} records commit {recorded or '(none)'}", (
            f"delete {path.name} and " + lock + "again, or restore the recipe's model.revision")
    return "pass", f"{r.model.repo_id}@{recorded} (recorded in {path.name})", ""


def _downloads(r: Recipe) -> bool:
    from ds4deploy.build.artifacts import image_artifacts, owner_base_image

    return bool(image_artifacts(r)) or owner_base_image(r) is not None


@rule("image-pins", "every downloaded artifact of the image build is locked by sha256, and an owner-supplied base "
      "image by its image ID (recipes/<name>.lock.json)",
      "reproducible builds: images pinned by commit, version or digest, with sha256 for downloaded wheels; the "
      "image ID is the sha256 of the image config (docs/sources.md#docker-image-id)",
      _downloads)
def _pins(r: Recipe, hosts):
    """Reads the lock only (no download, no hashing, no Docker): builds verify each artifact's bytes against it, and
    each node the image ID of an owner-supplied base (ds4deploy.build.artifacts.check_base_image)."""
    from ds4deploy.build.artifacts import locked_base_image, locked_build_args

    try:
        pins = locked_build_args(r)
        base = locked_base_image(r)
    except UserError as exc:
        return "fail", exc.cause, exc.fix
    shown = [f"{k}={v[:12]}..." for k, v in pins.items()] + ([f"{base['ref']}={base['id'][:19]}..."] if base else [])
    return "pass", ", ".join(shown), ""


@rule("bench-max-tokens", "benchmarks set max_tokens when the server's default thinking is unbounded",
      "docs/sources.md#gx10-benchmark-method: DEFAULT_THINKING=max made one request generate for 2 h 45 min "
      "without max_tokens",
      lambda r: r.benchmark.server_default_thinking != "none")
def _maxtok(r: Recipe, hosts):
    if r.benchmark.max_tokens:
        return "pass", f"max_tokens {r.benchmark.max_tokens}", ""
    return "fail", "max_tokens unset", "set benchmark.max_tokens (2048 in the reference method)"
