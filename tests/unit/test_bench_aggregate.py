"""Cell statistics: vLLM bench key names and units, medians/percentiles, failures kept out of the rates."""

from __future__ import annotations

import numpy as np
import pytest

from ds4deploy.bench.aggregate import summarize
from ds4deploy.bench.stream import RequestResult


def req(i, ttft, last, prompt=1000, completion=101, ok=True, error=None, finish="length"):
    return RequestResult(index=i, ok=ok, error=error, ttft_s=ttft, last_token_s=last, e2e_s=last,
                         prompt_tokens=prompt, completion_tokens=completion, finish_reason=finish)


def test_rates_and_vllm_keys():
    rs = [req(0, 0.5, 1.5), req(1, 1.0, 3.0), req(2, 0.25, 0.75)]
    s = summarize(rs, duration_s=4.0)
    assert s["completed"] == 3 and s["failed"] == 0
    assert s["total_output_tokens"] == 303 and s["total_input_tokens"] == 3000
    assert s["output_throughput"] == pytest.approx(303 / 4.0) == s["aggregate_tok_s"]
    assert s["total_token_throughput"] == pytest.approx(3303 / 4.0)
    assert s["request_throughput"] == pytest.approx(0.75)
    # decode per request: 100 tokens over (last - first): 100/1.0, 100/2.0, 100/0.5
    assert s["decode_tok_s"] == pytest.approx(100.0) == s["per_session_tok_s"]
    assert (s["decode_tok_s_min"], s["decode_tok_s_max"]) == (pytest.approx(50.0), pytest.approx(200.0))
    assert s["ttft_s"] == pytest.approx(0.5)
    assert s["median_ttft_ms"] == pytest.approx(500.0)
    assert s["mean_ttft_ms"] == pytest.approx(np.mean([500, 1000, 250]))
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile([500, 1000, 250], 99))
    assert s["p90_e2el_ms"] == pytest.approx(np.percentile([1500, 3000, 750], 90))
    # TPOT = 1 / decode rate, in ms (vLLM: (latency - ttft) / (tokens - 1))
    assert s["median_tpot_ms"] == pytest.approx(10.0)
    assert s["prefill_tok_s"] == pytest.approx(2000.0)  # median of 1000/0.5, 1000/1.0, 1000/0.25
    assert s["finish_reasons"] == {"length": 3}


def test_failed_requests_are_counted_but_not_in_the_rates():
    rs = [req(0, 0.5, 1.5), RequestResult(index=1, ok=False, error="HTTP 500: boom")]
    s = summarize(rs, duration_s=2.0)
    assert s["completed"] == 1 and s["failed"] == 1
    assert s["errors"] == ["", "HTTP 500: boom"]
    assert s["total_output_tokens"] == 101
    assert s["decode_tok_s"] == pytest.approx(100.0)


def test_all_failed_gives_no_rates():
    s = summarize([RequestResult(index=0, ok=False, error="ConnectError")], duration_s=0.1)
    assert s["completed"] == 0 and s["decode_tok_s"] is None and s["ttft_s"] is None
    assert s["median_ttft_ms"] is None and s["aggregate_tok_s"] == 0


def test_vllm_decode_rate_is_one_over_its_tpot():
    from ds4deploy.bench.aggregate import vllm_decode_tok_s

    # vllm/benchmarks/serve.py: TPOT = (latency - TTFT) / (output tokens - 1); 9 tokens, 0.2 s to the first,
    # 1.0 s to the last: TPOT 0.1 s, 10 tok/s.
    assert vllm_decode_tok_s(9, 1.0, 0.2) == pytest.approx(10.0)
    assert vllm_decode_tok_s(1, 1.0, 0.2) is None  # one token: no decode step
    assert vllm_decode_tok_s(0, 0.0, 0.0) is None  # a failed request, as vLLM records it
    assert vllm_decode_tok_s(9, 0.2, 0.2) is None  # every token in one read
    assert vllm_decode_tok_s(9, None, 0.2) is None
