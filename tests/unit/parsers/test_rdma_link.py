"""rdma link show parsers on real captures (deepseek-ai/3FS threads); JSON per iproute2 rdma/link.c keys."""

from __future__ import annotations

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.parsers.rdma_link import RdmaLink, parse_ibdev2netdev, parse_rdma_link_text
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


def test_ibdev2netdev_gb10_twin_hcas():
    links = parse_ibdev2netdev(fixture_text("ibdev2netdev-dgx-spark-playbooks-connect-two-sparks.txt"))
    assert [(m.device, m.port, m.netdev, m.carrier) for m in links] == [
        ("roceP2p1s0f0", 1, "enP2p1s0f0np0", "Down"), ("roceP2p1s0f1", 1, "enP2p1s0f1np1", "Up"),
        ("rocep1s0f0", 1, "enp1s0f0np0", "Down"), ("rocep1s0f1", 1, "enp1s0f1np1", "Up"),
    ]
    assert [m.is_up for m in links] == [False, True, False, True]
    assert links[3].port_state is None and links[3].shown == "enp1s0f1np1 Up (ibdev2netdev)"


def test_ibdev2netdev_verbose_reads_the_port_state():
    links = parse_ibdev2netdev(fixture_text("ibdev2netdev-sriov-cni-verbose.txt"))
    assert len(links) == 6
    assert (links[0].device, links[0].netdev, links[0].port_state, links[0].carrier) == (
        "mlx5_0", "enp2s0f0", "ACTIVE", "Up")
    assert (links[2].device, links[2].port_state, links[2].is_up) == ("mlx5_2", "DOWN", False)  # "(DOWN  )"
    assert links[0].shown == "ACTIVE, enp2s0f0 Up (ibdev2netdev)"


def test_ibdev2netdev_vf_down_and_errors():
    (vf,) = parse_ibdev2netdev(fixture_text("ibdev2netdev-sriov-network-operator-382-vf-down.txt"))
    assert (vf.device, vf.netdev, vf.is_up) == ("mlx5_3", "net1", False)
    assert parse_ibdev2netdev("") == []
    with pytest.raises(UserError, match="expected `ibdev2netdev` output"):
        parse_ibdev2netdev(fixture_text("rdma_link-3fs-pr-283.txt"))
    with pytest.raises(UserError, match="line 1"):
        parse_ibdev2netdev("mlx5_0 port 1 <===> ib0\n")  # pre-2017 style: no state printed
    with pytest.raises(UserError, match="line 2"):
        parse_ibdev2netdev("rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\nrocep1s0f0 port 1 ==> enp1s0f\n")
