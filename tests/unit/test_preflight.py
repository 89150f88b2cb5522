"""The preflight rule book: the reference recipes pass; each rule has a counterexample that fails it; missing host
facts give 'unknown', never a silent pass."""

from __future__ import annotations

import pytest
import yaml

from ds4deploy import preflight
from ds4deploy.recipe import load_recipe
from tests.unit.conftest import run_cli

REFERENCE = ["v100x8-ds41-flash-iq2", "rtx3090x2-xeon-ds4-flash", "gx10x2-ds4-flash-fp8"]
V100, SM86, GX10 = REFERENCE


def verdict(recipe, rule_id, hosts=None):
    return next(v for v in preflight.run(recipe, hosts) if v.rule == rule_id)


def mutate(name, path, value):
    """Load recipe `name` with the dotted `path` set to `value` (validated like a file would be)."""
    r = load_recipe(name)
    data = r.model_dump(mode="python")
    keys = path.split(".")
    d = data
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[keys[-1]] = value
    out = type(r).model_validate(data)
    out._source = r.source_path
    return out


@pytest.mark.parametrize("name", [*REFERENCE, "cpu"])
def test_reference_recipes_pass_preflight(name):
    verdicts = preflight.run(load_recipe(name))
    assert [v.rule for v in verdicts if v.status == "fail"] == []
    assert preflight.Report(name, verdicts).exit_code == 0


# (rule, recipe that passes it, dotted path, value that must fail it)
COUNTEREXAMPLES = [
    ("fit-gpu-memory", V100, "memory.weights_on_gpu_gb", 300.0),
    ("fit-gpu-memory", GX10, "serving.gpu_memory_utilization", 0.5),
    ("parallel-shape", V100, "parallelism.tensor", 2),
    ("parallel-shape", GX10, "parallelism.tensor", 4),
    ("dspark-seqs-32", SM86, "serving.max_num_seqs", 6),
    ("gb10-dspark-k5", GX10, "serving.speculative.num_speculative_tokens", 3),
    ("cudagraph-capture-size", GX10, "serving.max_num_seqs", 12),
    ("cudagraph-capture-size", GX10, "serving.extra_args", {"block-size": 256}),
    ("v100-fp16", V100, "model.dtype", "bfloat16"),
    ("v100-arch-list", V100, "engine.torch_cuda_arch_list", "7.0;8.0"),
    ("v100-cuda12", V100, "engine.cuda.nvcc", "13.0"),
    ("nvfp4-kv-engine", GX10, "engine.capabilities", ["dspark"]),
    ("gb10-mem-util", GX10, "serving.gpu_memory_utilization", 0.80),
    ("cuda-one-toolkit", SM86, "engine.cuda.headers", "13.0.2"),
    ("rails-distinct-subnets", GX10, "fabric.rails.1.subnet", "10.100.184.0/24"),
    ("rails-mtu-recipe", GX10, "fabric.rails.0.mtu", 1500),
    ("nccl-ib-hca-twins", GX10, "fabric.nccl_ib_hca", ["rocep1s0f1"]),
    ("instances-fit", SM86, "serving.gpu_memory_utilization", 0.2),
    ("instances-fit", SM86, "hardware.ram_per_numa_gib", 100.0),
    ("bench-max-tokens", GX10, "benchmark.max_tokens", None),
]


@pytest.mark.parametrize(("rule_id", "name", "path", "value"), COUNTEREXAMPLES,
                         ids=[f"{c[0]}:{c[2]}" for c in COUNTEREXAMPLES])
def test_each_rule_passes_its_reference_and_fails_its_counterexample(rule_id, name, path, value):
    assert verdict(load_recipe(name), rule_id).status == "pass"
    bad = verdict(mutate(name, path, value), rule_id)
    assert bad.status == "fail"
    assert bad.remediation
    assert bad.numbers


def test_every_rule_has_a_counterexample_or_host_test():
    covered = {c[0] for c in COUNTEREXAMPLES} | {"rails-mtu-hosts", "rails-addresses", "kernel-known-bad",
                                                  "model-pin", "image-pins"}
    assert {r.id for r in preflight.RULES} == covered
    assert all(r.source for r in preflight.RULES)


GOOD_HOSTS = {
    "gx10-a": {"ds4_kernel": "6.17.0-1032-nvidia",
               "ds4_rails": {"rail0": {"address": "10.100.184.1", "mtu": 9000},
                             "rail1": {"address": "10.100.185.1", "mtu": 9000}}},
    "gx10-b": {"ds4_kernel": "6.17.0-1032-nvidia",
               "ds4_rails": {"rail0": {"address": "10.100.184.2", "mtu": 9000},
                             "rail1": {"address": "10.100.185.2", "mtu": 9000}}},
}


def _hosts(**changes):
    import copy

    h = copy.deepcopy(GOOD_HOSTS)
    for path, value in changes.items():
        host, *keys = path.split("__")
        d = h[host]
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return h


@pytest.mark.parametrize(("rule_id", "changes", "needle"), [
    ("rails-mtu-hosts", {"gx10_b__ds4_rails__rail1__mtu": 1500}, "gx10-b/rail1"),
    ("rails-addresses", {"gx10_b__ds4_rails__rail0__address": "10.100.184.1"}, "on gx10-a and gx10-b"),
    ("rails-addresses", {"gx10_a__ds4_rails__rail1__address": "10.100.184.9"}, "not in 10.100.185.0/24"),
    ("kernel-known-bad", {"gx10_a__ds4_kernel": "7.0.0-1019-nvidia"}, "runs 7.0.0-1019-nvidia"),
])
def test_host_fact_rules(rule_id, changes, needle):
    r = load_recipe(GX10)
    assert verdict(r, rule_id).status == "unknown"  # no inventory: said, not passed
    assert verdict(r, rule_id, GOOD_HOSTS).status == "pass"
    fixed = {k.replace("gx10_a", "gx10-a").replace("gx10_b", "gx10-b"): v for k, v in changes.items()}
    bad = verdict(r, rule_id, _hosts(**fixed))
    assert bad.status == "fail"
    assert needle in bad.numbers + bad.remediation


def test_short_revision_and_missing_sha256_are_unknown_with_the_fix():
    pin = verdict(load_recipe(GX10), "model-pin")
    assert pin.status == "unknown"
    assert "8 of 40 hex digits" in pin.numbers
    full = verdict(mutate(GX10, "model.revision", "9e165c30" + "a" * 32), "model-pin")
    assert full.status == "pass"
    sha = verdict(load_recipe(SM86), "image-pins")
    assert sha.status == "unknown"
    assert "LVLLMDS4X_SHA256" in sha.numbers


def test_instance_count_is_derived_from_ram_and_vram():
    count, why = preflight.instance_count(load_recipe(SM86))
    assert count == 3
    assert "4 NUMA nodes" in why
    assert "floor(23.69 GiB / 6.15 GiB) = 3" in why
    assert "floor(1 / 0.3) = 3" in why
    # Never more instances than NUMA nodes (instance i is bound to node i), whatever the GPUs would allow.
    r = mutate(SM86, "instances.vram_gib_each", 1.0)
    data = r.model_dump(mode="python")
    data["serving"]["gpu_memory_utilization"] = 0.1
    data["memory"]["weights_on_gpu_gb"] = 0.1
    roomy = type(r).model_validate(data)
    assert preflight.instance_count(roomy)[0] == 4


def test_cli_with_inventory_and_exit_codes(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": GOOD_HOSTS}}))
    p = run_cli("preflight", GX10, "--inventory", str(inv))
    assert p.returncode == 0, p.stdout
    assert "14 passed, 0 failed, 1 unknown" in p.stdout
    bad = _hosts(**{"gx10-a__ds4_kernel": "7.0.0-1019-nvidia"})
    inv.write_text(yaml.safe_dump({"all": {"children": {"gx10": {"hosts": bad}}}}))
    p = run_cli("preflight", GX10, "--inventory", str(inv))
    assert p.returncode == 1
    assert "kernel-known-bad" in p.stdout
    assert "fail" in p.stdout
