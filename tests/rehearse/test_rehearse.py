"""Rehearsal of a reference recipe's real deploy on stand-in nodes (`make rehearse RECIPE=<recipe>`).

`make deploy` itself runs (ds4deploy vars, provision.yml and site.yml, the supervisor) against an inventory of
stand-in nodes (tests/rehearse/nodes.py: namespaces with their own Docker daemon on this machine), with only the
hardware stood in: CPU, RAM, disk and NUMA at the recipe's minimums, GPU facts from captured nvidia-smi output, a
GID table per node following the recipe's rails (node-b's RoCE v2 index moved from 3 to 4, so each node must resolve
its own), the model from a local server speaking the hub protocol under the recipe's repo id and revision (tiny
files; a `source: local` recipe copies a tiny local directory with MODEL_FROM), and the engine image replaced by a
stand-in tagged as the recipe's image (tests/rehearse/standin: Debian with python3) that checks its argv, its
environment, mounts, devices and GPU reservation against the committed render, then serves; the engine arguments
each container got are parsed with vLLM's own parser on the host (tests/support/vllm_parser.py).

The control host's commands (make, ansible-playbook, the supervisor, the hub) run in the head node's network
namespace, as on a machine that is its own control host. The recipe is read from a scratch copy of recipes/
($DS4_RECIPES_DIR), so the manifest (and the sm86 image lock of a stand-in artifact) the deploy records never
reach the repository.
Asserted: the preflight ran on the stand-in facts, every stand-in check passed, the worker started (and reached its
ready line) before the head, each node's .env launch facts (rank, master address, GID index), serving with the API
key, the supervisor's ordered restart after a killed stand-in worker (incident folder written), and `make down`
(stacks gone, supervisor stopped, incident folder kept).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from ds4deploy.build.image import debian_base, image_exists
from ds4deploy.operate.incidents import INCIDENTS_ROOT
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.render.compose import node_project_name, project_name
from ds4deploy.render.index import REHEARSED
from tests.rehearse import hardware, nodes
from tests.rehearse.expect import expectations
from tests.support import host_docker
from tests.support.vllm_parser import VllmParser, strip_fork_only

REHEARSE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
# The reference recipes `make test` rehearses (ds4deploy.render.index.REHEARSED, whose index row says so), or the one
# `make rehearse RECIPE=<name>` names.
RECIPES = ([os.environ["DS4_REHEARSE_RECIPE"]] if os.environ.get("DS4_REHEARSE_RECIPE")
           else sorted(REHEARSED))
KEEP_IMAGES = os.environ.get("DS4_REHEARSE_KEEP_IMAGES") == "1"
# Where the stand-in GB10 pair's rails put each node (the published subnets, .1 head and .2 worker).
RAIL_HOST = {0: 1, 1: 2}
WORKER_GID_INDEX = 4  # node-b's moved RoCE v2 slot (node-a keeps the published 3)
DEPLOY_TIMEOUT_S = 1800
RESTART_TIMEOUT_S = 600

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="stand-in nodes need root (namespaces, dockerd)")


def _stamp(text: str) -> datetime:
    """An RFC 3339 timestamp from Docker (nanoseconds cut to microseconds)."""
    text = text.strip().replace("Z", "+00:00")
    if "." in text:
        head, rest = text.split(".", 1)
        frac, _, tz = rest.partition("+")
        text = f"{head}.{frac[:6]}+{tz}"
    return datetime.fromisoformat(text)


class Rehearsal:
    """Everything one rehearsal made, and the helpers the tests read it with."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.recipe = load_recipe(name)
        self.tmp = tmp
        self.nodes = nodes.nodes_for(self.recipe)
        self.head = self.nodes[0]
        self.deploy_vars = yaml.safe_load((REPO_ROOT / "compose" / self.name / "deploy-vars.yml").read_text())
        self.multinode = self.recipe.hardware.nodes > 1
        self.hub: subprocess.Popen | None = None
        self.env = dict(os.environ)
        self.log: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.created: list[Path] = []

    # -- control-host commands, in the head node's network namespace --------------------------------------------
    def control(self, argv: list[str], timeout: float, name: str) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        log = self.tmp / f"{name}.log"  # written as it runs (follow it with tail -f)
        with log.open("w") as fh:
            p = subprocess.run(["nsenter", f"--net=/run/netns/{self.head.netns}", *argv], stdout=fh,
                               stderr=subprocess.STDOUT, text=True, env=self.env, cwd=REPO_ROOT, timeout=timeout,
                               check=False)
        self.timings[name] = round(time.monotonic() - t0, 1)
        self.log[name] = log.read_text()
        return p

    def make(self, target: str, name: str, timeout: float = DEPLOY_TIMEOUT_S, *extra: str):
        return self.control(["make", "--no-print-directory", target, f"RECIPE={self.name}",
                             f"INVENTORY={self.inventory}", *extra], timeout, name)

    def http(self, path: str, key: str | None = None) -> tuple[int, str]:
        """GET http://127.0.0.1:<port><path> in the head node's network namespace: (status, body)."""
        code = ("import sys, urllib.request, urllib.error\n"
                "r = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]} "
                "if sys.argv[2] else {})\n"
                "try:\n    resp = urllib.request.urlopen(r, timeout=10)\n"
                "    print(resp.status); print(resp.read().decode())\n"
                "except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n")
        url = f"http://127.0.0.1:{self.recipe.serving.port}{path}"
        p = subprocess.run(["nsenter", f"--net=/run/netns/{self.head.netns}", sys.executable, "-c", code, url,
                            key or ""], capture_output=True, text=True, timeout=60, check=False)
        if p.returncode != 0:
            return 0, p.stderr
        status, _, body = p.stdout.partition("\n")
        return int(status), body

    # -- the nodes' containers ----------------------------------------------------------------------------------
    def project(self, rank: int) -> str:
        return node_project_name(self.recipe, rank) if self.multinode else project_name(self.recipe)

    def engine(self, rank: int) -> dict | None:
        """`docker inspect` of the node's engine container (None when there is none)."""
        node = self.nodes[rank]
        ids = node.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project(rank)}",
                          "--filter", "label=com.docker.compose.service=engine").stdout.split()
        return json.loads(node.docker("inspect", ids[0]).stdout)[0] if ids else None

    def engine_log(self, rank: int) -> str:
        return self.nodes[rank].docker("logs", "--timestamps", self.engine(rank)["Id"]).stdout

    def check_report(self, rank: int) -> dict:
        """The stand-in engine's last report line in the node's engine log."""
        lines = [ln for ln in self.engine_log(rank).splitlines() if "ds4-rehearse-check " in ln]
        assert lines, self.engine_log(rank)[-3000:]
        return json.loads(lines[-1].split("ds4-rehearse-check ", 1)[1])

    def stack_dir(self, rank: int) -> Path:
        base = Path("/opt/ds4deploy/stacks") / self.deploy_vars["ds4_stack_name"]
        return base / f"node{rank}" if self.multinode else base

    def launch_env(self, rank: int) -> dict[str, str]:
        text = (self.stack_dir(rank) / ".env").read_text()
        return dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))

    def key(self) -> str:
        text = Path(self.deploy_vars["ds4_key_file"]).read_text()
        return text.split("VLLM_API_KEY=", 1)[1].strip()

    @property
    def journal_path(self) -> Path:
        return Path("/var/lib/ds4deploy/supervise") / f"{self.recipe.name}.jsonl"

    def journal(self) -> list[dict]:
        """The supervisor's journal since this rehearsal's deploy (`ds4deploy supervise`, JSON lines)."""
        lines = self.journal_path.read_text().splitlines() if self.journal_path.is_file() else []
        return [json.loads(ln) for ln in lines[self.journal_from:]]

    # -- set-up -------------------------------------------------------------------------------------------------
    def _model(self) -> Path:
        """Tiny stand-in model files: a hub repository's, or a local GGUF recipe's (its one file and the paths the
        engine is given inside it, or split files)."""
        d = self.tmp / "model"
        d.mkdir()
        if self.recipe.model.source == "local":
            from ds4deploy.plan.preflight.engine import model_mount_paths

            if self.recipe.model.file:
                # The one file the engine loads, and a stand-in file in every other path it is given inside the
                # model (tokenizer and config directories, the Engram tables): preflight rule engine-model-paths.
                (d / self.recipe.model.file).write_bytes(b"GGUF" + os.urandom(4096))
                for _, rel in model_mount_paths(self.recipe):
                    if rel != self.recipe.model.file:
                        (d / rel).mkdir(parents=True, exist_ok=True)
                        (d / rel / "rehearsal-stand-in.json").write_text("{}\n")
                return d
            for i in (1, 2):
                (d / f"model-{i:05d}-of-00002.gguf").write_bytes(b"GGUF" + os.urandom(4096))
            return d
        config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
                  "max_position_embeddings": self.recipe.serving.max_model_len,
                  "note": "tiny rehearsal stand-in for " + self.recipe.model.repo_id}
        (d / "config.json").write_text(json.dumps(config, indent=1))
        (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": self.recipe.serving.max_model_len}))
        # Above the hub's LFS threshold (tests/support/fakehub.py): verified by its LFS sha256.
        (d / "model-00001-of-00001.safetensors").write_bytes(os.urandom(12_000))
        return d

    def _recipes(self) -> Path:
        """A scratch recipes/ with this recipe and what is committed beside it (manifest, lock)."""
        d = self.tmp / "recipes"
        d.mkdir()
        for suffix in (".yaml", ".manifest.json", ".lock.json"):
            src = REPO_ROOT / "recipes" / f"{self.recipe.base_name}{suffix}"
            if src.is_file():
                shutil.copy(src, d / src.name)
        return d

    def _lock_standin_artifacts(self) -> None:
        """An image build that downloads artifacts (sm86: the Lvllmds4-x wheel) needs their lock: made with
        `ds4deploy image lock` from stand-in files of the same names (the stand-in image is not built from them); an
        owner-supplied base image (V100) is locked by the image ID of a stand-in tagged under its name."""
        probe = subprocess.run([str(BIN / "ds4deploy"), "image", "context", self.name, "--dest", str(self.tmp / "ctx")],
                               capture_output=True, text=True, env=self.env, check=False, timeout=600)
        if probe.returncode == 0 or "image lock" not in probe.stderr:
            return
        from ds4deploy.build.artifacts import image_artifacts, owner_base_image  # what the recipe's image build needs

        if owner := owner_base_image(self.recipe):
            # The owner-supplied base (V100: their port's image), which the lock pins by image ID: the stand-in's
            # base stands in for it, tagged under the recipe's name here and loaded into every node (`_images`).
            subprocess.run(["docker", "tag", debian_base(), owner], check=True, capture_output=True, timeout=60)
        args = []
        for art in image_artifacts(self.recipe):
            f = self.tmp / "artifacts" / art.file
            f.parent.mkdir(exist_ok=True)
            f.write_text(f"rehearsal stand-in for {art.file}\n")
            args += ["--artifact", f"{art.name}={f}"]
        subprocess.run([str(BIN / "ds4deploy"), "image", "lock", self.name, *args], check=True, capture_output=True,
                       text=True, env=self.env, timeout=120)

    def _context_sha256(self) -> str:
        """The context digest the image role compares with the image's label (`ds4deploy image context`)."""
        p = subprocess.run([str(BIN / "ds4deploy"), "image", "context", self.name, "--dest", str(self.tmp / "ctx")],
                           capture_output=True, text=True, env=self.env, check=True, timeout=600)
        return json.loads(p.stdout)["sha256"]

    def _images(self, model_files: list[str]) -> None:
        """Build the stand-in engine image in this machine's daemon, tagged as the recipe's image, and load it (and
        the front door's image) into every node's daemon that lacks one of them, streamed from `docker save`.

        The stand-in is Debian with python3 (a few hundred MB with the front door, their base once where both are
        built on the local base), so a node loads it in seconds; the node daemons keep their data from one rehearsed
        recipe to the next (`node_data`). (Building the stand-in in each node's daemon instead gives each node another
        image ID, which the deploy refuses: one server, one image.)"""
        # The stand-in's base: the local Debian base when present (ds4deploy.build.image.debian_base), which the
        # front door is built from where no registry is reachable, so a node holds the layers the two share once.
        needed = [debian_base()] + ([self.deploy_vars["ds4_front_door_image"]] if self.deploy_vars["ds4_front_door"]
                                    else [])
        if missing := [ref for ref in needed if not image_exists(ref)]:
            pytest.fail(f"{', '.join(missing)} not on this machine: the rehearsal builds its stand-in engine on the "
                        "Debian base and loads the front door image into every node. Fix: `make deploy RECIPE=cpu` "
                        "(builds both; images/base/build-base.sh builds the base alone), then rehearse.")
        ctx = self.tmp / "standin"
        shutil.copytree(REHEARSE / "standin", ctx)
        (ctx / "expect.json").write_text(json.dumps(expectations(self.recipe, model_files), indent=1))
        image = self.recipe.image_ref
        t0 = time.monotonic()
        subprocess.run(["docker", "build", "--quiet", "--build-arg", f"BASE_IMAGE={debian_base()}",
                        "--label", f"io.ds4deploy.context-sha256={self._context_sha256()}",
                        "--label", f"io.ds4deploy.recipe={self.name}", "--label", "io.ds4deploy.rehearsal-standin=1",
                        "-t", image, str(ctx)], check=True, capture_output=True, text=True, timeout=900)
        from ds4deploy.build.artifacts import owner_base_image

        owner = owner_base_image(self.recipe)
        wanted = ([image] + ([owner] if owner else [])
                  + ([self.deploy_vars["ds4_front_door_image"]] if self.deploy_vars["ds4_front_door"] else []))
        ids = {ref: subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                                   text=True, check=True).stdout.strip() for ref in wanted}
        lacking = [node for node in self.nodes
                   if any(node.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False).stdout.strip()
                          != ids[ref] for ref in wanted)]
        if lacking:
            self._enough_disk(wanted, len(lacking))
            nodes.load_images(lacking, wanted)
        self.timings["images"] = round(time.monotonic() - t0, 1)

    @staticmethod
    def _enough_disk(refs: list[str], targets: int) -> None:
        """Fail with the cause and the fix when the node daemons' filesystem lacks the room that loading `refs` into
        `targets` nodes needs (`nodes.free_disk_needed`): a load that runs out of disk leaves only "exit status 1"."""
        need, free = nodes.free_disk_needed(refs, targets), shutil.disk_usage(nodes.DATA).free
        if free < need:
            pytest.fail(f"loading the stand-in images into {targets} node(s) needs {need / 2**30:.1f} GiB free under "
                        f"{nodes.DATA}; {free / 2**30:.1f} GiB is. Fix: free disk on that filesystem (rehearsal "
                        "folders left in /tmp, unused images), then rehearse.")

    def _gid_trees(self) -> dict[str, Path]:
        out = {}
        for rank, node in enumerate(self.nodes):
            rails = {r.name: f"{r.subnet.rsplit('.', 1)[0]}.{RAIL_HOST[rank]}" for r in self.recipe.fabric.rails}
            out[node.name] = hardware.gid_tree(rails, node.dir / "sysfs", None if rank == 0 else WORKER_GID_INDEX)
        return out

    def _inventory(self) -> Path:
        hosts = {}
        trees = self._gid_trees() if self.recipe.fabric is not None else {}
        kernel = os.uname().release
        for rank, node in enumerate(self.nodes):
            hv = {"ds4_rehearse_node_dir": str(node.dir), "ds4_docker_host": node.docker_host,
                  "ds4_kernel": kernel, "ansible_host": "127.0.0.1"}
            if self.multinode:
                hv["ds4_node_rank"] = rank
            if self.recipe.fabric is not None:
                rails = {r.name: {"address": f"{r.subnet.rsplit('.', 1)[0]}.{RAIL_HOST[rank]}", "mtu": r.mtu}
                         for r in self.recipe.fabric.rails}
                hv.update(ds4_rails=rails, ds4_sysfs_root=str(trees[node.name]),
                          ansible_host=rails[self.recipe.fabric.rails[0].name]["address"])
            hosts[node.name] = hv
        inv = {"all": {"vars": {
            "ansible_connection": "rehearse_node",
            "ansible_python_interpreter": sys.executable,
            # The stand-in architecture (tests/rehearse/library/rehearse_machine.py) after setup's own facts.
            "ansible_facts_modules": ["ansible.builtin.setup", "rehearse_machine"],
            "ansible_facts_parallel": False}, "hosts": hosts}}
        path = self.tmp / "inventory.yml"
        path.write_text("---\n" + yaml.safe_dump(inv, sort_keys=False))
        return path

    def _remember(self, *paths: Path) -> None:
        """Paths the deploy creates on this machine outside the nodes: removed at the end when new."""
        self.created += [p for p in paths if not p.exists()]

    def _fresh_apt_cache(self) -> None:
        """A NUMA recipe's memory_numa role installs numactl with apt (cache_valid_time 1 h). The stand-in nodes share
        this machine's packages but have no route out: refresh the cache here, and mark the lists directory with the
        time of that refresh (apt rewrites the files in place, so the directory's mtime, which Ansible's apt module
        reads as the cache's age, would stay old)."""
        if self.recipe.hardware.numa_nodes > 1:
            subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=600)
            os.utime("/var/lib/apt/lists")

    def up(self) -> None:
        self._remember(Path(self.deploy_vars["ds4_key_file"]),
                       Path("/opt/ds4deploy/stacks") / self.deploy_vars["ds4_stack_name"],
                       INCIDENTS_ROOT / self.recipe.name)
        self.env.update({
            "DS4_RECIPES_DIR": str(self._recipes()),
            "ANSIBLE_CONNECTION_PLUGINS": str(REHEARSE / "plugins" / "connection"),
            "ANSIBLE_LIBRARY": f"{REPO_ROOT / 'ansible' / 'library'}:{REHEARSE / 'library'}",
            "HF_HOME": str(self.tmp / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1", "CI": "1"})
        t0 = time.monotonic()
        with host_docker.turn():  # tags an owner base image in this machine's daemon (a V100 recipe)
            self._lock_standin_artifacts()
        self._fresh_apt_cache()
        model = self._model()
        self.timings["lock-apt-model"] = round(time.monotonic() - t0, 1)
        model_files = sorted(str(p.relative_to(model)) for p in model.rglob("*") if p.is_file())
        t0 = time.monotonic()
        self.nodes = nodes.up(self.recipe)
        self.timings["nodes"] = round(time.monotonic() - t0, 1)
        with host_docker.turn():  # builds the stand-in and streams images out of this machine's daemon
            self._images(model_files)
        self.inventory = self._inventory()
        self._remember(self.journal_path)
        self.journal_from = len(self.journal_path.read_text().splitlines()) if self.journal_path.is_file() else 0
        self.extra = []
        if self.recipe.model.source == "hub":
            self.hub = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.head.netns}", sys.executable, "-m", "tests.rehearse.hub",
                 self.recipe.model.repo_id, self.recipe.model.revision, str(model)],
                stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
            self.env["HF_ENDPOINT"] = self.hub.stdout.readline().split()[1]
        else:
            self.extra = [f"MODEL_FROM={model}"]
        self.timings["nodes-images-hub"] = round(time.monotonic() - t0, 1)
        self.deploy = self.make("deploy", "deploy", DEPLOY_TIMEOUT_S, *self.extra)

    def down(self) -> None:
        if self.hub is not None:
            self.hub.terminate()
            self.hub.wait(30)
        subprocess.run([str(BIN / "ds4deploy"), "supervisor", "stop", self.name], capture_output=True, env=self.env,
                       check=False, timeout=120)
        nodes.down(remove_data=False)  # the shared images stay for the next recipe (`node_data`)
        for p in self.created:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def node_data():
    """The stand-in nodes' Docker data, kept from one rehearsed recipe to the next (the images they share are loaded
    once) and removed after the last one (kept with DS4_REHEARSE_KEEP_IMAGES=1)."""
    yield
    nodes.down(remove_data=not KEEP_IMAGES)


@pytest.fixture(scope="module", autouse=True)
def vllm_parser():
    """vLLM's parser in the engine venv, started before the first recipe's deploy so that its import overlaps the
    deploy (`tests.support.vllm_parser.VllmParser`)."""
    parser = VllmParser()
    yield parser
    parser.close()


@pytest.fixture(scope="module", params=RECIPES)
def rehearsal(request):
    tmp = Path(tempfile.mkdtemp(prefix=f"ds4-rehearse-{request.param}-"))
    r = Rehearsal(request.param, tmp)
    try:
        r.up()
        yield r
    finally:
        print(f"\nrehearsal {r.name}: timings (s) {json.dumps(r.timings)}; logs in {tmp}")
        r.down()


def test_make_deploy_succeeds_on_the_stand_in_nodes(rehearsal):
    out = rehearsal.log["deploy"]
    assert rehearsal.deploy.returncode == 0, out[-6000:]
    # The preflight ran on every node against the stand-in facts, before the first change.
    for node in rehearsal.nodes:
        assert f"ok: [{node.name}]" in out.split("TASK [preflight : Check the CPU architecture]")[1].split("TASK [")[0]
    # The GPU settings were checked with the stand-in nvidia-smi (read-only query of provision.yml's second play).
    calls = (rehearsal.head.dir / "bin" / "calls.log").read_text()
    assert "--query-gpu=name,clocks.max.graphics,power.min_limit,power.max_limit" in calls


def test_every_stand_in_engine_got_what_the_render_says(rehearsal, vllm_parser):
    reports = [rehearsal.check_report(rank) for rank in range(len(rehearsal.nodes))]
    # The engine arguments each container was given, as `vllm serve` would read them (vLLM's own parser, on the host),
    # after the recipe's declared fork-only flags are removed.
    parsed = vllm_parser.parse([strip_fork_only(r.get("engine_args", []), rehearsal.recipe.engine.fork_only_flags)
                                for r in reports])
    for rank, (report, vllm) in enumerate(zip(reports, parsed, strict=True)):
        assert report["problems"] == [], report
        assert vllm["ok"] is True, (report["engine_args"], vllm)
        assert (vllm["tp"], vllm["pp"], vllm["headless"]) == (
            rehearsal.recipe.parallelism.tensor, rehearsal.recipe.parallelism.pipeline, rank > 0), vllm
        assert report["role"] == rehearsal.engine(rank)["Config"]["Labels"]["com.docker.compose.project.config_files"
                                                                          ].rsplit("/", 1)[1]
        assert report["nvidia_visible_devices"] == "all"
        # dockerd ran the (stand-in) NVIDIA prestart hook for the GPU reservation.
        assert "prestart" in (rehearsal.nodes[rank].dir / "bin" / "hook.log").read_text()


def test_each_nodes_launch_facts(rehearsal):
    for rank, node in enumerate(rehearsal.nodes):
        env = rehearsal.launch_env(rank)
        report = rehearsal.check_report(rank)
        if rehearsal.multinode:
            # The head's address and each node's own: their first rail's (the inventory's ansible_host here).
            hosts = yaml.safe_load(rehearsal.inventory.read_text())["all"]["hosts"]
            master = hosts["node-a"]["ansible_host"]
            assert env["DS4_NODE_RANK"] == str(rank)
            assert env["DS4_MASTER_ADDR"] == master
            assert env["DS4_HOST_IP"] == hosts[node.name]["ansible_host"]
            assert report["values"]["DS4_NODE_RANK"] == str(rank)
            assert report["values"]["DS4_MASTER_ADDR"] == master
        else:
            assert env == {}  # one node: no per-node launch facts (ds4deploy.plan.nodes.Node.launch_env)
        if rehearsal.recipe.fabric is not None:
            assert env["DS4_NCCL_IB_GID_INDEX"] == ("3" if rank == 0 else str(WORKER_GID_INDEX))
            assert report["values"]["DS4_NCCL_IB_GID_INDEX"] == env["DS4_NCCL_IB_GID_INDEX"]


def test_the_worker_started_before_the_head(rehearsal):
    if not rehearsal.multinode:
        pytest.skip("one node: nothing to order")
    marker = rehearsal.deploy_vars["ds4_worker_ready_log"]
    ready = next(ln for ln in rehearsal.engine_log(1).splitlines() if marker in ln)
    head = rehearsal.engine(0)
    assert _stamp(ready.split()[0]) < _stamp(head["Created"]), (ready, head["Created"])


def test_it_serves_the_recipes_model_with_the_key(rehearsal):
    assert rehearsal.http("/health")[0] == 200
    status, body = rehearsal.http("/v1/models", rehearsal.key())
    assert status == 200 and json.loads(body)["data"][0]["id"] == rehearsal.recipe.model.served_name
    assert rehearsal.http("/v1/models", "ds4-wrong")[0] == 401


def test_the_supervisor_restarts_the_group_in_order_after_a_killed_worker(rehearsal):
    victim = len(rehearsal.nodes) - 1  # the worker; the single engine of a one-node recipe
    before = {rank: rehearsal.engine(rank)["State"]["StartedAt"] for rank in range(len(rehearsal.nodes))}
    assert any(e.get("event") == "start" for e in rehearsal.journal()), "the supervisor is not running"
    seen = len(rehearsal.journal())
    killed = datetime.now().astimezone()
    rehearsal.nodes[victim].docker("kill", rehearsal.engine(victim)["Id"])
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    events: list[dict] = []
    while time.monotonic() < deadline:
        events = rehearsal.journal()[seen:]
        if any(e.get("event") in ("restarted", "restart-failed", "gave-up") for e in events):
            break
        time.sleep(5)
    rehearsal.timings["supervisor-restart"] = round(RESTART_TIMEOUT_S - (deadline - time.monotonic()), 1)
    assert [e["event"] for e in events if e.get("event") in ("failure", "restarted")] == ["failure", "restarted"], \
        events
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["states"][rehearsal.nodes[victim].name] != "running"
    started = {rank: _stamp(rehearsal.engine(rank)["State"]["StartedAt"]) for rank in range(len(rehearsal.nodes))}
    for rank in started:
        assert started[rank] > killed and rehearsal.engine(rank)["State"]["StartedAt"] != before[rank]
    if rehearsal.multinode:
        assert started[1] < started[0]
    # The evidence was saved before anything was stopped: the incident folder the failure names.
    rehearsal.incident = Path(failure["incident"])
    assert rehearsal.incident.parent == INCIDENTS_ROOT / rehearsal.recipe.name and any(rehearsal.incident.iterdir())
    assert rehearsal.http("/health")[0] == 200


def test_make_down_removes_the_stacks_and_keeps_the_evidence(rehearsal):
    p = rehearsal.make("down", "down", 600)
    assert p.returncode == 0, rehearsal.log["down"][-4000:]
    for rank, node in enumerate(rehearsal.nodes):
        assert node.docker("ps", "-aq", "--filter",
                           f"label=com.docker.compose.project={rehearsal.project(rank)}").stdout.split() == []
    status = subprocess.run([str(BIN / "ds4deploy"), "supervisor", "status", rehearsal.name], capture_output=True,
                            text=True, env=rehearsal.env, check=False)
    assert "NOT running" in status.stdout, status.stdout
    assert rehearsal.incident.is_dir() and any(rehearsal.incident.iterdir())
