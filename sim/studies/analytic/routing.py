"""Cluster hit rates under routing: random routing (the per-worker model, unchanged) and prefix routing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.studies.analytic.block_lru import BlockLruHitRates, Method, block_lru_hit_rates
from sim.studies.analytic.che import _check_popularity
from sim.studies.analytic.rules import formula_hit_rate


def random_routing_hit_rates(
    *,
    workers: int,
    popularity: Sequence[float] | np.ndarray,
    prefix_blocks: int,
    own_blocks: int,
    usable_blocks: float,
    in_flight_blocks: float = 0.0,
    block_size: int,
    prompt_tokens: int,
    method: Method = "che",
) -> BlockLruHitRates:
    """Steady-state hit rates of a cluster behind a random router: the per-worker model, unchanged.

    Random routing thins an IRM stream into W independent IRM streams with the *same* popularity, so each worker
    is `block_lru_hit_rates` of that popularity and the cluster's hit rate does not depend on W (the reference's
    observation: 3 and 6 workers measure alike). Assumes identical workers; `in_flight_blocks` is per worker (it is
    the only place W enters, through `in_flight_blocks_estimate`). The cold start does depend on W: see
    `finite_run_hit_rates`.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return block_lru_hit_rates(
        popularity=popularity, prefix_blocks=prefix_blocks, own_blocks=own_blocks, usable_blocks=usable_blocks,
        in_flight_blocks=in_flight_blocks, block_size=block_size, prompt_tokens=prompt_tokens, method=method,
    )


def prefix_routing_bound(workers: int, capacity_requests: float, prefixes: int) -> float:
    """min(1, W C / N): the formula's hit rate if each prefix lived on exactly one worker (perfect prefix routing).

    Assumes prefixes spread evenly, equally popular, and the formula's other assumptions (`formula_hit_rate`).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return formula_hit_rate(workers * capacity_requests, prefixes)


@dataclass(frozen=True, slots=True)
class RoutedHitRates:
    """Cluster hit rates under prefix routing: traffic-weighted over workers, with each worker's own figures
    (None for a worker that serves no prefix)."""

    request_hit_rate: float
    full_hit_rate: float
    token_hit_rate: float
    traffic_share_by_worker: tuple[float, ...]
    per_worker: tuple[BlockLruHitRates | None, ...]


def prefix_routing_hit_rates(
    *,
    workers: int,
    popularity: Sequence[float] | np.ndarray,
    assignment: Literal["round-robin"] | Sequence[int] = "round-robin",
    prefix_blocks: int,
    own_blocks: int,
    usable_blocks: float,
    in_flight_blocks: float = 0.0,
    block_size: int,
    prompt_tokens: int,
    method: Method = "che",
) -> RoutedHitRates:
    """Steady-state hit rates when every request of a prefix goes to the prefix's one worker.

    `assignment`: "round-robin" deals prefixes to workers by popularity rank (rank r -> worker r mod W: equal
    counts, nearly equal traffic); or a worker index per prefix (e.g. what a consistent-hash ring chose). Each worker
    then sees an IRM stream over its own prefixes with renormalised popularity; the cluster figure is the average
    weighted by traffic share. Assumes no load balancing overrides the assignment (strict hashing) and identical
    workers; ignores the one first-visit miss per prefix.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    p = _check_popularity(popularity)
    if isinstance(assignment, str):
        if assignment != "round-robin":
            raise ValueError(f"assignment must be 'round-robin' or a worker index per prefix, got {assignment!r}")
        ranks = np.argsort(-p, kind="stable")
        worker_of = np.empty(p.size, dtype=int)
        worker_of[ranks] = np.arange(p.size) % workers
    else:
        worker_of = np.asarray(assignment, dtype=int)
        if worker_of.shape != p.shape or np.any(worker_of < 0) or np.any(worker_of >= workers):
            raise ValueError(f"assignment needs one worker index in [0, {workers}) per prefix ({p.size})")
    shares, results = [], []
    request = full = token = 0.0
    for w in range(workers):
        mine = worker_of == w
        share = float(p[mine].sum())
        shares.append(share)
        if share <= 0:
            results.append(None)
            continue
        r = block_lru_hit_rates(
            popularity=p[mine] / share, prefix_blocks=prefix_blocks, own_blocks=own_blocks,
            usable_blocks=usable_blocks, in_flight_blocks=in_flight_blocks, block_size=block_size,
            prompt_tokens=prompt_tokens, method=method,
        )
        results.append(r)
        request += share * r.request_hit_rate
        full += share * r.full_hit_rate
        token += share * r.token_hit_rate
    return RoutedHitRates(request, full, token, tuple(shares), tuple(results))
