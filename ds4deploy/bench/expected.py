"""Each measured cell against the recipe's expected figures (``recipe.expected``).

Two kinds of expectation (ds4deploy/recipe/schema.py `Expected`):

- `table`: the reference system's published cells (docs/sources.md), each a value for one profile, prompt length,
  concurrency and (optionally) content type. A measured value within ``value x (1 +- tolerance)`` is "within",
  else "above" or "below". An entry without a content type is compared with the median over the cells of every
  content type at that prompt length and concurrency (docs/sources.md#v100x8-table gives one TTFT per prompt length).
- `decode_tok_s` / `ttft_s` ranges: hold for every single-session cell of any profile (they come from one-request
  measurements, e.g. the cpu recipe's `make bench-stack`).

"above"/"below" is only the direction: above on ttft_s is slower, above on a tok/s metric is faster. Cells marked
invalid (prefix-cache hit, failures, prompt length off) are compared too, with the flag shown next to the verdict.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from ds4deploy.recipe.schema import Expected

METRICS = ("decode_tok_s", "aggregate_tok_s", "per_session_tok_s", "prefill_tok_s", "ttft_s")


@dataclass(frozen=True)
class Verdict:
    """One comparison. `measured` in the metric's unit (tok/s or s); `verdict` within/above/below/no data."""

    what: str
    metric: str
    measured: float | None
    low: float
    high: float
    reference: float | None
    verdict: str
    source: str
    invalid: bool

    def as_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


def _verdict(measured: float | None, low: float, high: float) -> str:
    if measured is None:
        return "no data"
    if measured < low:
        return "below"
    if measured > high:
        return "above"
    return "within"


def compare(cells: list[dict], profile: str, expected: Expected) -> list[Verdict]:
    """Compare `cells` (cell records as written by `ds4deploy.bench.report`: ``spec`` {prompt_tokens, concurrency,
    content, ...}, the metrics at top level, ``valid``) of `profile` against `expected`. Returns one `Verdict` per
    applicable expectation."""
    out: list[Verdict] = []
    tol = expected.tolerance
    for e in expected.table:
        if e.profile != profile:
            continue
        hits = [c for c in cells if c["spec"]["prompt_tokens"] == e.prompt_tokens
                and c["spec"]["concurrency"] == e.concurrency
                and (e.content is None or c["spec"]["content"] == e.content)]
        values = [v for c in hits if (v := c.get(e.metric)) is not None]
        measured = statistics.median(values) if values else None
        what = f"{e.prompt_tokens} x {e.concurrency}" + (f" {e.content}" if e.content else "")
        out.append(Verdict(what, e.metric, measured, e.value * (1 - tol), e.value * (1 + tol), e.value,
                           _verdict(measured, e.value * (1 - tol), e.value * (1 + tol)),
                           expected.table_source or "recipe expected.table", any(not c["valid"] for c in hits)))
    for metric in ("decode_tok_s", "ttft_s"):
        rng = getattr(expected, metric)
        if rng is None:
            continue
        for c in cells:
            if c["spec"]["concurrency"] != 1:
                continue
            m = c.get(metric)
            out.append(Verdict(c["cell_id"], metric, m, rng.low, rng.high, None, _verdict(m, rng.low, rng.high),
                               rng.source, not c["valid"]))
    return out
