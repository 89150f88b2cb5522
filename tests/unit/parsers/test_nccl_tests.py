"""nccl-tests table parser on real runs (H200, GB200, P40 k8s, A100 sendrecv, GB10 truncated); SOURCES.md."""

from __future__ import annotations

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.parsers.nccl_tests import NcclRow, parse_nccl_tests
from tests.unit.parsers._fixtures import fixture_text


def test_two_node_h200_all_reduce():
    result = parse_nccl_tests(fixture_text("nccl_tests-nvidia-tools-image-h200.txt"))
    assert len(result.rows) == 32
    assert result.avg_busbw_gbyte_s == 36.2205
    assert (result.out_of_bounds, result.out_of_bounds_ok) == (0, True)
    assert result.nccl_version == "2.27.3+cuda12.9"
    assert len(result.ranks) == 16
    assert (result.ranks[15].rank, result.ranks[15].host, result.ranks[15].device, result.ranks[15].gpu_name) == (
        15, "nvidiatools-dgx-9d-workload", 7, "NVIDIA H200",
    )
    assert result.rows[0] == NcclRow(8, 2, "float", "sum", -1, 59.24, 0.0, 0.0, 0, 32.26, 0.0, 0.0, 0)
    last = result.rows[-1]
    assert (last.size_bytes, last.oop_busbw_gbyte_s, last.ip_busbw_gbyte_s) == (17179869184, 92.33, 92.35)


def test_gb200_table_quoted_from_last_rank_line():
    result = parse_nccl_tests(fixture_text("nccl_tests-coreweave-43-gb200.txt"))
    assert [row.size_bytes for row in result.rows] == [536870912, 1073741824, 2147483648, 4294967296, 8589934592]
    assert result.avg_busbw_gbyte_s == 745.53
    assert result.rows[3].oop_time_us == 10094.0


def test_nccl_info_lines_inside_and_after_the_table():
    result = parse_nccl_tests(fixture_text("nccl_tests-koordinator-p40-interleaved.txt"))
    assert len(result.rows) == 11
    assert result.rows[-1].oop_busbw_gbyte_s == 2.84
    assert result.avg_busbw_gbyte_s == 2.61937
    assert result.nccl_version == "2.21.5+cuda12.4"
    assert result.ranks == ()


def test_wrong_column_na():
    result = parse_nccl_tests(fixture_text("nccl_tests-li-plus-sendrecv-na.txt"), require_avg=False)
    assert [(row.oop_wrong, row.ip_wrong) for row in result.rows] == [(0, None)] * 4
    assert result.rows[-1].ip_busbw_gbyte_s == 195.56
    assert result.avg_busbw_gbyte_s is None


def test_missing_avg_line_is_refused_by_default():
    with pytest.raises(UserError, match=r"ends after 4 rows without the '# Avg bus bandwidth' line"):
        parse_nccl_tests(fixture_text("nccl_tests-li-plus-sendrecv-na.txt"))


def test_gb10_run_cut_mid_row():
    with pytest.raises(UserError, match=r"row at line 16 is incomplete \('131072'\)"):
        parse_nccl_tests(fixture_text("nccl_tests-dgx-spark-playbooks-103-gb10-truncated.txt"))


def test_gb10_header_parsed_before_the_cut():
    text = fixture_text("nccl_tests-dgx-spark-playbooks-103-gb10-truncated.txt").rsplit("\n", 2)[0] + "\n"
    result = parse_nccl_tests(text, require_avg=False)
    assert result.nccl_tests_version == "2.20.0"
    assert [rank.host for rank in result.ranks] == ["spark-d708", "spark-dbf4"]
    assert {rank.gpu_name for rank in result.ranks} == {"NVIDIA GB10"}
    assert result.rows[-1].oop_busbw_gbyte_s == 0.96


def test_legacy_layout_is_refused_naming_its_releases():
    with pytest.raises(UserError) as err:
        parse_nccl_tests(fixture_text("nccl_tests-deepops-legacy-format.txt"))
    assert "nccl-tests 2.0.0 to 2.11.0" in err.value.cause
    assert "2.13.0 or later" in err.value.fix and "#wrong" in err.value.fix


# Header lines as nccl-tests prints them (NVIDIA/nccl-tests @v1.0.0 src/all_reduce.cu print_header; @v2.19.6
# src/util.cu writeResultHeader with per_iter_timing); no public capture of these layouts was found.
V1_HEADER = ("#                                  out-of-place                    in-place\n"
             "#        bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw"
             "      res\n")
PER_ITER_HEADER = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    "
                   "i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%\n")


@pytest.mark.parametrize(("text", "layout", "fix"), [
    (V1_HEADER, "nccl-tests 1.0.0", "2.13.0 or later"),
    (PER_ITER_HEADER, "per-iteration layout of nccl-tests 2.19.6", "rerun without -I"),
])
def test_other_layouts_are_named_with_their_releases(text, layout, fix):
    with pytest.raises(UserError) as err:
        parse_nccl_tests(text)
    assert layout in err.value.cause
    assert fix in err.value.fix


def test_wrong_elements_are_counted_including_g_format():
    result = parse_nccl_tests(fixture_text("nccl_tests-rtx3090-inc-wrong-values.txt"))
    assert len(result.rows) == 27
    assert (result.rows[0].oop_wrong, result.rows[0].ip_wrong) == (4, 4)
    # %6g: 1048576 wrong elements print as 1.04858e+06
    assert result.rows[18].size_bytes == 2097152 and result.rows[18].oop_wrong == 1048580
    assert (result.out_of_bounds, result.out_of_bounds_ok) == (108, False)
    assert result.wrong_elements > 500_000_000
    assert result.data_corrupt is True
    assert result.avg_busbw_gbyte_s == 3.02663


def test_clean_runs_are_not_corrupt():
    for name in ("nccl_tests-nvidia-tools-image-h200.txt", "nccl_tests-koordinator-p40-interleaved.txt"):
        result = parse_nccl_tests(fixture_text(name))
        assert (result.wrong_elements, result.data_corrupt) == (0, False)
    sendrecv = parse_nccl_tests(fixture_text("nccl_tests-li-plus-sendrecv-na.txt"), require_avg=False)
    assert sendrecv.data_corrupt is False  # N/A is not a wrong element


def test_cputime_and_timestamp_columns_are_read():
    # The H200 capture with its header as 2.18+ prints it with -C 1 -S 1 and a timestamp after each row
    # (NVIDIA/nccl-tests src/util.cu writeResultHeader / writeBenchmarkLineBody); the numbers are the capture's.
    text = fixture_text("nccl_tests-nvidia-tools-image-h200.txt")
    head, _, tail = text.partition("#wrong     time   algbw   busbw #wrong")
    assert tail, "the fixture's header changed"
    text = head + "#wrong  cputime   algbw   busbw #wrong           timestamp" + tail
    text = "\n".join(line + "  2026-03-06 12:00:01" if line.strip()[:1].isdigit() else line
                      for line in text.splitlines())
    result = parse_nccl_tests(text)
    assert len(result.rows) == 32
    assert result.rows[-1].ip_busbw_gbyte_s == 92.35


def test_other_tool_and_header_only_are_refused():
    with pytest.raises(UserError, match="expected nccl-tests output"):
        parse_nccl_tests(fixture_text("ib_write_bw-deepops-conflicting-cpu.txt"))
    header_only = fixture_text("nccl_tests-coreweave-43-gb200.txt").split("   536870912")[0]
    with pytest.raises(UserError, match="no result row"):
        parse_nccl_tests(header_only)


def test_open_mpi_help_message_lines_are_noise_not_cut_rows():
    # Issue 26: "8 more processes have sent help message ..." starts with a digit but is no row.
    result = parse_nccl_tests(fixture_text("nccl_tests-a100-8gpu-mpirun-openmpi-help-message-noise.txt"))
    assert len(result.rows) == 30
    assert (result.rows[0].size_bytes, result.rows[-1].size_bytes) == (8, 4294967296)
    assert result.avg_busbw_gbyte_s == 72.7724
    assert result.wrong_elements == 0 and result.out_of_bounds_ok is True and not result.data_corrupt
    assert [r.device for r in result.ranks] == list(range(8))


def test_nccl_failure_line_is_quoted_as_the_cause():
    # The line as nccl-tests prints it (NVIDIA/nccl-tests issue #275, title), after the rows it finished.
    text = fixture_text("nccl_tests-a100-8gpu-mpirun-openmpi-help-message-noise.txt")
    cut = text[: text.index("   268435456")] + (
        "dell03: Test NCCL failure common.cu:1012 'internal error - please report this issue to the NCCL developers"
        " / '\n .. dell03 pid 543317: Test failure common.cu:891\n")
    with pytest.raises(UserError) as exc:
        parse_nccl_tests(cut)
    assert ("nccl-tests reported NCCL failure at common.cu:1012: 'internal error - please report this issue to the "
            "NCCL developers'") in exc.value.cause
    assert "NCCL_DEBUG=WARN" in exc.value.fix
    # Before any table (NVIDIA/nccl-tests issue #66, title): the cause is the CUDA failure, not "no table".
    with pytest.raises(UserError, match=r"CUDA failure at common\.cu:730: 'unknown error'"):
        parse_nccl_tests("# nThread 1 nGpus 1 minBytes 1048576\nTest CUDA failure common.cu:730 'unknown error'\n")
