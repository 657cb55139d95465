"""Time predictions that carry over, against real vLLM (tests/fixtures/real-vllm-timing/, -long/; see their README).

The roofline time model of scenarios/tiny-cpu-long.yaml was fitted by `kvsim calibrate` on the six runs at
concurrency 1 and 4 of 612-token prompts (one server, N = 2, 7, 12) against the servers' queue + time to first token.
Held out, never fitted:
* the 612-token runs at concurrency 8 and 16: TTFT p50 within 30 %, throughput within 20 % — except where the
  measurement is known to fall short (`SHORTFALLS`, asserted at the measured error so that it cannot grow);
* the 2,448-token (~4x longer) runs at concurrency 1, 4 and 8: TTFT p50 within 30 %, no refit.
Each run is simulated with its own requests and recorded routing (`kvsim validate --ttft server`).

The shortfalls: at C = 8 the measured client stalled now and then for 0.5-1.3 s (the server's own timestamps put
the first token at 4-11 ms; the client shares a core with the server's EngineCore and API server), so fewer
requests were in the engine than the closed loop's 8. The simulation keeps 8 in flight: at N = 2 it preempts 25
times where vLLM preempted 7, hence its TTFT p50 of 11.8 ms against 6.4; and throughput, which the stalls cut, is
over-predicted by 36 % at N = 2 and 7 (8 % at N = 12).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from run_fixture_checks import assert_counters_agree
from sim.scenario import load_scenario
from sim.servers.run_csv import read_run
from sim.studies.validate import compare

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHORT = sorted((FIXTURES / "real-vllm-timing").glob("*.csv"))
LONG = sorted((FIXTURES / "real-vllm-long").glob("*.csv"))
SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "tiny-cpu-long.yaml"
FITTED_ON = {f"w1-n{n}-c{c}" for n in (2, 7, 12) for c in (1, 4)}
TTFT_P50_TOLERANCE = 0.30
THROUGHPUT_TOLERANCE = 0.20
SHORTFALLS = {  # run -> {metric: the bound it is held to instead (its measured error, rounded up)}
    "w1-n2-c8": {"ttft_p50_ms": 0.90, "throughput_rps": 0.40},
    "w1-n7-c8": {"throughput_rps": 0.40},
}


@pytest.fixture(scope="module")
def fitted():
    return load_scenario(SCENARIO)[0]


def test_the_fixture_sets_are_complete():
    assert {p.stem for p in SHORT} == FITTED_ON | {"w1-n2-c8", "w1-n7-c8", "w1-n12-c8", "w1-n7-c16", "w1-n12-c16"}
    assert {p.stem for p in LONG} == {"w1-n2-c1", "w1-n7-c1", "w1-n12-c1", "w1-n2-c4", "w1-n7-c4", "w1-n12-c4",
                                      "w1-n7-c8"}
    for path in SHORT + LONG:
        run = read_run(path)
        assert run.setup.engine.version == "0.32.0" and not any(r.error for r in run.rows)
        assert run.setup.prompt_tokens == (612 if path in SHORT else 2448)


@pytest.mark.parametrize("path", SHORT + LONG, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_measurement_agrees_with_the_servers_counters(path):
    assert_counters_agree(path)  # preemptions happen here at C >= 8, as vLLM's counters say


def test_the_scenario_was_fitted_on_concurrency_1_and_4_only(fitted):
    assert fitted.time_model.kind == "roofline"
    assert {e.split(":")[0] for e in fitted.calibration.fitted_on} == FITTED_ON


def _errors(scenario, path) -> dict[str, float]:
    return {c.metric: c.relative_error for c in compare(scenario, read_run(path), ttft_source="server")}


@pytest.mark.parametrize("path", [p for p in SHORT if p.stem not in FITTED_ON], ids=lambda p: p.stem)
def test_higher_concurrency_is_predicted_from_the_fit_on_1_and_4(path, fitted):
    errors = _errors(fitted, path)
    print(path.stem, {k: f"{100 * v:+.0f}%" for k, v in errors.items() if k.startswith(("ttft", "throughput", "e2e"))})
    bounds = {"ttft_p50_ms": TTFT_P50_TOLERANCE, "throughput_rps": THROUGHPUT_TOLERANCE, **SHORTFALLS.get(path.stem, {})}
    for metric, bound in bounds.items():
        assert abs(errors[metric]) <= bound, (metric, errors[metric])


@pytest.mark.parametrize("path", LONG, ids=lambda p: p.stem)
def test_four_times_longer_prompts_are_predicted_without_a_refit(path, fitted):
    errors = _errors(fitted, path)
    print(path.stem, {k: f"{100 * v:+.0f}%" for k, v in errors.items() if k.startswith(("ttft", "throughput", "e2e"))})
    assert abs(errors["ttft_p50_ms"]) <= TTFT_P50_TOLERANCE
