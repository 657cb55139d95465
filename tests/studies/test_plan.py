"""Capacity planning: the analytic screen agrees with steady-state simulation where its assumptions hold, and
`kvsim plan capacity` answers with a table, plan.csv and a figure."""

from __future__ import annotations

import csv
import statistics

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import load_scenario
from sim.studies import analytic
from sim.studies.plan import (
    Evaluation,
    PlanSpec,
    PlanTarget,
    analytic_hit_rate,
    configure,
    make_grid,
    plan,
    transient_requests,
)
from sim.studies.sweep import run_sweep, sweep_points


@pytest.fixture(scope="module")
def baseline():
    return load_scenario()[0]


def _steady_hit_rate(scenario, router, repeats=4):
    points = sweep_points(workers=[scenario.cluster.workers], prefixes=[scenario.workload.prefixes],
                          concurrency=[scenario.workload.concurrency], routers=[router], repeats=repeats,
                          seed=scenario.seed)
    return statistics.fmean(o.row["request_hit_rate"] for o in run_sweep(scenario, points))


@pytest.mark.parametrize("exponent", [0.8, 1.2])
@pytest.mark.slow
def test_che_block_model_tracks_zipf_simulation_within_three_points(baseline, exponent):
    # Random routing thins the stream into independent per-worker streams (Che's assumption); at steady state the
    # Che-style block model must be within 3 points of the simulation.
    discard = transient_requests("random", 6, 24)
    scenario = baseline.with_overrides(**{
        "workload.prefixes": 24, "workload.popularity": "zipf", "workload.zipf_exponent": exponent,
        "workload.min_requests": discard + 1000, "workload.requests_per_prefix": 0, "workload.discard_first": discard})
    simulated = _steady_hit_rate(scenario, "random")
    K, U = analytic.shared_prefix_blocks(2032, 2371, 64, 16)
    model = analytic.random_routing_hit_rates(
        workers=6, popularity=analytic.zipf_popularity(24, exponent), prefix_blocks=K, own_blocks=U,
        usable_blocks=scenario.num_blocks - 1, block_size=16, prompt_tokens=2371)
    print(f"Zipf {exponent}: simulated {simulated:.3f}, Che block model {model.request_hit_rate:.3f}")
    assert abs(model.request_hit_rate - simulated) <= 0.03


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_kv_gib_candidate_sets_the_capacity_even_over_a_block_count_override(baseline, engine):
    # A scenario that fixes its capacity by count (vLLM num_gpu_blocks_override, SGLang max_total_tokens): each
    # kv-gib candidate replaces it through the engine's own rule, as tune's kv-gib knob does, so 2 GiB is 2 GiB.
    base = baseline.with_engine(engine)
    base = base.with_overrides(**base.engine.capacity_overrides(tokens=4000))
    spec = PlanSpec(vary="kv-gib", grid=(2.0,), target=PlanTarget(hit_rate=0.5), horizon_requests=100)
    scenario = configure(base, spec, "random", 2.0)
    assert scenario.engine.kv_cache_bytes == 2 * 2**30
    assert scenario.capacity_tokens == configure(baseline.with_engine(engine), spec, "random", 2.0).capacity_tokens
    assert scenario.capacity_tokens > base.capacity_tokens


@pytest.mark.slow
def test_uniform_steady_state_screen_within_two_points(baseline):
    spec = PlanSpec(vary="kv-gib", grid=(2.0,), target=PlanTarget(hit_rate=0.5), horizon_requests=1000)
    scenario = configure(baseline.with_overrides(**{"workload.prefixes": 12}), spec, "random", 2.0)
    simulated = _steady_hit_rate(scenario, "random")
    predicted = analytic_hit_rate(scenario, "random")
    print(f"uniform N=12, 2 GiB: simulated {simulated:.3f}, block model {predicted:.3f}")
    assert abs(predicted - simulated) <= 0.02


def test_an_evaluation_of_three_runs_has_the_student_t_interval():
    # Three runs (plan's default): hit rates 0.50, 0.56, 0.59 have mean 0.55 and sd 0.045826; the 95 % half-width is
    # t(0.975, 2) = 4.302653 times sd / sqrt(3) = 0.113838, not the normal z = 1.96 times it (0.051857: 2.2x too narrow).
    e = Evaluation(2.0, hit_rates=(0.50, 0.56, 0.59), ttft_p99_ms=(200.0, 210.0, 230.0))
    assert e.hit_rate == pytest.approx(0.55)
    assert e.hit_rate_ci95 == pytest.approx(4.302653 * 0.0458258 / 3 ** 0.5, rel=1e-5)
    assert e.hit_rate_ci95 == pytest.approx(0.113838, rel=1e-5)
    assert e.ttft_p99 == pytest.approx(640 / 3)
    assert e.ttft_p99_ci95 == pytest.approx(4.302653 * 15.275252 / 3 ** 0.5, rel=1e-5)
    one = Evaluation(2.0, hit_rates=(0.5,), ttft_p99_ms=(200.0,))
    assert one.hit_rate == 0.5 and one.hit_rate_ci95 != one.hit_rate_ci95  # NaN: one run has no spread


@pytest.mark.slow
def test_plan_finds_the_smallest_value_meeting_the_target(baseline):
    spec = PlanSpec(vary="kv-gib", grid=make_grid("kv-gib", 1.0, 4.0, 0.5), target=PlanTarget(hit_rate=0.6),
                    repeats=2, horizon_requests=300, routers=("random",))
    [result] = plan(baseline.with_overrides(**{"workload.prefixes": 8}), spec, jobs=1)
    assert result.answer is not None
    by_value = {e.value: e for e in result.evaluations}
    assert by_value[result.answer].hit_rate >= 0.6
    below = [e for e in result.evaluations if e.value < result.answer]
    assert below and all(e.hit_rate < 0.6 for e in below)
    assert result.analytic_answer is not None and abs(result.analytic_answer - result.answer) <= 1.0


@pytest.mark.slow
def test_plan_reports_none_when_out_of_range(baseline):
    spec = PlanSpec(vary="workers", grid=make_grid("workers", 1, 3, 1), target=PlanTarget(hit_rate=0.99),
                    repeats=2, horizon_requests=200, routers=("random",))
    [result] = plan(baseline.with_overrides(**{"workload.prefixes": 24}), spec, jobs=1)
    assert result.answer is None


@pytest.mark.slow
def test_plan_command_writes_csv_and_figure(tmp_path):
    res = CliRunner().invoke(main, ["plan", "capacity", "--prefixes", "8", "--target-hit-rate", "0.6", "--vary",
                                    "kv-gib",
                                    "--min", "1", "--max", "3", "--step", "0.5", "--router", "random,prefix-hash",
                                    "--repeats", "2", "--horizon", "200", "--jobs", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "plan.csv").open()))
    assert [r["router"] for r in rows] == ["random", "prefix-hash"]
    assert set(rows[0]) >= {"router", "vary", "answer", "unit", "predicted", "target", "analytic_answer"}
    assert rows[0]["unit"] == "GiB" and float(rows[0]["target"]) == 0.6
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_rejects_a_missing_target():
    res = CliRunner().invoke(main, ["plan", "capacity", "--vary", "workers"])
    assert res.exit_code != 0 and "give a target" in res.output and "Traceback" not in res.output
