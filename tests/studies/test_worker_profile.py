"""`sim.studies.worker_profile`: the highest rate one worker meets the SLO at, by short seeded simulations."""

from __future__ import annotations

import pytest

import sim.studies.worker_profile as worker_profile
from sim.config import ProblemsError
from sim.scenario import load_scenario
from sim.studies.worker_profile import profile_worker
from tests.support.paths import REPO


def tiny(**overrides):
    scenario = load_scenario(REPO / "scenarios" / "tiny-cpu.yaml")[0]
    return scenario.with_overrides(**overrides) if overrides else scenario


def test_the_answer_meets_the_slo_and_the_next_rate_simulated_above_it_does_not():
    scenario = tiny(slo={"ttft_ms": 2000})
    profile = profile_worker(scenario, requests=60, seeds=1)
    by_rate = {p.rate: p for p in profile.points}
    assert profile.knob == "workload.arrival_rate_rps"
    assert profile.worker_rps == profile.rate
    assert by_rate[profile.rate].goodput_fraction >= 0.95
    above = min(r for r in by_rate if r > profile.rate)
    assert by_rate[above].goodput_fraction < 0.95
    assert above / profile.rate <= 1.05
    # Bracketed from 1 req/s (the scenario is closed-loop) by doubling: 1, 2, 4 ... are the first points.
    assert [p.rate for p in profile.points[:2]] == [1.0, 2.0]


def test_a_second_ask_is_answered_from_the_cache(monkeypatch):
    scenario = tiny(slo={"ttft_ms": 2000})
    first = profile_worker(scenario, requests=60, seeds=1)

    def no_run(*args, **kwargs):
        raise AssertionError("simulated again")

    monkeypatch.setattr(worker_profile, "run", no_run)
    assert profile_worker(scenario, requests=60, seeds=1) is first


def test_no_slo_or_no_passing_rate_is_a_one_line_error():
    with pytest.raises(ProblemsError, match=r"^slo: a worker profile needs the scenario's SLO"):
        profile_worker(tiny(), requests=60, seeds=1)
    with pytest.raises(ProblemsError, match=r"^slo: one worker meets the SLO at no rate down to"):
        profile_worker(tiny(slo={"ttft_ms": 1}), requests=20, seeds=1, max_steps=3)


def test_with_worker_rps_fills_only_a_planner_without_one(monkeypatch):
    scenario = tiny(slo={"ttft_ms": 2000})

    class Profile:
        worker_rps = 3.25

    monkeypatch.setattr(worker_profile, "profile_worker", lambda s: Profile)
    assert worker_profile.with_worker_rps("planner", {"predictor": "kalman"}, scenario) == {
        "predictor": "kalman", "worker_rps": 3.25}
    assert worker_profile.with_worker_rps("planner", {"worker_rps": 1.0}, scenario) == {"worker_rps": 1.0}
    assert worker_profile.with_worker_rps("hpa", {"target": 4}, scenario) == {"target": 4}


def test_a_scenario_with_a_load_curve_and_an_autoscaler_profiles_as_its_fixed_constant_rate_self():
    # The planner profiles a worker before an autoscaled diurnal run: the curve and the fleet are not the profile's.
    base = tiny(slo={"ttft_ms": 2000}, **{"cluster.deployments": []})  # one worker per device, as autoscaling needs
    curved = base.with_overrides(**{
        "workload.arrival_curve": {"kind": "diurnal", "mean_rps": 2.0, "amplitude": 0.5, "period_s": 600.0},
        "workload.duration_s": 600.0,
        "cluster.workers": 3,
        "cluster.autoscaling": {"autoscaler": {"name": "schedule", "options": {"at": "0/1"}}, "min_workers": 1,
                                "max_workers": 3},
    })
    assert curved.workload.arrival_curve is not None and curved.cluster.autoscaling is not None
    plain = profile_worker(base, requests=60, seeds=1)
    assert profile_worker(curved, requests=60, seeds=1).points == plain.points
