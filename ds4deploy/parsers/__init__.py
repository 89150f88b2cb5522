"""Pure parsers for the text the fabric and GPU checks capture (no subprocess, no I/O).

Each module turns one tool's output into frozen dataclasses whose field names carry their units
(``bw_avg_gbit_s``, ``memory_total_mib``, ``avg_busbw_gbyte_s``). Running the tool is someone else's job;
these functions only read text. Output that is not the expected tool's, or that stops mid-table, raises
`ds4deploy.core.errors.UserError` naming what was expected (exit code 2: "could not check").

- `ib_write_bw`: perftest ``ib_write_bw`` (``--report_gbits`` or MB/sec), warnings, ``-D``/``--run_infinitely``
  runs whose peak prints 0.00, extra result columns (``--cpu_util``), and perftest's own failure lines.
- `gids`: ``show_gids`` text, the sysfs GID table (``/sys/class/infiniband/<hca>/ports/<p>/...``, EINVAL slots
  skipped) and `gids.roce_v2_gid_index`, the per-node RoCE v2 GID index of a rail's IPv4 address. The parser itself
  is `gid_table`, a symlink to ansible/module_utils/ds4_gids.py: the same file the Ansible module ds4_gid_index
  runs on each node (standard library only, it raises its own `GidTableError`; `gids` turns that into `UserError`).
- `rdma_link`: ``rdma link show`` text, ``rdma -j link show`` JSON and MLNX_OFED's ``ibdev2netdev [-v]``.
- `nvidia_smi`: ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` with N/A fields (GB10).
- `nccl_tests`: nccl-tests ``*_perf`` tables (layouts named by the releases that print them), ``#wrong``
  counts and the ``# Avg bus bandwidth`` line.

Fixtures: tests/unit/fixtures/parsers/ (sources in SOURCES.md) and tests/unit/fixtures/sysfs/.
"""
