"""A small, fast scenario and synthetic 'measurements' made by simulating it (for calibration tests)."""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

from sim.scenario import Scenario, load_scenario
from sim.studies.calibrate import Simulator, Target, apply_parameters, predict
from sim.studies.sweep import SweepRunner

POINTS = [(2, 2, 2), (2, 4, 3)]
CASES = ["2/2/2", "2/4/3"]
METRICS = ["ttft_hit_p50", "ttft_miss_p50", "ttft_p90"]


def small_scenario() -> Scenario:
    base, _ = load_scenario()
    return base.with_overrides(**{
        "workload.prefix_tokens": 256, "workload.tail_tokens": 64, "workload.output_tokens": 8,
        "workload.min_requests": 40, "workload.requests_per_prefix": 0,
        "engine.kv_cache_bytes": 60 * 16 * 114688, "cluster.workers": 2, "cluster.deployments": [],
        "reference": None,
    })


def synthetic_targets(truth: Scenario) -> list[Target]:
    with SweepRunner(1) as runner:
        results = Simulator(runner, repeats=1, seed=truth.seed).simulate(truth, CASES)
    targets = []
    for case, p in zip(CASES, POINTS):
        for m in METRICS:
            t = Target(case, p, m, 1.0, pooled=True)
            targets.append(Target(case, p, m, predict(t, results[case]), pooled=True))
    return targets


def write_calibration_inputs(folder: Path, truth: dict[str, float]) -> tuple[Path, Path]:
    """`small.yaml` (the small scenario) and `measured.csv` (its synthetic targets simulated with the `truth`
    parameters, in the reference's tidy format) in `folder`: the --scenario and --measured of a calibration."""
    scenario = small_scenario()
    targets = synthetic_targets(apply_parameters(scenario, truth))
    scenario_file = folder / "small.yaml"
    scenario_file.write_text(yaml.safe_dump(scenario.model_dump(mode="json")))
    measured = folder / "measured.csv"
    with measured.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workers", "prefixes", "concurrency", "metric", "value", "unit", "aggregation"])
        for t in targets:
            w.writerow([*t.point, t.metric, t.measured, "ms", "runs pooled"])
    return scenario_file, measured
