"""One secret detector for every string a recipe, a variant or a render carries.

Renders are committed, so a credential anywhere in a recipe ends up in git history. The detector looks at two
things:

- value shapes of well-known credentials (token prefixes documented by their issuers, listed in `TOKEN_SHAPES`
  with the page each comes from), wherever they appear (an env value, an entrypoint element, a build arg, a JSON
  argument);
- names that carry credentials (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``, ``--api-key``,
  ``--hf-token``...): a mapping key of that kind with a non-empty value, or such a flag in an argv followed by a
  value (``--api-key X`` or ``--api-key=X``).

`find_secrets` walks any nested structure and returns the field path of each hit; callers turn hits into one
`UserError` naming the path and the fix (the key file).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# Value shapes. Each prefix is the issuer's documented token format.
TOKEN_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # https://huggingface.co/docs/hub/security-tokens (user access tokens start with hf_)
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    # https://platform.openai.com/docs/api-reference/authentication (sk-..., sk-proj-...); Anthropic: sk-ant-...
    # https://docs.anthropic.com/en/api/admin-api/apikeys/get-api-key
    ("API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    # https://github.blog/2021-04-05-behind-githubs-new-authentication-token-formats/
    ("GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})")),
    # https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html (access key IDs: AKIA/ASIA)
    ("AWS access key", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    # https://api.slack.com/authentication/token-types
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    # RFC 7519 JSON Web Token: three base64url parts, the first two JSON objects ("eyJ" = '{"')
    ("JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    # RFC 7468 PEM private keys
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    # RFC 3986 userinfo with a password: scheme://user:password@host
    ("password in a URL", re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)),
    # RFC 6750 bearer credentials written into a header value
    ("bearer credential", re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]{12,}")),
)

# Names that carry credentials: upper-cased, '-' as '_', one of these words as a whole '_'-separated part
# (VLLM_API_KEY, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, AWS_SECRET_ACCESS_KEY, --api-key, --hf-token, DB_PASSWORD).
_SECRET_NAME = re.compile(
    r"(^|_)(API_?KEY|ACCESS_KEY|SECRET|SECRET_KEY|SECRETS|TOKEN|AUTH_TOKEN|ACCESS_TOKEN|PASSWORD|PASSWD|"
    r"CREDENTIALS?|PRIVATE_KEY)($|_)"
)
# Names with a secret word that carry no credential: digests and token counts.
_NOT_SECRET_NAME = re.compile(r"(SHA\d*|DIGEST|HASH|_TOKENS|TOKENIZER|_FILE|_PATH)($|_)")


def is_secret_name(name: str) -> bool:
    """Whether an env var, build arg or flag name (``VLLM_API_KEY``, ``--hf-token``) carries a credential."""
    norm = name.lstrip("-").upper().replace("-", "_")
    return bool(_SECRET_NAME.search(norm)) and not _NOT_SECRET_NAME.search(norm)


def token_shape(value: str) -> str | None:
    """The kind of credential `value` contains (e.g. ``"Hugging Face token"``), or None."""
    for kind, rx in TOKEN_SHAPES:
        if rx.search(value):
            return kind
    return None


def _fmt(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _walk(node: Any, path: tuple) -> Iterator[tuple[tuple, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            sub = (*path, str(k))
            if isinstance(k, str) and is_secret_name(k) and v not in (None, "", False):
                yield sub, f"'{k}' names a credential"
            yield from _walk(v, sub)
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            if isinstance(v, str) and v.startswith("--") and is_secret_name(v.split("=", 1)[0]):
                has_value = "=" in v or (i + 1 < len(node) and isinstance(node[i + 1], str)
                                         and not node[i + 1].startswith("--"))
                if has_value:
                    yield (*path, i), f"flag {v.split('=', 1)[0]} passes a credential on the command line"
            yield from _walk(v, (*path, i))
    elif isinstance(node, str):
        kind = token_shape(node)
        if kind:
            yield path, f"value looks like a {kind}"


def find_secrets(node: Any, root: str = "") -> list[str]:
    """Every place in `node` (nested dicts/lists/strings) that holds or names a credential.

    Args:
        node: the structure to scan (a raw recipe mapping, a render's parsed compose file, a text).
        root: a prefix for the paths (e.g. ``"compose.yaml"``).
    Returns:
        ``"<field path>: <why>"`` lines, e.g. ``"engine.entrypoint[4]: value looks like a API key (sk-...)"``.
    """
    out = []
    for path, why in _walk(node, ()):
        where = _fmt(path)
        out.append(f"{root}{'.' if root and where else ''}{where or '(value)'}: {why}")
    return list(dict.fromkeys(out))
