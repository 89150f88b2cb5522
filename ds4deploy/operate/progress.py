"""Is the engine working, idle or stuck? Read from the engine's own progress counters, per engine family.

The supervisor (ds4deploy.operate.supervisor) must never restart an engine that is only busy: on a one-sequence recipe a
probe request waits behind the user's request, and a long prefill prints nothing for minutes (docs/sources.md
#supervisor-progress). So "stuck" is decided from what the engine itself reports:

- a `Reading` is one look at the engine: how many requests it runs and queues (`load`), and a fingerprint of every
  value that moves when the scheduler does work (token counters, the iteration counter, the KV-cache fill, the
  running/waiting gauges themselves);
- `ProgressWatch.judge` turns successive readings into a `Verdict`: ``idle`` (nothing running or queued, and no
  work counter moved since the last reading: the supervisor may send its one-token probe, which then waits behind
  no one), ``busy`` (work present and the fingerprint moved within the recipe's bound ``serving.progress_bound_s``;
  or nothing in the scheduler at this reading but tokens served since the last one: short requests that come and
  go between readings, or wait in the API server, which the scheduler's gauges do not count), ``stalled`` (work
  present and nothing moved for the whole bound: restart), ``unreadable`` (no reading: the supervisor falls back to
  its probe).
  A reading that fails while the last one showed work that moved within the bound stays ``busy``: under a full
  queue the API server answers /metrics late (up to 6.5 s on the 2-core cpu stack with 16 clients, 20 s with the
  test suite loading the host, 2026-12-01), and a probe sent then would wait behind the queue and call a busy
  engine wedged (with the 5 s reading timeout of before, the supervisor's readings failed under the e2e load).

One family's reading lives in one function of `READERS`, keyed by ``engine.family``. Both families serve /metrics
in the Prometheus text format (`ds4deploy.parsers.prometheus.sum_samples`):

- ``vllm``: `read_vllm` (the scheduler's running/waiting gauges, token counters, iteration histogram, KV-cache fill);
- ``llamacpp``: `read_llamacpp` (llama-server started with ``--metrics``, which `ds4deploy.engines.llamacpp` always
  passes: its processing and deferred requests, prompt and generated token counters, the llama_decode() call
  counter). On a one-slot llama-server a probe request would wait behind the user's request, so this reading is the
  only safe way to tell a long prefill from a wedge (docs/sources.md#llamacpp-metrics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ds4deploy.engines.llamacpp import METRICS as LLAMACPP_METRICS
from ds4deploy.engines.vllm import METRICS as VLLM_METRICS
from ds4deploy.parsers.prometheus import sum_samples

# vLLM's samples that move whenever the scheduler does work (names: `ds4deploy.engines.vllm.METRICS`). Counters:
# prompt and generated tokens (counted when a request's first token and each later one comes out), finished
# requests, preemptions, prefix-cache lookups (counted when a request is scheduled), and the `_count` of the
# per-iteration token histogram (one observation per engine step that produced tokens). Gauges: the KV-cache fill
# (moves with every chunk of a chunked prefill) and the scheduler's running/waiting counts. Samples are summed over
# their labels (model name, engine index).
VLLM_RUNNING = VLLM_METRICS["requests_running"]
VLLM_WAITING = VLLM_METRICS["requests_waiting"]
VLLM_PROGRESS = tuple(VLLM_METRICS[k] for k in (
    "prompt_tokens", "generation_tokens", "iteration_tokens_count", "requests_finished", "preemptions",
    "prefix_cache_queries", "kv_cache_usage", "requests_running", "requests_waiting"))


@dataclass(frozen=True)
class Reading:
    """One look at the engine: `running` and `waiting` requests (counts) and `fingerprint`, the values that move
    when it works (sample name -> value, units as the engine reports them: tokens, requests, a 0-1 fraction)."""

    running: float
    waiting: float
    fingerprint: tuple[tuple[str, float], ...]

    @property
    def load(self) -> float:
        """Requests the engine holds: running + waiting."""
        return self.running + self.waiting


def _metrics_page(url: str, key: str | None, timeout_s: float) -> str:
    """GET <url>/metrics with the key as a bearer token; the page's text.

    Raises:
        httpx.HTTPError: no answer within `timeout_s`, or a status other than 200.
    """
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=timeout_s)
    r.raise_for_status()
    return r.text

def _reading(text: str, names: tuple[str, ...], running: str, waiting: str, hint: str) -> Reading:
    """Sum the samples of `names` on a Prometheus text page over their labels -> `Reading` (`running` and `waiting`
    are the family's gauges, both among `names`).

    Raises:
        ValueError: the page is not Prometheus text, or lacks either gauge (the message names both, then `hint`).
    """
    sums = sum_samples(text, names)
    if running not in sums or waiting not in sums:
        raise ValueError(f"no {running} / {waiting} on the metrics page{hint}")
    return Reading(sums[running], sums[waiting], tuple(sorted(sums.items())))


def parse_vllm_metrics(text: str) -> Reading:
    """A vLLM /metrics page (Prometheus text format) -> `Reading`.

    Raises:
        ValueError: the page is not Prometheus text, or lacks the running/waiting gauges (not a vLLM engine).
    """
    return _reading(text, VLLM_PROGRESS, VLLM_RUNNING, VLLM_WAITING, "")


def read_vllm(url: str, key: str | None, timeout_s: float) -> Reading:
    """GET <url>/metrics with the key; `parse_vllm_metrics` of the answer.

    Raises:
        httpx.HTTPError: no answer within `timeout_s`, or a status other than 200.
        ValueError: see `parse_vllm_metrics`.
    """
    return parse_vllm_metrics(_metrics_page(url, key, timeout_s))


# llama-server's samples that move when it works, and its two gauges (names and their sources:
# `ds4deploy.engines.llamacpp.METRICS`; the averaged rates and the high-water mark are left out there).
LLAMACPP_RUNNING = LLAMACPP_METRICS["requests_processing"]
LLAMACPP_WAITING = LLAMACPP_METRICS["requests_deferred"]
LLAMACPP_PROGRESS = tuple(LLAMACPP_METRICS.values())
# The samples of both families that are gauges, not counts of work done: they go down as well as up, so a change in
# them alone is no sign that the engine worked (`ProgressWatch.judge`, "worked since the last reading").
GAUGES = frozenset({VLLM_RUNNING, VLLM_WAITING, VLLM_METRICS["kv_cache_usage"], LLAMACPP_RUNNING, LLAMACPP_WAITING})


def parse_llamacpp_metrics(text: str) -> Reading:
    """A llama-server /metrics page (Prometheus text format, `LLAMACPP_PROGRESS`) -> `Reading`: `running` =
    requests_processing (slots busy), `waiting` = requests_deferred (requests queued for a free slot).

    Raises:
        ValueError: the page is not Prometheus text, or lacks the requests_processing / requests_deferred gauges
            (not a llama-server, or one started without ``--metrics``).
    """
    return _reading(text, LLAMACPP_PROGRESS, LLAMACPP_RUNNING, LLAMACPP_WAITING,
                    " (llama-server serves them only when started with --metrics)")


def read_llamacpp(url: str, key: str | None, timeout_s: float) -> Reading:
    """GET <url>/metrics with the key (llama-server checks the API key on /metrics too: only /health and /v1/health
    are public, tools/server/server-http.cpp, middleware_validate_api_key); `parse_llamacpp_metrics` of the answer.

    Raises:
        httpx.HTTPError: no answer within `timeout_s`, or a status other than 200 (501 from a llama-server started
            without ``--metrics``, 401 on a wrong key).
        ValueError: see `parse_llamacpp_metrics`.
    """
    return parse_llamacpp_metrics(_metrics_page(url, key, timeout_s))


# Engine family (``engine.family``: every vLLM build, stock, CPU or fork, serves the same /metrics; ``llamacpp``:
# llama-server) -> reader(url of the head's API, key, timeout in s) -> Reading. A family without a reader would fall
# back to the supervisor's probe.
READERS: dict[str, Callable[[str, str | None, float], Reading]] = {"vllm": read_vllm, "llamacpp": read_llamacpp}


def worked_between(before: Reading, after: Reading) -> bool:
    """True when a counter of work done (any fingerprint sample but `GAUGES`: tokens, finished requests, engine
    steps) is higher in `after` than in `before`: the engine worked in between, whatever its gauges say now."""
    old = dict(before.fingerprint)
    return any(v > old.get(name, v) for name, v in after.fingerprint if name not in GAUGES)


@dataclass(frozen=True)
class Verdict:
    """`state`: "idle", "busy", "stalled" or "unreadable"; `detail`: one line for the journal."""

    state: str
    detail: str


@dataclass
class ProgressWatch:
    """Successive readings -> `Verdict`. `bound_s`: seconds of no movement at all, with work present, that count as
    stuck (the recipe's ``serving.progress_bound_s``). Times are the caller's monotonic clock, in seconds."""

    bound_s: float
    last: Reading | None = None
    moved_at: float | None = None

    def judge(self, reading: Reading | None, now: float, why: str = "") -> Verdict:
        """Record `reading` (None: the engine gave none, `why` says why) taken at `now` and judge it.

        With nothing running or queued but a work counter higher than at the last reading (`worked_between`):
        ``busy``. No reading after one with work that moved less than `bound_s` ago: ``busy`` still (a late
        /metrics answer under load is not a wedge; the bound still applies, counted from that last movement). No
        reading after one with nothing running or queued: ``unreadable``, and the probe decides."""
        if reading is None:
            why = f" ({why})" if why else ""
            if self.last is not None and self.last.load > 0 and self.moved_at is not None:
                still = now - self.moved_at
                if still < self.bound_s:
                    return Verdict("busy", f"no progress reading now{why}; {self.last.running:g} running, "
                                           f"{self.last.waiting:g} waiting and progress {still:.0f} s ago at the last")
            return Verdict("unreadable", f"no progress reading{why}")
        worked = self.last is not None and worked_between(self.last, reading)
        self._take(reading, now)
        assert self.moved_at is not None
        still = now - self.moved_at
        work = f"{reading.running:g} running, {reading.waiting:g} waiting"
        if reading.load == 0:
            if worked:
                # Requests came and went between two readings: the gauges are a snapshot of the scheduler, and a
                # request still with the API server (being tokenized, or its answer detokenized and sent) is in
                # neither of them. On the 2-core cpu stack under 16 clients, 1,024-token requests finished at
                # ~0.7 per second while most readings showed 0 running, 0 waiting (2026-12-03). The engine is
                # alive: a probe now would wait behind that work.
                return Verdict("busy", f"{work} at this reading, but the engine's work counters moved since the "
                                       "last one (requests come and go between readings)")
            return Verdict("idle", f"idle ({work})")
        if still >= self.bound_s:
            return Verdict("stalled", f"{work}, no progress counter moved for {still:.0f} s "
                                      f"(bound {self.bound_s:g} s)")
        return Verdict("busy", f"{work}, last progress {still:.0f} s ago")

    def rebase(self, reading: Reading | None, now: float) -> None:
        """Take `reading`, taken at `now`, as the last one without judging it: after the supervisor's own probe,
        whose one token would otherwise count as work at the next check. None (no reading) changes nothing."""
        if reading is not None:
            self._take(reading, now)

    def _take(self, reading: Reading, now: float) -> None:
        """`reading`, taken at `now`, becomes the last one; the movement time is `now` when it differs from the one
        before (or there was none)."""
        if self.last is None or self.moved_at is None or reading.fingerprint != self.last.fingerprint:
            self.moved_at = now
        self.last = reading

    def moved_since(self, reading: Reading | None) -> bool:
        """True when `reading` differs from the last one (judged, or taken by `rebase`): the engine did some work in
        between (a probe that timed out meanwhile waited behind someone else's request, it did not hit a frozen
        engine)."""
        return reading is not None and self.last is not None and reading.fingerprint != self.last.fingerprint
