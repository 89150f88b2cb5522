"""nvidia-smi --query-gpu CSV parser on real V100, RTX 3090 and GB10 captures (fixtures/parsers/SOURCES.md)."""

from __future__ import annotations

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.parsers.nvidia_smi import parse_query_gpu
from tests.unit.parsers._fixtures import fixture_text

GPU_UTILS_FIELDS = (
    "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,gpu_uuid,"
    "power.draw,temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,clocks.mem,utilization.gpu,"
    "utilization.memory,fan.speed,pcie.link.width.current,pstate"
).split(",")


def test_v100_eight_gpus_one_busy():
    rows = parse_query_gpu(fixture_text("nvidia_smi-dsh-gpu-v100.txt"))
    assert len(rows) == 8
    assert rows[0] == {
        "index": 0, "name": "Tesla V100-SXM2-32GB", "memory_total_mib": 32768, "memory_used_mib": 4,
        "utilization_gpu_pct": 0, "temperature_gpu_c": 35,
    }
    assert rows[5]["memory_total_mib"] == 32764
    busy = rows[6]
    assert (busy["memory_used_mib"], busy["utilization_gpu_pct"], busy["temperature_gpu_c"]) == (13928, 100, 51)


def test_rtx3090_identity_and_clocks():
    ident = parse_query_gpu(fixture_text("nvidia_smi-qwen36-rtx3090-identity.txt"))
    assert [row["index"] for row in ident] == [0, 1]
    assert ident[1] == {
        "index": 1, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576,
        "driver_version": "580.126.09", "compute_cap": "8.6",
    }
    (clocks,) = parse_query_gpu(fixture_text("nvidia_smi-qwen36-rtx3090-clocks.txt"))
    assert clocks == {
        "clocks_current_graphics_mhz": 1965, "clocks_max_graphics_mhz": 2100,
        "clocks_current_memory_mhz": 9751, "clocks_max_memory_mhz": 9751,
        "power_limit_w": 350.0, "power_default_limit_w": 350.0, "power_max_limit_w": 350.0,
    }


def test_gb10_na_fields_become_none():
    (row,) = parse_query_gpu(fixture_text("nvidia_smi-smart-city-gb10.txt"))
    assert row == {
        "name": "NVIDIA GB10", "memory_total_mib": None, "driver_version": "580.142", "temperature_gpu_c": 44,
        "utilization_gpu_pct": 66, "clocks_current_sm_mhz": 2528, "clocks_current_memory_mhz": None,
    }


def test_noheader_nounits_with_field_list_and_aliases():
    (row,) = parse_query_gpu(fixture_text("nvidia_smi-gpu-utils-83-noheader-nounits.txt"), GPU_UTILS_FIELDS)
    assert (row["power_limit_w"], row["power_min_limit_w"], row["power_max_limit_w"]) == (200.0, 105.0, 292.0)
    assert (row["memory_total_mib"], row["power_draw_w"], row["temperature_gpu_c"]) == (7979, 176.98, 45)
    assert row["temperature_memory_c"] is None  # bare "N/A" under nounits
    assert row["clocks_current_sm_mhz"] == 1965  # alias clocks.sm
    assert row["clocks_current_memory_mhz"] == 7199  # alias clocks.mem
    assert (row["uuid"], row["name"], row["pstate"]) == (
        "GPU-22b2c6ac-2d49-4863-197c-9c469071178a", "GeForce RTX 2080", "P2",
    )


def test_header_checked_against_requested_fields():
    text = fixture_text("nvidia_smi-qwen36-rtx3090-clocks.txt")
    aliases = ["clocks.gr", "clocks.max.gr", "clocks.mem", "clocks.max.mem", "power.limit",
               "power.default_limit", "power.max_limit"]
    assert parse_query_gpu(text, aliases)[0]["clocks_current_graphics_mhz"] == 1965
    with pytest.raises(UserError, match=r"header names .* but the query asked for"):
        parse_query_gpu(text, ["power.limit"])


def test_not_supported_and_odd_spacing():
    # "[Not Supported]" is nvidia-smi's spelling for unsupported fields; no real capture of it was found
    # (SOURCES.md), so this reuses the real GB10 line with that token in place of [N/A].
    text = fixture_text("nvidia_smi-smart-city-gb10.txt").replace("[N/A], 580", "[Not Supported] ,580")
    (row,) = parse_query_gpu(text)
    assert (row["memory_total_mib"], row["driver_version"]) == (None, "580.142")


def test_truncated_line_is_refused():
    text = fixture_text("nvidia_smi-dsh-gpu-v100.txt").rsplit(",", 1)[0]
    with pytest.raises(UserError, match="line 9 has 5 values for 6 fields"):
        parse_query_gpu(text)


def test_noheader_without_fields_is_refused():
    with pytest.raises(UserError, match="expected nvidia-smi --query-gpu CSV with a header line"):
        parse_query_gpu(fixture_text("nvidia_smi-gpu-utils-83-noheader-nounits.txt"))


def test_wrong_unit_value_is_refused():
    text = fixture_text("nvidia_smi-qwen36-rtx3090-clocks.txt").replace("1965 MHz", "1965 W", 1)
    with pytest.raises(UserError, match=r"clocks.current.graphics .* '1965 W', expected a number in MHz"):
        parse_query_gpu(text)


def test_other_tool_or_empty_output_is_refused():
    with pytest.raises(UserError, match="printed nothing"):
        parse_query_gpu("\n")
    with pytest.raises(UserError, match="expected nvidia-smi --query-gpu CSV"):
        parse_query_gpu(fixture_text("rdma_link-3fs-pr-283.txt"))


def test_plain_table_is_read_as_users_paste_it():
    # Issue 26: the plain `nvidia-smi` table (driver 535 layout), 4x V100.
    rows = parse_query_gpu(fixture_text("nvidia_smi-v100-sxm2-4gpu-table-driver535-grid5000.txt"))
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert {r["name"] for r in rows} == {"Tesla V100-SXM2-32GB"}
    assert {r["persistence_mode"] for r in rows} == {"Enabled"}
    assert {r["power_limit_w"] for r in rows} == {300.0}
    assert {r["memory_total_mib"] for r in rows} == {32768}
    assert rows[0]["driver_version"] == "535.183.06" and rows[0]["pci_bus_id"] == "00000000:1A:00.0"
    # What the host checks ask for: fields the table does not show are None, never guessed.
    from ds4deploy.checks.host import GPU_FIELDS

    checked = parse_query_gpu(fixture_text("nvidia_smi-v100-sxm2-4gpu-table-driver535-grid5000.txt"), GPU_FIELDS)
    assert checked[0] == {"index": 0, "name": "Tesla V100-SXM2-32GB", "driver_version": "535.183.06",
                          "compute_cap": None, "persistence_mode": "Enabled", "power_limit_w": 300.0,
                          "power_max_limit_w": None, "clocks_max_graphics_mhz": None}


def test_q_output_is_read_and_a_cut_capture_refused():
    text = fixture_text("nvidia_smi-q-v100-sxm2-traverse-418-first-of-4.txt")
    with pytest.raises(UserError, match="Attached GPUs : 4 but prints 1 GPU section"):
        parse_query_gpu(text)
    # The same capture as a one-GPU host would print it.
    one = text.replace("Attached GPUs                       : 4", "Attached GPUs                       : 1")
    (row,) = parse_query_gpu(one)
    assert (row["name"], row["persistence_mode"], row["driver_version"]) == ("Tesla V100-SXM2-32GB", "Enabled",
                                                                            "418.67")
    assert (row["memory_total_mib"], row["power_limit_w"], row["power_max_limit_w"]) == (32480, 300.0, 300.0)
    assert (row["clocks_max_graphics_mhz"], row["pci_bus_id"]) == (1530, "00000004:04:00.0")
