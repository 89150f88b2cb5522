"""The form of a key has one source (ds4deploy/core/keys.py); every check of it derives from there or is proven equal
to it here: the people key file's check (Python), the preflight's grep of a backend's gateway key file (POSIX ERE
through the play vars), the front door entrypoint's and the router launcher's own guards (no Python in those
containers: their patterns are derived from the one source here, and the entrypoint is run on every printable
character)."""

from __future__ import annotations

import os
import re
import shutil
import string
import subprocess

import pytest
import yaml

from ds4deploy.core.keys import KEY_ALPHABET, KEY_MIN_CHARS, KEY_PATTERN, KEY_RE
from ds4deploy.recipe.paths import REPO_ROOT

ENTRYPOINT = REPO_ROOT / "images" / "proxy" / "entrypoint.sh"
ROUTER_LAUNCH = REPO_ROOT / "images" / "gateway" / "router-launch.py"
SERVING = REPO_ROOT / "ansible" / "roles" / "preflight" / "tasks" / "serving.yml"
# What the messages and docs say a key is made of ("A-Z a-z 0-9 _ -"): the one source must mean that.
ALPHABET = set(string.ascii_letters + string.digits + "_-")
PRINTABLE = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]


def test_the_rule_is_32_or_more_of_its_alphabet():
    ok = "ds4p-" + "a" * (KEY_MIN_CHARS - 5)
    assert KEY_MIN_CHARS == 32 and KEY_RE.match(ok) and not KEY_RE.match(ok[:-1])
    assert {c for c in PRINTABLE if KEY_RE.match(ok + c)} == ALPHABET


def _lines() -> list[str]:
    """Gateway key file lines: a valid key with each printable character appended, one a character short."""
    base = "ds4-" + "x" * (KEY_MIN_CHARS - 4)
    return [f"DS4_GATEWAY_KEY={base}{c}" for c in PRINTABLE] + [f"DS4_GATEWAY_KEY={base[:-1]}"]


@pytest.mark.skipif(shutil.which("grep") is None, reason="no grep")
@pytest.mark.tool  # runs grep / the entrypoint script in subprocesses
def test_the_preflight_grep_reads_the_pattern_as_python_does(tmp_path):
    """The preflight's form check is `grep -Eqx DS4_GATEWAY_KEY=<ds4_key_pattern>`: real grep -E accepts exactly the
    lines Python's re accepts."""
    lines = _lines()
    (tmp_path / "keys").write_text("\n".join(lines) + "\n")
    p = subprocess.run(["grep", "-Exn", f"DS4_GATEWAY_KEY={KEY_PATTERN}", str(tmp_path / "keys")],
                       capture_output=True, text=True, check=False)
    by_grep = {int(line.split(":", 1)[0]) for line in p.stdout.splitlines()}
    by_python = {n for n, line in enumerate(lines, 1) if KEY_RE.match(line.removeprefix("DS4_GATEWAY_KEY="))}
    assert by_grep == by_python and len(by_python) == len(ALPHABET)


def test_the_preflight_reads_the_pattern_from_the_play_vars():
    """serving.yml's grep names ds4_key_pattern and holds no alphabet of its own."""
    tasks = yaml.safe_load(SERVING.read_text())
    form = next(t for t in tasks if t["name"].startswith("Read the gateway key file's form"))
    assert form["ansible.builtin.command"]["argv"][2] == "DS4_GATEWAY_KEY={{ ds4_key_pattern }}"
    assert "A-Za-z0-9" not in SERVING.read_text()
    # The play vars carrying KEY_PATTERN as ds4_key_pattern: tests/unit/test_playvars.py (it builds them already).


def test_the_container_guards_use_the_one_alphabet():
    """The entrypoint's three key guards are the shell pattern *[!<KEY_ALPHABET>]*, the router launcher's the
    regex [<KEY_ALPHABET>]+: derived from the one source, not copied into this test."""
    guards = re.findall(r"^\s*(\*\[!.*?\]\*)\)", ENTRYPOINT.read_text(), flags=re.M)
    assert guards == [f"*[!{KEY_ALPHABET}]*"] * 3, guards
    assert f're.fullmatch(r"[{KEY_ALPHABET}]+", key)' in ROUTER_LAUNCH.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.tool  # runs grep / the entrypoint script in subprocesses
def test_the_entrypoint_admits_exactly_the_alphabet(tmp_path):
    """The real entrypoint on a key ending in each printable character: it passes the key's guard (and stops at the
    missing metrics key, before nginx) exactly for the characters of KEY_ALPHABET."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "DS4_METRICS_KEY", "DS4_GATEWAY_KEY")}
    env["FRONT_DOOR_TEMPLATE"] = str(REPO_ROOT / "compose" / "cpu" / "front-door.conf.template")
    passed = set()
    for c in PRINTABLE:
        env["VLLM_API_KEY"] = "ds4-" + "x" * 40 + c
        p = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, text=True, check=False,
                           timeout=30)
        assert p.returncode == 2, (c, p.stderr)
        if "DS4_METRICS_KEY is empty or unset" in p.stderr:
            passed.add(c)
        else:
            assert "VLLM_API_KEY holds characters other than" in p.stderr, (c, p.stderr)
    assert passed == {c for c in PRINTABLE if re.fullmatch(f"[{KEY_ALPHABET}]", c)} == ALPHABET
