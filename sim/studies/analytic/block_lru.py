"""One vLLM worker as an LRU over blocks: steady state (Che-style or exact under IRM) and finite runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.studies.analytic.che import _check_popularity
from sim.workloads.request import shareable_tokens

Method = Literal["che", "exact"]


def shared_prefix_blocks(prefix_tokens: int, prompt_tokens: int, output_tokens: int, block_size: int) -> tuple[int, int]:
    """(K, U): hashed blocks a request shares with its prefix, and hashed blocks that are its own.

    K = full blocks inside the prefix, capped at (prompt - 1) // block_size because a full hit always recomputes
    the last prompt token. U = hashed blocks when the request finishes minus K: the KV of prompt + output - 1
    tokens (the last sampled token has no KV) fills floor((P + m - 1) / B) blocks. U blocks are never reused.
    The partial last block is unhashed; vLLM (>= 0.24) frees it to the head of the free queue, where it is reused
    first and displaces nothing, so it is not counted. Reference: K = 2032 // 16 = 127, U = 2434 // 16 - 127 = 25.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not 0 <= prefix_tokens <= prompt_tokens or prompt_tokens < 1 or output_tokens < 1:
        raise ValueError(
            f"need 0 <= prefix_tokens <= prompt_tokens, prompt_tokens >= 1, output_tokens >= 1; got "
            f"prefix_tokens={prefix_tokens}, prompt_tokens={prompt_tokens}, output_tokens={output_tokens}"
        )
    num_prefix_blocks = shareable_tokens(prefix_tokens=prefix_tokens, prompt_tokens=prompt_tokens,
                                         block_size=block_size) // block_size
    num_hashed_blocks = (prompt_tokens + output_tokens - 1) // block_size
    return num_prefix_blocks, num_hashed_blocks - num_prefix_blocks


def in_flight_blocks_estimate(
    *, concurrency: float, workers: int, prompt_tokens: int, output_tokens: int, prefix_blocks: int, block_size: int
) -> float:
    """Blocks that requests in flight hold on one worker beyond their shared prefix: (concurrency / W) x own blocks.

    Each in-flight request holds at most cdiv(P + m - 1, B) blocks; its K prefix blocks are not subtracted because
    the block model already counts them (as the distinct prefixes seen since). NOTE: an upper bound on what to pass
    as `in_flight_blocks`. The block model counts time in *arrivals* at the worker, so the own blocks of requests
    that arrived since a prefix's last use are already in U·T; only requests that arrived before it and finish
    after it push blocks that T misses. The simulator confirms that on the reference the request hit rate is the
    same at concurrency 1 and 8, so the default `in_flight_blocks=0` is the better estimate there.
    """
    if workers < 1 or concurrency < 0:
        raise ValueError(f"need workers >= 1 and concurrency >= 0, got workers={workers}, concurrency={concurrency}")
    held_blocks = -(-(prompt_tokens + output_tokens - 1) // block_size)
    return concurrency / workers * max(held_blocks - prefix_blocks, 0)


@dataclass(frozen=True, slots=True)
class BlockLruHitRates:
    """Expected per-request hit figures of one worker (or of a cluster, averaged over its traffic).

    * `request_hit_rate`: a request finds its prefix's root block (any cached token);
    * `full_hit_rate`: it finds all `prefix_blocks` blocks;
    * `token_hit_rate`: expected hit tokens / prompt tokens (vLLM's prefix_cache_hits / prefix_cache_queries);
    * `num_hit_tokens_per_request`: expected hit tokens per request;
    * `characteristic_time_requests`: Che's time of the root, popularity-weighted over prefixes (nan for the exact
      model, which has none);
    * `request_hit_rate_by_prefix`: in the order of the popularity given.
    """

    request_hit_rate: float
    full_hit_rate: float
    token_hit_rate: float
    num_hit_tokens_per_request: float
    characteristic_time_requests: float
    request_hit_rate_by_prefix: tuple[float, ...]


def _check_block_inputs(
    prefix_blocks: int, own_blocks: int, usable_blocks: int, in_flight_blocks: float, block_size: int, prompt_tokens: int
) -> float:
    if prefix_blocks < 1:
        raise ValueError(f"prefix_blocks must be >= 1, got {prefix_blocks}")
    if own_blocks < 0:
        raise ValueError(f"own_blocks must be >= 0, got {own_blocks}")
    if block_size < 1 or prompt_tokens < 1:
        raise ValueError(f"block_size and prompt_tokens must be >= 1, got {block_size}, {prompt_tokens}")
    if prefix_blocks * block_size > prompt_tokens:
        raise ValueError(f"prefix_blocks={prefix_blocks} x block_size={block_size} exceeds prompt_tokens={prompt_tokens}")
    if in_flight_blocks < 0:
        raise ValueError(f"in_flight_blocks must be >= 0, got {in_flight_blocks}")
    effective_blocks = usable_blocks - in_flight_blocks
    if effective_blocks < 1:
        raise ValueError(
            f"usable_blocks={usable_blocks} - in_flight_blocks={in_flight_blocks} leaves no block for the cache"
        )
    return float(effective_blocks)


def _summarise(
    p: np.ndarray,
    survival_by_block: np.ndarray,
    block_size: int,
    prompt_tokens: int,
    characteristic_time_requests: float,
) -> BlockLruHitRates:
    """From P(block j of prefix i is cached at its next request), shape (prefixes, K), to the rates."""
    request_hit = survival_by_block[:, 0]
    num_hit_tokens = float(np.sum(p * survival_by_block.sum(axis=1))) * block_size
    return BlockLruHitRates(
        request_hit_rate=float(np.sum(p * request_hit)),
        full_hit_rate=float(np.sum(p * survival_by_block[:, -1])),
        token_hit_rate=num_hit_tokens / prompt_tokens,
        num_hit_tokens_per_request=num_hit_tokens,
        characteristic_time_requests=characteristic_time_requests,
        request_hit_rate_by_prefix=tuple(float(h) for h in request_hit),
    )


def _che_block_survival(p: np.ndarray, prefix_blocks: int, own_blocks: int, effective_blocks: float) -> tuple[np.ndarray, np.ndarray]:
    """Che-style survival of every block of every prefix with per-prefix, per-block characteristic times.

    Block j of prefix i is still cached at i's next request iff 1 + j + U t + K D_t <= M_eff, t = requests since
    (all of other prefixes), D_t = distinct other prefixes among them; the mean field replaces D_t by
    sum_{k != i} (1 - (1 - p_k)^t), so T_ij solves U T + K sum_{k != i} (1 - (1 - p_k)^T) = M_eff - 1 - j and the
    block survives with probability 1 - (1 - p_i)^T_ij. Returns (survival (N, K), root times (N,)).
    """
    K, U = prefix_blocks, own_blocks
    n = p.size
    levels = effective_blocks - 1.0 - np.arange(K)  # right-hand sides, decreasing in j
    active = p > 0
    pa = p[active]
    survival = np.zeros((n, K))
    root_times = np.zeros(n)
    if pa.size == 1:  # one prefix: nothing else ever comes between two of its requests
        survival[active] = levels >= 0
        root_times[active] = math.inf
        return survival, root_times
    log1m = np.log1p(-pa)
    # NOTE: sum_k (1 - (1 - p_k)^T) is tabulated once on a log grid of T and interpolated; the per-prefix
    # leave-one-out is exact. 8192 log-spaced points agree with a direct root-find to ~1e-7 relative.
    g_max_no_own = K * (pa.size - 1)
    if U > 0:
        t_hi = 2.0 * max(levels[0], 1.0) / U + 10.0
    else:
        t_hi = min(1e3 / float(pa.min()), 1e15)
    t_lo = min(1e-3, 1e-3 / float(pa.max()))
    t_grid = np.concatenate(([0.0], np.geomspace(t_lo, t_hi, 8192)))
    seen_all = np.zeros_like(t_grid)
    for chunk in np.array_split(np.arange(pa.size), max(1, pa.size // 2048)):
        seen_all += np.sum(-np.expm1(np.outer(t_grid, log1m[chunk])), axis=1)
    uniq, inverse = np.unique(pa, return_inverse=True)
    for g, pg in enumerate(uniq):
        seen_own = -np.expm1(t_grid * math.log1p(-pg))
        pushed = U * t_grid + K * (seen_all - seen_own)
        if U == 0:
            pushed = np.maximum.accumulate(pushed)  # guard the flat tail against rounding
        times = np.interp(levels, pushed, t_grid, left=0.0, right=math.inf)
        # a level at or above what all other prefixes can ever push (U = 0): the block is never evicted
        if U == 0:
            times = np.where(levels >= g_max_no_own, math.inf, times)
        times = np.where(levels <= 0, 0.0, times)
        with np.errstate(over="ignore", invalid="ignore"):
            surv = np.where(np.isinf(times), 1.0, -np.expm1(times * math.log1p(-pg)))
        idx = np.flatnonzero(active)[inverse == g]
        survival[idx] = surv
        root_times[idx] = times[0]
    return survival, root_times


# ---- exact IRM engine ------------------------------------------------------------------------------------------
# Embed the IRM stream in a Poisson process of rate 1 request per unit time: prefix k then arrives as an
# independent Poisson process of rate p_k. Between two requests of prefix i (an Exp(p_i) gap tau) the others
# bring n_k ~ Poisson(p_k tau) requests each, independently, and push X_k = U n_k + K 1[n_k > 0] blocks above
# prefix i's root. Block j survives iff sum_{k != i} X_k <= M_eff - 1 - j. This is exact for the IRM (the number
# of other requests in an Exp(p_i) gap is geometric, as in discrete time); only the quadrature over tau is numeric.

_GAUSS_NODES, _GAUSS_WEIGHTS = np.polynomial.legendre.leggauss(8)
_EXACT_WORK_LIMIT = 5e10


def _quadrature(upper: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Composite 8-point Gauss-Legendre nodes on [0, upper]: panels geometric from `scale` and at most upper/16 wide.

    NOTE: 6 points on 8 panels already agree with 16 on 32 to 1e-6 on the reference; this keeps a margin."""
    edges = {0.0, upper}
    edge = scale
    while edge < upper:
        edges.add(edge)
        edge *= 2.0
    edges.update(np.linspace(0.0, upper, 17)[1:-1].tolist())
    edges_sorted = np.array(sorted(edges))
    a, b = edges_sorted[:-1], edges_sorted[1:]
    half = (b - a) / 2.0
    nodes = (a[:, None] + half[:, None] * (_GAUSS_NODES[None, :] + 1.0)).ravel()
    weights = (half[:, None] * _GAUSS_WEIGHTS[None, :]).ravel()
    return nodes, weights


class _PushedBlocks:
    """Distribution of the blocks one other prefix pushes, per quadrature node: pmf of its request count m
    (Poisson, optionally plus warm-ups) mapped to m = 0 -> 0 blocks, m >= 1 -> K + U m blocks, truncated at L."""

    __slots__ = ("offsets", "weights")

    def __init__(self, rate: np.ndarray, K: int, U: int, L: int, extra_counts: np.ndarray | None = None) -> None:
        # pmf of the count m, columns m = 0..m_max, rows = nodes
        if U > 0:
            m_max = max((L - K) // U, 0)
            counts = np.arange(m_max + 1)
            from scipy.stats import poisson  # NOTE: here: importing the CLI must not load scipy

            pmf = poisson.pmf(counts[None, :], rate[:, None])
            if extra_counts is not None:  # add c ~ extra_counts independent warm-ups: convolve in m
                mixed = np.zeros_like(pmf)
                for c, prob in enumerate(extra_counts):
                    if prob > 0 and c <= m_max:
                        mixed[:, c:] += prob * pmf[:, : m_max + 1 - c]
                pmf = mixed
            self.offsets = [0] + [K + U * m for m in range(1, m_max + 1) if K + U * m <= L]
            self.weights = [pmf[:, m] for m in range(len(self.offsets))]
        else:
            p_none = np.exp(-rate)
            if extra_counts is not None:
                p_none = p_none * extra_counts[0]
            self.offsets = [0] + ([K] if K <= L else [])
            self.weights = [p_none] + ([1.0 - p_none] if K <= L else [])

    def apply(self, acc: np.ndarray, times: int = 1) -> np.ndarray:
        width = acc.shape[1]
        for _ in range(times):
            out = acc * self.weights[0][:, None]
            for offset, w in zip(self.offsets[1:], self.weights[1:]):
                out[:, offset:] += w[:, None] * acc[:, : width - offset]
            acc = out
        return acc


def _leave_one_out(
    num_items: int,
    multiplicity: Sequence[int],
    form_before: Callable[[int], _PushedBlocks],
    form_after: Callable[[int], _PushedBlocks],
    start: np.ndarray,
    leaf: Callable[[int, np.ndarray], None],
) -> None:
    """For each item i, leaf(i, distribution of the blocks all *other* copies push): items before i contribute
    `form_before`, items after i `form_after`, each `multiplicity` times (i's own group m_i - 1 times, with
    form_after). Divide and conquer: O(items x log items) convolutions, O(log items) arrays alive."""

    def rec(lo: int, hi: int, acc: np.ndarray) -> None:
        if hi - lo == 1:
            leaf(lo, form_after(lo).apply(acc, multiplicity[lo] - 1))
            return
        mid = (lo + hi) // 2
        left = acc
        for k in range(mid, hi):
            left = form_after(k).apply(left, multiplicity[k])
        rec(lo, mid, left)
        right = acc
        for k in range(lo, mid):
            right = form_before(k).apply(right, multiplicity[k])
        rec(mid, hi, right)

    rec(0, num_items, start)


def _check_exact_work(num_items: int, num_nodes: int, L: int, K: int, U: int) -> None:
    shifts = (L // U + 1) if U > 0 else 2
    work = max(num_items, 1) * max(math.log2(max(num_items, 2)), 1.0) * num_nodes * (L + 1) * shifts
    if work > _EXACT_WORK_LIMIT:
        raise ValueError(
            f"method='exact' would take ~{work:.1e} operations ({num_items} distinct popularities, {L + 1} cache "
            f"levels); use method='che', which is accurate when many prefixes fit"
        )


def _exact_block_survival(p: np.ndarray, prefix_blocks: int, own_blocks: int, effective_blocks: float) -> np.ndarray:
    K, U = prefix_blocks, own_blocks
    L = int(math.floor(effective_blocks)) - 1  # room above a prefix's root: 1 + pushed <= M_eff
    n = p.size
    survival = np.zeros((n, K))
    active = np.flatnonzero(p > 0)
    if L < 0 or active.size == 0:
        return survival
    pa = p[active]
    uniq, inverse, counts = np.unique(pa, return_inverse=True, return_counts=True)
    if active.size == 1:
        survival[active[0], : min(K, L + 1)] = 1.0
        return survival
    # horizon: beyond tau_max the root survives with probability < 1e-12 (or never decays: everything fits)
    p_max = float(uniq[-1])
    others_rate = 1.0 - p_max
    tau_max = 1.0
    for _ in range(200):
        bound = 1.0
        if U > 0 and others_rate > 0:
            from scipy.stats import poisson  # NOTE: as above

            bound = poisson.cdf(L // U, others_rate * tau_max)
        if K > 0 and bound > 1e-12:
            # S >= K (distinct others) and distinct others >= distinct overall - 1 (Poisson-binomial via normal)
            seen = -np.expm1(-pa * tau_max)
            mean, var = seen.sum() - 1.0, float(np.sum(seen * (1 - seen)))
            limit = L // K
            if mean > limit:
                bound = min(bound, math.exp(-((mean - limit) ** 2) / (2 * var + 2 * (mean - limit) / 3 + 1e-300)))
        if bound < 1e-12 or tau_max > 1e12:
            break
        tau_max *= 2.0
    nodes, weights = _quadrature(tau_max, min(0.25, 0.25 / p_max))
    nodes = np.append(nodes, tau_max)  # the last row gives F(tau_max) for the tail term
    weights = np.append(weights, 0.0)
    _check_exact_work(uniq.size, nodes.size, L, K, U)
    levels = L - np.arange(K)
    valid = levels >= 0
    start = np.zeros((nodes.size, L + 1))
    start[:, 0] = 1.0
    forms: dict[int, _PushedBlocks] = {}

    def form(g: int) -> _PushedBlocks:
        if g not in forms:
            forms[g] = _PushedBlocks(uniq[g] * nodes, K, U, L)
        return forms[g]

    def leaf(g: int, dist: np.ndarray) -> None:
        cdf = np.cumsum(dist, axis=1)
        pg = float(uniq[g])
        density = weights * pg * np.exp(-pg * nodes)
        surv = np.zeros(K)
        surv[valid] = density @ cdf[:, levels[valid]] + math.exp(-pg * tau_max) * cdf[-1, levels[valid]]
        survival[active[inverse == g]] = np.clip(surv, 0.0, 1.0)
        forms.pop(g, None)

    _leave_one_out(uniq.size, counts.tolist(), form, form, start, leaf)
    return survival


def block_lru_hit_rates(
    *,
    popularity: Sequence[float] | np.ndarray,
    prefix_blocks: int,
    own_blocks: int,
    usable_blocks: float,
    in_flight_blocks: float = 0.0,
    block_size: int,
    prompt_tokens: int,
    method: Method = "che",
) -> BlockLruHitRates:
    """Steady-state hit rates of one vLLM worker serving an independent stream of shared-prefix requests.

    The model (docs/engines/vllm.md, the per-worker cache): the free queue is an LRU over blocks. A finishing request frees its
    blocks tail first, so its U own hashed blocks (unique tail and output, never reused) reach the most recently
    used end first and its prefix's K blocks follow with the root *last*; its unhashed partial block goes to the
    head and displaces nothing. A hit pulls blocks out of the queue and the finish puts them back, so after a
    request of prefix i, each later request pushes U fresh blocks plus K for each *distinct* other prefix, and
    prefix i's block j (0 = root) is still cached while 1 + j + pushed <= M_eff = usable_blocks - in_flight_blocks.
    A request hits iff the root survives; the hit length is the number of surviving leading blocks.

    Assumptions: requests at this worker are IRM (prefix i with probability `popularity[i]`, independently), time
    counted in arrivals at the worker; steady state (no warm-up transient: see `finite_run_hit_rates`); whole
    prefixes of K blocks; no preemption. `in_flight_blocks`: blocks held by running requests that the arrival count
    does not already cover (see `in_flight_blocks_estimate`; 0 fits the simulator on the reference).

    `method="che"`: per-prefix, per-block Che mean field (solve U T + K sum_{k != i}(1 - (1 - p_k)^T) = M_eff - 1 - j;
    the root's own prefix blocks are not above it, hence the leave-one-out and the "- 1 - j"). Fast at any size, but
    a mean field over the handful of prefixes that fit: on the reference (about 4 fit) it is off by up to 0.011.
    `method="exact"`: exact under the IRM (Poisson embedding, numeric quadrature over the gap); cost grows with
    distinct popularities x cache blocks^2 / U, so it refuses very large problems.
    """
    effective_blocks = _check_block_inputs(prefix_blocks, own_blocks, usable_blocks, in_flight_blocks, block_size, prompt_tokens)
    p = _check_popularity(popularity)
    if method == "che":
        survival, root_times = _che_block_survival(p, prefix_blocks, own_blocks, effective_blocks)
        finite = np.isfinite(root_times)
        t_char = float(np.sum(p * root_times)) if finite[p > 0].all() else math.inf
        return _summarise(p, survival, block_size, prompt_tokens, t_char)
    if method == "exact":
        survival = _exact_block_survival(p, prefix_blocks, own_blocks, effective_blocks)
        return _summarise(p, survival, block_size, prompt_tokens, math.nan)
    raise ValueError(f"method must be 'che' or 'exact', got {method!r}")


def finite_run_hit_rates(
    *,
    workers: int,
    popularity: Sequence[float] | np.ndarray,
    measured_requests: int,
    warmups_per_prefix: int = 1,
    prefix_blocks: int,
    own_blocks: int,
    usable_blocks: float,
    in_flight_blocks: float = 0.0,
    block_size: int,
    prompt_tokens: int,
) -> BlockLruHitRates:
    """Expected hit rates of a finite run under random routing that starts from warm-ups, as the reference does.

    Protocol (`sim.workloads.shared_prefix.shared_prefix_stream`): `warmups_per_prefix` warm-ups of prefix 0, then of prefix 1, ...
    sent one at a time, each to a uniformly random worker; then `measured_requests` IRM requests, each to a
    uniformly random worker. Nothing is in the caches before the warm-ups.

    The block model of `block_lru_hit_rates(method="exact")`, per worker, with two differences. (1) A measured
    request at time s after the start (in requests at its worker) whose prefix i has not been to this worker since
    the start hits iff a warm-up of i came here (probability 1 - (1 - 1/W)^w) and its root survived the blocks pushed
    since: those of the later prefixes' warm-ups here and of the s-window's requests. (2) The result is the average
    over the run, s uniform on [0, measured_requests / W]. Approximations: the per-worker request count is
    Poisson rather than binomial (the Poisson embedding of the stream), and warm-up and measured requests push
    blocks the same way. Cost: O(N log N) convolutions per quadrature node; meant for N up to a few hundred.
    """
    if workers < 1 or measured_requests < 1 or warmups_per_prefix < 0:
        raise ValueError(
            f"need workers >= 1, measured_requests >= 1, warmups_per_prefix >= 0; got {workers}, "
            f"{measured_requests}, {warmups_per_prefix}"
        )
    effective_blocks = _check_block_inputs(prefix_blocks, own_blocks, usable_blocks, in_flight_blocks, block_size, prompt_tokens)
    p = _check_popularity(popularity)
    K, U = prefix_blocks, own_blocks
    L = int(math.floor(effective_blocks)) - 1
    n = p.size
    horizon = measured_requests / workers
    nodes, weights = _quadrature(horizon, min(0.25, horizon / 64))
    _check_exact_work(n, nodes.size, L, K, U)
    levels = L - np.arange(K)
    valid = levels >= 0
    warm_here = 1.0 - (1.0 - 1.0 / workers) ** warmups_per_prefix
    from scipy.stats import binom  # NOTE: as above

    warm_counts = binom.pmf(np.arange(warmups_per_prefix + 1), warmups_per_prefix, 1.0 / workers)
    start = np.zeros((nodes.size, L + 1))
    start[:, 0] = 1.0
    survival = np.zeros((n, K))
    if L < 0:
        return _summarise(p, survival, block_size, prompt_tokens, math.nan)

    # (1) the previous request of prefix i came after the start, gap tau < s: weight (horizon - tau) / horizon
    uniq, inverse, counts = np.unique(p, return_inverse=True, return_counts=True)

    def measured_form(g: int) -> _PushedBlocks:
        return _PushedBlocks(uniq[g] * nodes, K, U, L)

    def steady_leaf(g: int, dist: np.ndarray) -> None:
        cdf = np.cumsum(dist, axis=1)
        pg = float(uniq[g])
        density = weights * (horizon - nodes) / horizon * pg * np.exp(-pg * nodes)
        surv = np.zeros(K)
        surv[valid] = density @ cdf[:, levels[valid]]
        survival[inverse == g] += surv

    _leave_one_out(uniq.size, counts.tolist(), measured_form, measured_form, start, steady_leaf)

    # (2) no request of prefix i since the start: it hits only through its warm-up here
    if warm_here > 0:
        def before_form(k: int) -> _PushedBlocks:  # warmed before i: its warm-ups are below i's root
            return _PushedBlocks(p[k] * nodes, K, U, L)

        def after_form(k: int) -> _PushedBlocks:  # warmed after i: c ~ Binomial(w, 1/W) warm-ups here add pushes
            return _PushedBlocks(p[k] * nodes, K, U, L, extra_counts=warm_counts)

        def warm_leaf(i: int, dist: np.ndarray) -> None:
            cdf = np.cumsum(dist, axis=1)
            density = weights / horizon * np.exp(-p[i] * nodes) * warm_here
            surv = np.zeros(K)
            surv[valid] = density @ cdf[:, levels[valid]]
            survival[i] += surv

        _leave_one_out(n, [1] * n, before_form, after_form, start, warm_leaf)

    return _summarise(p, np.clip(survival, 0.0, 1.0), block_size, prompt_tokens, math.nan)
