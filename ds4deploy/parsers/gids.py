"""RoCE GID tables on the control host: the node-side parser (ansible/module_utils/ds4_gids.py) with `UserError`.

There is one GID-table parser. It lives in ansible/module_utils/ds4_gids.py because the Ansible module
``ds4_gid_index`` runs it on every node (ansible/library/ds4_gid_index.py); ``ds4deploy/parsers/gid_table.py`` is a
symlink to that file, so the installed package carries the same code. This module re-exports it for the control
host's checks and the ``ds4deploy fabric gid-index`` command, turning its `GidTableError` (the node has no
ds4deploy package, so no `UserError` there) into `ds4deploy.core.errors.UserError` with the same cause and fix.
See `ds4deploy.parsers.gid_table` for the sysfs layout, the kernel's EINVAL slots and the per-node index reports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from ds4deploy.core.errors import UserError
from ds4deploy.parsers import gid_table

GidEntry = gid_table.GidEntry
NO_RDMA = gid_table.NO_RDMA
_F = TypeVar("_F", bound=Callable)


def _user_errors(fn: _F) -> _F:
    """`fn` raising `UserError` (code 2, "could not check") where the shared parser raises `GidTableError`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gid_table.GidTableError as exc:
            raise UserError(exc.cause, exc.fix) from exc

    return wrapper  # type: ignore[return-value]


parse_show_gids = _user_errors(gid_table.parse_show_gids)
read_gid_table = _user_errors(gid_table.read_gid_table)
roce_v2_gid_index = _user_errors(gid_table.roce_v2_gid_index)
