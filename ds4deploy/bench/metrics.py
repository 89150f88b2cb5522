"""The server's Prometheus counters, read before and after each benchmark cell.

Names are vLLM's (`ds4deploy.engines.vllm.METRICS`, with their sources). Counters are summed over their label
sets (engine index, model, finish reason: `ds4deploy.parsers.prometheus.sum_samples`), so a data-parallel server
with several engines is read as one.

What the harness derives from the difference of two scrapes (`CounterDelta`):

- prefix-cache hit tokens / queried tokens: a cell the cache served is not a prefill measurement
  (docs/sources.md#gx10-benchmark-method: a 2,048-token cell showed 9,480 tok/s prefill because of a cache hit).
- speculative decoding: accepted tokens per draft and tokens per round (``1 + accepted / drafts``, vLLM's
  "acceptance length", ``vllm/benchmarks/serve.py``), and accepted / drafted tokens (acceptance rate).
- finished requests: more than the cell sent means someone else used the server during the cell.
- the server's own decode rate: vLLM observes, per request and engine step after the first token, the time since
  that request's previous token (``inter_token_latency_seconds``, ``vllm/v1/metrics/stats.py``
  ``IterationStats.update_from_output``), so its sum over a cell is the sum of every request's (last - first token
  time) as the engine saw it, and ``(generation tokens - finished requests) / that sum`` is the same per-session
  decode rate the client computes from the stream ((completion tokens - 1) / (last - first token arrival)),
  token-weighted. A client figure far from it means the stream was not delivered as generated (the server's
  frontend or the client was starved of CPU and tokens arrived in bursts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import httpx

from ds4deploy.core.errors import UserError
from ds4deploy.engines.vllm import METRICS as VLLM_METRICS
from ds4deploy.parsers.prometheus import sum_samples

# Sample names: vLLM's (`ds4deploy.engines.vllm.METRICS`), one per `Counters` field.
NAMES = {field: VLLM_METRICS[field] for field in (
    "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens", "requests_finished",
    "spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens", "itl_seconds_sum", "ttft_seconds_sum",
    "ttft_count", "requests_running", "requests_waiting")}


@dataclass(frozen=True)
class Counters:
    """One scrape of the counters the harness uses. Token counters are tokens; `None` = the server has no such
    metric (e.g. no speculative decoding configured, or a fork that renamed it)."""

    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    requests_finished: float | None = None
    spec_num_drafts: float | None = None
    spec_num_draft_tokens: float | None = None
    spec_num_accepted_tokens: float | None = None
    itl_seconds_sum: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_count: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None


def parse_metrics(text: str) -> Counters:
    """Parse Prometheus text exposition (``GET /metrics``) into `Counters`, summing each sample over its labels.

    Raises:
        UserError: the text is not Prometheus exposition format.
    """
    try:
        sums = sum_samples(text, NAMES.values())
    except ValueError as exc:
        raise UserError(f"the server's /metrics is not Prometheus text: {exc}",
                        "point --url at a vLLM server (its /metrics serves Prometheus text)") from None
    return Counters(**{field: sums.get(name) for field, name in NAMES.items()})


def scrape(client: httpx.Client, base_url: str) -> Counters | None:
    """`Counters` from ``base_url/metrics``, or None when the server has no /metrics (404) or it cannot be read."""
    try:
        r = client.get(f"{base_url}/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return parse_metrics(r.text)


def _d(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


@dataclass(frozen=True)
class CounterDelta:
    """What changed on the server during one cell (after - before). Tokens are token counts, rates are fractions."""

    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    requests_finished: float | None
    spec_num_drafts: float | None
    spec_num_draft_tokens: float | None
    spec_num_accepted_tokens: float | None
    itl_seconds_sum: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_count: float | None = None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hit tokens / queried tokens (0..1), None when nothing was queried or the counters are missing."""
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def spec_accepted_per_draft(self) -> float | None:
        """Accepted draft tokens per drafting round (docs/sources.md#v100x8-acceptance: code/JSON 3.6-3.8 of 5)."""
        if not self.spec_num_drafts or self.spec_num_accepted_tokens is None:
            return None
        return self.spec_num_accepted_tokens / self.spec_num_drafts

    @property
    def spec_tokens_per_round(self) -> float | None:
        """Tokens emitted per round: 1 verified token + the accepted drafts (vLLM's "acceptance length")."""
        a = self.spec_accepted_per_draft
        return None if a is None else 1.0 + a

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens (0..1); the GX10 pair reports 83-87 % (docs/sources.md#gx10-pair)."""
        if not self.spec_num_draft_tokens or self.spec_num_accepted_tokens is None:
            return None
        return self.spec_num_accepted_tokens / self.spec_num_draft_tokens

    @property
    def server_decode_tok_s(self) -> float | None:
        """The server's own per-session decode rate over the cell, tok/s: (generation tokens - finished requests) /
        summed inter-token latency (module docstring). None when a counter is missing or nothing was decoded."""
        if (self.generation_tokens is None or self.requests_finished is None or not self.itl_seconds_sum
                or self.generation_tokens <= self.requests_finished):
            return None
        return (self.generation_tokens - self.requests_finished) / self.itl_seconds_sum

    @property
    def server_mean_ttft_s(self) -> float | None:
        """Mean time to first token over the cell as the server measured it (``time_to_first_token_seconds``: from
        the request's arrival at the API server to its first token, ``vllm/v1/metrics/stats.py``), seconds; the
        client's TTFT adds the HTTP round trip and its own reading. None when nothing was counted."""
        if not self.ttft_count or self.ttft_seconds_sum is None:
            return None
        return self.ttft_seconds_sum / self.ttft_count

    def as_dict(self) -> dict:
        """Raw differences plus the derived rates, JSON-ready."""
        out = asdict(self)
        out.update(server_decode_tok_s=self.server_decode_tok_s, server_mean_ttft_s=self.server_mean_ttft_s,
                   prefix_cache_hit_rate=self.prefix_cache_hit_rate,
                   spec_accepted_per_draft=self.spec_accepted_per_draft,
                   spec_tokens_per_round=self.spec_tokens_per_round,
                   spec_acceptance_rate=self.spec_acceptance_rate)
        return out


def diff(before: Counters, after: Counters) -> CounterDelta:
    """Counter differences over a cell; a counter missing from either scrape gives None."""
    return CounterDelta(**{f: _d(getattr(after, f), getattr(before, f)) for f in CounterDelta.__dataclass_fields__})
