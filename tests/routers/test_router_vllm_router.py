"""vLLM production-stack routers on a fake cluster: the QPS fallback, the session ring, the prefix trie and
`loadaware`'s score, each with exact expected choices.

Prompts are `router_fakes.prompt`: 2371 tokens = 148 request blocks of 16, the first 127 the prefix's. The trie's
128-character chunks are 32-token keys (every 2nd block): 74 keys, the first 63 the prefix's, so a holder of the
prefix matches 63 x 128 = 8,064 characters.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import replace

from policies.vllm_router import VllmRouterLoadAware, VllmRouterPrefixAware, VllmRouterSession
from sim.workloads.request import Request
from tests.support.router_fakes import FakeView, build, prompt, send


def anonymous(rid):
    """A request with no session key (prefix_id None)."""
    r = prompt(rid, 1000 + rid)
    return Request(r.request_id, r.prompt_tokens, r.output_tokens, r.block_hashes)


# ---------------------------------------------------------------------------------------------- _qps_routing
def test_qps_routing_takes_an_endpoint_without_stats_then_the_lowest_60s_arrival_qps_first_of_equals():
    view = FakeView(6)
    r = build(VllmRouterSession, view=view)
    assert [send(r, anonymous(i), view) for i in range(6)] == [0, 1, 2, 3, 4, 5]  # each unseen one at once
    view.now_s = 10.0
    assert send(r, anonymous(6), view) == 0  # all at 1/60 qps: the first of equals
    view.now_s = 59.0
    assert send(r, anonymous(7), view) == 1  # worker 0 now at 2/60
    view.now_s = 60.5  # the t=0 arrivals left the window [0.5, 60.5]; worker 0 keeps t=10, worker 1 t=59
    assert [round(r.qps(w, 60.5) * 60) for w in range(6)] == [1, 1, 0, 0, 0, 0]
    assert send(r, anonymous(8), view) == 2  # an emptied window still counts as stats (qps 0), first of the zeros


def test_qps_window_option():
    view = FakeView(2)
    r = build(VllmRouterSession, n=2, view=view, request_stats_window_s=5.0)
    send(r, anonymous(0), view), send(r, anonymous(1), view)
    view.now_s = 1.0
    send(r, anonymous(2), view)  # -> 0 (equal qps)
    view.now_s = 5.5  # worker 0's t=0 arrival and worker 1's have left a 5 s window; worker 0 keeps its t=1
    assert send(r, anonymous(3), view) == 1


# ---------------------------------------------------------------------------------------------- session
def naive_ring_node(key, num_workers, vnodes=160):
    """uhashring's default ring written out: the smallest point strictly above md5(str(key)), else the first."""
    md5 = lambda s: int(hashlib.md5(s.encode()).hexdigest(), 16)  # noqa: E731
    points = {md5(f"worker-{w}-{i}"): w for w in range(num_workers) for i in range(vnodes)}
    h = md5(str(key))
    above = [p for p in points if p > h]
    return points[min(above)] if above else points[min(points)]


def test_session_follows_the_uhashring_ring_and_never_reads_load():
    view = FakeView(6, in_flight=[50, 0, 0, 0, 0, 0])
    r = build(VllmRouterSession, view=view)
    assert len(r._points) == 6 * 160
    for session in range(40):
        assert r.route(prompt(session, session), view) == naive_ring_node(session, 6)
    homes = {s: send(r, prompt(100 + s, s), view) for s in range(60)}
    assert all(send(r, prompt(200 + s, s), view) == homes[s] for s in range(60))  # sticky, whatever the load
    assert len(set(homes.values())) == 6


def test_session_keys_on_the_session_id_and_falls_back_to_the_prefix_without_one():
    # Two sessions of the same prefix 7 go to their own ring nodes, every turn; a request of a workload without
    # sessions keys on its prefix_id as before (kvsim's stand-in); neither -> _qps_routing (the first endpoint
    # without stats).
    view = FakeView(6)
    r = build(VllmRouterSession, view=view)
    homes = {s: naive_ring_node(("session", s), 6) for s in range(40)}
    assert len(set(homes.values())) == 6
    for turn in range(3):
        assert all(send(r, replace(prompt(100 * turn + s, 7), session_id=s), view) == homes[s] for s in range(40))
    assert send(r, prompt(500, 7), view) == naive_ring_node(7, 6)
    fresh = build(VllmRouterSession, view=view)
    assert send(fresh, anonymous(1), view) == 0


def test_session_vnodes_option_changes_the_ring():
    r = build(VllmRouterSession, vnodes=40)
    assert len(r._points) == 6 * 40
    assert all(r.ring_node(s) == naive_ring_node(s, 6, vnodes=40) for s in range(40))


# ---------------------------------------------------------------------------------------------- prefixaware
def test_prefix_aware_index_is_a_32_token_history_that_never_forgets():
    r = build(VllmRouterPrefixAware)
    spec = r.prefix_state_spec()
    assert (spec.mode, spec.ttl_s, spec.capacity_keys, spec.key_block_tokens) == ("approximate", None, None, 32)
    assert r.options.prefix_min_match_length == 0 and r.needs_cache_state


def test_prefix_aware_miss_is_uniformly_random_and_a_hit_sticks():
    view = FakeView(6)
    r = build(VllmRouterPrefixAware, seed=2, view=view)
    picks = Counter(send(r, prompt(i, i), view) for i in range(1200))  # 1,200 distinct prefixes: all misses
    assert set(picks) == set(range(6)) and all(150 < c < 250 for c in picks.values())
    home = send(r, prompt(5000, 77), view)
    assert all(send(r, prompt(5001 + i, 77), view) == home for i in range(30))


def test_prefix_aware_longest_match_wins_and_equal_holders_are_random():
    # Worker 2 holds the whole prefix (63 keys), worker 4 its first 10 blocks (5 keys): the walk narrows to {2}.
    view = FakeView(6)
    r = build(VllmRouterPrefixAware, view=view)
    r.prefix.record(prompt(0, 7), 2)
    r.prefix.record(prompt(50, 7, prompt_tokens=160, shared_blocks=10), 4)
    assert r.longest_match(prompt(1, 7)) == (63 * 128, [2])
    assert r.route(prompt(1, 7), view) == 2
    r.prefix.record(prompt(51, 7), 5)  # worker 5 now holds the same 63 keys
    assert Counter(r.route(prompt(i, 7), view) for i in range(300)).keys() == {2, 5}


def test_prefix_aware_min_match_length_is_in_characters_and_falls_back_to_qps_but_still_records():
    view = FakeView(3)
    strict = build(VllmRouterPrefixAware, n=3, view=view, prefix_min_match_length=8065)
    exact = build(VllmRouterPrefixAware, n=3, view=view, prefix_min_match_length=8064)
    for r in (strict, exact):
        r.prefix.record(prompt(0, 7), 2)
    assert exact.route(prompt(1, 7), view) == 2  # 8,064 is not below 8,064
    assert send(strict, prompt(1, 7), view) == 0  # 8,064 < 8,065 -> _qps_routing: worker 0 has no stats
    assert strict.longest_match(prompt(2, 7)) == (63 * 128, [0, 2])  # the fallback choice was inserted too


def test_prefix_aware_never_sees_evictions_and_never_ages():
    view = FakeView(3)
    r = build(VllmRouterPrefixAware, n=3, view=view)
    r.prefix.record(prompt(0, 7), 1)
    view.emit(1, "cleared")
    view.now_s = 1e7
    assert r.route(prompt(1, 7), view) == 1


def test_prefix_aware_same_seed_same_choices():
    runs = []
    for _ in range(2):
        view = FakeView(6)
        r = build(VllmRouterPrefixAware, seed=9, view=view)
        runs.append([send(r, prompt(i, i % 7), view) for i in range(80)])
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------------------------------- loadaware
def cached(n, holders):
    """FakeView whose worker w holds the first holders[w] blocks of prefix 7."""
    return FakeView(n, cached={w: {("p", 7, i) for i in range(holders.get(w, 0))} for w in range(n)})


def test_loadaware_warm_but_busy_loses_to_cold_but_idle():
    # 2,000-token prompt, worker 0 caches 100 blocks = 1,600 tokens: benefit 0.8. In flight [3, 1], mean 2:
    # relative loads [+0.5, -0.5]; scores [0.8 - 0.5, 0 + 0.5] = [0.3, 0.5] -> worker 1.
    req = prompt(1, 7, prompt_tokens=2000, shared_blocks=100)
    view = cached(2, {0: 100})
    r = build(VllmRouterLoadAware, n=2, view=view)
    r.in_flight[:] = [3, 1]
    scores, matched = r.scores(req)
    assert matched == [1600, 0] and scores == [0.8 - 0.5, 0.5]
    assert r.route(req, view) == 1
    r.in_flight[:] = [1, 1]  # even load: the cache decides
    assert r.route(req, view) == 0


def test_loadaware_mean_below_one_is_clamped_and_beta_weighs_the_load():
    # In flight [1, 0]: mean 0.5, divided by max(1, 0.5) = 1 -> relative [+0.5, -0.5]: [0.3, 0.5] -> worker 1.
    # beta 0.2: [0.8 - 0.1, 0.1] -> worker 0.
    req = prompt(1, 7, prompt_tokens=2000, shared_blocks=100)
    view = cached(2, {0: 100})
    r = build(VllmRouterLoadAware, n=2, view=view)
    lenient = build(VllmRouterLoadAware, n=2, view=view, loadaware_beta=0.2)
    r.in_flight[:] = lenient.in_flight[:] = [1, 0]
    assert r.route(req, view) == 1 and lenient.route(req, view) == 0


def test_loadaware_ties_go_to_the_first_endpoint_and_load_is_the_routers_own():
    view = cached(4, {1: 127, 3: 127})
    view.in_flight_counts[:] = [0, 9, 0, 0]  # the cluster's count: not what loadaware reads
    r = build(VllmRouterLoadAware, n=4, view=view)
    assert r.route(prompt(1, 7), view) == 1  # workers 1 and 3 score the same: the first wins


def test_loadaware_with_no_holder_falls_back_to_qps_or_the_session_ring():
    view = FakeView(3)
    r = build(VllmRouterLoadAware, n=3, view=view)
    assert [send(r, prompt(i, 7), view) for i in range(3)] == [0, 1, 2]  # nothing cached: _qps_routing
    ringed = build(VllmRouterLoadAware, n=3, view=view, session_key=True)
    assert ringed.route(prompt(9, 7), view) == naive_ring_node(7, 3)
    assert ringed.route(anonymous(9), view) == 0
    assert ringed.route(replace(prompt(9, 7), session_id=5), view) == naive_ring_node(("session", 5), 3)


def test_loadaware_reads_events_with_lag():
    view = FakeView(2)
    r = build(VllmRouterLoadAware, n=2, view=view, state="events", event_lag_s=1.0)
    view.emit(1, "stored", [("p", 7, i) for i in range(127)])
    assert r.scores(prompt(1, 7))[1] == [0, 0]  # not applied yet
    view.now_s = 1.0
    assert r.scores(prompt(1, 7))[1] == [0, 127 * 16]
    assert r.route(prompt(1, 7), view) == 1
