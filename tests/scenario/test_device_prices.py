"""What a scenario's devices cost (`Scenario.device_price`, `fleet_device_time`, `with_gpu_price`): narrated on the
built-in service-baseline scenario, whose 6-worker deployment is one RTX 3090 shared by 4 workers and two RTX 4070
Laptop GPUs (the time model's hardware)."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.results.cost import DeviceTime
from sim.scenario import ScenarioError, builtin_scenario_path, load_scenario, with_gpu_price

SIX = load_scenario(builtin_scenario_path())[0].with_overrides(**{"cluster.workers": 6})


def test_a_fixed_fleet_is_its_devices_each_at_its_profiles_price():
    assert SIX.fleet_device_time(3600.0) == (
        DeviceTime("gpu-24gb", "rtx-3090", 1, 0.113, 3600.0),       # 4 workers share it: one device, one GPU
        DeviceTime("laptop-8gb-a", "rtx-4070-laptop", 1, 0.068, 3600.0),
        DeviceTime("laptop-8gb-b", "rtx-4070-laptop", 1, 0.068, 3600.0),
    )
    assert SIX.fleet_usd_per_hour() == pytest.approx(0.249)


def test_a_price_per_profile_changes_only_the_devices_on_it_and_one_price_changes_all():
    priced = with_gpu_price(SIX, {"rtx3090": 0.2})                  # an alias of rtx-3090
    assert [t.price_per_hour_usd for t in priced.fleet_device_time(1.0)] == [0.2, 0.068, 0.068]
    assert [t.price_per_hour_usd for t in with_gpu_price(SIX, 1.5).fleet_device_time(1.0)] == [1.5, 1.5, 1.5]


def test_tensor_parallel_devices_pay_for_every_gpu():
    on_h100 = SIX.with_hardware(hardware="h100-sxm", tensor_parallel=2).with_overrides(**{"cluster.workers": 3})
    assert [(t.hardware, t.gpus, t.price_per_hour_usd) for t in on_h100.fleet_device_time(3600.0)] == \
        [("h100-sxm", 2, 12.29)] * 3
    assert on_h100.fleet_usd_per_hour() == pytest.approx(3 * 2 * 12.29)


def test_a_linear_time_model_has_no_hardware_so_no_price_unless_given():
    linear, _ = load_scenario(builtin_scenario_path("trace-replay"))
    assert {(t.hardware, t.gpus) for t in linear.fleet_device_time(1.0)} == {(None, 1)}
    assert math.isnan(linear.fleet_usd_per_hour())
    assert with_gpu_price(linear, 2.0).fleet_usd_per_hour() == 2.0 * linear.cluster.workers


@pytest.mark.parametrize(("price", "message"), [
    (-1.0, "gpu_price_usd must be US dollars per GPU-hour > 0, got -1.0"),
    ({"h100": 1.0}, "gpu_price_usd: no device runs on h100-sxm; the devices' hardware: rtx-3090, rtx-4070-laptop"),
    ({"gtx-480": 1.0}, "gpu_price_usd: unknown hardware 'gtx-480'; allowed: rtx-4060-laptop"),
])
def test_a_bad_price_is_refused_naming_it(price, message):
    with pytest.raises(ScenarioError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        with_gpu_price(SIX, price)


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-price-usd", "-2"], "Invalid value for '--gpu-price-usd': '-2' must be US dollars per GPU-hour > 0"),
    (["--gpu-price-usd", "cheap"], "'cheap' is not a number of US dollars per GPU-hour"),
    (["--gpu-price-usd", "l4=1,=2"], "'=2': give USD, or NAME=USD,... with NAME a hardware profile"),
    (["--gpu-price-usd", "h100=1"], "Error: gpu_price_usd: no device runs on h100-sxm"),
])
def test_bad_price_options_are_one_line_errors(args, message):
    result = CliRunner().invoke(main, ["run", "--prefixes", "2", *args])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_a_scenario_file_price_must_be_positive(tmp_path):
    text = builtin_scenario_path().read_text().replace("{name: laptop-8gb-a, workers: 1}",
                                                       "{name: laptop-8gb-a, workers: 1, price_per_hour_usd: 0}", 1)
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"price_per_hour_usd: Input should be greater than 0"):
        load_scenario(path)
