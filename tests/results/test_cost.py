"""Device time and its cost (`sim.results.cost`): narrated sums."""

from __future__ import annotations

import math

import pytest

from sim.results.cost import DeviceTime, total_cost_usd, total_gpu_hours


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
