"""Air-gapped deploy, end to end: `make bundle`, then `make deploy OFFLINE=<bundle>` from a fresh copy of the
repository with no venv, no engine image, no model, and outbound network blocked (iptables), then a real request.

Runs after the main deploy of `make test` has been torn down (it deploys the cpu recipe on that recipe's port), in
`make test`'s last phase beside the llama.cpp, office and gateway lanes (Makefile `last-lanes`: their images are
built first, so they need no outbound network while this test blocks it). The office lane streams the engine-cpu
image into its stand-in hosts, so this test removes that image and loads it again within a turn at this machine's
Docker daemon (tests/support/host_docker.py), which it gives back once the image is back.
The network block is an iptables chain on OUTPUT that rejects everything but loopback, the Docker bridges and the
links to the office lane's stand-in hosts (tests/rehearse/nodes.py HOST_LINK: hosts on this
machine, not out of it), so pip, the model hub and registries are unreachable for the whole offline deploy; the test
first proves the block works (PyPI must be unreachable) so the deploy cannot pass by reaching the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from ds4deploy.operate.key_file import parse_env_file
from tests.rehearse.nodes import HOST_LINK
from tests.support import host_docker

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
CHAIN = "DS4-OFFLINE-TEST"
DV = yaml.safe_load((REPO / "compose" / "cpu" / "deploy-vars.yml").read_text())


def run(cmd, cwd=REPO, env=None, timeout=1800) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A real bundle of the cpu recipe, made with network access, the way a user makes one."""
    dest = tmp_path_factory.mktemp("bundle") / "cpu-bundle"
    proc = run(["make", "bundle", "RECIPE=cpu", f"BUNDLE={dest}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return dest


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def network_blocked():
    """Reject all outbound traffic except loopback, Docker bridges and the stand-in hosts' links (IPv4 and IPv6)
    inside the block."""
    tools = [t for t in ("iptables", "ip6tables") if shutil.which(t)]
    assert "iptables" in tools, "iptables is needed to take the network away from the offline deploy"
    try:
        for tool in tools:
            for args in (["-N", CHAIN], ["-A", CHAIN, "-o", "lo", "-j", "RETURN"],
                         ["-A", CHAIN, "-o", "docker0", "-j", "RETURN"], ["-A", CHAIN, "-o", "br-+", "-j", "RETURN"],
                         ["-A", CHAIN, "-o", HOST_LINK + "+", "-j", "RETURN"],
                         ["-A", CHAIN, "-j", "REJECT"], ["-I", "OUTPUT", "1", "-j", CHAIN]):
                proc = run([tool, "-w", *args], timeout=60)
                assert proc.returncode == 0, f"{tool} {' '.join(args)}: {proc.stderr}"
        assert not _pypi_reachable(), "the network block does not work: pypi.org is still reachable"
        yield
    finally:
        for tool in tools:
            run([tool, "-w", "-D", "OUTPUT", "-j", CHAIN], timeout=60)
            run([tool, "-w", "-F", CHAIN], timeout=60)
            run([tool, "-w", "-X", CHAIN], timeout=60)


def _fresh_copy(dest: Path) -> Path:
    """The checkout as a user receives it: tracked and new (not ignored) files, no venv, no caches."""
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def test_bundle_refuses_damage_and_other_recipes(bundle, tmp_path):
    """One flipped byte is named; a bundle for another recipe or an interrupted one is refused."""
    ds4 = str(VENV_BIN / "ds4deploy")
    target = bundle / "model" / "config.json"
    original = target.read_bytes()
    try:
        target.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        proc = run([ds4, "bundle", "verify", str(bundle), "cpu"])
        assert proc.returncode == 1
        assert "model/config.json: sha256" in proc.stderr and "fix:" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        target.write_bytes(original)
    proc = run([ds4, "bundle", "verify", str(bundle), "cpu"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["collections"]["community.docker"]

    proc = run([ds4, "bundle", "verify", str(bundle), "v100x8-ds41-flash-iq2"])
    assert proc.returncode == 2 and "was made for recipe 'cpu'" in proc.stderr

    partial = tmp_path / "b.partial"
    partial.mkdir()
    proc = run([ds4, "bundle", "verify", str(tmp_path / "b"), "cpu"])
    assert proc.returncode == 2 and "interrupted" in proc.stderr and "Traceback" not in proc.stderr


def test_offline_deploy_from_bundle_alone(bundle, tmp_path):
    """Fresh copy + bundle, no network: the deploy installs, loads, stages and serves."""
    meta = json.loads((bundle / "bundle.json").read_text())
    image = meta["images"][0]
    # The office lane beside (tests/office) streams this image into its stand-in hosts within a turn at this
    # machine's Docker daemon: this test holds the turn from the image's removal until its deploy has loaded it again.
    with contextlib.ExitStack() as turn:
        turn.enter_context(host_docker.turn())
        # Nothing the deploy needs may be on the host already: no engine image, no model copy.
        assert run(["docker", "image", "rm", "--force", image["ref"]]).returncode == 0
        shutil.rmtree(DV["ds4_model_dir"], ignore_errors=True)
        clone = _fresh_copy(tmp_path / "ds4deploy")
        # pip must not find wheels anywhere but the bundle (this machine's pip.conf points at a local wheel dir).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "DS4_", "VIRTUAL_ENV"))}
        env |= {"PIP_CONFIG_FILE": os.devnull, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
        try:
            with network_blocked():
                gen = run(["make", "deploy", "RECIPE=cpu", f"OFFLINE={bundle}"], cwd=clone, env=env,
                          timeout=host_docker.OFFLINE_DEPLOY_S)
                assert gen.returncode == 0, gen.stdout[-4000:] + gen.stderr[-3000:]
                assert "bundle verified" in gen.stdout
                # The image is the bundled one, byte for byte (same content-addressed id).
                got = run(["docker", "image", "inspect", "--format", "{{.Id}}", image["ref"]]).stdout.strip()
                assert got == image["id"]
                turn.close()  # the image is back: the office lane may stream it
                # The wheelhouse alone made the venv (pip had no index and no other find-links).
                assert (clone / ".venv" / "bin" / "ansible-playbook").is_file()
                key = parse_env_file(Path(DV["ds4_key_file"]).read_text())["VLLM_API_KEY"]
                r = httpx.post(f"http://127.0.0.1:{DV['ds4_port']}/v1/chat/completions", timeout=120,
                               headers={"Authorization": f"Bearer {key}"},
                               json={"model": DV["ds4_served_name"], "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "hello"}]})
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] >= 1
        finally:
            down = run(["make", "down", "RECIPE=cpu"], cwd=clone, env=env, timeout=600)
            assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]

