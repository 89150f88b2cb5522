"""The wire as a neutral clock: when each benchmark request went out and when its first token came back, taken
from a packet capture of the client's connection to the server.

Why (docs/bench-harness.md, "Reading the trust measurements"): two benchmark clients on the same server can only
be compared request for request if something outside both of them times the same requests. The kernel's capture
timestamps do: per request, the client's TTFT minus the wire's TTFT is the client's own time inside its TTFT (its
send path, its event loop reaching the chunk, its parser), and that difference is paired per request, so the
server's request-to-request spread (on the 2-core CI host a request's TTFT at 4 sessions is 20-30 ms or 50-75 ms
with its place in a batch, docs/results/bench-harness-runs/2026-11-30-wire.txt) drops out of the comparison.

Capture: ``tcpdump -i <iface> -s 0 -U -w FILE tcp port PORT`` (needs root or CAP_NET_RAW). Parse: dpkt (pcap
reader, Ethernet/Linux-cooked/IP/TCP). Requests are recognised by the benchmark salt every prompt starts with
(``[bench <run id> #<6 digits>]``, `ds4deploy.bench.prompts.salt`); one request at a time per connection (HTTP/1.1
keep-alive, no pipelining: aiohttp and vLLM's client both work that way), so the server's bytes on a connection
between two requests belong to the first.
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dpkt

from ds4deploy.core.errors import UserError

# The salt of `ds4deploy.bench.prompts.salt`; in a JSON body it is plain ASCII, never escaped.
TAG = re.compile(rb"\[bench ([0-9a-f]+) #(\d{6})\]")
# The first SSE event with reasoning or content text (`ds4deploy.bench.stream`'s definition of the first token):
# a JSON string value that is not empty. vLLM's role-only first frame has "content":"" and does not match.
TOKEN = re.compile(rb'"(?:reasoning|reasoning_content|content)":"[^"]')
ROLE = re.compile(rb'"role":"assistant"')
USAGE = re.compile(rb'"completion_tokens":(\d+)')  # the usage event (stream_options.include_usage)
OVERLAP = 64  # bytes kept from the previous segment, so an event split across two segments still matches


@dataclass
class WireRequest:
    """One request as the wire saw it; times are capture timestamps (seconds since the epoch, microsecond
    resolution). `first_token_s` / `role_s` are None when the response carried none (an error, a cut stream)."""

    run_id: str
    index: int
    sent_s: float  # the last client segment of the request (its body complete on the wire)
    client: str = ""  # the connection's client end, "address port"
    role_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    completion_tokens: int | None = None  # from the usage event, when the stream carried one

    @property
    def decode_tok_s(self) -> float | None:
        """Decode rate on the wire, tok/s: (completion tokens - 1) / (last - first token), the harness's per-request
        definition (`ds4deploy.bench.stream.RequestResult.decode_tok_s`) on the capture's clock."""
        if (self.completion_tokens is None or self.completion_tokens < 2 or self.first_token_s is None
                or self.last_token_s is None or self.last_token_s <= self.first_token_s):
            return None
        return (self.completion_tokens - 1) / (self.last_token_s - self.first_token_s)

    @property
    def ttft_ms(self) -> float | None:
        """Wire TTFT: request complete on the wire -> first token on the wire, ms."""
        return None if self.first_token_s is None else (self.first_token_s - self.sent_s) * 1000


def _tcp(reader: dpkt.pcap.Reader) -> Iterator[tuple[float, dpkt.ip.IP | dpkt.ip6.IP6, dpkt.tcp.TCP]]:
    """(timestamp, IP packet, its TCP segment) for every IPv4/IPv6 TCP packet with payload in the capture."""
    link = reader.datalink()
    if link == dpkt.pcap.DLT_EN10MB:
        frame = dpkt.ethernet.Ethernet
    elif link == dpkt.pcap.DLT_LINUX_SLL:
        frame = dpkt.sll.SLL
    elif link == getattr(dpkt.pcap, "DLT_LINUX_SLL2", 276):
        frame = dpkt.sll2.SLL2
    else:
        raise ValueError(f"unsupported capture link type {link} (capture on lo, any or an Ethernet interface)")
    for ts, buf in reader:
        ip = frame(buf).data
        if isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) and isinstance(ip.data, dpkt.tcp.TCP) and ip.data.data:
            yield ts, ip, ip.data


def _addr(packed: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if len(packed) == 16 else socket.AF_INET, packed)


class _Stream:
    """One direction of one TCP connection: hands out each byte once, in order, so a retransmitted segment (or
    the repeated part of one) is not read twice, and keeps the last `OVERLAP` bytes so a pattern cut by a segment
    boundary still matches."""

    def __init__(self) -> None:
        self.base: int | None = None  # the first sequence number seen
        self.next = 0  # bytes handed out so far, relative to `base`
        self.tail = b""

    def new_data(self, seq: int, data: bytes) -> bytes:
        """The part of a segment not seen before (b"" for a pure retransmission); after a gap (a segment the
        capture lost) reading goes on from the new segment."""
        if self.base is None:
            self.base = seq
        start = (seq - self.base) % 2**32
        end = start + len(data)
        if end <= self.next:
            return b""
        new = data[max(0, self.next - start):]
        self.next = end
        return new


def _find_new(pattern: re.Pattern, tail: bytes, buf: bytes) -> re.Match | None:
    """The first match of `pattern` in `buf` (= tail + new bytes) that ends in the new bytes: a match wholly inside
    the tail was already found with the previous segment."""
    return next((m for m in pattern.finditer(buf) if m.end() > len(tail)), None)


def parse(path: Path, port: int) -> dict[tuple[str, int], WireRequest]:
    """Every salted request to server `port` in the pcap file `path`, keyed by (run id, request index).

    Each direction of a connection is read in sequence order, each byte once (`_Stream`: retransmissions are
    skipped). A request starts with the client bytes carrying a salt; further client bytes before the first server
    byte are the rest of its body (its `sent_s` moves to the last of them); server bytes after that belong to it
    until the next salted request on the same connection (HTTP/1.1 keep-alive, no pipelining: aiohttp, which both
    clients use, waits for a response before reusing a connection).

    The same salt can go out more than once: the harness sizes each prompt with the server's /tokenize before it
    sends it (the answer is JSON, no token), and a capture on "any" sees a local container's traffic again behind
    Docker's port proxy. The request kept per salt is the earliest one answered with a token (the client's own
    connection: the proxy forwards only after it has received), else the last one seen.

    Raises UserError for a file that is not a readable capture or of an unsupported link type."""
    conns: dict[tuple, dict] = {}  # by (client address, client port, server address)
    seen: dict[tuple[str, int], list[WireRequest]] = {}
    try:
        with path.open("rb") as f:
            for ts, ip, tcp in _tcp(dpkt.pcap.Reader(f)):
                if tcp.dport == port:
                    c = conns.setdefault((ip.src, tcp.sport, ip.dst),
                                         {"req": None, "answered": False, "up": _Stream(), "down": _Stream()})
                    up: _Stream = c["up"]
                    data = up.new_data(tcp.seq, bytes(tcp.data))
                    if not data:
                        continue
                    buf, tail = up.tail + data, up.tail
                    up.tail = buf[-OVERLAP:]
                    m = _find_new(TAG, tail, buf)
                    if m:
                        key = (m.group(1).decode(), int(m.group(2)))
                        c.update(req=WireRequest(key[0], key[1], ts, f"{_addr(ip.src)} {tcp.sport}"),
                                 answered=False)
                        seen.setdefault(key, []).append(c["req"])
                    elif c["req"] is not None and not c["answered"]:
                        c["req"].sent_s = ts
                elif tcp.sport == port:
                    c = conns.get((ip.dst, tcp.dport, ip.src))
                    if c is None:
                        continue
                    down: _Stream = c["down"]
                    data = down.new_data(tcp.seq, bytes(tcp.data))
                    if not data or c["req"] is None:
                        continue
                    c["answered"] = True
                    r: WireRequest = c["req"]
                    buf, tail = down.tail + data, down.tail
                    down.tail = buf[-OVERLAP:]
                    if r.role_s is None and _find_new(ROLE, tail, buf):
                        r.role_s = ts
                    if _find_new(TOKEN, tail, buf):
                        r.first_token_s = r.first_token_s or ts
                        r.last_token_s = ts
                    if m := _find_new(USAGE, tail, buf):
                        r.completion_tokens = int(m.group(1))
    except (ValueError, dpkt.dpkt.NeedData, dpkt.dpkt.UnpackError) as exc:
        raise UserError(f"cannot read the packet capture {path}: {exc or type(exc).__name__}",
                        "rerun (tcpdump may have stopped before writing), or pass --no-wire") from None
    out = {}
    for key, reqs in seen.items():
        answered = [r for r in reqs if r.first_token_s is not None]
        out[key] = min(answered, key=lambda r: r.sent_s) if answered else reqs[-1]
    return out


@dataclass
class Capture:
    """A running or finished capture: `path` the pcap file; after the capture ends, `dropped` is the kernel's
    count of packets it could not hand to tcpdump (then some requests may be missing or mistimed)."""

    path: Path
    port: int
    dropped: int | None = None

    def requests(self) -> dict[tuple[str, int], WireRequest]:
        """`parse` of the finished capture."""
        return parse(self.path, self.port)


def available() -> str | None:
    """None when a capture can run here, else why not (one line, with the fix)."""
    if shutil.which("tcpdump") is None:
        return "tcpdump is not installed (apt-get install tcpdump)"
    return None


@contextmanager
def capture(path: Path, port: int, interface: str = "lo") -> Iterator[Capture]:
    """Capture TCP port `port` on `interface` into `path` while the block runs.

    tcpdump runs packet-buffered (-U), with full snap length and without dropping privileges (-Z root: the file's
    directory may be private to root). Waits for tcpdump's "listening on" before yielding; stops it with SIGINT
    (it then flushes the file and prints its counters) and records the dropped-packet count.

    Raises UserError when tcpdump is missing or fails to start (e.g. not root)."""
    why = available()
    if why:
        raise UserError(f"cannot capture the benchmark traffic: {why}", "install tcpdump, or pass --no-wire")
    # -B: a 16 MiB kernel buffer (KiB; the default 2 MiB is what a busy 2-core host overruns first)
    cmd = ["tcpdump", "-i", interface, "-s", "0", "-B", "16384", "-U", "-n", "-Z", "root", "-w", str(path), "tcp",
           "port", str(port)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert p.stderr is not None
    # "tcpdump: listening on lo, link-type EN10MB ..." (on "any" after a "data link type LINUX_SLL2" line), or an
    # error and exit
    head = ""
    while "listening on" not in head:
        line = p.stderr.readline()
        if not line:
            p.kill()
            rest = p.communicate()[1]
            raise UserError(f"tcpdump did not start: {(head + rest).strip()}",
                            "run as root (packet capture needs CAP_NET_RAW), or pass --no-wire")
        head += line
    cap = Capture(path, port)
    try:
        yield cap
    finally:
        # tcpdump reads the kernel buffer in blocks, handed over when full or after libpcap's timeout (tcpdump sets
        # 1,000 ms); on SIGINT it stops without the pending block, so wait it out (measured: a request sent 0.1-0.5 s
        # before the stop was missing from the file, 1.5 s after it was there)
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        try:
            err = p.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            p.kill()
            err = p.communicate()[1]
        m = re.search(r"(\d+) packets? dropped by kernel", err)
        cap.dropped = int(m.group(1)) if m else None


# A client-side delay this long inside one request's TTFT is a stall of the client process (its event loop did not
# reach the chunk), not the ordinary send/parse path: that is 0.3-1.2 ms here (docs/results/bench-harness-runs/
# 2026-11-30-wire.txt), while stalled requests waited 13-400 ms.
STALL_MS = 5.0


def pair(client: dict[int, float | None], wire: dict[tuple[str, int], WireRequest],
         run_id: str) -> list[tuple[float, WireRequest]] | None:
    """The client's per-request values (keyed by salt index) with the same requests on the wire, in index order;
    values that are None are left out. None when the capture lacks any of the client's requests: then nothing of
    the run is paired (a run is compared whole or not at all)."""
    if any((run_id, i) not in wire for i in client):
        return None
    return [(v, wire[(run_id, i)]) for i, v in sorted(client.items()) if v is not None]


def run_ttft_ms(wire: dict[tuple[str, int], WireRequest], run_id: str, indexes: list[int]) -> float | None:
    """Median wire TTFT (ms) over requests `indexes` of run `run_id` that got a first token (None if none did)."""
    vals = [wire[(run_id, i)].ttft_ms for i in indexes if (run_id, i) in wire]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def client_overhead(records: list[dict], wire: dict[tuple[str, int], WireRequest], run_id: str) -> dict[str, dict]:
    """Each client's own time inside its TTFT, request by request: client TTFT - wire TTFT of the same request.

    `records`: [{"client": str, "index": int, "ttft_ms": float}] (`tools.benchval.trust_send`); requests the
    capture does not hold (or holds without a first token) are counted as `missing`. Per client: `n`,
    `missing`, `wire_ttft_ms_median`, `ttft_ms_median` (the client's own, same requests),
    `overhead_ms_median`/`_p90`/`_mean` (ms), `reported_vs_wire` (the client's median TTFT / the wire's median
    TTFT of the same requests - 1: what its reported figure is off by, stalls included), `stalls` (requests with
    more than `STALL_MS` of client time), `pairs` ((client TTFT, wire TTFT) per request, ms, for
    `reported_diff_ci`),
    `role_lead_ms_median` (how long vLLM's role-only frame leaves before the first token, on the wire: a client
    that stops its TTFT clock at that frame, as `vllm bench serve` does, reads that much less) and `overhead_ms`
    (every value, for `median_diff_ci`)."""
    per: dict[str, dict[str, list[float]]] = {}
    missing: dict[str, int] = {}
    for rec in records:
        w = wire.get((run_id, rec["index"]))
        d = per.setdefault(rec["client"], {"ov": [], "wire": [], "ttft": [], "role": []})
        if w is None or w.ttft_ms is None:
            missing[rec["client"]] = missing.get(rec["client"], 0) + 1
            continue
        d["ov"].append(rec["ttft_ms"] - w.ttft_ms)
        d["wire"].append(w.ttft_ms)
        d["ttft"].append(rec["ttft_ms"])
        if w.role_s is not None:
            d["role"].append((w.first_token_s - w.role_s) * 1000)
    out = {}
    for client, d in per.items():
        ov = d["ov"]
        out[client] = {"n": len(ov), "missing": missing.get(client, 0)}
        if len(ov) >= 2:
            out[client] |= {"wire_ttft_ms_median": statistics.median(d["wire"]),
                            "ttft_ms_median": statistics.median(d["ttft"]),
                            "overhead_ms_median": statistics.median(ov),
                            "overhead_ms_p90": statistics.quantiles(ov, n=10)[-1],
                            "overhead_ms_mean": statistics.mean(ov),
                            "reported_vs_wire": statistics.median(d["ttft"]) / statistics.median(d["wire"]) - 1,
                            "stalls": sum(x > STALL_MS for x in ov), "overhead_ms": ov,
                            "pairs": list(zip(d["ttft"], d["wire"], strict=True)),
                            "role_lead_ms_median": statistics.median(d["role"]) if d["role"] else None}
    return out


def _interval(values: list[float]) -> tuple[float, float]:
    """The 2.5th and 97.5th percentile of bootstrap replicates (nearest rank)."""
    v = sorted(values)
    return v[max(0, round(0.025 * len(v)) - 1)], v[min(len(v) - 1, round(0.975 * len(v)) - 1)]


def median_diff_ci(a: list[float], b: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(a) - median(b) (two samples taken as independent, `reps`
    resamples, fixed `seed` so a re-render gives the same figures). Requests that share a batch are not quite
    independent (at 4 sessions a client stall hits neighbours too), so the interval is somewhat narrow there."""
    rnd = random.Random(seed)  # noqa: S311 (resampling for statistics, not security)
    return _interval([statistics.median(rnd.choices(a, k=len(a))) - statistics.median(rnd.choices(b, k=len(b)))
                      for _ in range(reps)])


def reported_diff_ci(a: list[tuple[float, float]], b: list[tuple[float, float]], reps: int = 2000,
                     seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of (median client / median wire - 1) of `a` minus the same of `b`, each a list of
    (client TTFT, wire TTFT) pairs resampled as pairs (same caveat and seed as `median_diff_ci`)."""
    rnd = random.Random(seed)  # noqa: S311 (resampling for statistics, not security)

    def off(pairs: list[tuple[float, float]]) -> float:
        got = rnd.choices(pairs, k=len(pairs))
        return statistics.median(c for c, _ in got) / statistics.median(w for _, w in got) - 1

    return _interval([off(a) - off(b) for _ in range(reps)])


def run_aggregate_tok_s(wire: dict[tuple[str, int], WireRequest], run_id: str, indexes: list[int]) -> float | None:
    """Aggregate output rate of requests `indexes` of run `run_id` on the wire, tok/s: their completion tokens /
    (last token of the last request - first request sent); None when a request is missing or lacks its usage event
    or last token."""
    reqs = [wire.get((run_id, i)) for i in indexes]
    if not reqs or any(r is None or r.completion_tokens is None or r.last_token_s is None for r in reqs):
        return None
    window = max(r.last_token_s for r in reqs) - min(r.sent_s for r in reqs)
    return sum(r.completion_tokens for r in reqs) / window if window > 0 else None


def paired_decode_ratio(client_decode_tok_s: dict[int, float | None], wire: dict[tuple[str, int], WireRequest],
                        run_id: str) -> list[float] | None:
    """Client decode rate / wire decode rate per request of run `run_id` (client rates keyed by salt index, see
    `pair`); requests without a rate on either side are left out; None when the capture lacks a request."""
    pairs = pair(client_decode_tok_s, wire, run_id)
    return None if pairs is None else [c / w.decode_tok_s for c, w in pairs if w.decode_tok_s]


def paired_overhead(client_ttfts_ms: dict[int, float | None], wire: dict[tuple[str, int], WireRequest],
                    run_id: str) -> list[float] | None:
    """Client TTFT - wire TTFT (ms) per request of run `run_id` (client TTFTs keyed by salt index, see `pair`);
    requests without a TTFT on either side are left out; None when the capture lacks a request."""
    pairs = pair(client_ttfts_ms, wire, run_id)
    return None if pairs is None else [c - w.ttft_ms for c, w in pairs if w.ttft_ms is not None]
