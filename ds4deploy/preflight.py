"""The preflight rule book: every known way a recipe fails on real hardware, checked before any host is touched.

Each rule has an id, a title, the source of the fact behind it (seed system or public report), a predicate saying
when it applies, and a check returning a `Verdict`: ``pass``, ``fail`` (with a remediation), ``unknown`` (a fact
is missing: the message says which and where to add it; never a silent pass) or ``skip`` (does not apply).

Host facts come from an Ansible inventory (``--inventory``), per host::

    ds4_kernel: 6.17.0-1032-nvidia          # uname -r
    ds4_rails:                              # per rail of the recipe's fabric
      rail0: {address: 192.168.100.1, mtu: 9000}

Units: GB = 10**9 bytes, GiB = 2**30 bytes; every memory number is printed in both where both appear.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ds4deploy.errors import UserError
from ds4deploy.instances import GIB_PER_GB, instance_count
from ds4deploy.recipe import Recipe


@dataclass(frozen=True)
class Verdict:
    """The outcome of one rule: status, the numbers behind it, what to do, and where the rule comes from."""

    rule: str
    status: str  # pass | fail | unknown | skip
    numbers: str
    remediation: str
    source: str


@dataclass(frozen=True)
class Rule:
    """A preflight rule. `check(recipe, hosts)` returns (status, numbers, remediation)."""

    id: str
    title: str
    source: str
    applies: Callable[[Recipe], bool]
    check: Callable[[Recipe, dict[str, dict]], tuple[str, str, str]]


RULES: list[Rule] = []


def rule(id_: str, title: str, source: str, applies: Callable[[Recipe], bool]):
    """Register a rule (decorator)."""

    def wrap(fn):
        RULES.append(Rule(id_, title, source, applies, fn))
        return fn

    return wrap


def _spec_k(r: Recipe) -> int:
    return r.serving.speculative.num_speculative_tokens if r.serving.speculative else 0


def _gib(gb: float) -> float:
    return gb * GIB_PER_GB


# --- memory and shape ------------------------------------------------------------------------------------------


@rule("fit-gpu-memory", "weights + KV + overhead fit on each GPU within gpu_memory_utilization",
      "SEEDS A/B/C memory figures; vLLM sizes its budget as gpu_memory_utilization x GPU memory",
      lambda r: r.memory is not None and r.hardware.gpus.count > 0)
def _fit(r: Recipe, hosts):
    m, g = r.memory, r.hardware.gpus
    if g.memory_gib is None:
        return "unknown", "hardware.gpus.memory_gib is not set", "add the usable GiB per GPU to the recipe"
    # tensor x pipeline is the whole world size, across nodes too (--nnodes): each rank holds 1/ranks of the weights.
    ranks = r.parallelism.tensor * r.parallelism.pipeline
    weights_gb = m.weights_on_gpu_gb / ranks
    need = _gib(weights_gb) + m.kv_cache_gib_per_gpu + m.overhead_gib_per_gpu
    budget = g.memory_gib * r.serving.gpu_memory_utilization
    nums = (f"per GPU: weights {weights_gb:.2f} GB ({_gib(weights_gb):.2f} GiB) + KV {m.kv_cache_gib_per_gpu} GiB + "
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


# --- speculative decoding and CUDA graphs -----------------------------------------------------------------------


@rule("dspark-seqs-32", "Lvllmds4-x 2.3.8: max_num_seqs x (k+1) <= 32",
      "SEEDS C pitfall 3; guqiong96/Lvllmds4-x routed_experts.py caps the batch at 32 (removed in 2.3.9)",
      lambda r: r.engine.flavor == "lvllmds4-x" and r.engine.version.startswith("2.3.8") and _spec_k(r) > 0)
def _dspark32(r: Recipe, hosts):
    k, n = _spec_k(r), r.serving.max_num_seqs
    nums = f"max_num_seqs {n} x (k {k} + 1) = {n * (k + 1)}; limit 32"
    if n * (k + 1) <= 32:
        return "pass", nums, ""
    return "fail", nums, (f"lower max_num_seqs to {32 // (k + 1)} or k; warm-up otherwise dies on a tensor size "
                          "mismatch (seqs=4, k=5 was fastest)")


@rule("gb10-dspark-k5", "GB10 community builds: DSpark k must be 5 (or a multiple of 5)",
      "shared/UPSTREAM.md sm121: on these builds k must be 5",
      lambda r: r.engine.flavor == "gb10-community" and _spec_k(r) > 0)
def _k5(r: Recipe, hosts):
    k = _spec_k(r)
    if k % 5 == 0:
        return "pass", f"k = {k}", ""
    return "fail", f"k = {k}", "set serving.speculative.num_speculative_tokens to 5"


@rule("cudagraph-capture-size", "max-cudagraph-capture-size equals max_num_seqs x (k+1)",
      "shared/UPSTREAM.md sm121 serve flags (--max-cudagraph-capture-size <seqs*(k+1)>)",
      lambda r: "max-cudagraph-capture-size" in r.serving.extra_args
      or (r.engine.flavor == "gb10-community" and _spec_k(r) > 0))
def _capture(r: Recipe, hosts):
    k, n = _spec_k(r), r.serving.max_num_seqs
    got = r.serving.extra_args.get("max-cudagraph-capture-size")
    if got is None:
        return "fail", "max-cudagraph-capture-size unset", (
            f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)} (GB10 builds with DSpark need it)")
    nums = f"capture size {got}; max_num_seqs {n} x (k {k} + 1) = {n * (k + 1)}"
    if got == n * (k + 1):
        return "pass", nums, ""
    return "fail", nums, f"set serving.extra_args.max-cudagraph-capture-size to {n * (k + 1)}"


# --- architecture-specific --------------------------------------------------------------------------------------


@rule("v100-fp16", "V100: fp16 only (no bf16 on sm70)", "shared/UPSTREAM.md sm70: V100 has no bf16: --dtype half",
      lambda r: r.hardware.gpus.arch == "sm70")
def _fp16(r: Recipe, hosts):
    if r.model.dtype in ("float16", "half"):
        return "pass", f"dtype {r.model.dtype}", ""
    return "fail", f"dtype {r.model.dtype}", "set model.dtype: float16"


@rule("v100-arch-list", "V100: TORCH_CUDA_ARCH_LIST is 7.0 only",
      "shared/UPSTREAM.md sm70: a mixed-arch list silently drops the sm_70 Marlin kernels",
      lambda r: r.hardware.gpus.arch == "sm70")
def _archlist(r: Recipe, hosts):
    lists = {r.engine.torch_cuda_arch_list, r.engine.image.build_args.get("TORCH_CUDA_ARCH_LIST")}
    nums = f"engine.torch_cuda_arch_list {r.engine.torch_cuda_arch_list!r}, build arg " \
           f"{r.engine.image.build_args.get('TORCH_CUDA_ARCH_LIST')!r}"
    if lists == {"7.0"}:
        return "pass", nums, ""
    return "fail", nums, "set both to \"7.0\" exactly"


@rule("v100-cuda12", "V100: CUDA 12.x (CUDA 13 dropped sm_70)",
      "shared/UPSTREAM.md sm70: CUDA 13 dropped sm_70; torch 2.10.0+cu128 is the last flavour with sm_70",
      lambda r: r.hardware.gpus.arch == "sm70")
def _cuda12(r: Recipe, hosts):
    if r.engine.cuda is None:
        return "unknown", "engine.cuda is not set", "add engine.cuda (nvcc, headers, cudart versions)"
    major = r.engine.cuda.nvcc.split(".")[0]
    if major == "12":
        return "pass", f"nvcc {r.engine.cuda.nvcc}", ""
    return "fail", f"nvcc {r.engine.cuda.nvcc}", "build on CUDA 12.8 (nvidia/cuda:12.8.x base)"


@rule("nvfp4-kv-engine", "nvfp4_ds_mla KV cache only with an engine that has it",
      "shared/UPSTREAM.md sm121: nvfp4_ds_mla exists only in community builds; stock vLLM rejects nvfp4 with MLA",
      lambda r: r.serving.kv_cache_dtype == "nvfp4_ds_mla")
def _nvfp4(r: Recipe, hosts):
    caps = r.engine.capabilities
    if "nvfp4_ds_mla" in caps:
        return "pass", f"engine {r.engine.name} capabilities {caps}", ""
    return "fail", f"engine {r.engine.name} capabilities {caps}", (
        "use kv_cache_dtype fp8_ds_mla, or an engine build with nvfp4_ds_mla (the GB10 community image)")


@rule("gb10-mem-util", "GB10: gpu_memory_utilization <= 0.78",
      "shared/UPSTREAM.md sm121: 0.80 boots then dies on first traffic; a 256K cold prefill at 0.80 hard-resets",
      lambda r: r.hardware.gpus.arch == "sm121")
def _gb10util(r: Recipe, hosts):
    u = r.serving.gpu_memory_utilization
    if u <= 0.78:
        return "pass", f"gpu_memory_utilization {u}", ""
    return "fail", f"gpu_memory_utilization {u}", "set serving.gpu_memory_utilization to 0.78"


@rule("cuda-one-toolkit", "nvcc, CUDA headers and cudart come from one toolkit version",
      "SEEDS C pitfall 2: nvcc 13.2 vs headers 13.0 -> CCCL 'compiler and toolkit headers are incompatible'",
      lambda r: r.engine.cuda is not None)
def _onecuda(r: Recipe, hosts):
    c = r.engine.cuda
    nums = f"nvcc {c.nvcc}, headers {c.headers}, cudart {c.cudart}"
    # major.minor, as images/sm86/check_cuda_toolkit.py compares at build time (component patch levels differ
    # inside one toolkit: nvcc 13.0.88 ships with cudart 13.0.96).
    if len({".".join(v.split(".")[:2]) for v in (c.nvcc, c.headers, c.cudart)}) == 1:
        return "pass", nums, ""
    return "fail", nums, "pin the pip CUDA runtime and NVRTC packages to the nvcc version"


# --- fabric -------------------------------------------------------------------------------------------------------


@rule("rails-distinct-subnets", "each RoCE rail on its own subnet",
      "SEEDS B RoCE checklist: rails on one subnet pin routing to one rail (~110 Gb/s instead of 196)",
      lambda r: r.fabric is not None)
def _subnets(r: Recipe, hosts):
    nets = [ipaddress.ip_network(x.subnet) for x in r.fabric.rails]
    nums = ", ".join(f"{x.name} {x.subnet}" for x in r.fabric.rails)
    for i, a in enumerate(nets):
        for b in nets[i + 1:]:
            if a.overlaps(b):
                return "fail", nums, "give every rail its own /24 (e.g. 192.168.100.0/24 and 192.168.101.0/24)"
    return "pass", nums, ""


@rule("rails-mtu-recipe", "rails use MTU 9000", "shared/UPSTREAM.md netplan per rail: mtu 9000",
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
      "shared/UPSTREAM.md: verify jumbo frames end to end (don't-fragment ping of MTU-28 bytes)",
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
      "SEEDS B RoCE checklist: both ports need an IP (the GID is derived from it)",
      lambda r: r.fabric is not None)
def _rail_addrs(r: Recipe, hosts):
    facts, unknown = _rail_facts(r, hosts, "address")
    if unknown:
        return unknown
    subnets = {x.name: ipaddress.ip_network(x.subnet) for x in r.fabric.rails}
    seen: dict[str, str] = {}
    for h, rail, addr in facts:
        if ipaddress.ip_address(addr) not in subnets[rail]:
            return "fail", f"{h} {rail} {addr} not in {subnets[rail]}", f"give {h} an address in {subnets[rail]}"
        if addr in seen:
            return "fail", f"{addr} on {seen[addr]} and {h}", "give every node its own address"
        seen[addr] = h
    return "pass", ", ".join(f"{h} {a}" for a, h in seen.items()), ""


@rule("nccl-ib-hca-twins", "NCCL_IB_HCA names the HCA of every rail (on GB10: both twin HCAs of the cabled port)",
      "shared/UPSTREAM.md sm121: NCCL_IB_HCA lists both twin HCAs of the port; one HCA = half the bandwidth",
      lambda r: r.fabric is not None)
def _twins(r: Recipe, hosts):
    from ds4deploy.engine_args import engine_env

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


# --- instances, model, benchmark ---------------------------------------------------------------------------------


@rule("instances-fit", "at least one engine instance fits a NUMA node's RAM and the GPUs' memory",
      "SEEDS C: ~170 GB system RAM per instance pinned to one NUMA node; 6.6 GB VRAM per card",
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


@rule("model-pin", "the model is pinned to a full 40-hex commit",
      "SEEDS B verified revision 9e165c30 file by file; only a full commit names exactly one tree",
      lambda r: r.model.source == "hub")
def _pin(r: Recipe, hosts):
    rev = r.model.revision or ""
    if len(rev) == 40:
        return "pass", f"{r.model.repo_id}@{rev}", ""
    return "unknown", f"{r.model.repo_id}@{rev} has only {len(rev)} of 40 hex digits", (
        "resolve it to the full commit (hub web page or `git ls-remote`) and set model.revision")


@rule("image-pins", "every downloaded artifact of the image build has its sha256 recorded",
      "issue: images pinned by commit, version or digest, with sha256 for downloaded wheels",
      lambda r: any(k.endswith("_SHA256") for k in r.engine.image.build_args))
def _pins(r: Recipe, hosts):
    empty = [k for k, v in r.engine.image.build_args.items() if k.endswith("_SHA256") and not v]
    if empty:
        return "unknown", f"{', '.join(empty)} empty", (
            "fill in the sha256 from the release page before building; the Dockerfile refuses to build without it")
    return "pass", "all recorded", ""


@rule("bench-max-tokens", "benchmarks set max_tokens when the server's default thinking is unbounded",
      "SEEDS B: DEFAULT_THINKING=max made one request generate for 2 h 45 min without max_tokens",
      lambda r: r.benchmark.server_default_thinking != "none")
def _maxtok(r: Recipe, hosts):
    if r.benchmark.max_tokens:
        return "pass", f"max_tokens {r.benchmark.max_tokens}", ""
    return "fail", "max_tokens unset", "set benchmark.max_tokens (2048 in the reference method)"


# --- running ------------------------------------------------------------------------------------------------------


def load_inventory(path: Path) -> dict[str, dict]:
    """Host name -> host vars from a YAML Ansible inventory (hosts under any group, vars merged group -> host).

    Raises:
        UserError: the file is missing or not a YAML inventory.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read inventory {path}: {exc}", "pass a YAML Ansible inventory") from None
    hosts: dict[str, dict] = {}

    def walk(group: dict, inherited: dict) -> None:
        gvars = {**inherited, **(group.get("vars") or {})}
        for name, hv in (group.get("hosts") or {}).items():
            hosts[name] = {**hosts.get(name, {}), **gvars, **(hv or {})}
        for child in (group.get("children") or {}).values():
            walk(child or {}, gvars)

    if not isinstance(data, dict):
        raise UserError(f"{path} is not a YAML Ansible inventory", "start from ansible/inventories/local.yml")
    for group in data.values():
        walk(group or {}, {})
    return hosts


def run(recipe: Recipe, hosts: dict[str, dict] | None = None) -> list[Verdict]:
    """Every rule against `recipe` (and host facts when given), in rule-book order."""
    out = []
    for r in RULES:
        if not r.applies(recipe):
            out.append(Verdict(r.id, "skip", "does not apply", "", r.source))
            continue
        status, numbers, fix = r.check(recipe, hosts or {})
        out.append(Verdict(r.id, status, numbers, fix, r.source))
    return out


@dataclass
class Report:
    """Verdicts of one recipe; `exit_code` is 1 when any rule failed, else 0."""

    recipe: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(v.status == "fail" for v in self.verdicts) else 0
