"""Tuning a router for a workload: search its options (and optionally the worker count or KV per worker) for the
setting that best meets an objective under constraints, by simulation.

Why optuna: the spaces are mixed (float ranges, some on a log scale, integer thresholds, categorical switches such as
SGLang's `min_load_tie`); its TPE sampler handles all three in one model, takes constraints (`constraints_func`:
it prefers feasible trials and, among infeasible ones, the least violating), offers NSGA-II for a two-objective
search of a front, and is seeded, so a search is reproducible. Its ask/tell interface leaves the evaluation to
kvsim: trials are asked in batches, simulated in parallel on an executor (`sim.studies.executor`), and told back in trial order.

Determinism. Every trial runs the same seeds, seed + 0 .. seed + repeats - 1 (common random numbers: every
candidate sees the same request streams, so differences between trials are the knobs', not the streams'). A batch
holds `batch_trials` trials whatever the number of processes (`jobs` only decides how many simulations run at once), and
trials are told in order, so a seed gives the same trials, values and answer with 1 process or 8.

The search, for a budget of S simulations and R repeats: T = S // R trials.
1. Trial 0 is the router's defaults (and the scenario's cluster), run alone: the baseline every answer is compared
   with. It is told to the sampler when its values lie in the space.
2. Then batches of `batch_trials` trials asked from the sampler; float values are rounded to 4 significant digits before
   they run, so that the printed spec is exactly what ran. A configuration seen before is not simulated again
   (the same seeds give the same result) but still counts as a trial.
3. A trial's metrics are the means over its R runs of every numeric column of the summary row
   (`Summary.row()`: request_hit_rate, ttft_p99_ms, throughput_rps, ..., and any column added later) and their
   95 % Student-t intervals over runs. The search (the sampler, `feasible`, the answer) judges constraints
   (`ttft_p99_ms<=200`) on the means; the verdict (`Verdict`) judges them with the intervals (met, not met,
   undecided) and says whether the answer is separated from the other candidates beyond the intervals
   (`sim.results.stats.separated`), computed from the trials, never stored.

Objectives: `maximize:COLUMN`, `minimize:COLUMN`, `min-workers` (fewest workers meeting the constraints; `workers`
must be in the space; ties go to the better of the other Pareto metric), `min-cost` (the lowest fleet price per hour,
`usd_per_hour`, meeting the constraints; ties, e.g. a space of router knobs only, where the fleet does not change, go
to the lower `usd_per_million_tokens` unless --pareto names another second metric), or `pareto` (both Pareto metrics at once;
the answer is the front's best in the first). Default (`default_objective`): maximize throughput_rps, or
goodput_rps when the scenario sets an SLO (without one every request meets it, and goodput is the throughput).

The Pareto front is read off the trials: the feasible trials that no other feasible trial dominates in the two
Pareto metrics (default: the objective's column and ttft_p99_ms).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from sim.results.stats import (
    Interval, LimitStatus, against_limit, over_runs, pareto_front, repeats_to_separate, separated, standing,
)
from sim.routing.spec import format_value, router_label, split_router_spec
from sim.runner import build_router, router_class
from sim.scenario import Scenario
from sim.config import GIB
from sim.routing.knobs import FloatKnob, IntKnob, Knob
from sim.studies.search_space import CLUSTER_KNOBS, check_space, cluster_overrides, parse_space, round_significant
from sim.studies.executor import Executor, using
from sim.studies.sweep import SweepPoint, run_point

THROUGHPUT_OBJECTIVE = "maximize:throughput_rps"
GOODPUT_OBJECTIVE = "maximize:goodput_rps"


def default_objective(scenario: Scenario) -> Objective:
    """Throughput (`maximize:throughput_rps`), or with an SLO set (`--slo`, the scenario's `slo`) goodput
    (`maximize:goodput_rps`, requests per second meeting it): without an SLO goodput is the throughput, and the
    objective should say what it is."""
    slo = scenario.slo
    has_slo = any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))
    return Objective.parse(GOODPUT_OBJECTIVE if has_slo else THROUGHPUT_OBJECTIVE)


NO_INTERVAL = Interval(math.nan, math.nan, math.nan, 0)

LOWER_IS_BETTER = frozenset({
    "workers", "kv-gib", "max_worker_share", "imbalance_max_mean", "preemptions", "evicted_blocks", "evicted_tokens",
    "view_false_hit_rate", "view_false_tokens",
})
"""Columns where less is better, beside every latency (`*_ms`, `*_s`): the direction a Pareto metric gets when its
text does not say (`min:COLUMN` / `max:COLUMN` do)."""

BATCH_TRIALS = 4
"""Trials asked per batch: enough to keep two cores busy with one repeat, few enough that TPE learns often."""


class UnknownColumn(ValueError):
    """An objective, constraint or Pareto metric names a column the summary row does not have."""


def lower_is_better(column: str) -> bool:
    return (column in LOWER_IS_BETTER or column.endswith("_ms") or column.endswith("_s")
            or column.startswith("usd_") or column in ("cost_usd", "gpu_hours"))


@dataclass(frozen=True, slots=True)
class Metric:
    """A summary column and which way is better."""

    column: str
    maximize: bool

    @classmethod
    def parse(cls, text: str) -> Metric:
        """`COLUMN` (direction by `lower_is_better`), `max:COLUMN` / `maximize:COLUMN` or `min:` / `minimize:`."""
        head, colon, column = text.strip().partition(":")
        if not colon:
            column = head
            return cls(column, not lower_is_better(column))
        if head not in ("max", "maximize", "min", "minimize") or not column.strip():
            raise ValueError(f"{text!r}: give COLUMN, max:COLUMN or min:COLUMN")
        return cls(column.strip(), head.startswith("max"))

    def better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b

    def text(self) -> str:
        return f"{'max' if self.maximize else 'min'}:{self.column}"


@dataclass(frozen=True, slots=True)
class Objective:
    """What the search optimises: one column (maximize/minimize), the worker count (min-workers), the fleet's price
    per hour (min-cost: `usd_per_hour`), or the two Pareto metrics (pareto)."""

    kind: Literal["maximize", "minimize", "min-workers", "min-cost", "pareto"]
    column: str = ""

    @classmethod
    def parse(cls, text: str) -> Objective:
        text = text.strip()
        if text in SHORT_OBJECTIVES:
            return cls(text, SHORT_OBJECTIVES[text])  # type: ignore[arg-type]
        kind, colon, column = text.partition(":")
        if kind not in ("maximize", "minimize") or not colon or not column.strip():
            raise ValueError(f"{text!r}: give maximize:COLUMN, minimize:COLUMN, min-workers, min-cost or pareto "
                             f"(COLUMN: a numeric column of summary.csv, e.g. request_hit_rate)")
        return cls(kind, column.strip())  # type: ignore[arg-type]

    @property
    def metric(self) -> Metric | None:
        """The single metric optimised (None for pareto)."""
        if self.kind == "pareto":
            return None
        return Metric(self.column, self.kind == "maximize")

    def text(self) -> str:
        return self.kind if self.kind in SHORT_OBJECTIVES else f"{self.kind}:{self.column}"


SHORT_OBJECTIVES = {"min-workers": "workers", "min-cost": "usd_per_hour", "pareto": ""}
"""The objectives named by one word, with the column each minimises ("" for pareto: its two metrics)."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """`column <= bound` or `column >= bound`: `met`/`violation` on the mean over repeats (what the search uses),
    `status` with the 95 % interval (what the verdict says)."""

    column: str
    op: Literal["<=", ">="]
    bound: float

    @classmethod
    def parse(cls, text: str) -> Constraint:
        for op in ("<=", ">="):
            column, found, bound = text.partition(op)
            if found:
                try:
                    value = float(bound)
                except ValueError:
                    break
                if column.strip() and math.isfinite(value):
                    return cls(column.strip(), op, value)  # type: ignore[arg-type]
                break
        raise ValueError(f"{text!r}: give COLUMN<=NUMBER or COLUMN>=NUMBER, e.g. ttft_p99_ms<=200")

    def met(self, value: float) -> bool:
        return not math.isnan(value) and (value <= self.bound if self.op == "<=" else value >= self.bound)

    def status(self, interval: Interval) -> LimitStatus:
        """"met" (the whole interval meets it), "not met" (the whole interval fails) or "undecided"."""
        return against_limit(interval, self.op, self.bound)

    def violation(self, value: float) -> float:
        """How far `value` is on the wrong side, relative to |bound| (<= 0: met; NaN counts as 1)."""
        if math.isnan(value):
            return 1.0
        scale = abs(self.bound) or 1.0
        return (value - self.bound) / scale if self.op == "<=" else (self.bound - value) / scale

    def text(self) -> str:
        return f"{self.column}{self.op}{self.bound:g}"


@dataclass(frozen=True, slots=True)
class Trial:
    """One configuration, simulated `repeats` times on the common seeds."""

    number: int
    params: dict[str, Any]
    """Knob -> value, in the space's order (the baseline: the defaults)."""
    router: str
    """The router spec text that ran (fixed options and router knobs), to paste as --router."""
    intervals: dict[str, Interval]
    """Per numeric summary column, its mean over the repeats with the 95 % Student-t interval."""
    feasible: bool
    """Every constraint met on the means (what the search steers by)."""
    violation: float
    """Sum of the constraints' relative violations on the means (0 when feasible)."""
    on_front: bool = False

    @property
    def means(self) -> dict[str, float]:
        """Mean over repeats of every numeric summary column (NaN where no run had a value)."""
        return {c: iv.mean for c, iv in self.intervals.items()}

    @property
    def ci95(self) -> dict[str, float]:
        """95 % confidence half-width of each mean (NaN with one repeat)."""
        return {c: iv.half_width for c, iv in self.intervals.items()}

    def interval(self, column: str) -> Interval:
        return self.intervals.get(column, NO_INTERVAL)

    @property
    def is_baseline(self) -> bool:
        return self.number == 0

    @property
    def config_key(self) -> tuple:
        """What the trial ran (router spec and knob values): trials with equal keys are one candidate."""
        return self.router, tuple(sorted((k, str(v)) for k, v in self.params.items()))


def constraints_status(trial: Trial, constraints: Sequence[Constraint]) -> str:
    """The trial's constraints judged with the intervals: "not met" if any is not met, "met" if all are, else
    "undecided"; "" without constraints."""
    if not constraints:
        return ""
    statuses = {c.status(trial.interval(c.column)) for c in constraints}
    return "not met" if "not met" in statuses else "met" if statuses == {"met"} else "undecided"


@dataclass(frozen=True, slots=True)
class Verdict:
    """How settled an answer is at its number of repeats: its constraints judged with the intervals, and its
    objective against the contenders' (the other candidates whose constraints are not "not met") under THE RULE
    of `sim.results.stats` (intervals that do not overlap). Computed from the trials, never stored (journals keep
    runs), so a resumed search says the same. Indices are into the candidates given to `settle`."""

    candidates: tuple[Trial, ...]
    answer: int
    metric: Metric
    statuses: tuple[str, ...]
    """Per candidate, `constraints_status`."""
    contenders: tuple[int, ...]
    """The candidates the answer is compared with: not the answer, constraints not "not met", objective known."""
    tied: tuple[int, ...]
    """Contenders indistinguishable from the answer on the metric, closest first."""
    ahead: tuple[int, ...]
    """Contenders better than the answer beyond the intervals (their constraints undecided: else they would answer)."""
    settled: bool | None
    """The answer's objective separated from every contender's, none ahead (None: one run, no interval)."""
    repeats_to_separate: float
    """Estimated runs per candidate that would separate the answer from every tied one (`stats.repeats_to_separate`)."""
    best_met: int | None
    """The candidate with the best mean among those whose constraints are all met over the whole interval (None:
    none is, or there are no constraints): the safe choice when the answer's are undecided."""

    @property
    def status(self) -> str:
        """The answer's `constraints_status`."""
        return self.statuses[self.answer]

    def label(self, i: int) -> str:
        """Candidate i's verdict: the answer "best" / "not settled" / "no interval"; a contender "indistinguishable",
        "ahead" or "behind"; "" for a candidate whose constraints are not met."""
        if i == self.answer:
            return "no interval" if self.settled is None else "best" if self.settled else "not settled"
        if i not in self.contenders:
            return ""
        return "indistinguishable" if i in self.tied else "ahead" if i in self.ahead else "behind"


def settle(candidates: Sequence[Trial], answer: int, metric: Metric, constraints: Sequence[Constraint]) -> Verdict:
    """The `Verdict` of `candidates[answer]` against the other candidates."""
    statuses = tuple(constraints_status(t, constraints) for t in candidates)
    contenders = tuple(i for i, t in enumerate(candidates) if i != answer and statuses[i] != "not met"
                       and not math.isnan(t.interval(metric.column).mean))
    st = standing(candidates[answer].interval(metric.column), [candidates[i].interval(metric.column) for i in contenders],
                  maximize=metric.maximize)
    met = [i for i, status in enumerate(statuses) if status == "met"
           and not math.isnan(candidates[i].interval(metric.column).mean)]
    sign = -1.0 if metric.maximize else 1.0
    best_met = min(met, key=lambda i: (sign * candidates[i].interval(metric.column).mean, i)) if met else None
    return Verdict(tuple(candidates), answer, metric, statuses, contenders, tuple(contenders[i] for i in st.tied),
                   tuple(contenders[i] for i in st.ahead), st.settled, st.repeats_to_separate, best_met)


@dataclass(frozen=True, slots=True)
class TuneResult:
    """Every trial in order (trial 0 is the baseline), the answer, and what was asked."""

    router: str
    space: tuple[Knob, ...]
    objective: Objective
    constraints: tuple[Constraint, ...]
    pareto: tuple[Metric, Metric]
    repeats: int
    seed: int
    trials: tuple[Trial, ...]
    best: int | None
    """Number of the best feasible trial (None: no trial meets the constraints)."""
    closest: int
    """Number of the best trial if one is feasible, else of the least violating one."""

    @property
    def baseline(self) -> Trial:
        return self.trials[0]

    @property
    def answer(self) -> Trial:
        """The best trial, or the closest when none meets the constraints."""
        return self.trials[self.closest]

    @property
    def front(self) -> list[Trial]:
        return [t for t in self.trials if t.on_front]

    @property
    def metric(self) -> Metric:
        """The metric the answer is judged on: the objective's (the first Pareto metric for pareto)."""
        return self.objective.metric or self.pareto[0]

    def candidates(self) -> list[Trial]:
        """The distinct configurations, each as its first trial (a configuration asked again is not a rival)."""
        first: dict[tuple, Trial] = {}
        for t in self.trials:
            first.setdefault(t.config_key, t)
        return list(first.values())

    def verdict(self) -> Verdict:
        """How settled the answer is (`settle` over the distinct configurations)."""
        candidates = self.candidates()
        answer = next(i for i, t in enumerate(candidates) if t.config_key == self.answer.config_key)
        return settle(candidates, answer, self.metric, self.constraints)

    def against_default(self) -> tuple[bool | None, float]:
        """Whether the answer's metric is separated from the default's (THE RULE), and the estimated repeats that
        would separate them."""
        a, b = self.answer.interval(self.metric.column), self.baseline.interval(self.metric.column)
        return separated(a, b), repeats_to_separate(a, b)

    def ranked(self) -> list[Trial]:
        """Trials best first: feasible before infeasible (least violation first), then by the objective."""
        return sorted(self.trials, key=lambda t: _rank_key(t, self.objective, self.pareto))

    @property
    def named_columns(self) -> list[str]:
        """The columns the question names: the objective's, the constraints', the Pareto metrics' (once each)."""
        names = [self.objective.column] * bool(self.objective.column) + [c.column for c in self.constraints] + [
            m.column for m in self.pareto]
        return list(dict.fromkeys(names))

    def rows(self) -> tuple[list[dict[str, object]], list[str]]:
        """A row per trial (`tune.csv`) and its columns: trial, role (default / best / closest), router spec, the
        knobs, feasible, on_front, violation, the named columns with their 95 % half-widths, then every other mean."""
        named = self.named_columns
        knobs = [k.key for k in self.space]
        others = list(dict.fromkeys(c for t in self.trials for c in t.means if c not in named and c not in knobs))
        columns = (["trial", "role", "router", *knobs, "feasible", "on_front", "violation"]
                   + [x for c in named for x in (c, f"{c}_ci95")] + others
                   + ["constraint_status", "verdict", "repeats_to_separate"])
        verdict = self.verdict()
        index = {t.config_key: i for i, t in enumerate(verdict.candidates)}
        rows = []
        for t in self.trials:
            roles = ["default"] * t.is_baseline
            if t.number == self.closest:
                roles.append("best" if self.best is not None else "closest")
            role = "+".join(roles)
            row: dict[str, object] = {"trial": t.number, "role": role, "router": t.router,
                                      "feasible": str(t.feasible).lower(), "on_front": str(t.on_front).lower(),
                                      "violation": t.violation}
            row.update({k: v if isinstance(v, float) else format_value(v) for k, v in t.params.items()})
            for c in named:
                row[c] = t.means.get(c, math.nan)
                row[f"{c}_ci95"] = t.ci95.get(c, math.nan)
            row.update({c: t.means[c] for c in others if c in t.means})
            row.update(verdict_columns(verdict, index[t.config_key]))
            rows.append(row)
        return rows, columns


def verdict_columns(verdict: Verdict, i: int) -> dict[str, object]:
    """The columns a CSV row of candidate i gains (tune.csv, plan.csv): `constraint_status`, `verdict` and
    `repeats_to_separate` (for the answer: from its closest rivals; for an indistinguishable one: from the answer)."""
    v = verdict
    if i == v.answer:
        needed = v.repeats_to_separate
    elif i in v.tied:
        needed = repeats_to_separate(v.candidates[v.answer].interval(v.metric.column),
                                     v.candidates[i].interval(v.metric.column))
    else:
        needed = math.nan
    return {"constraint_status": v.statuses[i], "verdict": v.label(i), "repeats_to_separate": needed}


def default_pareto(objective: Objective, constraints: Sequence[Constraint] = ()) -> tuple[Metric, Metric]:
    """The objective's column against ttft_p99_ms (against request_hit_rate when the objective is ttft_p99_ms;
    for min-workers against the first constrained column, else ttft_p99_ms)."""
    if objective.kind == "pareto":
        raise ValueError("objective pareto needs its two metrics (--pareto COL1,COL2)")
    first = objective.metric
    if objective.kind == "min-workers":
        other = next((c.column for c in constraints if c.column != "workers"), "ttft_p99_ms")
        return first, Metric(other, not lower_is_better(other))
    if objective.kind == "min-cost":
        # NOTE: the fleet's price is often the same for many trials (router knobs do not change it): the tie goes
        # to what a dollar buys.
        return first, Metric("usd_per_million_tokens", False)
    if first.column == "ttft_p99_ms":
        return first, Metric("request_hit_rate", True)
    return first, Metric("ttft_p99_ms", False)


def parse_pareto(text: str) -> tuple[Metric, Metric]:
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    if len(items) != 2:
        raise ValueError(f"{text!r}: give two columns COL1,COL2 (each optionally max: or min:)")
    a, b = (Metric.parse(t) for t in items)
    if a.column == b.column:
        raise ValueError(f"{text!r}: give two different columns")
    return a, b


# ------------------------------------------------------------------ the ranking
def _objective_value(trial: Trial, objective: Objective, pareto: tuple[Metric, Metric]) -> float:
    metric = objective.metric or pareto[0]
    return trial.means.get(metric.column, math.nan)


def _rank_key(trial: Trial, objective: Objective, pareto: tuple[Metric, Metric]) -> tuple:
    metric = objective.metric or pareto[0]
    value = _objective_value(trial, objective, pareto)
    primary = math.inf if math.isnan(value) else (-value if metric.maximize else value)
    if objective.kind in ("min-workers", "min-cost"):
        second = pareto[1] if pareto[0].column == metric.column else pareto[0]
    elif objective.kind == "pareto":
        second = pareto[1]
    else:
        second = None
    tie = 0.0
    if second is not None:
        v = trial.means.get(second.column, math.nan)
        tie = math.inf if math.isnan(v) else (-v if second.maximize else v)
    return (not trial.feasible, trial.violation if not trial.feasible else 0.0, primary, tie, trial.number)


# ------------------------------------------------------------------ evaluating trials
def _numeric(row: Mapping[str, object]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("repeat", "seed")}


def summarise_runs(rows: Sequence[Mapping[str, object]]) -> dict[str, Interval]:
    """The interval over runs of every numeric column of the first row (`over_runs`)."""
    return over_runs([_numeric(r) for r in rows], _numeric(rows[0]))


def _run_row(args: tuple[Scenario, SweepPoint]) -> dict[str, object]:
    return run_point(*args).row


class RunStore(Protocol):
    """Where a search keeps its finished simulations so that a rerun can take them instead of simulating again
    (`sim.results.journal.RunJournal`): keyed by `[router spec, [[cluster knob, value], ...], seed]`, the run is
    its summary row (JSON-compatible; it must come back equal, floats exact)."""

    def __contains__(self, key: Sequence[Any]) -> bool: ...

    def get(self, key: Sequence[Any]) -> Any: ...

    def append(self, key: Sequence[Any], run: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class _Config:
    """What a trial runs: the router spec text and the cluster knobs' values."""

    router: str
    cluster: tuple[tuple[str, Any], ...]


@dataclass
class _Search:
    """The state of one search: the base scenario, what to run, and the evaluated configurations."""

    base: Scenario
    name: str
    fixed: dict[str, Any]
    space: tuple[Knob, ...]
    repeats: int
    seed: int
    runner: Executor
    store: RunStore | None = None
    evaluated: dict[_Config, dict[str, Interval]] = field(default_factory=dict)

    def config(self, params: Mapping[str, Any], *, baseline: bool = False) -> _Config:
        options = dict(self.fixed)
        if not baseline:
            options.update({k: v for k, v in params.items() if k not in CLUSTER_KNOBS})
        cluster = () if baseline else tuple((k, params[k]) for k in CLUSTER_KNOBS if k in params)
        return _Config(router_label(self.name, options), cluster)

    def jobs(self, config: _Config) -> list[tuple[Scenario, SweepPoint]]:
        base = self.base
        if config.cluster:
            base = base.with_overrides(**cluster_overrides(base.engine, dict(config.cluster)))
        return [(base, SweepPoint(base.cluster.workers, base.workload.prefixes, base.workload.concurrency,
                                  config.router, r, self.seed + r)) for r in range(self.repeats)]

    def run_key(self, config: _Config, seed: int) -> list:
        """A simulation's identity in the store: everything a trial's run depends on beyond the base scenario."""
        return [config.router, [list(kv) for kv in config.cluster], seed]

    def evaluate(self, configs: Sequence[_Config], progress: Callable[[], None]) -> list[dict[str, Interval]]:
        """Intervals per configuration, simulating only those not seen before (all in one map) and,
        with a store, only the runs it lacks; each new run is stored as it finishes."""
        new = list(dict.fromkeys(c for c in configs if c not in self.evaluated))
        tasks = [job for c in new for job in self.jobs(c)]
        keys = [self.run_key(c, self.seed + r) for c in new for r in range(self.repeats)]
        for c in configs:
            if c in self.evaluated:
                for _ in range(self.repeats):
                    progress()
        rows: list = [None] * len(tasks)
        todo = list(range(len(tasks)))
        if self.store is not None:
            todo = []
            for i, key in enumerate(keys):
                if key in self.store:
                    rows[i] = self.store.get(key)
                    progress()
                else:
                    todo.append(i)

        def on_result(j: int, row: dict) -> None:
            if self.store is not None:
                self.store.append(keys[todo[j]], row)

        fresh = self.runner.map(_run_row, [tasks[i] for i in todo], progress, on_result)
        for i, row in zip(todo, fresh):
            rows[i] = row
        for i, c in enumerate(new):
            self.evaluated[c] = summarise_runs(rows[i * self.repeats:(i + 1) * self.repeats])
        return [self.evaluated[c] for c in configs]


def _distributions(space: Sequence[Knob]) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for k in space:
        if isinstance(k, FloatKnob):
            out[k.key] = FloatDistribution(float(k.low), float(k.high), log=k.log)
        elif isinstance(k, IntKnob):
            out[k.key] = IntDistribution(k.low, k.high, log=k.log)
        else:
            out[k.key] = CategoricalDistribution(k.choices)
    return out


def _runnable(space: Sequence[Knob], params: Mapping[str, Any]) -> dict[str, Any]:
    """Sampled values as they run: floats to 4 significant digits (kept inside the range)."""
    out = {}
    for k in space:
        v = params[k.key]
        if isinstance(k, FloatKnob):
            v = min(max(round_significant(float(v)), float(k.low)), float(k.high))
        out[k.key] = v
    return out


def _sampler(kind: str, seed: int, trials: int, constraints_func):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 4)),
                                             constraints_func=constraints_func)
    if kind == "tpe":
        # NOTE: with budgets of tens of trials, optuna's 10 random start-up trials would be a third of the search.
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, trials // 4)), multivariate=True,
                                          constant_liar=True, constraints_func=constraints_func)
    raise ValueError(f"sampler: give tpe, nsga2 or random, got {kind!r}")


def tune(base: Scenario, router: str, space: Sequence[Knob] | str | None = None, *,
         objective: Objective | str | None = None, constraints: Sequence[Constraint | str] = (),
         pareto: tuple[Metric, Metric] | str | None = None, budget_simulations: int = 120, repeats: int = 3,
         seed: int | None = None, jobs: int | None = None, batch_trials: int = BATCH_TRIALS, sampler: str = "tpe",
         progress: Callable[[int, int, str], None] | None = None, executor: Executor | None = None,
         store: RunStore | None = None) -> TuneResult:
    """Search `space` (knobs or their text; default: the router's `search_space`) for `router` (NAME, or
    NAME:key=value,... with fixed options) on `base`, with `budget_simulations // repeats` trials; pure (writes
    nothing); `objective` None is `default_objective(base)`. The simulations run on `executor` (left open), or without one on `jobs` local processes. With a
    `store`, each finished simulation is appended to it and those it already holds are taken from it instead of run:
    the search asks the same trials again (same seed, same values told), so a rerun over a partial store is
    the uninterrupted search, simulating only what the store lacks.

    `progress(simulations_done, simulations_total, note)` is called after each simulation. A ValueError (an
    `UnknownColumn` for a column the summary lacks) names what is wrong; a ScenarioError a bad router option."""
    import optuna

    objective = (default_objective(base) if objective is None
                 else Objective.parse(objective) if isinstance(objective, str) else objective)
    constraints = tuple(Constraint.parse(c) if isinstance(c, str) else c for c in constraints)
    if pareto is None:
        pareto = default_pareto(objective, constraints)
    elif isinstance(pareto, str):
        pareto = parse_pareto(pareto)
    name, fixed = split_router_spec(router)
    cls = router_class(name)
    if not fixed and name == base.router.name:
        fixed = dict(base.router.options)  # a bare name keeps the scenario's options, as `sweep` does
    space = cls.search_space if space is None else parse_space(space) if isinstance(space, str) else tuple(space)
    check_space(space, router=name, option_names=list(cls.Options.model_fields), parse_options=cls.parse_options,
                fixed_options=fixed)
    keys = [k.key for k in space]
    if objective.kind == "min-workers" and "workers" not in keys:
        raise ValueError("objective min-workers needs workers in the space, e.g. --space ...,workers=1..16")
    if repeats < 1 or batch_trials < 1:
        raise ValueError(f"repeats and batch_trials must be >= 1, got {repeats} and {batch_trials}")
    if budget_simulations < repeats:
        raise ValueError(f"budget of {budget_simulations} simulations is less than one trial ({repeats} repeats)")
    seed = base.seed if seed is None else seed
    n_trials = budget_simulations // repeats if space else 1
    total = n_trials * repeats
    defaults = cls.parse_options(fixed)
    baseline_params = {k.key: (base.cluster.workers if k.key == "workers"
                               else base.engine.kv_cache_bytes / GIB if k.key == "kv-gib"
                               else getattr(defaults, k.key)) for k in space}

    def feasibility(means: Mapping[str, float]) -> tuple[bool, float, list[float]]:
        v = [c.violation(means.get(c.column, math.nan)) for c in constraints]
        ok = all(c.met(means.get(c.column, math.nan)) for c in constraints)
        return ok, sum(max(0.0, x) for x in v), v

    done = 0
    best_note = ""

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, best_note)

    trials: list[Trial] = []

    def record(params: dict[str, Any], config: _Config, intervals: dict[str, Interval]) -> Trial:
        nonlocal best_note
        if "kv-gib" in params:  # a knob, not a summary column: the trial's own value, exact in every run
            intervals = {**intervals, "kv-gib": Interval(float(params["kv-gib"]), 0.0, 0.0, repeats)}
        ok, violation, _ = feasibility({c: iv.mean for c, iv in intervals.items()})
        trial = Trial(len(trials), params, config.router, intervals, ok, violation)
        trials.append(trial)
        metric = objective.metric or pareto[0]
        feasible = [t for t in trials if t.feasible]
        if feasible:
            top = min(feasible, key=lambda t: _rank_key(t, objective, pareto))
            best_note = f"best {metric.column} {top.means.get(metric.column, math.nan):.4g} (trial {top.number})"
        else:
            best_note = "none feasible yet"
        return trial

    with using(executor, jobs) as runner:
        search = _Search(base, name, fixed, space, repeats, seed, runner, store)
        # Validate every router configuration the space can reach at its extremes before simulating any.
        for k in space:
            for value in k.extremes:
                params = {**baseline_params, k.key: value}
                scenario, point = search.jobs(search.config(params))[0]
                build_router(point.scenario(scenario))
        baseline_config = search.config(baseline_params, baseline=True)
        intervals, = search.evaluate([baseline_config], tick)
        available = set(intervals) | ({"kv-gib"} & set(keys))
        named = [c.column for c in constraints] + [m.column for m in pareto] + [objective.column] * bool(objective.column)
        for column in named:
            if column not in available:
                raise UnknownColumn(f"unknown column {column!r}; numeric columns of the summary: "
                                    f"{', '.join(sorted(available))}")
        baseline = record(baseline_params, baseline_config, intervals)
        if n_trials > 1:
            distributions = _distributions(space)
            directions = ([("maximize" if m.maximize else "minimize") for m in pareto] if objective.kind == "pareto"
                          else ["maximize" if objective.metric.maximize else "minimize"])

            # optuna >= 5 reads constraints set on the trial; optuna 4 needs the sampler's constraints_func.
            on_trial = hasattr(optuna.trial.Trial, "set_constraint")

            def constraints_func(frozen) -> list[float]:
                return frozen.user_attrs["constraints"]

            previous = optuna.logging.get_verbosity()
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study = optuna.create_study(
                        directions=directions,
                        sampler=_sampler(sampler, seed, n_trials,
                                         constraints_func if constraints and not on_trial else None))

                    def tell(ask, trial: Trial) -> None:
                        values = ([trial.means.get(m.column, math.nan) for m in pareto] if objective.kind == "pareto"
                                  else [trial.means.get(objective.metric.column, math.nan)])
                        violations = feasibility(trial.means)[2]
                        if on_trial:
                            for c, v in zip(constraints, violations):
                                ask.set_constraint(c.text(), v)
                        else:
                            ask.set_user_attr("constraints", violations)
                        if any(math.isnan(v) for v in values):
                            study.tell(ask, state=optuna.trial.TrialState.FAIL)
                        else:
                            study.tell(ask, values if len(values) > 1 else values[0])

                    if all(k.contains(baseline_params[k.key]) for k in space):
                        study.enqueue_trial(dict(baseline_params))
                        tell(study.ask(distributions), baseline)
                    while len(trials) < n_trials:
                        asked = [study.ask(distributions) for _ in range(min(batch_trials, n_trials - len(trials)))]
                        params = [_runnable(space, a.params) for a in asked]
                        configs = [search.config(p) for p in params]
                        results = search.evaluate(configs, tick)
                        for a, p, c, ivs in zip(asked, params, configs, results):
                            tell(a, record(p, c, ivs))
            finally:
                optuna.logging.set_verbosity(previous)

    front = pareto_front([(t.means.get(pareto[0].column, math.nan), t.means.get(pareto[1].column, math.nan))
                          if t.feasible else (math.nan, math.nan) for t in trials],
                         (pareto[0].maximize, pareto[1].maximize))
    final = tuple(replace(t, on_front=on) for t, on in zip(trials, front))
    ranked = sorted(final, key=lambda t: _rank_key(t, objective, pareto))
    usable = [t for t in ranked if not math.isnan(_objective_value(t, objective, pareto))] or ranked
    best = next((t.number for t in usable if t.feasible), None)
    return TuneResult(router=router_label(name, fixed), space=space, objective=objective, constraints=constraints,
                      pareto=pareto, repeats=repeats, seed=seed, trials=final, best=best,
                      closest=best if best is not None else usable[0].number)
