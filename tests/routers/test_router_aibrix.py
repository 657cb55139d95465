"""AIBrix routers on a fake cluster: each branch of `prefix-cache` (imbalance filter, match %, std gate, fallback),
its routing-history index (TTL, capacity, blind to evictions), and `least-kv-cache`.

The prompts are `router_fakes.prompt`: 2371 tokens = 148 request blocks of 16, the first 127 the prefix's. AIBrix's
chart hashes 128-character blocks = 32 tokens, so its history keys every 2nd block: K = 2371 // 32 = 74 keys, of
which the 63 keys ending at blocks 1, 3, ..., 125 are the prefix's -> a holder matches 63 * 100 // 74 = 85 %.
"""

from __future__ import annotations

import statistics
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.aibrix import AibrixLeastKvCacheRouter, AibrixPrefixCacheRouter, sample_stdev
from sim.engines.interface import EngineLoad
from sim.workloads.request import Request
from tests.support.router_fakes import FakeView, build, prompt, send


def aibrix(n=6, seed=0, view=None, **options):
    view = view if view is not None else FakeView(n)
    return build(AibrixPrefixCacheRouter, n=n, seed=seed, view=view, **options), view


def test_defaults_are_the_deployed_gateways_and_the_index_is_a_20_minute_200k_block_lru():
    r, _ = aibrix()
    o = r.options
    assert (o.state, o.imbalance_abs_count, o.standard_deviation_factor, o.prefix_block_chars) == ("approximate", 16, 2.0, 128)
    spec = r.prefix_state_spec()
    assert (spec.mode, spec.ttl_s, spec.capacity_keys, spec.check_interval_s) == ("approximate", 1200.0, 200_000, 1.0)
    assert (spec.per_worker, spec.prune_to, spec.leaves_first, spec.key_block_tokens) == (False, 1.0, False, 32)


def test_a_holder_gets_its_match_percent_and_wins_when_loads_are_even():
    r, view = aibrix()
    r.prefix.record(prompt(0, 7), 2)  # the gateway sent prefix 7 to pod 2 before
    assert r.match_percents(prompt(1, 7), view) == {2: 85}
    assert r.route(prompt(1, 7), view) == 2


def test_among_equal_matches_the_less_running_pod_wins():
    # Pods 0 and 2 both match 85 %; running [5, 0, 1, 0, 0, 0]: mean 1, sample std sqrt((16+1+0+1+1+1)/5) = 2,
    # bound 1 + 2 * 2 = 5: both pass, and the sort puts pod 2 (running 1) before pod 0 (running 5).
    r, view = aibrix(view=FakeView(6, in_flight=[5, 0, 1, 0, 0, 0]))
    r.prefix.record(prompt(0, 7), 0)
    r.prefix.record(prompt(0, 7), 2)
    assert r.route(prompt(1, 7), view) == 2


def test_the_std_gate_skips_a_busy_best_match_for_the_next_match():
    # running [11, 0, 0, 0, 0, 0]: 11 - 0 <= 16 so not imbalanced; mean 11/6 = 1.83, sample std
    # sqrt((9.17^2 + 5 * 1.83^2)/5) = 4.49, bound 1.83 + 2 * 4.49 = 10.8 < 11: pod 0 (85 %) fails the gate and pod
    # 3, which holds only the first 10 blocks of the prefix (5 keys: 5 * 100 // 74 = 6 %), is taken.
    r, view = aibrix(view=FakeView(6, in_flight=[11, 0, 0, 0, 0, 0]))
    r.prefix.record(prompt(0, 7), 0)
    r.prefix.record(prompt(50, 7, prompt_tokens=160, shared_blocks=10), 3)
    assert r.match_percents(prompt(1, 7), view) == {0: 85, 3: 6}
    assert r.route(prompt(1, 7), view) == 3


@pytest.mark.parametrize("running", [
    [11, 0, 0, 1, 0, 0],  # balanced (11 <= 16), but pod 0's 11 running > mean + 2 sigma: no matched pod passes
    [17, 0, 0, 3, 0, 0],  # imbalanced (17 > 16): the candidates are the least running, and none of them matched
], ids=["gate-rejects-the-match", "imbalanced-no-candidate-matched"])
def test_without_a_usable_match_a_random_least_running_pod_is_taken(running):
    view = FakeView(6, in_flight=running)
    picks = set()
    for seed in range(40):
        r, _ = aibrix(seed=seed, view=view)
        r.prefix.record(prompt(0, 7), 0)
        picks.add(r.route(prompt(1, 7), view))
    assert picks == {1, 2, 4, 5}


def test_imbalance_restricts_the_match_to_the_least_running_pods():
    # running [17, 0, 0, 3, 0, 0]: 17 - 0 > 16 -> candidates {1, 2, 4, 5}. Pod 0 holds the whole prefix but is not a
    # candidate; pod 4 holds its first 10 blocks: the longest match among the candidates, so pod 4 (not random).
    r, view = aibrix(view=FakeView(6, in_flight=[17, 0, 0, 3, 0, 0]))
    r.prefix.record(prompt(0, 7), 0)
    r.prefix.record(prompt(50, 7, prompt_tokens=160, shared_blocks=10), 4)
    assert all(r.route(prompt(i, 7), view) == 4 for i in range(1, 20))




def test_imbalance_threshold_code_default_8_versus_chart_16():
    # Only pod 0 holds the prefix; running [9, 0, 0, 4, 4, 4]: max - min = 9. Chart (16): balanced; mean 3.5,
    # sample std sqrt(55.5 / 5) = 3.33, bound 3.5 + 2 * 3.33 = 10.2 >= 9 -> pod 0. Code defaults (8, 1): 9 > 8 is
    # imbalanced, the candidates are pods 1 and 2, neither matches -> a random one of them.
    view = FakeView(6, in_flight=[9, 0, 0, 4, 4, 4])
    chart, _ = aibrix(view=view)
    code, _ = aibrix(view=view, imbalance_abs_count=8, standard_deviation_factor=1)
    for r in (chart, code):
        r.prefix.record(prompt(0, 7), 0)
    assert chart.route(prompt(1, 7), view) == 0  # 9 <= 16: balanced, pod 0 within the bound
    assert {code.route(prompt(i, 7), view) for i in range(1, 30)} == {1, 2}  # 9 > 8: least running {1, 2}


def test_a_pod_that_matched_only_the_first_block_counts_as_matched_at_zero_percent():
    # A 6,400-token prompt = 200 keys; pod 5 holds its first key only: 1 * 100 // 200 = 0 %, yet it is matched and
    # so beats the (empty) fallback; all pods idle.
    long = Request(1, 6400, 8, tuple(("q", i) for i in range(400)))
    first = Request(0, 32, 8, long.block_hashes[:2])
    r, view = aibrix()
    r.prefix.record(first, 5)
    assert r.match_percents(long, view) == {5: 0}
    assert r.route(long, view) == 5


def test_a_prompt_shorter_than_one_block_has_no_hashes_and_goes_to_a_least_running_pod():
    view = FakeView(3, in_flight=[1, 0, 1])
    r, _ = aibrix(n=3, view=view)
    short = Request(1, 31, 8, (("s", 0),))
    r.prefix.record(short, 0)
    assert r.match_percents(short, view) == {}
    assert r.route(short, view) == 1


def test_every_choice_is_recorded_even_a_fallback_one():
    r, view = aibrix(view=FakeView(6, in_flight=[17, 0, 0, 3, 0, 0]))
    w = send(r, prompt(0, 9), view)  # imbalanced, nothing matched: a least-running pod
    assert w in {1, 2, 4, 5}
    assert r.match_percents(prompt(1, 9), view) == {w: 85}


def test_history_forgets_an_entry_at_the_first_1s_check_20_minutes_after_it_was_recorded():
    r, view = aibrix()
    view.now_s = 0.5
    r.prefix.record(prompt(0, 7), 2)
    view.now_s = 1200.9  # last check at 1200 s: 0.5 + 1200 > 1200, kept
    assert r.match_percents(prompt(1, 7), view) == {2: 85}
    view.now_s = 1201.0  # the check at 1201 s drops it (AIBrix: at the first sweep with age > 20 min, the same one)
    assert r.match_percents(prompt(1, 7), view) == {}


def test_a_new_record_refreshes_the_age():
    r, view = aibrix()
    r.prefix.record(prompt(0, 7), 2)
    view.now_s = 1000.0
    r.prefix.record(prompt(1, 7), 2)
    view.now_s = 2100.0
    assert r.match_percents(prompt(2, 7), view) == {2: 85}


def test_capacity_drops_the_least_recently_recorded_blocks_root_first_at_the_next_check():
    # block_number 100: prefix 7 to pod 0 (74 keys) then prefix 8 to pod 1 (74 keys) = 148 > 100. At the next 1 s
    # check the 48 oldest go: prefix 7's keys 0..47, its root first, so pod 0 no longer matches prefix 7 at all.
    r, view = aibrix(block_number=100)
    r.prefix.record(prompt(0, 7), 0)
    r.prefix.record(prompt(1, 8), 1)
    assert r.match_percents(prompt(2, 7), view) == {0: 85}  # not yet checked
    view.now_s = 1.0
    assert r.match_percents(prompt(2, 7), view) == {}
    assert r.match_percents(prompt(3, 8), view) == {1: 85}


def test_the_history_never_sees_engine_evictions():
    r, view = aibrix()
    r.prefix.record(prompt(0, 7), 2)
    view.emit(2, "cleared")
    assert r.match_percents(prompt(1, 7), view) == {2: 85}


def test_events_state_matches_on_engine_blocks():
    # With KV events the key is the engine block (16 tokens): 127 of 148 blocks -> 127 * 100 // 148 = 85 %.
    r, view = aibrix(state="events")
    view.emit(3, "stored", [("p", 7, i) for i in range(127)])
    assert r.match_percents(prompt(1, 7), view) == {3: 85}
    assert r.route(prompt(1, 7), view) == 3


def test_running_requests_are_all_gateways_counts_or_this_gateways_own():
    view = FakeView(2, in_flight=[20, 0])
    everyone, _ = aibrix(n=2, view=view)
    mine, _ = aibrix(n=2, view=view, running_requests="this_gateway")
    mine.in_flight[:] = [0, 3]
    assert everyone.running(view) == [20, 0] and mine.running(view) == [0, 3]
    assert everyone.route(prompt(1, 7), view) == 1 and mine.route(prompt(1, 7), view) == 0


def test_equal_match_and_load_are_broken_at_random_and_the_same_seed_repeats():
    view = FakeView(6)
    r, _ = aibrix(seed=4, view=view)
    r.prefix.record(prompt(0, 7), 1)
    r.prefix.record(prompt(0, 7), 4)
    picks = Counter(r.route(prompt(i, 7), view) for i in range(400))
    assert set(picks) == {1, 4} and all(150 < c < 250 for c in picks.values())
    runs = []
    for _ in range(2):
        r, v = aibrix(seed=11)
        runs.append([send(r, prompt(i, i % 5), v) for i in range(60)])
    assert runs[0] == runs[1]


def test_a_block_finer_than_the_request_blocks_is_matched_in_whole_request_blocks():
    # The code default, 4 characters = 1 token, is finer than the 16-token request blocks: matched per block.
    r, view = aibrix(prefix_block_chars=4)
    r.prefix.record(prompt(0, 7), 0)
    assert r.prefix.match_tokens(prompt(1, 7))[0] == 127 * 16
    with pytest.raises(ValueError, match="prefix_block_chars"):
        aibrix(prefix_block_chars=130)


# ---------------------------------------------------------------------------------------------- least-kv-cache
def test_least_kv_cache_takes_the_least_scraped_usage_and_the_last_of_equals():
    view = FakeView(4, scraped=[EngineLoad(kv_usage=u) for u in (0.3, 0.1, 0.1, 0.5)],
                    loads=[EngineLoad(kv_usage=0.9)] * 4)
    r = build(AibrixLeastKvCacheRouter, n=4, view=view)
    assert r.route(prompt(1, 0), view) == 2  # 0.1 at pods 1 and 2: `<=` keeps the later one
    assert set(view.scrape_intervals) == {0.05}  # the chart's 50 ms refresh
    assert not AibrixLeastKvCacheRouter.needs_cache_state


def test_least_kv_cache_reads_the_scrape_interval_option():
    view = FakeView(2, scraped=[EngineLoad(kv_usage=0.2), EngineLoad(kv_usage=0.4)])
    r = build(AibrixLeastKvCacheRouter, n=2, view=view, scrape_interval_s=0.5)
    assert r.route(prompt(1, 0), view) == 0 and view.scrape_intervals == [0.5, 0.5]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=2, max_size=16))
def test_sample_stdev_is_statistics_stdev_to_the_last_bit(counts):
    assert sample_stdev(counts) == statistics.stdev(counts)
