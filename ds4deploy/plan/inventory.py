"""Ansible inventories, read the way Ansible reads them: one reader for every caller (preflight, node plan, checks).

`read_inventory` runs ``ansible-inventory --list`` (https://docs.ansible.com/ansible/latest/cli/ansible-inventory.html),
so YAML and INI inventories, host ranges (``node[01:04]``), ``group_vars/`` and ``host_vars/`` beside the file,
children and variable precedence are Ansible's own. On top of it:

- duplicate keys in a YAML inventory are refused with both line numbers (`ds4deploy.core.yamlio`); Ansible itself is
  run with ``DUPLICATE_YAML_DICT_KEY=error`` for the files it reads;
- a host defined in two places of the file with different values for one variable is refused: Ansible would keep
  one of them without a word;
- host variables that are templates (``ansible_host: "{{ mgmt_ip }}"``) are resolved by Ansible itself (an
  ad-hoc ``debug`` on the control host, no connection to the nodes), so two nodes are never mistaken for one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import load_strict

# Seconds `ansible-inventory --list` may take: a static inventory of hundreds of hosts reads in a few seconds; a
# dynamic one (a script, a cloud plugin) that has not answered in five minutes is stuck.
INVENTORY_TIMEOUT_S = 300


@dataclass(frozen=True)
class Inventory:
    """An inventory as Ansible sees it.

    Attributes:
        hosts: host name -> its variables after Ansible's precedence and templating, in inventory order.
        groups: group name -> host names (direct and through children); ``all`` holds every host.
    """

    hosts: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]


def _tool(name: str) -> str:
    """An Ansible CLI from the venv this package runs in, else from PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if not found:
        raise UserError(f"{name} not found", "run `make venv` (Ansible is a dependency of the deploy extra)")
    return found


def _env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_DUPLICATE_YAML_DICT_KEY": "error", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
            "ANSIBLE_HOST_KEY_CHECKING": "false", "ANSIBLE_NOCOLOR": "1"}


def _conflicts(data: Any) -> list[str]:
    """Hosts a YAML inventory defines in several groups with different values for one variable."""
    seen: dict[str, dict[str, tuple[str, Any]]] = {}
    out: list[str] = []

    def walk(group: str, body: Any) -> None:
        # Shapes Ansible refuses (hosts as a list, a host's variables as a string) are left to ansible-inventory,
        # whose message names them.
        if not isinstance(body, dict):
            return
        hosts, children = body.get("hosts"), body.get("children")
        for host, hv in (hosts.items() if isinstance(hosts, dict) else ()):
            for k, v in (hv.items() if isinstance(hv, dict) else ()):
                prev = seen.setdefault(str(host), {}).get(k)
                if prev is not None and prev[1] != v:
                    out.append(f"host {host} sets {k} = {prev[1]!r} in group {prev[0]} and {v!r} in group {group}")
                seen[str(host)][k] = (group, v)
        for child, cb in (children.items() if isinstance(children, dict) else ()):
            walk(str(child), cb)

    if isinstance(data, dict):
        for name, body in data.items():
            walk(str(name), body)
    return out


def _groups(listing: dict[str, Any]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}

    def members(name: str, stack: tuple[str, ...] = ()) -> list[str]:
        if name in groups:
            return groups[name]
        body = listing.get(name) or {}
        hosts = list(body.get("hosts") or [])
        for child in body.get("children") or []:
            if child not in stack:
                hosts += members(child, (*stack, name))
        groups[name] = list(dict.fromkeys(hosts))
        return groups[name]

    for name in listing:
        if name != "_meta":
            members(name)
    groups.setdefault("all", [])
    groups["all"] = list(dict.fromkeys(groups["all"] + [h for g in groups.values() for h in g]))
    return groups


# How Ansible says a plugin or module of a collection it does not have could not be loaded: ansible-core 2.19+
# "Could not load 'ansible.posix.json' callback plugin.", older "Invalid callback for stdout specified:
# ansible.posix.json", and for modules "couldn't resolve module/action 'community.general.x'" (ansible-core
# lib/ansible/executor/task_queue_manager.py and lib/ansible/parsing/mod_args.py). ansible-core alone ships only
# ansible.builtin; the `ansible` package bundles ansible.posix and community.general.
_MISSING_PLUGIN = re.compile(
    r"(?:Could not load '|Invalid callback for stdout specified: |couldn't resolve module/action ')"
    r"(?P<plugin>(?P<fqcn>[a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_.]+)")


def missing_collection(output: str) -> UserError | None:
    """The `UserError` for Ansible output saying a collection's plugin could not be loaded (named, with the
    install command), or None. ``ansible.builtin`` is part of ansible-core and never missing."""
    m = _MISSING_PLUGIN.search(output)
    if m is None or m["fqcn"] == "ansible.builtin":
        return None
    return UserError(f"the Ansible collection {m['fqcn']} is not installed (Ansible could not load {m['plugin']}): "
                     "ansible-core "
                     "alone ships only ansible.builtin",
                     f"install it: `ansible-galaxy collection install {m['fqcn']}` (or run `make venv`, which installs "
                     "the full ansible package with it)")


def _resolve_templates(path: Path, hostvars: dict[str, dict[str, Any]]) -> None:
    """Replace, in place, every top-level host variable whose value holds a Jinja template by Ansible's value."""
    templated = {h: sorted(k for k, v in hv.items() if "{{" in json.dumps(v) or "{%" in json.dumps(v))
                 for h, hv in hostvars.items()}
    keys = sorted({k for ks in templated.values() for k in ks})
    if not keys:
        return
    expr = "{{ {" + ", ".join(f"{json.dumps(k)}: ({k} | default(None))" for k in keys) + "} }}"
    env = {**_env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    hosts = ",".join(h for h, ks in templated.items() if ks)
    try:
        p = subprocess.run([_tool("ansible"), "-i", str(path), hosts, "-m", "ansible.builtin.debug", "-a",
                            f"msg={expr}"], capture_output=True, text=True, env=env, timeout=INVENTORY_TIMEOUT_S,
                           check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"Ansible did not resolve the templated host variables of {path} within "
                        f"{INVENTORY_TIMEOUT_S} s", "run `ansible -i <it> all -m debug` to see where it stops, or "
                        "write those variables' values plainly") from None
    missing = missing_collection(p.stderr + p.stdout)
    if missing is not None:
        raise missing
    try:
        results = json.loads(p.stdout)["plays"][0]["tasks"][0]["hosts"]
    except (ValueError, KeyError, IndexError):
        raise UserError(f"Ansible could not resolve the templated host variables of {path}: "
                        f"{(p.stderr or p.stdout).strip()[-600:]}",
                        "fix the templates in the inventory (each must name a variable the host has)") from None
    for host, res in results.items():
        if res.get("failed") or not isinstance(res.get("msg"), dict):
            raise UserError(f"{path}: host {host}: a templated variable cannot be resolved: {res.get('msg')}",
                            "fix the template in the inventory (it must name a variable the host has)")
        for k in templated.get(host, []):
            if res["msg"].get(k) is not None:
                hostvars[host][k] = res["msg"][k]


def read_inventory(path: Path | str) -> Inventory:
    """Read an Ansible inventory file (YAML or INI) as Ansible does.

    Raises:
        UserError: the file is missing or Ansible cannot parse it (its message), a YAML key is written twice, a
            host has conflicting definitions, or a templated variable cannot be resolved.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"inventory {path} does not exist", "pass an Ansible inventory file (INVENTORY=<file>)")
    if path.is_file() and path.suffix in (".yml", ".yaml"):
        doc = load_strict(path)
        clashes = _conflicts(doc.data)
        if clashes:
            raise UserError(f"{path}: a host is defined twice with different values:\n  " + "\n  ".join(clashes),
                            "define each host once (one group for its variables; other groups list it without vars)")
    if not path.is_file() and not path.is_dir():
        raise UserError(f"inventory {path} is neither a file nor a folder (a pipe or a device would be read forever)",
                        "pass an Ansible inventory file or folder")
    try:
        p = subprocess.run([_tool("ansible-inventory"), "-i", str(path), "--list"], capture_output=True, text=True,
                           env=_env(), timeout=INVENTORY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"ansible-inventory did not read {path} within {INVENTORY_TIMEOUT_S} s (an inventory script "
                        "that hangs, or a dynamic source that does not answer)",
                        "run `ansible-inventory -i <it> --list` to see where it stops, or pass a static inventory"
                        ) from None
    if p.returncode != 0:
        msg = " ".join(line.strip() for line in (p.stderr or p.stdout).splitlines() if line.strip())
        raise UserError(f"Ansible cannot read the inventory {path}: {msg[-800:]}",
                        "fix the inventory (YAML or INI, https://docs.ansible.com/ansible/latest/inventory_guide/)")
    listing = json.loads(p.stdout)
    groups = _groups(listing)
    hostvars = listing.get("_meta", {}).get("hostvars", {})
    hosts = {h: dict(hostvars.get(h, {})) for h in groups["all"]}
    _resolve_templates(path, hosts)
    return Inventory(hosts, groups)
