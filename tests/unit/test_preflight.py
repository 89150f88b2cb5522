"""The preflight rule book: the reference recipes pass; each rule has a counterexample that fails it; missing host
facts give 'unknown', never a silent pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ds4deploy.plan import preflight
from ds4deploy.plan.preflight import architecture, field_reports, serving
from ds4deploy.recipe.instances import instance_count
from ds4deploy.recipe.load import load_recipe
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


# Rules only the owner of the hardware can satisfy, each by one lock command (recipes/README.md lists them).
OWNER_LOCKS = {"model-pin": "ds4deploy model lock", "image-pins": "ds4deploy image lock"}


@pytest.mark.parametrize("name", [*REFERENCE, "cpu"])
def test_reference_recipes_pass_preflight_but_for_the_owners_locks(name):
    verdicts = preflight.run(load_recipe(name))
    for v in verdicts:
        if v.status == "fail":
            assert v.rule in OWNER_LOCKS and OWNER_LOCKS[v.rule] in v.remediation, v
    if name == "cpu":
        assert preflight.Report(name, verdicts).exit_code == 0


@pytest.fixture
def locked_gx10(recipe_dir, tmp_path, monkeypatch):
    """The GX10 recipe in a scratch recipes/ with a manifest recording its commit, and a local hub serving that
    commit (tests/support/fakehub.py; HF_ENDPOINT points at it): the deploy's control-host checks ask the hub."""
    import hashlib
    import json
    import shutil

    from tests.support.fakehub import FakeHub
    from tests.unit.conftest import REPO

    shutil.copy(REPO / "recipes" / f"{GX10}.yaml", recipe_dir / f"{GX10}.yaml")
    model = load_recipe(GX10).model
    config = b"{}\n"
    blob = hashlib.sha1(f"blob {len(config)}\0".encode() + config, usedforsecurity=False).hexdigest()
    manifest = {"recipe": GX10, "source": "hub", "repo_id": model.repo_id, "revision": model.revision,
                "files": {"config.json": {"size": len(config), "git_sha1": blob}}}
    (recipe_dir / f"{GX10}.manifest.json").write_text(json.dumps(manifest))
    with FakeHub(model.repo_id, model.revision, {"config.json": config}) as hub:
        for key, value in {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"),
                           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
            monkeypatch.setenv(key, value)
        yield recipe_dir


# (rule, recipe that passes it, dotted path, value that must fail it)
COUNTEREXAMPLES = [
    ("fit-gpu-memory", V100, "memory.weights_on_gpu_gb", 300.0),
    ("fit-gpu-memory", GX10, "serving.gpu_memory_utilization", 0.5),
    ("parallel-shape", V100, "parallelism.tensor", 2),
    ("parallel-shape", GX10, "parallelism.tensor", 4),
    ("gb10-dspark-k5", GX10, "serving.speculative.num_speculative_tokens", 3),
    ("cudagraph-capture-size", GX10, "serving.max_num_seqs", 12),
    ("cudagraph-capture-size", GX10, "serving.extra_args", {"block-size": 256, "kv-cache-memory-bytes": 12884901888}),
    ("v100-fp16", V100, "model.dtype", "bfloat16"),
    ("v100-arch-list", V100, "engine.torch_cuda_arch_list", "7.0;8.0"),
    ("v100-cuda12", V100, "engine.cuda.nvcc", "13.0"),
    ("nvfp4-kv-engine", GX10, "engine.capabilities", ["dspark"]),
    ("gb10-mem-util", GX10, "serving.gpu_memory_utilization", 0.80),
    ("cuda-one-toolkit", SM86, "engine.cuda.headers", "13.0.2"),
    ("rails-distinct-subnets", GX10, "fabric.rails.1.subnet", "10.100.184.0/24"),
    ("rails-mtu-recipe", GX10, "fabric.rails.0.mtu", 1500),
    ("nccl-ib-hca-twins", GX10, "fabric.nccl_ib_hca", ["rocep1s0f1"]),
    ("v100-dspark-sync", V100, "serving.extra_args", {"max-cudagraph-capture-size": 6}),
    ("v100-dspark-sync", V100, "serving.extra_args.async-scheduling", True),
    ("gb10-fixed-kv", GX10, "serving.extra_args.kv-cache-memory-bytes", 0),
    ("gb10-regular-graphs", GX10, "engine.env.VLLM_USE_BREAKABLE_CUDAGRAPH", "1"),
    ("lk-moe-numactl", SM86, "instances", {"ram_gb_each": 170, "vram_gib_each": 6.15, "source": "per NUMA node"}),
    ("lk-threads-cores", SM86, "engine.env.LK_THREADS", "96"),
    ("omp-threads-numa", SM86, "engine.env.OMP_NUM_THREADS", "48"),
    ("dsv4-sm12x-kv-layout", GX10, "serving.kv_cache_dtype", None),
    ("dsv4-sm12x-kv-layout", GX10, "serving.kv_cache_dtype", "auto"),
    ("dsv4-sm12x-kv-layout", GX10, "serving.kv_cache_dtype", "bfloat16"),
    ("sm121-cuda13", GX10, "engine.image.build_args.TORCH_VERSION", "2.11.0+cu128"),
    ("sm121-cuda13", GX10, "engine.image.build_args.TORCH_VERSION", "2.11.0"),
    ("sm121-cuda13", GX10, "engine.image.build_args.CUDA_VERSION", "12.8.1"),
    ("sm121-cuda13", GX10, "engine.cuda.nvcc", "12.9.86"),
    ("rdma-memlock", GX10, "container.memlock_unlimited", False),
    ("output-cap", V100, "serving.default_max_tokens", None),
    ("output-cap", "cpu", "serving.default_max_tokens", 65536),
    ("coding-agent-fit", V100, "serving.max_model_len", 32768),
    ("coding-agent-fit", GX10, "serving.reasoning_parser", None),
    ("coding-agent-fit", GX10, "serving.default_max_tokens", 16384),
    # Claude Code compacts near its own window (1M by default), not near the server's context: a 65,536-token copy
    # of the GX10 recipe would answer 400 to every request once a session passes 33,536 tokens.
    ("coding-agent-fit", GX10, "serving.max_model_len", 65536),
    ("coding-agent-fit", V100, "serving.coding_agent.compact_window_tokens", None),
    ("coding-agent-fit", V100, "serving.coding_agent.compact_window_tokens", 500000),
    ("coding-agent-fit", V100, "serving.coding_agent.compact_window_tokens", 20000),
    ("front-door-ports", V100, "serving.front_door.engine_port", 8000),
    ("front-door-ports", V100, "serving.front_door.engine_port", None),
    ("front-door-ports", GX10, "serving.front_door.engine_port", 25000),
    ("kv-capacity", SM86, "serving.gpu_memory_utilization", 0.19),
    ("kv-capacity", "cpu", "engine.env.VLLM_CPU_KVCACHE_SPACE", "0.05"),
    ("llamacpp-gguf", "v100x8-ds4-flash-llamacpp", "model.gguf.file",
     "DeepSeek-V4-Flash-UD-Q4_K_XL-00002-of-00005.gguf"),
    ("llamacpp-flags", "cpu-llamacpp", "engine.llamacpp.extra_args", {"no-mmap": True}),
    ("llamacpp-volta-k-cache", "v100x8-ds4-flash-llamacpp", "engine.llamacpp.cache_type_k", "q8_0"),
    ("llamacpp-volta-split", "v100x8-ds4-flash-llamacpp", "engine.llamacpp.split_mode", "tensor"),
]


@pytest.mark.parametrize(("rule_id", "name", "path", "value"), COUNTEREXAMPLES,
                         ids=[f"{c[0]}:{c[2]}" for c in COUNTEREXAMPLES])
def test_each_rule_passes_its_reference_and_fails_its_counterexample(rule_id, name, path, value):
    assert verdict(load_recipe(name), rule_id).status == "pass"
    bad = verdict(mutate(name, path, value), rule_id)
    assert bad.status == "fail"
    assert bad.remediation
    assert bad.numbers


def test_the_2_3_8_batch_cap_applies_to_a_2_3_8_pin_only():
    """Lvllmds4-x 2.3.8 caps max_num_seqs x (k+1) at 32; the recipe pins 2.3.9, which does not."""
    assert verdict(load_recipe(SM86), "dspark-seqs-32").status == "skip"
    old = mutate(SM86, "engine.version", "2.3.8")
    assert verdict(old, "dspark-seqs-32").status == "pass"  # 4 x 6 = 24
    data = old.model_dump(mode="python")
    data["serving"]["max_num_seqs"] = 6
    bad = verdict(type(old).model_validate(data), "dspark-seqs-32")
    assert bad.status == "fail" and "6 x (k 5 + 1) = 36" in bad.numbers


def test_an_unbounded_server_thinking_default_needs_benchmark_max_tokens():
    """The GX10 render's server thinks only when asked (benchmark.server_default_thinking: none); a server whose
    default is max thinking needs max_tokens on every benchmark request."""
    assert verdict(load_recipe(GX10), "bench-max-tokens").status == "skip"
    thinking = mutate(GX10, "benchmark.server_default_thinking", "max")
    assert verdict(thinking, "bench-max-tokens").status == "pass"
    data = thinking.model_dump(mode="python")
    data["benchmark"]["max_tokens"] = None
    assert verdict(type(thinking).model_validate(data), "bench-max-tokens").status == "fail"


def test_every_rule_has_a_counterexample_or_host_test():
    covered = {c[0] for c in COUNTEREXAMPLES} | {"rails-mtu-hosts", "rails-addresses", "kernel-known-bad",
                                                  "model-pin", "image-pins", "multinode-socket-ifname", "instances-fit",
                                                  "dspark-seqs-32", "bench-max-tokens"}
    # The engine-registry rules and the KV-pool claim: their defect recipes are in tests/unit/test_engine_registry.py.
    covered |= {"engine-names", "engine-env", "engine-capabilities", "engine-cuda", "engine-model-paths"}
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
    ("rails-addresses", {"gx10_b__ds4_rails__rail0__address": "10.100.184.1"}, "is also given to gx10-a (rail0)"),
    ("rails-addresses", {"gx10_a__ds4_rails__rail1__address": "10.100.184.9"}, "not a host address in 10.100.185.0/24"),
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


def test_short_revision_fails_until_a_manifest_records_its_commit(recipe_dir, locked_gx10):
    import json

    path = locked_gx10 / f"{GX10}.manifest.json"
    assert verdict(load_recipe(GX10), "model-pin").status == "pass"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "revision": "1" * 40}))  # built for another commit
    moved = verdict(load_recipe(GX10), "model-pin")
    assert moved.status == "fail" and "records commit " + "1" * 40 in moved.numbers
    path.unlink()
    pin = verdict(mutate(GX10, "model.revision", "9e165c30"), "model-pin")
    assert pin.status == "fail"
    assert "is a prefix of 8 hex digits and no" in pin.numbers and f"ds4deploy model lock {GX10}" in pin.remediation
    full = verdict(mutate(GX10, "model.revision", "9e165c30" + "a" * 32), "model-pin")
    assert full.status == "pass" and "the first fetch writes it" in full.numbers


def test_an_unlocked_artifact_fails_with_the_lock_command():
    # Passing with a lock, and a recipe sha256 that disagrees with it: tests/unit/test_artifacts.py.
    sha = verdict(load_recipe(SM86), "image-pins")
    assert sha.status == "fail"
    assert "LVLLMDS4X" in sha.numbers and "ds4deploy image lock rtx3090x2-xeon-ds4-flash" in sha.remediation


def _pinned_sm86(**changes):
    """The RTX 3090 recipe with one numactl-pinned instance per NUMA node (the layout it no longer uses), on the
    reference box it was sized for (768 GB: 4 NUMA nodes of 192 GB = 178.8 GiB, docs/sources.md#rtx3090-xeon), with the
    0.3 share of each GPU per instance that layout used (the recipe now gives its one engine 0.95)."""
    r = mutate(SM86, "instances", {"ram_gb_each": 170, "vram_gib_each": 6.15, "source": "per NUMA node"})
    data = r.model_dump(mode="python")
    data["hardware"].update(min_ram_gib=716, ram_per_numa_gib=178.8)
    data["serving"]["gpu_memory_utilization"] = 0.3
    for path, value in changes.items():
        *keys, last = path.split("__")
        d = data
        for k in keys:
            d = d[k]
        d[last] = value
    return type(r).model_validate(data)


@pytest.mark.parametrize(("changes", "needle"), [
    ({"serving__gpu_memory_utilization": 0.2}, "raise serving.gpu_memory_utilization"),
    ({"hardware__ram_per_numa_gib": 100.0}, "add RAM per NUMA node"),
])
def test_instances_fit_passes_the_pinned_layout_and_fails_its_counterexamples(changes, needle):
    assert verdict(_pinned_sm86(), "instances-fit").status == "pass"
    bad = verdict(_pinned_sm86(**changes), "instances-fit")
    assert bad.status == "fail"
    assert needle in bad.remediation


def test_gb10_long_context_without_a_fixed_kv_allocation_fails():
    r = load_recipe(GX10)
    data = r.model_dump(mode="python")
    del data["serving"]["extra_args"]["kv-cache-memory-bytes"]
    data["memory"]["kv_cache_gib_per_gpu"] = 12.0
    util_sized = type(r).model_validate(data)
    bad = verdict(util_sized, "gb10-fixed-kv")
    assert bad.status == "fail"
    assert "kv-cache-memory-bytes" in bad.remediation
    data["serving"]["max_model_len"] = architecture.GB10_FIXED_KV_ABOVE_TOKENS
    assert verdict(type(r).model_validate(data), "gb10-fixed-kv").status == "skip"


def test_the_kv_cache_is_written_once():
    r = load_recipe(GX10)
    data = r.model_dump(mode="python")
    data["memory"]["kv_cache_gib_per_gpu"] = 12.0
    with pytest.raises(ValueError, match="written exactly once"):
        type(r).model_validate(data)
    assert r.kv_cache_gib_per_gpu == 12.0


def test_instance_count_is_derived_from_ram_and_vram():
    count, why = instance_count(_pinned_sm86())
    assert count == 3
    assert "4 NUMA nodes" in why
    assert "floor(23.69 GiB / 6.15 GiB) = 3" in why
    assert "floor(1 / 0.3) = 3" in why
    # Never more instances than NUMA nodes (instance i is bound to node i), whatever the GPUs would allow.
    r = _pinned_sm86(instances__vram_gib_each=1.0)
    data = r.model_dump(mode="python")
    data["serving"]["gpu_memory_utilization"] = 0.1
    data["memory"]["weights_on_gpu_gb"] = 0.1
    roomy = type(r).model_validate(data)
    assert instance_count(roomy)[0] == 4


@pytest.mark.tool
def test_cli_with_inventory_and_exit_codes(tmp_path, locked_gx10):
    """The rules with the inventory's host facts, then the deploy's control-host checks (the committed render, the
    node plan); --no-nodes leaves out reading the nodes (these hosts do not exist) and says so."""
    inv = tmp_path / "inv.yml"
    plan = {"gx10-a": {"ds4_node_rank": 0, "ds4_host_ip": "10.0.0.1"},
            "gx10-b": {"ds4_node_rank": 1, "ds4_host_ip": "10.0.0.2"}}
    hosts = {h: {**facts, **plan[h]} for h, facts in GOOD_HOSTS.items()}
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    p = run_cli("preflight", GX10, "--inventory", str(inv), "--no-nodes", env_dir=locked_gx10)
    # Not rendered in this scratch directory: the deploy would refuse it, so the preflight does too.
    assert p.returncode == 1 and "front-door.conf.template is missing" in p.stderr, p.stdout + p.stderr
    assert " passed, 0 failed, 0 unknown, 1 warnings" in p.stdout, p.stdout
    assert run_cli("render", GX10, env_dir=locked_gx10).returncode == 0
    p = run_cli("preflight", GX10, "--inventory", str(inv), "--no-nodes", env_dir=locked_gx10)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "control-host checks of the deploy passed; nodes not read (--no-nodes)" in p.stdout
    passed = sum(v.status == "pass" for v in preflight.run(load_recipe(GX10), GOOD_HOSTS))
    assert passed >= 18  # the GX10 rules of this book at least (others may be added)
    assert " passed, 0 failed, 0 unknown, 1 warnings" in p.stdout, p.stdout
    # The node plan is the deploy's too: two hosts on one rank are refused here as by `make deploy`.
    inv.write_text(yaml.safe_dump({"all": {"hosts": {**hosts, "gx10-b": {**hosts["gx10-b"], "ds4_node_rank": 0}}}}))
    p = run_cli("preflight", GX10, "--inventory", str(inv), "--no-nodes", env_dir=locked_gx10)
    assert p.returncode == 2 and "both have ds4_node_rank 0" in p.stderr and "\nfix: " in p.stderr
    bad = _hosts(**{"gx10-a__ds4_kernel": "7.0.0-1019-nvidia"})
    inv.write_text(yaml.safe_dump({"all": {"children": {"gx10": {"hosts": bad}}}}))
    p = run_cli("preflight", GX10, "--inventory", str(inv), env_dir=locked_gx10)
    assert p.returncode == 1
    assert "kernel-known-bad" in p.stdout
    assert "fail" in p.stdout


# --- the field-fault recipes (tests/unit/fixtures/field_recipes/README.md): each accepted before its rule existed ---

FIELD = Path(__file__).parent / "fixtures" / "field_recipes"


@pytest.mark.parametrize(("name", "rule_id", "needles"), [
    ("gx10-kv-auto", "dsv4-sm12x-kv-layout", ["kv_cache_dtype (unset", "fp8_ds_mla", "issues/47174"]),
    ("gx10-cu128", "sm121-cuda13", ["nvcc 12.8.93", "CUDA_VERSION 12.8.1", "torch 2.9.0+cu128 (needs a +cu13x"]),
    ("gx10-no-memlock", "rdma-memlock", ["memlock_unlimited False", "container.memlock_unlimited: true",
                                         "troubleshooting.html#infiniband"]),
    ("cpu2-hostnet", "multinode-socket-ifname", ["GLOO_SOCKET_IFNAME=(unset)", "ip -o addr show to",
                                                 "connectFullMesh"]),
])
def test_field_fault_recipes_fail_their_rule_and_only_it(name, rule_id, needles):
    recipe = load_recipe(FIELD / f"{name}.yaml")
    verdicts = preflight.run(recipe)
    failed = [v.rule for v in verdicts if v.status == "fail"]
    # A CUDA 12.8 build is also outside what the pinned GB10 engine is built for (its registry: CUDA 13.0).
    also = {"gx10-cu128": ["engine-cuda"]}.get(name, [])
    assert failed == [rule_id, *also]
    bad = next(v for v in verdicts if v.rule == rule_id)
    text = bad.numbers + " " + bad.remediation
    for needle in needles:
        assert needle in text
    assert bad.source.startswith("https://")
    assert preflight.Report(name, verdicts).exit_code == 1


def test_field_fault_recipe_fails_the_cli_with_the_inventory():
    p = run_cli("preflight", str(FIELD / "cpu2-hostnet.yaml"), "--inventory", str(FIELD / "cpu2-hostnet.inventory.yml"))
    assert p.returncode == 1
    assert "multinode-socket-ifname" in p.stdout


def test_socket_ifname_named_in_engine_env_passes(tmp_path):
    data = yaml.safe_load((FIELD / "cpu2-hostnet.yaml").read_text())
    data["extends"] = str((FIELD / data["extends"]).resolve())  # `extends:` paths are relative to the file
    data["engine"] = {"env": {"GLOO_SOCKET_IFNAME": "enp1s0"}}
    path = tmp_path / "cpu2-hostnet.yaml"
    path.write_text(yaml.safe_dump(data))
    ok = verdict(load_recipe(path), "multinode-socket-ifname")
    assert ok.status == "pass" and "GLOO_SOCKET_IFNAME=enp1s0" in ok.numbers
    # A GPU recipe needs NCCL's too; with a fabric both are derived from its first rail.
    fab = verdict(load_recipe(GX10), "multinode-socket-ifname")
    assert fab.status == "pass" and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in fab.numbers
    # One node, or nodes on a Docker network (bridge), do not need them.
    assert verdict(load_recipe("cpu-2node-tp"), "multinode-socket-ifname").status == "skip"


def test_sm121_unknown_without_a_torch_pin():
    r = load_recipe(GX10)
    data = r.model_dump(mode="python")
    del data["engine"]["image"]["build_args"]["TORCH_VERSION"]
    assert verdict(type(r).model_validate(data), "sm121-cuda13").status == "unknown"


def test_torch_local_cuda_flavour():
    assert field_reports.torch_local_cuda("2.11.0+cu130") == "cu130"
    assert field_reports.torch_local_cuda("2.13.0+cpu") is None
    assert field_reports.torch_local_cuda("2.11.0") is None
def test_a_short_context_needs_no_output_cap_and_a_long_one_does():
    """The output-cap rule's threshold: uncapped is fine up to LONG_CONTEXT_TOKENS, refused above."""
    short = mutate("cpu", "serving.max_model_len", 2048)
    short = short.model_copy(update={"serving": short.serving.model_copy(update={"default_max_tokens": None})})
    ok = verdict(short, "output-cap")
    assert ok.status == "pass" and "short enough" in ok.numbers
    long_ctx = mutate(V100, "serving.default_max_tokens", None)
    assert long_ctx.serving.max_model_len > serving.LONG_CONTEXT_TOKENS
    bad = verdict(long_ctx, "output-cap")
    assert bad.status == "fail" and "serving.default_max_tokens" in bad.remediation


def test_front_door_port_clash_is_refused_by_the_cli_with_cause_and_fix(recipe_dir):
    """A host-network recipe whose engine would take the front door's port: the preflight CLI exits 1 and names the
    clash and the fix, before anything starts."""
    from tests.unit.conftest import write_variant

    def clash(d):
        d["serving"].update(bind_address="0.0.0.0", network_mode="host", front_door={"engine_port": 8000})

    write_variant(recipe_dir, "clash", clash)
    p = run_cli("preflight", "clash", env_dir=recipe_dir)
    assert p.returncode == 1
    assert "front-door-ports" in p.stdout and "fail" in p.stdout
    assert "engine_port" in p.stdout and "Traceback" not in p.stdout + p.stderr


@pytest.mark.tool
def test_cli_runs_the_deploys_control_host_checks_without_an_inventory(recipe_dir, tmp_path):
    """Without an inventory the preflight still refuses what `ds4deploy vars` (the deploy's first step) refuses
    without one: an unrendered recipe, a MODEL_FROM for a model that is not local; and says the nodes were not read."""
    p = run_cli("preflight", "cpu", env_dir=recipe_dir)
    assert p.returncode == 1 and "compose/cpu/compose.yaml is missing" in p.stderr, p.stdout + p.stderr
    assert run_cli("render", "cpu", env_dir=recipe_dir).returncode == 0
    p = run_cli("preflight", "cpu", env_dir=recipe_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "control-host checks of the deploy passed; nodes not read (pass --inventory" in p.stdout
    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF")
    p = run_cli("preflight", "cpu", "--model-from", str(src), env_dir=recipe_dir)
    assert p.returncode == 2 and "--from names a local model's files" in p.stderr and "\nfix: " in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.tool
def test_cli_refuses_a_local_model_the_deploy_could_not_check_on_the_nodes(recipe_dir):
    """A local model placed on the nodes by hand: no manifest, or one without sha256, is refused by the preflight
    as by the deploy's staging step (ds4deploy.model.staging.check_source), naming the fix."""
    import json

    from tests.unit.conftest import write_variant

    def local(d):
        d["model"] = {"source": "local", "served_name": "tiny-gguf", "dtype": "float16", "quantization": "gguf",
                      "size_on_disk_gb": 0.001, "path": "/var/lib/ds4deploy/models/tiny-gguf"}

    write_variant(recipe_dir, "gguf", local)
    assert run_cli("render", "gguf", env_dir=recipe_dir).returncode == 0
    p = run_cli("preflight", "gguf", env_dir=recipe_dir)
    assert p.returncode == 2 and "no model manifest for recipe 'gguf'" in p.stderr and "--from PATH" in p.stderr
    (recipe_dir / "gguf.manifest.json").write_text(json.dumps(
        {"recipe": "gguf", "source": "local", "files": {"tiny.gguf": {"size": 4, "git_sha1": "a" * 40}}}))
    p = run_cli("preflight", "gguf", env_dir=recipe_dir)
    assert p.returncode == 2 and "gguf.manifest.json records no sha256 for tiny.gguf" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_kv_capacity_refuses_a_request_that_cannot_fit_and_warns_with_the_resident_sessions():
    # GX10: 12 GiB of KV per rank hold one 1,048,576-token request of max_num_seqs 6 (docs/estimator.md).
    warn = verdict(load_recipe(GX10), "kv-capacity")
    assert warn.status == "warn" and "1 of max_num_seqs 6 full-length sessions resident" in warn.numbers
    assert "at most 1 full-length sessions" in warn.remediation
    small = verdict(mutate(GX10, "serving.extra_args.kv-cache-memory-bytes", 8 * 2**30), "kv-capacity")
    assert small.status == "fail" and "8.00 GiB available" in small.numbers and "needs 11.04 GiB" in small.numbers
    # No KV accounting for the V4.1 fork: said, never a guessed number.
    v100 = verdict(load_recipe(V100), "kv-capacity")
    assert v100.status == "unknown" and "no KV accounting for model_type 'deepseek_v41_text'" in v100.numbers


def test_preflight_cli_counts_the_capacity_warning_and_passes(locked_gx10):
    p = run_cli("preflight", GX10, "--width", "250", "--no-nodes", env_dir=locked_gx10)
    assert "kv-capacity" in p.stdout and " 0 failed, " in p.stdout and " unknown, 1 warnings, " in p.stdout, p.stdout
