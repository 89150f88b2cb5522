"""Ansible connection to a rehearsal stand-in node (tests/rehearse/nodes.py): Ansible's local connection, with every
command run through the node's ``enter`` script, which joins the node's network and mount namespaces and points
the docker CLI at the node's own Docker daemon. Files are put and fetched on this machine's file system, which the
node's mount namespace shares (only the node's hardware stand-ins and state directories are its own)."""

from __future__ import annotations

import shlex

from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
    name: rehearse_node
    short_description: run on a ds4deploy rehearsal stand-in node (network and mount namespaces of this machine)
    description:
        - Ansible's local connection, each command wrapped in the node's enter script (tests/rehearse/nodes.py).
    author: ds4deploy
    options:
        node_dir:
            description: The stand-in node's directory (holds its enter script).
            required: true
            vars:
                - name: ds4_rehearse_node_dir
        become_success_timeout:
            type: int
            default: 10
            description: As for the local connection.
            vars:
                - name: ansible_local_become_success_timeout
        become_strip_preamble:
            type: bool
            default: true
            description: As for the local connection.
            vars:
                - name: ansible_local_become_strip_preamble
    extends_documentation_fragment:
        - connection_pipelining
"""


class Connection(LocalConnection):
    """The local connection, inside the stand-in node."""

    transport = "rehearse_node"

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True):
        """Run `cmd` with /bin/sh inside the node (its enter script)."""
        enter = f"{self.get_option('node_dir')}/enter"
        return super().exec_command(f"exec {shlex.quote(enter)} /bin/sh -c {shlex.quote(cmd)}", in_data, sudoable)
