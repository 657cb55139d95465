"""Device time and its cost (`sim.results.cost`): narrated sums."""

from __future__ import annotations

import math
import re
from importlib import resources

import pytest
import yaml

from sim.results.cost import COST_COLUMNS, DeviceTime, cost_columns, total_cost_usd, total_gpu_hours
from sim.timing.hardware import hardware_profiles


def test_two_devices_for_half_an_hour_sum_their_gpu_hours_and_cost():
    # An H100 x2 device at $4.00 a GPU-hour and an L4 at $0.80, each provisioned for 1,800 s (half an hour).
    h100 = DeviceTime(device="dev0", hardware="h100-sxm", gpus=2, price_per_hour_usd=4.0, seconds=1800.0)
    l4 = DeviceTime(device="dev1", hardware="l4", gpus=1, price_per_hour_usd=0.8, seconds=1800.0)
    assert (h100.gpu_hours, l4.gpu_hours) == (1.0, 0.5)          # 2 GPUs x 0.5 h; 1 GPU x 0.5 h
    assert (h100.cost_usd, l4.cost_usd) == (4.0, 0.4)
    assert total_gpu_hours([h100, l4]) == 1.5
    assert total_cost_usd([h100, l4]) == pytest.approx(4.4)
    assert total_gpu_hours([]) == 0.0 and total_cost_usd([]) == 0.0


def test_an_unknown_price_makes_the_total_unknown_not_free():
    priced = DeviceTime(device="dev0", hardware="l4", gpus=1, price_per_hour_usd=0.8, seconds=3600.0)
    unpriced = DeviceTime(device="dev1", hardware=None, gpus=1, price_per_hour_usd=math.nan, seconds=3600.0)
    assert total_gpu_hours([priced, unpriced]) == 2.0
    assert math.isnan(total_cost_usd([priced, unpriced]))


@pytest.mark.parametrize(("gpus", "seconds"), [(0, 1.0), (1, -1.0), (1, math.nan)])
def test_an_impossible_device_time_is_refused_with_its_values(gpus, seconds):
    with pytest.raises(ValueError, match=f"gpus {gpus}"):
        DeviceTime(device="dev0", hardware=None, gpus=gpus, price_per_hour_usd=1.0, seconds=seconds)


def test_the_cost_columns_of_two_devices_over_two_hours():
    # Two devices for 7,200 s: an H100 x2 at $4.00 a GPU-hour ($8/h) and an L4 at $0.50 ($0.50/h): $17 in all.
    # The requests counted: 2,000,000 prompt tokens, 500,000 output tokens, 40 of them met the SLO.
    times = (DeviceTime(device="d0", hardware="h100-sxm", gpus=2, price_per_hour_usd=4.0, seconds=7200.0),
             DeviceTime(device="d1", hardware="l4", gpus=1, price_per_hour_usd=0.5, seconds=7200.0))
    row = cost_columns(times, span_s=7200.0, input_tokens=2_000_000, output_tokens=500_000, slo_met_requests=40,
                       slo_set=True)
    assert list(row) == list(COST_COLUMNS)
    assert row["gpu_hours"] == 6.0                                   # (2 + 1) GPUs x 2 h
    assert row["cost_usd"] == 17.0                                   # (8 + 0.5) $/h x 2 h
    assert row["usd_per_hour"] == 8.5
    assert row["usd_per_million_input_tokens"] == 8.5                # the whole $17 over 2 M prompt tokens
    assert row["usd_per_million_output_tokens"] == 34.0              # ... over 0.5 M output tokens
    assert row["usd_per_million_tokens"] == 6.8                      # ... over 2.5 M tokens
    assert row["usd_per_million_slo_requests"] == 17.0 / 40 * 1e6


def test_without_an_slo_or_device_time_the_figures_are_nan_not_zero():
    times = (DeviceTime(device="d0", hardware="l4", gpus=1, price_per_hour_usd=0.5, seconds=3600.0),)
    no_slo = cost_columns(times, span_s=3600.0, input_tokens=10, output_tokens=10, slo_met_requests=5, slo_set=False)
    assert no_slo["cost_usd"] == 0.5 and math.isnan(no_slo["usd_per_million_slo_requests"])
    none_met = cost_columns(times, span_s=3600.0, input_tokens=10, output_tokens=10, slo_met_requests=0, slo_set=True)
    assert math.isnan(none_met["usd_per_million_slo_requests"])
    unfilled = cost_columns((), span_s=3600.0, input_tokens=10, output_tokens=10, slo_met_requests=5, slo_set=True)
    assert all(math.isnan(v) for v in unfilled.values())


def test_every_hardware_profile_states_its_price_and_where_it_comes_from():
    text = resources.files("sim.timing").joinpath("hardware.yaml").read_text(encoding="utf-8")
    for name, entry in yaml.safe_load(text).items():
        assert "price_per_hour_usd" in entry, name                    # null is a decision; absence is not
        source = entry["sources"]["price_per_hour_usd"]
        if entry["price_per_hour_usd"] is not None:
            assert re.search(r"(19|20)\d\d-\d\d", source), (name, source)   # the list price's date
            assert "Not re-checked" in source, name
    profiles = hardware_profiles()
    assert profiles["h100-sxm"].price_per_hour_usd == 12.29           # p5.48xlarge $98.32 / 8 GPUs
    assert profiles["a100-80gb"].price_per_hour_usd == 5.1207         # p4de.24xlarge $40.9657 / 8
    assert profiles["l4"].price_per_hour_usd == 0.8048                # g6.xlarge, one GPU
    assert math.isnan(profiles["h200"].price_per_hour_usd)            # none known: NaN, never free
