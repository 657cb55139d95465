"""Statistics gathered while a long replay runs, in memory that does not grow with the number of requests.

Counts are exact; percentiles come from a log-spaced histogram (bins 1 % wide, so a percentile is within 1 % of
the exact one); the figure over trace time uses fixed-width time bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.results.records import RequestRecord, Slo, booked_add
from sim.results.stats import NAN, ratio
from sim.results.summary import HitCounts, RequestRates, SessionCounts, SessionFigures, turn_bucket

_BIN_RATIO = 1.01
_log = math.log
_LOG_RATIO = math.log(_BIN_RATIO)
_MIN_MS = 0.01


class LogHistogram:
    """Counts of positive values in bins [0.01 ms x 1.01^k, 0.01 ms x 1.01^(k+1)); values below 0.01 ms in bin 0."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0

    def add(self, value_ms: float) -> None:
        self.add_to_bin(self.bin_of(value_ms))

    @staticmethod
    def bin_of(value_ms: float) -> int:
        return int(math.log(value_ms / _MIN_MS) / _LOG_RATIO) if value_ms > _MIN_MS else 0

    def add_to_bin(self, k: int) -> None:
        self.counts[k] = self.counts.get(k, 0) + 1
        self.total += 1

    def merge(self, other: LogHistogram) -> None:
        """Add `other`'s counts to these."""
        for k, n in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        self.total += other.total

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100), at the geometric middle of its bin; nan when empty."""
        if not self.total:
            return float("nan")
        rank = q / 100 * (self.total - 1)
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen > rank:
                return _MIN_MS * _BIN_RATIO ** (k + 0.5)
        return _MIN_MS * _BIN_RATIO ** (max(self.counts) + 0.5)


@dataclass
class TimeBin:
    """The requests sent in one bin of trace time."""

    requests: int = 0
    """Requests sent in the bin."""
    prompt_tokens: int = 0
    """Their prompt tokens."""
    cached_tokens: int = 0
    """Of those, tokens cached at each request's first admission."""
    ttft_ms: LogHistogram = field(default_factory=LogHistogram)
    """Their TTFTs."""

    @property
    def prefix_reuse(self) -> float:
        """Cached prompt tokens / prompt tokens of the bin's requests."""
        return ratio(self.cached_tokens, self.prompt_tokens)

    def merge(self, other: TimeBin) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.ttft_ms.merge(other.ttft_ms)


class SessionSpans:
    """The sessions of a replay, as their requests finish: per open session, when its first request was sent and its
    last so far finished; completion times (last finish - first send) in a histogram once a session has ended.

    A replay learns that a session has ended from its driver (`end`: it returned nothing more and nothing of it is in
    flight); records alone cannot say so. Memory stays bounded either way: with more than `max_open` sessions open,
    the one idle longest (the map is kept in order of last activity) is ended there (`cut` counts them), so a
    driver that never calls `end` still replays in bounded memory; a cut session that sends again counts as a new
    one, with a shorter time.

    Merging the spans of two parts of a split replay is exact while neither part has ended a session (their open
    spans combine); a session ended in one part may be open or ended in the other, so otherwise the number of
    sessions and their times are unknown (`known` False: -1 and NaN)."""

    __slots__ = ("open", "times_ms", "ended", "cut", "max_open", "known")

    def __init__(self, max_open: int = 100_000) -> None:
        self.open: dict[int, tuple[float, float]] = {}
        self.times_ms = LogHistogram()
        self.ended = 0
        self.cut = 0
        self.max_open = max_open
        self.known = True

    def add(self, r: RequestRecord) -> None:
        span = self.open.pop(r.session_id, None)  # re-inserted below: last activity goes to the end
        self.open[r.session_id] = ((r.sent_s, r.finished_s) if span is None
                                   else (min(span[0], r.sent_s), max(span[1], r.finished_s)))
        if len(self.open) > self.max_open:
            self._end(next(iter(self.open)))
            self.cut += 1

    def end(self, session_id: int) -> None:
        """The session has ended: its time joins the histogram and its span is dropped (nothing if not open)."""
        if session_id in self.open:
            self._end(session_id)

    def _end(self, session_id: int) -> None:
        first_s, last_s = self.open.pop(session_id)
        self.times_ms.add((last_s - first_s) * 1000)
        self.ended += 1

    def merge(self, other: SessionSpans) -> None:
        if (self.ended and (other.ended or other.open)) or (other.ended and self.open):
            self.known = False
        self.known = self.known and other.known
        for sid, (first_s, last_s) in other.open.items():
            span = self.open.get(sid)
            self.open[sid] = (first_s, last_s) if span is None else (min(span[0], first_s), max(span[1], last_s))
        self.times_ms.merge(other.times_ms)
        self.ended += other.ended
        self.cut += other.cut

    @property
    def num_sessions(self) -> int:
        """Sessions seen, ended or open; -1 when unknown."""
        return self.ended + len(self.open) if self.known else -1

    def time_s(self, q: float) -> float:
        """The q-th percentile of the completion times of every session seen, the open ones up to now (NaN when
        unknown)."""
        if not self.known:
            return NAN
        times = LogHistogram()
        times.merge(self.times_ms)
        for first_s, last_s in self.open.values():
            times.add((last_s - first_s) * 1000)
        return times.percentile(q) / 1000


@dataclass
class StreamingStats(HitCounts, RequestRates):
    """What a replay reports, accumulated request by request (by send time into `bin_s`-wide bins).

    The hit counters are `HitCounts`' (keyword arguments). The SLO counters count against `slo` exactly as a run's
    summary does (`sim.results.records.Slo`). Requests of a session also count per turn (at most `MAX_TURN` + 1
    rows) and in their session's span (`SessionSpans`, at most `max_open_sessions` open), so memory stays bounded
    however many sessions and turns the replay has."""

    num_workers: int
    """Workers of the replay (the length of the per-worker lists)."""
    bin_s: float = 60.0
    """Width of the time bins of the figure, in seconds of send time."""
    slo: Slo = Slo()
    """The objectives the SLO counters count against."""
    available_tokens: int = 0
    """Prompt tokens one infinite cache shared by the cluster would hit (-1: not booked)."""
    captured_tokens: int = 0
    """Prompt tokens an infinite cache on each chosen worker would hit (-1: not booked)."""
    view_checked: int = 0
    """Requests routed on non-exact state (their belief was compared with the cache)."""
    view_false_hits: int = 0
    """Of those, requests whose chosen worker held less than the router believed."""
    preemptions: int = 0
    """Preemptions (retractions) of the requests, summed."""
    output_tokens: int = 0
    """Output tokens of the requests."""
    slo_met_requests: int = 0
    """Requests meeting every objective of `slo` (all of them when none is set)."""
    ttft_slo_met: int = 0
    """Requests within `slo.ttft_ms` (all when it is unset)."""
    tpot_slo_met: int = 0
    """Requests within `slo.tpot_ms`, one-output-token requests included (all when it is unset)."""
    e2e_slo_met: int = 0
    """Requests within `slo.e2e_ms` (all when it is unset)."""
    first_sent_s: float = math.inf
    """When the first request was sent."""
    last_finished_s: float = 0.0
    """When the last request finished."""
    ttft_ms: LogHistogram = field(default_factory=LogHistogram)
    e2e_ms: LogHistogram = field(default_factory=LogHistogram)
    tpot_ms: LogHistogram = field(default_factory=LogHistogram)
    """Requests with more than one output token only."""
    requests_per_worker: list[int] = field(default_factory=list)
    prompt_tokens_per_worker: list[int] = field(default_factory=list)
    bins: dict[int, TimeBin] = field(default_factory=dict)
    """Per time bin (send time // `bin_s`), its requests' counts and TTFTs."""
    turns: dict[int, SessionCounts] = field(default_factory=dict)
    """Per turn row (`turn_bucket`: at most `MAX_TURN` + 1 rows), the counters of its session requests."""
    turn_ttft_ms: dict[int, LogHistogram] = field(default_factory=dict)
    """Per turn row, its session requests' TTFTs."""
    max_open_sessions: int = 100_000
    """Sessions whose span is kept open at most (`SessionSpans`)."""
    sessions: SessionSpans = field(init=False)
    """The sessions' spans and completion times."""

    def __post_init__(self) -> None:
        self.requests_per_worker = [0] * self.num_workers
        self.prompt_tokens_per_worker = [0] * self.num_workers
        self.sessions = SessionSpans(self.max_open_sessions)

    def add(self, r: RequestRecord) -> None:
        # NOTE: one call per finished request of a replay (a million of them in the synthetic replay), so the
        # counters of `HitCounts.add`, the SLO's, the histograms' and the record's properties are spelled out here,
        # with the same arithmetic in the same order (the summaries stay byte-identical); `test_streaming_stats`
        # checks it against the counters of `HitCounts`, `Slo` and `LogHistogram` one by one.
        cached = r.cached_tokens
        shareable = r.shareable_tokens
        cpu_cached = r.cpu_cached_tokens
        shared_cached = r.shared_cached_tokens
        prompt = r.prompt_tokens
        self.requests += 1
        self.shared_hit_requests += shared_cached > 0
        self.shared_cached_tokens += shared_cached
        self.hit_requests += cached > 0
        self.full_hit_requests += shareable > 0 and cached >= shareable
        self.cpu_hit_requests += cpu_cached > 0
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.cpu_cached_tokens += cpu_cached
        available, captured = r.available_tokens, r.captured_tokens
        booked = self.available_tokens
        self.available_tokens = -1 if booked < 0 or available < 0 else booked + available
        booked = self.captured_tokens
        self.captured_tokens = -1 if booked < 0 or captured < 0 else booked + captured
        if r.believed_tokens >= 0:
            self.view_checked += 1
            self.view_false_hits += r.believed_tokens > r.held_tokens
        self.preemptions += r.num_preemptions
        output = r.output_tokens
        self.output_tokens += output
        sent_s, first_s, finished_s = r.sent_s, r.first_token_s, r.finished_s
        slo = self.slo
        if slo.ttft_ms is None and slo.tpot_ms is None and slo.e2e_ms is None:  # not slo.is_set: all met
            self.slo_met_requests += 1
            self.ttft_slo_met += 1
            self.tpot_slo_met += 1
            self.e2e_slo_met += 1
        else:
            self.slo_met_requests += slo.met_by(r)
            self.ttft_slo_met += slo.ttft_met(r)
            self.tpot_slo_met += slo.tpot_met(r)
            self.e2e_slo_met += slo.e2e_met(r)
        if sent_s < self.first_sent_s:  # min(first_sent_s, sent_s), NaN and ties alike
            self.first_sent_s = sent_s
        if finished_s > self.last_finished_s:
            self.last_finished_s = finished_s
        value_ms = (first_s - sent_s) * 1000  # r.ttft_s
        ttft_bin = int(_log(value_ms / _MIN_MS) / _LOG_RATIO) if value_ms > _MIN_MS else 0  # LogHistogram.bin_of
        h = self.ttft_ms
        counts = h.counts
        counts[ttft_bin] = counts.get(ttft_bin, 0) + 1
        h.total += 1
        value_ms = (finished_s - sent_s) * 1000  # r.e2e_s
        k = int(_log(value_ms / _MIN_MS) / _LOG_RATIO) if value_ms > _MIN_MS else 0
        h = self.e2e_ms
        counts = h.counts
        counts[k] = counts.get(k, 0) + 1
        h.total += 1
        if output > 1:  # r.tpot_s is not None
            value_ms = (finished_s - first_s) / (output - 1) * 1000
            k = int(_log(value_ms / _MIN_MS) / _LOG_RATIO) if value_ms > _MIN_MS else 0
            h = self.tpot_ms
            counts = h.counts
            counts[k] = counts.get(k, 0) + 1
            h.total += 1
        worker = r.worker
        self.requests_per_worker[worker] += 1
        self.prompt_tokens_per_worker[worker] += prompt
        key = int(sent_s // self.bin_s)
        b = self.bins.get(key)
        if b is None:
            b = self.bins[key] = TimeBin()
        b.requests += 1
        b.prompt_tokens += prompt
        b.cached_tokens += cached
        h = b.ttft_ms
        counts = h.counts
        counts[ttft_bin] = counts.get(ttft_bin, 0) + 1
        h.total += 1
        if r.session_id is not None:
            turn = turn_bucket(r.turn)
            if turn not in self.turns:
                self.turns[turn], self.turn_ttft_ms[turn] = SessionCounts(), LogHistogram()
            self.turns[turn].add(r)
            self.turn_ttft_ms[turn].add_to_bin(ttft_bin)
            self.sessions.add(r)

    def end_session(self, session_id: int) -> None:
        """For the driver of a replay of sessions: `session_id` has ended (nothing more of it will be sent), so its
        span can be dropped (`SessionSpans.end`)."""
        self.sessions.end(session_id)

    def session_figures(self) -> SessionFigures | None:
        """What the replay reports of its sessions, as a run's summary does (None: no request of a session)."""
        if not self.turns:
            return None
        turns = dict(sorted(self.turns.items()))
        return SessionFigures(
            counts=SessionCounts.total(turns.values()), turns=turns,
            turn_ttft_ms={t: (self.turn_ttft_ms[t].percentile(50), self.turn_ttft_ms[t].percentile(99)) for t in turns},
            num_sessions=self.sessions.num_sessions,
            session_time_s=(self.sessions.time_s(50), self.sessions.time_s(99)),
        )

    def merge(self, other: StreamingStats) -> None:
        """Fold in the statistics of other requests of the same replay (another process's workers)."""
        if (other.num_workers, other.bin_s, other.slo) != (self.num_workers, self.bin_s, self.slo):
            raise ValueError("merging statistics of different shapes (workers, time bins or SLO)")
        HitCounts.merge(self, other)
        self.available_tokens = booked_add(self.available_tokens, other.available_tokens)
        self.captured_tokens = booked_add(self.captured_tokens, other.captured_tokens)
        self.view_checked += other.view_checked
        self.view_false_hits += other.view_false_hits
        self.preemptions += other.preemptions
        self.output_tokens += other.output_tokens
        self.slo_met_requests += other.slo_met_requests
        self.ttft_slo_met += other.ttft_slo_met
        self.tpot_slo_met += other.tpot_slo_met
        self.e2e_slo_met += other.e2e_slo_met
        self.first_sent_s = min(self.first_sent_s, other.first_sent_s)
        self.last_finished_s = max(self.last_finished_s, other.last_finished_s)
        self.ttft_ms.merge(other.ttft_ms)
        self.e2e_ms.merge(other.e2e_ms)
        self.tpot_ms.merge(other.tpot_ms)
        for w in range(self.num_workers):
            self.requests_per_worker[w] += other.requests_per_worker[w]
            self.prompt_tokens_per_worker[w] += other.prompt_tokens_per_worker[w]
        for key, theirs in other.bins.items():
            self.bins.setdefault(key, TimeBin()).merge(theirs)
        for turn, theirs in other.turns.items():
            self.turns.setdefault(turn, SessionCounts()).merge(theirs)
            self.turn_ttft_ms.setdefault(turn, LogHistogram()).merge(other.turn_ttft_ms[turn])
        self.sessions.merge(other.sessions)

    @property
    def span_s(self) -> float:
        """From the first request sent to the last finished: the replay's duration for rates."""
        return self.last_finished_s - self.first_sent_s

    @property
    def rate_span_s(self) -> float:
        return self.span_s
