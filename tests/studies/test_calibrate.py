"""Calibration: parameter addressing, aggregation of predictions, recovery of known parameters, determinism,
and the shipped calibrated scenario against the reference TTFTs."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.results.records import TtftSamples
from sim.scenario import ScenarioError, load_scenario
from sim.studies.calibrate import (
    Latencies,
    Simulator,
    Target,
    apply_parameters,
    fit,
    predict,
    read_parameter,
    targets_from_reference,
)
from sim.studies.reference import Measurement, load_reference
from sim.studies.sweep import SweepRunner
from tests.support.calibration_inputs import small_scenario, synthetic_targets, write_calibration_inputs


def test_parameters_are_read_and_set_by_address():
    scenario, _ = load_scenario()
    assert read_parameter(scenario, "time_model.compute_efficiency") == scenario.time_model.compute_efficiency
    assert read_parameter(scenario, "cluster.request_overhead_s") == scenario.cluster.request_overhead_s
    changed = apply_parameters(scenario, {"device.gpu-24gb.speed": 7.0, "time_model.step_overhead_s": 0.001})
    # a device parameter applies to every device of that name, in every deployment
    speeds = [d.speed for dep in changed.cluster.deployments for d in dep.devices if d.name == "gpu-24gb"]
    assert speeds == [7.0, 7.0]
    assert changed.time_model.step_overhead_s == 0.001
    with pytest.raises(ValueError, match="no device named 'tpu'"):
        read_parameter(scenario, "device.tpu.speed")
    with pytest.raises(ValueError, match="no such scenario field"):
        read_parameter(scenario, "time_model.warp_s")
    with pytest.raises(ValueError, match=r"time_model.attention_efficiency: unset in the scenario \(give it a starting"):
        read_parameter(scenario, "time_model.attention_efficiency")  # it follows compute_efficiency unless set
    with pytest.raises(ScenarioError):
        apply_parameters(scenario, {"device.gpu-24gb.sharing_efficiency": 3.0})
    with pytest.raises(ScenarioError, match="compute_efficiency"):
        apply_parameters(scenario, {"time_model.compute_efficiency": 1.5})


def test_efficiencies_are_fitted_within_the_peaks():
    from sim.studies.calibrate import parameter_bounds

    assert parameter_bounds("time_model.memory_efficiency") == (1e-3, 1.0)
    assert parameter_bounds("device.gpu-24gb.sharing_efficiency") == (0.2, 1.0)
    assert parameter_bounds("time_model.step_overhead_s") == (1e-9, 2.0)


def test_targets_keep_the_reference_aggregation():
    ms = [
        Measurement(6, 2, 4, "ttft_hit_p50", 37, "ms", "3 runs pooled"),
        Measurement(6, 2, 4, "ttft_p99", 122, "ms", "median of 3 runs"),
        Measurement(6, 2, 4, "request_hit_rate", 0.95, "fraction", "median of 3 runs"),
    ]
    targets = targets_from_reference(ms)
    assert [(t.metric, t.pooled) for t in targets] == [("ttft_hit_p50", True), ("ttft_p99", False)]


def _outcome(hit, miss, rps=1.0):
    return Latencies(TtftSamples(tuple(hit), tuple(miss)), rps)


def test_predictions_pool_or_take_the_median_of_runs_as_the_measurement_did():
    runs = [_outcome([10, 20], [100]), _outcome([30], [200, 300]), _outcome([40], [400])]
    pooled = Target("1/1/1", (1, 1, 1), "ttft_hit_p50", 1.0, pooled=True)
    per_run = Target("1/1/1", (1, 1, 1), "ttft_hit_p50", 1.0, pooled=False)
    assert predict(pooled, runs) == pytest.approx(25.0)  # median of 10, 20, 30, 40
    assert predict(per_run, runs) == pytest.approx(30.0)  # median of 15, 30, 40
    assert predict(Target("1/1/1", (1, 1, 1), "ttft_p50", 1.0, pooled=True), runs) == pytest.approx(70.0)  # all 8 pooled
    assert predict(Target("1/1/1", (1, 1, 1), "throughput_rps", 1.0, pooled=False),
                   [_outcome([1], [], 2.0), _outcome([1], [], 4.0), _outcome([1], [], 9.0)]) == 4.0


@pytest.mark.slow
def test_fit_recovers_known_parameters_and_is_deterministic():
    truth = {"time_model.compute_efficiency": 0.3, "cluster.request_overhead_s": 0.02}
    scenario = small_scenario()
    targets = synthetic_targets(apply_parameters(scenario, truth))
    start = apply_parameters(scenario, {"time_model.compute_efficiency": 0.5, "cluster.request_overhead_s": 0.035})
    kwargs = dict(repeats=1, jobs=1, starts=4, refine=1, max_evaluations=60)
    first = fit(start, targets, list(truth), **kwargs)
    again = fit(start, targets, list(truth), **kwargs)
    assert first.parameters == again.parameters
    # NOTE: percentiles of a few dozen simulated requests jump when event order changes, so the objective is
    # jagged near the truth (a 3 % parameter change moves one p90 by 5 %): recovery within 10 % is the honest bar.
    for name, value in truth.items():
        assert first.parameters[name] == pytest.approx(value, rel=0.10), (name, first.parameters)
    assert first.rms_log_error(used_in_fit=True) < 0.05


def test_holdout_figures_are_reported_but_not_fitted():
    scenario = small_scenario()
    targets = synthetic_targets(scenario)
    result = fit(scenario, targets, ["time_model.step_overhead_s"], holdout=lambda t: t.point[1] == 4,
                 repeats=1, jobs=1, starts=0, refine=1, max_evaluations=5)
    used = {r.target.point[1] for r in result.residuals if r.used_in_fit}
    held = {r.target.point[1] for r in result.residuals if not r.used_in_fit}
    assert used == {2} and held == {4}


def test_calibrate_command_writes_a_loadable_scenario_and_the_residuals(tmp_path):
    scenario_file, measured = write_calibration_inputs(tmp_path, {"time_model.step_overhead_s": 0.004})
    out = tmp_path / "fitted" / "fitted.yaml"
    report = tmp_path / "residuals.csv"
    res = CliRunner().invoke(main, ["calibrate", "--scenario", str(scenario_file), "--measured", str(measured),
                                    "--fit", "time_model.step_overhead_s", "--holdout", "prefixes=4",
                                    "--repeats", "1", "--starts", "2", "--refine", "1", "--max-evaluations", "15",
                                    "--jobs", "1", "--out", str(out), "--report", str(report)])
    assert res.exit_code == 0, res.output
    fitted, _ = load_scenario(out)
    assert "slo:" not in out.read_text()  # no SLO set: no block of nulls
    assert fitted.time_model.step_overhead_s == pytest.approx(0.004, rel=0.1)
    assert fitted.calibration.fitted_on and fitted.calibration.held_out
    assert fitted.calibration.fit_rms_log_error is not None
    rows = list(csv.DictReader(report.open()))
    assert set(rows[0]) == {"point", "metric", "measured", "predicted", "error", "used_in_fit"}
    assert len(rows) == len(list(csv.DictReader(measured.open())))  # a residual per measured figure


def test_calibrate_rejects_an_unknown_parameter(tmp_path):
    res = CliRunner().invoke(main, ["calibrate", "--fit", "time_model.warp_s", "--out", str(tmp_path / "x.yaml")])
    assert res.exit_code != 0 and "no such scenario field" in res.output and "Traceback" not in res.output


# Tolerances of the calibrated model on the reference figures it was fitted on (see the calibration issue).
TOLERANCE = {"ttft_hit_p50": 0.10, "ttft_miss_p50": 0.10, "ttft_p50": 0.20, "ttft_p99": 0.35,
             "ttft_hit_p90": 0.25, "ttft_miss_p90": 0.25}


@pytest.mark.slow
def test_shipped_scenario_reproduces_the_reference_latencies():
    scenario, path = load_scenario()
    targets = targets_from_reference(load_reference(path.parent / scenario.reference))
    assert len(targets) == 32
    with SweepRunner() as runner:
        results = Simulator(runner, repeats=3, seed=scenario.seed).simulate(scenario, [t.case for t in targets])
    misses = []
    for t in targets:
        error = predict(t, results[t.case]) / t.measured - 1
        if abs(error) > TOLERANCE[t.metric]:
            misses.append(f"{t.label}: {100 * error:+.1f} %")
    assert not misses, misses
