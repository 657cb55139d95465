"""The cheapest configuration that meets constraints (`kvsim plan cost`, `kvsim plan --objective min-cost`).

The candidates are every combination of a GPU (hardware x tensor-parallel degree, or the scenario's own devices), a
worker count, a router and a host (CPU) KV tier per worker. What a candidate costs is known before it runs: its
fleet's price per hour (`Scenario.fleet_usd_per_hour`: each device's GPUs x its price per GPU-hour). So the search
is a walk up the price list:

    candidates sorted by (usd_per_hour, GPUs, host KV GiB, the order given)
    ┌──────────┬──────────┬──────────┬──────────┬─────
    │ $0.80/h  │ $1.61/h  │ $1.86/h  │ $2.41/h  │ ...
    │ fails    │ fails    │ fails    │ MEETS    │ (never simulated)
    └──────────┴──────────┴──────────┴──────────┴─────
                                ▲          ▲
                  the next-cheaper one     the answer
                  (its violated constraint binds)

each candidate simulated `repeats` times on the same seeds (common random numbers, as `kvsim tune`), constraints
judged on the means over the repeats, until the first that meets them all: the answer, exact for the candidates and
the simulated means. The binding constraint is the one that rules out the next-cheaper candidate (the one tried just
before the answer): of the constraints it violates, the one it violates most (relative to the bound, as
`sim.studies.tune.Constraint.violation`); a candidate whose model weights do not fit its GPU binds as "memory".

Host KV is not priced (an instance's host memory comes with its price: a p5.48xlarge has 2 TiB), so among candidates
of one price the smaller host tier is tried first; a router has no price either, so among equal prices the routers
go in the order given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.results.stats import t_interval
from sim.results.summary import summarize
from sim.routing.spec import router_overrides
from sim.runner import run
from sim.scenario import Scenario, ScenarioError, cpu_kv_gib, with_cpu_kv_gib
from sim.studies.executor import Executor, using
from sim.studies.tune import Constraint, UnknownColumn

MEMORY = "memory"
"""The `binding` of a plan whose next-cheaper candidate could not hold the model's weights or one request's KV."""


@dataclass(frozen=True, slots=True)
class CostCandidate:
    """One configuration of the search: what it is, its scenario (None when it cannot be built: `problem` says
    why) and its fleet's price per hour."""

    gpu: str
    """The hardware and its TP degree when above 1 (`l4`, `h100-sxmx2`), or "scenario" for the scenario's own
    devices."""
    workers: int
    router: str
    cpu_kv_gib: float
    usd_per_hour: float
    scenario: Scenario | None
    problem: str = ""

    def label(self) -> str:
        kv = f", {self.cpu_kv_gib:g} GiB host KV" if self.cpu_kv_gib else ""
        on = "the scenario's devices" if self.gpu == "scenario" else self.gpu
        return f"{self.workers} worker{'s' * (self.workers != 1)} on {on}, {self.router}{kv}"


@dataclass(frozen=True, slots=True)
class CostTrial:
    """A candidate simulated: the mean of every numeric summary column over its repeats, and which constraints
    it violates (on the means; a candidate that could not be built violates none and `problem` says why)."""

    candidate: CostCandidate
    means: dict[str, float]
    ci95: dict[str, float]
    violated: tuple[Constraint, ...]

    @property
    def feasible(self) -> bool:
        return self.candidate.problem == "" and not self.violated

    def worst(self) -> Constraint | None:
        """The violated constraint it violates most (relative to the bound); None when it violates none."""
        if not self.violated:
            return None
        return max(self.violated, key=lambda c: c.violation(self.means.get(c.column, math.nan)))


@dataclass(frozen=True, slots=True)
class CostPlan:
    """The trials in price order (the cheapest first, the answer last when there is one), the candidates never
    simulated, and what binds."""

    constraints: tuple[Constraint, ...]
    trials: tuple[CostTrial, ...]
    untried: tuple[CostCandidate, ...]
    """Candidates dearer than the answer, or beyond the budget."""
    answer: CostTrial | None
    budget_exhausted: bool = False

    @property
    def next_cheaper(self) -> CostTrial | None:
        """The candidate tried just before the answer (None: the answer is the cheapest, or there is none)."""
        if self.answer is None or len(self.trials) < 2:
            return None
        return self.trials[-2]

    @property
    def binding(self) -> str:
        """What rules out the next-cheaper candidate: a constraint's text, `MEMORY`, or "" when nothing does (the
        cheapest candidate meets every constraint, or there is no answer)."""
        below = self.next_cheaper
        if below is None:
            return ""
        if below.candidate.problem:
            return MEMORY
        worst = below.worst()
        return worst.text() if worst is not None else ""


def candidates(base: Scenario, *, gpus: Sequence[tuple[str, int]] | None, workers: Sequence[int],
               routers: Sequence[str], cpu_kv_gibs: Sequence[float], model: str | None = None,
               kv_gib: float | None = None, adjust: Callable[[Scenario], Scenario] = lambda s: s
               ) -> list[CostCandidate]:
    """Every combination, sorted by (price per hour, GPUs, host KV, the order given); NaN prices last. `gpus` None:
    the scenario's devices; `adjust` is applied to each candidate's scenario after its hardware (e.g. prices)."""
    from sim.config import GIB

    out: list[tuple[tuple, CostCandidate]] = []
    order = 0
    for gpu in (gpus or [None]):
        # NOTE: named as --gpu names its devices (`l4`, `h100-sxmx2`).
        label = "scenario" if gpu is None else gpu[0] + (f"x{gpu[1]}" if gpu[1] > 1 else "")
        try:
            on = base
            if gpu is not None or model is not None:
                kv_bytes = None if kv_gib is None else int(round(kv_gib * GIB))
                on = base.with_hardware(model=model, hardware=gpu[0] if gpu else None,
                                        tensor_parallel=gpu[1] if gpu else 1, kv_cache_bytes=kv_bytes)
            on = adjust(on)
            problem = ""
        except ScenarioError as err:
            on, problem = None, str(err).splitlines()[-1].strip()
        for n in workers:
            for router in routers:
                for gib in cpu_kv_gibs:
                    scenario, why = None, problem
                    if on is not None:
                        scenario = with_cpu_kv_gib(on.with_overrides(**{
                            "cluster.workers": n, **router_overrides(router, on.router.name, on.router.options)}), gib)
                    price = scenario.fleet_usd_per_hour() if scenario is not None else math.nan
                    if scenario is None:
                        # NOTE: priced as its hardware would be, so that it sits in the walk where it would cost.
                        price = _unbuilt_price(gpu, n)
                    candidate = CostCandidate(label, n, router, gib, price, scenario, why)
                    gpus_n = n * (gpu[1] if gpu else 1)
                    key = (math.isnan(price), price if not math.isnan(price) else 0.0, gpus_n, gib, order)
                    out.append((key, candidate))
                    order += 1
    return [c for _, c in sorted(out, key=lambda kc: kc[0])]


def _unbuilt_price(gpu: tuple[str, int] | None, workers: int) -> float:
    """What `workers` devices of `gpu` would cost an hour at the profile's price (NaN for the scenario's devices)."""
    if gpu is None:
        return math.nan
    from sim.timing.hardware import hardware_profile

    return workers * gpu[1] * hardware_profile(gpu[0]).price_per_hour_usd


def _numeric(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _simulate(scenario: Scenario) -> dict[str, float]:
    """One run of a candidate: its summary row's numeric columns, with its worker count and host KV."""
    return {"workers": float(scenario.cluster.workers), "cpu_kv_gib": cpu_kv_gib(scenario),
            **_numeric(summarize(run(scenario)).row())}


def evaluate(candidate: CostCandidate, constraints: Sequence[Constraint], *, repeats: int, runner: Executor
             ) -> CostTrial:
    """`candidate` simulated `repeats` times on seeds seed .. seed + repeats - 1; an UnknownColumn when a
    constraint names a column its summary does not have."""
    if candidate.scenario is None:
        return CostTrial(candidate, {}, {}, ())
    s = candidate.scenario
    rows = runner.map(_simulate, [s.with_overrides(seed=s.seed + r) for r in range(repeats)])
    columns = list(rows[0])
    for c in constraints:
        if c.column not in rows[0]:
            raise UnknownColumn(f"constraint {c.text()}: {c.column!r} is not a summary column (e.g. ttft_p99_ms, "
                                f"goodput_fraction, request_hit_rate, usd_per_million_tokens)")
    intervals = {k: t_interval([r.get(k, math.nan) for r in rows]) for k in columns}
    means = {k: iv.mean for k, iv in intervals.items()}
    violated = tuple(c for c in constraints if not c.met(means.get(c.column, math.nan)))
    return CostTrial(candidate, means, {k: iv.half_width for k, iv in intervals.items()}, violated)


def plan_cost(all_candidates: Sequence[CostCandidate], constraints: Sequence[Constraint], *, repeats: int,
              budget_simulations: int, jobs: int | None = None, executor: Executor | None = None,
              progress: Callable[[str], None] | None = None) -> CostPlan:
    """Walk `all_candidates` (in their order: `candidates` sorts them by price) until the first that meets every
    constraint, within `budget_simulations` simulations."""
    if not constraints:
        raise ValueError("give at least one --constraint (e.g. 'ttft_p99_ms<=500'): without one the cheapest "
                         "candidate is the answer and nothing needs simulating")
    priced = [c for c in all_candidates if not math.isnan(c.usd_per_hour)]
    if not priced:
        raise ValueError("no candidate has a price: its hardware has none (a linear time model, or a profile "
                         "without a list price); give --gpu-price-usd or --gpu")
    trials: list[CostTrial] = []
    spent = 0
    with using(executor, jobs) as runner:
        for i, candidate in enumerate(priced):
            if candidate.scenario is not None and spent + repeats > budget_simulations:
                return CostPlan(tuple(constraints), tuple(trials), tuple(priced[i:]), None, budget_exhausted=True)
            trial = evaluate(candidate, constraints, repeats=repeats, runner=runner)
            spent += repeats if candidate.scenario is not None else 0
            trials.append(trial)
            if progress:
                progress(f"{candidate.label()} (${candidate.usd_per_hour:.2f}/h): "
                         + ("meets" if trial.feasible else f"fails ({failure_text(trial)})"))
            if trial.feasible:
                return CostPlan(tuple(constraints), tuple(trials), tuple(priced[i + 1:]), trial)
    return CostPlan(tuple(constraints), tuple(trials), (), None)


def failure_text(trial: CostTrial) -> str:
    """Why a trial fails, in one line: the problem that kept it from running, or each violated constraint with
    its mean (`ttft_p99_ms 812 > 500`)."""
    if trial.candidate.problem:
        return trial.candidate.problem
    parts = []
    for c in trial.violated:
        op = ">" if c.op == "<=" else "<"
        parts.append(f"{c.column} {trial.means.get(c.column, math.nan):.4g} {op} {c.bound:g}")
    return "; ".join(parts)
