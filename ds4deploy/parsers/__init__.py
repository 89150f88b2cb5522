"""Pure parsers for the text the fabric and GPU checks capture (no subprocess, no I/O).

Each module turns one tool's output into frozen dataclasses whose field names carry their units
(``bw_avg_gbit_s``, ``memory_total_mib``, ``avg_busbw_gbyte_s``). Running the tool is someone else's job;
these functions only read text. Output that is not the expected tool's, or that stops mid-table, raises
`ds4deploy.errors.UserError` naming what was expected (exit code 2: "could not check").

- `ib_write_bw`: perftest ``ib_write_bw`` (``--report_gbits`` or MB/sec), warnings, ``-D``/``--run_infinitely``
  runs whose peak prints 0.00.
- `gids`: ``show_gids`` text, the sysfs GID table (``/sys/class/infiniband/<hca>/ports/<p>/...``, EINVAL slots
  skipped) and `gids.roce_v2_gid_index`, the per-node RoCE v2 GID index of a rail's IPv4 address.
- `rdma_link`: ``rdma link show`` text and ``rdma -j link show`` JSON.
- `nvidia_smi`: ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` with N/A fields (GB10).
- `nccl_tests`: nccl-tests ``*_perf`` tables and the ``# Avg bus bandwidth`` line.

Fixtures: tests/unit/fixtures/parsers/ (sources in SOURCES.md) and tests/unit/fixtures/sysfs/.
"""
