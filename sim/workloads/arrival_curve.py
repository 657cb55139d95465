"""Arrival-rate curves λ(t) (requests, or sessions, per second over time) and exact non-homogeneous Poisson arrivals
by time-rescaling; the same inverse warps a trace's own timestamps onto a curve.

Time-rescaling (Çinlar, "Introduction to Stochastic Processes", 1975, §4.7; Brown et al., "The time-rescaling
theorem and its application to neural spike train data analysis", Neural Computation 14, 2002): with
Λ(t) = ∫₀ᵗ λ(u) du the curve's cumulative rate (the arrivals expected by t), if s₁ < s₂ < ... are the arrivals of a
unit-rate Poisson process then tᵢ = Λ⁻¹(sᵢ) are the arrivals of a Poisson process of rate λ(t). So a stream is the
running sum of Exp(1) draws, each mapped through Λ⁻¹: one draw per arrival, no thinning, and the arrivals in any
[a, b) are exactly the unit-rate arrivals in [Λ(a), Λ(b)), a Poisson count of mean Λ(b) - Λ(a).

    λ(t)  rate           ▁▂▄▆█▆▄▂▁▂▄▆█
    Λ(t)  cumulative     ____.--''__.-'      s on Λ's axis (unit rate)  ->  t = Λ⁻¹(s) on the time axis
    sᵢ    unit-rate      |  |   | | |  |  |
    tᵢ    on the curve   |    |  ||| |    |||     (dense where λ is high, sparse where it is low)

Λ⁻¹(y) is the first t with Λ(t) >= y (a curve may be 0 for a while: no arrival falls there); infinite when the
curve never brings y arrivals (a piecewise or bursts curve that ends at rate 0).

The scenario form is a pydantic spec discriminated by `kind` (`workload.arrival_curve`); the CLI form is
`KIND:key=value,...` (`parse_arrival_curve`), e.g. `diurnal:mean_rps=4,amplitude=0.8,period_s=86400,peak_s=50400`.
"""

from __future__ import annotations

import json
import math
import random
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Protocol, Union

from pydantic import Field, ValidationError, model_validator

from sim.config import ConfigModel, ProblemsError, key_values, suggestion, validation_problems
from sim.workloads.traces import TraceError, TraceRequest, field, json_object, open_binary


# ---- the curves: λ(t), Λ(t) and Λ⁻¹ -------------------------------------------------------------------------------

class RateCurve(Protocol):
    """A non-negative arrival rate over time t >= 0 (seconds from the start of the arrivals)."""

    def rate_rps(self, t_s: float) -> float:
        """λ(t): arrivals per second at t."""

    def cumulative(self, t_s: float) -> float:
        """Λ(t) = ∫₀ᵗ λ: the arrivals expected in [0, t)."""

    def inverse(self, arrivals: float) -> float:
        """Λ⁻¹(y): the first t with Λ(t) >= y (0 for y <= 0); math.inf when Λ never reaches y."""

    @property
    def total_arrivals(self) -> float:
        """Λ(∞): the arrivals the curve ever expects (math.inf unless it ends at rate 0)."""


@dataclass(frozen=True, slots=True)
class ConstantCurve:
    """λ(t) = constant_rps: a homogeneous Poisson process."""

    constant_rps: float

    def rate_rps(self, t_s: float) -> float:
        return self.constant_rps

    def cumulative(self, t_s: float) -> float:
        return self.constant_rps * max(t_s, 0.0)

    def inverse(self, arrivals: float) -> float:
        return max(arrivals, 0.0) / self.constant_rps

    @property
    def total_arrivals(self) -> float:
        return math.inf


@dataclass(frozen=True, slots=True)
class PiecewiseCurve:
    """λ through points (tₖ, rₖ), t₀ = 0 < t₁ < ...: linear between points, or a step (rₖ on [tₖ, tₖ₊₁));
    the last rate holds after the last point.

    Λ at the points is precomputed (`cum_at`, Aₖ = Λ(tₖ)), so Λ⁻¹(y) finds the last point with Aₖ < y and solves
    inside its segment, d = t - tₖ, Δ = y - Aₖ, slope m = (rₖ₊₁ - rₖ) / (tₖ₊₁ - tₖ):

        step:    rₖ·d = Δ                      d = Δ / rₖ
        linear:  rₖ·d + m·d²/2 = Δ            d = 2Δ / (rₖ + sqrt(rₖ² + 2·m·Δ))   (the root without cancellation)
    """

    times_s: tuple[float, ...]
    rates_rps: tuple[float, ...]
    step: bool
    cum_at: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        cum = [0.0]
        for k in range(len(self.times_s) - 1):
            cum.append(cum[-1] + self._segment_mass(k, self.times_s[k + 1] - self.times_s[k]))
        object.__setattr__(self, "cum_at", tuple(cum))

    def _segment_mass(self, k: int, d: float) -> float:
        """∫ λ over [tₖ, tₖ + d) for d within segment k (or any d >= 0 past the last point)."""
        r0 = self.rates_rps[k]
        if self.step or k == len(self.times_s) - 1:
            return r0 * d
        slope = (self.rates_rps[k + 1] - r0) / (self.times_s[k + 1] - self.times_s[k])
        return r0 * d + slope * d * d / 2

    def _segment(self, t_s: float) -> int:
        return max(bisect_left(self.times_s, t_s) - 1, 0) if t_s > 0 else 0

    def rate_rps(self, t_s: float) -> float:
        if t_s >= self.times_s[-1]:
            return self.rates_rps[-1]
        k = max(bisect_right(self.times_s, t_s) - 1, 0)  # the last point at or before t
        if self.step:
            return self.rates_rps[k]
        t0, t1 = self.times_s[k], self.times_s[k + 1]
        r0, r1 = self.rates_rps[k], self.rates_rps[k + 1]
        return r0 + (r1 - r0) * (t_s - t0) / (t1 - t0)

    def cumulative(self, t_s: float) -> float:
        if t_s <= 0:
            return 0.0
        k = self._segment(t_s)
        return self.cum_at[k] + self._segment_mass(k, t_s - self.times_s[k])

    def inverse(self, arrivals: float) -> float:
        if arrivals <= 0:
            return 0.0
        k = bisect_left(self.cum_at, arrivals) - 1  # the last point with Aₖ < y (A₀ = 0 < y)
        delta = arrivals - self.cum_at[k]
        r0 = self.rates_rps[k]
        if k == len(self.times_s) - 1:
            return self.times_s[k] + delta / r0 if r0 > 0 else math.inf
        if self.step:
            d = delta / r0  # r0 > 0: the segment holds more than Aₖ
        else:
            slope = (self.rates_rps[k + 1] - r0) / (self.times_s[k + 1] - self.times_s[k])
            d = 2 * delta / (r0 + math.sqrt(max(r0 * r0 + 2 * slope * delta, 0.0)))
        # NOTE: rounding may put d a hair past the segment's end; Λ⁻¹ is then the next point.
        return min(self.times_s[k] + d, self.times_s[k + 1])

    @property
    def total_arrivals(self) -> float:
        return math.inf if self.rates_rps[-1] > 0 else self.cum_at[-1]


@dataclass(frozen=True, slots=True)
class DiurnalCurve:
    """λ(t) = mean·(1 + amplitude·cos(ω(t - peak))), ω = 2π / period: a sine around the mean, highest at peak_s
    (and every period after), lowest half a period from it (mean·(1 - amplitude)).

        Λ(t) = mean·t + (mean·amplitude / ω)·(sin(ω(t - peak)) + sin(ω·peak))

    Λ(t + period) = Λ(t) + mean·period, so Λ⁻¹ takes the whole periods off and solves within one period by
    Newton's method kept inside a shrinking bracket (Λ is increasing; where λ = 0, bisection steps)."""

    mean_rps: float
    amplitude: float
    period_s: float
    peak_s: float

    @property
    def _omega(self) -> float:
        return 2 * math.pi / self.period_s

    def rate_rps(self, t_s: float) -> float:
        return self.mean_rps * (1 + self.amplitude * math.cos(self._omega * (t_s - self.peak_s)))

    def cumulative(self, t_s: float) -> float:
        if t_s <= 0:
            return 0.0
        w = self._omega
        # NOTE: sin(w(t - p)) + sin(wp) written as a product, which does not cancel near t = 0.
        wave = 2 * math.sin(w * t_s / 2) * math.cos(w * (t_s / 2 - self.peak_s))
        return self.mean_rps * t_s + self.mean_rps * self.amplitude / w * wave

    def inverse(self, arrivals: float) -> float:
        if arrivals <= 0:
            return 0.0
        per_period = self.mean_rps * self.period_s
        periods = math.floor(arrivals / per_period)
        y = arrivals - periods * per_period
        lo, hi = 0.0, self.period_s
        t = min(max(y / self.mean_rps, lo), hi)
        # NOTE: a few ulps of y (Λ in the product form is that accurate), or a bracket a few ulps of a period wide.
        tolerance = 8 * sys.float_info.epsilon * y
        for _ in range(200):
            f = self.cumulative(t) - y
            if abs(f) <= tolerance or hi - lo <= 8 * sys.float_info.epsilon * self.period_s:
                break
            if f > 0:
                hi = t
            else:
                lo = t
            rate = self.rate_rps(t)
            step = t - f / rate if rate > 0 else math.nan
            t = step if lo < step < hi else (lo + hi) / 2
        return periods * self.period_s + t

    @property
    def total_arrivals(self) -> float:
        return math.inf


# ---- the scenario form: specs by kind -----------------------------------------------------------------------------

class ConstantCurveSpec(ConfigModel):
    """A constant rate: Poisson arrivals, as `arrival_rate_rps` gives them (the same draws, the same results)."""

    kind: Literal["constant"] = Field(description="constant (this one), piecewise, diurnal or bursts.")
    rate_rps: float = Field(gt=0, description="Arrivals per second.")

    def curve(self) -> ConstantCurve:
        return ConstantCurve(self.rate_rps)

    def text(self) -> str:
        return f"constant {self.rate_rps:g}/s"


class PiecewiseCurveSpec(ConfigModel):
    """A rate through points (t_s, rate_rps): linear between them or a step at each; the last rate holds after the
    last point (0: the arrivals end there)."""

    kind: Literal["piecewise"] = Field(description="constant, piecewise (this one), diurnal or bursts.")
    points: list[tuple[float, float]] = Field(min_length=1, description=(
        "[[t_s, rate_rps], ...]: times from 0 (the first point's), strictly increasing; rates >= 0, not all 0. CLI: "
        "points=T:R/T:R/..."))
    interpolation: Literal["linear", "step"] = Field("linear", description=(
        "linear: the rate runs straight from point to point; step: each point's rate holds until the next."))

    @model_validator(mode="after")
    def _check(self) -> PiecewiseCurveSpec:
        times = [t for t, _ in self.points]
        if times[0] != 0:
            raise ValueError(f"points: the first point is at t_s 0 (the arrivals' start), got {times[0]:g}")
        for a, b in zip(times, times[1:]):
            if b <= a:
                raise ValueError(f"points: times must increase strictly, got {b:g} after {a:g}")
        if any(r < 0 for _, r in self.points):
            raise ValueError("points: rates must be >= 0 (arrivals per second)")
        if all(r == 0 for _, r in self.points):
            raise ValueError("points: every rate is 0, so nothing ever arrives")
        return self

    def curve(self) -> PiecewiseCurve:
        return PiecewiseCurve(tuple(t for t, _ in self.points), tuple(r for _, r in self.points),
                              step=self.interpolation == "step")

    def text(self) -> str:
        rates = [r for _, r in self.points]
        return (f"piecewise ({self.interpolation}) {min(rates):g}-{max(rates):g}/s over "
                f"{self.points[-1][0]:g} s")


class DiurnalCurveSpec(ConfigModel):
    """A daily (or any period's) sine: mean·(1 + amplitude·cos(2π(t - peak_s) / period_s))."""

    kind: Literal["diurnal"] = Field(description="constant, piecewise, diurnal (this one) or bursts.")
    mean_rps: float = Field(gt=0, description="The mean rate over a period (arrivals per second).")
    amplitude: float = Field(ge=0, le=1, description=(
        "The swing as a fraction of the mean: the peak is mean·(1 + amplitude), the trough mean·(1 - amplitude)."))
    period_s: float = Field(86400.0, gt=0, description="The period (s): a day by default.")
    peak_s: float | None = Field(None, ge=0, description=(
        "When the rate peaks (s from the start; then every period). Default: half a period, so a run starts at "
        "the trough (midnight) and peaks mid-period."))

    def curve(self) -> DiurnalCurve:
        peak = self.period_s / 2 if self.peak_s is None else self.peak_s
        return DiurnalCurve(self.mean_rps, self.amplitude, self.period_s, peak)

    def text(self) -> str:
        peak = self.period_s / 2 if self.peak_s is None else self.peak_s
        return (f"diurnal {self.mean_rps:g}/s ±{self.amplitude:.0%}, period {self.period_s:g} s, peak at "
                f"{peak:g} s")


class BurstSpec(ConfigModel):
    """One burst: extra_rps on top of the base rate during [at_s, at_s + duration_s)."""

    at_s: float = Field(ge=0, description="When the burst starts (s from the start).")
    duration_s: float = Field(gt=0, description="How long it lasts (s).")
    extra_rps: float = Field(gt=0, description="Arrivals per second added to the base rate (overlapping bursts add).")


class BurstsCurveSpec(ConfigModel):
    """A base rate with bursts on top: a step curve."""

    kind: Literal["bursts"] = Field(description="constant, piecewise, diurnal or bursts (this one).")
    base_rps: float = Field(ge=0, description="The rate outside bursts (arrivals per second; 0: only bursts).")
    bursts: list[BurstSpec] = Field(min_length=1, description=(
        "[{at_s, duration_s, extra_rps}, ...]. CLI: bursts=AT:DURATION:EXTRA/AT:DURATION:EXTRA/..."))

    def curve(self) -> PiecewiseCurve:
        edges = sorted({0.0, *(b.at_s for b in self.bursts), *(b.at_s + b.duration_s for b in self.bursts)})
        rates = [self.base_rps + sum(b.extra_rps for b in self.bursts if b.at_s <= e < b.at_s + b.duration_s)
                 for e in edges]
        return PiecewiseCurve(tuple(edges), tuple(rates), step=True)

    def text(self) -> str:
        peak = max(self.curve().rates_rps)
        return f"bursts {self.base_rps:g}/s base, {len(self.bursts)} burst{'s' * (len(self.bursts) > 1)} up to {peak:g}/s"


ArrivalCurveSpec = Annotated[Union[ConstantCurveSpec, PiecewiseCurveSpec, DiurnalCurveSpec, BurstsCurveSpec],  # noqa: UP007
                             Field(discriminator="kind")]
"""`workload.arrival_curve`: a curve by `kind`."""

CURVE_SPECS: dict[str, type[ConfigModel]] = {
    "constant": ConstantCurveSpec, "piecewise": PiecewiseCurveSpec, "diurnal": DiurnalCurveSpec,
    "bursts": BurstsCurveSpec,
}


# ---- arrivals --------------------------------------------------------------------------------------------------

def arrival_times_s(curve: RateCurve, rng: random.Random, *, until_s: float | None = None,
                    limit: int | None = None) -> Iterator[float]:
    """The arrival times (s, increasing) of a Poisson process of rate `curve`, drawn with `rng`: tᵢ = Λ⁻¹(sᵢ), sᵢ
    the running sum of Exp(1) draws (module docstring). Ends at the first arrival at or after `until_s`, after
    `limit` arrivals, or when the curve brings no more (whichever comes first); else never."""
    n = 0
    if isinstance(curve, ConstantCurve):
        # NOTE: Λ⁻¹(s) = s / rate; drawn as gaps of mean 1 / rate (t += Exp(rate)), the very sum of kvsim's Poisson
        # arrivals (`arrival_rate_rps`, `session_rate_per_s`), so a constant curve gives their bits exactly.
        t = 0.0
        while limit is None or n < limit:
            t += rng.expovariate(curve.constant_rps)
            if until_s is not None and t >= until_s:
                return
            yield t
            n += 1
        return
    s = 0.0
    while limit is None or n < limit:
        s += rng.expovariate(1.0)
        t = curve.inverse(s)
        if t == math.inf or (until_s is not None and t >= until_s):
            return
        yield t
        n += 1


# ---- a trace's own timestamps warped onto a curve -----------------------------------------------------------------

def trace_mean_rps(num_requests: int, last_arrival_s: float) -> float:
    """A trace's mean rate r̄ = n / t_last: the rate of the homogeneous Poisson process that best explains n arrivals
    over [0, t_last] (its maximum-likelihood estimate); a ValueError when the trace spans no time."""
    if num_requests < 1 or not last_arrival_s > 0 or not math.isfinite(num_requests / last_arrival_s):
        raise ValueError(f"a trace of {num_requests} request(s) whose last arrives at {last_arrival_s:g} s spans no "
                         "time: it has no mean rate to warp")
    return num_requests / last_arrival_s


def warp_mean_rps(curve: RateCurve, num_arrivals: int, last_arrival_s: float, *, unit: str = "requests") -> float:
    """The mean rate r̄ (`trace_mean_rps`) a warp onto `curve` scales a trace's times by; a ValueError when the trace
    spans no time or the curve brings fewer arrivals in all than the trace has (`unit`: what they are called)."""
    mean_rps = trace_mean_rps(num_arrivals, last_arrival_s)
    if curve.total_arrivals < num_arrivals:
        raise ValueError(f"the curve brings only {curve.total_arrivals:g} arrivals in all, fewer than the trace's "
                         f"{num_arrivals:,} {unit}")
    return mean_rps


def warp_trace(trace: Iterable[TraceRequest], curve: RateCurve, *, mean_rps: float) -> Iterator[TraceRequest]:
    """The trace with each arrival t mapped to Λ⁻¹(r̄·t), r̄ = `mean_rps` (the trace's own, `trace_mean_rps`).

    r̄·t is the trace's time on a unit-rate axis (a trace that is Poisson at r̄ becomes unit-rate Poisson), and Λ⁻¹
    takes it onto the curve's time (time-rescaling backwards). Λ⁻¹ is non-decreasing, so the order and ties stay;
    a burst stays a burst, stretched or squeezed by the local rate; the last of n requests lands at Λ⁻¹(n), where
    the curve expects n arrivals (so a constant curve of rate r is a pure time scale by r̄ / r)."""
    for item in trace:
        at_s = curve.inverse(mean_rps * item.arrival_s)
        if at_s == math.inf:
            raise ValueError(f"request {item.request.request_id}: the curve brings only {curve.total_arrivals:g} "
                             "arrivals in all, fewer than the trace's requests")
        yield TraceRequest(at_s, item.request)


@dataclass(frozen=True, slots=True)
class WarpedMooncake:
    """A Mooncake trace warped onto a curve (`warped_mooncake`)."""

    jsonl: bytes
    """The trace's lines with their timestamps warped (ms, whole), every other field as it was; blank lines dropped."""
    num_requests: int
    last_arrival_s: float
    """The trace's own last timestamp (s)."""
    mean_rps: float
    """The trace's own mean rate r̄ (`trace_mean_rps`)."""
    warped_last_arrival_s: float
    """Where the last request lands: Λ⁻¹(n) before rounding."""


def warped_mooncake(path: str | Path, curve: RateCurve) -> WarpedMooncake:
    """The Mooncake trace at `path` with each timestamp t warped to Λ⁻¹(r̄·t) as `warp_trace` does, written in whole
    ms as Mooncake's are (the order stays: rounding never reverses it), every other field untouched: the same load
    for another simulator (Dynamo's mocker) as `kvsim replay --arrival-curve` sends, within half a millisecond.

    Two passes over the file (the first for r̄); a TraceError names the line whose timestamp is missing, not a
    finite number >= 0, or goes backwards (the rest of a line is not checked here: the replay reads it)."""
    path = Path(path)
    stamped: list[tuple[dict, float]] = []
    handle = open_binary(path)
    with handle:
        last_ms = 0.0
        for line_no, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            obj = json_object(text, path, line_no)
            ts = field(obj, "timestamp", float, path, line_no)
            if not math.isfinite(ts) or ts < 0:
                raise TraceError(f"{path}:{line_no}: field 'timestamp' must be a finite number of ms >= 0, got {ts}")
            if ts < last_ms:
                raise TraceError(f"{path}:{line_no}: field 'timestamp' goes backwards ({ts} after {last_ms})")
            last_ms = ts
            stamped.append((obj, ts / 1000.0))
    if not stamped:
        raise TraceError(f"{path}: no requests (an empty trace)")
    n, last_s = len(stamped), stamped[-1][1]
    try:
        mean = warp_mean_rps(curve, n, last_s)
    except ValueError as err:
        raise TraceError(f"{path}: {err}") from None
    lines = [json.dumps({**obj, "timestamp": round(1000 * curve.inverse(mean * t_s))}) for obj, t_s in stamped]
    return WarpedMooncake(("\n".join(lines) + "\n").encode(), n, last_s, mean, curve.inverse(n))


# ---- the CLI form: KIND:key=value,... ------------------------------------------------------------------------------

CLI_FORM = ("KIND:key=value,... with KIND constant (rate_rps), piecewise (points=T:R/T:R/..., interpolation), diurnal "
            "(mean_rps, amplitude, period_s, peak_s) or bursts (base_rps, bursts=AT:DURATION:EXTRA/...); a bare "
            "number is a constant rate")


def parse_arrival_curve(text: str) -> ConstantCurveSpec | PiecewiseCurveSpec | DiurnalCurveSpec | BurstsCurveSpec:
    """The curve `text` writes in the CLI form (`CLI_FORM`), e.g. `diurnal:mean_rps=4,amplitude=0.8`; a one-line
    ValueError (a ProblemsError for the fields) names what is wrong and what is allowed."""
    text = text.strip()
    try:
        return ConstantCurveSpec(kind="constant", rate_rps=float(text))
    except ValueError:
        pass
    kind, _, rest = (s.strip() for s in text.partition(":"))
    cls = CURVE_SPECS.get(kind)
    if cls is None:
        raise ValueError(f"unknown curve kind {kind!r}; {suggestion(kind, CURVE_SPECS)} (form: {CLI_FORM})")
    items: dict[str, object] = dict(key_values(rest, f"key=value (the form: {CLI_FORM})"))
    try:
        if kind == "piecewise" and "points" in items:
            items["points"] = [_numbers(p, 2, "points", "T:R") for p in str(items["points"]).split("/")]
        if kind == "bursts" and "bursts" in items:
            items["bursts"] = [dict(zip(("at_s", "duration_s", "extra_rps"), _numbers(b, 3, "bursts", "AT:DURATION:EXTRA")))
                               for b in str(items["bursts"]).split("/")]
        return cls.model_validate({"kind": kind, **items})
    except ValidationError as err:
        raise ProblemsError(validation_problems(err, cls, noun=f"option of a {kind} curve")) from None


def _numbers(item: str, count: int, key: str, form: str) -> list[float]:
    parts = item.split(":")
    try:
        if len(parts) != count:
            raise ValueError
        return [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"{key}: {item!r} is not {form} (numbers; several separated by /)") from None

