"""ib_write_bw parser on real perftest captures (DGX Spark, DGX/OpenShift, k8s); see fixtures/parsers/SOURCES.md."""

from __future__ import annotations

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.parsers.ib_write_bw import parse_ib_write_bw
from tests.unit.parsers._fixtures import fixture_text


def test_gb10_run_infinitely_rows_and_unknown_peak():
    result = parse_ib_write_bw(fixture_text("ib_write_bw-dgx-spark-playbooks-run-infinitely.txt"))
    assert result.test == "RDMA_Write BW Test"
    assert (result.device, result.transport, result.link_type) == ("rocep1s0f0", "IB", "Ethernet")
    assert (result.gid_index, result.mtu_bytes, result.num_qps) == (3, 1024, 1)
    assert result.reported_unit == "Gb/sec"
    assert [row.iterations for row in result.rows] == [882805, 882802, 882791, 882791, 882821]
    assert [row.bw_avg_gbit_s for row in result.rows] == [92.57, 92.57, 92.57, 92.56, 92.57]
    assert all(row.bw_peak_gbit_s is None for row in result.rows)  # printed 0.00 = not measured
    assert result.bw_avg_gbit_s == 92.57
    assert result.rows[-1].msg_rate_mpps == 0.176555
    assert result.warnings == ("WARNING: BW peak won't be measured in this run.",)


def test_duration_run_with_warnings_before_banner_and_tabs_in_row():
    result = parse_ib_write_bw(fixture_text("ib_write_bw-nvidia-tools-image-cuda-D60.txt"))
    assert (result.device, result.num_qps, result.gid_index, result.mtu_bytes) == ("mlx5_1", 16, 3, 1024)
    assert len(result.rows) == 1
    row = result.rows[0]
    assert (row.size_bytes, row.iterations, row.bw_peak_gbit_s, row.bw_avg_gbit_s, row.msg_rate_mpps) == (
        65536, 10384867, None, 181.46, 0.3461,
    )
    assert "Requested mtu is higher than active mtu" in result.warnings
    assert "Changing to active mtu - 3" in result.warnings


def test_conflicting_cpu_frequency_between_header_and_row():
    result = parse_ib_write_bw(fixture_text("ib_write_bw-deepops-conflicting-cpu.txt"))
    assert (result.device, result.gid_index, result.mtu_bytes) == ("mlx5_0", 3, 4096)
    assert result.bw_peak_gbit_s == 92.42
    assert result.bw_avg_gbit_s == 92.40
    assert result.warnings == (
        "Conflicting CPU frequency values detected: 1200.535000 != 1251.336000. CPU Frequency is not max.",
    )


def test_gb10_rdma_cm_run_has_no_gid_index():
    result = parse_ib_write_bw(fixture_text("ib_write_bw-spark-vllm-docker-rdma-cm.txt"))
    assert (result.device, result.link_type, result.num_qps, result.gid_index) == ("rocep1s0f1", "IB", 4, None)
    assert (result.bw_peak_gbit_s, result.bw_avg_gbit_s) == (111.72, 111.71)
    assert result.warnings == ()


def test_mb_per_sec_output_is_converted_from_mib_per_second():
    result = parse_ib_write_bw(fixture_text("ib_write_bw-koordinator-mbsec.txt"))
    assert result.reported_unit == "MB/sec"
    # perftest MB/sec = 2^20 bytes/s (format_factor 0x100000): 2758.38 MiB/s * 8 * 2^20 / 1e9 Gb/s
    assert result.bw_avg_gbit_s == pytest.approx(23.13897, abs=1e-5)
    assert result.bw_peak_gbit_s == pytest.approx(2758.40 * 8 * 1048576 / 1e9)
    assert result.bw_avg_gbit_s < 25  # not to be mistaken for 2758 "Gb/s"


def test_truncated_run_names_the_cut_line():
    with pytest.raises(UserError, match=r"line 26 is incomplete \('65536      664644'\)"):
        parse_ib_write_bw(fixture_text("ib_write_bw-perftest-234-truncated.txt"))


def test_banner_without_result_table_is_refused():
    text = fixture_text("ib_write_bw-deepops-conflicting-cpu.txt").split(" #bytes")[0]
    with pytest.raises(UserError, match="stops before its result table"):
        parse_ib_write_bw(text)


def test_header_without_any_row_is_refused():
    text = fixture_text("ib_write_bw-spark-vllm-docker-rdma-cm.txt").split(" 65536")[0]
    with pytest.raises(UserError, match="no result row"):
        parse_ib_write_bw(text)


def test_other_tools_output_is_refused():
    with pytest.raises(UserError, match="expected ib_write_bw output"):
        parse_ib_write_bw(fixture_text("nccl_tests-coreweave-43-gb200.txt"))


def test_cpu_util_column_is_read():
    result = parse_ib_write_bw(fixture_text("ib_write_bw-issue15-cpu-util-column.txt"))
    (row,) = result.rows
    assert (row.size_bytes, row.iterations, row.bw_peak_gbit_s, row.bw_avg_gbit_s) == (65536, 1000000, None, 90.0)
    assert row.msg_rate_mpps == 0.171661
    assert row.extra == {"CPU_Util[%]": 4.0}
    assert row.cpu_util_pct == 4.0
    # Without the column there is no value, not a zero.
    assert parse_ib_write_bw(fixture_text("ib_write_bw-deepops-conflicting-cpu.txt")).rows[0].cpu_util_pct is None


def test_extra_column_row_cut_short_is_still_a_cut():
    text = fixture_text("ib_write_bw-issue15-cpu-util-column.txt").replace("0.171661         4.00", "0.171661")
    with pytest.raises(UserError, match="cut mid-row"):
        parse_ib_write_bw(text)


@pytest.mark.parametrize(("name", "kind", "quoted", "fix_needle"), [
    ("ib_write_bw-perftest-pr-228-couldnt-connect.txt", "TCP connection to the server",
     "Couldn't connect to 192.168.125.211:18515", "start the server before the client"),
    ("ib_write_bw-issue15-fail-couldnt-connect.txt", "TCP connection to the server",
     "Unable to init the socket connection", "same -p port"),
    ("ib_write_bw-k8s-rdma-shared-dev-plugin-169-no-device.txt", "no RDMA device",
     "Did not detect devices", "/dev/infiniband"),
    ("ib_write_bw-issue15-fail-no-device.txt", "no RDMA device",
     "Unable to find the Infiniband/RoCE device", "modprobe mlx5_ib"),
    ("ib_write_bw-perftest-54-rdma-cm-rejected.txt", "rdma_cm connection",
     "Event: RDMA_CM_EVENT_REJECTED; error: -111.", "server's rail address"),
    ("ib_write_bw-perftest-105-create-qp.txt", "RDMA resources",
     "Failed to create QP.", "ulimit -l unlimited"),
])
def test_perftest_own_failure_is_quoted_with_its_fix(name, kind, quoted, fix_needle):
    with pytest.raises(UserError) as err:
        parse_ib_write_bw(fixture_text(name))
    assert f"ib_write_bw failed ({kind})" in err.value.cause
    assert f"'{quoted}'" in err.value.cause
    assert fix_needle in err.value.fix
    assert "no table found" not in err.value.cause and "found none" not in err.value.cause


def test_connection_failure_after_the_tcp_exchange():
    # linux-rdma/perftest issue #132: the server's and the client's lines, as quoted there.
    server = ("ethernet_read_keys: Couldn't read remote address\nUnable to read to socket/rdma_cm\n"
              "Failed to exchange data between server and clients\n")
    with pytest.raises(UserError) as err:
        parse_ib_write_bw(server)
    assert "RDMA connection after the TCP exchange" in err.value.cause
    assert "'Failed to exchange data between server and clients'" in err.value.cause
    assert "-x" in err.value.fix and "gid-index" in err.value.fix
    with pytest.raises(UserError, match="RDMA connection after the TCP exchange"):
        parse_ib_write_bw("Failed to modify QP to RTS\n Unable to Connect the HCA's through the link\n")


def test_server_side_mb_header_over_gbit_values_is_read_by_msg_rate():
    # Issue 26: only the client ran --report_gbits; the server's header says MB/sec over Gb/s values.
    result = parse_ib_write_bw(fixture_text("ib_write_bw-k8s-pod-server-mbsec-header-gbit-values.txt"))
    assert (result.reported_unit, result.values_unit) == ("MB/sec", "Gb/sec")
    assert result.bw_avg_gbit_s == 196.07  # 0.002922 Mpps x 8388608 B x 8 = 196.1 Gb/s; as MiB/s it would be 1.64
    assert result.rows[0].size_bytes == 8388608
    assert any("MsgRate x #bytes says the values are Gb/sec" in w for w in result.warnings)


def test_values_that_agree_with_neither_unit_are_refused():
    text = fixture_text("ib_write_bw-k8s-pod-server-mbsec-header-gbit-values.txt").replace("0.002922", "0.292200")
    with pytest.raises(UserError, match="neither as Gb/sec nor as MB/sec"):
        parse_ib_write_bw(text)
