"""From a run's records and counters to the figures users read. Rates are derived here, from counts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np

from sim.engines.interface import PrefixCacheStats
from sim.results.records import RunResult, booked_add, booked_fraction


def _percentile_ms(values_s: list[float], q: float) -> float:
    if not values_s:
        return float("nan")
    return float(np.percentile(np.asarray(values_s), q) * 1000.0)


@dataclass(frozen=True, slots=True)
class Summary:
    """Counts over the measured requests of one run, and the rates derived from them.

    * `request_hit_rate`: requests with any cached token at first admission / requests (what the reference counts);
    * `full_hit_rate`: requests whose whole shareable prefix was cached / requests;
    * `token_hit_rate`: cached prompt tokens / prompt tokens over the measured requests, each counted at its first
      admission: vLLM's `prefix_cache_hits / prefix_cache_queries` as vLLM >= 0.27 counts them (older releases also
      count failed lookups; the raw counters of the measured phase are in `prefix_cache`).
    * `reuse_available` / `reuse_captured` / `reuse_delivered`: prompt tokens that one infinite shared cache, an
      infinite cache per worker under the router's choices, and the real finite caches hit, over prompt tokens
      (`sim.cluster.reuse.ReuseLedger`; delivered is `token_hit_rate`). available - captured is what routing
      loses, captured - delivered what memory loses.
    * `view_false_hit_rate`: of the requests a router with non-exact state routed (`view_checked`), the fraction
      whose chosen worker held fewer tokens of the prompt than the router believed.
    """

    requests: int
    hit_requests: int
    full_hit_requests: int
    query_tokens: int
    hit_tokens: int
    prefix_cache: PrefixCacheStats
    evicted_blocks: int
    evicted_tokens: int
    preemptions: int
    duration_s: float
    ttft_ms: dict[str, float]
    requests_per_worker: tuple[int, ...]
    available_tokens: int = 0
    captured_tokens: int = 0
    view_checked: int = 0
    """Measured requests routed on non-exact state (their belief was compared with the cache)."""
    view_false_hits: int = 0
    """Of those, requests whose chosen worker held less than the router believed."""
    view_false_tokens: int = 0
    """Believed-but-absent prompt tokens, summed over those requests."""

    @property
    def reuse_available(self) -> float:
        return booked_fraction(self.available_tokens, self.query_tokens)

    @property
    def reuse_captured(self) -> float:
        return booked_fraction(self.captured_tokens, self.query_tokens)

    @property
    def view_false_hit_rate(self) -> float:
        return self.view_false_hits / self.view_checked if self.view_checked else float("nan")

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.requests if self.requests else float("nan")

    @property
    def full_hit_rate(self) -> float:
        return self.full_hit_requests / self.requests if self.requests else float("nan")

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else float("nan")

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else float("nan")

    def row(self) -> dict[str, float | int]:
        """The summary as flat columns (`summary.csv`)."""
        return {
            "requests": self.requests,
            "request_hit_rate": self.request_hit_rate,
            "full_hit_rate": self.full_hit_rate,
            "token_hit_rate": self.token_hit_rate,
            "ttft_p50_ms": self.ttft_ms["p50"],
            "ttft_p90_ms": self.ttft_ms["p90"],
            "ttft_p99_ms": self.ttft_ms["p99"],
            **{f"ttft_{split}_p{q}_ms": self.ttft_ms[f"{split}_p{q}"] for split in ("hit", "miss") for q in (50, 90, 99)},
            "throughput_rps": self.throughput_rps,
            "hit_requests": self.hit_requests,
            "full_hit_requests": self.full_hit_requests,
            "prefix_cache_queries": self.prefix_cache.queries,
            "prefix_cache_hits": self.prefix_cache.hits,
            "evicted_blocks": self.evicted_blocks,
            "evicted_tokens": self.evicted_tokens,
            "preemptions": self.preemptions,
            "max_worker_share": max(self.requests_per_worker) / self.requests if self.requests else float("nan"),
            "reuse_available": self.reuse_available,
            "reuse_captured": self.reuse_captured,
            "reuse_delivered": self.token_hit_rate,
            "view_checked": self.view_checked,
            "view_false_hit_rate": self.view_false_hit_rate,
            "view_false_tokens": self.view_false_tokens,
        }


def summarize(result: RunResult) -> Summary:
    measured = result.measured
    stats = PrefixCacheStats()
    for w in result.workers:
        stats = stats.plus(w.prefix_cache)
    ttft_all = [r.ttft_s for r in measured]
    ttft_hit = [r.ttft_s for r in measured if r.is_hit]
    ttft_miss = [r.ttft_s for r in measured if not r.is_hit]
    per_worker = [0] * result.num_workers
    for r in measured:
        per_worker[r.worker] += 1
    return Summary(
        requests=len(measured),
        hit_requests=sum(1 for r in measured if r.is_hit),
        full_hit_requests=sum(1 for r in measured if r.is_full_hit),
        query_tokens=sum(r.prompt_tokens for r in measured),
        hit_tokens=sum(r.cached_tokens for r in measured),
        prefix_cache=stats,
        evicted_blocks=sum(w.evicted_blocks for w in result.workers),
        evicted_tokens=sum(w.evicted_tokens for w in result.workers),
        preemptions=sum(w.preemptions for w in result.workers),
        duration_s=result.measured_end_s - result.measured_start_s,
        ttft_ms={
            f"{prefix}p{q}": _percentile_ms(values, q)
            for prefix, values in (("", ttft_all), ("hit_", ttft_hit), ("miss_", ttft_miss))
            for q in (50, 90, 99)
        },
        requests_per_worker=tuple(per_worker),
        available_tokens=reduce(booked_add, (r.available_tokens for r in measured), 0),
        captured_tokens=reduce(booked_add, (r.captured_tokens for r in measured), 0),
        view_checked=sum(1 for r in measured if r.believed_tokens >= 0),
        view_false_hits=sum(1 for r in measured if r.believed_tokens > r.held_tokens),
        view_false_tokens=sum(max(0, r.believed_tokens - r.held_tokens) for r in measured),
    )
