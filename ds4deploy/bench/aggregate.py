"""Per-cell statistics from the per-request records.

Keys that mean the same as in ``vllm bench serve --save-result`` (vLLM 0.32 ``vllm/benchmarks/serve.py``,
``benchmark()`` result dict and ``process_one_metric``) keep vLLM's names and units, so the two tools' JSON can be
read by one script: ``duration`` (s), ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput`` (req/s), ``output_throughput`` and ``total_token_throughput`` (tok/s over the cell's wall
time), ``{mean,median,std,p90,p99}_{ttft,tpot,e2el}_ms`` (milliseconds; TPOT = (latency - TTFT) / (tokens - 1),
the inverse of our per-session decode rate), ``input_lens``, ``output_lens``, ``ttfts``, ``latencies`` (s),
``errors``. Percentiles are numpy's linear interpolation, as in vLLM.

Our own keys use the reference tables' words (docs/sources.md): ``aggregate_tok_s`` (= output_throughput),
``per_session_tok_s`` and ``decode_tok_s`` (median per-request decode rate), ``prefill_tok_s`` (median),
``ttft_s`` (median).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ds4deploy.bench.stream import RequestResult

PERCENTILES = (90, 99)


def _stats(name: str, values_s: list[float]) -> dict[str, float | None]:
    """mean/median/std/p90/p99 of seconds, as milliseconds under vLLM's key names."""
    if not values_s:
        return {f"{k}_{name}_ms": None for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))}
    a = np.asarray(values_s, dtype=float) * 1000.0
    out = {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
           f"std_{name}_ms": float(a.std())}
    out.update({f"p{p}_{name}_ms": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def vllm_decode_tok_s(output_tokens: int | None, latency_s: float | None, ttft_s: float | None) -> float | None:
    """One request's decode rate as `vllm bench serve` derives it, tok/s: 1 / TPOT, TPOT = (latency - TTFT) /
    (output tokens - 1) (vllm/benchmarks/serve.py, calculate_metrics; latency and TTFT in seconds from its own
    clock). None for fewer than 2 tokens or no time between first and last token (a failed request: 0, 0)."""
    if not output_tokens or output_tokens < 2 or latency_s is None or ttft_s is None or latency_s <= ttft_s:
        return None
    return (output_tokens - 1) / (latency_s - ttft_s)


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    """Statistics of one cell.

    Args:
        results: every request of the cell, failed ones included.
        duration_s: wall time from the first send to the last finish, seconds.
    Returns:
        A JSON-ready dict (keys above). Rates over failed requests are not counted; ``failed`` and ``errors`` say
        how many failed and why.
    """
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    decode = [d for r in ok if (d := r.decode_tok_s) is not None]
    prefill = [p for r in ok if (p := r.prefill_tok_s) is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [1.0 / d for d in decode]
    dur = duration_s if duration_s > 0 else float("nan")
    res: dict = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
        **_stats("ttft", ttfts),
        **_stats("tpot", tpots),
        **_stats("e2el", [r.e2e_s for r in ok if r.e2e_s is not None]),
        "aggregate_tok_s": out_tokens / dur,
        "per_session_tok_s": _median(decode),
        "decode_tok_s": _median(decode),
        "decode_tok_s_min": min(decode) if decode else None,
        "decode_tok_s_max": max(decode) if decode else None,
        "prefill_tok_s": _median(prefill),
        "ttft_s": _median(ttfts),
        "prompt_tokens_median": _median([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
        "finish_reasons": dict(Counter(r.finish_reason or "none" for r in ok)),
        "input_lens": [r.prompt_tokens for r in results],
        "output_lens": [r.completion_tokens for r in results],
        # Stream chunks that carried tokens, per request: below output_lens when the server packed tokens together.
        "token_chunks": [r.token_chunks for r in results],
        "ttfts": [r.ttft_s for r in results],
        "latencies": [r.e2e_s for r in results],
        "errors": [r.error or "" for r in results],
    }
    return res
