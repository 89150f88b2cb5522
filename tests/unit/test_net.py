"""The listening-port check's rule (ds4deploy.core.net.listens_only_on) on socket lists as testinfra builds them from
real `ss -tln` lines: testinfra turns a `*:<port>` (dual-stack `::`) line into two entries."""

from __future__ import annotations

import pytest

from ds4deploy.core.net import listens_only_on

OTHER = ["tcp://0.0.0.0:22", "tcp://:::22", "unix:///run/docker.sock", "udp://0.0.0.0:8000"]


@pytest.mark.parametrize(("sockets", "address", "ok"), [
    # A dual-stack bind of :: (ss prints *:8000; testinfra lists it as both).
    (["tcp://:::8000", "tcp://0.0.0.0:8000"], "::", True),
    # An IPv6-only :: bind (ss prints [::]:8000).
    (["tcp://:::8000"], "::", True),
    # :: asked, but only IPv4 bound.
    (["tcp://0.0.0.0:8000"], "::", False),
    # :: plus a second, separate bind on a specific address.
    (["tcp://:::8000", "tcp://0.0.0.0:8000", "tcp://10.0.0.5:8000"], "::", False),
    (["tcp://127.0.0.1:8000"], "127.0.0.1", True),
    (["tcp://0.0.0.0:8000"], "127.0.0.1", False),
    # 0.0.0.0 asked: a dual-stack bind also serves IPv6, more than the recipe says.
    (["tcp://:::8000", "tcp://0.0.0.0:8000"], "0.0.0.0", False),
    (["tcp://0.0.0.0:8000"], "0.0.0.0", True),
    (["tcp://::1:8000"], "::1", True),
    ([], "127.0.0.1", False),
])
def test_bound_where_the_recipe_says(sockets, address, ok):
    got, bound = listens_only_on(OTHER + sockets, address, 8000)
    assert got is ok
    assert bound == sockets


def test_other_ports_are_not_confused():
    assert listens_only_on(["tcp://0.0.0.0:18000", "tcp://127.0.0.1:8000"], "127.0.0.1", 8000) == (
        True, ["tcp://127.0.0.1:8000"])
