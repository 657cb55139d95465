"""kv-aware (Dynamo's KV router) on a fake cluster: the default cost (prefill blocks after the overlap plus active
blocks) and what it trades, the active-block and prefill tracking, ties and temperature, and Dynamo's newest scorer
and options: overlap credit, prefill load scale, the deprecated weight, lmetric, approximate-mode pruning defaults
and predicted TTL."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from policies.kv_aware import KvAwareRouter
from sim.workloads.request import Request
from tests.support.router_fakes import B, FakeView, build, prompt, send

ISL = 2371  # prompt(): 148 full blocks of 16 tokens (+3 tokens), the first 127 the prefix's


def holding(n, worker_blocks):
    """A view whose worker w caches the first `worker_blocks[w]` blocks of prefix 7."""
    return FakeView(n, cached={w: {("p", 7, i) for i in range(worker_blocks.get(w, 0))} for w in range(n)})


def legacy_cost(prefill_tokens, overlap_blocks, decode_blocks, weight=1.0):
    """The pre-2026 form: weight * (P + ISL - overlap * B) / B + decode."""
    return weight * (prefill_tokens + ISL - overlap_blocks * B) / B + decode_blocks


def test_defaults_are_dynamos_and_give_the_legacy_cost_bit_for_bit():
    # Worker 1 holds 127 blocks and carries one other request still in prefill (2,371 tokens, 148 active blocks);
    # worker 0 holds nothing. Credit 1, scale 1: the newest form max((P + ISL)/B - overlap, 0) + decode equals the
    # old (P + ISL - overlap*B)/B + decode exactly (B = 16: every term is an exact float).
    view = holding(2, {1: 127})
    r = build(KvAwareRouter, n=2, view=view)
    o = r.options
    assert (o.overlap_score_credit, o.prefill_load_scale, o.overlap_score_weight, o.temperature) == (1.0, 1.0, None, 0.0)
    assert (o.router_selection_policy, o.router_ttl_s, o.router_max_tree_size, o.router_prune_target_ratio,
            o.router_predicted_ttl_s) == ("default", 120.0, 1048576, 0.8, None)
    r.on_dispatch(prompt(50, 3), 1)
    costs, overlap = r.costs(prompt(1, 7), view)
    assert overlap == [0, 127]
    assert costs == [legacy_cost(0, 0, 148), legacy_cost(ISL, 127, 148 + 148)]
    assert costs == [148.1875 + 148, 148.1875 * 2 - 127 + 296]


def test_kv_aware_a_busy_prefix_holder_loses_to_an_idle_worker():
    # The trade-off of Dynamo's default cost: the prefix saves 127 prefill blocks, but one in-flight request with
    # another prefix on that worker adds its 148 active blocks.
    view = FakeView(2, cached={0: {("p", 7, i) for i in range(127)}, 1: set()})
    r = build(KvAwareRouter, n=2, view=view)
    other = prompt(50, 3)
    r.on_dispatch(other, 0)
    r.on_first_token(other, 0)  # its prefill is done; its blocks stay active until completion
    costs, _ = r.costs(prompt(1, 7), view)
    assert costs == [pytest.approx(2371 / 16 - 127 + 148 + 148), pytest.approx(2371 / 16 + 148)]
    assert r.route(prompt(1, 7), view) == 1
    r.on_complete(other, 0)
    assert r.route(prompt(2, 7), view) == 0


def test_kv_aware_tracks_prefill_tokens_until_the_first_token():
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view)
    a = prompt(1, 7)
    w = r.route(a, view)
    r.on_dispatch(a, w)
    costs, _ = r.costs(prompt(2, 8), view)
    # The loaded worker carries a's 2371 prefill tokens and 148 active blocks.
    assert costs[w] - costs[1 - w] == pytest.approx(2371 / 16 + 148)
    r.on_first_token(a, w)
    costs, _ = r.costs(prompt(2, 8), view)
    assert costs[w] - costs[1 - w] == pytest.approx(148)


def test_kv_aware_shares_active_blocks_of_the_same_prefix():
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view)
    a = prompt(1, 7)
    r.on_dispatch(a, 0)
    r.on_first_token(a, 0)
    costs, _ = r.costs(prompt(2, 7), view)
    # On worker 0 only the 21 unique blocks of the new request are new: 148 active + 21 new.
    assert costs[0] == pytest.approx(2371 / 16 + 148 + 21)


def test_kv_aware_ties_are_broken_uniformly_at_random():
    view = FakeView(4)
    r = build(KvAwareRouter, n=4, seed=1, view=view)
    picks = Counter(r.route(prompt(i, 0), view) for i in range(4000))
    assert set(picks) == {0, 1, 2, 3} and all(850 < c < 1150 for c in picks.values())


def test_kv_aware_overlap_is_each_workers_run_from_the_first_block():
    # Worker 0 has blocks 0-1, worker 1 has blocks 0-3: overlaps 2 and 4. Worker 2 has only block 3 and worker 3
    # blocks 0, 1 and 3: in Dynamo's tree walk (RadixTree::find_matches) a worker drops out at the first block it
    # lacks and scores the depth it reached, even where another worker keeps the path alive: 0 and 2.
    h = [("p", 0, i) for i in range(6)]
    view = FakeView(4, cached={0: set(h[:2]), 1: set(h[:4]), 2: {h[3]}, 3: {h[0], h[1], h[3]}})
    r = build(KvAwareRouter, n=4, view=view)
    _, overlap = r.costs(Request(1, 100, 1, tuple(h)), view)
    assert overlap == [2, 4, 0, 2]


def test_kv_aware_weight_zero_routes_by_load_and_peeks_nothing():
    view = FakeView(2, cached={0: {("p", 7, i) for i in range(127)}, 1: set()})
    r = build(KvAwareRouter, n=2, view=view, overlap_score_weight=0.0)
    _, overlap = r.costs(prompt(1, 7), view)
    assert overlap == [0, 0] and view.peeks == 0


def test_kv_aware_temperature_spreads_choices():
    view = FakeView(2, cached={0: {("p", 7, i) for i in range(127)}, 1: set()})
    r = build(KvAwareRouter, n=2, seed=0, view=view, temperature=1.0)
    picks = Counter(r.route(prompt(i, 7), view) for i in range(2000))
    # p1/p0 = exp(-1): worker 1 gets about 27% of the requests.
    assert 0.22 < picks[1] / 2000 < 0.32


def test_a_credit_of_half_halves_the_overlaps_discount():
    # Worker 0 holds the 127 prefix blocks. Credit 1: prefill 148.1875 - 127 = 21.1875 blocks; credit 0.5:
    # 148.1875 - 63.5 = 84.6875. Worker 1 (no overlap) is unchanged at 148.1875 prefill blocks.
    view = holding(2, {0: 127})
    full, half = build(KvAwareRouter, n=2, view=view), build(KvAwareRouter, n=2, view=view, overlap_score_credit=0.5)
    assert full.costs(prompt(1, 7), view)[0] == [21.1875 + 148, 148.1875 + 148]
    assert half.costs(prompt(1, 7), view)[0] == [84.6875 + 148, 148.1875 + 148]


def test_the_credit_flips_a_choice_between_a_warm_busy_worker_and_an_idle_cold_one():
    # Worker 0 holds the 127 blocks and runs another request of the same prefix (prefill done): its 148 active
    # blocks are shared, so the new request adds only its 21 own (decode 169). Worker 1 is idle and cold:
    # 148.1875 + 148 = 296.1875. Credit 1: 148.1875 - 127 + 169 = 190.1875 -> worker 0; credit 0.1 (12.7 blocks
    # off): 304.4875 -> worker 1.
    view = holding(2, {0: 127})
    for credit, expected in ((1.0, 0), (0.1, 1)):
        r = build(KvAwareRouter, n=2, view=view, overlap_score_credit=credit)
        same_prefix = prompt(50, 7)
        r.on_dispatch(same_prefix, 0)
        r.on_first_token(same_prefix, 0)
        costs, _ = r.costs(prompt(1, 7), view)
        assert costs[1] == 148.1875 + 148
        assert costs[0] == pytest.approx(148.1875 - credit * 127 + 169)
        assert r.route(prompt(1, 7), view) == expected


def test_prefill_load_scale_weighs_the_adjusted_prefill_after_the_credit():
    # Scale 2 doubles the adjusted prefill only: worker 0 (127 cached) 2 * 21.1875 + 148, worker 1 2 * 148.1875 + 148.
    view = holding(2, {0: 127})
    r = build(KvAwareRouter, n=2, view=view, prefill_load_scale=2.0)
    assert r.costs(prompt(1, 7), view)[0] == [42.375 + 148, 296.375 + 148]


def test_adjusted_prefill_is_clamped_at_zero():
    # A 64-token prompt of 4 blocks, all 4 cached on worker 0: raw prefill 64/16 = 4 blocks, credit 4, adjusted 0;
    # the cost is the decode blocks alone (4 new blocks).
    hashes = tuple(("p", 7, i) for i in range(4))
    view = holding(2, {0: 4})
    r = build(KvAwareRouter, n=2, view=view)
    costs, overlap = r.costs(Request(1, 64, 1, hashes), view)
    assert overlap == [4, 0] and costs == [0.0 + 4, 4.0 + 4]


def test_deprecated_weight_maps_to_the_scale_and_zero_also_zeroes_the_credit():
    # overlap_score_weight=2 -> prefill_load_scale 2 (credit stays 1); =0 -> scale 0 and credit 0: no peeks, cost =
    # decode blocks; Dynamo's mapping overrides an explicit prefill_load_scale.
    view = holding(2, {0: 127})
    two = build(KvAwareRouter, n=2, view=view, overlap_score_weight=2.0, prefill_load_scale=5.0)
    assert (two.prefill_load_scale, two.overlap_score_credit) == (2.0, 1.0)
    assert two.costs(prompt(1, 7), view)[0] == [42.375 + 148, 296.375 + 148]
    zero = build(KvAwareRouter, n=2, view=view, overlap_score_weight=0.0)
    peeks = view.peeks
    assert (zero.prefill_load_scale, zero.overlap_score_credit) == (0.0, 0.0)
    assert zero.costs(prompt(1, 7), view) == ([148.0, 148.0], [0, 0]) and view.peeks == peeks


def test_credit_out_of_range_is_rejected_like_dynamo():
    with pytest.raises(ValueError, match="overlap_score_credit"):
        build(KvAwareRouter, overlap_score_credit=1.5)


# ---------------------------------------------------------------------------------------------------- lmetric
def test_lmetric_is_new_prefill_tokens_times_batch_size_and_ties_go_to_the_lowest_worker():
    # Worker 1 holds 127 blocks and runs 3 requests: (2371 - 2032) * 4 = 1356; worker 0 is cold and idle:
    # 2371 * 1 = 2371; worker 2 cold with 1 request: 4742. Worker 1 wins. Two idle cold workers tie: worker 0.
    view = holding(3, {1: 127})
    r = build(KvAwareRouter, n=3, view=view, router_selection_policy="lmetric", lmetric_hotspot_detection=False)
    r.in_flight[:] = [0, 3, 1]
    scores, _ = r.costs(prompt(1, 7), view)
    assert scores == [2371.0, 1356.0, 4742.0]
    assert r.route(prompt(1, 7), view) == 1
    cold = build(KvAwareRouter, n=3, view=FakeView(3), router_selection_policy="lmetric")
    assert {cold.route(prompt(i, 9), FakeView(3)) for i in range(20)} == {0}


def test_lmetric_picks_the_warm_busy_worker_where_the_default_cost_picks_the_idle_one():
    # Worker 0 holds the 127 prefix blocks and has one other-prefix request in flight (prefill done); worker 1 is
    # idle. Default: worker 0 = 21.1875 + 148 + 148 = 317.1875 > worker 1 = 148.1875 + 148 = 296.1875 -> worker 1.
    # lmetric: worker 0 = 339 * 2 = 678 < worker 1 = 2371 * 1 -> worker 0.
    view = holding(2, {0: 127})
    default = build(KvAwareRouter, n=2, view=view)
    lmetric = build(KvAwareRouter, n=2, view=view, router_selection_policy="lmetric")
    for r in (default, lmetric):
        other = prompt(50, 3)
        r.on_dispatch(other, 0)
        r.on_first_token(other, 0)
    assert default.route(prompt(1, 7), view) == 1
    assert lmetric.costs(prompt(1, 7), view)[0] == [678.0, 2371.0]
    assert lmetric.route(prompt(1, 7), view) == 0


def test_lmetric_full_hit_still_prefills_one_token():
    # A 64-token prompt fully cached on both workers: new prefill max(0, 1) = 1 token each, so the batch sizes decide
    # (1 x 4 vs 1 x 2): worker 1.
    hashes = tuple(("p", 7, i) for i in range(4))
    view = holding(2, {0: 4, 1: 4})
    r = build(KvAwareRouter, n=2, view=view, router_selection_policy="lmetric")
    r.in_flight[:] = [3, 1]
    assert r.costs(Request(1, 64, 1, hashes), view)[0] == [4.0, 2.0]


def test_lmetric_hotspot_diverts_after_a_streak_of_twice_the_holders():
    # Dynamo's own example (lmetric.rs tests): 4 workers, class = the first 2 blocks, window 4. Worker 0 holds the
    # prompt and runs 2 requests, workers 1-3 are cold with 1 each. The class is every arrival (share 1 > 1/4): an
    # alarm; worker 0 is best (1 token x 3 = 3 < 64 x 2 = 128), streak 1 < 2|M| = 2 -> worker 0; the second request's streak 2
    # -> the best non-holder, worker 1 (ties among 1-3 to the lowest).
    hashes = tuple(("p", 7, i) for i in range(4))
    view = holding(4, {0: 4})
    r = build(KvAwareRouter, n=4, view=view, router_selection_policy="lmetric", lmetric_class_prefix_blocks=2,
              lmetric_window_requests=4)
    r.in_flight[:] = [2, 1, 1, 1]
    req = Request(1, 64, 1, hashes)
    assert r.route(req, view) == 0
    assert r.route(req, view) == 1
    assert r.route(req, view) == 1  # the streak (3) is not reset by a diversion


def test_lmetric_hotspot_is_quiet_within_the_class_coverage():
    # Two of four workers hold class 7; it alternates with class 8, so its share settles at 1/2, where
    # x/(1-x) = 1 does not exceed |M|/|M'| = 1: class 7 always goes to its best holder, worker 0.
    def req(rid, cls):
        return Request(rid, 64, 1, tuple(("p", cls, i) for i in range(4)))

    view = holding(4, {0: 4, 1: 4})
    r = build(KvAwareRouter, n=4, view=view, router_selection_policy="lmetric", lmetric_class_prefix_blocks=2,
              lmetric_window_requests=4)
    r.in_flight[:] = [2, 2, 1, 1]
    for i in range(4):
        assert r.route(req(2 * i, 7), view) == 0
        r.route(req(2 * i + 1, 8), view)


def test_lmetric_ignores_the_temperature():
    view = holding(2, {1: 127})
    # (The detector is off: with it, this one-class stream would alarm and divert every request after the second.)
    r = build(KvAwareRouter, n=2, view=view, router_selection_policy="lmetric", temperature=5.0,
              lmetric_hotspot_detection=False)
    assert {r.route(prompt(i, 7), view) for i in range(50)} == {1}


# ------------------------------------------------------------------------------------------------ prefix state
def test_approximate_state_uses_dynamos_prune_config_and_forgets_exactly_at_120_s():
    # Approximate mode: worker 3 is credited with the request's 148 blocks from the moment it is routed there, kept
    # at t = 119.999 s and gone at t = 120 s (expired when now >= insert + ttl); it never saw the caches.
    view = FakeView(6)
    r = build(KvAwareRouter, view=view, state="approximate")
    spec = r.prefix_state_spec()
    assert (spec.mode, spec.ttl_s, spec.capacity_keys, spec.prune_to, spec.leaves_first, spec.check_interval_s) == (
        "approximate", 120.0, 2**20, 0.8, True, 0.0)
    req = prompt(1, 7)
    view.now_s = 0.0
    r.on_dispatch(req, 3)
    view.now_s = 119.999
    assert r.overlaps(prompt(2, 7), view) == [0, 0, 0, 127, 0, 0]
    view.now_s = 120.0
    assert r.overlaps(prompt(2, 7), view) == [0] * 6
    assert view.peeks == 0


def test_approximate_ttl_is_refreshed_only_by_reinsertion():
    # Routed to worker 0 at t=0 and again at t=100: kept until 220 s. A lookup at t=110 refreshes nothing.
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view, state="approximate")
    r.on_dispatch(prompt(1, 7), 0)
    view.now_s = 100.0
    r.on_dispatch(prompt(2, 7), 0)
    view.now_s = 110.0
    assert r.overlaps(prompt(3, 7), view) == [127, 0]
    view.now_s = 219.9
    assert r.overlaps(prompt(3, 7), view) == [127, 0]
    view.now_s = 220.0
    assert r.overlaps(prompt(3, 7), view) == [0, 0]


def test_approximate_tree_prunes_to_the_target_earliest_expiring_deepest_first():
    # Max 200 (block, worker) entries, target 0.8 -> 160. Request a (148 blocks) at t=0 on worker 0, request b
    # (another prefix, 148 blocks) at t=1 on worker 1: 296 > 200, prune to 160 by dropping 136 of a's entries,
    # deepest first: a keeps its first 12 blocks, b all 148.
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view, state="approximate", router_max_tree_size=200)
    r.on_dispatch(prompt(1, 7), 0)
    view.now_s = 1.0
    r.on_dispatch(prompt(2, 8), 1)
    assert r.overlaps(prompt(3, 7), view) == [12, 0]
    assert r.overlaps(prompt(4, 8), view) == [0, 127]


def test_predicted_ttl_counts_a_just_routed_prefix_before_its_events_arrive():
    # Events mode with a 0.5 s event lag: right after request 1 goes to worker 2 (no event yet), a plain event index
    # sees nothing; with router_predicted_ttl_s=5 the side index credits worker 2 with the 148 routed blocks
    # (127 of them the next request's prefix), until 5 s after the decision.
    view = FakeView(4)
    plain = build(KvAwareRouter, n=4, view=view, state="events", event_lag_s=0.5)
    predicted = build(KvAwareRouter, n=4, view=view, state="events", event_lag_s=0.5, router_predicted_ttl_s=5.0)
    for r in (plain, predicted):
        r.on_dispatch(prompt(1, 7), 2)
    view.now_s = 0.1
    assert plain.overlaps(prompt(2, 7), view) == [0, 0, 0, 0]
    assert predicted.overlaps(prompt(2, 7), view) == [0, 0, 127, 0]
    view.now_s = 5.0
    assert predicted.overlaps(prompt(3, 7), view) == [0, 0, 0, 0]


def test_predicted_ttl_needs_events():
    with pytest.raises(ValueError, match="router_predicted_ttl_s needs state=events"):
        build(KvAwareRouter, router_predicted_ttl_s=5.0)


def test_same_seed_same_choices_with_the_new_options():
    def choices(seed, **options):
        view = holding(6, {1: 127, 4: 60})
        r = build(KvAwareRouter, seed=seed, view=view, **options)
        out = []
        for i in range(30):
            q = prompt(i, 7 if i % 2 else i)
            out.append(send(r, q, view))
            if i % 4 == 3:
                r.on_complete(q, out[-1])
        return out

    for options in ({"overlap_score_credit": 0.5, "temperature": 0.5}, {"router_selection_policy": "lmetric"}):
        assert choices(3, **options) == choices(3, **options)
    assert choices(3, temperature=0.5) != choices(4, temperature=0.5)


# ---------------------------------------------------------------------------------------------- session affinity
def turn(rid, session, prefix=7):
    """A prompt of prefix `prefix` sent by session `session` (Dynamo: the X-Dynamo-Session-ID header)."""
    return replace(prompt(rid, prefix), session_id=session)


def finish(r, request, worker, view, at_s):
    view.now_s = at_s
    r.on_first_token(request, worker)
    r.on_complete(request, worker)


def busy_holder(mode="hard", ttl_s=60, **options):
    """Worker 1 holds prefix 7. Session 1's first turn goes there by cost and completes at t=10; then another prompt
    still in prefill on worker 1 makes the cost prefer worker 0: 148.1875 + 148 = 296.1875 against
    (2371 + 2371) / 16 - 127 + 148 + 148 = 465.375."""
    view = holding(2, {1: 127})
    r = build(KvAwareRouter, n=2, view=view, session_affinity_ttl_s=ttl_s, session_affinity_mode=mode, **options)
    first = turn(1, session=1)
    assert send(r, first, view) == 1
    finish(r, first, 1, view, at_s=10.0)
    r.on_dispatch(prompt(50, 3), 1)
    return r, view


def test_session_affinity_defaults_are_dynamos_off():
    o = build(KvAwareRouter).options
    assert (o.session_affinity_ttl_s, o.session_affinity_mode, o.enable_session_prefix_index) == (None, "hard", False)
    with pytest.raises(ValueError, match="session_affinity_ttl_s"):
        build(KvAwareRouter, session_affinity_ttl_s=0)
    with pytest.raises(ValueError, match="session_affinity_mode"):
        build(KvAwareRouter, session_affinity_mode="sticky")


def test_hard_affinity_keeps_a_session_on_its_worker_against_the_cost():
    r, view = busy_holder()
    costs, _ = r.costs(turn(2, session=1), view)
    assert costs == [296.1875, 465.375]
    view.now_s = 20.0
    assert send(r, turn(2, session=1), view) == 1  # pinned: the cost is not compared
    assert send(r, turn(3, session=2), view) == 0  # another session, unbound: the cost
    off, view = busy_holder(ttl_s=None)
    view.now_s = 20.0
    assert send(off, turn(2, session=1), view) == 0  # affinity off: the session is not followed


def test_the_ttl_is_idle_time_from_the_last_response_and_requests_in_flight_hold_the_binding():
    # Bound at t=0, the first turn completes at t=10: idle deadline 70. At t=69.9 the session is still bound, and
    # that arrival does not move the deadline; while it is in flight nothing expires (t=150 and its completion at
    # t=200 -> deadline 260). At t=260 (>= the deadline, nothing in flight) the binding has expired: the cost
    # decides (worker 0) and binds anew.
    r, view = busy_holder()
    view.now_s = 69.9
    second = turn(2, session=1)
    assert send(r, second, view) == 1
    assert r._sessions[1].idle_deadline_s == 70.0 and r._sessions[1].active_requests == 1
    view.now_s = 150.0
    third = turn(3, session=1)
    assert send(r, third, view) == 1
    finish(r, second, 1, view, at_s=200.0)
    finish(r, third, 1, view, at_s=200.0)
    assert (r._sessions[1].idle_deadline_s, r._sessions[1].active_requests) == (260.0, 0)
    view.now_s = 259.9
    assert r.route(turn(4, session=1), view) == 1
    view.now_s = 260.0
    assert send(r, turn(5, session=1), view) == 0
    assert r._sessions[1].worker == 0 and r._sessions[1].idle_deadline_s == 320.0


def test_soft_and_hard_choose_alike_with_the_default_cost():
    # The default selector narrows the candidates to an eligible affinity target, and every worker is eligible
    # here (no busy thresholds, a fixed worker set): soft keeps the session where hard pins it. Session 1 (bound to
    # worker 1) at t=20 and t=80 (its deadline 81); session 2, new at t=30 (cost: worker 0), has expired at t=95
    # (deadline 91) and the cost places it again.
    def choices(mode):
        r, view = busy_holder(mode)
        picks = []
        for i, t in enumerate((20.0, 30.0, 80.0, 95.0)):
            view.now_s = t
            q = turn(10 + i, session=1 + i % 2)
            picks.append(send(r, q, view))
            finish(r, q, picks[-1], view, at_s=t + 1)
        return picks

    assert choices("soft") == choices("hard") == [1, 0, 1, 0]


def lmetric_busy_holder(mode):
    """lmetric without its hot-spot detector: session 1's first turn goes to worker 1 (339 x 1 < 2371 x 1), then
    seven more requests in flight there make 339 x 8 = 2712 > 2371: lmetric's own choice is worker 0."""
    view = holding(2, {1: 127})
    r = build(KvAwareRouter, n=2, view=view, router_selection_policy="lmetric", lmetric_hotspot_detection=False,
              session_affinity_ttl_s=60, session_affinity_mode=mode)
    first = turn(1, session=1)
    assert send(r, first, view) == 1
    for i in range(7):
        r.on_dispatch(prompt(60 + i, 3), 1)
    return r, view, first


def test_with_lmetric_hard_pins_and_soft_is_advisory_and_the_binding_follows_the_dispatch():
    r, view, _ = lmetric_busy_holder("hard")
    assert send(r, turn(2, session=1), view) == 1
    r, view, first = lmetric_busy_holder("soft")
    view.now_s = 1.0
    second = turn(2, session=1)
    assert send(r, second, view) == 0  # lmetric ignores the target; the session rebinds to worker 0
    binding = r._sessions[1]
    assert (binding.worker, binding.version, binding.active_requests, binding.idle_deadline_s) == (0, 2, 2, 60.0)
    # The first turn (version 1) completes: one request fewer, but the deadline is the rebound version's to move.
    finish(r, first, 1, view, at_s=5.0)
    assert (binding.active_requests, binding.idle_deadline_s) == (1, 60.0)
    finish(r, second, 0, view, at_s=8.0)
    assert (binding.active_requests, binding.idle_deadline_s) == (0, 68.0)


def test_requests_without_a_session_and_the_session_prefix_index_route_as_before():
    def choices(**options):
        view = holding(3, {1: 127, 2: 60})
        r = build(KvAwareRouter, n=3, seed=4, view=view, **options)
        picks = []
        for i in range(30):
            view.now_s = i * 0.5
            q = prompt(i, 7 if i % 3 else i)
            picks.append(send(r, q, view))
            if i % 4 == 3:
                finish(r, q, picks[-1], view, at_s=view.now_s)
        return picks

    base = choices()
    assert choices(session_affinity_ttl_s=30) == base
    assert choices(session_affinity_ttl_s=30, session_affinity_mode="soft", enable_session_prefix_index=True) == base
    assert choices(enable_session_prefix_index=True) == base
