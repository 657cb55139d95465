"""The analytic screens of `sim.studies.analytic` against the reference's numbers, the literature and the simulator.

Tolerances are stated per test; the simulator comparisons average several seeds because one 200-request run of
the reference has a standard deviation of about 0.035 in its request hit rate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.engines.vllm.block_pool import BlockPool
from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import load_scenario
from sim.studies import analytic

# The reference worker (scenarios/service-baseline.yaml): 585 blocks of 16 tokens, 584 usable; prompts of a
# 2,032-token shared prefix + 339-token tail, 64 output tokens.
BLOCK_SIZE = 16
USABLE_BLOCKS = 584
PROMPT_TOKENS = 2371
PREFIX_TOKENS = 2032
OUTPUT_TOKENS = 64
K, U = 127, 25


def reference_kwargs(num_prefixes: int) -> dict:
    return dict(
        popularity=np.full(num_prefixes, 1.0 / num_prefixes), prefix_blocks=K, own_blocks=U,
        usable_blocks=USABLE_BLOCKS, block_size=BLOCK_SIZE, prompt_tokens=PROMPT_TOKENS,
    )


# ---------------------------------------------------------------------------------------------- rules of thumb
def test_reference_capacity_and_formula():
    # 1 GiB of KV at 114,688 B per token holds 9,362 tokens: 3.95 prompts of 2,371 tokens.
    c = analytic.capacity_requests(2**30, 114_688, PROMPT_TOKENS)
    assert c == pytest.approx(3.9487, abs=1e-3)
    scenario, _ = load_scenario()
    assert c == pytest.approx(scenario.kv_capacity_requests, rel=1e-12)
    assert analytic.formula_hit_rate(c, 2) == 1.0
    assert analytic.formula_hit_rate(c, 7) == pytest.approx(0.5641, abs=1e-4)
    assert analytic.formula_hit_rate(c, 12) == pytest.approx(0.3291, abs=1e-4)
    assert analytic.formula_hit_rate(c, 24) == pytest.approx(0.1645, abs=1e-4)
    # perfect prefix routing: six workers hold 23.7 prompts
    assert analytic.prefix_routing_bound(6, c, 12) == 1.0
    assert analytic.prefix_routing_bound(6, c, 24) == pytest.approx(6 * c / 24, abs=1e-12)


def test_shared_prefix_blocks_of_the_reference():
    # 2,032 prefix tokens = 127 full blocks; prompt + 63 output tokens with KV = 2,434 tokens = 152 hashed blocks.
    assert analytic.shared_prefix_blocks(PREFIX_TOKENS, PROMPT_TOKENS, OUTPUT_TOKENS, BLOCK_SIZE) == (127, 25)
    # a prefix that is the whole block-aligned prompt shares one block less (the last token is always recomputed)
    assert analytic.shared_prefix_blocks(64, 64, 1, 16) == (3, 1)
    # in flight: 8 requests over 6 workers, each holding cdiv(2434, 16) - 127 = 26 blocks of its own
    assert analytic.in_flight_blocks_estimate(
        concurrency=8, workers=6, prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, prefix_blocks=K,
        block_size=BLOCK_SIZE,
    ) == pytest.approx(8 / 6 * 26)


def test_first_visit_misses_of_two_prefixes():
    # 2 prefixes x 100 requests, one warm-up each: 6 workers leave 5 first visits per prefix, 3 workers leave 2.
    six = 2 * analytic.first_visit_misses(6, 100)
    three = 2 * analytic.first_visit_misses(3, 100)
    assert six == pytest.approx(10.0, abs=1e-6)
    assert three == pytest.approx(4.0, abs=1e-6)
    # the reference measured 190 and 196 hits of 200: exactly these
    assert 1 - six / 200 == pytest.approx(0.95, abs=1e-6)
    assert 1 - three / 200 == pytest.approx(0.98, abs=1e-6)
    # no warm-up: every worker a prefix reaches costs one miss
    assert analytic.first_visit_misses(6, 100, 0) == pytest.approx(6 * (1 - (5 / 6) ** 100))
    # w warm-ups cover W(1 - (1 - 1/W)^w) workers in expectation
    assert analytic.first_visit_misses(6, 100, 3) == pytest.approx(6 * ((5 / 6) ** 3 - (5 / 6) ** 103))


def test_zipf_popularity():
    p = analytic.zipf_popularity(5, 1.0)
    assert p.sum() == pytest.approx(1.0)
    assert p[0] / p[1] == pytest.approx(2.0) and p[0] / p[4] == pytest.approx(5.0)
    assert np.allclose(analytic.zipf_popularity(4, 0.0), 0.25)


# ---------------------------------------------------------------------------------------------- Che
def test_che_reproduces_the_published_zipf_lru_table():
    # docs/commands/plan.md, che_hit_rate: Zipf over 100,000 objects, LRU of 100 / 1,000 / 10,000 objects (within 1e-3).
    table = {0.8: (0.0678, 0.2043, 0.4687), 1.0: (0.2898, 0.5062, 0.7373)}
    for exponent, expected in table.items():
        p = analytic.zipf_popularity(100_000, exponent)
        for capacity, h in zip((100, 1_000, 10_000), expected):
            assert analytic.che_hit_rate(p, capacity) == pytest.approx(h, abs=1e-3)
    p = analytic.zipf_popularity(10, 1.0)
    assert analytic.che_characteristic_time(p, 10) == math.inf and analytic.che_hit_rate(p, 10) == 1.0


def _lru_single_block_hit_rate(p: np.ndarray, capacity: int, num_requests: int, seed: int) -> float:
    """kvsim's BlockPool as an LRU of single-block objects, driven by an IRM stream; 20% warm-up discarded."""
    pool = BlockPool(capacity + 1)  # + the null block
    objects = np.random.default_rng(seed).choice(p.size, size=num_requests, p=p)
    warmup = num_requests // 5
    hits = 0
    for n, obj in enumerate(objects.tolist()):
        block = pool.get_cached_block(obj)
        if block is None:
            block = pool.get_new_blocks(1)[0]
            pool.cache_block(block, obj)
        else:
            pool.touch([block])  # a hit pulls the block out of the free queue ...
            hits += n >= warmup
        pool.free([block])  # ... and the free puts it back at the most recently used end
    return hits / (num_requests - warmup)


@pytest.mark.parametrize("exponent, num_objects, capacity", [(0.8, 1_000, 100), (1.0, 2_000, 50)])
def test_che_matches_an_lru_of_kvsim_blocks(exponent, num_objects, capacity):
    # 100,000 requests: the simulated ratio's standard error is about 0.002; Che within 0.01.
    p = analytic.zipf_popularity(num_objects, exponent)
    simulated = _lru_single_block_hit_rate(p, capacity, 100_000, seed=7)
    assert analytic.che_hit_rate(p, capacity) == pytest.approx(simulated, abs=0.01)


# ---------------------------------------------------------------------------------------------- block model
def _block_lru_run(p: np.ndarray, *, k: int, u: int, usable: int, num_requests: int, seed: int) -> tuple[float, float]:
    """One worker served one request at a time, blocks handled as the KV cache manager does (tail-first free,
    partial block first to the head); returns (request hit rate, mean hit blocks) after a 20% warm-up."""
    pool = BlockPool(usable + 1)
    draws = np.random.default_rng(seed).choice(p.size, size=num_requests, p=p).tolist()
    warmup = num_requests // 5
    hits = hit_blocks = 0
    for n, prefix in enumerate(draws):
        cached = []
        for j in range(k):
            b = pool.get_cached_block(("p", prefix, j))
            if b is None:
                break
            cached.append(b)
        pool.touch(cached)
        new = pool.get_new_blocks(k - len(cached) + u + 1)  # + 1 unhashed partial block
        for j, b in enumerate(new[: k - len(cached)]):
            pool.cache_block(b, ("p", prefix, len(cached) + j))
        for j, b in enumerate(new[k - len(cached): k - len(cached) + u]):
            pool.cache_block(b, ("u", n, j))
        pool.free(list(reversed(cached + new)))
        if n >= warmup:
            hits += bool(cached)
            hit_blocks += len(cached)
    return hits / (num_requests - warmup), hit_blocks / (num_requests - warmup)


@pytest.mark.parametrize("popularity", [np.full(10, 0.1), analytic.zipf_popularity(30, 1.0)], ids=["uniform", "zipf"])
def test_block_model_matches_a_direct_block_lru(popularity):
    # A scaled-down worker: prefixes of 8 blocks, 2 own blocks per request, 40 usable blocks (about 4 prefixes fit).
    # 40,000 requests: standard error ~0.003. Exact IRM model within 0.01; the Che mean field within 0.03.
    simulated_hit, simulated_blocks = _block_lru_run(popularity, k=8, u=2, usable=40, num_requests=40_000, seed=3)
    kwargs = dict(popularity=popularity, prefix_blocks=8, own_blocks=2, usable_blocks=40, block_size=16,
                  prompt_tokens=8 * 16 + 40)
    exact = analytic.block_lru_hit_rates(**kwargs, method="exact")
    che = analytic.block_lru_hit_rates(**kwargs, method="che")
    assert exact.request_hit_rate == pytest.approx(simulated_hit, abs=0.01)
    assert exact.num_hit_tokens_per_request / 16 == pytest.approx(simulated_blocks, abs=0.08)
    assert che.request_hit_rate == pytest.approx(simulated_hit, abs=0.03)


def test_block_model_on_the_reference_worker():
    # Uniform popularity, about 4 whole prefixes fit: LRU over 4 objects of N gives 4/N, and the exact model says so.
    for n, steady in ((7, 0.5691), (12, 0.3333), (24, 0.1667)):
        exact = analytic.block_lru_hit_rates(**reference_kwargs(n), method="exact")
        assert exact.request_hit_rate == pytest.approx(steady, abs=1e-3)
        che = analytic.block_lru_hit_rates(**reference_kwargs(n), method="che")
        assert che.request_hit_rate == pytest.approx(steady, abs=0.012)
        assert che.characteristic_time_requests > 0
        # partial hits: the token hit rate lies below the full-prefix share 127 x 16 / 2371 of the request hit rate
        assert exact.full_hit_rate <= exact.request_hit_rate
        assert exact.token_hit_rate <= exact.request_hit_rate * K * BLOCK_SIZE / PROMPT_TOKENS + 1e-12
    # two prefixes always fit: every request after the first visit hits its whole prefix
    # (unless 19 requests of the other prefix come in a row: 1 + 19 x 25 + 127 > 584, probability 2^-19)
    both = analytic.block_lru_hit_rates(**reference_kwargs(2), method="exact")
    assert both.request_hit_rate == pytest.approx(1.0 - 2.0**-19, abs=1e-9)
    assert both.token_hit_rate == pytest.approx(K * BLOCK_SIZE / PROMPT_TOKENS, abs=1e-3)


def test_random_routing_does_not_depend_on_the_worker_count():
    # Thinning keeps the popularity, so the steady state is one worker's; only the cold start depends on W.
    three = analytic.random_routing_hit_rates(workers=3, **reference_kwargs(12))
    six = analytic.random_routing_hit_rates(workers=6, **reference_kwargs(12))
    assert three == six
    cold3 = analytic.finite_run_hit_rates(workers=3, measured_requests=240, **reference_kwargs(12))
    cold6 = analytic.finite_run_hit_rates(workers=6, measured_requests=240, **reference_kwargs(12))
    assert cold6.request_hit_rate < cold3.request_hit_rate < three.request_hit_rate + 1e-3


def test_prefix_routing_by_rank():
    # 12 equal prefixes dealt to 6 workers: 2 each, which fit, so every request hits (as in the two-prefix worker).
    routed = analytic.prefix_routing_hit_rates(workers=6, **reference_kwargs(12), method="exact")
    assert routed.request_hit_rate == pytest.approx(1.0 - 2.0**-19, abs=1e-9)
    assert routed.traffic_share_by_worker == pytest.approx((1 / 6,) * 6)
    # a skewed popularity is dealt by rank: worker 0 gets ranks 1, 7, 13, ...
    p = analytic.zipf_popularity(24, 1.0)
    skewed = analytic.prefix_routing_hit_rates(workers=6, **{**reference_kwargs(24), "popularity": p})
    assert skewed.traffic_share_by_worker[0] == pytest.approx(p[0::6].sum())


def test_bad_inputs_name_the_culprit():
    with pytest.raises(ValueError, match="sum to 1"):
        analytic.block_lru_hit_rates(**{**reference_kwargs(3), "popularity": [0.5, 0.5, 0.5]})
    with pytest.raises(ValueError, match="method"):
        analytic.block_lru_hit_rates(**reference_kwargs(3), method="magic")
    with pytest.raises(ValueError, match="in_flight_blocks"):
        analytic.block_lru_hit_rates(**reference_kwargs(3), in_flight_blocks=600)


# ---------------------------------------------------------------------------------------------- vs the simulator
SEEDS = {2: range(1), 7: range(12), 12: range(12), 24: range(6)}


@pytest.fixture(scope="module")
def simulated():
    """Request and token hit rates of the reference scenario (random routing, 6 workers, concurrency 8), per N,
    averaged over the seeds of SEEDS (every run of one N has the same number of requests)."""
    scenario, _ = load_scenario()
    out = {}
    for n, seeds in SEEDS.items():
        runs = [
            summarize(run(scenario.with_overrides(**{
                "workload.prefixes": n, "cluster.workers": 6, "workload.concurrency": 8, "seed": s,
            })))
            for s in seeds
        ]
        out[n] = (float(np.mean([r.request_hit_rate for r in runs])), float(np.mean([r.token_hit_rate for r in runs])))
    return out


def _finite_run(n: int) -> analytic.BlockLruHitRates:
    return analytic.finite_run_hit_rates(workers=6, measured_requests=max(200, 20 * n), **reference_kwargs(n))


@pytest.mark.slow
def test_two_prefixes_miss_only_first_visits(simulated):
    # N = 2: the simulator, the finite-run block model and the first-visit count all give 190 hits of 200.
    request_hit, token_hit = simulated[2]
    assert request_hit == pytest.approx(0.95, abs=1e-9)
    assert _finite_run(2).request_hit_rate == pytest.approx(0.95, abs=2e-3)
    assert _finite_run(2).token_hit_rate == pytest.approx(token_hit, abs=5e-3)


@pytest.mark.parametrize("n", [7, 12, 24])
@pytest.mark.slow
def test_block_model_matches_the_simulator(simulated, n):
    # The finite-run block model (warm-ups, 200-480 requests, steady state reached after a few requests per
    # worker) against the mean of 6-12 seeds: within 0.02 in request and token hit rate. Measured (this file's
    # seeds): N=7 0.537 vs 0.528, N=12 0.324 vs 0.337, N=24 0.166 vs 0.163 (20 seeds: 0.529, 0.331, 0.163); token
    # hit rate 0.436 vs 0.430, 0.270 vs 0.281, 0.141 vs 0.138.
    # The steady-state models ignore the cold start, which costs ~0.03 at N=7 (each worker starts with ~1.2 of
    # the 7 prefixes and only 33 requests follow): exact 0.569 and Che 0.580 there, so they are held to 0.06 only.
    request_hit, token_hit = simulated[n]
    model = _finite_run(n)
    assert model.request_hit_rate == pytest.approx(request_hit, abs=0.02)
    assert model.token_hit_rate == pytest.approx(token_hit, abs=0.02)
    for method in ("exact", "che"):
        steady = analytic.random_routing_hit_rates(workers=6, **reference_kwargs(n), method=method)
        assert steady.request_hit_rate == pytest.approx(request_hit, abs=0.06)


@pytest.mark.slow
def test_where_the_formula_is_off(simulated):
    c = analytic.capacity_requests(2**30, 114_688, PROMPT_TOKENS)
    # N = 7: the formula ignores the cold start and is off by 0.036; the finite-run model by 0.008.
    sim7 = simulated[7][0]
    assert abs(analytic.formula_hit_rate(c, 7) - sim7) > 2 * abs(_finite_run(7).request_hit_rate - sim7)
    # N = 12: the formula is right, and not by chance: ~4 whole prefixes of 127 + 25 blocks fit in 584, and an LRU
    # of 4 equally popular objects out of N hits 4/N = 0.333, while C/N = 3.95/12 = 0.329.
    sim12 = simulated[12][0]
    assert analytic.formula_hit_rate(c, 12) == pytest.approx(sim12, abs=0.02)
    assert analytic.block_lru_hit_rates(**reference_kwargs(12), method="exact").request_hit_rate == pytest.approx(4 / 12, abs=1e-3)


@pytest.mark.slow
def test_prefix_hash_routing_vs_its_bound():
    # Strict consistent hashing (prefix-hash) of 24 prefixes over 6 workers: the bound min(1, W C / N) = 0.99, but
    # the ring deals the prefixes 5/5/1/0/9/4, and the block model with that assignment predicts the simulator
    # (0.69 over 2 seeds) within 0.02.
    scenario, _ = load_scenario()
    n = 24
    hits, assignment = [], {}
    for seed in range(2):
        result = run(scenario.with_overrides(**{
            "workload.prefixes": n, "cluster.workers": 6, "router.name": "prefix-hash", "seed": seed,
        }))
        hits.append(summarize(result).request_hit_rate)
        for record in result.records:
            assert assignment.setdefault(record.prefix_id, record.worker) == record.worker
    model = analytic.prefix_routing_hit_rates(
        workers=6, assignment=[assignment[i] for i in range(n)], **reference_kwargs(n), method="exact",
    )
    bound = analytic.prefix_routing_bound(6, analytic.capacity_requests(2**30, 114_688, PROMPT_TOKENS), n)
    assert model.request_hit_rate == pytest.approx(float(np.mean(hits)), abs=0.02)
    assert bound - float(np.mean(hits)) > 0.2
