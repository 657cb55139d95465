"""SGLang Model Gateway `cache_aware`: each branch of the rule on a fake cluster, with exact expected choices."""

from __future__ import annotations

from collections import Counter

import pytest

from policies.sglang_gateway import SglangCacheAwareRouter as R
from sim.engines.interface import EngineLoad
from tests.support.router_fakes import FakeView, build, prompt, send


def fresh(n=6, seed=0, **options):
    view = FakeView(n)
    return build(R, n=n, seed=seed, view=view, **options), view


def test_defaults_are_the_python_cli_and_the_tree_is_a_per_tenant_history():
    r, _ = fresh()
    o = r.options
    assert (o.cache_threshold, o.balance_abs_threshold, o.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (o.eviction_interval_secs, o.max_tree_size) == (60, 2**26)
    assert (o.balance_token_usage_threshold, o.overload_token_usage_threshold, o.scrape_interval_s) == (1.0, 1.0, 10.0)
    spec = r.prefix_state_spec()
    # 2^26 characters / 4 characters a token / 16 tokens a key = 2^20 keys per worker, checked every 60 s.
    assert (spec.mode, spec.capacity_keys, spec.per_worker, spec.check_interval_s) == ("approximate", 2**20, True, 60.0)
    assert (spec.prune_to, spec.leaves_first, spec.key_block_tokens, spec.ttl_s) == (1.0, True, 16, None)
    assert build(R, eviction_interval_secs=0).prefix_state_spec().capacity_keys is None  # no eviction thread
    assert build(R, tree_budget="shared").prefix_state_spec().per_worker is False


def test_a_miss_goes_to_the_first_least_loaded_worker_and_a_match_above_the_threshold_to_its_tenant():
    r, view = fresh()
    r.in_flight[:] = [1, 1, 1, 1, 0, 1]
    assert send(r, prompt(1, 7), view) == 4  # empty tree: rate 0 -> argmin load
    r.in_flight[:] = [0, 0, 0, 0, 9, 0]
    # The tree holds prefix 7's 127 blocks for worker 4: rate 2032 / 2371 = 0.857 > 0.3 -> worker 4, busy or not.
    assert r.prefix_tokens(prompt(2, 7)) == [0, 0, 0, 0, 2032, 0]
    assert send(r, prompt(2, 7), view) == 4
    r.in_flight[:] = [3, 2, 2, 5, 9, 2]
    assert send(r, prompt(3, 8), view) == 1  # a new prefix: the first of the least-loaded workers 1, 2, 5
    assert view.peeks == 0  # approximate: never a peek into the caches


def test_the_match_rate_must_exceed_the_threshold():
    r, view = fresh()
    r.in_flight[:] = [1, 0, 1, 1, 1, 1]
    send(r, prompt(1, 7, shared_blocks=148), view)  # worker 1 holds prefix 7's blocks
    r.in_flight[:] = [0, 5, 0, 0, 0, 0]
    # 44 shared blocks: 704 / 2371 = 0.297 <= 0.3 -> least loaded (worker 0); 45: 720 / 2371 = 0.304 -> worker 1.
    assert r.route(prompt(2, 7, shared_blocks=44), view) == 0
    assert r.route(prompt(3, 7, shared_blocks=45), view) == 1


def test_imbalance_needs_both_the_absolute_and_the_relative_gap_and_still_inserts_for_the_choice():
    r, view = fresh(n=2)
    r.in_flight[:] = [1, 0]
    send(r, prompt(1, 7), view)  # worker 1
    req = prompt(2, 7)
    r.in_flight[:] = [20, 84]  # 84 - 20 = 64, not > 64: balanced -> the tenant
    assert r.route(req, view) == 1
    r.in_flight[:] = [170, 250]  # 80 > 64 but 250 <= 1.5 x 170 = 255: balanced
    assert r.route(req, view) == 1
    r.in_flight[:] = [20, 100]  # 80 > 64 and 100 > 30: imbalanced -> argmin, worker 0
    assert send(r, req, view) == 0
    # Inserted for worker 0 in the imbalanced branch too: both now hold the prefix.
    assert r.prefix_tokens(prompt(3, 7)) == [2032, 2032]


def test_two_holders_the_tenant_is_the_first_in_the_nodes_hash_order_fixed_per_node_and_per_seed():
    r, view = fresh(n=2)
    r.in_flight[:] = [0, 1]
    assert send(r, prompt(1, 7), view) == 0
    r.in_flight[:] = [100, 0]
    assert send(r, prompt(2, 7), view) == 1  # imbalanced: worker 1 becomes the second holder
    r.in_flight[:] = [0, 0]
    req = prompt(3, 7)
    first = r.hash_order(req, 2032, [0, 1])[0]
    assert [r.route(prompt(i, 7), view) for i in range(3, 8)] == [first] * 5
    # Across nodes (and salts) the order is arbitrary: each worker comes first for some prefixes.
    firsts = Counter(r.hash_order(prompt(0, p), 2032, [0, 1])[0] for p in range(200))
    assert 60 < firsts[0] < 140
    again, _ = fresh(n=2)
    assert again.hash_order(req, 2032, [0, 1]) == r.hash_order(req, 2032, [0, 1])  # same seed, same order


def test_first_inserted_tenant_is_the_node_creator_while_it_holds_it():
    for creator in (0, 1):
        r, view = fresh(n=2, match_tenant="first_inserted")
        r.in_flight[:] = [1, 1]
        r.in_flight[creator] = 0
        assert send(r, prompt(1, 7), view) == creator  # a miss: least loaded
        r.in_flight[:] = [0, 0]
        r.in_flight[creator] = 100  # imbalanced: the other worker gets the prefix too
        assert send(r, prompt(2, 7), view) == 1 - creator
        r.in_flight[:] = [0, 0]
        assert r.route(prompt(3, 7), view) == creator  # both hold the node; its creator wins, whatever the hash


def test_smallest_tree_fallback_takes_the_tenant_with_the_fewest_keys():
    r, view = fresh(n=3, miss_fallback="smallest_tree")
    r.in_flight[:] = [5, 0, 0]
    assert send(r, prompt(1, 7), view) == 0  # all trees empty: the first, although worker 0 is the busiest
    assert send(r, prompt(2, 8), view) == 1  # worker 0 holds 148 keys
    r.in_flight[:] = [0, 0, 9]
    assert send(r, prompt(3, 9), view) == 2  # 148, 148, 0 keys
    with pytest.raises(ValueError, match="smallest_tree"):
        build(R, miss_fallback="smallest_tree", state="exact")


def test_serial_warmups_all_land_on_worker_0_unless_ties_go_to_the_fewest_processed():
    # One request at a time: every worker has 0 in flight, so sglang's min_by_key takes worker 0 for every new
    # prefix; smg #1714 breaks the tie by requests processed so far and spreads them.
    r, view = fresh()
    picks = []
    for p in range(6):
        w = send(r, prompt(p, p), view)
        r.on_complete(prompt(p, p), w)
        picks.append(w)
    assert picks == [0] * 6
    r, view = fresh(min_load_tie="fewest_processed")
    picks = []
    for p in range(6):
        w = send(r, prompt(p, p), view)
        r.on_complete(prompt(p, p), w)
        picks.append(w)
    assert picks == [0, 1, 2, 3, 4, 5]


def test_the_tree_forgets_lru_leaves_over_budget_only_at_the_eviction_tick_and_never_without_the_thread():
    # Budget 200 keys a tenant (200 x 64 characters). Worker 0 routes prefixes 7 then 8 (148 keys each, 296).
    r, view = fresh(n=2, max_tree_size=200 * 64)
    r.in_flight[:] = [0, 1]
    send(r, prompt(1, 7), view)
    view.now_s = 1.0
    send(r, prompt(2, 8), view)
    view.now_s = 59.9
    assert r.prefix_tokens(prompt(3, 7))[0] == 2032  # no tick yet
    view.now_s = 60.0
    # The tick drops 96 keys, the oldest first and deepest first: prefix 7's request keeps its first 52 blocks.
    assert r.prefix_tokens(prompt(3, 7))[0] == 52 * 16
    assert r.prefix_tokens(prompt(3, 8))[0] == 2032
    r, view = fresh(n=2, max_tree_size=200 * 64, eviction_interval_secs=0)
    r.in_flight[:] = [0, 1]
    send(r, prompt(1, 7), view)
    send(r, prompt(2, 8), view)
    view.now_s = 3600.0
    assert r.prefix_tokens(prompt(3, 7))[0] == 2032


def test_token_usage_guards_force_min_load_and_are_read_only_when_on():
    r, view = fresh(n=2)
    r.in_flight[:] = [1, 0]
    send(r, prompt(1, 7), view)  # worker 1 is the tenant
    view.scraped = [EngineLoad(kv_usage=0.1), EngineLoad(kv_usage=0.95)]
    r.in_flight[:] = [0, 1]
    assert r.route(prompt(2, 7), view) == 1 and view.scrape_intervals == []  # both guards off (1.0)
    r, view = fresh(n=2, balance_token_usage_threshold=0.5)
    r.in_flight[:] = [1, 0]
    send(r, prompt(1, 7), view)
    view.scraped = [EngineLoad(kv_usage=0.1), EngineLoad(kv_usage=0.7)]
    r.in_flight[:] = [0, 1]
    assert r.route(prompt(2, 7), view) == 0  # spread 0.6 > 0.5 -> min load, though worker 1 holds the prefix
    view.scraped = [EngineLoad(kv_usage=0.3), EngineLoad(kv_usage=0.7)]
    assert r.route(prompt(2, 7), view) == 1  # spread 0.4
    assert set(view.scrape_intervals) == {10.0}
    r, view = fresh(n=2, overload_token_usage_threshold=0.9)
    r.in_flight[:] = [1, 0]
    send(r, prompt(1, 7), view)
    view.scraped = [EngineLoad(kv_usage=0.85), EngineLoad(kv_usage=0.92)]
    r.in_flight[:] = [0, 1]
    assert r.route(prompt(2, 7), view) == 0  # 0.92 > 0.9: overloaded


def test_per_request_gate_takes_the_least_loaded_holder_and_spills_a_hot_one():
    r, view = fresh(n=3, load_gate="per_request")
    r.in_flight[:] = [0, 1, 1]
    assert send(r, prompt(1, 7), view) == 0
    # No global switch under per_request. A hit on worker 0 at 200 in flight: mean 66.7, 200 > 1.5 x 66.7 and
    # 200 > 66.7 + 64 -> spilled to the least-loaded worker 1, which becomes a second holder.
    r.in_flight[:] = [200, 0, 0]
    assert send(r, prompt(2, 7), view) == 1
    r.in_flight[:] = [4, 3, 0]
    assert r.route(prompt(3, 7), view) == 1  # holders 0 and 1: the less loaded one (3 < 1.5 x 2.33), not idle 2
    r.in_flight[:] = [3, 3, 0]
    picks = Counter(r.route(prompt(4, 7), view) for _ in range(400))  # a load tie: uniformly at random
    assert set(picks) == {0, 1} and 140 < picks[0] < 260


def test_same_seed_same_choices():
    def run(seed):
        r, view = fresh(seed=seed, min_load_tie="first")
        picks = []
        for i in range(60):
            w = send(r, prompt(i, i % 9), view)
            picks.append(w)
            if i % 3 == 0:
                r.on_complete(prompt(i, i % 9), w)
        return picks
    assert run(5) == run(5)
