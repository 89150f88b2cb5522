"""Per-person usage from a gateway front door's access log (`ds4deploy gateway usage`, docs/gateway.md).

The log is the front door's own: one JSON object per line, written by nginx with the ``ds4gw`` format of
templates/gateway-front-door.conf.j2 (time, person, method, path, status, bytes_in, bytes_out, seconds, tokens_in,
tokens_out, fallback, backend, session). Lines that are not such objects (nginx's own warnings on the same stream)
are skipped and counted. Tokens are the backend's own counts from its answer, read by the door as the answer passed
(images/proxy/usage.js): empty in the line when the answer carried none (an OpenAI stream without
``stream_options.include_usage`` on vLLM, a refused or failed request, /v1/models); such requests are counted apart.
A line whose ``fallback`` names a model was resent under the recipe's fallback name (images/proxy/fallback.js).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class PersonUsage:
    """One person's totals. Bytes are HTTP bytes as nginx counts them (``$request_length``: request line, headers
    and body; ``$body_bytes_sent``: response body); tokens are prompt (in) and generated (out) tokens as the backends
    reported them, summed over the requests whose answer carried counts (`without_tokens`: the other answered
    requests, status 2xx); `fell_back`: requests resent under their model's fallback name (the recipe's
    ``fallback``); seconds are wall seconds nginx spent on each request (``$request_time``, millisecond
    resolution), summed."""

    requests: int = 0
    refused: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    without_tokens: int = 0
    fell_back: int = 0
    seconds: float = 0.0
    by_status: dict[int, int] = field(default_factory=dict)
    by_backend: dict[str, int] = field(default_factory=dict)


@dataclass
class Usage:
    """Usage by person (``""``: requests without a known key) and the number of log lines that were not requests."""

    people: dict[str, PersonUsage]
    skipped_lines: int


def usage(lines: Iterable[str]) -> Usage:
    """Sum the access log `lines` by person.

    Returns:
        `Usage`; a 401 without a person counts under ``""`` as refused.
    """
    people: dict[str, PersonUsage] = {}
    skipped = 0
    for line in lines:
        line = line.strip()
        try:
            rec = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict) or "person" not in rec or "status" not in rec:
            skipped += line != ""
            continue
        u = people.setdefault(str(rec["person"]), PersonUsage())
        status = int(rec["status"])
        u.requests += 1
        u.refused += status == 401
        u.bytes_in += int(rec.get("bytes_in") or 0)
        u.bytes_out += int(rec.get("bytes_out") or 0)
        u.seconds += float(rec.get("seconds") or 0)
        tin, tout = str(rec.get("tokens_in") or ""), str(rec.get("tokens_out") or "")
        if tin.isdigit() or tout.isdigit():
            u.tokens_in += int(tin) if tin.isdigit() else 0
            u.tokens_out += int(tout) if tout.isdigit() else 0
        elif 200 <= status < 300:
            u.without_tokens += 1  # answered, with no counts (a refusal is counted under refused or statuses)
        u.fell_back += bool(rec.get("fallback"))
        u.by_status[status] = u.by_status.get(status, 0) + 1
        backend = str(rec.get("backend") or "")
        if backend:
            u.by_backend[backend] = u.by_backend.get(backend, 0) + 1
    return Usage(people, skipped)


def table(u: Usage) -> str:
    """A plain-text table, one row per person (``(no key)`` for refused requests without a person's key)."""
    rows = [("person", "requests", "refused", "bytes in", "bytes out", "tokens in", "tokens out", "no tokens",
             "fell back", "seconds", "statuses")]
    for person, p in sorted(u.people.items()):
        statuses = " ".join(f"{s}:{n}" for s, n in sorted(p.by_status.items()))
        rows.append((person or "(no key)", str(p.requests), str(p.refused), str(p.bytes_in), str(p.bytes_out),
                     str(p.tokens_in), str(p.tokens_out), str(p.without_tokens), str(p.fell_back), f"{p.seconds:.3f}",
                     statuses))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.append("tokens: as the backends reported them in their answers; \"no tokens\": requests whose answer carried "
               f"no counts; \"fell back\": requests resent under their model's fallback name (docs/gateway.md); "
               f"{u.skipped_lines} non-request line(s) skipped")
    return "\n".join(out)
