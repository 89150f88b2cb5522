"""The real backends every deployed gateway test shares, started once per run (tools/gateway_rig.py: the start-up
`make bench-gateway` uses too)."""

from __future__ import annotations

import pytest

from tools import gateway_rig as backends


@pytest.fixture(scope="session")
def office_backends(tmp_path_factory):
    """The three running backends (`backends.start`); removed at the end of the run."""
    why = backends.missing()
    if why:
        pytest.skip(why)
    started = {"names": [f"{n}" for b in backends.BACKEND_PORTS for n in backends.containers(b)]}
    try:
        started = backends.start(tmp_path_factory.mktemp("backends"))
        yield started
    finally:
        backends.docker("rm", "-f", *started["names"], check=False)
