"""Fitting the time model to measured latencies: simulate the measured points, compare, adjust (scipy).

Targets are measured figures of a *case*: TTFT percentiles overall and of hits and misses, and throughput. A case is
either a point (workers, prefixes, concurrency) of an aggregated reference file, simulated `repeats` times with fixed
seeds (common random numbers), or one measured run CSV, simulated once with its own requests and routing. Either way
the objective is deterministic: the same inputs give the same parameters. Residuals are
relative, log(predicted / measured), scaled by what is expected of that kind of figure (`RELATIVE_SCALE`: 10 % for
medians, 20 % for p90, 30 % for p99), and minimised with a robust loss (soft L1: quadratic within that scale,
linear beyond, so one noisy figure cannot drag the fit) over log-parameters within bounds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import qmc

from sim.results.records import TtftSamples
from sim.results.stats import per_second, percentile
from sim.studies.reference import Measurement
from sim.servers.run_csv import Run
from sim.runner import run
from sim.scenario import Scenario, ScenarioError
from sim.studies.executor import Executor, using
from sim.studies.validate import measured_figures, scenario_for_run, stream_for_run
from sim.workloads.shared_prefix import RequestStream

Point = tuple[int, int, int]  # (workers, prefixes, concurrency)

# metric -> (which requests, percentile); throughput is handled apart
TTFT_METRICS = {
    f"ttft{'' if split == 'all' else '_' + split}_p{q}": (split, q)
    for split in ("all", "hit", "miss") for q in (50, 90, 99)
}
# metric -> (which latency of every request, percentile): end to end and per output token, client-timed
LATENCY_METRICS = {f"{kind}_p{q}": (kind, q) for kind in ("e2e", "tpot") for q in (50, 90, 99)}
FITTABLE_METRICS = set(TTFT_METRICS) | set(LATENCY_METRICS) | {"throughput_rps"}
REPORT_ONLY_METRICS = frozenset(m for m in LATENCY_METRICS if m.startswith("tpot"))
"""Reported by `kvsim calibrate` but not fitted unless asked: a client starved of CPU (the real-vLLM fixtures)
receives streamed tokens in bursts, which distorts its TPOT; its E2E (the last token) is not distorted."""

# Residual scale by percentile: relative errors up to this size count quadratically, larger ones linearly. A tail
# percentile of a few hundred requests is noisier than a median, so it is allowed more before it pulls hard.
RELATIVE_SCALE = {50: 0.10, 90: 0.20, 99: 0.30, "throughput_rps": 0.10}


def relative_scale(metric: str) -> float:
    if metric == "throughput_rps":
        return RELATIVE_SCALE[metric]
    return RELATIVE_SCALE[(TTFT_METRICS.get(metric) or LATENCY_METRICS[metric])[1]]

# Bounds of each kind of parameter (natural units); fitted in log space.
BOUNDS = {
    "speed": (0.05, 50.0),
    "sharing_efficiency": (0.2, 1.0),
    "step_occupancy": (0.02, 1.0),
    "host_load": (1e-3, 4.0),
    "idle_load": (1e-3, 4.0),
    "pause_s": (1e-3, 5.0),
    "pause_fraction": (1e-4, 0.9),
    "_efficiency": (1e-3, 1.0),  # a roofline's fractions of the hardware's peaks
    "_s": (1e-9, 2.0),
}


@dataclass(frozen=True, slots=True)
class Target:
    case: str
    """What to simulate: 'workers/prefixes/concurrency' (a reference point, e.g. '6/7/4', with the base scenario's
    workload) or a run CSV's name."""
    point: Point
    metric: str
    measured: float
    pooled: bool
    """True: percentile over the requests of all repeats pooled; False: median over repeats of each run's value."""

    @property
    def label(self) -> str:
        w, n, c = self.point
        return f"{self.case} W={w} N={n} concurrency={c} {self.metric}" if self.case != _point_case(self.point) else \
            f"W={w} N={n} concurrency={c} {self.metric}"


def _point_case(point: Point) -> str:
    return "/".join(map(str, point))


def targets_from_reference(measurements: Iterable[Measurement]) -> list[Target]:
    """The measured figures kvsim can predict (TTFT in ms, throughput), with the reference's aggregation."""
    out = []
    for m in measurements:
        metric = m.metric.removesuffix("_ms")
        if metric not in FITTABLE_METRICS:
            continue
        if metric != "throughput_rps" and m.unit not in ("ms", ""):
            raise ValueError(f"reference metric {m.metric} at {m.workers}/{m.prefixes}/{m.concurrency}: unit must be ms")
        point = (m.workers, m.prefixes, m.concurrency)
        out.append(Target(_point_case(point), point, metric, m.value, pooled="pooled" in m.aggregation))
    return out


def targets_from_runs(runs: Iterable[Run], *, ttft_source: str = "client") -> list[Target]:
    """TTFT p50/p90/p99 overall and of hits and misses, E2E (client-timed) and TPOT p50/p90/p99, and throughput,
    of each measured run; TTFT and TPOT as the client timed them or as the server reports them (`ttft_source`,
    `RunRow.ttft`, `RunRow.tpot_ms`: the server's TPOT where the run recorded vLLM's generation time)."""
    out = []
    for measured_run in runs:
        rows = measured_run.measured
        point = (measured_run.setup.workers, measured_run.setup.prefixes, measured_run.setup.concurrency)
        for metric, (split, q) in TTFT_METRICS.items():
            values = [r.ttft(ttft_source) for r in rows if split == "all" or (split == "hit") == r.is_hit]
            if len(values) >= 10:  # a percentile of a handful of requests is not a measurement
                out.append(Target(measured_run.name, point, metric, percentile(values, q), pooled=True))
        outputs = measured_run.setup.output_tokens
        for metric, (kind, q) in LATENCY_METRICS.items():
            values = [r.e2e_ms for r in rows] if kind == "e2e" else \
                [v for r in rows if (v := r.tpot_ms(outputs, ttft_source)) is not None]
            if len(values) >= 10:
                out.append(Target(measured_run.name, point, metric, percentile(values, q), pooled=True))
        out.append(Target(measured_run.name, point, "throughput_rps", measured_figures(measured_run)["throughput_rps"],
                          pooled=True))
    return out


# ---------------------------------------------------------------------------------------------- parameters
def parameter_bounds(name: str) -> tuple[float, float]:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in BOUNDS:
        return BOUNDS[leaf]
    for suffix in ("_efficiency", "_s"):
        if leaf.endswith(suffix):
            return BOUNDS[suffix]
    raise ValueError(f"cannot fit {name!r}: only times (..._s), efficiencies (..._efficiency) and a device's speed, "
                     f"sharing_efficiency, host_load, idle_load, step_occupancy, pause_s, pause_fraction and handoff_s are fitted")


def read_parameter(scenario: Scenario, name: str) -> float:
    """Parameter addresses: 'time_model.base_s', 'cluster.request_overhead_s', 'device.gpu-24gb.speed'."""
    kind, _, rest = name.partition(".")
    if kind == "device":
        device, _, field = rest.rpartition(".")
        for dep in scenario.cluster.deployments:
            for d in dep.devices:
                if d.name == device:
                    return float(getattr(d, field))
        raise ValueError(f"{name}: no device named {device!r} in cluster.deployments")
    node = scenario.model_dump()
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{name}: no such scenario field")
        node = node[part]
    if node is None:
        raise ValueError(f"{name}: unset in the scenario (give it a starting value there to fit it)")
    if not isinstance(node, (int, float)):
        raise ValueError(f"{name}: not a number")
    return float(node)


def apply_parameters(scenario: Scenario, values: dict[str, float]) -> Scenario:
    """A copy of `scenario` with the parameters set (a device parameter applies to every device of that name)."""
    data = scenario.model_dump()
    for name, value in values.items():
        kind, _, rest = name.partition(".")
        if kind == "device":
            device, _, field = rest.rpartition(".")
            for dep in data["cluster"]["deployments"]:
                for d in dep["devices"]:
                    if d["name"] == device:
                        d[field] = value
        else:
            node = data
            *parents, leaf = name.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = value
    try:
        return Scenario.model_validate(data)
    except Exception as err:  # pydantic's ValidationError, reported with the values that caused it
        raise ScenarioError(f"parameters {values}: {err}") from None


# ---------------------------------------------------------------------------------------------- prediction
@dataclass(frozen=True, slots=True)
class Latencies:
    """What one simulated run contributes to the targets."""

    ttft: TtftSamples
    throughput_rps: float
    e2e_ms: tuple[float, ...] = ()
    tpot_ms: tuple[float, ...] = ()
    """Of the requests with more than one output token."""

    def latency_ms(self, kind: str) -> tuple[float, ...]:
        """`kind`: "e2e", "tpot", or a TTFT split ("all", "hit", "miss")."""
        if kind == "e2e":
            return self.e2e_ms
        return self.tpot_ms if kind == "tpot" else self.ttft.ttft_ms(kind)


def simulate_latencies(scenario: Scenario, stream: RequestStream | None = None,
                       ttft_source: str = "client") -> Latencies:
    result = run(scenario, stream)
    measured = result.measured
    duration = result.measured_end_s - result.measured_start_s
    return Latencies(
        ttft=TtftSamples.of(measured, engine=ttft_source == "server"),
        throughput_rps=per_second(len(measured), duration),
        e2e_ms=tuple(r.e2e_s * 1000 for r in measured),
        tpot_ms=tuple(r.tpot_s * 1000 for r in measured if r.tpot_s is not None),
    )


def _simulate_job(job: tuple[Scenario, RequestStream | None, str]) -> Latencies:
    return simulate_latencies(*job)


def latencies_to_json(latencies: Latencies) -> dict:
    return {"ttft_hit_ms": list(latencies.ttft.hit_ms), "ttft_miss_ms": list(latencies.ttft.miss_ms),
            "throughput_rps": latencies.throughput_rps, "e2e_ms": list(latencies.e2e_ms),
            "tpot_ms": list(latencies.tpot_ms)}


def latencies_from_json(run: dict) -> Latencies:
    return Latencies(TtftSamples(tuple(run["ttft_hit_ms"]), tuple(run["ttft_miss_ms"])), run["throughput_rps"],
                     tuple(run.get("e2e_ms", ())), tuple(run.get("tpot_ms", ())))


class RunStore(Protocol):
    """Where a fit keeps its finished simulations so that a rerun takes them instead of simulating again
    (`sim.results.journal.RunJournal`): keyed by `[[[parameter, value], ...], case, seed]` (the candidate's
    parameter values as exact floats, the measured point or run CSV simulated, the run's seed), the run is its
    `latencies_to_json` (JSON-compatible; it must come back equal, floats exact)."""

    def __contains__(self, key: Sequence[Any]) -> bool: ...

    def get(self, key: Sequence[Any]) -> Any: ...

    def append(self, key: Sequence[Any], run: Any) -> None: ...


def predict(target: Target, runs: Sequence[Latencies]) -> float:
    """The simulated counterpart of a measured figure, aggregated over runs the way the measurement was."""
    if target.metric == "throughput_rps":
        return float(np.median([r.throughput_rps for r in runs]))
    kind, q = TTFT_METRICS.get(target.metric) or LATENCY_METRICS[target.metric]
    samples = [r.latency_ms(kind) for r in runs]
    if target.pooled:
        return percentile([v for s in samples for v in s], q)
    per_run = [percentile(s, q) for s in samples if s]
    return float(np.median(per_run)) if per_run else float("nan")


class Simulator:
    """Simulates cases under candidate scenarios: reference points `repeats` times (seeds seed..seed+repeats-1),
    measured runs once each with their own requests and recorded routing."""

    def __init__(self, runner: Executor, *, repeats: int, seed: int, runs: Iterable[Run] = (),
                 ttft_source: str = "client", store: RunStore | None = None) -> None:
        self.runner = runner
        self.store = store
        self.ttft_source = ttft_source
        self.repeats = repeats
        self.seed = seed
        self.runs_by_name = {r.name: r for r in runs}
        self.num_evaluations = 0
        self.num_simulated = 0
        """Simulations run (not taken from the store)."""

    def _jobs(self, scenario: Scenario, case: str) -> list[tuple[Scenario, RequestStream | None, str]]:
        run = self.runs_by_name.get(case)
        if run is not None:
            s = scenario_for_run(scenario, run)
            return [(s, stream_for_run(run, block_size=s.engine.block_size), self.ttft_source)]
        w, n, c = (int(x) for x in case.split("/"))
        return [(scenario.with_overrides(**{"cluster.workers": w, "workload.prefixes": n, "workload.concurrency": c,
                                            "seed": self.seed + r}), None, "client") for r in range(self.repeats)]

    def simulate(self, scenario: Scenario, cases: Iterable[str],
                 parameters: dict[str, float] | None = None) -> dict[str, list[Latencies]]:
        """Each case's runs under `scenario`. With a store, `parameters` (the values that made `scenario` from the
        fit's base) identify the runs in it: those it holds are taken, the others run and appended as they finish."""
        self.num_evaluations += 1
        names, jobs = [], []
        for case in dict.fromkeys(cases):
            for job in self._jobs(scenario, case):
                names.append(case)
                jobs.append(job)
        results: list = [None] * len(jobs)
        todo = list(range(len(jobs)))
        keys: list = []
        if self.store is not None:
            if parameters is None:
                raise ValueError("a simulator with a store needs the parameter values of each scenario")
            values = [[name, float(v)] for name, v in parameters.items()]
            keys = [[values, case, job[0].seed] for case, job in zip(names, jobs)]
            todo = []
            for i, key in enumerate(keys):
                if key in self.store:
                    results[i] = latencies_from_json(self.store.get(key))
                else:
                    todo.append(i)

        def on_result(j: int, result: Latencies) -> None:
            if self.store is not None:
                self.store.append(keys[todo[j]], latencies_to_json(result))

        fresh = self.runner.map(_simulate_job, [jobs[i] for i in todo], None, on_result)
        self.num_simulated += len(todo)
        for i, result in zip(todo, fresh):
            results[i] = result
        out: dict[str, list[Latencies]] = defaultdict(list)
        for case, result in zip(names, results):
            out[case].append(result)
        return out


# ---------------------------------------------------------------------------------------------- fitting
@dataclass(frozen=True, slots=True)
class Residual:
    target: Target
    predicted: float
    used_in_fit: bool

    @property
    def error(self) -> float:
        """Relative error, predicted / measured - 1."""
        return self.predicted / self.target.measured - 1.0


@dataclass(frozen=True, slots=True)
class FitResult:
    scenario: Scenario
    parameters: dict[str, float]
    initial: dict[str, float]
    residuals: tuple[Residual, ...]
    evaluations: int
    cost: float
    message: str

    def rms_log_error(self, *, used_in_fit: bool, exclude: frozenset[str] = frozenset()) -> float:
        """RMS of log(predicted / measured) over the fitted (or the other) figures, but the metrics in `exclude`."""
        errs = [math.log(r.predicted / r.target.measured) for r in self.residuals
                if r.used_in_fit == used_in_fit and r.target.metric not in exclude]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else float("nan")


def evaluate(scenario: Scenario, targets: Sequence[Target], sim: Simulator, fitted: set[Target],
             parameters: dict[str, float] | None = None) -> list[Residual]:
    results = sim.simulate(scenario, [t.case for t in targets], parameters)
    return [Residual(t, predict(t, results[t.case]), t in fitted) for t in targets]


def _soft_l1_cost(r: np.ndarray) -> float:
    return float(np.sum(np.sqrt(1.0 + r * r) - 1.0))


def fit(
    base: Scenario,
    targets: Sequence[Target],
    parameters: Sequence[str],
    *,
    holdout: Callable[[Target], bool] = lambda t: False,
    repeats: int = 2,
    runs: Sequence[Run] = (),
    ttft_source: str = "client",
    jobs: int | None = None,
    starts: int = 12,
    refine: int = 2,
    max_evaluations: int = 60,
    progress: Callable[[int, float], None] | None = None,
    executor: Executor | None = None,
    store: RunStore | None = None,
) -> FitResult:
    """Fit `parameters` to the targets not held out; residuals are reported for all targets.

    Multi-start, because the simulated objective has several basins and small jumps (a change of event order):
    the initial values and `starts` quasi-random points (a scrambled Halton sequence with a fixed seed, within a
    factor 3 of the initial values) are scored, then the best `refine` are refined with `least_squares`
    (soft L1, finite differences of 5 % in log space, at most `max_evaluations` each). Deterministic.

    With a `store`, each finished simulation is appended to it and those it already holds are taken from it
    instead of run: the optimiser evaluates the same candidates again (the objective is deterministic), so a rerun
    over a partial store is the uninterrupted fit, simulating only what the store lacks.
    """
    if not parameters:
        raise ValueError("give at least one parameter to fit")
    used = [t for t in targets if not holdout(t)]
    if not used:
        raise ValueError("every target is held out: nothing to fit")
    initial = {p: read_parameter(base, p) for p in parameters}
    bounds = [parameter_bounds(p) for p in parameters]
    lower = np.log([b[0] for b in bounds])
    upper = np.log([b[1] for b in bounds])
    x0 = np.clip(np.log([max(initial[p], 1e-12) for p in parameters]), lower + 1e-6, upper - 1e-6)
    measured = np.array([t.measured for t in used])
    scale = np.array([relative_scale(t.metric) for t in used])

    with using(executor, jobs) as runner:
        sim = Simulator(runner, repeats=repeats, seed=base.seed, runs=runs, ttft_source=ttft_source, store=store)
        used_cases = [t.case for t in used]

        def residuals(x: np.ndarray) -> np.ndarray:
            values = dict(zip(parameters, (float(v) for v in np.exp(x))))
            scenario = apply_parameters(base, values)
            results = sim.simulate(scenario, used_cases, values)
            predicted = np.array([predict(t, results[t.case]) for t in used])
            r = np.log(np.maximum(predicted, 1e-9) / measured)
            if progress:
                progress(sim.num_evaluations, float(np.sqrt(np.mean(r * r))))
            return r / scale

        candidates = [x0]
        if starts > 0:
            unit = qmc.Halton(d=len(parameters), scramble=True, seed=0).random(starts)
            candidates += [np.clip(x0 + (u - 0.5) * 2 * math.log(3.0), lower + 1e-6, upper - 1e-6) for u in unit]
        scored = sorted(((_soft_l1_cost(residuals(x)), i) for i, x in enumerate(candidates)))
        best = None
        for _, i in scored[: max(1, refine)]:
            result = least_squares(residuals, candidates[i], bounds=(lower, upper), loss="soft_l1", f_scale=1.0,
                                   diff_step=0.05, max_nfev=max_evaluations)
            if best is None or result.cost < best.cost:
                best = result
        values = dict(zip(parameters, (float(v) for v in np.exp(best.x))))
        fitted_scenario = apply_parameters(base, values)
        report = evaluate(fitted_scenario, targets, sim, set(used), values)
    return FitResult(
        scenario=fitted_scenario, parameters=values, initial=initial, residuals=tuple(report),
        evaluations=sim.num_evaluations, cost=float(best.cost), message=str(best.message),
    )
