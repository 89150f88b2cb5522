"""The wire as the reference clock (tools/benchval/wire.py), on real captures of the deployed cpu stack
(fixtures/wire/SOURCES.md) and on a live capture of a local server."""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

import dpkt
import pytest

from tests.unit.conftest import chat_server
from tools.benchval import wire

FIX = Path(__file__).parent / "fixtures" / "wire"
PROBE = json.loads((FIX / "probe-c2-lo.json").read_text())
CELL = json.loads((FIX / "bench-run-c2-any.cell.json").read_text())


def test_probe_capture_every_request_with_its_first_token():
    w = wire.parse(FIX / "probe-c2-lo.pcap", 8000)
    run = PROBE["run_id"]
    # 2 sessions x 4 requests (one unmeasured round each), plus the refused request sent with curl.
    assert sorted(i for r, i in w if r == run) == [0, 1, 2, 3, 10000, 10001, 10002, 10003]
    for (r, _i), x in w.items():
        if r != run:
            continue
        assert x.sent_s < x.role_s <= x.first_token_s
        assert 5 < x.ttft_ms < 100
    refused = w[("0badc0de", 1)]  # HTTP 400: max_tokens above max_model_len, no stream
    assert refused.first_token_s is None and refused.role_s is None and refused.ttft_ms is None


def test_probe_capture_pairs_with_the_clients_own_ttft():
    """Per request the client read its first token after the wire carried it (ours: the first text; vLLM's
    client: the role-only frame, up to `role lead` earlier), by little: the pairing is the right request."""
    w = wire.parse(FIX / "probe-c2-lo.pcap", 8000)
    run = PROBE["run_id"]
    diffs = []
    for rec in PROBE["requests"]:
        x = w[(run, rec["index"])]
        d = rec["ttft_ms"] - x.ttft_ms
        lead = (x.first_token_s - x.role_s) * 1000
        assert d > (0 if rec["client"] == "ours" else -lead - 0.05), rec
        diffs.append(d)
    assert max(abs(d) for d in diffs) < 2.5
    # The wire TTFTs differ by several ms between requests, so pairing a client record with another request's
    # wire time shows: the same check fails for the records shifted by one.
    wires = [w[(run, rec["index"])].ttft_ms for rec in PROBE["requests"]]
    shifted = [rec["ttft_ms"] - wt for rec, wt in zip(PROBE["requests"], wires[1:] + wires[:1], strict=True)]
    assert max(abs(d) for d in shifted) > 2.5


def test_client_overhead_per_client():
    w = wire.parse(FIX / "probe-c2-lo.pcap", 8000)
    ov = wire.client_overhead(PROBE["requests"], w, PROBE["run_id"])
    assert set(ov) == {"ours", "vllm", "vllm_noenv"}
    for client, x in ov.items():
        mine = [r for r in PROBE["requests"] if r["client"] == client]
        assert x["n"] == len(mine) == 2 and x["missing"] == 0 and x["stalls"] == 0
        want = [r["ttft_ms"] - w[(PROBE["run_id"], r["index"])].ttft_ms for r in mine]
        assert x["overhead_ms_median"] == pytest.approx(statistics.median(want))
        assert x["ttft_ms_median"] == pytest.approx(statistics.median(r["ttft_ms"] for r in mine))
    # A record the capture does not hold is counted, not paired with something else.
    recs = PROBE["requests"] + [{"client": "ours", "index": 4242, "ttft_ms": 10.0}]
    assert wire.client_overhead(recs, w, PROBE["run_id"])["ours"]["missing"] == 1
    # A client-side delay past STALL_MS is a stall.
    recs = [dict(r, ttft_ms=r["ttft_ms"] + 50) if r["index"] == 3 else r for r in PROBE["requests"]]
    assert wire.client_overhead(recs, w, PROBE["run_id"])["ours"]["stalls"] == 1


def test_any_capture_keeps_the_clients_own_connection():
    """`tcpdump -i any` (Linux cooked v2) of `ds4deploy bench run`: every salt also went to /tokenize while the
    harness sized the prompt, and the same request shows again on Docker's bridge behind the port proxy. The kept
    request is the client's (earliest answered with a token), so it pairs with the cell's own TTFTs."""
    with (FIX / "bench-run-c2-any.pcap").open("rb") as f:
        assert dpkt.pcap.Reader(f).datalink() == 276  # DLT_LINUX_SLL2
    w = wire.parse(FIX / "bench-run-c2-any.pcap", 8000)
    run = CELL["run_id"]
    # This cell had no warm-up and is the run's only one: its requests carry salts #0-#3 (later cells record
    # each request's salt_index; this capture predates that field).
    med = wire.run_ttft_ms(w, run, [0, 1, 2, 3])
    assert (run, 999999) in w  # the harness's probe request, not part of the cell
    # Each request went out three times (client -> proxy on lo, proxy -> container seen on the veth and the
    # bridge); the kept one is the client's.
    assert {w[(run, i)].client.split()[0] for i in range(4)} == {"127.0.0.1"}
    ttfts = {q["index"]: q["ttft_s"] * 1000 for q in CELL["requests"]}
    ov = wire.paired_overhead(ttfts, w, run)
    assert ov is not None and len(ov) == 4
    assert all(0 < d < 2.5 for d in ov)  # ours stops at the first text: always after the wire
    assert med == pytest.approx(statistics.median(t - d for t, d in zip(ttfts.values(), ov, strict=True)))
    # Paired by salt, not by position: a request the capture does not hold leaves the whole run unpaired.
    assert wire.paired_overhead({**ttfts, 7: 12.0}, w, run) is None
    assert wire.paired_overhead({i: ttfts[i] for i in (3, 1)}, w, run) == [ov[1], ov[3]]


def test_any_capture_output_rates_match_the_cells():
    """Token counts from the usage events and the decode window on the wire: the same as the cell's own record
    (max_tokens 8, ignore_eos), and its per-request decode rate within 2 % of the wire's (the client times each
    chunk a few hundredths of a ms after the wire, on a 15 ms window)."""
    w = wire.parse(FIX / "bench-run-c2-any.pcap", 8000)
    run = CELL["run_id"]
    reqs = sorted(CELL["requests"], key=lambda q: q["index"])
    mine = [w[(run, i)] for i in range(4)]
    assert [x.completion_tokens for x in mine] == [q["completion_tokens"] for q in reqs] == [8] * 4
    ratios = wire.paired_decode_ratio({q["index"]: q["decode_tok_s"] for q in reqs}, w, run)
    assert ratios is not None and len(ratios) == 4
    assert all(abs(r - 1) < 0.02 for r in ratios)
    agg = wire.run_aggregate_tok_s(w, run, [0, 1, 2, 3])
    assert agg == pytest.approx(32 / (max(x.last_token_s for x in mine) - min(x.sent_s for x in mine)))
    # The cell's own aggregate spans the same traffic on the client's clock: close, never faster than the wire
    # by more than the client's read lag allows.
    assert 0.8 < CELL["output_throughput"] / agg < 1.02
    assert wire.paired_decode_ratio({4: 1.0}, w, run) is None
    assert wire.run_aggregate_tok_s(w, run, [0, 1, 2, 3, 4]) is None  # a request the capture does not hold


def _pcap(path: Path, segments: list[tuple[float, int, int, bytes] | tuple[float, int, int, bytes, int]]) -> None:
    """A capture of TCP segments (time, source port, destination port, payload[, sequence number]) on 127.0.0.1,
    Ethernet framing; without a sequence number a segment follows the previous one of its direction."""
    nxt: dict[tuple[int, int], int] = {}
    with path.open("wb") as f:
        out = dpkt.pcap.Writer(f)
        for ts, sport, dport, data, *seq in segments:
            start = seq[0] if seq else nxt.get((sport, dport), 4_294_967_000)  # wraps past 2**32 on the way
            nxt[(sport, dport)] = (start + len(data)) % 2**32
            tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=start, flags=dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH,
                               data=data)
            ip = dpkt.ip.IP(src=b"\x7f\x00\x00\x01", dst=b"\x7f\x00\x00\x01", p=dpkt.ip.IP_PROTO_TCP, data=tcp)
            ip.len = len(bytes(ip))
            out.writepkt(dpkt.ethernet.Ethernet(type=dpkt.ethernet.ETH_TYPE_IP, data=ip), ts=ts)


def test_event_split_across_segments_and_body_after_headers(tmp_path):
    """Headers and body in separate client segments (the body's is the send time), a retransmitted body (not a
    new send), the first token's event cut in two by the server's segments (the token counts when its second half
    arrives), a retransmitted token segment after the last token (not a later token), sequence numbers wrapping
    past 2**32."""
    body = b'{"messages": [{"role": "user", "content": "[bench 00c0ffee #000007] hi"}]}'
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":"Hel'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"
    segs = [(1.000, 50000, 8000, head),
            (1.001, 50000, 8000, body),
            (1.002, 50000, 8000, body, (4_294_967_000 + len(head)) % 2**32),  # retransmission of the body
            (1.010, 8000, 50000, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"),
            (1.020, 8000, 50000, role + b'data: {"choices":[{"delta":{"con'),
            (1.030, 8000, 50000, b'tent":"Hello"}}]}\n\n'),
            (1.040, 8000, 50000, token + b'lo"}}]}\n\n'),
            (1.050, 8000, 50000, b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion'),
            (1.060, 8000, 50000, b'_tokens":3,"total_tokens":12}}\n\ndata: [DONE]\n\n')]
    down = 4_294_967_000 + len(segs[3][3]) + len(segs[4][3]) + len(segs[5][3])
    segs.append((1.070, 8000, 50000, token + b'lo"}}]}\n\n', down % 2**32))  # the 1.040 segment again
    _pcap(tmp_path / "c.pcap", segs)
    (x,) = wire.parse(tmp_path / "c.pcap", 8000).values()
    assert (x.run_id, x.index) == ("00c0ffee", 7)
    assert x.sent_s == pytest.approx(1.001)
    assert x.role_s == pytest.approx(1.020)
    assert x.first_token_s == pytest.approx(1.030)
    assert x.ttft_ms == pytest.approx(29.0)
    # The last token is the 1.040 segment: the usage segments after it carry none (their overlap with the token
    # before does not count again), and the usage event split in two still gives the count.
    assert x.last_token_s == pytest.approx(1.040)
    assert x.completion_tokens == 3
    assert x.decode_tok_s == pytest.approx(2 / 0.010)


def test_unreadable_captures_are_one_clear_error(tmp_path):
    from ds4deploy.core.errors import UserError

    with (tmp_path / "x.pcap").open("wb") as f:
        dpkt.pcap.Writer(f, linktype=dpkt.pcap.DLT_IEEE802_11)
    with pytest.raises(UserError, match="link type") as e:
        wire.parse(tmp_path / "x.pcap", 8000)
    assert "--no-wire" in e.value.fix
    (tmp_path / "empty.pcap").write_bytes(b"")  # tcpdump stopped before writing its header
    with pytest.raises(UserError, match="cannot read the packet capture"):
        wire.parse(tmp_path / "empty.pcap", 8000)
    head = (FIX / "probe-c2-lo.pcap").read_bytes()[:5000]  # cut in the middle of a packet
    (tmp_path / "cut.pcap").write_bytes(head)
    wire.parse(tmp_path / "cut.pcap", 8000)  # what is there is read; a cut last record is no error


def test_median_diff_ci():
    a = [10.0 + 0.1 * (i % 7) for i in range(200)]
    lo, hi = wire.median_diff_ci(a, a)
    assert lo <= 0 <= hi
    lo, hi = wire.median_diff_ci([x + 1 for x in a], a)
    assert 0.5 < lo <= 1 <= hi < 1.5
    assert wire.median_diff_ci(a, [x + 0.05 for x in a]) == wire.median_diff_ci(a, [x + 0.05 for x in a])


@pytest.mark.skipif(shutil.which("tcpdump") is None or os.geteuid() != 0,
                    reason="needs tcpdump and root (make unit installs tcpdump; CI runs as root)")
def test_live_capture_of_a_local_stream(tmp_path):
    """A real tcpdump capture around a real request: a local aiohttp server that answers after 30 ms with the
    captured vLLM stream, our client with a salted body. Causality, not speed: the wire sees the first token at
    least 30 ms after the request and no later than the client does."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from ds4deploy.bench.stream import stream_request

    sse = (Path(__file__).parent / "fixtures" / "bench" / "vllm-0.32-cpu-chat-stream.sse").read_bytes()

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.03)
        for event in sse.split(b"\n\n"):
            if event.strip():
                await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    async def run() -> tuple[object, wire.Capture]:
        async with chat_server(handler) as (url, port):
            with wire.capture(tmp_path / "live.pcap", port, "lo") as cap:
                async with aiohttp.ClientSession() as session:
                    payload = {"messages": [{"role": "user", "content": "[bench 0ddba11 #000003] hi"}],
                               "stream": True}
                    result = await stream_request(session, url, payload, 3)
        return result, cap

    result, cap = asyncio.run(run())
    assert result.ok, result.error
    assert cap.dropped == 0
    x = cap.requests()[("0ddba11", 3)]
    assert x.ttft_ms >= 30.0
    assert x.ttft_ms <= result.ttft_s * 1000


def test_capture_without_tcpdump_is_one_clear_error(tmp_path, monkeypatch):
    from ds4deploy.core.errors import UserError

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run here
    assert "tcpdump is not installed" in wire.available()
    with pytest.raises(UserError, match="tcpdump is not installed") as e, wire.capture(tmp_path / "x.pcap", 1):
        pass
    assert "--no-wire" in e.value.fix


@pytest.mark.skipif(shutil.which("tcpdump") is None or os.geteuid() != 0,
                    reason="needs tcpdump and root (make unit installs tcpdump; CI runs as root)")
def test_capture_that_cannot_start_says_why(tmp_path):
    from ds4deploy.core.errors import UserError

    with pytest.raises(UserError, match=r"tcpdump did not start: .*no-such-if0") as e, \
            wire.capture(tmp_path / "x.pcap", 1, "no-such-if0"):
        pass
    assert "--no-wire" in e.value.fix
