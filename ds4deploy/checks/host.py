"""Host checks of one node against the recipe: GPUs, GPU tuning, memory and NUMA, memlock, GPUs inside
containers, the kernel, the model directory.

GPU facts come from ``nvidia-smi --query-gpu`` (parsed by `ds4deploy.parsers.nvidia_smi`). A host without
``nvidia-smi`` and without ``/dev/nvidia0`` reports every GPU row as "skipped: no NVIDIA GPU", never pass; a host
with the device node but a failing nvidia-smi reports an error (driver broken).

Locked clocks are not readable through ``nvidia-smi --query-gpu``; the clock row reads what the gpu_tuning role's
boot-time unit applies (/etc/ds4deploy/gpu-tuning.env) and whether that unit ran successfully.
"""

from __future__ import annotations

import shlex

from ds4deploy.checks.report import ERROR, FAIL, PASS, Row, skip
from ds4deploy.checks.target import Target
from ds4deploy.core.errors import UserError
from ds4deploy.parsers.nvidia_smi import parse_query_gpu
from ds4deploy.plan.check_inputs import DRIVER_FOR_CUDA, version_tuple
from ds4deploy.plan.preflight.field_reports import SRC_MEMLOCK, needs_unlimited_memlock
from ds4deploy.recipe.schema import Recipe

GPU_FIELDS = ["index", "name", "driver_version", "compute_cap", "persistence_mode", "power.limit",
              "power.max_limit", "clocks.max.graphics"]
NO_GPU = "no NVIDIA GPU"
TUNING_ENV = "/etc/ds4deploy/gpu-tuning.env"
TUNING_UNIT = "ds4deploy-gpu-tuning.service"
# MemTotal of a NUMA node is below the installed RAM by what firmware and the kernel reserve; ds4deploy accepts
# 5 % less than hardware.ram_per_numa_gib (an estimate: crashkernel, page structs and firmware take 1-3 % on the
# reference boxes' class of hardware).
NUMA_RAM_SLACK = 0.95
# nvidia-smi prints the power limit with two decimals; a set limit reads back within 1 W of the request.
POWER_TOLERANCE_W = 1.0


def _arch(compute_cap: str | None) -> str:
    """``"8.6"`` -> ``"sm86"``, ``"12.1"`` -> ``"sm121"``; ``"?"`` when unknown."""
    return "sm" + compute_cap.replace(".", "") if compute_cap else "?"


def gpu_facts(target: Target) -> list[dict] | None:
    """Per-GPU facts from nvidia-smi, or None when the host has no NVIDIA GPU.

    Raises:
        UserError: a device node exists but nvidia-smi fails or prints something unparseable (driver broken).
    """
    out = target.run(f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv", timeout=60)
    if out.ok:
        return parse_query_gpu(out.stdout, GPU_FIELDS)
    has_dev = target.run("test -e /dev/nvidia0 || test -e /dev/nvidiactl").ok
    if not has_dev and (out.rc == 127 or "not found" in out.stderr):
        return None
    raise UserError(f"nvidia-smi failed on {target.name} (rc {out.rc}): {(out.stderr or out.stdout).strip()[:200]}",
                    "reinstall or reload the NVIDIA driver (the nvidia_driver role), then reboot")


def check_gpus(target: Target, recipe: Recipe) -> list[Row]:
    """GPU rows: count, architecture, model, driver, persistence, power limit, clocks."""
    host, g = target.name, recipe.hardware.gpus
    names = ["gpu.count", "gpu.arch", "gpu.driver", "gpu.persistence", "gpu.power_limit", "gpu.clocks"]
    if g.count == 0:
        return [skip(host, n, "no GPU", f"recipe {recipe.name} uses no GPU") for n in names[:1]]
    try:
        gpus = gpu_facts(target)
    except UserError as exc:
        return [Row(host, "gpu.count", str(g.count), exc.cause, ERROR, exc.fix)]
    if gpus is None:
        return [skip(host, n, "recipe hardware.gpus", NO_GPU) for n in names]
    rows = [Row(host, "gpu.count", f"{g.count} x {g.model or g.arch}", f"{len(gpus)} x {gpus[0].get('name')}",
                PASS if len(gpus) == g.count else FAIL,
                "" if len(gpus) == g.count else "check that every GPU is seated and bound to the nvidia driver "
                "(`nvidia-smi -L`, `dmesg | grep -i nvrm`)", "recipe hardware.gpus.count")]
    archs = sorted({_arch(x.get("compute_cap")) for x in gpus})
    rows.append(Row(host, "gpu.arch", g.arch, ", ".join(archs), PASS if archs == [g.arch] else FAIL,
                    "" if archs == [g.arch] else f"this host's GPUs are {', '.join(archs)}: deploy a recipe built "
                    f"for them", "recipe hardware.gpus.arch"))
    driver = gpus[0].get("driver_version") or "?"
    cuda_major = recipe.engine.cuda.cudart.split(".")[0] if recipe.engine.cuda else None
    need = DRIVER_FOR_CUDA.get(cuda_major) if cuda_major else None
    if need is None:
        rows.append(skip(host, "gpu.driver", "any", f"recipe names no CUDA version; driver {driver}"))
    else:
        ok = version_tuple(driver) >= version_tuple(need[0])
        rows.append(Row(host, "gpu.driver", f">= {need[0]} (CUDA {recipe.engine.cuda.cudart})", driver,
                        PASS if ok else FAIL, "" if ok else f"install driver branch {need[0].split('.')[0]} or newer "
                        "(nvidia_driver role with nvidia_driver_install: true)", need[1]))
    off = [str(x["index"]) for x in gpus if x.get("persistence_mode") != "Enabled"]
    rows.append(Row(host, "gpu.persistence", "Enabled", "Enabled" if not off else f"Disabled on GPU {','.join(off)}",
                    PASS if not off else FAIL, "" if not off else
                    f"run the gpu_tuning role (its boot unit runs `nvidia-smi -pm 1`); check `systemctl status "
                    f"{TUNING_UNIT}`", "NVIDIA: persistence mode keeps the driver loaded between jobs"))
    if g.power_limit_w is None:
        rows.append(skip(host, "gpu.power_limit", "default", "recipe sets no power limit"))
    else:
        limits = [x.get("power_limit_w") for x in gpus]
        bad = [f"GPU {x['index']} {x.get('power_limit_w')} W" for x in gpus
               if x.get("power_limit_w") is None or abs(x["power_limit_w"] - g.power_limit_w) > POWER_TOLERANCE_W]
        rows.append(Row(host, "gpu.power_limit", f"{g.power_limit_w} W", ", ".join(bad) or f"{limits[0]:g} W",
                        PASS if not bad else FAIL, "" if not bad else
                        f"run the gpu_tuning role; `systemctl status {TUNING_UNIT}`; N/A means the GPU has no "
                        "settable power limit (GB10)",
                        "recipe hardware.gpus.power_limit_w (docs/sources.md#v100x8: 150 W)"))
    rows.append(_clock_row(target, recipe, gpus))
    return rows


def _clock_row(target: Target, recipe: Recipe, gpus: list[dict]) -> Row:
    host, g = target.name, recipe.hardware.gpus
    lock, cap = g.graphics_clock_lock_mhz, g.graphics_clock_cap_mhz
    env = target.run(f"cat {TUNING_ENV}")
    applied = dict(line.split("=", 1) for line in env.stdout.splitlines() if "=" in line) if env.ok else {}
    if lock is None and cap is None:
        left = applied.get("DS4_CLOCK_RANGE", "")
        return Row(host, "gpu.clocks", "not locked (driver default)", left or "not locked",
                   PASS if not left else FAIL, "" if not left else
                   "a clock setting remains from an earlier recipe: run the gpu_tuning role (it resets with "
                   "`nvidia-smi -rgc`)",
                   "docs/sources.md#gx10-benchmark-method: clocks left changed by a stray script skewed a benchmark")
    want = f"{lock},{lock}" if lock else f"0,{cap}"
    expected = f"locked at {lock} MHz" if lock else f"capped at {cap} MHz"
    max_mhz = min((x.get("clocks_max_graphics_mhz") or 10**6) for x in gpus)
    if lock and lock > max_mhz:
        return Row(host, "gpu.clocks", expected, f"GPU maximum {max_mhz} MHz", FAIL,
                   "ask for a clock the GPU supports (`nvidia-smi -q -d SUPPORTED_CLOCKS`)",
                   "recipe hardware.gpus.graphics_clock_*_mhz")
    active = target.run(f"systemctl is-active {TUNING_UNIT}")
    state = active.stdout.strip() or "unknown"
    got = applied.get("DS4_CLOCK_RANGE")
    ok = got == want and state == "active"
    return Row(host, "gpu.clocks", f"{expected} ({TUNING_UNIT})",
               f"range {got or 'unset'}, unit {state}", PASS if ok else FAIL, "" if ok else
               f"run the gpu_tuning role; then `systemctl status {TUNING_UNIT}`",
               "recipe hardware.gpus.graphics_clock_*_mhz (docs/sources.md#v100x8: 1522 MHz lock)")


def check_container_gpus(target: Target, recipe: Recipe, image: str | None = None) -> list[Row]:
    """The container runtime hands the GPUs to a container: ``docker run --gpus all <image> nvidia-smi -L``."""
    host, g = target.name, recipe.hardware.gpus
    if g.count == 0:
        return [skip(host, "gpu.container", "no GPU", f"recipe {recipe.name} uses no GPU")]
    if not target.run("test -e /dev/nvidia0 || test -e /dev/nvidiactl").ok:
        return [skip(host, "gpu.container", f"{g.count} GPU(s) in a container", NO_GPU)]
    image = image or recipe.image_ref
    if not target.run(f"docker image inspect {shlex.quote(image)} >/dev/null").ok:
        return [Row(host, "gpu.container", f"{g.count} GPU(s) in {image}", f"image {image} not on the host", ERROR,
                    "deploy the recipe first (make deploy) so its engine image exists, then check again")]
    out = target.run(f"docker run --rm --gpus all --entrypoint nvidia-smi {shlex.quote(image)} -L", timeout=180)
    seen = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    ok = out.ok and len(seen) == g.count
    return [Row(host, "gpu.container", f"{g.count} GPU(s) in {image}",
                f"{len(seen)} GPU(s)" if out.ok else (out.stderr.strip()[:160] or f"rc {out.rc}"),
                PASS if ok else FAIL, "" if ok else
                "configure the NVIDIA container toolkit (nvidia_toolkit role: `nvidia-ctk runtime configure "
                "--runtime=docker`, restart Docker)", "NVIDIA Container Toolkit install guide")]


def check_memory(target: Target, recipe: Recipe) -> list[Row]:
    """NUMA node count, RAM per NUMA node (GiB), numactl, memlock."""
    host, hw = target.name, recipe.hardware
    out = target.run("for f in /sys/devices/system/node/node[0-9]*/meminfo; do "
                     "printf '%s ' \"$f\"; grep MemTotal \"$f\" | awk '{print $4}'; done")
    nodes = {}
    for line in out.stdout.splitlines():
        path, _, kib = line.rpartition(" ")
        if kib.isdigit():
            nodes[path.split("/")[-2]] = int(kib) / 2**20  # kB (KiB) -> GiB
    rows = []
    if not nodes:
        rows.append(Row(host, "memory.numa_nodes", f">= {hw.numa_nodes}", "no /sys/devices/system/node", ERROR,
                        "a kernel without NUMA sysfs: check `numactl -H`"))
    else:
        ok = len(nodes) >= hw.numa_nodes
        rows.append(Row(host, "memory.numa_nodes", f">= {hw.numa_nodes}", str(len(nodes)), PASS if ok else FAIL,
                        "" if ok else "enable NUMA in the BIOS (no node interleaving) or use a recipe for this host",
                        "recipe hardware.numa_nodes"))
    if hw.ram_per_numa_gib is None:
        rows.append(skip(host, "memory.ram_per_numa", "any", "recipe sets no hardware.ram_per_numa_gib"))
    else:
        need = hw.ram_per_numa_gib * NUMA_RAM_SLACK
        small = {n: v for n, v in nodes.items() if v < need}
        shown = ", ".join(f"{n} {v:.1f} GiB" for n, v in sorted(nodes.items()))
        rows.append(Row(host, "memory.ram_per_numa", f">= {need:.1f} GiB per node (95 % of {hw.ram_per_numa_gib})",
                        shown or "none", PASS if nodes and not small else FAIL,
                        "" if nodes and not small else "populate every memory channel of each socket equally "
                        "(docs/sources.md#rtx3090-xeon: one engine instance per NUMA node needs its RAM on that node)",
                        "recipe hardware.ram_per_numa_gib"))
    if recipe.instances is not None or hw.numa_nodes > 1:
        found = target.run("command -v numactl")
        rows.append(Row(host, "memory.numactl", "installed", found.stdout.strip() or "missing",
                        PASS if found.ok else FAIL, "" if found.ok else "install numactl (memory_numa role)",
                        "docs/sources.md#rtx3090-xeon: each instance pinned with numactl --membind"))
    else:
        rows.append(skip(host, "memory.numactl", "installed", "one NUMA node and one instance: no pinning"))
    # A fabric / InfiniBand recipe needs it whatever container.memlock_unlimited says (preflight rule rdma-memlock).
    if recipe.container.memlock_unlimited or needs_unlimited_memlock(recipe):
        lim = target.run("ulimit -l").stdout.strip()
        ok = lim == "unlimited"
        rows.append(Row(host, "memory.memlock", "unlimited", lim or "?", PASS if ok else FAIL, "" if ok else
                        "set container.memlock_unlimited: true and run the memory_numa role (limits.d memlock "
                        "unlimited), then log in again",
                        "recipe container.memlock_unlimited (RDMA registers pinned memory); " + SRC_MEMLOCK))
    else:
        rows.append(skip(host, "memory.memlock", "unlimited", "recipe does not ask for unlimited memlock"))
    return rows


def check_kernel(target: Target, recipe: Recipe) -> list[Row]:
    """The running kernel is none of the recipe's hardware.known_bad_kernels (``uname -r`` prefix match)."""
    host, bad = target.name, recipe.hardware.known_bad_kernels
    if not bad:
        return [skip(host, "kernel.known_bad", "any kernel", "recipe lists no known-bad kernel")]
    release = target.run("uname -r").stdout.strip()
    hit = next((k for k in bad if release.startswith(k.release)), None)
    expected = "none of " + ", ".join(k.release for k in bad)
    if hit:
        return [Row(host, "kernel.known_bad", expected, release, FAIL,
                    f"boot another kernel: {hit.reason}", hit.source)]
    return [Row(host, "kernel.known_bad", expected, release or "?", PASS if release else ERROR)]


def check_model_dir(target: Target, recipe: Recipe) -> list[Row]:
    """The model directory exists and is owned by the engine container's uid:gid (engine.image.user)."""
    host, path = target.name, recipe.model.path
    want = recipe.engine.image.user
    out = target.run(f"stat -c %u:%g {shlex.quote(path)}")
    if not out.ok:
        return [Row(host, "storage.model_dir", f"{path} owned by {want}", "missing", FAIL,
                    "run the model_storage role (it creates the directory with that owner)")]
    got = out.stdout.strip()
    return [Row(host, "storage.model_dir", f"{path} owned by {want}", got, PASS if got == want else FAIL,
                "" if got == want else f"chown -R {want} {path} (model_storage role)",
                "docs/sources.md#hf-cache-owner: the HF cache must be owned by the container user")]


def check_host(target: Target, recipe: Recipe) -> list[Row]:
    """Every host row: GPUs, container GPUs, memory, kernel, model directory."""
    return (check_gpus(target, recipe) + check_container_gpus(target, recipe) + check_memory(target, recipe)
            + check_kernel(target, recipe) + check_model_dir(target, recipe))
