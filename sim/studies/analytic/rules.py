"""Rules of thumb for the per-worker prefix-cache hit rate: capacity in prompts, min(1, C/N), first-visit misses."""

from __future__ import annotations

from sim.scenario import capacity_requests

__all__ = ["capacity_requests", "first_visit_misses", "formula_hit_rate"]


def formula_hit_rate(capacity_requests: float, prefixes: int) -> float:
    """The measured experiment's rule of thumb: min(1, C/N).

    Assumes each worker keeps C of the N equally popular prefixes, that those are a uniformly random subset, and
    that a request hits iff its prefix is among them; ignores first visits, the unique tails and outputs that also
    churn the cache, partial hits and the order in which vLLM frees blocks.
    """
    if prefixes < 1:
        raise ValueError(f"prefixes must be >= 1, got {prefixes}")
    return min(1.0, capacity_requests / prefixes)


def first_visit_misses(workers: int, requests_per_prefix: float, warmups_per_prefix: int = 1) -> float:
    """Expected measured misses per prefix when prefixes are few and nothing is ever evicted.

    Assumes random routing (each request, warm-ups included, goes to a uniformly random worker) and a cache large
    enough that a prefix, once on a worker, stays there: a measured request misses iff it is the first visit of its
    prefix to its worker. By linearity, misses = E[workers covered after n + w requests] - E[covered by the w
    warm-ups] = W(1 - (1 - 1/W)^(n + w)) - W(1 - (1 - 1/W)^w); one warm-up covers exactly one worker.
    The reference, 6 workers and 2 prefixes of 100 requests each: 2 x 5.00 = 10 misses in 200 (3 workers: 4).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if requests_per_prefix < 0 or warmups_per_prefix < 0:
        raise ValueError(
            f"requests_per_prefix and warmups_per_prefix must be >= 0, got {requests_per_prefix}, {warmups_per_prefix}"
        )
    stay_away = 1.0 - 1.0 / workers
    covered_at_end = workers * (1.0 - stay_away ** (requests_per_prefix + warmups_per_prefix))
    covered_by_warmups = workers * (1.0 - stay_away**warmups_per_prefix)
    return covered_at_end - covered_by_warmups
