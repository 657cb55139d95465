"""The classic Che approximation for an LRU cache of equal-size objects, and Zipf popularity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def zipf_popularity(num_prefixes: int, exponent: float) -> np.ndarray:
    """Request probabilities p_r proportional to r^-exponent for ranks r = 1..num_prefixes (rank 1 most popular).

    Normalised to sum to 1; exponent 0 is uniform.
    """
    if num_prefixes < 1:
        raise ValueError(f"num_prefixes must be >= 1, got {num_prefixes}")
    if exponent < 0:
        raise ValueError(f"exponent must be >= 0, got {exponent}")
    weights = np.arange(1, num_prefixes + 1, dtype=float) ** -float(exponent)
    return weights / weights.sum()


def _check_popularity(popularity: Sequence[float] | np.ndarray) -> np.ndarray:
    p = np.asarray(popularity, dtype=float)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"popularity must be a non-empty 1-D sequence, got shape {p.shape}")
    if np.any(p < 0) or not np.all(np.isfinite(p)):
        raise ValueError("popularity must be finite and >= 0")
    total = float(p.sum())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"popularity must sum to 1, sums to {total!r}")
    return p / total


def che_characteristic_time(popularity: Sequence[float] | np.ndarray, capacity_objects: float) -> float:
    """Che's characteristic time T_C (in requests): the root of sum_i (1 - exp(-p_i T)) = C.

    Assumes the independent reference model (each request picks object i with probability p_i, independently),
    equal-size objects and an LRU cache of `capacity_objects` objects. Returns inf when every requested object fits.
    """
    p = _check_popularity(popularity)
    p = p[p > 0]
    if capacity_objects <= 0:
        return 0.0
    if capacity_objects >= p.size:
        return math.inf

    def excess(t: float) -> float:
        return float(np.sum(-np.expm1(-p * t))) - capacity_objects

    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
    from scipy.optimize import brentq  # NOTE: here: importing the CLI must not load scipy

    return brentq(excess, 0.0, hi, xtol=1e-12 * hi, rtol=1e-14, maxiter=500)


def che_hit_rate(popularity: Sequence[float] | np.ndarray, capacity_objects: float) -> float:
    """Che's LRU hit ratio H = sum_i p_i (1 - exp(-p_i T_C)) (docs/commands/plan.md, "The analytic models").

    Assumptions as `che_characteristic_time`; accurate to a few 1e-3 once the cache holds more than a few dozen
    objects, poor when it holds only a handful (then use `block_lru_hit_rates(method="exact")`).
    """
    p = _check_popularity(popularity)
    t = che_characteristic_time(p, capacity_objects)
    if math.isinf(t):
        return 1.0
    return float(np.sum(p * -np.expm1(-p * t)))
