"""The composition roots give a fixed fleet its device time: `run` over the measured phase, `replay` over the
simulated span, the same whether a replay runs in one process or is split over several."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.replay import replay, with_device_time
from sim.results.cost import DeviceTime
from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import load_scenario, with_gpu_price
from sim.workloads.traces import read_mooncake
from tests.support.paths import SCENARIOS, TRACES

SYNTHETIC = TRACES / "synthetic_head300.jsonl"


def test_a_run_pays_for_every_device_over_the_measured_phase():
    base, _ = load_scenario()  # 3 workers: the RTX 3090 ($0.113/h) and two RTX 4070 Laptop GPUs ($0.068/h each)
    scenario = base.with_overrides(**{"cluster.workers": 3, "workload.prefixes": 2, "workload.min_requests": 40})
    result = run(scenario)
    span_s = result.measured_end_s - result.measured_start_s
    assert result.device_time == scenario.fleet_device_time(span_s)
    assert [t.seconds for t in result.device_time] == [span_s] * 3
    row = summarize(result).row()
    assert row["gpu_hours"] == pytest.approx(3 * span_s / 3600)
    assert row["usd_per_hour"] == pytest.approx(0.249)             # 0.113 + 2 x 0.068, busy or idle
    measured = result.measured
    tokens = sum(r.prompt_tokens + r.output_tokens for r in measured)
    assert row["usd_per_million_tokens"] == pytest.approx(row["cost_usd"] / tokens * 1e6)


@pytest.fixture(scope="module")
def priced():
    s, _ = load_scenario(SCENARIOS / "trace-replay.yaml")  # a linear time model: no hardware, so a price is given
    return with_gpu_price(s.with_overrides(**{"cluster.workers": 4, "router.name": "round-robin",
                                              "router.options": {}}), 2.0)


def test_a_replay_pays_for_its_devices_over_the_simulated_span_in_one_process_or_several(priced):
    one = replay(priced, read_mooncake(SYNTHETIC, block_size=512))
    split = replay(priced, lambda: read_mooncake(SYNTHETIC, block_size=512), jobs=2)
    assert split.jobs == 2
    assert one.device_time == split.device_time == priced.fleet_device_time(one.simulated_s)
    row = one.row()
    assert row["gpu_hours"] == pytest.approx(4 * one.simulated_s / 3600)
    assert row["usd_per_hour"] == pytest.approx(8.0)                # 4 devices x $2
    assert row["cost_usd"] == pytest.approx(8.0 * one.simulated_s / 3600)


def test_a_result_that_carries_its_own_device_time_keeps_it(priced):
    # What an elastic fleet hands over: slot 0 provisioned 10 s, slot 1 only 4 s (it started late).
    result = replay(priced, read_mooncake(SYNTHETIC, block_size=512, limit=5))
    own = (DeviceTime("gpu-0", None, 1, 2.0, 10.0), DeviceTime("gpu-1", None, 1, 2.0, 4.0))
    assert with_device_time(priced, replace(result, device_time=own)).device_time == own
