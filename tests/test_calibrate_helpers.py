"""A small, fast scenario and synthetic 'measurements' made by simulating it (for calibration tests)."""

from __future__ import annotations

from sim.studies.calibrate import Simulator, Target, predict
from sim.scenario import Scenario, load_scenario
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
