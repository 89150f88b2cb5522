"""Fabric checks through testinfra: RDMA link state and the RoCE v2 GID index of every rail HCA, resolved on each
node; ib_write_bw per rail and both rails at once from this host to the first host of the inventory (the head);
nccl-tests all-reduce where installed. Hosts without an RDMA device report "skipped: no RDMA device".

    DS4_RECIPE=gx10x2-ds4-flash-fp8 pytest tests/infra/test_fabric.py --hosts=ansible://fabric_nodes \\
        --ansible-inventory <inventory>
"""

from __future__ import annotations

import pytest

from ds4deploy.checks import fabric
from ds4deploy.checks.target import target_for
from ds4deploy.recipe.load import load_recipe
from tests.support.testinfra_support import assert_rows, host_name, inventory_hosts, recipe_name, target


@pytest.fixture(scope="module")
def recipe():
    r = load_recipe(recipe_name())
    if r.fabric is None:
        pytest.skip(f"recipe {r.name} has no fabric")
    return r


def test_rdma_links_and_gid_index(host, request, recipe):
    hv = inventory_hosts(request).get(host_name(host), {})
    assert_rows(fabric.check_fabric_node(target(host, hv), recipe, hv))


def test_ib_write_bw_to_the_head(host, request, recipe):
    hosts = inventory_hosts(request)
    name = host_name(host)
    head = next(iter(hosts), None)
    if head is None or head == name:
        pytest.skip("this host is the head (the ib_write_bw server side)")
    rows = fabric.check_bandwidth(target_for(head, hosts[head]), hosts[head], target(host, hosts[name]),
                                  hosts[name], recipe)
    assert_rows(rows)
