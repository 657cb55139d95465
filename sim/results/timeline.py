"""An autoscaled run's timeline: the fleet and its traffic per interval (`timeline.csv`), each worker instance's life
(`instances.csv`), and the figure of both (`timeline.png`), so that the cold-cache dip after a scale-out shows.

Requests are binned by the time they were sent (arrivals, hit rates, TTFT, goodput: how the load of that interval
was served), completions by the time they finished; the workers of a row are the fleet at the row's end. A request
is *cold* when the worker that served it had been ready for less than `cold_window_s` when it was sent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.results.records import RequestRecord, Slo
from sim.results.streaming_stats import LogHistogram


@dataclass(frozen=True, slots=True)
class InstanceSpan:
    """One worker instance's life in its slot (simulated seconds; None: not reached) and what it served."""

    slot: int
    instance: int
    started_s: float
    """When the autoscaler launched it (provisioning began)."""
    ready_s: float | None
    """When it became routable (None: cancelled while starting)."""
    drained_s: float | None
    """When it stopped being routable (scale-in)."""
    stopped_s: float | None
    """When its engine and cache were dropped (None: still live at the end)."""
    requests: int
    hit_requests: int
    """Requests with a prefix-cache hit at admission."""
    prompt_tokens: int
    cached_tokens: int

    def provisioned_s(self, start_s: float, end_s: float) -> float:
        """Seconds of [start_s, end_s] this instance held its device (from launch to stop: starting, ready and
        draining are all paid for; a live one to `end_s`)."""
        stop_s = end_s if self.stopped_s is None else min(self.stopped_s, end_s)
        return max(0.0, stop_s - max(self.started_s, start_s))

    def phase_before(self, t_s: float) -> str:
        """`starting`, `ready`, `draining` or `stopped` just before `t_s` (a change at `t_s` is not seen yet)."""
        if t_s <= self.started_s or (self.stopped_s is not None and t_s > self.stopped_s):
            return "stopped"
        if self.drained_s is not None and t_s > self.drained_s:
            return "draining"
        return "ready" if self.ready_s is not None and t_s > self.ready_s else "starting"


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """One autoscaler tick: its answer, what the fleet reconciled to (clamped) and the fleet it saw."""

    now_s: float
    desired_workers: int
    target_workers: int
    ready: int
    starting: int
    draining: int


@dataclass(slots=True)
class TimelineBin:
    """Counters of one interval (rates are derived in `timeline_rows`)."""

    arrivals: int = 0
    completions: int = 0
    hit_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    slo_met: int = 0
    cold_requests: int = 0
    cold_hit_requests: int = 0
    cold_prompt_tokens: int = 0
    cold_cached_tokens: int = 0
    ttft_ms: LogHistogram = field(default_factory=LogHistogram)


class Timeline:
    """Per-interval counters of completed requests (`add`), binned as the module docstring says."""

    def __init__(self, *, bin_s: float, slo: Slo) -> None:
        if bin_s <= 0:
            raise ValueError(f"timeline bin must be > 0 s, got {bin_s}")
        self.bin_s = bin_s
        self.slo = slo
        self.bins: dict[int, TimelineBin] = {}

    def _bin(self, t_s: float) -> TimelineBin:
        k = int(t_s // self.bin_s)
        b = self.bins.get(k)
        if b is None:
            b = self.bins[k] = TimelineBin()
        return b

    def add(self, r: RequestRecord, *, cold: bool) -> None:
        self._bin(r.finished_s).completions += 1
        b = self._bin(r.sent_s)
        b.arrivals += 1
        b.hit_requests += r.cached_tokens > 0
        b.prompt_tokens += r.prompt_tokens
        b.cached_tokens += r.cached_tokens
        b.slo_met += self.slo.met_by(r)
        b.ttft_ms.add(r.ttft_s * 1e3)
        if cold:
            b.cold_requests += 1
            b.cold_hit_requests += r.cached_tokens > 0
            b.cold_prompt_tokens += r.prompt_tokens
            b.cold_cached_tokens += r.cached_tokens


@dataclass(frozen=True, slots=True)
class FleetRecord:
    """What an autoscaled run or replay leaves of its fleet: every instance's phases and requests, each tick's
    decision, the timeline's bins, and the time the run ended (live instances' spans end there)."""

    instances: tuple[InstanceSpan, ...]
    """Every instance, by instance id."""
    decisions: tuple[ScaleDecision, ...]
    timeline: Timeline
    end_s: float
    provisioning_s: float
    cold_window_s: float

    def device_seconds(self, start_s: float = 0.0, end_s: float | None = None) -> float:
        """Device-seconds provisioned over [start_s, end_s] (default: to the end): each instance from its launch to
        its stop (starting, ready and draining are all paid for)."""
        end_s = self.end_s if end_s is None else end_s
        return math.fsum(i.provisioned_s(start_s, end_s) for i in self.instances)

    def row(self, start_s: float = 0.0, end_s: float | None = None) -> dict[str, float | int]:
        """The summary's fleet columns (`FLEET_COLUMNS`) over [start_s, end_s]: device-seconds provisioned, the mean
        workers provisioned (device-seconds / span), workers launched and drained in it."""
        end_s = self.end_s if end_s is None else end_s
        device_s = self.device_seconds(start_s, end_s)
        return {"fleet_device_s": device_s,
                "fleet_workers_mean": device_s / (end_s - start_s) if end_s > start_s else math.nan,
                "fleet_launched": sum(1 for i in self.instances if start_s <= i.started_s <= end_s and i.started_s > 0),
                "fleet_drained": sum(1 for i in self.instances
                                     if i.drained_s is not None and start_s <= i.drained_s <= end_s)}

    def rows(self) -> list[dict[str, float | int | str]]:
        """`timeline.csv` (`timeline_rows`)."""
        return timeline_rows(self.timeline, self.instances, self.decisions, self.end_s)


FLEET_COLUMNS = ("fleet_device_s", "fleet_workers_mean", "fleet_launched", "fleet_drained")
"""An autoscaled run's summary columns (only then: a fixed fleet's summary keeps its columns)."""


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


TIMELINE_COLUMNS = (
    "start_s", "end_s", "workers_ready", "workers_starting", "workers_draining", "workers_launched",
    "workers_drained", "desired_workers", "arrivals_rps", "completions", "request_hit_rate", "prefix_reuse",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "goodput_rps", "cold_requests", "cold_request_hit_rate",
    "cold_prefix_reuse",
)


def timeline_rows(timeline: Timeline, instances: Sequence[InstanceSpan], decisions: Sequence[ScaleDecision],
                  end_s: float) -> list[dict[str, float | int | str]]:
    """`timeline.csv`: one row per interval [start_s, end_s) from 0 to `end_s` (the last may be shorter). The workers
    are the fleet just before the row's end (a change at that instant is the next row's, as its scale events are);
    `workers_launched` / `workers_drained` count the scale events in the row;
    `desired_workers` is the last tick's answer in the row (empty without a tick)."""
    bin_s = timeline.bin_s
    num_bins = max(1, math.ceil(end_s / bin_s - 1e-9), max(timeline.bins, default=-1) + 1)
    rows = []
    for k in range(num_bins):
        lo, hi = k * bin_s, (k + 1) * bin_s
        if k == num_bins - 1 and lo < end_s < hi:
            hi = end_s  # the last row ends with the run
        phases = [i.phase_before(hi) for i in instances]
        b = timeline.bins.get(k, TimelineBin())
        ticks = [d for d in decisions if lo < d.now_s <= hi]
        span_s = hi - lo
        rows.append({
            "start_s": lo, "end_s": hi,
            "workers_ready": phases.count("ready"), "workers_starting": phases.count("starting"),
            "workers_draining": phases.count("draining"),
            "workers_launched": sum(1 for i in instances if lo <= i.started_s < hi and i.started_s > 0),
            "workers_drained": sum(1 for i in instances if i.drained_s is not None and lo <= i.drained_s < hi),
            "desired_workers": ticks[-1].desired_workers if ticks else "",
            "arrivals_rps": b.arrivals / span_s if span_s > 0 else math.nan,
            "completions": b.completions,
            "request_hit_rate": _ratio(b.hit_requests, b.arrivals),
            "prefix_reuse": _ratio(b.cached_tokens, b.prompt_tokens),
            "ttft_p50_ms": b.ttft_ms.percentile(50), "ttft_p90_ms": b.ttft_ms.percentile(90),
            "ttft_p99_ms": b.ttft_ms.percentile(99),
            "goodput_rps": b.slo_met / span_s if span_s > 0 else math.nan,
            "cold_requests": b.cold_requests,
            "cold_request_hit_rate": _ratio(b.cold_hit_requests, b.cold_requests),
            "cold_prefix_reuse": _ratio(b.cold_cached_tokens, b.cold_prompt_tokens),
        })
    return rows


INSTANCE_COLUMNS = ("slot", "instance", "started_s", "ready_s", "drained_s", "stopped_s", "requests",
                    "request_hit_rate", "prefix_reuse")


def instance_rows(instances: Sequence[InstanceSpan]) -> list[dict[str, float | int | str]]:
    """`instances.csv`: one row per instance (empty cells: a phase not reached)."""
    def cell(t: float | None) -> float | str:
        return "" if t is None else t

    return [{"slot": i.slot, "instance": i.instance, "started_s": i.started_s, "ready_s": cell(i.ready_s),
             "drained_s": cell(i.drained_s), "stopped_s": cell(i.stopped_s), "requests": i.requests,
             "request_hit_rate": _ratio(i.hit_requests, i.requests),
             "prefix_reuse": _ratio(i.cached_tokens, i.prompt_tokens)} for i in instances]
