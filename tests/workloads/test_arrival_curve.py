"""Arrival-rate curves: Λ and Λ⁻¹ worked by hand on tiny curves, arrivals by time-rescaling (the unit-rate draws
come back through Λ; counts per interval are exactly the unit-rate counts on the rescaled intervals), the trace warp
(order kept, the mean rate mapped), and the CLI form's one-line errors."""

from __future__ import annotations

import json
import math
from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import ProblemsError
from sim.workloads.arrival_curve import (
    ConstantCurve, DiurnalCurveSpec, PiecewiseCurveSpec, arrival_times_s, parse_arrival_curve, trace_mean_rps,
    warp_trace, warped_mooncake,
)
from sim.workloads.request import Request
from sim.workloads.shared_prefix import rng_for
from sim.workloads.traces import TraceError, TraceRequest


def _piecewise(points, interpolation="linear"):
    return PiecewiseCurveSpec(kind="piecewise", points=points, interpolation=interpolation).curve()


def test_linear_ramp_inverts_exactly():
    # The rate climbs from 0 to 2 req/s over 10 s, then holds: λ(t) = t/5, so Λ(t) = t²/10 up to 10 s (Λ(10) = 10),
    # then 10 + 2(t - 10).
    ramp = _piecewise([[0, 0], [10, 2]])
    assert ramp.cum_at == (0.0, 10.0)
    assert [ramp.rate_rps(t) for t in (0, 5, 10, 30)] == [0.0, 1.0, 2.0, 2.0]
    assert [ramp.cumulative(t) for t in (0, 5, 10, 12)] == [0.0, 2.5, 10.0, 14.0]
    # Λ⁻¹ by the segment's quadratic, d = 2Δ / (r₀ + sqrt(r₀² + 2mΔ)): 2.5 arrivals are expected by 5 s, 10 by 10 s,
    # 14 by 12 s (on the flat tail).
    assert [ramp.inverse(y) for y in (0, 2.5, 10, 14)] == [0.0, 5.0, 10.0, 12.0]


def test_step_curve_with_a_silent_stretch():
    # 1 req/s for 2 s, nothing from 2 s to 5 s, then 3 req/s: Λ(2) = 2 stays 2 until 5 s.
    steps = _piecewise([[0, 1], [2, 0], [5, 3]], "step")
    assert steps.cum_at == (0.0, 2.0, 2.0)
    assert [steps.rate_rps(t) for t in (0, 1.9, 2, 4.9, 5)] == [1.0, 1.0, 0.0, 0.0, 3.0]
    # Λ⁻¹(y) is the first t with Λ(t) >= y: 2 arrivals are reached at 2 s, and the next only once the rate is back.
    assert steps.inverse(2.0) == 2.0
    assert steps.inverse(2.75) == 5.25
    assert not any(2 < t < 5 for t in arrival_times_s(steps, rng_for(0, "t"), until_s=60))


def test_a_curve_that_ends_at_zero_brings_its_mass_and_stops():
    # 2 req/s falling to 0 at 3 s: Λ(∞) = 3 arrivals expected in all.
    fading = _piecewise([[0, 2], [3, 0]])
    assert fading.total_arrivals == 3.0
    assert fading.inverse(3.0) == 3.0 and fading.inverse(3.5) == math.inf
    for seed in range(20):
        times = list(arrival_times_s(fading, rng_for(seed, "t")))
        assert all(t < 3 for t in times) and times == sorted(times)


def test_bursts_are_a_step_curve_whose_overlaps_add():
    # 2 req/s, a +20 burst over [600, 660) and a +5 one over [630, 690): 22, then 27 where both run, then 7.
    curve = parse_arrival_curve("bursts:base_rps=2,bursts=600:60:20/630:60:5").curve()
    assert curve.times_s == (0.0, 600.0, 630.0, 660.0, 690.0)
    assert curve.rates_rps == (2.0, 22.0, 27.0, 7.0, 2.0)
    assert curve.cumulative(700) == 2 * 700 + 20 * 60 + 5 * 60


def test_diurnal_peaks_at_peak_s_and_brings_mean_times_period():
    day = DiurnalCurveSpec(kind="diurnal", mean_rps=4, amplitude=0.8, peak_s=50400).curve()
    assert day.period_s == 86400
    assert day.rate_rps(50400) == pytest.approx(4 * 1.8) and day.rate_rps(50400 - 43200) == pytest.approx(4 * 0.2)
    assert day.cumulative(86400) == pytest.approx(4 * 86400, rel=1e-15)
    assert day.inverse(4 * 86400) == pytest.approx(86400, rel=1e-12)
    # the default peak is half a period: a run starts at the trough
    assert DiurnalCurveSpec(kind="diurnal", mean_rps=1, amplitude=1).curve().peak_s == 43200


@settings(max_examples=200, deadline=None)
@given(amplitude=st.floats(0, 1), peak_frac=st.floats(0, 1), t_frac=st.floats(0, 3))
def test_diurnal_inverse_undoes_cumulative(amplitude, peak_frac, t_frac):
    day = DiurnalCurveSpec(kind="diurnal", mean_rps=2.5, amplitude=amplitude, period_s=3600,
                           peak_s=3600 * peak_frac).curve()
    y = day.cumulative(3600 * t_frac)
    assert day.cumulative(day.inverse(y)) == pytest.approx(y, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("spec", [
    "diurnal:mean_rps=3,amplitude=0.9,period_s=600,peak_s=150",
    "piecewise:points=0:0/100:6/200:1/400:3",
    "piecewise:points=0:1/100:6/200:0/300:3,interpolation=step",
    "bursts:base_rps=1,bursts=50:30:10/200:100:4",
])
def test_arrivals_are_the_unit_rate_draws_rescaled(spec):
    curve = parse_arrival_curve(spec).curve()
    times = list(arrival_times_s(curve, rng_for(7, "arrivals"), until_s=600))
    unit = rng_for(7, "arrivals")
    s = list(accumulate(unit.expovariate(1.0) for _ in times))
    # Λ(tᵢ) is the i-th unit-rate arrival sᵢ: nothing thinned, nothing rejected.
    assert [curve.cumulative(t) for t in times] == pytest.approx(s, rel=1e-9)
    # so the count in each minute is the count of unit-rate arrivals in [Λ(a), Λ(b)) ...
    for a in range(0, 600, 60):
        lo, hi = curve.cumulative(a), curve.cumulative(a + 60)
        assert sum(a <= t < a + 60 for t in times) == sum(lo <= x < hi for x in s)
    # ... and the first arrival past 600 s is the next unit-rate arrival past Λ(600)
    assert s[-1] < curve.cumulative(600) <= s[-1] + unit.expovariate(1.0)


def test_hourly_counts_follow_a_diurnal_day():
    # A day at mean 2 req/s swinging ±80 %: each hour's count is a Poisson count of mean Λ(b) - Λ(a) (from 0.45 to
    # 3.55 req/s on average over the hour); seeded, each within 4 sd of its mean.
    day = parse_arrival_curve("diurnal:mean_rps=2,amplitude=0.8,peak_s=50400").curve()
    times = list(arrival_times_s(day, rng_for(0, "arrivals"), until_s=86400))
    for hour in range(24):
        a, b = 3600 * hour, 3600 * (hour + 1)
        expected = day.cumulative(b) - day.cumulative(a)
        count = sum(a <= t < b for t in times)
        assert abs(count - expected) <= 4 * math.sqrt(expected), (hour, count, expected)
    busiest = max(range(24), key=lambda h: sum(3600 * h <= t < 3600 * (h + 1) for t in times))
    assert busiest in (13, 14)


def test_a_constant_curve_draws_what_arrival_rate_rps_draws():
    gaps = rng_for(3, "arrivals")
    t, expected = 0.0, []
    for _ in range(50):
        t += gaps.expovariate(2.5)
        expected.append(t)
    assert list(arrival_times_s(ConstantCurve(2.5), rng_for(3, "arrivals"), limit=50)) == expected
    assert list(arrival_times_s(ConstantCurve(2.5), rng_for(3, "arrivals"), until_s=expected[9])) == expected[:9]


def _trace(times):
    return [TraceRequest(t, Request(request_id=i, prompt_tokens=16, output_tokens=1, block_hashes=()))
            for i, t in enumerate(times)]


def test_warp_maps_a_trace_onto_a_step_curve():
    # Four requests at 1, 2, 2 and 4 s: r̄ = 4 / 4 s = 1 req/s. The curve: 1 req/s for 2 s, then 3 req/s, so
    # Λ⁻¹(y) = y up to 2, then 2 + (y - 2) / 3. The two requests at 2 s stay together, the one at 4 s comes at
    # 2 + 2/3 s, where the curve expects 4 arrivals.
    trace = _trace([1.0, 2.0, 2.0, 4.0])
    mean = trace_mean_rps(len(trace), trace[-1].arrival_s)
    assert mean == 1.0
    warped = list(warp_trace(trace, _piecewise([[0, 1], [2, 3]], "step"), mean_rps=mean))
    assert [w.arrival_s for w in warped] == [1.0, 2.0, 2.0, 2 + 2 / 3]
    assert [w.request for w in warped] == [t.request for t in trace]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**8).map(lambda ms: ms / 1000), min_size=2, max_size=60).map(sorted)
       .filter(lambda ts: ts[-1] > 0))
def test_warp_keeps_order_and_lands_the_last_request_where_the_curve_expects_n(times):
    trace = _trace(times)
    mean = trace_mean_rps(len(trace), times[-1])
    day = parse_arrival_curve("diurnal:mean_rps=0.5,amplitude=0.9,period_s=7200").curve()
    warped = [w.arrival_s for w in warp_trace(trace, day, mean_rps=mean)]
    assert warped == sorted(warped)
    assert all(a == b for a, b, x, y in zip(warped, warped[1:], times, times[1:]) if x == y)  # ties stay ties
    assert day.cumulative(warped[-1]) == pytest.approx(len(times), rel=1e-9)
    # a constant curve is a pure time scale by r̄ / r
    flat = [w.arrival_s for w in warp_trace(trace, ConstantCurve(3.0), mean_rps=mean)]
    assert flat == pytest.approx([t * mean / 3.0 for t in times], rel=1e-12)


def test_warp_errors():
    with pytest.raises(ValueError, match="spans no time"):
        trace_mean_rps(3, 0.0)
    short = _piecewise([[0, 1], [2, 0]])  # 1 arrival in all
    with pytest.raises(ValueError, match="request 1: the curve brings only 1 arrivals in all"):
        list(warp_trace(_trace([1.0, 2.0]), short, mean_rps=1.0))


def test_cli_forms():
    assert parse_arrival_curve("4").rate_rps == 4.0
    assert parse_arrival_curve("constant:rate_rps=2.5").rate_rps == 2.5
    day = parse_arrival_curve("diurnal:mean_rps=4,amplitude=0.8,period_s=86400,peak_s=50400")
    assert (day.mean_rps, day.amplitude, day.period_s, day.peak_s) == (4, 0.8, 86400, 50400)
    ramp = parse_arrival_curve("piecewise:points=0:1/3600:8/7200:1,interpolation=step")
    assert ramp.points == [(0, 1), (3600, 8), (7200, 1)] and ramp.interpolation == "step"
    assert parse_arrival_curve("bursts:base_rps=2,bursts=600:60:20").bursts[0].extra_rps == 20


@pytest.mark.parametrize("spec, message", [
    ("diurnl:mean_rps=4", "unknown curve kind 'diurnl'; did you mean diurnal?"),
    ("diurnal:mean_rps=4,amplitude=1.5", "amplitude: Input should be less than or equal to 1"),
    ("diurnal:mean_rps=4,amplitud=0.5", "amplitud: unknown option of a diurnal curve; probably the required "
                                        "amplitude, misspelt"),
    ("diurnal:mean_rps=4,amplitude", "'amplitude' is not key=value"),
    ("constant:rate_rps=-1", "rate_rps: Input should be greater than 0"),
    ("piecewise:points=0:1/5", "points: '5' is not T:R (numbers; several separated by /)"),
    ("piecewise:points=1:1/5:2", "points: the first point is at t_s 0 (the arrivals' start), got 1"),
    ("piecewise:points=0:1/5:2/5:3", "points: times must increase strictly, got 5 after 5"),
    ("piecewise:points=0:0/5:0", "points: every rate is 0, so nothing ever arrives"),
    ("bursts:base_rps=1,bursts=10:0:5", "bursts.0.duration_s: Input should be greater than 0"),
    ("diurnal:mean_rps=nan,amplitude=0.5", "mean_rps: Input should be a finite number"),
])
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(ValueError) as err:
        parse_arrival_curve(spec)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, (ProblemsError, ValueError))


def test_a_mooncake_file_warped(tmp_path):
    # Three requests at 0, 1 and 2 s: r̄ = 3 / 2 s. Onto 3 req/s: Λ⁻¹(1.5·t) = t / 2, so 0, 500 and 1000 ms; the
    # other fields stay as they were.
    lines = [{"timestamp": ms, "input_length": 512, "output_length": 4, "hash_ids": [i]}
             for i, ms in enumerate((0, 1000, 2000))]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    warped = warped_mooncake(path, ConstantCurve(3.0))
    assert (warped.num_requests, warped.last_arrival_s, warped.mean_rps, warped.warped_last_arrival_s) == (3, 2.0, 1.5, 1.0)
    assert [json.loads(x) for x in warped.jsonl.decode().splitlines()] == [
        {**x, "timestamp": ms} for x, ms in zip(lines, (0, 500, 1000))]
    path.write_text(json.dumps(lines[1]) + "\n" + json.dumps(lines[0]) + "\n")
    with pytest.raises(TraceError, match=r"t.jsonl:2: field 'timestamp' goes backwards \(0 after 1000\)"):
        warped_mooncake(path, ConstantCurve(3.0))
