"""The form of a key the front doors admit: the one source of the rule every check of it derives from.

A key (a person's key at the gateway, the gateway key a backend's front door accepts) is `KEY_MIN_CHARS` to
`KEY_MAX_CHARS` characters of `KEY_ALPHABET`. The alphabet is the characters that are literal inside an nginx regular
expression and need no quoting in a map or an ``if``: the front doors compare keys with regular expressions
(ds4deploy/render/gateway.py `people_maps`, images/proxy/entrypoint.sh). 32 characters of 64 symbols are 192 bits:
guessing one is hopeless.

Who reads it:

- `KEY_RE` (Python): the people key file (ds4deploy/render/gateway.py `read_people_keys`);
- `KEY_PATTERN` (the same text, read alike by Python's ``re`` and POSIX extended regular expressions, ``grep -E``):
  the deploy's preflight of a backend's gateway key file, passed to the play as ``ds4_key_pattern``
  (ds4deploy/plan/playvars.py, ansible/roles/preflight/tasks/serving.yml);
- `KEY_ALPHABET`: the front door container's own guard, a shell pattern ``*[!<alphabet>]*`` in
  images/proxy/entrypoint.sh (the container has no Python); tests/unit/test_keys.py derives that pattern from here
  and proves the script accepts exactly this alphabet.
"""

from __future__ import annotations

import re

# The body of a bracket expression: the same characters in Python's re, POSIX ERE and a shell pattern's [...] ('-'
# last, so it is literal in all three).
KEY_ALPHABET = "A-Za-z0-9_-"
# 32 characters of 64 symbols: 192 bits.
KEY_MIN_CHARS = 32
# nginx reads one configuration parameter into a buffer of this many bytes and refuses a longer one ("too long
# parameter": NGX_CONF_BUFFER, src/core/ngx_conf_file.c). Every value the renders put into one nginx parameter (a key
# in a map line, the gateway's fallback pairs) stays clear of it.
NGINX_CONF_BUFFER = 4096
# At most: a key is one parameter of the front doors' nginx config (a map line, an `if`) with the map's own regex
# around it, well inside `NGINX_CONF_BUFFER`; 1,024 characters are 6,144 bits, far beyond any need.
KEY_MAX_CHARS = 1024
# A whole key: Python's re and POSIX ERE (grep -E) read it alike. Anchor it (re.fullmatch, grep -x).
KEY_PATTERN = f"[{KEY_ALPHABET}]{{{KEY_MIN_CHARS},{KEY_MAX_CHARS}}}"
KEY_RE = re.compile(f"^{KEY_PATTERN}$")


def _in_words(alphabet: str) -> str:
    """A bracket expression's body as words: "A-Za-z0-9_-" -> "A-Z a-z 0-9 _ -"."""
    parts, i = [], 0
    while i < len(alphabet):
        step = 3 if i + 2 < len(alphabet) and alphabet[i + 1] == "-" else 1
        parts.append(alphabet[i:i + step])
        i += step
    return " ".join(parts)


# The rule in words, for messages: the Python checks', and the preflight's (play variable ``ds4_key_rule``).
KEY_RULE = f"{KEY_MIN_CHARS} to {KEY_MAX_CHARS} characters of {_in_words(KEY_ALPHABET)}"
