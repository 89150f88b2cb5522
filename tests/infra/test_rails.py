"""Rail checks through testinfra: each rail's IPv4 in its own subnet, MTU end to end (don't-fragment ping of
MTU-28 bytes to each peer's rail address), link up, routing per rail, link speed. Peers are the other hosts of
the inventory that have ds4_rails.

    DS4_RECIPE=gx10x2-ds4-flash-fp8 pytest tests/infra/test_rails.py --hosts=ansible://fabric_nodes \\
        --ansible-inventory ansible/inventories/test-hosts.yml
"""

from __future__ import annotations

import pytest

from ds4deploy.checks.rails import check_rails
from ds4deploy.recipe.load import load_recipe
from tests.support.testinfra_support import assert_rows, host_name, inventory_hosts, recipe_name, target


def test_rails(host, request):
    recipe = load_recipe(recipe_name())
    hosts = inventory_hosts(request)
    name = host_name(host)
    if recipe.fabric is None:
        pytest.skip(f"recipe {recipe.name} has no fabric")
    peers = {p: v for p, v in hosts.items() if p != name and v.get("ds4_rails")}
    assert_rows(check_rails(target(host, hosts.get(name, {})), recipe, hosts.get(name, {}), peers))
