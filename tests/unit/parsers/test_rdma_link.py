"""rdma link show parsers on real captures (deepseek-ai/3FS threads); JSON per iproute2 rdma/link.c keys."""

from __future__ import annotations

import json

import pytest

from ds4deploy.errors import UserError
from ds4deploy.parsers.rdma_link import RdmaLink, parse_rdma_link_json, parse_rdma_link_text
from tests.unit.parsers._fixtures import fixture_text


def test_text_two_mlx5_ports_with_trailing_spaces():
    links = parse_rdma_link_text(fixture_text("rdma_link-3fs-pr-283.txt"))
    assert links == [
        RdmaLink("mlx5_0", 1, "ACTIVE", "LINK_UP", "p1p1"),
        RdmaLink("mlx5_1", 1, "ACTIVE", "LINK_UP", "p1p2"),
    ]
    assert all(link.is_up for link in links)


def test_text_soft_roce_port():
    (link,) = parse_rdma_link_text(fixture_text("rdma_link-3fs-263-rxe.txt"))
    assert (link.device, link.port, link.netdev, link.is_up) == ("rxe_0", 1, "p1p1", True)


def test_text_early_iproute2_format_and_down_port():
    # Line shape printed by early iproute2 rdma/link.c: "%u/%u: %s/%u: " then the key/value pairs.
    text = "1/1: mlx5_0/1: state DOWN physical_state DISABLED netdev ens4f0 \n"
    (link,) = parse_rdma_link_text(text)
    assert (link.device, link.state, link.physical_state, link.is_up) == ("mlx5_0", "DOWN", "DISABLED", False)


def test_text_empty_output_means_no_device():
    assert parse_rdma_link_text("") == []


def test_text_wrong_tool_is_refused():
    with pytest.raises(UserError, match="expected `rdma link show` output"):
        parse_rdma_link_text(fixture_text("show_gids-index-51871324810-tabs.txt"))


def test_text_cut_line_is_refused():
    with pytest.raises(UserError, match="lacks state/physical_state"):
        parse_rdma_link_text("link mlx5_0/1 state ACTIVE\n")


def _as_json(links: list[RdmaLink]) -> str:
    """The JSON iproute2 >= 5 prints for these links (keys from rdma/link.c: ifindex, ifname, port, ...)."""
    return json.dumps(
        [
            {"ifindex": i, "ifname": link.device, "port": link.port, "state": link.state,
             "physical_state": link.physical_state, "netdev": link.netdev, "netdev_index": 2 + i}
            for i, link in enumerate(links)
        ]
    )


def test_json_matches_text_for_the_same_ports():
    # No captured `rdma -j link show` was found (SOURCES.md): the JSON is built from the real text capture
    # with iproute2's key names, so the two parsers must agree on it.
    links = parse_rdma_link_text(fixture_text("rdma_link-3fs-pr-283.txt"))
    assert parse_rdma_link_json(_as_json(links)) == links


def test_json_early_ifname_with_port():
    (link,) = parse_rdma_link_json('[{"ifindex":1,"port":1,"ifname":"mlx5_0/1","state":"ACTIVE",'
                                   '"physical_state":"LINK_UP"}]')
    assert (link.device, link.port, link.netdev) == ("mlx5_0", 1, None)


def test_json_errors():
    assert parse_rdma_link_json("[]") == []
    with pytest.raises(UserError, match="unparseable"):
        parse_rdma_link_json(fixture_text("rdma_link-3fs-pr-283.txt"))
    with pytest.raises(UserError, match="lacks physical_state"):
        parse_rdma_link_json('[{"ifname":"mlx5_0","port":1,"state":"ACTIVE"}]')
    with pytest.raises(UserError, match="a list of link objects"):
        parse_rdma_link_json('{"ifname":"mlx5_0"}')
