"""llm-d EPP router: each scorer, the affinity filter, the picker, the producers' state and the presets, on a fake
cluster with exact expected scores and choices. Requests have 16-token blocks; the approximate producer keys 64-token
blocks (the #1160 floor), so prompt(...) of 2371 tokens has 37 full 64-token keys + 1 partial = 38 blocks."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from policies.llm_d import LlmdRouter
from sim.engines.interface import EngineLoad
from sim.workloads.request import Request
from tests.support.router_fakes import B, FakeView, build, prompt, send

ONLY = dict(queue_weight=0, kv_cache_utilization_weight=0, prefix_cache_weight=0)
"""Switch the default preset's three scorers off, to test one scorer alone."""


def req(rid, tokens, prefix=0, shared_blocks=None, prefix_id="same"):
    """A request of `tokens` tokens whose first `shared_blocks` 16-token blocks are prefix `prefix`'s."""
    shared = tokens // B if shared_blocks is None else shared_blocks
    hashes = tuple(("p", prefix, i) if i < shared else ("u", rid, i) for i in range(tokens // B))
    return Request(rid, tokens, 8, hashes, prefix_id=prefix if prefix_id == "same" else prefix_id)


def test_defaults_are_the_chart_default_profile():
    r = build(LlmdRouter)
    o = r.options
    assert (o.preset, o.queue_weight, o.kv_cache_utilization_weight, o.prefix_cache_weight) == ("default", 2, 2, 3)
    assert (o.prefix_cache, o.load_aware_weight, o.token_load_weight, o.no_hit_lru_weight, o.affinity_filter) == \
        ("approximate", 0, 0, 0, False)
    assert (o.scrape_interval_s, o.replicas, o.lru_capacity_per_server, o.min_block_size_tokens) == (0.05, 1, 31250, 64)
    assert (o.max_prefix_tokens_to_match, o.affinity_threshold, o.max_ttft_penalty_ms) == (131072, 0.80, 18000)


def test_presets_set_their_configuration_and_explicit_options_win():
    ob = build(LlmdRouter, preset="optimized-baseline").options
    assert (ob.affinity_filter, ob.max_tokens_in_flight_penalty, ob.max_ttft_penalty_ms, ob.token_load_weight,
            ob.prefix_cache_weight, ob.queue_weight, ob.max_prefix_tokens_to_match) == (True, 286720, 0, 1, 0, 0, 40960)
    pr = build(LlmdRouter, preset="precise").options
    assert (pr.prefix_cache, pr.prefix_cache_weight, pr.kv_cache_utilization_weight, pr.queue_weight,
            pr.no_hit_lru_weight, pr.speculative_indexing, pr.replicas) == ("precise", 3, 2, 2, 2, True, 2)
    est = build(LlmdRouter, preset="estimate").options
    assert (est.prefix_cache_weight, est.load_aware_weight, est.queue_weight) == (1, 1, 0)
    mixed = build(LlmdRouter, preset="precise", queue_weight=0.5, replicas=1).options
    assert (mixed.queue_weight, mixed.replicas, mixed.no_hit_lru_weight) == (0.5, 1, 2)
    with pytest.raises(ValueError, match="preset"):
        build(LlmdRouter, preset="fastest")


# ---------------------------------------------------------------------------------------------- approximate producer
def test_approximate_prefix_score_is_matched_over_total_blocks_of_64_tokens():
    # Request 1 (2371 tokens, prefix 7) goes to worker 3. Request 2 shares its first 127 16-token blocks = 31 full
    # 64-token keys (127 // 4), the rest its own: worker 3 matches 31 of 38 blocks -> prefix score 31/38, the others 0.
    view = FakeView(6)
    r = build(LlmdRouter, view=view, **{**ONLY, "prefix_cache_weight": 3})
    r._approx.record(prompt(1, 7), 3)
    matched, total = r._approx.match_blocks(prompt(2, 7))
    assert (matched, total) == ([0, 0, 0, 31, 0, 0], 38)
    _, totals = r.scores(prompt(2, 7), view)
    assert totals == {0: 0.0, 1: 0.0, 2: 0.0, 3: pytest.approx(3 * 31 / 38), 4: 0.0, 5: 0.0}
    assert r.route(prompt(2, 7), view) == 3


def test_approximate_match_counts_every_holder_until_no_pod_holds_a_block():
    # Keys k0..k3 (16-token keys here). Worker 0 holds k0..k3, worker 1 only k1..k3 (its k0 was evicted), worker 2
    # only k3: upstream's matchLongestPrefix walks while *some* pod holds the key and credits every holder, so
    # worker 1 counts 3 and worker 2 counts 1 (a first-miss walk would give them 0).
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, min_block_size_tokens=16, auto_tune=False)
    q = req(1, 4 * B)
    k = list(q.block_hashes)
    index = r._approx.history.index
    index.add_all(k, 0)
    index.add_all(k[1:], 1)
    index.add(k[3], 2)
    assert r._approx.match_blocks(q) == ([4, 3, 1], 4)
    # Nobody holds k0 any more: the walk stops at once, everyone 0.
    index.remove(k[0], 0)
    r._approx._last = None
    assert r._approx.match_blocks(q) == ([0, 0, 0], 4)


def test_short_and_partial_prompts():
    # 40 tokens (< one 64-token block): one partial block of the request's own; it never matches -> score 0.
    view = FakeView(2)
    r = build(LlmdRouter, n=2, view=view, **{**ONLY, "prefix_cache_weight": 1})
    short = req(1, 40)
    assert r._approx.keys(short) == [("llm-d-partial-block", 1)]
    send(r, short, view)
    assert r._approx.match_blocks(req(2, 40)) == ([0, 0], 1)
    # 128 tokens exactly: two full keys, no partial.
    assert len(r._approx.keys(req(3, 128))) == 2


def test_block_size_follows_the_engine_then_the_64_token_floor():
    view = FakeView(2, block_size=16)
    assert build(LlmdRouter, n=2, view=view)._approx.tokens_per_key == 64  # vLLM 16 -> floored to 64
    view128 = FakeView(2, block_size=16)
    view128.cache_block_size = lambda: 128
    assert build(LlmdRouter, n=2, view=view128)._approx.tokens_per_key == 128
    assert build(LlmdRouter, n=2, view=view128, auto_tune=False)._approx.tokens_per_key == 64  # blockSizeTokens 16 -> 64
    assert build(LlmdRouter, n=2, view=view128, auto_tune=False, min_block_size_tokens=16)._approx.tokens_per_key == 16
    with pytest.raises(ValueError, match="multiple of the requests' block size 16"):
        build(LlmdRouter, n=2, view=FakeView(2), min_block_size_tokens=40)


def test_max_prefix_tokens_caps_the_blocks():
    view = FakeView(2)
    capped = build(LlmdRouter, n=2, view=view, max_prefix_tokens_to_match=640)  # 640 / 64 = 10 blocks
    assert len(capped._approx.keys(prompt(1, 0))) == 10
    old = build(LlmdRouter, n=2, view=view, max_prefix_tokens_to_match=0, max_prefix_blocks_to_match=256,
                min_block_size_tokens=16)  # the older character-hashing form: 256 blocks of 16 tokens
    assert len(old._approx.keys(req(2, 8000))) == 256
    whole = build(LlmdRouter, n=2, view=view, max_prefix_tokens_to_match=0, max_prefix_blocks_to_match=0)
    assert len(whole._approx.keys(req(3, 8000))) == 125


def test_per_pod_lru_forgets_the_oldest_roots_first_and_lookups_do_not_refresh():
    # Capacity 3 keys per pod (autoTune: the pod's block count), 64-token keys. Request a (4 keys: 3 full + partial,
    # 200 tokens) to worker 0 keeps its last 3 entries: a1, a2, partial -- its root a0 is gone, so the walk stops at
    # once for a repeat of a's prefix. Lookups in between change nothing; worker 1's LRU is its own.
    view = FakeView(2)
    view.num_blocks = 3
    r = build(LlmdRouter, n=2, view=view, **{**ONLY, "prefix_cache_weight": 1})
    a = req(1, 200, prefix=5)
    assert r._approx.history.capacity_keys == 3
    send(r, a, view)
    assert len(r._approx.history) == 3
    assert r._approx.match_blocks(req(2, 200, prefix=5)) == ([0, 0], 4)
    # A 2-key prompt b (128 tokens) recorded for worker 1: a repeat matches 2 of 2 there; worker 0 keeps its 3.
    r._approx.record(req(3, 128, prefix=6), 1)
    assert r._approx.match_blocks(req(4, 128, prefix=6)) == ([0, 2], 2)
    assert len(r._approx.history) == 5
    for _ in range(5):
        r._approx.match_blocks(req(5, 128, prefix=6))  # peeks
    assert r._approx.history.forgotten_keys == 1


def test_lru_capacity_defaults_to_31250_without_a_block_count():
    assert build(LlmdRouter, view=FakeView(6))._approx.history.capacity_keys == 31250
    view = FakeView(6)
    view.num_blocks = 9000
    assert build(LlmdRouter, view=view, auto_tune=False)._approx.history.capacity_keys == 31250
    assert build(LlmdRouter, view=view, auto_tune=False, lru_capacity_per_server=100)._approx.history.capacity_keys == 100


def test_approximate_state_never_sees_evictions():
    view = FakeView(2)
    r = build(LlmdRouter, n=2, view=view, **{**ONLY, "prefix_cache_weight": 1})
    send(r, prompt(1, 7), view)
    view.emit(0, "cleared")
    view.emit(1, "cleared")
    assert r._approx.match_blocks(prompt(2, 7))[0] in ([31, 0], [0, 31])


# ---------------------------------------------------------------------------------------------- load scorers
def test_queue_and_kv_utilization_scores_from_scraped_metrics():
    # Waiting queues 4, 0, 2 -> queue scores 0, 1, 0.5; KV usage 0.1, 0.9, 0.5 -> 0.9, 0.1, 0.5.
    # Default weights 2 / 2 (prefix 3 scores 0 on a cold cluster): totals 1.8, 2.2, 2.0 -> worker 1.
    scraped = [EngineLoad(num_waiting=4, kv_usage=0.1), EngineLoad(num_waiting=0, kv_usage=0.9),
               EngineLoad(num_waiting=2, kv_usage=0.5)]
    view = FakeView(3, scraped=scraped)
    r = build(LlmdRouter, n=3, view=view)
    _, totals = r.scores(prompt(1, 0), view)
    assert totals == {0: pytest.approx(1.8), 1: pytest.approx(2.2), 2: pytest.approx(2.0)}
    assert r.route(prompt(1, 0), view) == 1
    assert set(view.scrape_intervals) == {0.05}


def test_queue_scorer_gives_everyone_one_when_queues_are_equal():
    view = FakeView(2, scraped=[EngineLoad(num_waiting=3), EngineLoad(num_waiting=3)])
    r = build(LlmdRouter, n=2, view=view, **{**ONLY, "queue_weight": 1})
    assert r.scores(prompt(1, 0), view)[1] == {0: 1.0, 1: 1.0}


def test_load_aware_scorer():
    # Q = 0 -> 0.5; Q = 32 -> 0.5 * (1 - 32/128) = 0.375; Q = 500 -> capped at 128 -> 0.
    view = FakeView(3, scraped=[EngineLoad(num_waiting=0), EngineLoad(num_waiting=32), EngineLoad(num_waiting=500)])
    r = build(LlmdRouter, n=3, view=view, **{**ONLY, "load_aware_weight": 1})
    assert r.scores(prompt(1, 0), view)[1] == {0: 0.5, 1: 0.375, 2: 0.0}


def test_active_request_scorer_counts_router_in_flight_until_completion():
    # In flight 0, 2, 4: idle worker 1.0; others (4 - n) / 4 -> 0.5, 0.
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, **{**ONLY, "active_request_weight": 1})
    r.in_flight[:] = [0, 2, 4]
    assert r.scores(prompt(1, 0), view)[1] == {0: 1.0, 1: 0.5, 2: 0.0}


def test_token_load_counts_uncached_prompt_tokens_until_the_first_token():
    # Request a (2371 tokens, 38 approximate blocks of 64) goes to a cold cluster: it adds 38 * 64 = 2432 uncached
    # tokens (the partial block counts whole) to its worker, released at its first token. Request b of the same
    # prefix sees on a's worker its own uncached (38 - 31) * 64 = 448 + a's 2432 = 2880 tokens -> 1 - 2880/4194304;
    # elsewhere its full 2432.
    view = FakeView(2)
    r = build(LlmdRouter, n=2, view=view, **{**ONLY, "token_load_weight": 1})
    a, b = prompt(1, 7), prompt(2, 7)
    w = send(r, a, view)
    assert r._inflight_tokens[w] == 2432
    _, totals = r.scores(b, view)
    assert totals[w] == pytest.approx(1 - 2880 / 4194304)
    assert totals[1 - w] == pytest.approx(1 - 2432 / 4194304)
    r.on_first_token(a, w)
    assert r._inflight_tokens == [0, 0]


# ---------------------------------------------------------------------------------------------- no-hit LRU, session
def test_no_hit_lru_spreads_cold_requests_and_is_neutral_for_warm_ones():
    # Three workers, cold requests: never-used workers first in worker order (1.0, 0.5, 0.0) -> worker 0; then
    # worker 0 is the most recent: never-used 1, 2 rank 0, 1; worker 0 rank 2 -> 1, 2, 0 in turn.
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, **{**ONLY, "no_hit_lru_weight": 1})
    assert r.scores(req(1, 100, prefix=1), view)[1] == {0: 1.0, 1: 0.5, 2: 0.0}
    picks = [send(r, req(i, 100, prefix=i), view) for i in range(1, 7)]
    assert picks == [0, 1, 2, 0, 1, 2]
    assert list(r._lru) == [0, 1, 2]
    # A warm request (a repeat of request 6's 64-token block on worker 2): 0.5 everywhere, the LRU is not touched.
    assert r.scores(req(7, 100, prefix=6), view)[1] == {0: 0.5, 1: 0.5, 2: 0.5}


def test_session_affinity_prefers_the_pod_named_on_the_last_response():
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, **{**ONLY, "session_affinity_weight": 1})
    first = req(1, 100, prefix=4)
    w = send(r, first, view)
    assert r.scores(req(2, 100, prefix=4), view)[1] == {0: 0.0, 1: 0.0, 2: 0.0}  # no response yet
    r.on_first_token(first, w)
    assert r.scores(req(3, 100, prefix=4), view)[1] == {x: (1.0 if x == w else 0.0) for x in range(3)}
    assert r.scores(req(4, 100, prefix=None, prefix_id=None), view)[1] == {0: 0.0, 1: 0.0, 2: 0.0}


def in_session(request, session):
    return replace(request, session_id=session)


def test_session_affinity_follows_the_session_not_the_prefix():
    # Sessions 1 and 2 share prefix 4. Session 1's response named worker w; session 2 has had no response: its
    # requests score 0 everywhere, whatever worker its prefix group used.
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, **{**ONLY, "session_affinity_weight": 1})
    first = in_session(req(1, 100, prefix=4), 1)
    w = send(r, first, view)
    r.on_first_token(first, w)
    assert r.scores(in_session(req(2, 100, prefix=4), 1), view)[1] == {x: (1.0 if x == w else 0.0) for x in range(3)}
    assert r.scores(in_session(req(3, 100, prefix=4), 2), view)[1] == {0: 0.0, 1: 0.0, 2: 0.0}
    assert r.scores(req(4, 100, prefix=4), view)[1] == {0: 0.0, 1: 0.0, 2: 0.0}  # prefix group 4's stand-in key


SESSION_ID = {**ONLY, "session_affinity_weight": 1, "session_affinity_strategy": "session_id"}


def test_session_id_strategy_binds_at_dispatch_and_its_options_default_to_upstreams():
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, **SESSION_ID)
    assert (r.options.session_eviction_ttl_s, r.options.session_eviction_sweep_s) == (300.0, 10.0)
    w = send(r, in_session(req(1, 100), 9), view)  # unbound: every pod 0, the picker places it; bound now
    assert r._bindings == {("session", 9): (w, 0.0)}
    assert r.scores(in_session(req(2, 100), 9), view)[1] == {x: (1.0 if x == w else 0.0) for x in range(3)}


def busy_bound(view, refresh):
    """Session 9 bound to worker 0 at t=0. At t=15 worker 0 has two requests in flight and the active-request scorer
    (weight 2) outweighs the session (weight 1): the request goes to the idle worker 1 and the binding keeps worker 0
    without being refreshed. With `refresh`, both are idle at t=15 and the session's request goes to worker 0 and
    refreshes it."""
    r = build(LlmdRouter, n=2, view=view, **{**SESSION_ID, "active_request_weight": 2})
    assert send(r, in_session(req(1, 100), 9), view) in (0, 1)
    r._bindings[("session", 9)] = (0, 0.0)
    r.in_flight[:] = [0, 0] if refresh else [2, 0]
    view.now_s = 15.0
    q = in_session(req(2, 100), 9)
    assert r.scores(q, view)[1] == ({0: 3.0, 1: 2.0} if refresh else {0: 1.0, 1: 2.0})
    assert send(r, q, view) == (0 if refresh else 1)
    assert r._bindings[("session", 9)] == (0, 15.0 if refresh else 0.0)
    return r


@pytest.mark.parametrize("refresh", [False, True])
def test_session_id_bindings_are_swept_every_10_s_once_unused_for_more_than_300_s(refresh):
    # Last seen t=0 (outweighed at t=15): the sweep at t=300 keeps it (300 - 0 is not > 300), the one at t=310
    # drops it; lookups between sweeps never check expiry. Last seen t=15: it lives until the sweep at t=320.
    view = FakeView(2)
    r = busy_bound(view, refresh)
    r.in_flight[:] = [0, 0]
    for t, bound in ((309.9, True), (310.0, refresh), (319.9, refresh), (320.0, False)):
        view.now_s = t
        scores = r.scores(in_session(req(3, 100), 9), view)[1]
        assert (scores[0] == 3.0) is bound, t


def test_session_id_migrates_only_when_its_pod_is_not_a_candidate():
    # Session 9 is bound to worker 1, but worker 0 holds the whole prompt of prefix 7 and the optimized-baseline
    # affinity filter keeps only worker 0: the bound pod was filtered out, so PreRequest moves the binding there.
    r, view = _sticky_router(preset="optimized-baseline", session_affinity_weight=1,
                             session_affinity_strategy="session_id")
    r._bindings[("session", 9)] = (1, 0.0)
    view.now_s = 3.0
    q = in_session(prompt(1, 7, shared_blocks=148), 9)
    assert r.scores(q, view) == ([0], {0: 1 - 64 / 4194304})  # token load (its partial block) + session 0
    assert send(r, q, view) == 0
    assert r._bindings[("session", 9)] == (0, 3.0)


# ---------------------------------------------------------------------------------------------- affinity filter
def _sticky_router(n=3, **options):
    """Worker 0 served prefix 7 (2371 tokens): a repeat matches 31 + ... of 38 blocks there."""
    view = FakeView(n)
    r = build(LlmdRouter, n=n, view=view, **options)
    r._approx.record(prompt(100, 7, shared_blocks=148), 0)  # the whole prompt shared: 37 keys + its partial
    return r, view


def test_affinity_filter_keeps_only_sticky_endpoints():
    # A repeat sharing all 148 16-token blocks matches 37 of 38 blocks on worker 0 (0.974 >= 0.80): only worker 0
    # stays, whatever the token load says.
    r, view = _sticky_router(preset="optimized-baseline")
    r._inflight_tokens[:] = [100_000, 0, 0]
    q = prompt(1, 7, shared_blocks=148)
    candidates, totals = r.scores(q, view)
    assert candidates == [0]
    assert r.route(q, view) == 0


def test_affinity_filter_below_threshold_keeps_all():
    r, view = _sticky_router(preset="optimized-baseline")
    candidates, _ = r.scores(prompt(1, 7, shared_blocks=100), view)  # 25 of 38 = 0.66 < 0.80
    assert candidates == [0, 1, 2]


def test_affinity_filter_token_gate_breaks_stickiness_above_286720_tokens():
    # Sticky worker 0 carries 286,721 in-flight tokens more than the least loaded other: all three stay and the
    # token-load scorer sends the request to an idle worker (ties among 1 and 2 broken at random).
    r, view = _sticky_router(preset="optimized-baseline")
    q = prompt(1, 7, shared_blocks=148)
    r._inflight_tokens[:] = [286_720, 0, 0]
    assert r.scores(q, view)[0] == [0]
    r._inflight_tokens[:] = [286_721, 0, 0]
    assert r.scores(q, view)[0] == [0, 1, 2]
    assert r.route(q, view) in (1, 2)


def test_affinity_filter_ttft_gate():
    # HEAD's gate: ttft = in-flight tokens / 15,928 tok/s * 1000; break when sticky - other > 18,000 ms
    # (286,704 tokens). 286,704 -> exactly 18,000 ms: stays sticky; 286,720 -> 18,001 ms: broken.
    r, view = _sticky_router(affinity_filter=True)
    q = prompt(1, 7, shared_blocks=148)
    r._inflight_tokens[:] = [286_704, 0, 0]
    assert r.scores(q, view)[0] == [0]
    r._inflight_tokens[:] = [286_720, 0, 0]
    assert r.scores(q, view)[0] == [0, 1, 2]


def test_affinity_filter_exploration_skips_the_gate():
    r, view = _sticky_router(affinity_filter=True, exploration_probability=1.0)
    assert r.scores(prompt(1, 7, shared_blocks=148), view)[0] == [0, 1, 2]


# ---------------------------------------------------------------------------------------------- precise producer
def test_precise_score_is_depth_over_full_blocks_from_kv_events():
    # Worker 1's engine reports the request's first 74 of 148 blocks stored: score 0.5; the approximate index is
    # not used for the prefix score. Events removed later are seen.
    view = FakeView(2)
    r = build(LlmdRouter, n=2, view=view, prefix_cache="precise", prefix_cache_weight=1, queue_weight=0,
              kv_cache_utilization_weight=0)
    q = prompt(1, 7, shared_blocks=148)
    view.emit(1, "stored", q.block_hashes[:74])
    assert r._precise_scores(q, view) == [0.0, 0.5]
    view.emit(1, "removed", q.block_hashes[:1])
    assert r._precise_scores(q, view) == [0.0, 0.0]


def test_precise_min_max_normalisation_of_older_releases():
    # Depths 0, 37, 74, 148 -> hit pods min 37, max 148: 0, 0, 1/3, 1. One hit pod alone: 1.0. No hit: all 0.
    view = FakeView(4)
    r = build(LlmdRouter, n=4, view=view, prefix_cache="precise", prefix_cache_weight=1,
              precise_normalization="min_max")
    q = prompt(1, 7, shared_blocks=148)
    assert r._precise_scores(q, view) == [0.0, 0.0, 0.0, 0.0]
    view.emit(1, "stored", q.block_hashes[:37])
    assert r._precise_scores(q, view) == [0.0, 1.0, 0.0, 0.0]
    view.emit(2, "stored", q.block_hashes[:74])
    view.emit(3, "stored", q.block_hashes)
    assert r._precise_scores(q, view) == [0.0, 0.0, pytest.approx(1 / 3), 1.0]


def test_precise_speculative_indexing_predicts_for_two_seconds():
    view = FakeView(2)
    r = build(LlmdRouter, n=2, view=view, preset="precise", replicas=1)
    q = prompt(1, 7, shared_blocks=148)
    w = send(r, q, view)
    assert r._precise_scores(prompt(2, 7, shared_blocks=148), view)[w] == 1.0
    view.now_s = 2.0
    assert r._precise_scores(prompt(3, 7, shared_blocks=148), view) == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------- picker, determinism
def test_ties_are_broken_uniformly_at_random():
    view = FakeView(4)
    r = build(LlmdRouter, n=4, seed=1, view=view)
    picks = Counter(r.route(prompt(i, 0), view) for i in range(4000))
    assert set(picks) == {0, 1, 2, 3} and all(850 < c < 1150 for c in picks.values())


def test_same_seed_same_choices():
    def run(seed):
        view = FakeView(6)
        r = build(LlmdRouter, seed=seed, view=view, preset="optimized-baseline")
        rng = random.Random(5)
        return [send(r, prompt(i, rng.randrange(4)), view) for i in range(60)]

    assert run(3) == run(3)
    assert run(3) != run(4)
