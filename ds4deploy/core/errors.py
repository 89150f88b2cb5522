"""The one exception type the CLI turns into a clean message.

Every failure a user can cause or fix (a bad recipe, a busy port, Docker missing, a stale render) is raised as
`UserError(cause, fix)`. `ds4deploy.cli.main` prints it as two lines, ``error: <cause>`` and ``fix: <fix>``, and
exits with `code` (2 by default, "could not run"; 1 means "a check ran and failed"). No traceback is shown.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure with a named cause and a named fix.

    Args:
        cause: what is wrong, naming the file, key, value or number involved.
        fix: what the user should do about it.
        code: process exit code; 1 = a check failed, 2 = could not run / bad input (default).
    """

    def __init__(self, cause: str, fix: str, code: int = 2) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix
        self.code = code

    def __str__(self) -> str:
        return f"{self.cause}\nfix: {self.fix}"
