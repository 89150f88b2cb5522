"""One secret detector for every string a recipe, a variant, a lock, a manifest, a render or a message carries.

Renders and locks are committed, so a credential anywhere in them ends up in git history; a message or a log line
ends up in a terminal, a CI log or an issue. The detector goes by what a secret looks like, not by a list of
known variable names:

- value shapes of well-known credentials (token prefixes documented by their issuers, listed in `TOKEN_SHAPES`
  with the page each comes from), HTTP credentials written as a header (``Authorization: Basic ...``,
  ``Proxy-Authorization: Bearer ...``, RFC 9110 section 11.6.2 / 11.7.2) anywhere in a string, and URL userinfo
  (``scheme://user[:password]@host``, RFC 3986 section 3.2.1, which deprecates a password there);
- high-entropy tokens (`high_entropy`): a run of 20+ base64/hex-alphabet characters mixing letters and digits
  whose Shannon entropy is that of random bytes, not of words, versions or digests the recipe pins;
- names that carry credentials (``*_API_KEY``, ``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``,
  ``*_AUTH``, ``*_CREDENTIALS``, ``--api-key``, ``--hf-token``...): a mapping key of that kind with a non-empty
  scalar value, or such a flag in an argv followed by a value (``--api-key X`` or ``--api-key=X``).

`find_secrets` walks any nested structure and returns the field path of each hit; callers turn hits into one
`UserError` naming the path and the fix (the key file). `strip_userinfo` removes the credentials from a URL before
it is recorded; `redact` masks every secret shape in a text before it is printed.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

# A URL scheme (RFC 3986 section 3.1: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )) and its "://", matched only
# where a scheme can begin (not inside a longer run of scheme characters), so a search is linear in the text.
_SCHEME = r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://"

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
    # RFC 3986 section 3.2.1 userinfo: user:password@, or a user name alone (often a token: https://<token>@host)
    # (Each URL shape starts where a scheme can start, `_SCHEME`: without that anchor a long run of letters is tried
    # from every position, quadratic in its length: 20 KB of one letter took 5 s.)
    ("password in a URL", re.compile(_SCHEME + r"[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)),
    ("credentials in a URL", re.compile(_SCHEME + r"[^/\s@?#]+@", re.IGNORECASE)),
    # RFC 9110 sections 11.6.2 / 11.7.2: Authorization and Proxy-Authorization header fields with their credentials
    ("HTTP Authorization header", re.compile(
        r"\b(proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?\s*[A-Za-z][A-Za-z0-9_-]*\s+[A-Za-z0-9._~+/=-]{4,}",
        re.IGNORECASE)),
    # RFC 7617 Basic credentials (base64 of user:password) and RFC 6750 bearer credentials written into a value
    ("Basic credential", re.compile(r"\bBasic\s+[A-Za-z0-9+/]{8,}={0,2}(?![A-Za-z0-9+/=])")),
    ("bearer credential", re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]{12,}")),
    # A credential flag with its value inside one string (a shell command line, an env value holding extra flags:
    # "exec vllm ... --api-key 9f8e..."): vLLM's --api-key, its hub token flags, and the common spellings. A value
    # that is a variable or a placeholder ($VLLM_API_KEY, ${...}, <key>) is no credential, nor a word of prose
    # ("--api-key passes a credential"): a value counts with 8+ characters one of which is no lower-case letter, or
    # with 20+ characters.
    ("credential flag in a command line", re.compile(
        r"(?<![A-Za-z0-9_-])--?(api[-_]?key|hf[-_]token|token|password|passwd|secret|auth[-_]token|access[-_]token)"
        r"(=|\s+)[\"']?(?![$<{])((?=[^\s\"']*[^a-z\s\"'])[^\s\"']{8,}|[^\s\"']{20,})")),
)

# High-entropy tokens: a run of base64/base64url/hex characters at least this long ...
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/_=-]{20,}")
# ... whose Shannon entropy (bits per character) reaches this: random hex is ~4 bits/char over 32+ characters,
# random base64 ~5.5, English words and version strings stay near 3.5 (sample entropy of 20-40 characters of
# a 16-symbol alphabet is ~3.7-4.0, so hex needs its own, higher length bound below).
_ENTROPY_BITS = 3.6
# Hex runs are digests (sha256 64, git sha1 40, the recipes' revisions and build-arg digests) far more often than
# secrets; a hex run counts as a token only under a credential-shaped name (`is_secret_name`).
_HEX_RUN = re.compile(r"^[0-9a-fA-F]+$")

# Names that carry credentials: upper-cased, '-' as '_', one of these words as a whole '_'-separated part
# (VLLM_API_KEY, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, AWS_SECRET_ACCESS_KEY, --api-key, --hf-token, DB_PASSWORD).
# A name is credential-shaped when one of its '_'-separated parts is a credential word (HF_TOKEN, MY_SECRET_X), it
# ends in a short one (HF_AUTH, OPENAI_KEY, DB_PASS, GH_PAT; not num_key_value_heads), or it holds PASSWORD/PASSWD
# anywhere (DBPASSWORD).
_SECRET_NAME = re.compile(
    r"(^|_)(API_?KEY|ACCESS_KEY|APIKEY|SECRET|SECRET_KEY|SECRETS|TOKEN|AUTH_TOKEN|ACCESS_TOKEN|CREDENTIALS?|CREDS?|"
    r"PRIVATE_KEY)($|_)|_(KEY|AUTH|PAT|PASS|PWD)$|(TOKEN|SECRET|APIKEY)$|PASSWORD|PASSWD|PASSPHRASE"
)
# Names with a secret word that carry no credential: digests, token counts, files and paths that point at a
# secret (the key file itself lives outside the repo), and the recipe's own auth settings.
_NOT_SECRET_NAME = re.compile(
    r"(SHA\d*|DIGEST|HASH|_TOKENS|TOKENIZER|_FILE|_PATH|_DIR|_MODE|_ENV|_LEN|_SIZE|_TYPE|_ID|_NAME|_HEADER|_URL)($|_)"
    r"|^(KEY_FILE|AUTH|MODE|KEY)$"
)


def is_secret_name(name: str) -> bool:
    """Whether an env var, build arg or flag name (``VLLM_API_KEY``, ``--hf-token``) carries a credential."""
    # A numbered name is its word's (HF_TOKEN2, DB_PASSWORD_1: the second of a kind is as secret as the first).
    norm = re.sub(r"_?[0-9]+$", "", name.lstrip("-").upper().replace("-", "_"))
    return bool(_SECRET_NAME.search(norm)) and not _NOT_SECRET_NAME.search(norm)


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


def high_entropy(value: str, hex_too: bool = False) -> bool:
    """Whether `value` holds a random-looking token: a run of 20+ base64/hex characters with letters and digits
    in it, Shannon entropy >= `_ENTROPY_BITS` bits per character, and not a plain hex digest unless `hex_too`
    (a hex run under a credential-shaped name is a token: ``OPENAI_KEY: 9f8e...``)."""
    for run in _TOKEN_RUN.findall(value):
        core = run.strip("=-_/")
        if len(core) < 20 or not re.search(r"[0-9]", core) or not re.search(r"[A-Za-z]", core):
            continue
        if _HEX_RUN.match(core) and not hex_too:
            continue
        # A path or a dotted/dashed name made of words (Qwen3-0.6B-Instruct, lvllmds4_x-2.3.8-cp312) is not a token:
        # every '-'/'_'/'/'-separated piece of a token-shaped run is itself long or mixes cases and digits.
        pieces = [p for p in re.split(r"[-_/]", core) if p]
        if len(pieces) > 1 and max(len(p) for p in pieces) < 16:
            continue
        # A hex reference with words around it (git-0d986bc7..., a digest with a prefix) is a pin, not a token.
        if (not hex_too and any(len(p) >= 7 and _HEX_RUN.match(p) for p in pieces)
                and all(_HEX_RUN.match(p) or len(p) < 16 for p in pieces)):
            continue
        if _entropy(core) >= _ENTROPY_BITS:
            return True
    return False


def token_shape(value: str) -> str | None:
    """The kind of credential `value` contains (e.g. ``"Hugging Face token"``, ``"high-entropy token"``), or None."""
    for kind, rx in TOKEN_SHAPES:
        if rx.search(value):
            return kind
    if high_entropy(value):
        return "high-entropy token (a random string of 20+ characters)"
    return None


_USERINFO = re.compile(rf"(?P<scheme>{_SCHEME})[^/\s@?#]+@", re.IGNORECASE)


def strip_userinfo(url: str) -> str:
    """`url` without its userinfo (``https://user:pw@host/x`` -> ``https://host/x``): what may be recorded in a
    lock or printed. Other text passes unchanged."""
    return _USERINFO.sub(lambda m: m.group("scheme"), url)


def redact_shapes(text: str) -> str:
    """`text` with the known credential shapes masked (`TOKEN_SHAPES` as ``<redacted>``, URL userinfo removed), but
    not high-entropy runs: for log lines, which name incident folders, digests and request ids that the entropy rule
    would mask."""
    text = strip_userinfo(text)
    for _, rx in TOKEN_SHAPES:
        text = rx.sub("<redacted>", text)
    return text


def redact(text: str) -> str:
    """`text` with every credential shape masked (`TOKEN_SHAPES` matches and high-entropy runs as ``<redacted>``,
    URL userinfo removed): applied to every message before it is printed."""
    return _TOKEN_RUN.sub(_redact_run, redact_shapes(text))


_TIMESTAMP = re.compile(r"\d{8}T\d{6}Z")


def _redact_run(m: re.Match) -> str:
    """One `_TOKEN_RUN` match, masked when high-entropy. An absolute path is judged one component at a time, so an
    incident folder or a cache digest in an error message stays readable and only a token-shaped component (a key
    pasted into a path) is masked; a run that does not start with '/' (base64 tokens carry '/' too) is judged whole.
    A UTC timestamp in ISO 8601 basic form (``20261201T161530Z``, how incident folders are named) is no token."""
    run = m.group(0)
    if run.startswith("/"):
        return "/".join("<redacted>" if high_entropy(_TIMESTAMP.sub("", part)) else part for part in run.split("/"))
    return "<redacted>" if high_entropy(run) else run


def _fmt(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _walk(node: Any, path: tuple) -> Iterator[tuple[tuple, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            sub = (*path, str(k))
            if isinstance(k, str) and (token_shape(k) or (len(k.split()) > 1 and is_secret_name(k.split()[0]))):
                # A key that is itself a credential (an env name pasted as a token, "api-key <key>": true).
                yield (*path, "<a key>"), "a mapping key holds a credential"
                continue
            if (isinstance(k, str) and is_secret_name(k) and isinstance(v, str | int | float)
                    and not isinstance(v, bool) and v != ""):
                yield sub, f"'{k}' names a credential"
                continue
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
        elif node.lstrip().startswith(("{", "[")):
            # A JSON argument (--speculative-config, --model-loader-extra-config '{"api_key": ...}'): its names and
            # values are scanned as a mapping's. Text that is not JSON was scanned whole above.
            try:
                parsed = json.loads(node)
            except (ValueError, RecursionError):
                return
            yield from _walk(parsed, path)


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
