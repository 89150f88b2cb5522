"""Glue between the checks and testinfra (tests/infra/test_host_gpu.py, test_rails.py, test_fabric.py).

Run against any inventory and recipe, per host group with ``--hosts``::

    DS4_RECIPE=gx10x2-ds4-flash-fp8 pytest tests/infra/test_rails.py \\
        --hosts=ansible://fabric_nodes --ansible-inventory ansible/inventories/test-hosts.yml

Host variables come from the inventory file itself (`ds4deploy.plan.inventory.read_inventory`), so the checks see the
same ``ds4_rails``/``ds4_netns`` values as ``make check``.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from ds4deploy.checks.report import ERROR, FAIL, SKIP, Row
from ds4deploy.checks.target import Result


@dataclass
class TestinfraTarget:
    """A testinfra host (the ``host`` fixture), optionally inside a network namespace of that host."""

    name: str
    host: object
    netns: str | None = None

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        """Run `cmd` through testinfra, wrapped in coreutils ``timeout`` so a hung command cannot stall the run."""
        line = f"timeout {int(timeout)} sh -c {shlex.quote(cmd)}"
        if self.netns:
            line = f"ip netns exec {shlex.quote(self.netns)} {line}"
        out = self.host.run(line)
        return Result(out.rc, out.stdout, out.stderr)


def inventory_hosts(request) -> dict[str, dict]:
    """Host name -> variables of the ``--ansible-inventory`` file ({} without one)."""

    from ds4deploy.plan.inventory import read_inventory

    path = getattr(request.config.option, "ansible_inventory", None)
    return read_inventory(path).hosts if path else {}


def host_name(host) -> str:
    """The inventory name of a testinfra host (``ansible://<name>``), else its hostname."""
    return str(getattr(host.backend, "host", None) or host.backend.get_hostname())


def target(host, hostvars: dict) -> TestinfraTarget:
    """A check target over the testinfra host, inside ``ds4_netns`` when the inventory names one."""
    return TestinfraTarget(host_name(host), host, hostvars.get("ds4_netns"))


def recipe_name() -> str:
    """The recipe under test: $DS4_RECIPE (default ``cpu``), the convention of tests/infra/conftest.py."""
    return os.environ.get("DS4_RECIPE", "cpu")


def assert_rows(rows: list[Row]) -> None:
    """Fail with every failed or could-not-check row; skip (with the reasons) when every row is a skip.

    Raises:
        AssertionError: any row failed or could not run.
        pytest.skip.Exception: all rows are skips (the host lacks the hardware or the recipe does not ask).
    """
    import pytest

    bad = [r for r in rows if r.verdict in (FAIL, ERROR)]
    assert not bad, "\n".join(f"{r.host} {r.check}: expected {r.expected}, measured {r.measured} -> {r.verdict}; "
                              f"fix: {r.remediation}" for r in bad)
    if rows and all(r.verdict == SKIP for r in rows):
        pytest.skip("; ".join(sorted({r.measured for r in rows})))
