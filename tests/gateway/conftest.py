"""The real backends every deployed gateway test shares, started once per run (tools/gateway_rig.py: the start-up
`make bench-gateway` uses too)."""

from __future__ import annotations

import shutil

import pytest

from ds4deploy.build import gateway_image
from ds4deploy.recipe.load import load_recipe
from ds4deploy.render import front_door
from tools import gateway_rig as backends


@pytest.fixture(scope="session")
def office_backends(tmp_path_factory):
    """The three running backends (`backends.start`); removed at the end of the run."""
    if shutil.which("docker") is None or backends.docker("info", check=False).returncode != 0:
        pytest.skip("no Docker daemon: the gateway test runs real containers")
    llama = load_recipe("cpu-llamacpp")
    if not gateway_image.image_exists(llama.image_ref):
        pytest.skip(f"no {llama.image_ref}: build it with `make llamacpp` or `make deploy RECIPE=cpu-llamacpp`")
    if not gateway_image.image_exists(front_door.IMAGE):
        pytest.skip(f"no {front_door.IMAGE}: `make deploy RECIPE=cpu-llamacpp` builds it")
    started = {"names": [f"{n}" for b in backends.BACKEND_PORTS for n in backends.containers(b)]}
    try:
        started = backends.start(tmp_path_factory.mktemp("backends"))
        yield started
    finally:
        backends.docker("rm", "-f", *started["names"], check=False)
