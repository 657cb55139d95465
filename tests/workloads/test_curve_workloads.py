"""`workload.arrival_curve` in runs: a constant curve is today's Poisson bit for bit (shared-prefix and sessions), a
curve with `duration_s` sends exactly its arrivals in the span and each at its time, and the fields' rules are
one-line errors naming the field."""

from __future__ import annotations

import pytest
import yaml

from sim.runner import run
from sim.scenario import ScenarioError, load_scenario, validate_scenario
from sim.workloads.arrival_curve import arrival_times_s, parse_arrival_curve
from sim.workloads.session_workload import SessionWorkload
from sim.workloads.shared_prefix import rng_for
from tests.support.paths import REPO
from tests.workloads.session_scenarios import BASE, CHAT, sessions_scenario


def _tiny(**workload):
    data = {**BASE, "workload": {"prefixes": 3, "prefix_tokens": 64, "tail_tokens": 32, "output_tokens": 4,
                                 "min_requests": 12, "requests_per_prefix": 0, **workload}}
    return validate_scenario(data, source="test")


def test_a_constant_curve_is_arrival_rate_rps_bit_for_bit():
    rate = _tiny(arrival_rate_rps=5.0)
    curve = _tiny(arrival_curve={"kind": "constant", "rate_rps": 5.0})
    assert run(rate).records == run(curve).records
    shipped, _ = load_scenario(REPO / "scenarios" / "tiny-cpu.yaml")
    a = shipped.with_overrides(**{"workload.arrival_rate_rps": 3.0})
    b = shipped.with_overrides(**{"workload.arrival_curve": {"kind": "constant", "rate_rps": 3.0}})
    assert run(a).records == run(b).records


def test_constant_session_starts_are_session_rate_per_s_bit_for_bit():
    chat = {**CHAT, "sessions": 5, "concurrent_sessions": None}
    rate = sessions_scenario(**chat, session_rate_per_s=0.5)
    curve = sessions_scenario(**chat, arrival_curve={"kind": "constant", "rate_rps": 0.5})
    assert run(rate).records == run(curve).records


def test_a_ramp_over_a_duration_sends_its_arrivals_at_their_times():
    # 0 -> 4 req/s over 10 s: Λ(10) = 20 arrivals expected; those drawn (stream `arrivals`) are the measured
    # requests, each sent at its time after the warm-ups (one per prefix, sent first).
    scenario = _tiny(arrival_curve={"kind": "piecewise", "points": [[0, 0], [10, 4]]}, duration_s=10)
    times = list(arrival_times_s(parse_arrival_curve("piecewise:points=0:0/10:4").curve(),
                                 rng_for(scenario.seed, "arrivals"), until_s=10))
    result = run(scenario)
    measured = [r for r in result.records if not r.warmup]
    assert len(measured) == len(times) and 10 <= len(times) <= 30
    start = result.measured_start_s
    assert [r.sent_s - start for r in measured] == pytest.approx(times, abs=1e-9)
    assert scenario.workload.planned_requests == 20


def test_session_starts_over_a_duration():
    # Sessions start at 0.5/s for 20 s, then 0: the number of sessions is the starts drawn in [0, 20 s).
    scenario = sessions_scenario(**{**CHAT, "sessions": None, "concurrent_sessions": None},
                                 arrival_curve={"kind": "piecewise", "points": [[0, 0.5], [20, 0]],
                                                "interpolation": "step"}, duration_s=30)
    source = SessionWorkload(scenario.workload, block_size=16, seed=scenario.seed)
    starts = list(arrival_times_s(scenario.workload.arrival_curve.curve(), rng_for(scenario.seed, "session-starts"),
                                  until_s=30))
    assert source.num_sessions == len(starts) and all(t < 20 for t in starts)
    assert [s.start_s for s in source] == starts
    result = run(scenario)
    assert {r.session_id for r in result.records} == set(range(len(starts)))
    assert scenario.workload.planned_sessions == 10


@pytest.mark.parametrize("workload, message", [
    ({"arrival_rate_rps": 2, "arrival_curve": {"kind": "constant", "rate_rps": 2}},
     "workload.arrival_curve: give arrival_curve or arrival_rate_rps, not both"),
    ({"duration_s": 60}, "workload.duration_s: used only with arrival_curve"),
    ({"arrival_curve": {"kind": "diurnal", "mean_rps": 2, "amplitude": 2}},
     "workload.arrival_curve.amplitude: Input should be less than or equal to 1"),
    ({"arrival_curve": {"kind": "sine", "mean_rps": 2}}, "workload.arrival_curve"),
])
def test_shared_prefix_curve_errors(tmp_path, workload, message):
    data = {**BASE, "workload": {"prefixes": 3, "prefix_tokens": 64, "tail_tokens": 32, "output_tokens": 4,
                                 **workload}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("workload, message", [
    ({"concurrent_sessions": None, "arrival_curve": {"kind": "constant", "rate_rps": 1}, "sessions": None},
     "workload.sessions: give sessions (how many) or, with arrival_curve, duration_s"),
    ({"arrival_curve": {"kind": "constant", "rate_rps": 1}},
     "workload.arrival_curve: give one of session_rate_per_s (Poisson session starts), arrival_curve (starts at a "
     "rate that follows a curve) or concurrent_sessions (a closed loop); got arrival_curve and concurrent_sessions"),
])
def test_session_curve_errors(tmp_path, workload, message):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "workload": {"kind": "sessions", **CHAT, **workload}}, sort_keys=False))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_duration_with_too_few_arrivals_is_an_error():
    scenario = _tiny(arrival_curve={"kind": "piecewise", "points": [[0, 0.01]]}, duration_s=1, discard_first=5)
    with pytest.raises(ScenarioError, match="workload.arrival_curve: .* none left to measure after discard_first 5"):
        run(scenario)
