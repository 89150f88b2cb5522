"""Stand-in nodes for the rehearsal: each node is a network namespace, a mount namespace and its own Docker daemon
on this machine, with the recipe's hardware stood in (tests/rehearse/hardware.py).

Per node ``<n>`` (node-a, node-b):
- network namespace ``ds4-rehearse-<n>`` (loopback; for a two-node recipe with a fabric, one veth pair per rail
  joins the nodes, each end named as the rail's netdev, down and unaddressed: the rails role configures them, as
  on tests/hosts' test hosts);
- a persistent mount namespace (/run/ds4-rehearse/mnt/<n>) whose /sys is the namespace's sysfs (cgroups bound back),
  with /proc/cpuinfo, /proc/meminfo and, for a NUMA recipe, /sys/devices/system/node replaced by the stand-in files;
  its own tmpfs for /var/lib/ds4deploy (sized to the recipe's free-disk minimum: the model directory), /etc/netplan,
  /etc/security/limits.d, and /dev/infiniband with one uverbs character device for a recipe that maps it;
- a Docker daemon in both namespaces (data root /var/lib/ds4-rehearse/<n>/docker, socket
  /run/ds4-rehearse/<n>/docker.sock, no bridge, no iptables) whose PATH holds the stand-in
  nvidia-container-runtime-hook, so it registers the nvidia device driver (moby daemon/nvidia_linux.go);
- ``enter``: runs a command inside the node (both namespaces, DOCKER_HOST of its daemon, the stand-in nvidia-smi
  first on PATH); the connection plugin tests/rehearse/plugins/connection/rehearse_node.py uses it.
Everything else of this machine (/etc, /opt, /root, /usr, the repository) is shared, as on a real host that is also
the control host; `up(..., own=...)` gives each node directories of its own in place of named ones (tests/office:
/etc/ds4deploy and /opt/ds4deploy, as on hosts apart from the control host). `down()` stops the daemons, removes the
namespaces and everything listed above, and only that.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ds4deploy.recipe.schema import Recipe
from tests.rehearse import hardware

RUN = Path("/run/ds4-rehearse")
MNT = RUN / "mnt"
DATA = Path("/var/lib/ds4-rehearse")
# Seconds a load of the stand-in images may take (the 4 GB base into two nodes: 160-220 s here, 2026-12-02).
LOAD_TIMEOUT_S = 1800
STANDIN = Path(__file__).resolve().parent / "standin"
PREFIX = "ds4-rehearse-"
# This machine's end of a node's link to it (`link_to_host`): ds4h-a, ds4h-b. tests/offline's network block lets
# these through (they lead to stand-in hosts on this machine, not out of it).
HOST_LINK = "ds4h-"
NAMES = ("node-a", "node-b")
# Device numbers of /dev/infiniband/uverbs0 (Linux Documentation/admin-guide/devices.txt: 231 char, 192 = uverbs0).
UVERBS0 = (231, 192)


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


@dataclass(frozen=True)
class Node:
    """One stand-in node."""

    name: str

    @property
    def netns(self) -> str:
        return PREFIX + self.name

    @property
    def dir(self) -> Path:
        return RUN / self.name

    @property
    def mnt(self) -> Path:
        return MNT / self.name

    @property
    def docker_host(self) -> str:
        return f"unix://{self.dir}/docker.sock"

    @property
    def enter(self) -> Path:
        return self.dir / "enter"

    def own(self, path: str | Path) -> Path:
        """Where this machine sees the node's own copy of directory `path` (or of a file under it) that `up(...,
        own=...)` made the node's own: under the node's directory, removed with it."""
        return self.dir / "own" / Path(path).relative_to("/")

    def sh(self, cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `cmd` with sh inside the node."""
        return _run([str(self.enter), "/bin/sh", "-c", cmd], check=check, timeout=timeout)

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """The docker CLI against this node's daemon (from this machine's namespaces)."""
        return _run(["docker", *args], check=check, timeout=timeout,
                    env={**os.environ, "DOCKER_HOST": self.docker_host})


def nodes_for(recipe: Recipe, count: int | None = None) -> list[Node]:
    """The stand-in nodes of `recipe`: node-a (the head, or the single node), node-b (the worker). `count` (at most
    len(NAMES)) asks for that many instead: two hosts each running a one-node recipe (tests/office)."""
    return [Node(n) for n in NAMES[: count or recipe.hardware.nodes]]


def _enter_script(node: Node) -> str:
    return (f"#!/bin/sh\n# Run a command inside rehearsal stand-in node {node.name} (tests/rehearse/nodes.py).\n"
            f"export DOCKER_HOST={node.docker_host} DS4_REHEARSE_NODE_DIR={node.dir}\n"
            f"export PATH={node.dir}/bin:$PATH\n"
            f"exec nsenter --net=/run/netns/{node.netns} --mount={node.mnt} \"$@\"\n")


def _mount_script(node: Node, recipe: Recipe, files: dict, own: tuple[str, ...] = ()) -> str:
    """Shell run once inside the node's fresh namespaces: its own sysfs, the stand-in files and directories, and an
    empty directory of its own on each of `own`."""
    d = node.dir
    lines = [
        "set -eu",
        # Its network namespace's sysfs (/sys/class/net shows the node's links), cgroups bound back for dockerd.
        f"mkdir -p {d}/cgroup && mount --rbind /sys/fs/cgroup {d}/cgroup",
        "umount -l /sys && mount -t sysfs sysfs /sys",
        f"mount --rbind {d}/cgroup /sys/fs/cgroup && umount -l {d}/cgroup",
        f"mount --bind {files['cpuinfo']} /proc/cpuinfo",
        f"mount --bind {files['meminfo']} /proc/meminfo",
        f"mount -t tmpfs -o size={int(recipe.hardware.min_free_disk_gib * 1.1) + 1}g ds4-rehearse /var/lib/ds4deploy",
        f"mkdir -p {d}/netplan {d}/limits.d && mount --bind {d}/netplan /etc/netplan",
        f"mount --bind {d}/limits.d /etc/security/limits.d",
        *(f"mkdir -p {node.own(p)} && mount --bind {node.own(p)} {p}" for p in own),
    ]
    if files["numa"] is not None:
        lines.append(f"mount --bind {files['numa']} /sys/devices/system/node")
    if recipe.container.infiniband:
        lines.append("mount -t tmpfs -o mode=755 ds4-rehearse /dev/infiniband && "
                     f"mknod -m 666 /dev/infiniband/uverbs0 c {UVERBS0[0]} {UVERBS0[1]}")
    return "\n".join(lines) + "\n"


def _wire_rails(recipe: Recipe, nodes: list[Node]) -> None:
    for i, rail in enumerate(recipe.fabric.rails):
        a, b = f"rh-a{i}", f"rh-b{i}"
        _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        for end, node in ((a, nodes[0]), (b, nodes[1])):
            _run(["ip", "link", "set", end, "netns", node.netns])
            _run(["ip", "-n", node.netns, "link", "set", end, "name", rail.netdev])


def _start_dockerd(node: Node) -> None:
    (node.dir / "daemon.json").write_text("{}\n")
    data = DATA / node.name / "docker"
    data.mkdir(parents=True, exist_ok=True)
    log = (node.dir / "dockerd.log").open("ab")
    subprocess.Popen(
        [str(node.enter), "dockerd", "--config-file", str(node.dir / "daemon.json"), "--data-root", str(data),
         "--exec-root", str(node.dir / "exec"), "--pidfile", str(node.dir / "dockerd.pid"),
         "--host", node.docker_host, "--bridge", "none",
         "--add-runtime", f"runc-rehearse={node.dir}/bin/runc-rehearse", "--default-runtime", "runc-rehearse",
         "--iptables=false",
         "--ip-masq=false", "--userland-proxy=false", "--log-level", "warn"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(120):
        try:
            if node.docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=10).returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"dockerd of {node.name} did not answer: {(node.dir / 'dockerd.log').read_text()[-2000:]}")


def _empty(node: Node) -> None:
    """Remove every container and volume a kept data root still holds (a run stopped before its `make down`): a node
    starts with its images only, or the daemon would start the last recipe's containers again by their restart
    policy."""
    for ls, rm in ((["ps", "--all", "--quiet"], ["rm", "--force"]),
                   (["volume", "ls", "--quiet"], ["volume", "rm", "--force"])):
        ids = node.docker(*ls, check=False, timeout=60).stdout.split()
        if ids:
            node.docker(*rm, *ids, check=False, timeout=300)


def up(recipe: Recipe, count: int | None = None, own: tuple[str, ...] = ()) -> list[Node]:
    """Create the stand-in nodes of `recipe` (`nodes_for`; after removing any earlier ones, keeping their Docker
    data) and start their Docker daemons. `own`: absolute directories each node gets an empty one of its own in
    place of this machine's (`Node.own` says where this machine sees it)."""
    down(remove_data=False)
    nodes = nodes_for(recipe, count)
    RUN.mkdir(parents=True, exist_ok=True)
    MNT.mkdir(parents=True, exist_ok=True)
    # A namespace file can only be bound on a private mount (as ip-netns does for /run/netns).
    _run(["mount", "--bind", str(MNT), str(MNT)])
    _run(["mount", "--make-private", str(MNT)])
    for p in (Path("/var/lib/ds4deploy"), Path("/etc/netplan"), Path("/etc/security/limits.d"), *map(Path, own)):
        p.mkdir(parents=True, exist_ok=True)
    created_ib = recipe.container.infiniband and not Path("/dev/infiniband").exists()
    if created_ib:
        Path("/dev/infiniband").mkdir()
    (RUN / "state.json").write_text(json.dumps({"created_dev_infiniband": created_ib}))
    for node in nodes:
        node.dir.mkdir(parents=True, exist_ok=True)
        files = hardware.write_node_files(recipe, node.dir)
        for stub in ("nvidia-smi", "nvidia-container-runtime-hook", "runc-rehearse"):
            if stub != "nvidia-smi" or recipe.hardware.gpus.count:  # a CPU host has none
                shutil.copy(STANDIN / stub, node.dir / "bin" / stub)
        node.enter.write_text(_enter_script(node))
        node.enter.chmod(0o755)
        _run(["ip", "netns", "add", node.netns])
        _run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
        node.mnt.touch()
        _run(["unshare", f"--mount={node.mnt}", "--propagation", "slave", "true"])
        script = node.dir / "mounts.sh"
        script.write_text(_mount_script(node, recipe, files, own))
        _run(["nsenter", f"--net=/run/netns/{node.netns}", f"--mount={node.mnt}", "/bin/sh", str(script)])
    if len(nodes) == 2 and recipe.fabric is not None:
        _wire_rails(recipe, nodes)
    for node in nodes:
        _start_dockerd(node)
        _empty(node)
    return nodes


def host_address(node: Node) -> str:
    """The address of `node` on its link to this machine (`link_to_host`): 10.241.<1 + its index in NAMES>.2. The
    10.241.0.0/16 block is private (RFC 1918) and unused by this machine's own networks (eth0, docker0)."""
    return f"10.241.{NAMES.index(node.name) + 1}.2"


def link_to_host(nodes: list[Node]) -> dict[str, str]:
    """Join each node to this machine's network namespace, as hosts of one office network are joined: a veth pair
    per node, ``ds4h-<a|b>`` here with 10.241.<i>.1/24 and ``ds4h0`` in the node with `host_address`. Containers on
    host networking on either side reach the other end's address. Removed with the node's namespace (`down`).

    Returns:
        node name -> its address.
    Raises:
        RuntimeError: this machine already routes part of 10.241.0.0/16 (the links would clash with it)."""
    taken = [ln for ln in _run(["ip", "-4", "route", "show"]).stdout.splitlines() if ln.startswith("10.241.")]
    if taken:
        raise RuntimeError(f"this machine already routes {'; '.join(taken)}: the stand-in hosts' links to it "
                           "(10.241.<i>.0/24) would clash. Fix: remove that route (a link left by an interrupted run: "
                           "`ip link del ds4h-a`), or move `host_address` to a free private block")
    out = {}
    for node in nodes:
        here, there = HOST_LINK + node.name[-1], "ds4h0"
        addr = host_address(node)
        _run(["ip", "link", "add", here, "type", "veth", "peer", "name", there])
        _run(["ip", "link", "set", there, "netns", node.netns])
        _run(["ip", "addr", "add", addr.rsplit(".", 1)[0] + ".1/24", "dev", here])
        _run(["ip", "link", "set", here, "up"])
        _run(["ip", "-n", node.netns, "addr", "add", addr + "/24", "dev", there])
        _run(["ip", "-n", node.netns, "link", "set", there, "up"])
        out[node.name] = addr
    return out


def _stop_dockerd(node: Node) -> None:
    pidfile = node.dir / "dockerd.pid"
    if not pidfile.is_file():
        return
    ids = node.docker("ps", "-aq", check=False, timeout=30).stdout.split()
    if ids:
        node.docker("rm", "-f", *ids, check=False, timeout=120)
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
    except (ValueError, ProcessLookupError):
        return
    for _ in range(60):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)


def down(remove_data: bool = True) -> None:
    """Stop every stand-in node's daemon and remove the nodes (namespaces, their directories and Docker data)."""
    state = json.loads((RUN / "state.json").read_text()) if (RUN / "state.json").is_file() else {}
    existing = _run(["ip", "netns", "list"], check=False).stdout.split()
    for name in NAMES:
        node = Node(name)
        if node.dir.is_dir():
            _stop_dockerd(node)
        if node.netns in existing:
            _run(["ip", "netns", "del", node.netns], check=False)
        _run(["ip", "link", "del", HOST_LINK + name[-1]], check=False)  # gone with the namespace, unless half made
        if node.mnt.exists():
            _run(["umount", str(node.mnt)], check=False)
        if remove_data and (DATA / name).exists():
            shutil.rmtree(DATA / name, ignore_errors=True)
    if MNT.is_dir():
        _run(["umount", str(MNT)], check=False)
    if state.get("created_dev_infiniband") and Path("/dev/infiniband").is_dir():
        Path("/dev/infiniband").rmdir()
    shutil.rmtree(RUN, ignore_errors=True)


def load_images(targets: list[Node], refs: list[str]) -> None:
    """Load images `refs` into the daemons of `targets`, all at once, streamed from this machine's `docker save` with
    no archive on disk: read in 1 MiB chunks, each written to every node's `docker load`.

    Disk: each node's daemon unpacks the whole stream into a temporary directory under its data root before it
    registers the layers (moby image/tarexport/load.go untars the archive into a temp dir first), so a load needs
    about twice the images' size free per node while it runs (`free_disk_needed`).

    Raises RuntimeError naming each node whose load failed with the tail of its daemon's answer (e.g. "no space left
    on device"), or the save's."""
    save = subprocess.Popen(["docker", "save", *refs], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stream = save.stdout
    loads = {node: subprocess.Popen(["docker", "load", "--quiet"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env={**os.environ, "DOCKER_HOST": node.docker_host})
             for node in targets}
    live = dict(loads)
    procs = [*loads.values(), save]
    # A daemon that stops reading would block a write for ever: after LOAD_TIMEOUT_S every process is killed, which
    # ends the writes (broken pipe) and the waits below.
    expired = threading.Event()

    def kill_all() -> None:
        expired.set()
        for proc in procs:
            proc.kill()

    timer = threading.Timer(LOAD_TIMEOUT_S, kill_all)
    timer.start()
    try:
        with stream:
            while live and (chunk := stream.read(1 << 20)):
                for node, load in list(live.items()):
                    try:
                        load.stdin.write(chunk)
                    except BrokenPipeError:  # that load failed: its answer is read below
                        del live[node]
        if not live:
            save.kill()  # every load failed: nobody reads the rest of the save
        failed = []
        for node, load in loads.items():
            try:
                load.stdin.close()
            except BrokenPipeError:
                pass
            if load.wait():
                failed.append(f"{node.name}: {load.stderr.read().decode(errors='replace').strip()[-600:]}")
        if save.wait() and live:
            failed.append(f"this machine's docker save: {save.stderr.read().decode(errors='replace').strip()[-600:]}")
    finally:
        timer.cancel()
    if expired.is_set():
        failed.append(f"not done after {LOAD_TIMEOUT_S} s: every load was stopped")
    if failed:
        raise RuntimeError("loading images into the stand-in nodes failed: " + "; ".join(failed))


def free_disk_needed(refs: list[str], targets: int) -> int:
    """Bytes that loading `refs` into `targets` node daemons at once needs free under DATA: twice the images' size
    per node (`load_images`). The size is `docker image inspect .Size` summed over the images that are not a base of
    another one in `refs` (whose layers are a prefix of its layers): an upper bound, as layers shared otherwise are
    counted twice."""
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}} {{json .RootFS.Layers}}", *refs],
                         capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    images = {tuple(json.loads(layers)): int(size) for size, layers in (line.split(" ", 1) for line in out)}
    return 2 * targets * sum(size for layers, size in images.items()
                             if not any(other[:len(layers)] == layers and other != layers for other in images))
