#!/usr/bin/python
"""Fact module of the rehearsal stand-in nodes: the machine architecture the node stands in for.

Runs after ansible.builtin.setup (the inventory's ansible_facts_modules, ansible_facts_parallel: false, so it wins):
the kernel of this machine reports its own architecture, which no namespace can change. Reads machine.json in the
node's directory ($DS4_REHEARSE_NODE_DIR, set by the node's enter script).
"""

from __future__ import annotations

import json
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = """
module: rehearse_machine
short_description: the architecture a rehearsal stand-in node stands in for
description: Reports ansible_architecture from $DS4_REHEARSE_NODE_DIR/machine.json.
options: {}
author: ds4deploy
"""


def main() -> None:
    """Report the stand-in architecture (fails outside a stand-in node)."""
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    node_dir = os.environ.get("DS4_REHEARSE_NODE_DIR")
    if not node_dir:
        module.fail_json(msg="not on a rehearsal stand-in node (no DS4_REHEARSE_NODE_DIR)")
    with open(os.path.join(node_dir, "machine.json"), encoding="utf-8") as fh:
        machine = json.load(fh)
    module.exit_json(changed=False, ansible_facts={"ansible_architecture": machine["architecture"]})


if __name__ == "__main__":
    main()
