"""Statistics gathered while a long replay runs, in memory that does not grow with the number of requests.

Counts are exact; percentiles come from a log-spaced histogram (bins 1 % wide, so a percentile is within 1 % of
the exact one); the figure over trace time uses fixed-width time bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.results.records import RequestRecord, booked_add, booked_fraction

_BIN_RATIO = 1.01
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
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: LogHistogram = field(default_factory=LogHistogram)

    def merge(self, other: TimeBin) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.ttft_ms.merge(other.ttft_ms)


@dataclass
class StreamingStats:
    """What a replay reports, accumulated request by request (by send time into `bin_s`-wide bins)."""

    num_workers: int
    bin_s: float = 60.0
    requests: int = 0
    hit_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    available_tokens: int = 0
    captured_tokens: int = 0
    view_checked: int = 0
    view_false_hits: int = 0
    preemptions: int = 0
    first_sent_s: float = math.inf
    last_finished_s: float = 0.0
    ttft_ms: LogHistogram = field(default_factory=LogHistogram)
    e2e_ms: LogHistogram = field(default_factory=LogHistogram)
    requests_per_worker: list[int] = field(default_factory=list)
    prompt_tokens_per_worker: list[int] = field(default_factory=list)
    bins: dict[int, TimeBin] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.requests_per_worker = [0] * self.num_workers
        self.prompt_tokens_per_worker = [0] * self.num_workers

    def add(self, r: RequestRecord) -> None:
        self.requests += 1
        self.hit_requests += r.cached_tokens > 0
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.available_tokens = booked_add(self.available_tokens, r.available_tokens)
        self.captured_tokens = booked_add(self.captured_tokens, r.captured_tokens)
        if r.believed_tokens >= 0:
            self.view_checked += 1
            self.view_false_hits += r.believed_tokens > r.held_tokens
        self.preemptions += r.num_preemptions
        self.first_sent_s = min(self.first_sent_s, r.sent_s)
        self.last_finished_s = max(self.last_finished_s, r.finished_s)
        ttft_bin = LogHistogram.bin_of(r.ttft_s * 1000)
        self.ttft_ms.add_to_bin(ttft_bin)
        self.e2e_ms.add(r.e2e_s * 1000)
        self.requests_per_worker[r.worker] += 1
        self.prompt_tokens_per_worker[r.worker] += r.prompt_tokens
        key = int(r.sent_s // self.bin_s)
        b = self.bins.get(key)
        if b is None:
            b = self.bins[key] = TimeBin()
        b.requests += 1
        b.prompt_tokens += r.prompt_tokens
        b.cached_tokens += r.cached_tokens
        b.ttft_ms.add_to_bin(ttft_bin)

    def merge(self, other: StreamingStats) -> None:
        """Fold in the statistics of other requests of the same replay (another process's workers)."""
        if (other.num_workers, other.bin_s) != (self.num_workers, self.bin_s):
            raise ValueError("merging statistics of different shapes (workers or time bins)")
        self.requests += other.requests
        self.hit_requests += other.hit_requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.available_tokens = booked_add(self.available_tokens, other.available_tokens)
        self.captured_tokens = booked_add(self.captured_tokens, other.captured_tokens)
        self.view_checked += other.view_checked
        self.view_false_hits += other.view_false_hits
        self.preemptions += other.preemptions
        self.first_sent_s = min(self.first_sent_s, other.first_sent_s)
        self.last_finished_s = max(self.last_finished_s, other.last_finished_s)
        self.ttft_ms.merge(other.ttft_ms)
        self.e2e_ms.merge(other.e2e_ms)
        for w in range(self.num_workers):
            self.requests_per_worker[w] += other.requests_per_worker[w]
            self.prompt_tokens_per_worker[w] += other.prompt_tokens_per_worker[w]
        for key, theirs in other.bins.items():
            self.bins.setdefault(key, TimeBin()).merge(theirs)

    @property
    def prefix_reuse(self) -> float:
        """Cached prompt tokens / prompt tokens (Dynamo's `prefix_cache_reused_ratio`)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else float("nan")

    @property
    def reuse_available(self) -> float:
        """What one infinite cache shared by all workers would hit / prompt tokens (`sim.cluster.reuse`)."""
        return booked_fraction(self.available_tokens, self.prompt_tokens)

    @property
    def reuse_captured(self) -> float:
        """What an infinite cache per worker would hit under the router's choices / prompt tokens."""
        return booked_fraction(self.captured_tokens, self.prompt_tokens)

    @property
    def view_false_hit_rate(self) -> float:
        return self.view_false_hits / self.view_checked if self.view_checked else float("nan")

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.requests if self.requests else float("nan")

    @property
    def throughput_rps(self) -> float:
        span = self.last_finished_s - self.first_sent_s
        return self.requests / span if span > 0 else float("nan")
