"""Order of refusals: every check that can fail on the control host or by reading the nodes stops the real `make
deploy` before the first task that changes a node, and the node is proven unchanged.

Each test takes a fingerprint of this host (the one node of ansible/inventories/local.yml; tests/support/
fingerprint.py: files under /etc, which holds netplan, /opt/ds4deploy and /var/lib/ds4deploy with sizes, mtimes and
modes, and Docker's containers and images), deploys a scratch recipe that one check must refuse, and asserts: a
non-zero exit, the refusal's cause and fix, no traceback, and the same fingerprint after (and, for one rule on
each path, the same refusal from `ds4deploy preflight`). The deploy runs under a
watchdog: should it ever reach the first play that changes a node (provision-hosts.yml), it is killed at once and
the test fails there (the refusal came too late). The deployed cpu stack of `make test` keeps running throughout (a
scratch recipe serves on port 8093, never on the stack's).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import REPO
from tests.support import fingerprint

# The first play that changes a node (ansible/provision-hosts.yml); nothing may reach it when a check fails.
FIRST_CHANGE = "PLAY [Provision GPU and RoCE hosts"
LOCAL = REPO / "ansible" / "inventories" / "local.yml"


def _deploy_until_change(scratch, name: str, *extra: str, env: dict | None = None) -> tuple[int, str]:
    """`make deploy RECIPE=<name>`, killed (its whole process group) as soon as it reaches `FIRST_CHANGE`.

    Returns (exit code, stdout + stderr); fails the test when the deploy reached a play that changes a node.
    """
    proc = subprocess.Popen(["make", "--no-print-directory", "deploy", f"RECIPE={name}", *extra], cwd=REPO,
                            env={**scratch.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(FIRST_CHANGE):
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
                pytest.fail(f"the deploy of {name} reached the first play that changes a node instead of "
                            f"refusing:\n{''.join(lines)[-4000:]}")
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, "".join(lines)


def _preflight(scratch, name: str, extra: tuple[str, ...], env: dict | None) -> subprocess.CompletedProcess:
    """`ds4deploy preflight` with what `make deploy` was given (INVENTORY=, MODEL_FROM=)."""
    opts = dict(x.split("=", 1) for x in extra)
    argv = [str(REPO / ".venv" / "bin" / "ds4deploy"), "preflight", name, "--width", "1000",
            "--inventory", opts.get("INVENTORY", str(LOCAL)),
            *(["--model-from", opts["MODEL_FROM"]] if "MODEL_FROM" in opts else [])]
    return subprocess.run(argv, cwd=REPO, env={**scratch.env, **(env or {})}, capture_output=True, text=True,
                          timeout=600, check=False)


def _refused(scratch, name: str, *needles: str, extra: tuple[str, ...] = (), env: dict | None = None,
             preflight: bool = False) -> str:
    """Deploy `name` (`_deploy_until_change`) between two fingerprints; assert the refusal and that nothing changed.
    With `preflight`, `ds4deploy preflight` with the same inputs must refuse it too, with the same cause, and change
    nothing. The deploy imports the very playbook that command runs (ansible/site.yml imports preflight.yml after
    the same control-host checks), so that is proven once per path, not per rule: on the control host and by
    reading the node (`test_a_rule_failing_on_the_inventorys_host_facts`); each preflight run costs about 20 s.

    Returns the deploy's output.
    """
    before = fingerprint.take()
    if preflight:
        pre = _preflight(scratch, name, extra, env)
        pre_out = pre.stdout + pre.stderr
        assert pre.returncode != 0, f"ds4deploy preflight passed what the deploy refuses:\n{pre_out[-3000:]}"
        for needle in needles:
            assert needle in pre_out, f"{needle!r} not in the preflight's output:\n{pre_out[-3000:]}"
        assert "Traceback" not in pre_out
    code, out = _deploy_until_change(scratch, name, *extra, env=env)
    after = fingerprint.take()
    assert code != 0, out[-3000:]
    for needle in needles:
        assert needle in out, f"{needle!r} not in the output:\n{out[-3000:]}"
    assert "fix" in out.lower(), out[-3000:]
    assert "Traceback" not in out
    changes = fingerprint.diff(before, after)
    assert changes == [], "the refused deploy changed the node:\n" + "\n".join(changes[:40])
    return out


def _cpu(**hardware) -> dict:
    data = yaml.safe_load((REPO / "recipes" / "cpu.yaml").read_text())
    data["serving"]["port"] = 8093  # never the port of the main deploy
    data["hardware"].update(hardware)
    return data


def _nvidia_smi(tmp_path: Path, *gpus: str) -> dict:
    """A stand-in nvidia-smi on PATH that answers the preflight's query (name, compute capability) with `gpus`, in
    the format of the real `nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader`, and fails otherwise."""
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.parent.mkdir()
    rows = "\\n".join(gpus)
    stub.write_text(f"#!/bin/sh\ncase \"$*\" in\n  *--query-gpu=name,compute_cap*) printf '{rows}\\n';;\n"
                    "  *) echo 'stand-in nvidia-smi: no answer to this query' >&2; exit 9;;\nesac\n")
    stub.chmod(0o755)
    return {"PATH": f"{stub.parent}:{os.environ['PATH']}"}


def test_the_preflight_passes_the_deployed_recipe_and_changes_nothing():
    """The other direction: `ds4deploy preflight` reads the node and passes the recipe `make test` deployed (its own
    stack holds the port), and reading changes nothing."""
    before = fingerprint.take()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "ds4deploy"), "preflight", "cpu", "--inventory", str(LOCAL)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    after = fingerprint.take()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "reading every node (ansible/preflight.yml, changes nothing)" in done.stdout
    assert "localhost: ok" in done.stdout
    assert fingerprint.diff(before, after) == []


# --- refused on the control host (`ds4deploy vars`, before Ansible starts) --------------------------------------


def test_bad_schema(scratch):
    name = scratch.variant("e2e-order-typo", lambda d: d["serving"].update(max_num_seq=4), render=False)
    out = _refused(scratch, name, "serving.max_num_seq = 4", "fix: edit")
    assert "PLAY [" not in out


def test_a_rule_failing_on_the_inventorys_host_facts(scratch, tmp_path):
    """The rule book with the inventory's facts (ds4_kernel, what `uname -r` says here) on the control host; the
    same kernel without the fact in the inventory is refused by reading the node (kernel_guard's check)."""
    kernel = platform.release()
    bad = {"release": kernel, "reason": "e2e: this host's own kernel", "source": "tests/e2e/test_refusal_order.py"}
    name = scratch.write("e2e-order-kernel", _cpu(known_bad_kernels=[bad]))
    inv = yaml.safe_load(LOCAL.read_text())
    inv["all"]["hosts"]["localhost"]["ds4_kernel"] = kernel
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    out = _refused(scratch, name, "kernel-known-bad", f"localhost runs {kernel}", "boot another kernel",
                   extra=(f"INVENTORY={path}",), preflight=True)
    assert "PLAY [" not in out
    out = _refused(scratch, name, f"localhost runs kernel {kernel}, which recipe {name} refuses", "Fix: boot",
                   preflight=True)
    assert "PLAY [Read every node" in out


def test_missing_manifest_of_a_local_model(scratch):
    data = _cpu()
    data["model"] = {"source": "local", "served_name": "e2e-local", "dtype": "float16", "quantization": "gguf",
                     "size_on_disk_gb": 0.001, "path": "/var/lib/ds4deploy/models/e2e-order-nomanifest"}
    name = scratch.write("e2e-order-nomanifest", data, manifest=False)
    out = _refused(scratch, name, f"no model manifest for recipe '{name}'", "--from PATH")
    assert "PLAY [" not in out


def test_missing_image_lock(scratch):
    """A recipe whose image build downloads a wheel, with no lock recording its sha256 (the image-pins rule)."""
    data = yaml.safe_load((REPO / "recipes" / "rtx3090x2-xeon-ds4-flash.yaml").read_text())
    data["serving"]["port"] = 8093
    name = scratch.write("e2e-order-nolock", data, manifest=False)
    out = _refused(scratch, name, "image-pins", f"{name}.lock.json is missing", "ds4deploy image lock")
    assert "PLAY [" not in out


def test_model_source_the_deploy_cannot_stage(scratch, tmp_path):
    """MODEL_FROM names a local model's files; the cpu recipe's model is generated."""
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF")
    name = scratch.variant("e2e-order-from", lambda d: None)
    out = _refused(scratch, name, "--from names a local model's files", "model.source 'generated'",
                   extra=(f"MODEL_FROM={src}",))
    assert "PLAY [" not in out


def test_revision_prefix_without_a_recorded_commit(scratch):
    """A short revision is resolved only by `ds4deploy model lock` (it names every commit an ambiguous prefix
    matches, tests/unit/test_hub.py); the deploy refuses the prefix on the control host, without the network."""
    data = _cpu()
    data["model"] = {"source": "hub", "repo_id": "e2e/tiny", "revision": "9e165c30", "served_name": "e2e-hub",
                     "dtype": "bfloat16", "size_on_disk_gb": 0.001,
                     "path": "/var/lib/ds4deploy/models/e2e-order-prefix"}
    name = scratch.write("e2e-order-prefix", data, manifest=False)
    out = _refused(scratch, name, "model-pin", "is a prefix of 8 hex digits", f"ds4deploy model lock {name}")
    assert "PLAY [" not in out


# --- refused by reading the node (ansible/preflight.yml), before any node is changed ----------------------------


def test_missing_cpu_flag(scratch):
    name = scratch.write("e2e-order-flag", _cpu(cpu={"arch": "x86_64", "flags": ["avx2", "ds4_no_such_flag"],
                                                     "min_cores": 2}))
    _refused(scratch, name, "lacks the CPU flags ds4_no_such_flag", "Fix: use a host whose CPU has them")


def test_disk_too_small(scratch):
    name = scratch.write("e2e-order-disk", _cpu(min_free_disk_gib=10**6))
    _refused(scratch, name, "GiB free at", "needs 1000000", "Fix: free space there")


def test_port_taken(scratch):
    name = scratch.write("e2e-order-port", _cpu())
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 8093))
        s.listen()
        _refused(scratch, name, "port 8093", "already in use", "Fix: stop that process")


def test_a_gpu_recipe_on_an_engine_built_for_no_gpu(scratch, tmp_path):
    """The cpu engine with a declared sm86 GPU: the rule book's engine-cuda refuses it (the pinned engine is built for
    no GPU) before any node is read or changed, whatever GPUs the node has. The node's own GPU check (count and
    compute capability against the recipe) is proven on the test hosts with a GPU recipe
    (tests/hosts/test_bad_input_netns.py `test_one_node_with_other_gpus_stops_both_before_any_rail_changes`)."""
    name = scratch.write("e2e-order-gpu", _cpu(gpus={"count": 1, "arch": "sm86",
                                                     "model": "NVIDIA GeForce RTX 3090"}))
    _refused(scratch, name, "engine-cuda", "the recipe's GPUs are sm86",
             env=_nvidia_smi(tmp_path, "NVIDIA GeForce RTX 3090, 8.6"))


def test_local_model_missing_on_the_node(scratch):
    """A local model placed on the nodes by hand (no MODEL_FROM), absent from model.path: every node's copy is
    checked against the committed manifest right after the checks, before the first change."""
    data = _cpu()
    missing = "/var/lib/ds4deploy/models/e2e-order-local-missing"
    data["model"] = {"source": "local", "served_name": "e2e-local", "dtype": "float16", "quantization": "gguf",
                     "size_on_disk_gb": 0.001, "path": missing}
    name = scratch.write("e2e-order-local", data, manifest=False)
    manifest = {"recipe": name, "source": "local", "files": {
        "tiny.gguf": {"size": 4, "sha256": "5d8ab9d0d1c9f1e35d8ab9d0d1c9f1e35d8ab9d0d1c9f1e35d8ab9d0d1c9f1e3"}}}
    (scratch.recipes / f"{name}.manifest.json").write_text(json.dumps(manifest))
    assert not Path(missing).exists()
    _refused(scratch, name, f"the model in {missing} on localhost", "missing or differing files: tiny.gguf",
             "Fix: put the files")
    assert not Path(missing).exists()


def test_api_key_file_readable_by_others(scratch):
    """A key file kept from an earlier deploy that others may read: refused while reading the node, before the
    stack role would use it (and before anything else changes)."""
    name = scratch.write("e2e-order-key", _cpu())
    key = Path(f"/etc/ds4deploy/secrets/{name}.env")
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key.write_text("VLLM_API_KEY=ds4-e2eorderkeytest\n")
    key.chmod(0o644)
    try:
        _refused(scratch, name, f"the API key file {key}", "readable or writable by others", f"chmod 0600 {key}")
    finally:
        key.unlink()


def test_a_gateway_key_equal_to_the_deployments_own_is_refused(scratch):
    """A gateway key file (docs/gateway.md, "Backends") holding the deployment's own key, as an office that gave its
    backends the gateway key as their own would write it: refused while reading the node, before the front door
    (whose entrypoint refuses it) would fail at start after the stack changed; the key is never printed."""
    name = scratch.write("e2e-order-gwkey", _cpu())
    key = Path(f"/etc/ds4deploy/secrets/{name}.env")
    gateway_key = Path(f"/etc/ds4deploy/secrets/{name}.gateway.env")
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = "ds4-e2e-order-gateway-" + "k" * 24
    for path, line in ((key, f"VLLM_API_KEY={secret}\n"), (gateway_key, f"DS4_GATEWAY_KEY={secret}\n")):
        path.touch(mode=0o600)
        path.write_text(line)
    try:
        out = _refused(scratch, name, f"the gateway key file {gateway_key}",
                       "holds the same key as the API key file or metrics key file of this deployment")
        assert secret not in out
    finally:
        key.unlink()
        gateway_key.unlink()
