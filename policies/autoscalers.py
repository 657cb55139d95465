"""Autoscalers: the rules that answer, every `interval_s` of simulated time, how many workers the fleet should have
(`sim.scaling.Autoscaler`). `AUTOSCALERS` is the one registry: adding a rule is one class plus one line.

* `hpa`: Kubernetes' Horizontal Pod Autoscaler (autoscaling/v2), as its controller computes it
  (`pkg/controller/podautoscaler/replica_calculator.go` and `horizontal.go`, defaults from
  `pkg/apis/autoscaling/v2/defaults.go`).
* `planner`: Dynamo's SLA Planner, throughput-based scaling of an aggregated deployment
  (ai-dynamo/dynamo 1.2.0, `components/src/dynamo/planner/core/throughput_scaling.py` `_throughput_agg`,
  `core/load/predictors.py`, `core/state_machine.py` `_budget_clamp`, defaults in `config/defaults.py`).
* `schedule`: replicas over time, given.

Each rule is written from the upstream source read for it; `docs/concepts/autoscalers.md` cites it rule by rule, with
the defaults. Options come from a spec `NAME:key=value,...` (`split_autoscaler_spec`) or a scenario's `options:`
mapping, and are checked by each class's pydantic `Options` (unknown keys are errors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.config import Problem, ProblemsError, key_value, named_registry, validation_problems
from sim.routing.spec import option_value

if TYPE_CHECKING:  # the contract's types only: policies never import the cluster's code (tests/test_layering.py)
    from sim.scaling import FleetSnapshot, WorkerSnapshot


# ---------------------------------------------------------------------------------------------------------- base


class AutoscalerOptions(BaseModel):
    """Options every autoscaler has (none yet: each rule names its own interval as its product does)."""

    # NOTE: defer_build, as sim.config.ConfigModel: only the options of the routers a command uses are built.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class AutoscalerBase:
    """Parses `options` into `Options` at the edge and keeps the fleet's bounds. A subclass sets `interval_s` (when the
    fleet calls `desired_workers`) from its options and answers the worker count it wants (ready + starting)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[AutoscalerOptions]] = AutoscalerOptions

    def __init__(self, *, min_workers: int, max_workers: int, options: dict[str, Any]) -> None:
        if not 0 <= min_workers <= max_workers or max_workers < 1:
            raise ValueError(f"{self.name}: need 0 <= min_workers <= max_workers and max_workers >= 1, "
                             f"got min_workers={min_workers}, max_workers={max_workers}")
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.options = self.parse_options(options)
        self.interval_s = self.tick_s(self.options)

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> AutoscalerOptions:
        """`options` as this autoscaler's `Options`, or a ProblemsError (one line) naming each bad option."""
        try:
            return cls.Options.model_validate(options)
        except ValidationError as err:
            raise ProblemsError(validation_problems(err, cls.Options, noun=f"option of {cls.name}")) from None

    @classmethod
    def tick_s(cls, options: AutoscalerOptions) -> float:
        raise NotImplementedError

    def desired_workers(self, snapshot: FleetSnapshot) -> int:
        raise NotImplementedError


def current_replicas(snapshot: FleetSnapshot) -> int:
    """What the scaled object's `spec.replicas` is between two ticks: the workers the fleet keeps (ready + starting);
    draining workers are on their way out (pods with a deletion timestamp)."""
    return snapshot.ready + snapshot.starting


# ---------------------------------------------------------------------------------------------------------- hpa

HpaMetric = Literal["in_flight", "queue", "kv_usage", "ttft_p90_ms"]

HPA_DEFAULT_TARGETS: dict[str, float] = {"in_flight": 8.0, "queue": 1.0, "kv_usage": 0.8, "ttft_p90_ms": 500.0}
"""kvsim's default target per metric (Kubernetes has none: a metric target is always given). These are kvsim's
choices, stated in the docs: 8 requests in flight per worker, 1 waiting request per worker, 80 % KV usage, and a TTFT
p90 of 500 ms (Dynamo's Planner's default TTFT SLA)."""

SelectPolicy = Literal["max", "min", "disabled"]


class HpaOptions(AutoscalerOptions):
    """An HPA with one metric and the autoscaling/v2 `behavior` (each field's default is Kubernetes')."""

    metric: HpaMetric = Field(
        "in_flight",
        description="in_flight, queue (num_waiting) or kv_usage (0..1): a Pods metric averaged over the ready workers "
                    "(target: AverageValue per worker); ttft_p90_ms: the window's TTFT p90 as an External metric "
                    "(target: Value, not per worker).")
    target: float | None = Field(
        None, gt=0,
        description="The metric's target (AverageValue per worker, or Value for ttft_p90_ms). Default by metric: "
                    "in_flight 8, queue 1, kv_usage 0.8, ttft_p90_ms 500 (kvsim's choices).")
    behavior: bool = Field(
        True, description="true: the HPA has spec.behavior (every behavior option below, Kubernetes' defaults unless "
                          "given). false: a manifest without behavior, which the controller normalises the legacy way "
                          "(normalizeDesiredReplicas): the highest recommendation of the scale-down window and at most "
                          "max(2 x current, 4) workers per sync; the scale_* options are then unused.")
    sync_period_s: float = Field(
        15.0, gt=0, description="How often the controller syncs (kube-controller-manager "
                                "--horizontal-pod-autoscaler-sync-period, default 15 s).")
    tolerance: float = Field(
        0.1, ge=0, description="No change while the usage ratio is within [1 - tolerance, 1 + tolerance] "
                               "(--horizontal-pod-autoscaler-tolerance, default 0.1).")
    scale_up_tolerance: float | None = Field(
        None, ge=0, description="behavior.scaleUp.tolerance (HPAConfigurableTolerance); default: tolerance.")
    scale_down_tolerance: float | None = Field(
        None, ge=0, description="behavior.scaleDown.tolerance (HPAConfigurableTolerance); default: tolerance.")
    scale_up_stabilization_s: float = Field(
        0.0, ge=0, le=3600, description="behavior.scaleUp.stabilizationWindowSeconds (default 0): scale up only to "
                                        "the lowest recommendation of this window.")
    scale_down_stabilization_s: float = Field(
        300.0, ge=0, le=3600,
        description="behavior.scaleDown.stabilizationWindowSeconds (default 300, "
                    "--horizontal-pod-autoscaler-downscale-stabilization): scale down only to the highest "
                    "recommendation of this window.")
    scale_up_pods: int | None = Field(
        4, gt=0, description="Scale-up Pods policy: add at most this many workers per scale_up_pods_period_s "
                             "(default 4; null: no such policy).")
    scale_up_pods_period_s: float = Field(15.0, gt=0, le=1800, description="Its period (default 15 s).")
    scale_up_percent: int | None = Field(
        100, gt=0, description="Scale-up Percent policy: grow by at most this % per scale_up_percent_period_s "
                               "(default 100; null: no such policy).")
    scale_up_percent_period_s: float = Field(15.0, gt=0, le=1800, description="Its period (default 15 s).")
    scale_up_select: SelectPolicy = Field(
        "max", description="behavior.scaleUp.selectPolicy: max (default: the policy allowing the most change), "
                           "min, or disabled (never scale up).")
    scale_down_pods: int | None = Field(
        None, gt=0, description="Scale-down Pods policy: remove at most this many workers per period (default: none).")
    scale_down_pods_period_s: float = Field(15.0, gt=0, le=1800, description="Its period (default 15 s).")
    scale_down_percent: int | None = Field(
        100, gt=0, le=100, description="Scale-down Percent policy: shrink by at most this % per period (default 100).")
    scale_down_percent_period_s: float = Field(15.0, gt=0, le=1800, description="Its period (default 15 s).")
    scale_down_select: SelectPolicy = Field(
        "max", description="behavior.scaleDown.selectPolicy: max (default), min, or disabled (never scale down).")

    @model_validator(mode="after")
    def _some_policy_each_way(self) -> HpaOptions:
        for way in ("up", "down"):
            disabled = getattr(self, f"scale_{way}_select") == "disabled"
            if not disabled and getattr(self, f"scale_{way}_pods") is None and getattr(self, f"scale_{way}_percent") is None:
                raise ValueError(f"scale_{way}: give scale_{way}_pods or scale_{way}_percent (or "
                                 f"scale_{way}_select=disabled)")
        return self

    def target_value(self) -> float:
        return HPA_DEFAULT_TARGETS[self.metric] if self.target is None else self.target


def milli(value: float) -> int:
    """A metric value as the HPA reads it: a resource.Quantity's MilliValue, which rounds up (ScaledValue(-3))."""
    return math.ceil(round(value * 1000, 6))


class HpaAutoscaler(AutoscalerBase):
    """Kubernetes' HPA (autoscaling/v2) on one metric, tick by tick as `HorizontalController.reconcileAutoscaler` does:

    1. current = the workers kept (ready + starting: the scale's spec.replicas); the first tick records it as a
       recommendation (`recordInitialRecommendation`). A target at 0 with min_workers > 0 is left alone (scaling
       disabled); outside [min, max] current is brought back to the bound, with no metric read.
    2. replica_calculator: per-worker metric (Pods metric, AverageValue target) -> usage ratio = average over the ready
       workers / target (`calcPlainMetricReplicas`); within the tolerance band -> current; else ceil(ratio x ready).
       Starting workers are Pending pods (unready): on a scale-up they count with usage 0 and the ratio is recomputed
       over ready + starting; a recomputation that flips the direction or lands in the band keeps current.
       `ttft_p90_ms` is an External metric with a Value target (`GetExternalMetricReplicas`): ratio = p90 / target,
       ceil(ratio x ready) out of the band. No metric (no ready worker, or no TTFT in the window) -> no change and no
       recommendation recorded (the controller's "unable to compute" path).
    3. `stabilizeRecommendationWithBehaviors`: the recommendation is recorded at now; the result is current brought
       into [min of the scale-up window's recommendations, max of the scale-down window's] (a window holds the
       recommendations strictly younger than its length, and this one).
    4. `convertDesiredReplicasWithBehaviorRate`: a scale-up is capped by the scale-up policies, a scale-down by the
       scale-down policies, each from the replicas at the start of its period (current minus the additions plus the
       removals of scale events strictly younger than the period); Pods: start ± value; Percent: up ceil(start x
       (1 + p/100)), down int(start x (1 - p/100)); select max (most change), min, or disabled; then [min, max].
    5. If the result differs from current, a scale event is stored at now.

    With `behavior=false` steps 3-5 are the legacy `normalizeDesiredReplicas` instead (`legacy_normalized`).
    """

    name = "hpa"
    summary = "Kubernetes HPA (autoscaling/v2): ceil(ready x metric/target), tolerance, stabilisation windows, rate policies."
    Options = HpaOptions

    def __init__(self, *, min_workers: int, max_workers: int, options: dict[str, Any]) -> None:
        super().__init__(min_workers=min_workers, max_workers=max_workers, options=options)
        opts: HpaOptions = self.options
        self.target = opts.target_value()
        self.up_tolerance = opts.tolerance if opts.scale_up_tolerance is None else opts.scale_up_tolerance
        self.down_tolerance = opts.tolerance if opts.scale_down_tolerance is None else opts.scale_down_tolerance
        self.recommendations: list[tuple[float, int]] = []
        """(time, unstabilised recommendation), oldest first."""
        self.scale_up_events: list[tuple[float, int]] = []
        """(time, workers added) of each scale-up."""
        self.scale_down_events: list[tuple[float, int]] = []
        """(time, workers removed) of each scale-down."""
        self.initial_recorded = False
        self.last_reason = ""
        """Why the last tick answered what it did (the HPA's condition reason: ScaleUpLimit, ScaleDownStabilized...)."""

    @classmethod
    def tick_s(cls, options: HpaOptions) -> float:
        return options.sync_period_s

    # ------------------------------------------------------------------ replica_calculator.go
    def within_tolerance(self, usage_ratio: float) -> bool:
        """`Tolerances.isWithin`: (1 - scaleDown) <= ratio <= (1 + scaleUp)."""
        return 1.0 - self.down_tolerance <= usage_ratio <= 1.0 + self.up_tolerance

    def usage_ratio(self, values: Sequence[float]) -> float:
        """`GetMetricUsageRatio`: the average in milli-units (integer division, as the Go code divides int64s) over
        the target in milli-units."""
        average_milli = sum(milli(v) for v in values) // len(values)
        return average_milli / milli(self.target)

    def metric_replicas(self, snapshot: FleetSnapshot, current: int) -> int | None:
        """The metric's replica count, or None when the metric cannot be read (the HPA then changes nothing)."""
        ready = [w for w in snapshot.workers if w.phase == "ready"]
        if self.options.metric == "ttft_p90_ms":
            if not snapshot.ttft_ms:
                return None
            usage_ratio = milli(percentile_90(snapshot.ttft_ms)) / milli(self.target)
            if current == 0:  # scale from zero on the ratio alone (reached only with min_workers 0)
                return math.ceil(usage_ratio)
            if self.within_tolerance(usage_ratio):
                return current
            return math.ceil(usage_ratio * len(ready))
        if not ready:
            return None
        values = [self.per_worker_value(w) for w in ready]
        usage_ratio = self.usage_ratio(values)
        unready = snapshot.starting
        scale_up_with_unready = unready > 0 and usage_ratio > 1.0
        if not scale_up_with_unready:
            if self.within_tolerance(usage_ratio):
                return current
            return math.ceil(usage_ratio * len(ready))
        # NOTE: on a scale-up, Pending (starting) workers count as using 0 of the metric, so that replicas already on
        # their way are not asked for twice.
        values = values + [0.0] * unready
        new_ratio = self.usage_ratio(values)
        if self.within_tolerance(new_ratio) or new_ratio < 1.0:
            return current
        new_replicas = math.ceil(new_ratio * len(values))
        return current if new_replicas < current else new_replicas

    def per_worker_value(self, worker: WorkerSnapshot) -> float:
        metric = self.options.metric
        if metric == "in_flight":
            return worker.in_flight
        if metric == "queue":
            return worker.num_waiting
        return worker.kv_usage

    # ------------------------------------------------------------------ horizontal.go
    def stabilize(self, now_s: float, current: int, recommendation: int) -> int:
        """`stabilizeRecommendationWithBehaviors`."""
        opts: HpaOptions = self.options
        up_cutoff = now_s - opts.scale_up_stabilization_s
        down_cutoff = now_s - opts.scale_down_stabilization_s
        up = down = recommendation
        for at_s, rec in self.recommendations:
            if at_s > up_cutoff:
                up = min(up, rec)
            if at_s > down_cutoff:
                down = max(down, rec)
        oldest_kept = min(up_cutoff, down_cutoff)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > oldest_kept]
        self.recommendations.append((now_s, recommendation))
        return min(max(current, up), down)

    @staticmethod
    def changed_within(events: Sequence[tuple[float, int]], now_s: float, period_s: float) -> int:
        """`getReplicasChangePerPeriod`: the replicas changed by events strictly younger than the period."""
        cutoff = now_s - period_s
        return sum(change for at_s, change in events if at_s > cutoff)

    def period_start(self, now_s: float, current: int, period_s: float) -> int:
        return (current - self.changed_within(self.scale_up_events, now_s, period_s)
                + self.changed_within(self.scale_down_events, now_s, period_s))

    def scale_up_limit(self, now_s: float, current: int) -> int:
        """`calculateScaleUpLimitWithScalingRules`."""
        opts: HpaOptions = self.options
        if opts.scale_up_select == "disabled":
            return current
        proposals = []
        if opts.scale_up_pods is not None:
            proposals.append(self.period_start(now_s, current, opts.scale_up_pods_period_s) + opts.scale_up_pods)
        if opts.scale_up_percent is not None:
            start = self.period_start(now_s, current, opts.scale_up_percent_period_s)
            proposals.append(math.ceil(start * (1 + opts.scale_up_percent / 100)))
        return min(proposals) if opts.scale_up_select == "min" else max(proposals)

    def scale_down_limit(self, now_s: float, current: int) -> int:
        """`calculateScaleDownLimitWithBehaviors`."""
        opts: HpaOptions = self.options
        if opts.scale_down_select == "disabled":
            return current
        proposals = []
        if opts.scale_down_pods is not None:
            proposals.append(self.period_start(now_s, current, opts.scale_down_pods_period_s) - opts.scale_down_pods)
        if opts.scale_down_percent is not None:
            start = self.period_start(now_s, current, opts.scale_down_percent_period_s)
            proposals.append(int(start * (1 - opts.scale_down_percent / 100)))
        return max(proposals) if opts.scale_down_select == "min" else min(proposals)

    def rate_limited(self, now_s: float, current: int, desired: int) -> int:
        """`convertDesiredReplicasWithBehaviorRate`."""
        if desired > current:
            limit = max(self.scale_up_limit(now_s, current), current)
            allowed = min(self.max_workers, limit)
            self.last_reason = "ScaleUpLimit" if self.max_workers > limit else "TooManyReplicas"
            return allowed if desired > allowed else self._within(desired)
        if desired < current:
            limit = min(self.scale_down_limit(now_s, current), current)
            allowed = max(self.min_workers, limit)
            self.last_reason = "ScaleDownLimit" if self.min_workers < limit else "TooFewReplicas"
            return allowed if desired < allowed else self._within(desired)
        return self._within(desired)

    def legacy_normalized(self, now_s: float, current: int, recommendation: int) -> int:
        """Without spec.behavior: `stabilizeRecommendation` (the highest recommendation not older than the scale-down
        window, its edge included) then `convertDesiredReplicasWithRules` (at most max(2 x current, 4), within
        [min, max])."""
        cutoff = now_s - self.options.scale_down_stabilization_s
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= cutoff]
        stabilized = max([recommendation] + [r for _, r in self.recommendations])
        self.recommendations.append((now_s, recommendation))
        scale_up_limit = max(2 * current, 4)
        allowed = min(self.max_workers, scale_up_limit)
        if stabilized < self.min_workers:
            self.last_reason = "TooFewReplicas"
            return self.min_workers
        if stabilized > allowed:
            self.last_reason = "ScaleUpLimit" if self.max_workers > scale_up_limit else "TooManyReplicas"
            return allowed
        return self._within(stabilized)

    def _within(self, desired: int) -> int:
        self.last_reason = "DesiredWithinRange"
        return desired

    def desired_workers(self, snapshot: FleetSnapshot) -> int:
        now_s = snapshot.now_s
        current = current_replicas(snapshot)
        if not self.initial_recorded:
            # recordInitialRecommendation: the first reconcile records the current count, so that a new HPA does not
            # scale down before its scale-down window has passed.
            self.recommendations.append((now_s, current))
            self.initial_recorded = True
        if current == 0 and self.min_workers != 0:
            self.last_reason = "ScalingDisabled"  # the HPA does not act on a target scaled to zero
            return 0
        if current > self.max_workers:
            desired, self.last_reason = self.max_workers, "AboveMaxReplicas"
        elif current < self.min_workers:
            desired, self.last_reason = self.min_workers, "BelowMinReplicas"
        else:
            recommendation = self.metric_replicas(snapshot, current)
            if recommendation is None:
                self.last_reason = "FailedGetMetric"
                return current
            if self.options.behavior:
                stabilized = self.stabilize(now_s, current, recommendation)
                desired = self.rate_limited(now_s, current, stabilized)
            else:
                desired = self.legacy_normalized(now_s, current, recommendation)
                return desired  # without behavior, no scale event is stored (storeScaleEvent)
        if desired > current:
            self.scale_up_events.append((now_s, desired - current))
        elif desired < current:
            self.scale_down_events.append((now_s, current - desired))
        return desired


def percentile_90(values: Sequence[float]) -> float:
    """The 90th percentile with linear interpolation between closest ranks (numpy's default, as kvsim's summaries and
    timeline compute TTFT percentiles), so that the HPA reads the p90 the timeline shows."""
    ordered = sorted(values)
    position = 0.9 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ---------------------------------------------------------------------------------------------------------- planner


class PlannerOptions(AutoscalerOptions):
    """Dynamo's SLA Planner, throughput-based scaling in aggregated mode (defaults: Dynamo's `SLAPlannerDefaults`)."""

    adjustment_interval_s: float = Field(
        180.0, gt=0, description="throughput_adjustment_interval: how often the planner observes the traffic of the "
                                 "last interval and scales (Dynamo default 180 s).")
    worker_rps: float | None = Field(
        None, gt=0, description="Requests per second one worker serves meeting the SLO (Dynamo's engine_rps from its "
                                "pre-deployment profiling). Default: measured for the scenario by "
                                "sim.studies.worker_profile.")
    observe: Literal["completed", "arrivals"] = Field(
        "completed", description="The interval's request count the predictor learns from: completed (Dynamo's default "
                                 "throughput_metrics_source=frontend: increase(dynamo_frontend_requests_total), which "
                                 "the frontend counts when a response ends) or arrivals (requests that reached the "
                                 "router in the interval).")
    predictor: Literal["constant", "kalman"] = Field(
        "constant", description="Load predictor of the next interval's requests: constant (the last interval's) or "
                                "kalman (Dynamo's local-linear-trend Kalman filter). Dynamo's default, arima "
                                "(pmdarima auto_arima), is not built; it equals constant for the first 4 intervals.")
    kalman_q_level: float = Field(1.0, gt=0, description="kalman: level process noise (Dynamo default 1.0).")
    kalman_q_trend: float = Field(0.1, gt=0, description="kalman: trend process noise (Dynamo default 0.1).")
    kalman_r: float = Field(10.0, gt=0, description="kalman: measurement noise (Dynamo default 10.0).")
    min_endpoint: int = Field(1, ge=0, description="Fewest workers the planner asks for (Dynamo default 1).")
    max_gpu_budget: int = Field(8, description="Most GPUs the planner asks for (Dynamo default 8; negative: no budget).")
    engine_num_gpu: int = Field(1, ge=1, description="GPUs per worker (Dynamo's decode_engine_num_gpu, default 1).")


class ConstantPredictor:
    """Dynamo's `ConstantPredictor`: the next value is the last one observed (0 before any)."""

    def __init__(self) -> None:
        self.data: list[float] = []
        self.seen_nonzero = False

    def add(self, value: float) -> bool:
        """`BasePredictor.add_data_point`: a non-finite reading is 0, and the leading run of zeros (the idle period
        before the first traffic) is skipped. True if the value was kept."""
        if not math.isfinite(value):
            value = 0.0
        if value == 0 and not self.seen_nonzero:
            return False
        self.seen_nonzero = self.seen_nonzero or value != 0
        self.data.append(value)
        return True

    def predict_next(self) -> float:
        return self.data[-1] if self.data else 0.0


class KalmanPredictor(ConstantPredictor):
    """Dynamo's `KalmanPredictor` (filterpy `KalmanFilter(dim_x=2, dim_z=1)`): state [level, trend], F = [[1, 1],
    [0, 1]], H = [1, 0], P0 = 1000 I, Q = diag(q_level, q_trend), R = r; the first kept value sets the level; each
    later one is a predict (unless a forecast was already made for this step) and an update (Joseph form, as filterpy);
    the forecast is the predicted level, cached until the next value."""

    def __init__(self, q_level: float, q_trend: float, r: float) -> None:
        super().__init__()
        self.q = (q_level, q_trend)
        self.r = r
        self.x = [0.0, 0.0]
        self.p = [[1000.0, 0.0], [0.0, 1000.0]]
        self.initialized = False
        self.cached: float | None = None

    def _predict(self) -> None:
        (l, t), ((a, b), (c, d)) = self.x, self.p
        self.x = [l + t, t]
        # P = F P F^T + Q with F = [[1, 1], [0, 1]]
        self.p = [[a + b + c + d + self.q[0], b + d], [c + d, d + self.q[1]]]

    def _update(self, z: float) -> None:
        (a, b), (c, d) = self.p
        s = a + self.r
        k0, k1 = a / s, c / s
        y = z - self.x[0]
        self.x = [self.x[0] + k0 * y, self.x[1] + k1 * y]
        # Joseph form: P = (I - K H) P (I - K H)^T + K R K^T, with (I - K H) = [[1 - k0, 0], [-k1, 1]]
        m = [[1 - k0, 0.0], [-k1, 1.0]]
        mp = [[sum(m[i][j] * self.p[j][k] for j in range(2)) for k in range(2)] for i in range(2)]
        mpm = [[sum(mp[i][j] * m[k][j] for j in range(2)) for k in range(2)] for i in range(2)]
        kk = (k0, k1)
        self.p = [[mpm[i][k] + kk[i] * self.r * kk[k] for k in range(2)] for i in range(2)]

    def add(self, value: float) -> bool:
        if not super().add(value):
            return False
        z = self.data[-1]
        if not self.initialized:
            self.x = [z, 0.0]
            self.initialized = True
        else:
            if self.cached is None:
                self._predict()
            self._update(z)
        self.cached = None
        return True

    def predict_next(self) -> float:
        if not self.initialized:
            return super().predict_next()
        if self.cached is None:
            self._predict()
            self.cached = self.x[0]
        return self.cached


class PlannerAutoscaler(AutoscalerBase):
    """Dynamo's SLA Planner, throughput-based, as `PlannerStateMachine` runs it for an aggregated deployment:

    every `adjustment_interval_s` it adds the interval's request count (by default the requests completed in it, as
    Dynamo's frontend counter `requests_total` is incremented when a response ends) to the load predictor, predicts the next
    interval's, and asks for `max(ceil(predicted / interval / worker_rps), min_endpoint)` workers
    (`_throughput_agg`), then clamps to the GPU budget (`_budget_clamp`: over budget -> max(min_endpoint,
    floor(budget / engine_num_gpu)); a budget below min_endpoint's GPUs -> 0). kvsim's workers are aggregated, so
    Dynamo's own aggregated rule applies: one engine type whose requests per second at the TTFT and ITL SLAs
    (`find_best_engine_agg_rps`) is `worker_rps`. A window without traffic since the start keeps the predictor empty
    (the leading idle period is skipped) and the answer is min_endpoint.
    """

    name = "planner"
    summary = "Dynamo SLA Planner (throughput, agg): ceil(predicted rps / worker rps at the SLO), min endpoints, GPU budget."
    Options = PlannerOptions

    def __init__(self, *, min_workers: int, max_workers: int, options: dict[str, Any]) -> None:
        super().__init__(min_workers=min_workers, max_workers=max_workers, options=options)
        opts: PlannerOptions = self.options
        if opts.worker_rps is None:
            raise ProblemsError([Problem(("worker_rps",), "planner needs the requests per second one worker serves "
                                                          "meeting the SLO (give worker_rps=..., or let the "
                                                          "composition root measure it)")])
        self.worker_rps = opts.worker_rps
        self.predictor = (ConstantPredictor() if opts.predictor == "constant"
                          else KalmanPredictor(opts.kalman_q_level, opts.kalman_q_trend, opts.kalman_r))
        self.last_demand_rps = math.nan
        """The predicted demand of the last tick (requests per second), for timelines and tests."""

    @classmethod
    def tick_s(cls, options: PlannerOptions) -> float:
        return options.adjustment_interval_s

    def budget_clamp(self, desired: int) -> int:
        """`PlannerStateMachine._budget_clamp`."""
        opts: PlannerOptions = self.options
        budget = opts.max_gpu_budget
        if budget < 0 or desired * opts.engine_num_gpu <= budget:
            return desired
        if budget < opts.min_endpoint * opts.engine_num_gpu:
            return 0
        return max(opts.min_endpoint, budget // opts.engine_num_gpu)

    def desired_workers(self, snapshot: FleetSnapshot) -> int:
        opts: PlannerOptions = self.options
        self.predictor.add(float(snapshot.completed if opts.observe == "completed" else snapshot.arrivals))
        if snapshot.window_s <= 0:
            return current_replicas(snapshot)
        self.last_demand_rps = self.predictor.predict_next() / snapshot.window_s
        desired = max(math.ceil(self.last_demand_rps / self.worker_rps), opts.min_endpoint)
        return self.budget_clamp(max(desired, opts.min_endpoint))


# ---------------------------------------------------------------------------------------------------------- schedule


class ScheduleOptions(AutoscalerOptions):
    """Replicas over time: `at=0/2,3600/6` (time_s/workers, comma-separated) or a list `[[0, 2], [3600, 6]]`."""

    at: tuple[tuple[float, int], ...] = Field(
        description="(time_s, workers) points, times strictly increasing: from each time on the fleet wants that many "
                    "workers (before the first: no change). Spec form: at=0/2,3600/6.")
    interval_s: float = Field(15.0, gt=0, description="How often the schedule is read (a change at time t applies at "
                                                      "the first tick at or after t).")

    @field_validator("at", mode="before")
    @classmethod
    def _points(cls, value: Any) -> Any:
        if isinstance(value, str):
            points = []
            for item in value.split(","):
                time_s, slash, workers = item.strip().partition("/")
                if not slash:
                    raise ValueError(f"{item.strip()!r} is not time_s/workers (e.g. at=0/2,3600/6)")
                points.append((time_s, workers))
            return points
        if isinstance(value, Sequence):
            return [(p.get("at_s"), p.get("workers")) if isinstance(p, dict) else p for p in value]
        return value

    @field_validator("at")
    @classmethod
    def _increasing(cls, points: tuple[tuple[float, int], ...]) -> tuple[tuple[float, int], ...]:
        if not points:
            raise ValueError("give at least one time_s/workers point")
        for (t0, _), (t1, _) in zip(points, points[1:]):
            if not t1 > t0:
                raise ValueError(f"times must increase strictly, got {t0:g} then {t1:g}")
        for t, n in points:
            if t < 0 or n < 0:
                raise ValueError(f"time_s and workers must be >= 0, got {t:g}/{n}")
        return points


class ScheduleAutoscaler(AutoscalerBase):
    """The workers of the last point at or before now; before the first point, the current count."""

    name = "schedule"
    summary = "Replicas over time (at=0/2,3600/6): the last point at or before now."
    Options = ScheduleOptions

    @classmethod
    def tick_s(cls, options: ScheduleOptions) -> float:
        return options.interval_s

    def desired_workers(self, snapshot: FleetSnapshot) -> int:
        due = [workers for at_s, workers in self.options.at if at_s <= snapshot.now_s]
        return due[-1] if due else current_replicas(snapshot)


# ---------------------------------------------------------------------------------------------------------- registry


AUTOSCALERS: dict[str, type[AutoscalerBase]] = named_registry(
    "autoscaler", (HpaAutoscaler, PlannerAutoscaler, ScheduleAutoscaler))
"""Every autoscaler by name: one class plus one line here."""


def split_autoscaler_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`NAME:k=v,k=v` -> (NAME, {k: v}), values as YAML scalars (as router specs). An item without `=` continues the
    previous value (`schedule:at=0/2,3600/6,interval_s=30` -> at = "0/2,3600/6"). One-line ValueError otherwise."""
    name, colon, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"{spec!r}: an autoscaler spec starts with its name (NAME or NAME:key=value,...)")
    raw: dict[str, str] = {}
    last: str | None = None
    for item in rest.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            if last is None:
                raise ValueError(f"{spec!r}: {item.strip()!r} is not key=value (NAME or NAME:key=value,...)")
            raw[last] += "," + item.strip()
            continue
        key, value = key_value(item)
        if key in raw:
            raise ValueError(f"{spec!r}: option {key} given twice")
        raw[key], last = value, key
    if colon and not raw:
        raise ValueError(f"{spec!r}: nothing after ':' (give key=value options or drop the ':')")
    return name, {k: v if "," in v else option_value(v) for k, v in raw.items()}


def build_autoscaler(name: str, options: dict[str, Any], *, min_workers: int, max_workers: int) -> AutoscalerBase:
    """The registered autoscaler `name` with `options`; a one-line ProblemsError names an unknown name (with the
    registered ones) or each bad option."""
    cls = AUTOSCALERS.get(name)
    if cls is None:
        raise ProblemsError([Problem(("autoscaler",), f"unknown autoscaler {name!r} (one of: "
                                                      f"{', '.join(AUTOSCALERS)})")])
    return cls(min_workers=min_workers, max_workers=max_workers, options=options)
