"""Host, rail and fabric checks of provisioned nodes, one row per check and host.

Each check returns `report.Row` objects: the check's name, what the recipe expects, what was measured, a verdict
(``pass`` / ``fail`` / ``skip`` / ``error``) and, for anything but a pass, the remediation. A host without the
hardware a check needs reports ``skip`` with the reason ("skipped: no NVIDIA GPU", "skipped: no RDMA device"),
never ``pass``; a command that could not run reports ``error`` ("could not check").

Modules:
- `report`: the row model, exit codes (0 all passed or skipped, 1 a check failed, 2 a check could not run) and
  the rich tables `make check` prints.
- `target`: how a command reaches a host (local, inside a network namespace, over ssh, through a testinfra host).
- `inputs`: bad-input checks run on the control host before any host is changed (rail addresses, duplicate
  addresses, clocks a GPU cannot do) and the GPU datasheet table.
- `host`: GPU count/arch/driver, persistence, power limit, clocks, RAM per NUMA node, memlock, GPUs in containers,
  known-bad kernels.
- `rails`: per-rail address and subnet, MTU, link state and speed, routing and don't-fragment ping to the peer.
- `fabric`: RDMA link state, the per-node RoCE v2 GID index, ib_write_bw per rail and both rails at once,
  nccl-tests all-reduce.
- `runner`: runs the selected groups against an inventory.
"""
