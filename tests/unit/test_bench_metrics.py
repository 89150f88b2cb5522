"""/metrics parsing and counter diffs, on real vLLM 0.32 CPU output (tests/unit/fixtures/bench/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4deploy.bench.metrics import Counters, diff, parse_metrics
from ds4deploy.core.errors import UserError

FIX = Path(__file__).parent / "fixtures" / "bench"


def test_idle_server_counters_are_zero_and_spec_decode_absent():
    c = parse_metrics((FIX / "vllm-0.32-cpu-metrics-idle.txt").read_text())
    assert c.prefix_cache_queries == 0 and c.prefix_cache_hits == 0
    assert c.requests_finished == 0  # request_success_total summed over its finished_reason labels
    assert c.requests_running == 0 and c.requests_waiting == 0
    assert c.spec_num_drafts is None and c.spec_num_accepted_tokens is None  # no speculative decoding configured


def test_two_identical_prompts_show_the_second_served_by_the_cache():
    before = parse_metrics((FIX / "vllm-0.32-cpu-metrics-idle.txt").read_text())
    after = parse_metrics((FIX / "vllm-0.32-cpu-metrics-after-repeat.txt").read_text())
    d = diff(before, after)
    # Two 1,030-token prompts; the second hit 8 full 128-token blocks of the first.
    assert d.prefix_cache_queries == 2060 and d.prefix_cache_hits == 1024
    assert d.prefix_cache_hit_rate == pytest.approx(1024 / 2060)
    assert d.requests_finished == 2
    assert d.spec_accepted_per_draft is None and d.spec_tokens_per_round is None
    assert d.server_mean_ttft_s == pytest.approx(0.04062247276306152 / 2)  # the server's own TTFT histogram


def test_spec_decode_counters_give_acceptance():
    before = parse_metrics((FIX / "vllm-0.32-cpu-ngram-metrics-before.txt").read_text())
    after = parse_metrics((FIX / "vllm-0.32-cpu-ngram-metrics-after.txt").read_text())
    d = diff(before, after)
    assert d.spec_num_drafts and d.spec_num_drafts > 0
    assert d.spec_accepted_per_draft == pytest.approx(d.spec_num_accepted_tokens / d.spec_num_drafts)
    assert d.spec_tokens_per_round == pytest.approx(1 + d.spec_accepted_per_draft)
    assert 0 <= d.spec_acceptance_rate <= 1
    assert d.as_dict()["spec_tokens_per_round"] == d.spec_tokens_per_round


def test_missing_counter_on_either_side_gives_none():
    d = diff(Counters(prefix_cache_hits=5.0), Counters())
    assert d.prefix_cache_hits is None and d.prefix_cache_hit_rate is None


def test_html_instead_of_metrics_is_a_clear_error():
    with pytest.raises(UserError, match="not Prometheus text"):
        parse_metrics("<html><body>Not Found</body></html>\n")


def test_server_decode_rate_counts_tokens_not_engine_steps():
    before = parse_metrics((FIX / "vllm-0.32-cpu-ngram-metrics-before.txt").read_text())
    after = parse_metrics((FIX / "vllm-0.32-cpu-ngram-metrics-after.txt").read_text())
    d = diff(before, after)
    # Two requests, 216 generated tokens, 58 inter-token observations summing to 0.1012 s: ngram drafts packed
    # several tokens per engine step, so 1 / mean ITL (573/s) would undercount the 2,114 tok/s decoded.
    assert d.generation_tokens == 216 and d.requests_finished == 2
    assert d.server_decode_tok_s == pytest.approx(214 / 0.10121732599964162)
    assert d.as_dict()["server_decode_tok_s"] == d.server_decode_tok_s
    assert diff(Counters(), Counters()).server_decode_tok_s is None


def _result(i: int, ttft: float, last: float, tokens: int = 512, chunks: int | None = None):
    from ds4deploy.bench.stream import RequestResult

    return RequestResult(index=i, ok=True, ttft_s=ttft, last_token_s=last, e2e_s=last, prompt_tokens=1030,
                         completion_tokens=tokens, token_chunks=tokens if chunks is None else chunks)


def test_tokens_arriving_in_one_burst_flag_the_cell():
    from ds4deploy.bench.run import client_decode_window, judge

    before = parse_metrics((FIX / "vllm-0.32-cpu-metrics-idle.txt").read_text())
    # The server decoded 4 x 511 tokens at 1,150 tok/s per request (0.444 s each).
    server = Counters(**{**before.__dict__, "generation_tokens": 2048.0, "requests_finished": 4.0,
                         "itl_seconds_sum": 4 * 511 / 1150})
    steady = [_result(i, 0.022, 0.022 + 511 / 1150) for i in range(4)]
    tokens, window = client_decode_window(steady)
    assert tokens == 4 * 511 and tokens / window == pytest.approx(1150)
    assert judge(steady, diff(before, server), before, 1024) == []
    # Two requests as seen on the busy host: first and last token 2 ms apart at the end (TTFT ~= latency).
    burst = [*steady[:2], _result(2, 0.445, 0.447), _result(3, 0.459, 0.461)]
    flags = judge(burst, diff(before, server), before, 1024)
    assert len(flags) == 1 and flags[0].startswith(
        "stream timing off: the client saw 2,290 tok/s decode over the cell, 2 of 4 requests outside 0.5-2x the "
        "server's rate (0 with every token in one read), the server's own counters 1,150 tok/s")
    # One chunk per token: the bursts formed after the server wrote them.
    assert "(2,048 tokens came in 2,048 chunks, held up on the way to this client;" in flags[0]
    # Every token of every request in one read (seen on the busy host: TTFT = last token, 64 tokens).
    at_once = [_result(i, 0.062, 0.062, tokens=64, chunks=1) for i in range(2)]
    short = Counters(**{**before.__dict__, "generation_tokens": 128.0, "requests_finished": 2.0,
                        "itl_seconds_sum": 126 / 1200})
    (flag,) = judge(at_once, diff(before, short), before, 1024)
    assert flag.startswith("stream timing off: the client saw every token of each request at once, the server's "
                           "own counters 1,200 tok/s")
    # vLLM's frontend merges outputs a lagging stream has not sent yet: one chunk per request.
    assert ("(128 tokens came in 2 chunks, several per chunk (vLLM's frontend falling behind, or speculative "
            "decoding);") in flag
    # Five requests in one read, three slower than the server made them (a cell measured on the
    # loaded 2-core host, smoke profile p256-c4-code: TTFT and latency of each request, 64 tokens each, server
    # 1,033 tok/s): token-weighted the two cancel out (0.90x), the median request (0.34x) does not.
    ttfts = [0.0259, 0.0196, 0.0192, 0.1961, 0.0662, 0.2764, 0.2754, 0.2745]
    ends = [0.2088, 0.1981, 0.1969, 0.1961, 0.0662, 0.2764, 0.2754, 0.2745]
    mixed = [_result(i, a, b, tokens=64) for i, (a, b) in enumerate(zip(ttfts, ends, strict=True))]
    loaded = Counters(**{**before.__dict__, "generation_tokens": 512.0, "requests_finished": 8.0,
                         "itl_seconds_sum": 0.48789447200033464})
    tokens, window = client_decode_window(mixed)
    assert 0.8 < tokens / window / diff(before, loaded).server_decode_tok_s < 1.2
    (flag,) = judge(mixed, diff(before, loaded), before, 1024)
    assert flag.startswith("stream timing off: the client saw 935 tok/s decode over the cell, 8 of 8 requests "
                           "outside 0.5-2x the server's rate (5 with every token in one read), the server's own "
                           "counters 1,033 tok/s")
    # The per-request check alone. Server 1,000 tok/s, 64-token answers (63 decode steps each).
    def thousand(n: int):
        return diff(before, Counters(**{**before.__dict__, "generation_tokens": n * 64.0, "requests_finished": n,
                                        "itl_seconds_sum": n * 63 / 1000}))

    def at(i: int, rate: float | None):
        return _result(i, 0.02, 0.02 + (63 / rate if rate else 0), tokens=64)

    # Two in one read, two at 0.45x: token-weighted 0.9x, but every request is implausible on its own.
    mixed2 = [at(0, None), at(1, None), at(2, 450), at(3, 450)]
    tokens, window = client_decode_window(mixed2)
    assert tokens / window == pytest.approx(900)
    (flag,) = judge(mixed2, thousand(4), before, 1024)
    assert "900 tok/s decode over the cell, 4 of 4 requests outside 0.5-2x the server's rate (2 with every " in flag
    # Two of seven in one read, two at 0.5x, three at 1.0x: token-weighted 1.0x; 2 of 7 implausible (> 1/4).
    hidden = [at(0, None), at(1, None), at(2, 500), at(3, 500), at(4, 1000), at(5, 1000), at(6, 1000)]
    tokens, window = client_decode_window(hidden)
    assert tokens / window == pytest.approx(1000)
    (flag,) = judge(hidden, thousand(7), before, 1024)
    assert "1,000 tok/s decode over the cell, 2 of 7 requests outside 0.5-2x the server's rate (2 with " in flag
    # One of seven in one read is tolerated when the cell's rate agrees.
    one = [at(0, None), at(1, 1000), at(2, 1000), at(3, 1000), at(4, 1000), at(5, 1000), at(6, 857.14)]
    assert judge(one, thousand(7), before, 1024) == []
    # The server itself slower for one request than the next (measured on the quiet host, smoke p256-c1-code: 63
    # decode steps in 148.0 and 55.8 ms, server 612 tok/s token-weighted): 0.69x and 1.84x, token-weighted 1.0x;
    # the median of the two (1.27x) is a different average, not a timing fault.
    uneven = [_result(0, 0.0106, 0.1586, tokens=64), _result(1, 0.0078, 0.0636, tokens=64)]
    server612 = diff(before, Counters(**{**before.__dict__, "generation_tokens": 128.0, "requests_finished": 2.0,
                                         "itl_seconds_sum": 126 / 612.28}))
    assert judge(uneven, server612, before, 1024) == []
    # Too little decoding to judge (8 tokens): no verdict either way.
    few = Counters(**{**before.__dict__, "generation_tokens": 8.0, "requests_finished": 1.0, "itl_seconds_sum": 0.006})
    assert judge([_result(0, 0.02, 0.02, tokens=8)], diff(before, few), before, 1024) == []


def test_short_answers_ending_on_eos_get_no_timing_verdict():
    from ds4deploy.bench.run import judge

    before = parse_metrics((FIX / "vllm-0.32-cpu-metrics-idle.txt").read_text())
    # 16 answers of 6 tokens at 1,150 tok/s: the EOS step carries no text, so the client sees 4 of the 5 decode
    # steps (25 % faster than the server) - an artefact of short answers, not a stalled stream.
    server = Counters(**{**before.__dict__, "generation_tokens": 96.0, "requests_finished": 16.0,
                         "itl_seconds_sum": 16 * 5 / 1150})
    short = [_result(i, 0.02, 0.02 + 4 / 1150, tokens=6) for i in range(16)]
    assert judge(short, diff(before, server), before, 1024) == []
    # The same timing with long answers is judged (and flagged).
    longer = [_result(i, 0.02, 0.02 + 36 / 1150 * 0.7, tokens=37) for i in range(16)]
    server_long = Counters(**{**before.__dict__, "generation_tokens": 16 * 37.0, "requests_finished": 16.0,
                              "itl_seconds_sum": 16 * 36 / 1150})
    assert judge(longer, diff(before, server_long), before, 1024)[0].startswith("stream timing off")
