"""Device sharing against real vLLM: 1, 2 and 3 servers on 2 CPU cores (tests/fixtures/real-vllm-sharing/, its README).

scenarios/tiny-cpu-shared.yaml was fitted in two stages (benchmarks/studies/device-sharing/fit.sh): the time model on
one server at concurrency 1 and 4, the sharing on three servers at concurrency 1 and 4, server TTFT, short prompts,
reniced. Every run is simulated with its own requests and recorded routing; repeats of a setup are compared as a group
(`kvsim validate`): the error is how far the prediction lies outside the measured range over the repeats, relative to
its nearer end (sim/studies/repeats.py).

Held out: two servers (a server count not in the fit), concurrency 2, 8 and 16, the ~4x longer prompts, the starved
runs. The issue's goals: TTFT p50 within 25 %, p99 within 35 %, throughput here within 35 %. Where a figure misses, it
is held to its measured error rounded up (`SHORTFALLS`), so that it cannot grow unseen; docs/time/device-sharing.md
says what each miss is.
"""

from __future__ import annotations

import pytest

from sim.scenario import load_scenario
from sim.servers.run_csv import read_run
from sim.studies.repeats import RepeatComparison
from sim.studies.validate import compare_runs
from tests.support.paths import FIXTURES, SCENARIOS
from tests.support.run_fixture_checks import assert_counters_agree

ROOT = FIXTURES / "real-vllm-sharing"
SETS = ("short", "short-starved", "long")
RUNS = {s: sorted((ROOT / s).glob("*.csv")) for s in SETS}
# Measured again on 2026-12-03 with nothing else running (the sets above had other work on the machine at nice 19 /
# SCHED_IDLE): two and three servers 1.3-1.8x as fast. Not fitted yet; docs/time/device-sharing.md has the comparison.
QUIET = sorted((ROOT / "short-quiet").glob("*.csv"))
SCENARIO = SCENARIOS / "tiny-cpu-shared.yaml"
GOALS = {"ttft_p50_ms": 0.25, "ttft_p99_ms": 0.35, "throughput_rps": 0.35}
FITTED_ON = {("short", f"w{w}-n7-c{c}") for w in (1, 3) for c in (1, 4)}  # stage 1 on w1, stage 2 on w3
SHORTFALLS = {  # (set, setup) -> {metric: the bound it is held to instead (its error, rounded up to 0.05)}
    # one server: kvsim's engine at concurrency 8 queues longer than the real one (the time model's, not sharing)
    ("short", "w1-n7-c8"): {"ttft_p50_ms": 0.40},
    ("long", "w1-n7-c8"): {"ttft_p50_ms": 0.45},
    ("short-starved", "w1-n7-c1"): {"ttft_p99_ms": 0.40},
    ("short-starved", "w1-n7-c8"): {"ttft_p50_ms": 0.35},
    ("short-starved", "w1-n7-c16"): {"ttft_p50_ms": 0.45},
    # two servers (held out): the p99 too long at 2 (kvsim's admissions meet its long pauses; the measured
    # long stalls fall on one server's decode, not on its first token) and too short at 8 (the KV-bound queue of a
    # server drains faster than measured); throughput at 2 still over-predicted
    ("short", "w2-n7-c2"): {"ttft_p99_ms": 0.85, "throughput_rps": 0.40},
    ("short", "w2-n7-c8"): {"ttft_p99_ms": 0.40},
    # the long prompts at two servers: the medians about twice the measured (the real servers barely slow down with
    # long prompts: 3.3 requests/s at concurrency 1 against one server's 4.0, where short prompts fall from 5.3 to 2.3)
    ("long", "w2-n7-c1"): {"ttft_p50_ms": 1.25, "ttft_p99_ms": 0.80},
    ("long", "w2-n7-c4"): {"ttft_p50_ms": 1.20, "ttft_p99_ms": 1.05},
    ("long", "w2-n7-c8"): {"ttft_p50_ms": 1.05},
    # three servers: the median TTFT too high (fitted at 1 and 4), the p99 at 2 too long
    ("short", "w3-n7-c1"): {"ttft_p50_ms": 0.40},
    ("short", "w3-n7-c2"): {"ttft_p50_ms": 0.35, "ttft_p99_ms": 0.70},
    ("short", "w3-n7-c4"): {"ttft_p50_ms": 0.50},
    ("short", "w3-n7-c16"): {"ttft_p50_ms": 1.55},
}


@pytest.fixture(scope="module")
def groups() -> dict[tuple[str, str], dict[str, RepeatComparison]]:
    """(set, setup) -> metric -> the group's comparison, for every set's repeated setups."""
    scenario = load_scenario(SCENARIO)[0]
    out: dict[tuple[str, str], dict[str, RepeatComparison]] = {}
    for which in SETS:
        _, grouped = compare_runs(scenario, [read_run(p) for p in RUNS[which]], ttft_source="server")
        for c in grouped:
            out.setdefault((which, c.run.split("-r*")[0]), {})[c.metric] = c
    return out


def test_the_fixture_sets_are_complete():
    stems = {s: {p.stem for p in RUNS[s]} for s in SETS}
    assert stems["short"] == {f"w{w}-n7-c{c}-r{r}" for w in (1, 2, 3) for c in (1, 2, 4, 8, 16)
                              for r in range(1, 4 if w == 1 else 3)}
    assert stems["short-starved"] == {f"w{w}-n7-c{c}-r{r}" for w in (1, 2, 3) for c in (1, 2, 4, 8, 16)
                                      for r in range(1, 3 if w == 1 else 2)}
    assert stems["long"] == {f"w{w}-n7-c{c}-r{r}" for w in (1, 2) for c in (1, 4, 8) for r in (1, 2)}
    assert {p.stem for p in QUIET} == {f"w{w}-n7-c{c}-r{r}" for w in (1, 2, 3) for c in (1, 2, 4, 8, 16) for r in (1, 2)}
    assert all(r.server_generation_ms is not None for p in QUIET for r in read_run(p).rows)
    for which in SETS:
        for path in RUNS[which]:
            run = read_run(path)
            assert run.setup.engine.version == "0.32.0" and not any(r.error for r in run.rows)
            assert path.with_suffix(".cpu.json").exists()


@pytest.mark.parametrize("path", [p for s in SETS for p in RUNS[s]] + QUIET, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_measurement_agrees_with_the_servers_counters(path):
    assert_counters_agree(path)


def test_the_scenario_was_fitted_on_three_servers_at_1_and_4():
    scenario = load_scenario(SCENARIO)[0]
    assert {e.split(":")[0] for e in scenario.calibration.fitted_on} == {f"w3-n7-c{c}-r{r}" for c in (1, 4)
                                                                         for r in (1, 2)}
    devices = {d.workers: d for dep in scenario.cluster.deployments for d in dep.devices}
    assert devices[1].host_load == 0.92 and devices[1].cores == 2
    # physically plausible: an idle server demands at most a core (its worker spins on its queue, its EngineCore polls
    # it; two servers' workers use 1.28-1.41 cores between them at concurrency 1, one stepping); the share left while
    # shared is most of it; stalls last tenths of a second and take a few percent of the time per unit of
    # oversubscription; a step's hand-overs wait milliseconds for their time slices (a scheduler's slice)
    d = devices[2]
    assert 0 < d.idle_load <= 1 and 0.5 < d.sharing_efficiency <= 1 and 0.05 < d.pause_s < 1 and d.pause_fraction < 0.2
    assert 0.0005 < d.handoff_s < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("which", SETS)
def test_every_repeated_setup_within_its_goal_or_known_shortfall(which, groups):
    checked = 0
    for (s, setup), by_metric in sorted(groups.items()):
        if s != which:
            continue
        bounds = {**GOALS, **SHORTFALLS.get((s, setup), {})}
        errors = {m: by_metric[m].relative_error for m in GOALS}
        print(s, setup, "fitted" if (s, setup) in FITTED_ON else "held out",
              {m: f"{100 * e:+.0f}%" for m, e in errors.items()})
        for metric, error in errors.items():
            assert abs(error) <= bounds[metric], (setup, metric, error)
        checked += 1
    assert checked >= 5


@pytest.mark.slow
def test_two_servers_held_out_ttft_mostly_within_the_goals(groups):
    # the held-out server count: the median TTFT within 25 % of the measured range at every concurrency, the p99
    # within 35 % at 1, 4 and 16 (not at 2 and 8: SHORTFALLS)
    def within(metric, goal):
        return [c for c in (1, 2, 4, 8, 16)
                if abs(groups[("short", f"w2-n7-c{c}")][metric].relative_error) <= goal]
    assert within("ttft_p50_ms", 0.25) == [1, 2, 4, 8, 16]
    assert within("ttft_p99_ms", 0.35) == [1, 4, 16]
