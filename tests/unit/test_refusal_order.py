"""The order of refusals, read from the playbooks themselves: site.yml and provision.yml run ansible/preflight.yml
before the first play that changes a node, and every task preflight.yml reaches on a node (its own, and the task
files of the roles it imports, followed through every import and include) only reads: a module from `READ_ONLY`,
and a command or shell that declares ``changed_when: false``. tests/e2e/test_refusal_order.py proves the same on a
real host with a fingerprint for each kind of refusal."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.conftest import REPO

ANSIBLE = REPO / "ansible"
ROLES = ANSIBLE / "roles"
# Modules that cannot change a host (ansible.builtin documentation: each says it only reads or only reports;
# gather_facts runs the fact modules, `setup` unless the inventory names others, which only report facts).
READ_ONLY = {"ansible.builtin.assert", "ansible.builtin.fail", "ansible.builtin.debug", "ansible.builtin.ping",
             "ansible.builtin.setup", "ansible.builtin.gather_facts", "ansible.builtin.stat", "ansible.builtin.slurp",
             "ansible.builtin.wait_for",
             "ansible.builtin.set_fact", "ds4_gid_index"}
RUNS = {"ansible.builtin.command", "ansible.builtin.shell"}
IMPORTS = {"ansible.builtin.import_role", "ansible.builtin.include_role", "ansible.builtin.import_tasks",
           "ansible.builtin.include_tasks"}
KEYWORDS = {"name", "when", "vars", "register", "tags", "loop", "loop_control", "changed_when", "failed_when",
            "check_mode", "run_once", "delegate_to", "any_errors_fatal", "no_log", "ignore_unreachable", "block",
            "rescue", "always", "apply", "retries", "until", "throttle", "poll", "delay", "notify", "async",
            "ignore_errors", "environment", "become", "args", "timeout"}


def _load(path: Path) -> list:
    return yaml.safe_load(path.read_text()) or []


def _module(task: dict) -> str:
    (module,) = [k for k in task if k not in KEYWORDS]
    return module


def _tasks(path: Path, role: Path | None = None):
    """Every (file, task) reachable from the task list in `path`, through blocks, imports and includes."""
    for task in _load(path):
        yield from _task(path, task, role)


def _task(path: Path, task: dict, role: Path | None):
    if "block" in task:
        for sub in task["block"] + task.get("rescue", []) + task.get("always", []):
            yield from _task(path, sub, role)
        return
    module = _module(task)
    if module in IMPORTS:
        args = task[module]
        if "role" in module:
            target = ROLES / args["name"]
            yield from _tasks(target / "tasks" / args.get("tasks_from", "main.yml"), target)
        else:
            yield from _tasks((role / "tasks" if role else path.parent) / (args if isinstance(args, str) else
                                                                          args["file"]), role)
        return
    yield path, task


def _node_tasks_of_preflight():
    plays = _load(ANSIBLE / "preflight.yml")
    assert plays[0]["ansible.builtin.import_playbook"] == "nodes-plan.yml"
    (nodes,) = [p for p in plays if p.get("hosts") == "all"]
    # One node refused: no node changed. Every check runs in the block after the ping (an ignored unreachable host
    # under a play-wide any_errors_fatal would end the play before the next task names it).
    assert nodes["tasks"][0]["name"] == "Reach the host"
    assert all(t.get("any_errors_fatal") is True for t in nodes["tasks"][1:]), nodes["tasks"][1:]
    for task in nodes["tasks"]:
        yield from _task(ANSIBLE / "preflight.yml", task, None)


def test_every_task_preflight_runs_on_a_node_only_reads():
    bad = []
    for path, task in _node_tasks_of_preflight():
        module = _module(task)
        if task.get("delegate_to") == "localhost":
            continue  # on the control host (reading a local model's committed manifest), not on a node
        if module in RUNS:
            if task.get("changed_when") is not False:
                bad.append(f"{path.relative_to(REPO)}: {task['name']}: a command without changed_when: false")
        elif module not in READ_ONLY:
            bad.append(f"{path.relative_to(REPO)}: {task['name']}: {module} may change the host")
    assert not bad, "\n".join(bad)
    # The checks are there: CPU, GPU (nvidia-smi), disk, ports, kernel, driver, GPU limits, NUMA, room for the model.
    names = " | ".join(t["name"] for _, t in _node_tasks_of_preflight())
    for needle in ("CPU flags", "GPU count and architecture", "free disk space", "serving port is free",
                   "known-bad kernel", "driver is loaded", "clocks or power limits", "NUMA node count",
                   "room for the model", "Verify every model file on the node"):
        assert needle in names, needle


def test_a_read_only_check_with_a_change_in_it_is_found(tmp_path):
    """The walk above can fail: a role task file that writes a file is named."""
    role = tmp_path / "roles" / "probe" / "tasks"
    role.mkdir(parents=True)
    (role / "main.yml").write_text(yaml.safe_dump([
        {"name": "Read", "ansible.builtin.stat": {"path": "/etc"}},
        {"name": "Write", "ansible.builtin.copy": {"dest": "/etc/x", "content": "y"}},
        {"name": "Run", "ansible.builtin.command": {"cmd": "true"}}]))
    tasks = list(_tasks(role / "main.yml", role.parent))
    modules = [_module(t) for _, t in tasks]
    assert modules == ["ansible.builtin.stat", "ansible.builtin.copy", "ansible.builtin.command"]
    assert [m for m in modules if m not in READ_ONLY and m not in RUNS] == ["ansible.builtin.copy"]
    assert tasks[2][1].get("changed_when") is not False


def test_site_and_provision_check_every_node_before_the_first_change():
    site = [p.get("ansible.builtin.import_playbook") or p["name"] for p in _load(ANSIBLE / "site.yml")]
    assert site[0] == "preflight.yml", site
    first_change = site.index("provision-hosts.yml")
    before = _load(ANSIBLE / "site.yml")[1:first_change]
    # Between them: the model staged on the control host (and a hand-placed model checked on the nodes, read only),
    # the engine's own argument check on the nodes (a command that leaves nothing: changed_when false, as the
    # preflight's commands), and the supervisor paused on the control host.
    for play in before:
        for path, task in (x for t in play["tasks"] for x in _task(ANSIBLE / "site.yml", t, None)):
            module = _module(task)
            on_control_host = task.get("delegate_to") == "localhost" or play.get("hosts") == "localhost"
            reads = module in READ_ONLY or (module in RUNS and task.get("changed_when") is False)
            assert reads or on_control_host, f"{path.relative_to(REPO)}: {task['name']}"
    provision = [p.get("ansible.builtin.import_playbook") for p in _load(ANSIBLE / "provision.yml")]
    assert provision == ["preflight.yml", "provision-hosts.yml"]
    # provision-hosts.yml changes hosts and is never run alone: nothing else imports it, and it imports nothing.
    importers = [p.name for p in ANSIBLE.glob("*.yml")
                 if any(x.get("ansible.builtin.import_playbook") == "provision-hosts.yml" for x in _load(p))]
    assert sorted(importers) == ["provision.yml", "site.yml"]


def test_the_first_provisioning_role_reads_before_it_changes_anything():
    """The rails role's own refusals (partial or bonded rails) are not in preflight.yml (the role reads the netdevs
    it then configures); provision-hosts.yml runs it first, with any_errors_fatal, so every task before its last
    refusal only reads."""
    (play,) = _load(ANSIBLE / "provision-hosts.yml")
    assert play["any_errors_fatal"] is True and play["roles"][0]["role"] == "rails"
    tasks = list(_tasks(ROLES / "rails" / "tasks" / "main.yml", ROLES / "rails"))
    modules = [_module(t) for _, t in tasks]
    last_check = max(i for i, m in enumerate(modules) if m == "ansible.builtin.assert")
    for path, task in tasks[:last_check]:
        module = _module(task)
        assert module in READ_ONLY or (module in RUNS and task.get("changed_when") is False), \
            f"{path.relative_to(REPO)}: {task['name']}"


def test_the_gateway_deploy_checks_everything_before_its_first_change():
    """ansible/gateway.yml: gateway-plan.yml first (control host), then on the gateway host (any_errors_fatal) the
    gateway role's preflight.yml, whose every task only reads (a command on the control host declares changed_when:
    false), and only then the role's main.yml, whose first change follows the preflight's last refusal."""
    plays = _load(ANSIBLE / "gateway.yml")
    assert plays[0]["ansible.builtin.import_playbook"] == "gateway-plan.yml"
    for play in _load(ANSIBLE / "gateway-plan.yml"):
        for path, task in (x for t in play["tasks"] for x in _task(ANSIBLE / "gateway-plan.yml", t, None)):
            module = _module(task)
            assert module in READ_ONLY | {"ansible.builtin.include_vars", "ansible.builtin.add_host"} or (
                module in RUNS and task.get("changed_when") is False), f"{path.relative_to(REPO)}: {task['name']}"
    (play,) = plays[1:]
    assert play["any_errors_fatal"] is True
    # Between the checks and the role's changes: the gateway's supervisor paused on the control host (as site.yml
    # pauses a stack's), so a refused deploy leaves a running gateway supervised.
    preflight, pause, role = play["tasks"][:3]
    first, second = preflight["ansible.builtin.include_role"], role["ansible.builtin.include_role"]
    assert (first["name"], first.get("tasks_from"), second["name"], second.get("tasks_from")) == (
        "gateway", "preflight.yml", "gateway", None)
    assert pause["delegate_to"] == "localhost" and pause["ansible.builtin.command"]["argv"][1:3] == [
        "supervisor", "stop"] and "ds4_pause_supervisor" in pause["when"]
    checks = list(_tasks(ROLES / "gateway" / "tasks" / "preflight.yml", ROLES / "gateway"))
    for path, task in checks:
        module = _module(task)
        assert module in READ_ONLY or (module in RUNS and task.get("changed_when") is False), (
            f"{path.relative_to(REPO)}: {task['name']}")
    assert _module(checks[-2][1]) == "ansible.builtin.fail"  # the one refusal, then the maps kept (set_fact)
