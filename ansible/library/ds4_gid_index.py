#!/usr/bin/python
"""Ansible module ds4_gid_index: this node's RoCE v2 GID index per HCA, read from its own sysfs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ds4_gid_index
short_description: Resolve this node's RoCE v2 GID index (NCCL_IB_GID_INDEX) from its own sysfs GID table
description:
  - Reads C(<sysfs_root>/class/infiniband/<hca>/ports/<port>/gids/<n>) and C(gid_attrs/types/<n>) on the node
    and finds, for every HCA of every rail, the slot whose GID is the rail address in IPv4-mapped form
    (C(::ffff:a.b.c.d)) as C(RoCE v2) (docs/sources.md#gid-resolution).
  - The index differs between nodes and moves after reboots, so it is resolved on the node at every deploy and
    restart. NCCL_IB_GID_INDEX is one value per engine, so every HCA of the node must agree.
  - Read-only; supports check mode. The parser is module_utils/ds4_gids.py, shared with ds4deploy.
options:
  rails:
    description:
      - This node's fabric rails (C(ds4_node_rails)), in the node's own names (the inventory's
        C(ds4_rails.<rail>.hcas) override the recipe's per node); each needs C(name) and C(hcas). Empty = no fabric.
    type: list
    elements: dict
    required: true
  addresses:
    description: The node's inventory C(ds4_rails), C({<rail>: {address: a.b.c.d}}).
    type: dict
    default: {}
  sysfs_root:
    description: Where sysfs is mounted on the node; tests point it at fixture trees laid out the same way.
    type: path
    default: /sys
author: ds4deploy
"""

EXAMPLES = r"""
- name: Resolve this node's RoCE v2 GID index
  ds4_gid_index:
    rails: "{{ ds4_node_rails }}"
    addresses: "{{ ds4_rails | default({}) }}"
  register: gid
"""

RETURN = r"""
gid_index:
  description: The index every HCA of the node resolved to; null without rails.
  type: int
  returned: always
hcas:
  description: One entry per HCA, C({rail, hca, address, gid_index}).
  type: list
  elements: dict
  returned: always
env:
  description: C({DS4_NCCL_IB_GID_INDEX: "<n>"}) for the node's .env; empty without rails.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible.module_utils.ds4_gids import GidTableError, read_gid_table, resolve_rails  # noqa: E402


def main() -> None:
    """Resolve the index; fail with "<cause>. Fix: <fix>" when the table cannot give one."""
    module = AnsibleModule(
        argument_spec={
            "rails": {"type": "list", "elements": "dict", "required": True},
            "addresses": {"type": "dict", "default": {}},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )
    rails, root = module.params["rails"], module.params["sysfs_root"]
    try:
        table = read_gid_table(root) if rails else []
        result = resolve_rails(table, rails, module.params["addresses"], root)
    except GidTableError as exc:
        module.fail_json(msg=f"{exc.cause}. Fix: {exc.fix}.")
    env = {} if result["gid_index"] is None else {"DS4_NCCL_IB_GID_INDEX": str(result["gid_index"])}
    module.exit_json(changed=False, env=env, **result)


if __name__ == "__main__":
    main()
