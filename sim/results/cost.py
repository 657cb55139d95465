"""What a run's devices cost: the device time a fleet was provisioned for, and its price.

A fixed fleet is provisioned for the whole of what is measured (a run's measured phase, a replay's simulated span);
an elastic fleet only while a slot is starting, ready or draining. Either way a composition root hands the summary
one `DeviceTime` per device (or per stretch of a slot's life) and the summary derives GPU-hours and cost from them:
counters here, rates at report time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0
PER_MILLION = 1e6

COST_COLUMNS = (
    "gpu_hours", "cost_usd", "usd_per_hour", "usd_per_million_input_tokens", "usd_per_million_output_tokens",
    "usd_per_million_tokens", "usd_per_million_slo_requests",
)
"""The cost columns every summary ends its fixed columns with (`cost_columns`)."""


@dataclass(frozen=True, slots=True)
class DeviceTime:
    """Time a device was provisioned (paid for), with what it is and what one of its GPUs costs.

    Invariants: `seconds` >= 0, `gpus` >= 1. `price_per_hour_usd` is per GPU (a cloud instance's hourly price /
    its GPUs), so the device costs `gpus x price_per_hour_usd` an hour; NaN when no price is known (the device's
    cost is then NaN, and so is any total it is part of: an unknown is never counted as free). Several entries may
    name the same device (an elastic slot provisioned more than once); totals sum them.
    """

    device: str
    """The device's name in the cluster (`DeviceSpec.name`)."""
    hardware: str | None
    """Its hardware profile (`sim/timing/hardware.yaml`); None when the time model names none (a linear model)."""
    gpus: int
    """GPUs the device stands for: its tensor-parallel degree (one worker's engine spans them)."""
    price_per_hour_usd: float
    """Price of one GPU-hour in US dollars (NaN: unknown)."""
    seconds: float
    """Seconds the device was provisioned: a fixed fleet's measured span; an elastic slot's starting + ready +
    draining time."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or not self.seconds >= 0:
            raise ValueError(f"DeviceTime {self.device!r}: gpus {self.gpus} must be >= 1 and seconds "
                             f"{self.seconds} >= 0")

    @property
    def gpu_hours(self) -> float:
        """GPUs x hours provisioned."""
        return self.gpus * self.seconds / SECONDS_PER_HOUR

    @property
    def cost_usd(self) -> float:
        """`gpu_hours` x the price of a GPU-hour (NaN when the price is unknown)."""
        return self.gpu_hours * self.price_per_hour_usd


def total_gpu_hours(times: Iterable[DeviceTime]) -> float:
    """GPU-hours of `times`, summed (0 without an entry)."""
    return math.fsum(t.gpu_hours for t in times)


def total_cost_usd(times: Iterable[DeviceTime]) -> float:
    """Cost of `times` in US dollars, summed (0 without an entry; NaN if any entry's price is unknown)."""
    return math.fsum(t.cost_usd for t in times)


def cost_columns(device_time: tuple[DeviceTime, ...], *, span_s: float, input_tokens: int, output_tokens: int,
                 slo_met_requests: int, slo_set: bool) -> dict[str, float]:
    """The cost columns (`COST_COLUMNS`) of a run or a replay, derived here for both (the one summary path):

    * `gpu_hours`, `cost_usd`: `device_time` summed (`total_gpu_hours`, `total_cost_usd`);
    * `usd_per_hour`: `cost_usd` over the span the devices were provisioned for (`span_s`: a run's measured phase,
      a replay's simulated span): a fixed fleet's price per hour, an elastic fleet's mean;
    * `usd_per_million_input_tokens` / `_output_tokens` / `_tokens`: the WHOLE cost over a million prompt tokens,
      output tokens, or both, of the requests counted (not a split of the cost between prefill and decode: each
      answers "what does a million of these cost if the fleet did nothing else");
    * `usd_per_million_slo_requests`: the cost over a million requests meeting the SLO; NaN without an SLO (every
      request would count) or when none met it.

    Everything is NaN when `device_time` is empty (the result was not given its device time: unknown, not free),
    and the dollar figures are NaN when a device has no price."""
    if not device_time:
        return dict.fromkeys(COST_COLUMNS, math.nan)
    cost = total_cost_usd(device_time)

    def per_million(count: float) -> float:
        return cost / count * PER_MILLION if count > 0 else math.nan

    return {
        "gpu_hours": total_gpu_hours(device_time),
        "cost_usd": cost,
        "usd_per_hour": cost / (span_s / SECONDS_PER_HOUR) if span_s > 0 else math.nan,
        "usd_per_million_input_tokens": per_million(input_tokens),
        "usd_per_million_output_tokens": per_million(output_tokens),
        "usd_per_million_tokens": per_million(input_tokens + output_tokens),
        "usd_per_million_slo_requests": per_million(slo_met_requests) if slo_set else math.nan,
    }
