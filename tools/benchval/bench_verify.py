"""Benchmark: `ds4deploy model verify` against the machine's limit (`make bench-verify`).

Creates a set of files (default 8 x 512 MiB = 4 GiB of random bytes, in ``/tmp/ds4deploy-bench-verify``, removed
afterwards) with a manifest, then measures, each `--repeats` times (medians reported, min-max kept in the JSON):

- disk read speed, cold: ``dd bs=4M`` over all files in sequence, and a plain parallel read loop (1 MiB reads, one
  thread per core); the disk figure is the higher of the two (the most the disk delivered);
- single-core sha256: hashlib over an in-memory 256 MiB buffer in 1 MiB updates (and, for reference, the same on
  every core at once);
- the limit: cold ``min(disk read, cores x single-core sha256)``; warm (files in the page cache)
  ``cores x single-core sha256``;
- ``ds4deploy model verify --full --json`` (the real CLI, in a subprocess) for 1..4 hashing threads, cold and warm:
  bytes/s as the command reports it (bytes hashed / time spent verifying) and by wall clock (process start to
  exit, i.e. including Python start-up and imports);
- plain sequential ``sha256sum`` over the same files, cold and warm;
- a re-check that the sidecar answers (no ``--full``).

"Cold" drops the page cache before each run (``echo 3 > /proc/sys/vm/drop_caches``, needs root); where that is not
allowed only warm numbers are produced and the report says so. Results go to ``docs/results/bench-verify.json`` and the
marked section of ``docs/bench-verify.md``. Target: verify at >= 0.9 x the limit.

Units: GB/s = 10**9 bytes per second; file sizes in MiB/GiB (2**20 / 2**30 bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from ds4deploy.bench.docs_section import RESULTS_DIR, write_section
from ds4deploy.model.verify import CHUNK, default_workers

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
BEGIN, END = "<!-- bench-verify:begin -->", "<!-- bench-verify:end -->"


def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache; False when the kernel does not allow it (not root, or a
    read-only /proc/sys in a container)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError:
        return False
    return True


def warm(paths: list[Path]) -> None:
    """Read every file once so it sits in the page cache."""
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            buf = bytearray(8 * MIB)
            while fh.readinto(buf):
                pass


def make_files(d: Path, count: int, size_mib: int) -> dict[str, dict]:
    """Write `count` files of `size_mib` MiB of random bytes; returns their manifest entries (size, sha256)."""
    import numpy as np

    d.mkdir(parents=True, exist_ok=True)
    files = {}
    rng = np.random.default_rng(20261129)
    for i in range(count):
        name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        h = hashlib.sha256()
        with open(d / name, "wb") as fh:
            for _ in range(size_mib // 64):
                block = rng.bytes(64 * MIB)
                h.update(block)
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        files[name] = {"size": (size_mib // 64) * 64 * MIB, "sha256": h.hexdigest()}
    return files


def sha256_single_core(buf: bytes) -> float:
    """bytes/s of one hashlib.sha256 over `buf` in CHUNK updates."""
    mv = memoryview(buf)
    t = time.perf_counter()
    h = hashlib.sha256()
    for i in range(0, len(buf), CHUNK):
        h.update(mv[i:i + CHUNK])
    return len(buf) / (time.perf_counter() - t)


def sha256_all_cores(buf: bytes, threads: int) -> float:
    """bytes/s of `threads` threads each hashing `buf` at once (what the cores really give together)."""
    barrier = threading.Barrier(threads + 1)

    def work():
        barrier.wait()
        sha256_single_core(buf)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return threads * len(buf) / (time.perf_counter() - t0)


def parallel_read(paths: list[Path], threads: int) -> float:
    """bytes/s of a plain read loop (1 MiB readinto, no hashing) over `paths` with `threads` threads."""
    from concurrent.futures import ThreadPoolExecutor

    def read(p: Path) -> int:
        n = 0
        buf = bytearray(CHUNK)
        with open(p, "rb", buffering=0) as fh:
            while k := fh.readinto(buf):
                n += k
        return n

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        total = sum(ex.map(read, paths))
    return total / (time.perf_counter() - t)


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    """Wall seconds and stdout of a command that must succeed."""
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {p.returncode}: {p.stderr[-2000:]}")
    return dt, p.stdout


class OtherLoad:
    """CPU used by other processes while a measurement runs, in cores: (all busy CPU time from /proc/stat - this
    process's and its children's CPU time) / wall time. This host is shared; the number says how disturbed a run was.
    """

    def __init__(self) -> None:
        self.hz = os.sysconf("SC_CLK_TCK")

    def _snap(self) -> tuple[float, float, float]:
        import resource

        with open("/proc/stat") as fh:
            vals = [int(x) for x in fh.readline().split()[1:]]
        busy = (sum(vals[:8]) - vals[3] - vals[4]) / self.hz  # all but idle and iowait (guest is inside user)
        own = sum(getattr(resource.getrusage(w), a) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                  for a in ("ru_utime", "ru_stime"))
        return busy, own, time.perf_counter()

    def __enter__(self) -> OtherLoad:
        self.start = self._snap()
        return self

    def __exit__(self, *exc) -> None:
        b1, o1, t1 = self._snap()
        b0, o0, t0 = self.start
        self.cores = max(0.0, ((b1 - b0) - (o1 - o0)) / max(1e-9, t1 - t0))


def cpu_busy_share(seconds: float = 1.0) -> float:
    """Share of all CPU time (0-1) spent busy over `seconds` (from /proc/stat): other load on the machine."""
    def snap():
        with open("/proc/stat") as fh:
            vals = [int(x) for x in fh.readline().split()[1:]]
        return sum(vals), vals[3] + vals[4]

    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def run(args: argparse.Namespace) -> dict:
    """Create the files, measure everything, return the results document."""
    data_dir = Path(args.dir)
    if data_dir.exists():
        raise SystemExit(f"error: {data_dir} exists; remove it or pass --dir")
    cores = default_workers()
    work = Path(tempfile.mkdtemp(prefix="ds4deploy-bench-verify-"))
    try:
        t = time.perf_counter()
        files = make_files(data_dir, args.files, args.file_mib)
        print(f"created {args.files} x {args.file_mib} MiB in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        paths = [data_dir / n for n in sorted(files)]
        total = sum(f["size"] for f in files.values())
        # A throwaway recipe directory: the cpu recipe under another name, with this file set as its manifest.
        recipes = work / "recipes"
        recipes.mkdir()
        doc = yaml.safe_load((REPO / "recipes" / "cpu.yaml").read_text())
        doc["name"] = "bench-verify"
        (recipes / "bench-verify.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        (recipes / "bench-verify.manifest.json").write_text(json.dumps({"recipe": "bench-verify",
                                                                         "source": "generated", "files": files}))
        env = {**os.environ, "DS4_RECIPES_DIR": str(recipes), "DS4_COMPOSE_DIR": str(work / "compose"),
               "DS4_CACHE_DIR": str(work / "cache")}
        ds4 = [sys.executable, "-m", "ds4deploy.cli", "model", "verify", "bench-verify", "--dir", str(data_dir)]
        can_drop = drop_caches()
        temps = ["warm"] + (["cold"] if can_drop else [])
        thread_counts = sorted({1, 2, 3, 4, cores})
        buf = os.urandom(256 * MIB)
        raw: dict[str, list[float]] = {}

        def add(key: str, value: float, load: OtherLoad | None = None) -> None:
            raw.setdefault(key, []).append(value)
            if load is not None:
                raw.setdefault(f"{key}__other_cores", []).append(load.cores)

        def prepare(temp: str) -> None:
            if temp == "cold":
                drop_caches()
            else:
                warm(paths)

        add("other_cpu_busy_share_before", cpu_busy_share())
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}", file=sys.stderr)
            with OtherLoad() as load:
                v = sha256_single_core(buf)
            add("sha256_single_core", v, load)
            with OtherLoad() as load:
                v = sha256_all_cores(buf, cores)
            add("sha256_all_cores", v, load)
            for temp in temps:
                prepare(temp)
                with OtherLoad() as load:
                    dt = sum(timed(["dd", f"if={p}", "of=/dev/null", "bs=4M", "status=none"])[0] for p in paths)
                add(f"dd_read_{temp}", total / dt, load)
                if temp == "cold":
                    # dd dropping what it has read (posix_fadvise DONTNEED), as verify does for uncached files:
                    # the page cache's cost of fresh pages varies here (0.2-1.6 s of kernel time per 4.3 GB).
                    prepare(temp)
                    with OtherLoad() as load:
                        dt = sum(timed(["dd", f"if={p}", "of=/dev/null", "bs=4M", "iflag=nocache",
                                        "status=none"])[0] for p in paths)
                    add("dd_nocache_read_cold", total / dt, load)
                prepare(temp)
                with OtherLoad() as load:
                    v = parallel_read(paths, cores)
                add(f"parallel_read_{temp}", v, load)
                prepare(temp)
                with OtherLoad() as load:
                    dt, _ = timed(["sha256sum", *map(str, paths)])
                add(f"sha256sum_{temp}", total / dt, load)
                for w in thread_counts:
                    prepare(temp)
                    with OtherLoad() as load:
                        dt, out = timed([*ds4, "--full", "--json", "--workers", str(w)], env)
                    res = json.loads(out)
                    if not res["ok"]:
                        raise RuntimeError(f"verify failed: {res}")
                    add(f"verify_{temp}_w{w}", res["bytes_per_s"], load)
                    add(f"verify_wall_{temp}_w{w}", total / dt)
            dt, out = timed([*ds4, "--json"], env)
            res = json.loads(out)
            assert set(res["files"].values()) == {"cached"}, res
            add("sidecar_recheck_seconds", dt)
        add("other_cpu_busy_share_after", cpu_busy_share())
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in raw.items()}
    best = {k: max(v) for k, v in raw.items()}
    summary: dict = {"cores": cores, "default_workers": cores, "page_cache_dropped": can_drop,
                     "sha256_single_core": med["sha256_single_core"], "sha256_all_cores": med["sha256_all_cores"]}
    for temp in temps:
        disk = max(med[f"dd_read_{temp}"], med[f"parallel_read_{temp}"], med.get(f"dd_nocache_read_{temp}", 0.0))
        hash_limit = cores * med["sha256_single_core"]
        limit = min(disk, hash_limit) if temp == "cold" else hash_limit
        v = med[f"verify_{temp}_w{cores}"]
        summary[temp] = {
            "disk_read": disk, "dd_read": med[f"dd_read_{temp}"], "parallel_read": med[f"parallel_read_{temp}"],
            "limit": limit, "limit_is": "disk read" if limit == disk else "cores x single-core sha256",
            "verify": v, "verify_wall": med[f"verify_wall_{temp}_w{cores}"], "ratio_to_limit": v / limit,
            "ratio_wall_to_limit": med[f"verify_wall_{temp}_w{cores}"] / limit,
            "ratio_to_all_cores_sha256": v / min(disk, med["sha256_all_cores"]),
            "sha256sum": med[f"sha256sum_{temp}"], "speedup_vs_sha256sum": v / med[f"sha256sum_{temp}"],
            "verify_by_threads": {w: med[f"verify_{temp}_w{w}"] for w in thread_counts},
            # Best of the repeats, each quantity on its own: the least-disturbed runs on this shared host.
            "dd_nocache_read": med.get(f"dd_nocache_read_{temp}"),
            "best": {"verify": best[f"verify_{temp}_w{cores}"],
                     "limit": (min(max(best[f"dd_read_{temp}"], best[f"parallel_read_{temp}"],
                                       best.get(f"dd_nocache_read_{temp}", 0.0)),
                                   cores * best["sha256_single_core"]) if temp == "cold"
                               else cores * best["sha256_single_core"])},
            "other_cores_during_verify": med[f"verify_{temp}_w{cores}__other_cores"],
        }
        summary[temp]["best"]["ratio"] = summary[temp]["best"]["verify"] / summary[temp]["best"]["limit"]
    summary["sidecar_recheck_seconds"] = med["sidecar_recheck_seconds"]
    return {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": {"machine": platform.machine(), "cpu": _cpu_model(), "cores": cores,
                 "python": platform.python_version(), "openssl": ssl.OPENSSL_VERSION,
                 "sha256sum": _first_line(["sha256sum", "--version"]), "loadavg": os.getloadavg()},
        "set": {"files": args.files, "file_mib": args.file_mib, "total_bytes": total, "dir": str(data_dir)},
        "repeats": args.repeats, "units": "bytes/s unless named otherwise", "summary": summary, "raw": raw,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _first_line(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "unavailable"


def gbs(x: float) -> str:
    """bytes/s as GB/s (10**9 bytes per second), two decimals."""
    return f"{x / 1e9:.2f} GB/s"


def markdown(doc: dict) -> str:
    """The marked section of docs/bench-verify.md."""
    s, h, st = doc["summary"], doc["host"], doc["set"]
    lines = [
        BEGIN,
        "## Model verification speed (`make bench-verify`)",
        "",
        f"{doc['when']}, {h['cpu']} ({h['machine']}), {h['cores']} usable cores, Python {h['python']}, "
        f"{h['openssl']}, {h['sha256sum']}. {st['files']} files x {st['file_mib']} MiB = "
        f"{st['total_bytes'] / 2**30:.0f} GiB of random bytes; medians of {doc['repeats']} repeats. "
        f"Page cache {'dropped before each cold run' if s['page_cache_dropped'] else 'could NOT be dropped: warm only'}"
        f". Load average at the end: {', '.join(f'{x:.2f}' for x in h['loadavg'])} (other work shares this host). "
        "GB/s = 10^9 bytes/s.",
        "",
        f"Single-core sha256 (hashlib, in memory): {gbs(s['sha256_single_core'])}; all {h['cores']} cores at once: "
        f"{gbs(s['sha256_all_cores'])}.",
        "",
        "| | " + " | ".join(t for t in ("cold", "warm") if t in s) + " |",
        "|---|" + "---|" * sum(t in s for t in ("cold", "warm")),
    ]
    temps = [t for t in ("cold", "warm") if t in s]

    def row(label, f):
        lines.append(f"| {label} | " + " | ".join(f(s[t]) for t in temps) + " |")

    row("disk read (max of `dd bs=4M` sequential, the same with `iflag=nocache` (cold), parallel read loop)",
        lambda x: f"{gbs(x['disk_read'])} (dd {gbs(x['dd_read'])}"
                  + (f", dd nocache {gbs(x['dd_nocache_read'])}" if x.get("dd_nocache_read") else "")
                  + f", parallel {gbs(x['parallel_read'])})")
    row("limit = min(disk read, cores x single-core sha256); warm: cores x sha256",
        lambda x: f"{gbs(x['limit'])} ({x['limit_is']})")
    row(f"`ds4deploy model verify --full`, {h['cores']} threads (bytes hashed / verify time)",
        lambda x: f"**{gbs(x['verify'])}** = **{x['ratio_to_limit']:.2f} x limit**")
    row("same, by wall clock of the whole command (incl. Python start-up)",
        lambda x: f"{gbs(x['verify_wall'])} = {x['ratio_wall_to_limit']:.2f} x limit")
    row("verify / min(disk, measured all-core sha256)", lambda x: f"{x['ratio_to_all_cores_sha256']:.2f}")
    row("plain sequential `sha256sum`", lambda x: f"{gbs(x['sha256sum'])} (verify is {x['speedup_vs_sha256sum']:.1f}x)")
    row("verify by hashing threads", lambda x: ", ".join(f"{w}: {gbs(v)}" for w, v in x["verify_by_threads"].items()))
    row("best of the repeats: verify / limit",
        lambda x: f"{gbs(x['best']['verify'])} / {gbs(x['best']['limit'])} = {x['best']['ratio']:.2f}")
    row("CPU used by other processes during the verify runs (cores, median)",
        lambda x: f"{x['other_cores_during_verify']:.2f} of {h['cores']}")
    lines += [
        "",
        f"Re-check of the unchanged set through the sidecar (no `--full`): {s['sidecar_recheck_seconds']:.2f} s "
        "wall clock, all files `cached`.",
        "",
        "Raw per-repeat numbers: `docs/results/bench-verify.json`.",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_outputs(doc: dict, json_path: Path, md_path: Path) -> None:
    """Write the JSON and replace the marked section of the markdown file (created with a title if absent)."""
    json_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    write_section(md_path, BEGIN, END, markdown(doc), "Model verification benchmark")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tools.benchval.bench_verify` (see the module docstring)."""
    p = argparse.ArgumentParser(prog="bench-verify", description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "ds4deploy-bench-verify"),
                   help="where the files are created (removed afterwards)")
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--file-mib", type=int, default=512, help="MiB per file (a multiple of 64)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=str(RESULTS_DIR / "bench-verify.json"))
    p.add_argument("--md", default=str(REPO / "docs" / "bench-verify.md"))
    args = p.parse_args(argv)
    doc = run(args)
    write_outputs(doc, Path(args.json), Path(args.md))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
