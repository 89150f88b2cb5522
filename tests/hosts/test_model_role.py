"""The Ansible model role with a `source: local` model, run for real against this host (connection local, no
Docker): MODEL_FROM copies the files it names to the node and checks the copy; without it the node's own copy in
model.path is checked, and a missing or different file stops the play naming the node, the file and the fix.

In the test-hosts tier (`make test-hosts`), which already runs ansible-playbook, not in the unit tier: one run of
the role takes most of a minute on the 2-core CI host."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.conftest import REPO, write_variant

PLAY = """---
- name: The model role alone
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    ds4_offline_bundle: ""
  roles:
    - role: %s
"""


@pytest.fixture
def role_run(recipe_dir, tmp_path):
    """Run the model role for recipe `gguf` (a local model) with node directory tmp/node-model."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY % (REPO / "ansible" / "roles" / "model"))
    node_dir = tmp_path / "node-model"

    def edit(d):
        d["model"] = {"source": "local", "served_name": "tiny-gguf", "dtype": "float16", "quantization": "gguf",
                      "size_on_disk_gb": 0.001, "path": str(node_dir)}

    write_variant(recipe_dir, "gguf", edit)

    def run(model_from: str = "") -> subprocess.CompletedProcess:
        env = {**os.environ, "DS4_RECIPES_DIR": str(recipe_dir), "DS4_CACHE_DIR": str(tmp_path / "cache"),
               "ANSIBLE_NOCOLOR": "1"}
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
               "-e", "ds4_recipe=gguf", "-e", f"ds4_model_dir={node_dir}",
               "-e", f"model_staging_dir={tmp_path / 'staging'}", "-e", f"ds4_model_from={model_from}"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)

    return run, node_dir


def test_model_from_is_copied_and_checked_then_the_nodes_copy_is_checked(role_run, recipe_dir, tmp_path):
    run, node_dir = role_run
    src = tmp_path / "gguf"
    (src / "sub").mkdir(parents=True)
    # A model in one file and a second file in a subdirectory (not the parts of a split: those share a directory).
    parts = {"tiny.gguf": os.urandom(300_000), "sub/tiny-mmproj.gguf": os.urandom(200_001)}
    for name, data in parts.items():
        (src / name).write_bytes(data)
    p = run(str(src))
    assert p.returncode == 0, p.stdout[-3000:]
    assert f"the deploy wrote {recipe_dir / 'gguf.manifest.json'}" in p.stdout  # the first stage locked it
    assert {n: (node_dir / n).read_bytes() for n in parts} == parts
    manifest = json.loads((recipe_dir / "gguf.manifest.json").read_text())
    assert {n: f["sha256"] for n, f in manifest["files"].items()} == {n: hashlib.sha256(b).hexdigest()
                                                                      for n, b in parts.items()}
    # Already on the node: no MODEL_FROM, the node's copy alone is checked.
    p = run()
    assert p.returncode == 0, p.stdout[-3000:]
    copy = p.stdout.split("Copy the model files]")[1].split("TASK [")[0]
    assert "skipping: [localhost]" in copy and "changed" not in copy
    (node_dir / "sub" / "tiny-mmproj.gguf").unlink()
    p = run()
    assert p.returncode != 0
    assert "differing files: sub/tiny-mmproj.gguf" in p.stdout
    assert f"put the files recipes/gguf.manifest.json lists into {node_dir}" in p.stdout
    assert "MODEL_FROM=" in p.stdout
