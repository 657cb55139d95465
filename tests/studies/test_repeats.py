"""Repeated runs of one setup in `kvsim validate`: grouping, the error beyond the measured range, the bootstrap."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.servers.run_csv import read_run
from sim.studies.repeats import RepeatComparison, bootstrap_interval, repeat_groups
from tests.studies.test_validate import simulated_run_files

FIXTURES = "tests/fixtures"


def test_runs_of_one_setup_are_repeats_whatever_their_names(tmp_path):
    a = read_run(f"{FIXTURES}/real-vllm-timing/w1-n7-c4.csv")
    b = read_run(f"{FIXTURES}/real-vllm-timing-starved/w1-n7-c4.csv")   # same setup, measured another day
    c = read_run(f"{FIXTURES}/real-vllm-timing/w1-n7-c8.csv")           # another concurrency
    groups = repeat_groups([a, c, b])
    assert [[r.csv_path for r in g] for g in groups] == [[a.csv_path, b.csv_path]]


def test_error_is_the_distance_outside_the_measured_range():
    inside = RepeatComparison("g", "ttft_p99_ms", (100.0, 150.0, 120.0), (130.0, 130.0), (math.nan, math.nan))
    above = RepeatComparison("g", "ttft_p99_ms", (100.0, 150.0), (180.0, 180.0), (math.nan, math.nan))
    below = RepeatComparison("g", "ttft_p99_ms", (100.0, 150.0), (80.0, 90.0), (math.nan, math.nan))
    assert inside.error == 0.0 and inside.measured == 120.0
    assert above.error == 30.0 and above.relative_error == pytest.approx(0.2)        # 30 beyond 150
    assert below.predicted == 85.0 and below.relative_error == pytest.approx(-0.15)  # 15 below 100


def test_bootstrap_interval_is_seeded_and_covers_the_percentile():
    values = np.random.default_rng(1).exponential(10.0, size=400)
    lo, hi = bootstrap_interval(values, 90)
    assert (lo, hi) == bootstrap_interval(values, 90)
    assert lo < np.percentile(values, 90) < hi
    assert all(math.isnan(v) for v in bootstrap_interval(values[:5], 90))   # too few requests for an interval


def test_validate_holds_a_group_to_its_range(tmp_path):
    # The same kvsim-made run twice (two directories): a group whose range is one value; kvsim predicts itself,
    # so every figure is inside, up to the CSV's rounding, and passes a 1 % tolerance on the group, with the interval printed.
    (tmp_path / "a").mkdir()
    run_a = simulated_run_files(tmp_path / "a", name="run")
    (tmp_path / "b").mkdir()
    run_b = tmp_path / "b" / "run.csv"
    shutil.copy(run_a, run_b)
    shutil.copy(run_a.with_suffix(".json"), run_b.with_suffix(".json"))
    out = tmp_path / "rows.csv"
    result = CliRunner().invoke(main, ["validate", str(run_a), str(run_b), "--tolerance", "ttft_p90_ms=1%",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "run (2 repeats)" in result.output and "repeats" in result.output
    header = out.read_text().splitlines()[0]
    assert header.endswith("measured_low,measured_high,predicted_low,predicted_high")


def test_a_tolerance_applies_beyond_the_range():
    from sim.studies.validate import Tolerance

    above = RepeatComparison("g", "ttft_p99_ms", (100.0, 150.0), (180.0,), (math.nan, math.nan))   # 20 % beyond
    assert Tolerance.parse("ttft_p99_ms=10%").violated_by(above)
    assert not Tolerance.parse("ttft_p99_ms=25%").violated_by(above)
    assert not Tolerance.parse("ttft_p99_ms=25%").violated_by(
        RepeatComparison("g", "ttft_p99_ms", (100.0, 250.0), (240.0,), (math.nan, math.nan)))  # inside a wide spread


def test_only_the_repeats_themselves_are_checked_as_a_group(tmp_path):
    # Two repeats named `run` and a third `run` of another setup (another concurrency): the third is checked on its
    # own, although it shares their name.
    from sim.cli.real_servers import _check
    from sim.studies.validate import Tolerance, compare_runs
    from sim.scenario import load_scenario

    paths = []
    for d, concurrency in (("a", 4), ("b", 4), ("c", 8)):
        (tmp_path / d).mkdir()
        path = simulated_run_files(tmp_path / d, name="run", concurrency=concurrency)
        paths.append(path)
    runs = [read_run(p) for p in paths]
    per_run, grouped = compare_runs(load_scenario()[0], runs)
    flags = {(str(c.run), c.in_repeats) for c in per_run if c.metric == "ttft_p50_ms"}
    assert sorted(c.in_repeats for c in per_run if c.metric == "ttft_p50_ms") == [False, True, True], flags
    tolerances = [Tolerance.parse("ttft_p50_ms=50%")]
    lone = next(c for c in per_run if c.metric == "ttft_p50_ms" and not c.in_repeats)
    assert _check(lone, tolerances, []) == "ok"
    assert {_check(c, tolerances, []) for c in per_run if c.metric == "ttft_p50_ms" and c.in_repeats} == {"repeats"}
    assert len({c.run for c in grouped}) == 1
