"""How a check reaches a host: run one shell command there and get (rc, stdout, stderr) back.

`target_for(name, hostvars)` picks the transport from the inventory, the same variables Ansible reads:

- ``ds4_netns: <name>``: a network namespace on this machine (the CI test hosts); commands run under
  ``ip netns exec <name>``, which also gives them the namespace's own /sys/class/net.
- ``ansible_connection: local``: this machine.
- anything else: ``ssh`` to ``ansible_host`` (default: the host name) as ``ansible_user`` on ``ansible_port``,
  with BatchMode (never a password prompt) and a connect timeout.

tests/support/testinfra_support.py wraps a testinfra ``host`` fixture the same way, so the checks also run from
tests/infra.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import Protocol

# Seconds to wait for an ssh connection before a host counts as unreachable.
CONNECT_TIMEOUT_S = 10
# Exit status `timeout(1)` and our runner give a command that ran out of time (coreutils timeout: 124).
TIMED_OUT = 124


@dataclass(frozen=True)
class Result:
    """Outcome of one command: exit status and decoded output."""

    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.rc == 0


class Target(Protocol):
    """A host the checks can run shell commands on."""

    name: str

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        """Run `cmd` with ``sh -c`` on the host; a timeout gives rc 124."""
        ...


@dataclass
class ShellTarget:
    """A host reached by prefixing ``sh -c <cmd>`` with `prefix` (empty: this machine).

    Attributes:
        name: inventory host name.
        prefix: argv put in front of ``sh -c <cmd>`` (``["ip", "netns", "exec", "ns"]``, an ssh argv, or ``[]``).
        remote: True for ssh, whose remote side joins its arguments into one shell line (so the command is quoted).
    """

    name: str
    prefix: list[str]
    remote: bool = False

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        """Run `cmd` on the host. Returns rc 124 when it did not finish within `timeout` seconds."""
        argv = [*self.prefix, *(["sh -c " + shlex.quote(cmd)] if self.remote else ["sh", "-c", cmd])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return Result(TIMED_OUT, out, f"timed out after {timeout:.0f} s")
        except FileNotFoundError as exc:
            return Result(127, "", str(exc))
        return Result(done.returncode, done.stdout, done.stderr)


def target_for(name: str, hostvars: dict) -> ShellTarget:
    """The transport for inventory host `name` with variables `hostvars` (see module docstring)."""
    if hostvars.get("ds4_netns"):
        return ShellTarget(name, ["ip", "netns", "exec", str(hostvars["ds4_netns"])])
    if hostvars.get("ansible_connection") == "local":
        return ShellTarget(name, [])
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    if hostvars.get("ansible_port"):
        argv += ["-p", str(hostvars["ansible_port"])]
    if hostvars.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(hostvars["ansible_ssh_private_key_file"])]
    address = str(hostvars.get("ansible_host") or name)
    user = hostvars.get("ansible_user")
    argv.append(f"{user}@{address}" if user else address)
    return ShellTarget(name, argv, remote=True)
