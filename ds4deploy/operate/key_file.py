"""The API key file: ``VLLM_API_KEY=<key>`` in a 0600 file outside the repo (path: `Recipe.key_file`).

Everything that needs the key (the bench harness, the serving checks) reads it here, so the file format is
written down once. The key is never printed or logged by ds4deploy.
"""

from __future__ import annotations

import stat
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import Recipe


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=value`` lines of a docker env file; blank lines and ``#`` comments are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def read_api_key(recipe: Recipe) -> str | None:
    """The deployed API key of `recipe` on this host, or None when the recipe serves without one.

    Raises:
        UserError: auth is on but the key file is missing, unreadable (not deployed yet, or not root) or readable
            by others than its owner (`check_key_file`).
    """
    if recipe.serving.auth.mode != "api_key":
        return None
    path = Path(recipe.key_file)
    return read_key_line(path, "the API key file", "deploy the recipe first (`make deploy`), and run as root",
                         f"delete {path} and deploy again to regenerate it")


def read_key_line(path: Path, what: str, read_fix: str, missing_fix: str) -> str:
    """The ``VLLM_API_KEY=`` value of key file `path` (`what` names it in messages), after `check_key_file`.

    Raises:
        UserError: the file is missing or open to others (`check_key_file`), unreadable or not UTF-8 (fix
            `read_fix`), or holds no VLLM_API_KEY= line (fix `missing_fix`).
    """
    check_key_file(path)
    try:
        key = parse_env_file(path.read_text(encoding="utf-8")).get("VLLM_API_KEY")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}", read_fix) from None
    if not key:
        raise UserError(f"{path} has no VLLM_API_KEY= line", missing_fix)
    return key


def check_key_file(path: Path) -> None:
    """Refuse a key file that is missing or that group or others may read or write (the stack role applies the
    same rule on every node before anything starts).

    Raises:
        UserError: naming the file and its mode, with the fix.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserError(f"the API key file {path} does not exist",
                        "deploy the recipe first (`make deploy` generates it), or restore it (VLLM_API_KEY=<key>, "
                        "mode 0600)") from None
    except OSError as exc:
        raise UserError(f"cannot read the API key file {path}: {exc.strerror}", "run as root") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"the API key file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others than its owner "
                        "may read or change the key",
                        f"chmod 0600 {path} (and rotate the key if others may have read it)")
