"""The office of docs/gateway.md, deployed here as an office deploys it (`make e2e-office`, which `make test` runs
in a lane of its own beside the llama.cpp lane's cpu-llamacpp deploy and tests/offline's cpu deploy on this machine:
Makefile `last-lanes`).

Two hosts of an office network stand in as the rehearsal's stand-in nodes (tests/rehearse/nodes.py: per host a
network namespace, a mount namespace and its own Docker daemon), each with its own /etc/ds4deploy and /opt/ds4deploy
(key files, stack files: hosts apart from this one, the control and gateway host), joined to this machine by a link
of its own (`nodes.link_to_host`) and named as the committed recipes/gateways/office.yaml names them
(box-a.office.lan, box-b.office.lan, in /etc/hosts for the run). Then, with the product's targets only:

1. `make deploy RECIPE=cpu--lan INVENTORY=<the two hosts>`: one deploy, a complete stack on each host (a one-node
   recipe's inventory of two hosts: `ds4deploy.plan.nodes.plan`), the real vLLM CPU image and tiny model, each
   host's front door listening on the office network and accepting the gateway key beside the
   deployment's own (the key files as docs/gateway.md "Backends" has an owner write them), its supervisor started;
2. `make deploy RECIPE=office INVENTORY=<this host in group gateway, and the two hosts>`: the gateway on this
   machine, its deploy checking that each backend's recipe runs on its host (read through that host's Docker) and
   answers with the gateway key.

Proven, on two real vLLM servers: a gateway deploy before its backends refused, and the stack's deploy on a host that
runs its base recipe (one compose project) refused with nothing started on either host, `make status` of both, 12
sessions x 3 turns spread over both hosts with every turn of a session on one host, per-person usage equal to the
requests made and the tokens served, a revoked key refused at once, the client conformance matrix through the gateway as
on one stack, a host whose stack dies taking none of the next turns of its sessions (each answered by the other, none
failing) and coming back by its own supervisor (box-b never restarted), then `make down` of the gateway and of the two
hosts, each saving its logs first. The loopback gateway's tests (tests/gateway) prove the rest on backends the rig
starts with the cpu-llamacpp recipe's image, argv and front door (the llama.cpp family through a gateway, drain and
rejoin, fallback, the router's restart by its supervisor, token counts of streamed answers): not repeated here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.build.gateway_image import image_ref as router_image
from ds4deploy.operate import service
from ds4deploy.operate.incidents import INCIDENTS_ROOT
from ds4deploy.operate.supervisor import Policy
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.render import front_door, gateway
from ds4deploy.render.compose import project_name
from tests.rehearse import nodes
from tests.support import gateway_conformance, host_docker
from tests.support.gateway_usage import usage_table
from tests.support.images import context_label
from tools.gateway_rig import write_secret

RECIPE = "cpu--lan"
GATEWAY = "office"
STACK = load_recipe(RECIPE)
OFFICE = gateway.load_gateway(GATEWAY)
# The recipe's hosts, in the gateway recipe's order, each stood in by one node: box-a.office.lan by node-a, ...
HOSTS = {b.host: node for b, node in zip(OFFICE.backends, nodes.NAMES, strict=True)}
# What a host apart from the control host has of its own: the key files and the stack's files (ansible/group_vars/
# all.yml ds4_node_stack_dir) are each host's, not this machine's, whose cpu-llamacpp and cpu deploys run beside
# this test.
HOST_OWN = ("/etc/ds4deploy", "/opt/ds4deploy")
MODEL = STACK.model.served_name
PEOPLE = tuple(p.name for p in OFFICE.people)
BIN = Path(sys.executable).parent
REHEARSE = REPO_ROOT / "tests" / "rehearse"
# /etc/hosts lines of this run, between these two markers (removed at its end, nothing else touched).
HOSTS_BEGIN, HOSTS_END = "# ds4deploy tests/office: begin", "# ds4deploy tests/office: end"
# Seconds the stack's deploy on the two hosts may take: 130-150 s alone here, 335 s in make test's last phase
# (2026-12-04, two vLLM stacks); over three times that bounds a CI host much busier than ours and ends a hung deploy.
DEPLOY_TIMEOUT_S = 1200

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="stand-in hosts need root (namespaces, dockerd)")


def _url(host: str) -> str:
    return f"http://{host}:{STACK.serving.port}"


class Office:
    """Everything the run made, and what the tests read it with."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {**os.environ, "CI": "1", "ANSIBLE_NOCOLOR": "1",
                    "ANSIBLE_CONNECTION_PLUGINS": str(REHEARSE / "plugins" / "connection"),
                    "ANSIBLE_LIBRARY": f"{REPO_ROOT / 'ansible' / 'library'}:{REHEARSE / 'library'}"}
        self.created: list[Path] = []
        self.nodes: list[nodes.Node] = []
        self.keys: dict[str, str] = {}
        self.own_keys: dict[str, str] = {}
        self.gw_key = ""
        self.url = f"http://{OFFICE.bind_address}:{OFFICE.port}"
        self.log: dict[str, str] = {}
        self.stack_deploy: subprocess.CompletedProcess | None = None
        self.gateway_deploy: subprocess.CompletedProcess | None = None
        self.refusal: subprocess.CompletedProcess | None = None
        self.variant_refusal: subprocess.CompletedProcess | None = None
        # Each host's containers and stack files right after the refused deploy (`before_the_backends`).
        self.after_refusal: dict[str, tuple[list[str], list[str]]] = {}
        # What up() made, so that down() undoes that and only that (a skip or a failure half-way included).
        self.made_nodes = self.made_hosts_file = self.deployed = False

    def make(self, target: str, recipe: str, inventory: Path, timeout: float = 600,
             name: str = "") -> subprocess.CompletedProcess:
        """`make <target> RECIPE=<recipe> INVENTORY=<inventory>`, its output kept in <tmp>/<name>.log and
        `log[name]` (`name`: "<target> <recipe>" unless given)."""
        p = subprocess.run(["make", "--no-print-directory", target, f"RECIPE={recipe}", f"INVENTORY={inventory}"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=self.env)
        out = p.stdout + p.stderr
        name = name or f"{target} {recipe}"
        (self.tmp / f"{name.replace(' ', '-')}.log").write_text(out)
        self.log[name] = out
        return p

    def node(self, host: str) -> nodes.Node:
        return nodes.Node(HOSTS[host])

    def remember(self, *paths: Path) -> None:
        """Paths the run creates on this machine outside the hosts: removed at the end when new."""
        self.created += [p for p in paths if not p.exists()]

    def inventories(self) -> tuple[Path, Path]:
        """The two hosts' inventory (the stack's deploy) and the gateway's (this host in group gateway, beside the
        two hosts its deploy reads)."""
        boxes = {host: {"ansible_host": nodes.host_address(self.node(host)),
                        "ds4_rehearse_node_dir": str(self.node(host).dir),
                        "ds4_docker_host": self.node(host).docker_host, "ds4_kernel": os.uname().release}
                 for host in HOSTS}
        common = {"ansible_connection": "rehearse_node", "ansible_python_interpreter": sys.executable,
                  # The stand-in architecture (tests/rehearse/library/rehearse_machine.py) after setup's own facts.
                  "ansible_facts_modules": ["ansible.builtin.setup", "rehearse_machine"],
                  "ansible_facts_parallel": False}
        stack = self.tmp / "hosts.yml"
        stack.write_text("---\n" + yaml.safe_dump({"all": {"vars": common, "hosts": boxes}}, sort_keys=False))
        here = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        office = self.tmp / "office.yml"
        office.write_text("---\n" + yaml.safe_dump({"all": {
            "hosts": {"localhost": here, **{h: {**common, **hv} for h, hv in boxes.items()}},
            "children": {"gateway": {"hosts": {"localhost": {}}}}}}, sort_keys=False))
        return stack, office

    def images_here(self, want: str) -> None:
        """Fails the run, naming the fix, when an image the hosts get from this machine is missing, or when the
        engine image's context label is not `want`, the recipe's (`ds4deploy image context`): the hosts' deploy keeps
        an image only with the recipe's label (roles/image/tasks/build.yml; else it builds, with no registry or mirror
        here). `make deploy RECIPE=cpu` builds it with that label."""
        missing = [ref for ref in (STACK.image_ref, front_door.IMAGE, router_image())
                   if subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False).returncode]
        if missing:
            pytest.fail(f"{', '.join(missing)} not on this machine. Fix: `make deploy RECIPE={STACK.base_name}` (the "
                        "engine image and the front door) and `ds4deploy gateway image` (the router)")
        if (label := context_label(STACK.image_ref)) != want:
            pytest.fail(f"{STACK.image_ref} carries context label '{label}', not {want}. Fix: `make deploy "
                        f"RECIPE={STACK.base_name}` (it builds the image again with that label)")

    def up(self) -> None:
        # The recipe's context label, made before the turn below (it reads no Docker), which is held for as short as
        # it can be.
        want = json.loads(subprocess.run([str(BIN / "ds4deploy"), "image", "context", RECIPE, "--dest",
                                          str(self.tmp / "context")], capture_output=True, text=True, check=True,
                                         timeout=600).stdout)["sha256"]
        taken = [p for p in (Path(OFFICE.key_file), Path(OFFICE.people_key_file)) if p.exists()]
        if taken or _gateway_containers() or nodes.RUN.exists():
            pytest.skip(f"{', '.join(map(str, taken)) or 'the office gateway or stand-in nodes'} exist(s) already: "
                        "not this test's to replace")
        supervise = Path("/var/lib/ds4deploy/supervise")
        # This machine's part (the control and gateway host): the gateway's keys and files, both supervisors'
        # records, installs and journals, the incident folders. The hosts' own go with their nodes.
        self.remember(Path(OFFICE.key_file), Path(OFFICE.people_key_file), Path(OFFICE.metrics_key_file),
                      gateway.people_dir(OFFICE), Path("/opt/ds4deploy/gateways") / GATEWAY, INCIDENTS_ROOT / RECIPE,
                      INCIDENTS_ROOT / f"gateway-{GATEWAY}", *(supervise / f"{RECIPE}{suffix}" for suffix in (
                          ".jsonl", *(f".{h}.restart.log" for h in HOSTS))), supervise / f"{GATEWAY}.jsonl",
                      *(d / name for d in (service.STACKS_DIR, service.INSTALL_DIR) for name in (RECIPE, GATEWAY)))
        t0 = time.monotonic()
        self.made_nodes = True
        self.nodes = nodes.up(STACK, count=len(HOSTS), own=HOST_OWN)
        addresses = nodes.link_to_host(self.nodes)
        self.made_hosts_file = True
        _hosts_file_add({host: addresses[node] for host, node in HOSTS.items()})
        # tests/offline, in the lane beside, removes the engine image and loads it again from its bundle within a turn,
        # for as long as its offline deploy may take.
        with host_docker.turn(wait_s=host_docker.OFFLINE_DEPLOY_S):  # streams images out of this machine's daemon
            self.images_here(want)
            nodes.load_images(self.nodes, [STACK.image_ref, front_door.IMAGE])
        print(f"\nhosts up and images loaded: {time.monotonic() - t0:.0f} s")
        # The keys as an owner leaves them (docs/gateway.md, "Backends"), on each host: the stack's own key (each
        # host's own, as its first deploy would generate it) and the gateway's beside it; the gateway's on this one.
        self.gw_key = f"ds4-gw-{os.urandom(20).hex()}"
        for host in HOSTS:
            node = self.node(host)
            node.own(STACK.key_file).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.own_keys[host] = f"ds4-office-{os.urandom(20).hex()}"
            write_secret(node.own(STACK.key_file), f"VLLM_API_KEY={self.own_keys[host]}\n")
            write_secret(node.own(STACK.gateway_key_file), f"DS4_GATEWAY_KEY={self.gw_key}\n")
        write_secret(Path(OFFICE.key_file), f"VLLM_API_KEY={self.gw_key}\n")
        self.keys = {p: f"ds4p-{p}-{os.urandom(24).hex()}" for p in PEOPLE}
        write_secret(Path(OFFICE.people_key_file), "".join(f"{p} {k}\n" for p, k in self.keys.items()))
        self.stack_inv, self.office_inv = self.inventories()
        self.refusal, self.variant_refusal = self.before_the_backends()
        t0 = time.monotonic()
        self.deployed = True
        self.stack_deploy = self.make("deploy", RECIPE, self.stack_inv, DEPLOY_TIMEOUT_S)
        print(f"make deploy RECIPE={RECIPE} on {len(HOSTS)} hosts: {time.monotonic() - t0:.0f} s")
        if self.stack_deploy.returncode == 0:
            t0 = time.monotonic()
            self.gateway_deploy = self.make("deploy", GATEWAY, self.office_inv)
            print(f"make deploy RECIPE={GATEWAY}: {time.monotonic() - t0:.0f} s")

    def before_the_backends(self) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
        """While box-a runs the base recipe (a stand-in container labelled as its render labels a deployment of
        cpu, which listens on loopback only) and box-b nothing: `ds4deploy gateway vars office` (the first
        step of its `make deploy`) and `make deploy RECIPE=cpu--lan` on both hosts (the variant shares the
        base recipe's compose project), each refused; then the stand-in removed."""
        node = self.node(next(iter(HOSTS)))
        node.docker("run", "-d", "--name", "office-base-standin", "--network", "host",
                    "--label", f"com.docker.compose.project={project_name(STACK)}",
                    "--label", f"io.ds4deploy.recipe={STACK.base_name}", "--entrypoint", "sleep", front_door.IMAGE,
                    "infinity")
        try:
            gw = subprocess.run([str(BIN / "ds4deploy"), "gateway", "vars", GATEWAY, "--inventory",
                                 str(self.office_inv), "--scope", "deploy"], capture_output=True, text=True,
                                env=self.env, cwd=REPO_ROOT, timeout=300, check=False)
            refused = self.make("deploy", RECIPE, self.stack_inv, DEPLOY_TIMEOUT_S, name="refused deploy")
            for host in HOSTS:
                stacks = self.node(host).own("/opt/ds4deploy/stacks")
                self.after_refusal[host] = (
                    self.node(host).docker("ps", "--all", "--format", "{{.Names}}").stdout.split(),
                    sorted(str(f.relative_to(stacks)) for f in stacks.rglob("*")) if stacks.is_dir() else [])
            return gw, refused
        finally:
            node.docker("rm", "-f", "office-base-standin")

    def down(self) -> None:
        if self.deployed:  # `make deploy` started the supervisors; a test that failed before `make down` left them
            for name in (GATEWAY, RECIPE):
                subprocess.run([str(BIN / "ds4deploy"), "supervisor", "stop", name], capture_output=True,
                               env=self.env, check=False, timeout=120)
            subprocess.run(["docker", "compose", "-p", f"ds4-gw-{GATEWAY}", "down", "--timeout", "10"],
                           capture_output=True, check=False, timeout=300)
        if self.made_nodes:
            nodes.down(remove_data=True)
        if self.made_hosts_file:
            _hosts_file_remove()
        for p in self.created:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _hosts_file_add(names: dict[str, str]) -> None:
    """The office's host names in /etc/hosts between the run's markers (this machine, the router's container on host
    networking and the stand-in hosts, which share /etc, all read it)."""
    _hosts_file_remove()
    lines = [HOSTS_BEGIN, *(f"{addr} {host}" for host, addr in names.items()), HOSTS_END]
    text = Path("/etc/hosts").read_text()
    with open("/etc/hosts", "a", encoding="utf-8") as fh:
        fh.write(("" if text.endswith("\n") or not text else "\n") + "\n".join(lines) + "\n")


def _hosts_file_remove() -> None:
    text = Path("/etc/hosts").read_text()
    if HOSTS_BEGIN + "\n" not in text or HOSTS_END + "\n" not in text:
        return
    head, _, rest = text.partition(HOSTS_BEGIN + "\n")
    _, _, tail = rest.partition(HOSTS_END + "\n")
    # Written in place (not replaced): Docker bind-mounts this file into containers on host networking.
    with open("/etc/hosts", "w", encoding="utf-8") as fh:
        fh.write(head + tail)


def _gateway_containers() -> list[str]:
    return subprocess.run(["docker", "ps", "--all", "--quiet", "--filter",
                           f"label=com.docker.compose.project=ds4-gw-{GATEWAY}"],
                          capture_output=True, text=True, check=False).stdout.split()


@pytest.fixture(scope="module")
def office(tmp_path_factory):
    run = Office(tmp_path_factory.mktemp("office"))
    try:
        run.up()
        yield run
    finally:
        print(f"\noffice logs in {run.tmp}")
        run.down()


def chat(office: Office, person: str, session: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {office.keys[person]}"}
    if session:
        headers[OFFICE.routing.session_header] = session
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello from {person}"}], "max_tokens": 4}
    return httpx.post(f"{office.url}/v1/chat/completions", json=body, headers=headers, timeout=120)


@pytest.fixture
def deployed(office) -> Office:
    """The office, both deploys having passed (test_make_deploy_puts_... says why when not)."""
    if not (office.stack_deploy and office.stack_deploy.returncode == 0 and office.gateway_deploy
            and office.gateway_deploy.returncode == 0):
        pytest.skip("a deploy failed: test_make_deploy_puts_a_stack_on_each_host_and_the_gateway_in_front says why")
    return office


def test_make_deploy_puts_a_stack_on_each_host_and_the_gateway_in_front(office) -> None:
    assert office.stack_deploy is not None and office.stack_deploy.returncode == 0, \
        office.log[f"deploy {RECIPE}"][-6000:]
    assert office.gateway_deploy is not None and office.gateway_deploy.returncode == 0, \
        office.log[f"deploy {GATEWAY}"][-6000:]
    for out in office.log.values():
        assert office.gw_key not in out
        assert not any(k in out for k in (*office.own_keys.values(), *office.keys.values()))
    for host in HOSTS:
        running = office.node(host).docker("ps", "--format", "{{.Names}}").stdout.split()
        assert len(running) == 2, (host, running)  # the engine and its front door
        # The front door on the office network: the deployment's own key and the gateway's, no person's.
        other = next(k for h, k in office.own_keys.items() if h != host)  # each host its own key, as generated
        for key, code in ((office.own_keys[host], 200), (office.gw_key, 200), (office.keys["alice"], 401),
                          (other, 401)):
            r = httpx.get(f"{_url(host)}/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == code, (host, r.status_code)


def test_a_gateway_before_its_backends_is_refused(office) -> None:
    """Before the stacks were deployed: box-a running the base recipe (which listens on loopback only) and box-b
    nothing are each named, with the deploy that fixes it; nothing was written."""
    a, b = list(HOSTS)
    p = office.refusal
    assert p is not None, "the run stopped before the check"
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert (f"backend 'box-a': {a} runs recipe {STACK.base_name} in compose project {project_name(STACK)}, "
            f"not '{RECIPE}'") in p.stderr, p.stderr
    assert f"backend 'box-b': recipe '{RECIPE}' is not deployed on {b}" in p.stderr, p.stderr
    assert f"make deploy RECIPE={RECIPE}" in p.stderr, p.stderr


def test_the_stack_on_a_host_running_its_base_recipe_is_refused(office) -> None:
    """`make deploy RECIPE=cpu--lan` while box-a runs cpu (one compose project: the deploy would take
    its containers over under its supervisor): one message naming the host, the recipe and `make down`; neither host
    changed (box-b, whose checks passed, got nothing either)."""
    p = office.variant_refusal
    assert p is not None, "the run stopped before the check"
    out = p.stdout + p.stderr
    a, b = list(HOSTS)
    assert p.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert (f"{a} has containers deployed as {STACK.base_name}, which shares its compose project with "
            f"{RECIPE}") in out, out[-3000:]
    assert f"make down RECIPE={STACK.base_name}" in out and "Nothing was started" in out, out[-3000:]
    assert f"{b} has containers" not in out, out[-3000:]
    assert office.after_refusal == {a: (["office-base-standin"], []), b: ([], [])}, office.after_refusal


def test_make_status_shows_both_hosts_and_the_gateway(deployed) -> None:
    office = deployed
    p = office.make("status", RECIPE, office.stack_inv)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert all(host in out for host in HOSTS), out
    p = office.make("status", GATEWAY, office.office_inv)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for b in OFFICE.backends:
        assert f"{b.name} {_url(b.host)}: ready" in out, out


def test_sessions_spread_over_both_hosts_and_stay(deployed) -> None:
    office = deployed
    """12 sessions x 3 turns, the 12 of a turn at once: every turn of a session answered by the host of its first
    turn, both hosts used; then each person's usage equals the requests they made and the tokens the vLLM backends
    reported in their answers (prompt and completion)."""
    time.sleep(1.5)  # the door's access log is flushed at most 1 s after a request (flush=1s in the render)
    before = usage_table(GATEWAY)
    seen: dict[str, set[str]] = {}
    made: Counter = Counter()
    served: Counter = Counter()
    for turn in range(3):
        with ThreadPoolExecutor(max_workers=12) as pool:
            rs = list(pool.map(lambda s: (s, chat(office, PEOPLE[s % 3], session=f"office-{s}")), range(12)))
        for s, r in rs:
            assert r.status_code == 200, (turn, s, r.status_code, r.text[:300])
            seen.setdefault(f"office-{s}", set()).add(r.headers["x-smg-routed-worker-id"])
            made[PEOPLE[s % 3]] += 1
            served[PEOPLE[s % 3], "in"] += r.json()["usage"]["prompt_tokens"]
            served[PEOPLE[s % 3], "out"] += r.json()["usage"]["completion_tokens"]
    split = {s: b for s, b in seen.items() if len(b) != 1}
    assert not split, f"sessions answered by two hosts: {split}"
    used = Counter(next(iter(b)) for b in seen.values())
    print(f"sessions per host: {dict(used)}")
    assert set(used) == {_url(h) for h in HOSTS}, used
    time.sleep(1.5)
    after = usage_table(GATEWAY)
    for person in PEOPLE:
        was = before.get(person, {})
        got = {k: after[person][k] - was.get(k, 0) for k in ("requests", "tokens_in", "tokens_out")}
        want = {"requests": made[person], "tokens_in": served[person, "in"], "tokens_out": served[person, "out"]}
        assert got == want, (person, got, want)


def _journal() -> list[dict]:
    """The stack supervisor's journal (its `make deploy` started it)."""
    return [json.loads(ln) for ln in Path(f"/var/lib/ds4deploy/supervise/{RECIPE}.jsonl").read_text().splitlines()
            if ln.strip()]


def _back_bound_s() -> float:
    """Seconds from a host's stack killed to it answering through the gateway again, from the Policy and the recipe:
    the misses that make the supervisor restart (one check more of slack, each with its 5 s health timeout), the
    stack's start period, the router's two successful health checks 60 s apart before it lists the host ready again
    (SMG's defaults with the pinned version, docs/gateway.md "Limits"), and 180 s for the evidence and the restart
    play (Ansible on the two stand-in hosts of the shared 2-core machine: a deploy's play start alone takes ~15 s
    there)."""
    policy = Policy()
    return ((policy.failures_to_restart + 1) * (policy.interval_s + 5) + STACK.container.start_period_s + 2 * 60
            + 180)


def test_a_revoked_key_is_refused_at_once(deployed) -> None:
    """bob's line removed from the people key file and `ds4deploy gateway keys office --reload`: his very next request
    is refused at the door while alice's is answered; his line back, he is answered again."""
    office = deployed
    people = Path(OFFICE.people_key_file)
    whole = people.read_text()
    assert chat(office, "bob").status_code == 200
    write_secret(people, "".join(ln for ln in whole.splitlines(keepends=True) if not ln.startswith("bob ")))
    try:
        p = subprocess.run([str(BIN / "ds4deploy"), "gateway", "keys", GATEWAY, "--reload"], capture_output=True,
                           text=True, check=False, timeout=180)
        assert p.returncode == 0 and "no key (refused at the door): bob" in p.stdout, p.stdout + p.stderr
        assert (chat(office, "bob").status_code, chat(office, "alice").status_code) == (401, 200)
    finally:
        write_secret(people, whole)
        back = subprocess.run([str(BIN / "ds4deploy"), "gateway", "keys", GATEWAY, "--reload"], capture_output=True,
                              text=True, check=False, timeout=180)
        assert back.returncode == 0, back.stderr
    assert chat(office, "bob").status_code == 200


def test_conformance_matrix_through_the_gateway(deployed, tmp_path) -> None:
    """`ds4deploy conformance cpu--lan` against the office gateway's URL with a person's key, judged by the vLLM
    family's rules (the recipe the backends run names the family): the CLI fails no row, and every row that passes in
    the cpu stack's committed report (docs/results/conformance/cpu/) passes through the gateway too, but the one row
    the variant changes by design: `exposure.keyless_routes` names the routes the gateway's door answered without a
    key (/health) and judges them by the bind address of the recipe named, cpu--lan's 0.0.0.0 (a finding, not a
    failed row)."""
    office = deployed
    key_file = write_secret(tmp_path / "carol.env", f"VLLM_API_KEY={office.keys['carol']}\n")
    p, report, lost = gateway_conformance.through_gateway(RECIPE, office.url, key_file, MODEL, tmp_path / "report")
    assert report["engine_family"] == "vllm" and report["url"] == office.url, (report["engine_family"], report["url"])
    failed = [(r["case"], r["mode"], r["evidence"][:200]) for r in report["results"] if r["verdict"] == "fail"]
    assert p.returncode == 0 and not failed, (p.returncode, failed, p.stderr[-1000:])
    exposure = next(r for r in report["results"] if r["case"] == "exposure.keyless_routes")
    assert exposure["verdict"] == "finding", exposure
    assert exposure["evidence"] == ("answer anyone who reaches the port without a key: /health "
                                    f"(recipe {RECIPE} binds 0.0.0.0)"), exposure
    assert [row for row in lost if row[0] != "exposure.keyless_routes"] == []
    assert office.keys["carol"] not in p.stdout + p.stderr + (tmp_path / "report" / "conformance.json").read_text()


def test_a_dead_hosts_sessions_move_on_and_it_comes_back(deployed) -> None:
    office = deployed
    """box-a's stack dies (both containers killed): each of its sessions' next turn is answered by box-b, none
    failing; the stack's supervisor (started by its `make deploy`) brings box-a back within its Policy's bound, and
    the router sends new sessions to it again."""
    a, b = list(HOSTS)
    pins = {}
    for s in range(12):
        r = chat(office, "alice", session=f"dies-{s}")
        assert r.status_code == 200
        pins[s] = r.headers["x-smg-routed-worker-id"]
    assert set(pins.values()) == {_url(a), _url(b)}, pins
    node = office.node(a)
    killed_at = time.time()
    node.docker("kill", *node.docker("ps", "--quiet").stdout.split())
    t0 = time.monotonic()
    for s, first in pins.items():
        r = chat(office, "alice", session=f"dies-{s}")
        assert r.status_code == 200, (s, r.status_code, r.text[:300])
        assert r.headers["x-smg-routed-worker-id"] == _url(b), (s, first, r.headers["x-smg-routed-worker-id"])
    print(f"12 next turns after {a} died: {time.monotonic() - t0:.1f} s")
    bound = _back_bound_s()
    deadline = time.monotonic() + bound
    restarts: list[dict] = []
    while time.monotonic() < deadline and not restarts:
        time.sleep(5)
        restarts = [e for e in _journal() if e["event"] == "restarted" and e["t"] >= killed_at]
    print(f"{a} restarted by its supervisor after {time.monotonic() - t0:.0f} s")
    assert restarts, f"no restart of {a} journaled within {bound:.0f} s: {_journal()[-5:]}"
    used: set[str] = set()
    while time.monotonic() < deadline and _url(a) not in used:
        with ThreadPoolExecutor(max_workers=12) as pool:  # 12 new sessions at once: least_load spreads them
            used = {r.headers.get("x-smg-routed-worker-id") for r in pool.map(
                lambda i: chat(office, "bob", session=f"back-{i}-{time.monotonic()}"), range(12))}
        time.sleep(0 if _url(a) in used else 5)
    print(f"new sessions reach {a} again after {time.monotonic() - t0:.0f} s (bound {bound:.0f} s)")
    assert _url(a) in used, f"no new session reached {a} within {bound:.0f} s: {used}"
    restarts = [e for e in _journal() if e["event"] == "restarted" and e["t"] >= killed_at]
    assert {e["host"] for e in restarts} == {a}, restarts  # box-b was never restarted
    # Sessions pinned to box-b before the kill stayed there through box-a's restart.
    for s, first in pins.items():
        if first == _url(b):
            assert chat(office, "alice", session=f"dies-{s}").headers["x-smg-routed-worker-id"] == _url(b)


def test_make_down_saves_the_evidence_of_each(deployed) -> None:
    office = deployed
    """Runs last: `make down` of the gateway, then of the two hosts' stacks, each saving its logs in an incident
    folder before anything is removed; nothing of either runs afterwards."""
    for recipe, inventory, folder in ((GATEWAY, office.office_inv, f"gateway-{GATEWAY}"),
                                      (RECIPE, office.stack_inv, RECIPE)):
        before = set((INCIDENTS_ROOT / folder).glob("*"))
        p = office.make("down", recipe, inventory)
        assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
        new = sorted(set((INCIDENTS_ROOT / folder).glob("*")) - before)
        assert len(new) == 1, (folder, new)
        saved = {f.name for f in new[0].iterdir()}
        assert "incident.json" in saved, saved
        if recipe == RECIPE:
            assert all(any(f.startswith(host) for f in saved) for host in HOSTS), saved
    assert _gateway_containers() == []
    for host in HOSTS:
        assert office.node(host).docker("ps", "--all", "--quiet").stdout.split() == [], host
    for name in (GATEWAY, RECIPE):  # `make down` stopped each supervisor first
        assert subprocess.run([str(BIN / "ds4deploy"), "supervisor", "status", name], capture_output=True,
                              check=False).returncode == 1, name
