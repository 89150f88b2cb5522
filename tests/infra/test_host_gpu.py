"""Host checks through testinfra: GPU count/arch/driver, persistence, power limit, clocks, GPUs in a container,
RAM per NUMA node, memlock, known-bad kernels. Expectations come from the recipe ($DS4_RECIPE); a host without a
GPU reports "skipped: no NVIDIA GPU" (pytest skip with that reason), never a pass.

    DS4_RECIPE=v100x8-ds41-flash-iq2 pytest tests/infra/test_host_gpu.py --hosts=ansible://gpu_nodes \\
        --ansible-inventory <inventory>
"""

from __future__ import annotations

import pytest

from ds4deploy.checks import host as checks
from ds4deploy.recipe.load import load_recipe
from tests.support.testinfra_support import assert_rows, host_name, inventory_hosts, recipe_name, target


@pytest.fixture
def node(host, request):
    return target(host, inventory_hosts(request).get(host_name(host), {}))


@pytest.fixture(scope="module")
def recipe():
    return load_recipe(recipe_name())


def test_gpus_match_the_recipe(node, recipe):
    assert_rows(checks.check_gpus(node, recipe))


def test_container_runtime_sees_the_gpus(node, recipe):
    assert_rows(checks.check_container_gpus(node, recipe))


def test_memory_numa_and_memlock(node, recipe):
    assert_rows(checks.check_memory(node, recipe))


def test_kernel_is_not_known_bad(node, recipe):
    assert_rows(checks.check_kernel(node, recipe))
