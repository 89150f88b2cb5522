"""Bad input through the real `make deploy`: each ends with one message naming the cause and the fix, a
non-zero exit, no traceback, and no half-deployed containers. A misspelled key, a port in use and a key file others
can read are refused before any change in tests/e2e/test_refusal_order.py (which also proves the node unchanged)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.conftest import REPO, containers_of


def _assert_clean_failure(p: subprocess.CompletedProcess, project: str, *needles: str) -> None:
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    for n in needles:
        assert n in out, f"{n!r} not in output:\n{out[-3000:]}"
    assert "Traceback" not in out
    assert containers_of(project) == []


def test_unrendered_recipe_says_to_render(scratch):
    name = scratch.variant("e2e-norender", lambda d: None, render=False)
    p = scratch.deploy(name)
    _assert_clean_failure(p, f"ds4-{name}", "is missing", "fix: run `ds4deploy render`")


def test_unwritable_model_directory(scratch, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        name = scratch.variant("e2e-rodir", lambda d: d["model"].update(path=f"{ro}/models/tiny"))
        p = scratch.deploy(name)
    finally:
        subprocess.run(["umount", str(ro)], check=False)
    _assert_clean_failure(p, f"ds4-{name}", f"the model directory {ro}/models/tiny cannot be created",
                          "Fix: make it writable")


def test_failed_image_build_leaves_nothing_running(scratch):
    def edit(d):
        d["engine"]["image"]["tag"] = "e2e-broken"
        d["engine"]["version"] = "0.0.0.999"  # the image's VLLM_CPU_VERSION build arg follows the engine pin

    name = scratch.variant("e2e-badbuild", edit)
    p = scratch.deploy(name, timeout=1800)
    _assert_clean_failure(p, f"ds4-{name}", "building ds4deploy/engine-cpu:e2e-broken", "Fix: read the build output")
    assert subprocess.run(["docker", "image", "inspect", "ds4deploy/engine-cpu:e2e-broken"],
                          capture_output=True, check=False).returncode != 0


def test_docker_missing_and_not_installable(scratch):
    """The docker role on a host where the docker CLI is absent and the package cannot be installed."""
    playbook = REPO / "tests" / "e2e" / "docker_role.yml"
    p = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(REPO / "ansible/inventories/local.yml"),
         str(playbook), "-e", "docker_cli=/nonexistent/docker", "-e", "docker_daemon=/nonexistent/dockerd",
         "-e", '{"docker_distro_packages": ["ds4deploy-no-such-package"]}'],
        cwd=REPO / "ansible", env=dict(scratch.env, ANSIBLE_CONFIG=str(REPO / "ansible/ansible.cfg")),
        capture_output=True, text=True, timeout=600, check=False,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "Docker is not installed" in out
    assert "Fix: install Docker Engine yourself" in out
    assert "Traceback" not in out


def test_a_failing_preflight_rule_stops_the_deploy_with_its_table(scratch):
    def edit(d):
        d["engine"]["flavor"] = "gb10-community"
        d["serving"]["speculative"] = {"method": "dspark", "num_speculative_tokens": 3}

    name = scratch.variant("e2e-rule", edit)
    p = scratch.deploy(name)
    # The table names each failing rule with its numbers and fix (k=3 also breaks the GB10 capture-size rule).
    _assert_clean_failure(p, f"ds4-{name}", "gb10-dspark-k5", "k = 3", "cudagraph-capture-size",
                          " passed, 2 failed")
    assert "PLAY [" not in p.stdout, "no host may be touched when a preflight rule fails"


@pytest.mark.parametrize("bad", ["0.0.0.0"])
def test_exposed_bind_without_key_is_refused(scratch, bad):
    def edit(d):
        d["serving"]["bind_address"] = bad
        d["serving"]["auth"] = {"mode": "none"}

    name = scratch.variant("e2e-open", edit, render=False)
    p = scratch.deploy(name)
    _assert_clean_failure(p, f"ds4-{name}", "serving.auth.mode must be 'api_key'")


def test_engine_port_clashing_with_the_front_door_is_refused(scratch):
    """Host networking puts the front door and the engine in one network namespace: the same port for both stops
    the deploy at the preflight table, before any host is touched."""
    def edit(d):
        d["serving"].update(network_mode="host", front_door={"engine_port": 8093})

    # The render itself refuses it (one port twice on one host), so nothing can be rendered, let alone deployed.
    name = scratch.variant("e2e-clash", edit, render=False)
    p = scratch.deploy(name)
    _assert_clean_failure(p, f"ds4-{name}", "port 8093 is used twice on one host")
    assert "PLAY [" not in p.stdout


def test_a_hand_edited_front_door_config_is_refused_as_stale(scratch):
    """The committed front door config is derived from the recipe: edited by hand (here into one nginx refuses),
    the deploy names the file and the fix before any container exists."""
    name = scratch.variant("e2e-fdedit", lambda d: None)
    conf = scratch.compose / name / "front-door.conf.template"
    text = conf.read_text()
    assert "proxy_buffering off;" in text  # the edit below must change the file, or the test proves nothing
    conf.write_text(text.replace("proxy_buffering off;", "proxy_buffering sixteen;"))
    p = scratch.deploy(name)
    _assert_clean_failure(p, f"ds4-{name}", "front-door.conf.template differs from the recipe",
                          "fix: run `ds4deploy render`")


def _stack_state() -> dict:
    """The deployed cpu stack as it stands: its containers (id -> state), the files of its node stack folder (name ->
    bytes) and its supervisor's recorded pid (None without one)."""
    ids = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", "label=io.ds4deploy.recipe=cpu"],
                         capture_output=True, text=True, check=True).stdout.split()
    states = {i: subprocess.run(["docker", "inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}", i],
                                capture_output=True, text=True, check=True).stdout.strip() for i in ids}
    stack = Path("/opt/ds4deploy/stacks/cpu")
    files = {p.name: p.read_bytes() for p in sorted(stack.iterdir()) if p.is_file() and p.name != "supervise.json"}
    record = stack / "supervise.json"
    pid = json.loads(record.read_text())["pid"] if record.is_file() else None
    return {"containers": states, "files": files, "supervisor": pid}


def test_a_redeploy_the_engine_would_refuse_leaves_the_running_stack_as_it_was(scratch):
    """`make deploy RECIPE=cpu` of a recipe whose engine argument vLLM refuses (seed: lots), over the running cpu
    stack: the engine's own parser refuses it on the node before anything changes (roles/stack/tasks/engine_check.yml,
    in the play before the supervisor is paused), quoting vLLM; the stack's containers, its node files and its
    supervisor are exactly as before, and it still answers."""
    before = _stack_state()
    assert before["containers"] and all(s.startswith("running") for s in before["containers"].values()), before
    data = yaml.safe_load((REPO / "recipes" / "cpu.yaml").read_text())
    data["serving"]["extra_args"]["seed"] = "lots"
    name = scratch.write("cpu", data)
    p = scratch.deploy(name)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert "the engine on localhost refuses the arguments recipes/cpu.yaml gives it" in out, out[-3000:]
    assert "vllm serve: error: argument --seed: invalid int value: 'lots'" in out, out[-3000:]
    assert "Nothing of the stack changed on any node" in out and "Traceback" not in out
    assert "supervisor was stopped" not in out
    assert _stack_state() == before
    key = (Path("/etc/ds4deploy/secrets/cpu.env").read_text().split("VLLM_API_KEY=", 1)[1]).split()[0]
    r = httpx.get("http://127.0.0.1:8000/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
