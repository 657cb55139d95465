"""Time predictions that carry over, against real vLLM (tests/fixtures/real-vllm-timing/, -long/; see their README).

The roofline time model of scenarios/tiny-cpu-long.yaml was fitted by `kvsim calibrate` on the six runs at
concurrency 1 and 4 of 612-token prompts (one server, N = 2, 7, 12) against the servers' queue + time to first
token. Held out, never fitted:
* the 612-token runs at concurrency 8 and 16: TTFT p50 within 30 %, throughput within 20 %;
* the 2,448-token (~4x longer) runs at concurrency 1, 4 and 8: TTFT p50 within 30 %, no refit;
except where the measurement is known to fall short (`SHORTFALLS`, asserted at the measured error, rounded up, so
that it cannot grow). Each run is simulated with its own requests and recorded routing (`kvsim validate --ttft
server`). The same 18 runs measured before the client was protected from starvation (`-starved/`) are checked the
same way: they are the measurement's repeatability.

The shortfalls:
* the long prompts at N = 2, concurrency 4: the simulated closed loop keeps its 4 clients in lockstep (identical hits,
  identical service: all 4 arrive in one step and prefill together, 36.9 ms), where the real clients drifted apart
  (sends 50-80 ms apart) and prefilled alone (13.6 ms). In the first measurement of the same run they had not
  drifted: 30.3 ms;
* the long prompts at N = 7 and 12, concurrency 4: 72.3 and 83.7 ms measured against 50.0 and 78.2 the first time: the
  measurement repeats to within 45 % here, the prediction (44.1, 58.6 ms) lies within 30 % of the first;
* in the first (starved) measurement at concurrency 8, the client stalled now and then for 0.5-1.3 s (the server's own
  timestamps put those first tokens at 4-11 ms): fewer than 8 requests were in the engine, so kvsim's 8 preempt
  more (TTFT +79 % at N = 2) and its throughput is over-predicted where the stalls cut it (+41-45 % at N = 2, 7).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenario import load_scenario
from sim.servers.run_csv import read_run
from sim.studies.validate import compare
from tests.support.paths import FIXTURES, SCENARIOS
from tests.support.run_fixture_checks import assert_counters_agree

SETS = ("", "-starved")  # the fixtures, and the same runs measured with the client starved of CPU
SHORT = {s: sorted((FIXTURES / f"real-vllm-timing{s}").glob("*.csv")) for s in SETS}
LONG = {s: sorted((FIXTURES / f"real-vllm-long{s}").glob("*.csv")) for s in SETS}
SCENARIO = SCENARIOS / "tiny-cpu-long.yaml"
FITTED_ON = {f"w1-n{n}-c{c}" for n in (2, 7, 12) for c in (1, 4)}
HELD_OUT_SHORT = {"w1-n2-c8", "w1-n7-c8", "w1-n12-c8", "w1-n7-c16", "w1-n12-c16"}
TTFT_P50_TOLERANCE = 0.30
THROUGHPUT_TOLERANCE = 0.20
SHORTFALLS = {  # (set, workload, run) -> {metric: the bound it is held to instead (its measured error, rounded up)}
    # N = 2: seven of eight requests hit 2,048 of their 2,448 tokens; the real server's TTFT p50 at concurrency 4 is
    # a few ms and kvsim's several times that
    ("", "long", "w1-n2-c4"): {"ttft_p50_ms": 2.65},
    ("-starved", "long", "w1-n2-c4"): {"ttft_p50_ms": 0.65},
    ("", "long", "w1-n12-c4"): {"ttft_p50_ms": 0.35},
    ("", "short", "w1-n2-c8"): {"ttft_p50_ms": 0.55},
    ("-starved", "short", "w1-n2-c8"): {"ttft_p50_ms": 1.25, "throughput_rps": 0.35},
    ("-starved", "short", "w1-n7-c8"): {"throughput_rps": 0.35},
}


@pytest.fixture(scope="module")
def fitted():
    return load_scenario(SCENARIO)[0]


@pytest.mark.parametrize("which", SETS)
def test_the_fixture_sets_are_complete(which):
    assert {p.stem for p in SHORT[which]} == FITTED_ON | HELD_OUT_SHORT
    assert {p.stem for p in LONG[which]} == {"w1-n2-c1", "w1-n7-c1", "w1-n12-c1", "w1-n2-c4", "w1-n7-c4",
                                             "w1-n12-c4", "w1-n7-c8"}
    for path in SHORT[which] + LONG[which]:
        run = read_run(path)
        assert run.setup.engine.version == "0.32.0" and not any(r.error for r in run.rows)
        assert run.setup.prompt_tokens == (612 if path in SHORT[which] else 2448)


@pytest.mark.parametrize("path", [p for s in SETS for p in SHORT[s] + LONG[s]], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_measurement_agrees_with_the_servers_counters(path):
    assert_counters_agree(path)  # preemptions happen here at concurrency >= 8, as vLLM's counters say


def test_the_scenario_was_fitted_on_concurrency_1_and_4_only(fitted):
    assert fitted.time_model.kind == "roofline"
    assert {e.split(":")[0] for e in fitted.calibration.fitted_on} == FITTED_ON


def _check(fitted, which: str, workload: str, path: Path, metrics: dict[str, float]) -> None:
    errors = {c.metric: c.relative_error for c in compare(fitted, read_run(path), ttft_source="server")}
    print(which or "fixtures", workload, path.stem,
          {k: f"{100 * v:+.0f}%" for k, v in errors.items() if k.startswith(("ttft", "throughput", "e2e"))})
    for metric, bound in {**metrics, **SHORTFALLS.get((which, workload, path.stem), {})}.items():
        assert abs(errors[metric]) <= bound, (metric, errors[metric])


@pytest.mark.parametrize(("which", "path"), [(s, p) for s in SETS for p in SHORT[s] if p.stem in HELD_OUT_SHORT],
                         ids=lambda v: v if isinstance(v, str) else v.stem)
def test_higher_concurrency_is_predicted_from_the_fit_on_1_and_4(which, path, fitted):
    _check(fitted, which, "short", path, {"ttft_p50_ms": TTFT_P50_TOLERANCE, "throughput_rps": THROUGHPUT_TOLERANCE})


@pytest.mark.parametrize(("which", "path"), [(s, p) for s in SETS for p in LONG[s]],
                         ids=lambda v: v if isinstance(v, str) else v.stem)
def test_four_times_longer_prompts_are_predicted_without_a_refit(which, path, fitted):
    _check(fitted, which, "long", path, {"ttft_p50_ms": TTFT_P50_TOLERANCE})
