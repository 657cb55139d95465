"""What-if capacity planning: the cheapest worker count, GPU KV size or host (CPU) KV tier per worker that meets a
target, per router.

For each router: screen with the analytic block model (`sim.studies.analytic`: the per-worker LRU-over-blocks model for
random and round-robin routing, the prefix-partition model for routers that keep a prefix on one worker), then
confirm by simulation: a bisection over the grid of candidate values (assuming more workers or more KV never
lowers the hit rate), starting at the analytic answer, each candidate simulated `repeats` times at steady state:
a run first sends enough requests for every (worker, prefix) pair the router can create to be visited a few
times (coupon collector: 2 x pairs x ln(pairs), pairs = W x N for routers that spread every prefix, N for routers
that keep a prefix on one worker), discards them, then measures `horizon_requests`. The answer is the smallest simulated value whose mean meets the
target; the 95 % confidence interval of that mean is reported with it.

Which router and settings (`choose_router`): each candidate router is tuned (`sim.studies.tune`, its default search
space, the same budget, seeds and constraints for every router) on the scenario's workload as it is, and the answer is
the router whose best setting meets the constraints (on the means) with the best objective (or, if none does, the
closest); its `verdict` says whether it is separated from the other routers beyond the intervals and whether its
constraints are met by the whole interval (`sim.studies.tune.settle`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.studies import analytic
from sim.routing.spec import router_overrides, split_router_spec
from sim.runner import run
from sim.scenario import Scenario, cpu_kv_gib, with_cpu_kv_gib
from sim.workloads.spec import length_mean
from sim.results.stats import t_interval
from sim.results.summary import summarize
from sim.studies.executor import Executor, using
from sim.studies.search_space import cluster_overrides
from sim.studies.tune import Objective, RunStore, TuneResult, Verdict, default_objective, settle, tune

VARY_UNITS = {"workers": "workers", "kv-gib": "GiB", "cpu-kv-gib": "GiB"}
PARTITIONING_ROUTERS = {"prefix-hash", "kv-aware", "llm-d", "sglang-cache-aware", "aibrix-prefix-cache",
                        "vllm-router-session", "vllm-router-prefix-aware", "vllm-router-loadaware", "preble"}
"""Routers that tend to keep a prefix on one worker (the analytic screen's prefix-partition model)."""


def _partitions(router: str) -> bool:
    return split_router_spec(router)[0] in PARTITIONING_ROUTERS


@dataclass(frozen=True, slots=True)
class PlanTarget:
    hit_rate: float | None = None
    ttft_p99_ms: float | None = None

    def __post_init__(self) -> None:
        if self.hit_rate is None and self.ttft_p99_ms is None:
            raise ValueError("give a target: a request hit rate and/or a TTFT p99")

    def met_by(self, hit_rate: float, ttft_p99_ms: float) -> bool:
        ok = True
        if self.hit_rate is not None:
            ok &= hit_rate >= self.hit_rate
        if self.ttft_p99_ms is not None:
            ok &= ttft_p99_ms <= self.ttft_p99_ms
        return ok


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One candidate value, simulated `repeats` times: the means over those runs and their 95 % Student-t
    half-widths (`sim.results.stats.t_interval`; NaN for one run)."""

    value: float
    hit_rates: tuple[float, ...]
    ttft_p99_ms: tuple[float, ...]

    @property
    def hit_rate(self) -> float:
        return t_interval(self.hit_rates).mean

    @property
    def ttft_p99(self) -> float:
        return t_interval(self.ttft_p99_ms).mean

    @property
    def hit_rate_ci95(self) -> float:
        return t_interval(self.hit_rates).half_width

    @property
    def ttft_p99_ci95(self) -> float:
        return t_interval(self.ttft_p99_ms).half_width


@dataclass(frozen=True, slots=True)
class RouterPlan:
    router: str
    vary: str
    answer: float | None
    analytic_answer: float | None
    evaluations: tuple[Evaluation, ...]
    analytic_curve: tuple[tuple[float, float], ...]
    """(value, analytic hit rate) over the grid; empty when the target is a TTFT only."""

    @property
    def at_answer(self) -> Evaluation | None:
        return next((e for e in self.evaluations if e.value == self.answer), None)


@dataclass(frozen=True, slots=True)
class PlanSpec:
    vary: str
    grid: tuple[float, ...]
    target: PlanTarget
    repeats: int = 3
    horizon_requests: int = 1000
    routers: tuple[str, ...] = field(default_factory=lambda: ("random",))

    def __post_init__(self) -> None:
        if self.vary not in VARY_UNITS:
            raise ValueError(f"vary must be one of {', '.join(VARY_UNITS)}, got {self.vary!r}")
        if not self.grid:
            raise ValueError("the range to vary is empty")


def make_grid(vary: str, low: float, high: float, step: float) -> tuple[float, ...]:
    if vary == "workers":
        lo, hi = max(1, math.ceil(low)), math.floor(high)
        return tuple(float(v) for v in range(lo, hi + 1))
    if step <= 0 or high < low:
        raise ValueError(f"need low <= high and step > 0, got low={low}, high={high}, step={step}")
    n = int(math.floor((high - low) / step + 1e-9))
    return tuple(round(low + i * step, 6) for i in range(n + 1))


def transient_requests(router: str, workers: int, prefixes: int) -> int:
    """Requests to discard before steady state: every reachable (worker, prefix) pair visited a few times."""
    pairs = prefixes if _partitions(router) else workers * prefixes
    return math.ceil(2 * pairs * math.log(max(pairs, 2)))


def configure(base: Scenario, spec: PlanSpec, router: str, value: float) -> Scenario:
    """`base` at one candidate value, as a steady-state run: a discarded transient, then `horizon_requests`."""
    workers = int(value) if spec.vary == "workers" else base.cluster.workers
    discard = transient_requests(router, workers, base.workload.prefixes)
    overrides: dict[str, object] = {
        **router_overrides(router, base.router.name, base.router.options),
        "workload.min_requests": discard + spec.horizon_requests,
        "workload.requests_per_prefix": 0,
        "workload.discard_first": discard,
        "cluster.workers": workers,
    }
    if spec.vary == "kv-gib":
        # NOTE: through the engine's own capacity rule, as tune's kv-gib knob: a block-count or KV-slot override in
        # the scenario is replaced, not silently kept.
        overrides.update(cluster_overrides(base.engine, {"kv-gib": value}))
    if spec.vary == "cpu-kv-gib":
        base = with_cpu_kv_gib(base, value)
    return base.with_overrides(**overrides)


def analytic_hit_rate(scenario: Scenario, router: str) -> float:
    """The block model's steady-state request hit rate for `scenario` (mean lengths where they vary)."""
    w = scenario.workload
    B = scenario.engine.block_size
    prompt = w.prompt_tokens
    output = round(length_mean(w.output_tokens))
    prefix = round(length_mean(w.prefix_tokens))
    K, U = analytic.shared_prefix_blocks(prefix, prompt, output, B)
    # NOTE: a host tier counts as more blocks of the same LRU: an optimistic screen (it holds prompt blocks only,
    # and its order is not the GPU's); the bisection's simulations decide.
    cpu_blocks = 0
    if cpu_kv_gib(scenario):
        # NOTE: the host tier's chunks are the engine's blocks (vLLM) or pages (SGLang HiCache), counted here in B
        chunk_tokens = getattr(scenario.engine, "page_size", B)
        cpu_blocks = scenario.engine.num_cpu_chunks(scenario.model.kv_bytes_per_token) * chunk_tokens // B
    common = dict(popularity=np.array(w.popularity_weights()), prefix_blocks=K, own_blocks=U,
                  usable_blocks=scenario.capacity_tokens // B + cpu_blocks, block_size=B, prompt_tokens=prompt)
    if _partitions(router):
        return analytic.prefix_routing_hit_rates(workers=scenario.cluster.workers, **common).request_hit_rate
    return analytic.random_routing_hit_rates(workers=scenario.cluster.workers, **common).request_hit_rate


def _simulate(job: tuple[Scenario]) -> tuple[float, float]:
    summary = summarize(run(job[0]))
    return summary.request_hit_rate, summary.ttft_ms["p99"]


def plan_router(base: Scenario, spec: PlanSpec, router: str, runner: Executor,
                progress: Callable[[str], None] | None = None, store: RunStore | None = None) -> RouterPlan:
    """`router`'s plan. With a `store`, each finished simulation is appended to it, keyed by `[router spec, vary,
    value, seed]` (the run: `[hit rate, TTFT p99 ms]`), and those it holds are taken instead of run: the bisection
    is deterministic, so a rerun over a partial store is the uninterrupted plan."""
    grid = spec.grid
    curve: list[tuple[float, float]] = []
    analytic_index = None
    if spec.target.hit_rate is not None:
        for i, value in enumerate(grid):
            h = analytic_hit_rate(configure(base, spec, router, value), router)
            curve.append((value, h))
            if analytic_index is None and h >= spec.target.hit_rate:
                analytic_index = i
    evaluations: dict[int, Evaluation] = {}

    def evaluate(i: int) -> Evaluation:
        if i not in evaluations:
            scenario = configure(base, spec, router, grid[i])
            jobs = [(scenario.with_overrides(seed=scenario.seed + r),) for r in range(spec.repeats)]
            keys = [[router, spec.vary, float(grid[i]), job[0].seed] for job in jobs]
            results: list = [None] * len(jobs)
            todo = [j for j, key in enumerate(keys) if store is None or key not in store]
            for j in set(range(len(jobs))) - set(todo):
                results[j] = tuple(store.get(keys[j]))

            def on_result(j: int, result: tuple[float, float]) -> None:
                if store is not None:
                    store.append(keys[todo[j]], list(result))

            for j, result in zip(todo, runner.map(_simulate, [jobs[j] for j in todo], None, on_result)):
                results[j] = result
            evaluations[i] = Evaluation(grid[i], tuple(h for h, _ in results), tuple(t for _, t in results))
            if progress:
                e = evaluations[i]
                progress(f"{router}: {spec.vary}={grid[i]:g} -> hit {e.hit_rate:.3f}, TTFT p99 {e.ttft_p99:.0f} ms")
        return evaluations[i]

    def meets(i: int) -> bool:
        e = evaluate(i)
        return spec.target.met_by(e.hit_rate, e.ttft_p99)

    # Bisection for the first grid index that meets the target, bracketed from the analytic answer.
    lo, hi = -1, len(grid)  # invariant: lo fails (or is before the grid), hi meets (or is past it)
    start = analytic_index if analytic_index is not None else len(grid) // 2
    if meets(start):
        hi = start
    else:
        lo = start
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    answer = grid[hi] if hi < len(grid) else None
    return RouterPlan(
        router=router, vary=spec.vary, answer=answer,
        analytic_answer=grid[analytic_index] if analytic_index is not None else None,
        evaluations=tuple(evaluations[i] for i in sorted(evaluations)), analytic_curve=tuple(curve),
    )


def plan(base: Scenario, spec: PlanSpec, *, jobs: int | None = None,
         progress: Callable[[str], None] | None = None, executor: Executor | None = None,
         store: RunStore | None = None) -> list[RouterPlan]:
    """A plan per router of `spec`, simulated on `executor` (left open) or on `jobs` local processes; `store`, every
    router's run store (`plan_router`)."""
    for router in spec.routers:  # validate every configuration before simulating any
        for value in (spec.grid[0], spec.grid[-1]):
            configure(base, spec, router, value)
    with using(executor, jobs) as runner:
        return [plan_router(base, spec, router, runner, progress, store) for router in spec.routers]


@dataclass(frozen=True, slots=True)
class RouterChoice:
    """One tuning per candidate router, in the order given, and which one answers."""

    results: tuple[TuneResult, ...]
    best: int | None
    """Index of the router whose best setting meets the constraints with the best objective (None: none meets)."""
    closest: int
    """`best`, or when no router meets the constraints the one whose closest setting violates them least."""

    @property
    def answer(self):
        return self.results[self.closest]

    def verdict(self) -> Verdict:
        """How settled the answer is among the routers' best settings (indices: routers, in the order given)."""
        first = self.results[0]
        return settle([r.answer for r in self.results], self.closest, first.metric, first.constraints)


def choose_router(base: Scenario, routers: Sequence[str], *, objective=None, constraints: Sequence, budget_simulations: int,
                  repeats: int, seed: int | None = None, jobs: int | None = None,
                  progress: Callable[[str, int, int, str], None] | None = None,
                  executor: Executor | None = None, store: RunStore | None = None) -> RouterChoice:
    """Tune each of `routers` (NAME or NAME:key=value with fixed options) over its default search space with the
    same budget, seeds and constraints, and pick the best (`objective` None: `default_objective(base)`); `progress(router, done, total, note)` per simulation.
    `store` is every search's run store (`tune`): a run's key starts with its router spec, the router's name first."""
    objective = (default_objective(base) if objective is None
                 else Objective.parse(objective) if isinstance(objective, str) else objective)
    if objective.kind in ("min-workers", "min-cost", "pareto"):
        raise ValueError(f"choosing a router needs maximize:COLUMN or minimize:COLUMN, got {objective.text()} (for "
                         f"cost: minimize:usd_per_million_tokens on one fleet, or kvsim plan cost across fleets)")
    results = []
    for router in routers:
        def tick(done: int, total: int, note: str, router: str = router) -> None:
            if progress:
                progress(router, done, total, note)

        results.append(tune(base, router, objective=objective, constraints=constraints,
                            budget_simulations=budget_simulations, repeats=repeats, seed=seed, jobs=jobs,
                            progress=tick, executor=executor, store=store))
    metric = objective.metric

    def key(i: int) -> tuple:
        answer = results[i].answer
        value = answer.means.get(metric.column, math.nan)
        score = math.inf if math.isnan(value) else (-value if metric.maximize else value)
        return (not answer.feasible, answer.violation, score, i)

    order = sorted(range(len(results)), key=key)
    best = order[0] if results[order[0]].best is not None else None
    return RouterChoice(results=tuple(results), best=best, closest=order[0])
