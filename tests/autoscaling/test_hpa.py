"""The `hpa` autoscaler, tick by tick on hand-made snapshots, with the counts Kubernetes' controller would set.

Every scenario is a few ticks 15 s apart (the default sync period); `fleet(...)` builds a snapshot from the per-worker
metric of each ready worker (and how many are starting). Kubernetes' own tests (horizontal_test.go,
replica_calculator_test.go) check the same rules: the numbers here are worked by hand from the formulas in
`policies.autoscalers.HpaAutoscaler`'s docstring.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.autoscalers import HpaAutoscaler, percentile_90
from sim.config import ProblemsError
from tests.support.fleet_snapshots import fleet


def hpa(min_workers=1, max_workers=20, **options):
    return HpaAutoscaler(min_workers=min_workers, max_workers=max_workers, options=options)


def test_defaults_are_kubernetes_autoscaling_v2():
    a = hpa()
    o = a.options
    assert a.interval_s == 15.0
    assert (o.tolerance, o.scale_up_stabilization_s, o.scale_down_stabilization_s) == (0.1, 0.0, 300.0)
    assert (o.scale_up_pods, o.scale_up_percent, o.scale_up_pods_period_s, o.scale_up_select) == (4, 100, 15.0, "max")
    assert (o.scale_down_pods, o.scale_down_percent, o.scale_down_percent_period_s) == (None, 100, 15.0)
    assert a.target == 8.0  # kvsim's default in_flight target


def test_inside_the_tolerance_band_nothing_changes():
    # Target 4 in flight. 5 ready workers averaging 4.4 (ratio exactly 1.1) are in the band [0.9, 1.1]; 4 averaging
    # 4.5 (ratio 1.125) are not: ceil(1.125 x 4) = 5.
    a = hpa(target=4)
    assert a.desired_workers(fleet(15, [4, 4, 5, 5, 4])) == 5
    assert a.desired_workers(fleet(30, [4, 5, 4, 5])) == 5
    b = hpa(target=4, scale_down_stabilization_s=0)
    assert b.desired_workers(fleet(15, [4, 4, 4, 3, 3])) == 5  # 3.6 / 4 = 0.9: the band's low edge
    assert b.desired_workers(fleet(30, [4, 4, 3, 3, 3])) == 5  # 3.4 / 4 = 0.85 -> ceil(4.25) = 5
    assert b.desired_workers(fleet(45, [3, 3, 3, 3, 3])) == 4  # 0.75 -> ceil(3.75) = 4


def test_scale_up_is_ceil_of_ratio_times_ready_and_capped_by_four_pods_or_double_per_15_s():
    # 2 ready workers at 20 in flight each, target 4: ratio 5 -> ceil(5 x 2) = 10 wanted. The scale-up policies allow
    # max(2 + 4 pods, 2 x 2 = 4) = 6 from the period's start (no event in the last 15 s).
    a = hpa(target=4)
    assert a.desired_workers(fleet(15, [20, 20])) == 6
    assert a.last_reason == "ScaleUpLimit"
    # 15 s later the event at t=15 is not strictly younger than the 15 s period: the period starts at 6 again.
    # The 6 workers are still starting (unready): with 2 ready at 20 -> ratio 5 > 1, the starting ones count 0:
    # new ratio 40 / 6 = 6.666 in milli-units 6666 / 4000 = 1.6665 -> ceil(1.6665 x 6) = 10; cap max(6 + 4, 12) = 10.
    assert a.desired_workers(fleet(30, [20, 20], starting=4)) == 10
    assert a.scale_up_events == [(15.0, 4), (30.0, 4)]


def test_a_scale_up_within_the_same_period_counts_the_replicas_already_added():
    # Sync every 5 s with the default 15 s policies: the second scale-up in one period starts from the replicas at
    # the period's start (current 6 minus the 4 added at t=5 -> 2): max(2 + 4, 2 x 2) = 6 = current -> no change.
    a = hpa(target=4, sync_period_s=5)
    assert a.desired_workers(fleet(5, [20, 20])) == 6
    assert a.desired_workers(fleet(10, [20, 20, 20, 20, 20, 20])) == 6
    assert a.last_reason == "ScaleUpLimit"
    # At t=20 the t=5 event is out of the period (5, 20]: it starts at 6 -> max(6 + 4, 2 x 6) = 12 (30 wanted).
    assert a.desired_workers(fleet(20, [20, 20, 20, 20, 20, 20])) == 12


def test_the_scale_down_stabilisation_window_holds_the_highest_recommendation_of_the_last_300_s():
    # 6 ready workers; load drops at t=30 to 2 in flight each (target 4: ratio 0.5 -> ceil(0.5 x 6) = 3 wanted).
    # The recommendation of t=15 (6) is in the window until t=315 (the window holds times strictly after now - 300).
    a = hpa(target=4)
    assert a.desired_workers(fleet(15, [4] * 6)) == 6
    assert a.desired_workers(fleet(30, [2] * 6)) == 6
    assert a.last_reason == "DesiredWithinRange"
    assert a.desired_workers(fleet(300, [2] * 6)) == 6
    assert a.desired_workers(fleet(315, [2] * 6)) == 3  # t=15 left the window: max(3, 3, ...) = 3
    assert a.scale_down_events == [(315.0, 3)]


def test_scale_down_rate_limit_by_pods_policy():
    # A Pods scale-down policy of 1 per 60 s instead of 100 % per 15 s, no stabilisation: 8 -> 7 at t=15, then held
    # until the t=15 event leaves the 60 s period (t=75 is not strictly inside (15, 75]), then 7 -> 6.
    a = hpa(target=4, scale_down_stabilization_s=0, scale_down_pods=1, scale_down_pods_period_s=60,
            scale_down_percent=None)
    assert a.desired_workers(fleet(15, [1] * 8)) == 7
    assert a.desired_workers(fleet(30, [1] * 7)) == 7
    assert a.last_reason == "ScaleDownLimit"
    assert a.desired_workers(fleet(75, [1] * 7)) == 6


def test_percent_scale_down_truncates_and_min_workers_binds():
    # 50 % down from 5 -> int(5 x 0.5) = 2 allowed; with min_workers 3 the floor is 3 (TooFewReplicas).
    a = hpa(min_workers=3, target=4, scale_down_stabilization_s=0, scale_down_percent=50)
    assert a.desired_workers(fleet(15, [0] * 5)) == 3
    assert a.last_reason == "TooFewReplicas"
    b = hpa(min_workers=1, target=4, scale_down_stabilization_s=0, scale_down_percent=50)
    assert b.desired_workers(fleet(15, [0] * 5)) == 2
    assert b.last_reason == "ScaleDownLimit"


def test_select_min_and_disabled():
    a = hpa(target=4, scale_up_select="min")  # min(2 + 4, 2 x 2) = 4
    assert a.desired_workers(fleet(15, [20, 20])) == 4
    b = hpa(target=4, scale_down_select="disabled", scale_down_stabilization_s=0)
    assert b.desired_workers(fleet(15, [0] * 5)) == 5


def test_max_workers_caps_and_a_fleet_outside_the_bounds_is_brought_back_without_a_metric():
    a = hpa(max_workers=5, target=4)
    assert a.desired_workers(fleet(15, [20, 20, 20, 20])) == 5
    assert a.last_reason == "TooManyReplicas"
    assert hpa(max_workers=3).desired_workers(fleet(15, [0] * 4)) == 3
    assert hpa(min_workers=3).desired_workers(fleet(15, [100])) == 3


def test_starting_workers_on_a_scale_down_are_not_counted():
    # 2 ready at 1 in flight, 2 starting, target 4: ratio 0.25 <= 1 -> the plain path: ceil(0.25 x 2) = 1 wanted,
    # stabilised (no window) and limited to 100 % down: 1.
    a = hpa(target=4, scale_down_stabilization_s=0)
    assert a.desired_workers(fleet(15, [1, 1], starting=2)) == 1


def test_a_scale_up_that_the_starting_workers_already_cover_keeps_the_count():
    # 2 ready at 5, target 4: ratio 1.25 > 1 with 2 starting -> 10 / 4 workers = 2.5 -> ratio 0.625 < 1: the
    # direction flips, so no change (the starting workers already cover it).
    a = hpa(target=4)
    assert a.desired_workers(fleet(15, [5, 5], starting=2)) == 4


def test_no_ready_worker_means_no_metric_and_no_change():
    a = hpa(target=4)
    assert a.desired_workers(fleet(15, [], starting=3)) == 3
    assert a.last_reason == "FailedGetMetric"
    assert a.recommendations == [(15, 3)]  # only the first tick's record of the current count


def test_a_new_hpa_does_not_scale_down_before_its_window_has_passed():
    # recordInitialRecommendation: the first tick records current (6) before the metric's 2; the window holds it.
    a = hpa(target=4)
    assert a.desired_workers(fleet(15, [1] * 6)) == 6
    assert a.recommendations == [(15, 6), (15, 2)]
    assert a.last_reason == "DesiredWithinRange"
    assert a.desired_workers(fleet(300, [1] * 6)) == 6
    assert a.desired_workers(fleet(315, [1] * 6)) == 2


def test_a_target_scaled_to_zero_is_left_alone_unless_min_workers_is_zero():
    assert hpa(min_workers=1).desired_workers(fleet(15, [])) == 0
    # min 0: the Pods metric has no pod (no change); TTFT p90 as an External metric scales from zero on the ratio.
    assert hpa(min_workers=0).desired_workers(fleet(15, [])) == 0
    ttft = hpa(min_workers=0, metric="ttft_p90_ms", target=500)
    assert ttft.desired_workers(fleet(15, [], ttft_ms=(900.0, 1100.0))) == 3  # p90 1080 / 500 = 2.16 -> 3


def test_without_behavior_the_legacy_normalisation_doubles_or_adds_up_to_four():
    # behavior=false (a manifest without spec.behavior): the scale-up limit is max(2 x current, 4) per sync, with no
    # period accounting and no scale events; 2 workers at 20 (10 wanted) -> 4; then 4 at 10 -> 8; then 8 -> 10.
    a = hpa(target=4, behavior=False)
    assert a.desired_workers(fleet(15, [20, 20])) == 4
    assert a.desired_workers(fleet(30, [10] * 4)) == 8
    assert a.desired_workers(fleet(45, [5] * 8)) == 10
    assert a.scale_up_events == []
    # the scale-down window includes its edge: the t=45 recommendation (10) still holds at t=345.
    assert a.desired_workers(fleet(60, [1] * 10)) == 10
    assert a.desired_workers(fleet(345, [1] * 10)) == 10
    assert a.desired_workers(fleet(360, [1] * 10)) == 3


def test_queue_and_kv_usage_metrics_read_their_own_field():
    q = hpa(metric="queue", target=2)
    assert q.desired_workers(fleet(15, [0, 0], waiting=[6, 6])) == 6  # ratio 3 -> 6, cap max(2 + 4, 4) = 6
    k = hpa(metric="kv_usage", target=0.5)
    assert k.desired_workers(fleet(15, [0, 0, 0], kv_usage=[0.9, 0.9, 0.9])) == 6  # 0.9 / 0.5 = 1.8 -> ceil(5.4)


def test_kv_usage_is_averaged_in_milli_units_rounded_up():
    # 0.3334 reads as 334 milli (MilliValue rounds up), 0.3331 as 334 too; (334 + 334) // 2 = 334, / 500 = 0.668.
    k = hpa(metric="kv_usage", target=0.5, scale_down_stabilization_s=0)
    assert k.usage_ratio([0.3334, 0.3331]) == pytest.approx(0.668)
    assert k.desired_workers(fleet(15, [0, 0], kv_usage=[0.3334, 0.3331])) == 2  # ceil(0.668 x 2) = 2: no change


def test_ttft_p90_is_an_external_value_metric_not_averaged_per_worker():
    # 10 TTFTs 100..1000 ms: p90 (linear) = 910 ms; target 500 -> ratio 1.82 -> ceil(1.82 x 3 ready) = 6.
    a = hpa(metric="ttft_p90_ms", target=500)
    ttfts = tuple(float(v) for v in range(100, 1001, 100))
    assert percentile_90(ttfts) == pytest.approx(910.0)
    assert a.desired_workers(fleet(15, [0, 0, 0], ttft_ms=ttfts)) == 6
    # No first token in the window: no metric, no change.
    assert a.desired_workers(fleet(30, [0] * 6, ttft_ms=())) == 6


def test_bad_options_are_one_line_errors_naming_the_option():
    with pytest.raises(ProblemsError, match=r"^metric: Input should be 'in_flight', 'queue', 'kv_usage' or 'ttft_p90_ms'$"):
        hpa(metric="cpu")
    with pytest.raises(ProblemsError, match="tolerence: unknown option of hpa; did you mean tolerance"):
        hpa(tolerence=0.2)
    with pytest.raises(ProblemsError, match="target: Input should be greater than 0"):
        hpa(target=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), max_size=12), st.integers(0, 4)), min_size=1, max_size=30),
       st.integers(0, 3), st.integers(1, 12))
def test_the_answer_always_lies_in_the_bounds_and_moves_at_most_as_the_policies_allow(ticks, min_workers, span):
    """Whatever the load: the answer is in [min, max] once the fleet is, and a scale-up never adds more than
    max(4 workers, 100 %) of the period's start (here: current, as the previous tick's event is 15 s old)."""
    max_workers = min_workers + span
    a = hpa(min_workers=min_workers, max_workers=max(max_workers, 1), target=4)
    for i, (in_flight, starting) in enumerate(ticks):
        now = 15.0 * (i + 1)
        snapshot = fleet(now, in_flight, starting=starting)
        current = len(in_flight) + starting
        desired = a.desired_workers(snapshot)
        if a.min_workers <= current <= a.max_workers:
            assert a.min_workers <= desired <= a.max_workers
            if desired > current:
                assert desired <= max(current + 4, 2 * current)


def spread(total: int, workers: int) -> list[int]:
    """`total` requests in flight spread as evenly as a balanced router would: [7, 7, 7, 7, 6, 6] for 40 over 6."""
    return [total // workers + (i < total % workers) for i in range(workers)]


def test_a_fleet_that_follows_its_hpa_up_and_then_down_after_five_minutes():
    # The fleet applies each answer at once (no start-up delay); 40 requests in flight, target 4 per worker.
    a = hpa(target=4)
    workers, timeline = 2, []
    for tick in range(1, 25):
        now = 15.0 * tick
        total = 40 if now < 60 else 20  # the load halves at t=60
        workers = a.desired_workers(fleet(now, spread(total, workers)))
        timeline.append((now, workers))
    # t=15: 2 at 20 -> 10 wanted, 4-pods-or-double allows 6. t=30: 6 at 6.666 (6666 milli / 4000 = 1.6665) ->
    # ceil(9.999) = 10, allowed max(10, 12). t=45: 10 at 4: in the band. From t=60: 10 at 2 -> 5 recommended, held
    # by the t=30 and t=45 recommendations (10) until t=345, when t=45 is no longer strictly inside (45, 345].
    assert timeline[:4] == [(15.0, 6), (30.0, 10), (45.0, 10), (60.0, 10)]
    assert [n for t, n in timeline if t < 345] == [6] + [10] * 21
    assert timeline[-2:] == [(345.0, 5), (360.0, 5)]
    assert a.scale_up_events == [(15.0, 4), (30.0, 4)] and a.scale_down_events == [(345.0, 5)]
