"""The `planner` (Dynamo's SLA Planner, throughput-based, aggregated) and `schedule` autoscalers on hand-made
snapshots, and the autoscaler specs and registry."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import AUTOSCALERS
from policies.autoscalers import KalmanPredictor, PlannerAutoscaler, ScheduleAutoscaler, build_autoscaler, split_autoscaler_spec
from sim.config import ProblemsError
from tests.support.fleet_snapshots import fleet


def planner(min_workers=1, max_workers=20, **options):
    return PlannerAutoscaler(min_workers=min_workers, max_workers=max_workers, options=options)


def window(now_s, completed, ready=2, arrivals=None):
    """A 180 s window in which `completed` requests ended (and `arrivals` arrived: by default as many)."""
    return fleet(now_s, [0] * ready, completed=completed, arrivals=completed if arrivals is None else arrivals,
                 window_s=180.0)


def test_planner_defaults_are_dynamos():
    p = planner(worker_rps=1.5)
    o = p.options
    assert p.interval_s == 180.0
    assert (o.min_endpoint, o.max_gpu_budget, o.engine_num_gpu) == (1, 8, 1)
    assert (o.kalman_q_level, o.kalman_q_trend, o.kalman_r) == (1.0, 0.1, 10.0)


def test_planner_asks_for_predicted_rps_over_worker_rps_rounded_up():
    # One worker serves 1.5 req/s at the SLO. 540 requests in 180 s = 3 req/s -> 2 workers; 600 (3.33 req/s) -> 3;
    # the constant predictor expects the last interval's load again.
    p = planner(worker_rps=1.5)
    assert p.desired_workers(window(180, 540)) == 2
    assert p.last_demand_rps == pytest.approx(3.0)
    assert p.desired_workers(window(360, 600)) == 3
    assert p.desired_workers(window(540, 90)) == 1  # 0.5 req/s -> ceil(0.33) = 1


def test_planner_learns_from_completed_requests_as_dynamos_frontend_counter_by_default():
    # An overloaded interval: 900 arrived, 540 completed. Dynamo's frontend source counts completions (3 req/s -> 2
    # workers); observe=arrivals counts what arrived (5 req/s -> 4).
    assert planner(worker_rps=1.5).desired_workers(window(180, 540, arrivals=900)) == 2
    assert planner(worker_rps=1.5, observe="arrivals").desired_workers(window(180, 540, arrivals=900)) == 4


def test_planner_skips_the_idle_start_and_keeps_min_endpoint():
    # No traffic yet: the leading zeros are not data (Dynamo's BasePredictor), the prediction is 0 and the answer is
    # min_endpoint. A zero after traffic is data: the constant predictor then predicts 0 -> min_endpoint again.
    p = planner(worker_rps=1.0, min_endpoint=2)
    assert p.desired_workers(window(180, 0)) == 2
    assert p.predictor.data == []
    assert p.desired_workers(window(360, 900)) == 5
    assert p.desired_workers(window(540, 0)) == 2
    assert p.predictor.data == [900.0, 0.0]


def test_planner_gpu_budget_clamp():
    # 10 req/s over 1.5 -> 7 workers of 2 GPUs = 14 GPUs > the budget of 8 -> floor(8 / 2) = 4 workers.
    p = planner(worker_rps=1.5, engine_num_gpu=2)
    assert p.desired_workers(window(180, 1800)) == 4
    # A budget below min_endpoint's GPUs asks for no worker at all (Dynamo's "zero replicas").
    assert planner(worker_rps=1.5, engine_num_gpu=2, max_gpu_budget=1).desired_workers(window(180, 1800)) == 0
    # A negative budget is no budget.
    assert planner(worker_rps=1.5, max_gpu_budget=-1).desired_workers(window(180, 1800)) == 7


def test_kalman_forecast_follows_a_trend_as_filterpy_computes_it():
    # First value 100 sets the level (forecast 100). P after one predict = [[2001, 1000], [1000, 1000.1]];
    # the update with 200 (S = 2011) gives level 100 + 100 x 2001/2011 and trend 100 x 1000/2011; the next
    # forecast is their sum: 100 + 100 x 3001/2011 = 249.229...
    k = KalmanPredictor(1.0, 0.1, 10.0)
    k.add(100.0)
    assert k.predict_next() == pytest.approx(100.0)
    k.add(200.0)
    assert k.predict_next() == pytest.approx(100 + 100 * 3001 / 2011)
    assert k.predict_next() == pytest.approx(100 + 100 * 3001 / 2011)  # cached: asking twice does not advance


def test_planner_with_kalman_scales_ahead_of_a_ramp():
    p = planner(worker_rps=1.0, predictor="kalman")
    assert p.desired_workers(window(180, 180)) == 1    # 1 req/s
    assert p.desired_workers(window(360, 360)) == 3    # forecast 180 + 180 x 3001/2011 = 448.6 -> 2.49 req/s -> 3


def test_planner_needs_worker_rps():
    with pytest.raises(ProblemsError, match=r"^worker_rps: planner needs the requests per second"):
        planner()
    with pytest.raises(ProblemsError, match="predictor: Input should be 'constant' or 'kalman'"):
        planner(worker_rps=1, predictor="arima")


def test_schedule_follows_its_points_at_the_first_tick_at_or_after_each():
    s = ScheduleAutoscaler(min_workers=0, max_workers=10, options={"at": "60/2,3600/6,7200/3"})
    assert s.interval_s == 15.0
    assert s.desired_workers(fleet(15, [0] * 4)) == 4      # before the first point: no change
    assert s.desired_workers(fleet(60, [0] * 4)) == 2
    assert s.desired_workers(fleet(3599, [0, 0])) == 2
    assert s.desired_workers(fleet(3600, [0, 0])) == 6
    assert s.desired_workers(fleet(9000, [0] * 6)) == 3


def test_schedule_takes_a_list_or_mappings_from_a_scenario():
    a = ScheduleAutoscaler(min_workers=0, max_workers=10, options={"at": [[0, 2], [30, 5]], "interval_s": 30})
    b = ScheduleAutoscaler(min_workers=0, max_workers=10,
                           options={"at": [{"at_s": 0, "workers": 2}, {"at_s": 30, "workers": 5}]})
    assert a.options.at == b.options.at == ((0.0, 2), (30.0, 5))
    assert a.interval_s == 30.0


@pytest.mark.parametrize(("options", "message"), [
    ({"at": "0/2,0/3"}, "at: times must increase strictly, got 0 then 0"),
    ({"at": "0-2"}, "at: '0-2' is not time_s/workers"),
    ({"at": "0/-1"}, "at: time_s and workers must be >= 0, got 0/-1"),
    ({}, "at: Field required"),
])
def test_schedule_bad_points(options, message):
    with pytest.raises(ProblemsError, match=message):
        ScheduleAutoscaler(min_workers=0, max_workers=10, options=options)


def test_specs_split_like_router_specs_and_list_values_continue_past_commas():
    assert split_autoscaler_spec("hpa") == ("hpa", {})
    assert split_autoscaler_spec("hpa:target=4,metric=in_flight") == ("hpa", {"target": 4, "metric": "in_flight"})
    assert split_autoscaler_spec("schedule:at=0/2,3600/6,interval_s=30") == (
        "schedule", {"at": "0/2,3600/6", "interval_s": 30})
    assert split_autoscaler_spec("hpa:scale_up_pods=null") == ("hpa", {"scale_up_pods": None})
    for bad, message in [("hpa:", "nothing after ':'"), (":x=1", "starts with its name"),
                         ("hpa:4", "'4' is not key=value"), ("hpa:target=1,target=2", "option target given twice")]:
        with pytest.raises(ValueError, match=message):
            split_autoscaler_spec(bad)


def test_registry_and_builder():
    assert list(AUTOSCALERS) == ["hpa", "planner", "schedule"]
    assert all(cls.summary and cls.Options.model_config["extra"] == "forbid" for cls in AUTOSCALERS.values())
    a = build_autoscaler("hpa", {"target": 4}, min_workers=1, max_workers=12)
    assert (a.name, a.min_workers, a.max_workers, a.interval_s) == ("hpa", 1, 12, 15.0)
    with pytest.raises(ProblemsError, match=r"^autoscaler: unknown autoscaler 'hap' \(one of: hpa, planner, schedule\)$"):
        build_autoscaler("hap", {}, min_workers=1, max_workers=2)
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        build_autoscaler("hpa", {}, min_workers=3, max_workers=2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=20), st.floats(0.1, 20), st.integers(0, 3),
       st.integers(-1, 16), st.integers(1, 4), st.sampled_from(["constant", "kalman"]))
def test_the_planner_answer_is_within_its_floor_and_budget(arrivals, worker_rps, min_endpoint, budget, gpus, predictor):
    """Whatever the traffic: at least min_endpoint workers and at most the budget's, unless the budget cannot hold
    min_endpoint (then 0); with the constant predictor, ceil(last window's rps / worker_rps) clamped to the budget."""
    p = planner(worker_rps=worker_rps, min_endpoint=min_endpoint, max_gpu_budget=budget, engine_num_gpu=gpus,
                predictor=predictor)
    for i, n in enumerate(arrivals):
        desired = p.desired_workers(window(180.0 * (i + 1), n))
        if 0 <= budget < min_endpoint * gpus:
            assert desired == 0
            continue
        assert desired >= min_endpoint
        if budget >= 0:
            assert desired * gpus <= max(budget, min_endpoint * gpus)
        if predictor == "constant":  # the naive model: the last window's rps, then the budget
            wanted = max(math.ceil(p.predictor.predict_next() / 180.0 / worker_rps), min_endpoint)
            fits = budget < 0 or wanted * gpus <= budget
            assert desired == (wanted if fits else max(min_endpoint, budget // gpus))
