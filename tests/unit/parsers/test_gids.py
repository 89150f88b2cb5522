"""show_gids, sysfs GID table and RoCE v2 GID index resolution on real tables (DGX Spark GB10, k8s pods)."""

from __future__ import annotations

import errno
import ipaddress
from dataclasses import replace
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.parsers.gids import parse_show_gids, read_gid_table, roce_v2_gid_index
from tests.unit.parsers._fixtures import SYSFS, einval_reader, fixture_text


def test_show_gids_v1_v2_rows_with_blank_ipv4():
    entries = parse_show_gids(fixture_text("show_gids-index-51871324810-tabs.txt"))
    assert [(e.index, e.roce_version, str(e.ipv4) if e.ipv4 else None) for e in entries] == [
        (0, 1, None), (1, 2, None), (2, 1, "192.168.211.242"), (3, 2, "192.168.211.242"),
    ]
    assert {e.netdev for e in entries} == {"rdma0"}
    assert roce_v2_gid_index(entries, "mlx5_0", "192.168.211.242") == 3


def test_show_gids_sparse_table_in_a_pod():
    entries = parse_show_gids(fixture_text("show_gids-nccl-pr-1587-sparse.txt"))
    assert [e.index for e in entries] == [6, 7, 8, 9]
    assert roce_v2_gid_index(entries, "mlx5_0", "11.0.4.1") == 7


def test_show_gids_empty_table():
    assert parse_show_gids(fixture_text("show_gids-k8s-rdma-sriov-dev-plugin-30-empty.txt")) == []


def test_show_gids_truncated_row_is_refused():
    with pytest.raises(UserError, match=r"line 13 is not a complete GID row"):
        parse_show_gids(fixture_text("show_gids-nccl-1573-macvlan-truncated.txt"))


def test_show_gids_count_mismatch_is_refused():
    text = fixture_text("show_gids-index-51871324810-tabs.txt").replace("n_gids_found=4", "n_gids_found=5")
    with pytest.raises(UserError, match="n_gids_found=5 but printed 4"):
        parse_show_gids(text)


def test_show_gids_wrong_tool_is_refused():
    with pytest.raises(UserError, match="expected show_gids output"):
        parse_show_gids(fixture_text("rdma_link-3fs-pr-283.txt"))


def test_sysfs_gb10_table_skips_einval_and_zero_slots():
    entries = read_gid_table(SYSFS / "gb10-spark-0e68", read=einval_reader)
    rail_a = [e for e in entries if e.hca == "rocep1s0f1"]
    assert [(e.index, e.roce_version, e.netdev) for e in rail_a] == [
        (0, 1, "enp1s0f1np1"), (1, 2, "enp1s0f1np1"), (2, 1, "enp1s0f1np1"), (3, 2, "enp1s0f1np1"),
    ]  # slots 4-7 hold the zero GID with EINVAL attributes
    assert rail_a[1].gid == ipaddress.IPv6Address("fe80::4ebb:47ff:fe82:e6a")
    assert roce_v2_gid_index(entries, "rocep1s0f1", "10.100.184.1") == 3
    assert roce_v2_gid_index(entries, "roceP2p1s0f1", "10.100.185.1") == 3


def test_sysfs_pod_table_index_is_not_three():
    entries = read_gid_table(SYSFS / "k8s-macvlan-pod", read=einval_reader)
    assert [e.index for e in entries if e.hca == "mlx5_0"] == [4, 5, 6, 7]
    assert roce_v2_gid_index(entries, "mlx5_0", "10.152.0.12") == 7
    assert roce_v2_gid_index(entries, "mlx5_1", "10.152.4.12") == 7


def test_sysfs_real_kernel_einval_path(tmp_path):
    """The default reader raises OSError(EINVAL) from the kernel; emulate that for types/ndevs of slot 1."""
    port = tmp_path / "class/infiniband/rocep1s0f1/ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    (port / "gids/0").write_text("0000:0000:0000:0000:0000:ffff:0a64:b801\n")
    (port / "gid_attrs/types/0").write_text("RoCE v2\n")
    (port / "gid_attrs/ndevs/0").write_text("enp1s0f1np1\n")
    (port / "gids/1").write_text("0000:0000:0000:0000:0000:ffff:0a64:b802\n")  # stale GID, attrs EINVAL
    (port / "gid_attrs/types/1").write_text("")
    (port / "gid_attrs/ndevs/1").write_text("")
    failing = {port / "gid_attrs/types/1", port / "gid_attrs/ndevs/1"}

    def kernel_like(path: Path) -> str:
        if path in failing:
            raise OSError(errno.EINVAL, "Invalid argument")
        return path.read_text()

    entries = read_gid_table(tmp_path, read=kernel_like)
    assert [(e.index, str(e.ipv4)) for e in entries] == [(0, "10.100.184.1")]


def test_sysfs_other_read_errors_are_reported(tmp_path):
    port = tmp_path / "class/infiniband/mlx5_0/ports/1/gids"
    port.mkdir(parents=True)
    (port / "0").write_text("fe80:0000:0000:0000:0ac0:ebff:fe21:03da\n")

    def denied(path: Path) -> str:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(UserError, match=r"cannot read .*gids/0: Permission denied"):
        read_gid_table(tmp_path, read=denied)


def test_sysfs_without_rdma_devices_is_empty(tmp_path):
    assert read_gid_table(tmp_path) == []


def test_sysfs_default_reader_reads_plain_files():
    """Zero-GID slots are dropped before their (EINVAL) attributes are read, so plain reads suffice here."""
    assert read_gid_table(SYSFS / "gb10-spark-0e68") == read_gid_table(SYSFS / "gb10-spark-0e68", read=einval_reader)
    assert len(read_gid_table(SYSFS / "gb10-spark-0e68")) == 5


def test_gid_index_missing_address_names_hca_and_address():
    entries = read_gid_table(SYSFS / "gb10-spark-0e68", read=einval_reader)
    with pytest.raises(UserError, match=r"no RoCE v2 GID on rocep1s0f1 is ::ffff:10\.100\.184\.2") as info:
        roce_v2_gid_index(entries, "rocep1s0f1", "10.100.184.2")
    assert "10.100.184.2" in info.value.fix


def test_gid_index_v1_only_is_not_enough():
    entries = [e for e in read_gid_table(SYSFS / "gb10-spark-0e68", read=einval_reader) if e.roce_version == 1]
    with pytest.raises(UserError, match="no RoCE v2 GID on rocep1s0f1"):
        roce_v2_gid_index(entries, "rocep1s0f1", "10.100.184.1")


def test_gid_index_unknown_hca():
    entries = read_gid_table(SYSFS / "gb10-spark-0e68", read=einval_reader)
    with pytest.raises(UserError, match=r"no GID table for HCA rocep1s0f0 .*roceP2p1s0f1, rocep1s0f1"):
        roce_v2_gid_index(entries, "rocep1s0f0", "10.100.184.1")


def test_gid_index_several_matches_are_ambiguous():
    entries = read_gid_table(SYSFS / "k8s-macvlan-pod", read=einval_reader)
    twin = next(e for e in entries if e.hca == "mlx5_0" and e.index == 7)
    entries.append(replace(twin, index=11, netdev="net1.100"))  # same address on a second netdev
    with pytest.raises(UserError, match=r"several RoCE v2 GIDs on mlx5_0 are ::ffff:10\.152\.0\.12 \(indexes 7, 11"):
        roce_v2_gid_index(entries, "mlx5_0", "10.152.0.12")


def test_gid_index_bad_address():
    with pytest.raises(UserError, match="not an IPv4 address"):
        roce_v2_gid_index([], "rocep1s0f1", "10.100.184")


def test_show_gids_paste_with_lost_line_breaks_is_refused_with_the_reason():
    # Issue 26: header, rows and n_gids_found=2 on one line; never an empty table.
    with pytest.raises(UserError) as exc:
        parse_show_gids(fixture_text("show_gids-mlx5-1-newlines-lost-in-paste.txt"))
    assert "show_gids output lost its line breaks" in exc.value.cause
    assert "2 GID row(s)" in exc.value.cause and "could not be read" in exc.value.cause


def test_show_gids_header_alone_is_not_an_empty_table():
    header = fixture_text("show_gids-k8s-rdma-sriov-dev-plugin-30-empty.txt").replace("n_gids_found=0\n", "")
    with pytest.raises(UserError, match="no GID row and no 'n_gids_found=N' line"):
        parse_show_gids(header)
