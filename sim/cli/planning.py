"""`kvsim plan capacity`: the cheapest worker count or KV size per worker that reaches a hit-rate or TTFT target; `kvsim
plan router`: which router and settings meet constraints best (by `kvsim tune` per router); `kvsim plan cost` (and
`kvsim plan --objective min-cost ...`): the cheapest GPU, worker count, router and host KV meeting constraints."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import click

from sim.cli.app import (
    CPU_KV_HELP, ENGINE_HELP, SLO_HELP, UsageExit, checked_out_dir, console, executor_options, finite_float, gib_list,
    gpu_price_option, hardware_options, int_list, kv_origin, kv_rule_note, load_or_exit, main, on_cpu_kv, on_engine,
    on_gpu_price, on_hardware, one_engine, open_executor_or_exit, progress_bar, router_list, scenario_option,
    setup_text, slo_option, with_slo, workload_text,
)
from sim.cli.render import Table, format_option
from sim.cli.study_runs import journaled_search, resume_command
from sim.cli.tuning import (
    CONSTRAINT_HELP, HIT_RATE, OBJECTIVE_DEFAULT_HELP, paste_text, parse_constraints, parse_objective, value_text,
)
from sim.cli.verdicts import constraint_text, marked, objective_text, own_policy_note, safe_text, settled_text
from sim.results.figures import plan_figure
from sim.results.cost import COST_COLUMNS
from sim.results.output_set import write_output_set
from sim.results.report import csv_bytes, write_atomic
from sim.results.study_figures import choose_router_figure
from sim.scenario import Scenario, ScenarioError
from sim.scenario import cpu_kv_gib as cpu_kv_gib_of
from sim.studies.tune import Constraint, default_objective


PLAN_COST_COLUMNS = ("usd_per_hour", "usd_per_million_tokens")
"""The cost columns `plan router` and `plan capacity` append to plan.csv (means over runs; capacity: the answer's
fleet price only, known without simulating)."""

_SUBCOMMANDS = ("kvsim plan takes a subcommand: `kvsim plan capacity --vary workers|kv-gib|cpu-kv-gib ...` (was plan "
                "--vary), `kvsim plan router --router A,B,C ...` (was plan --choose-router A,B,C) or `kvsim plan cost "
                "--constraint 'ttft_p99_ms<=500' ...` (also `kvsim plan --objective min-cost ...`)")


def _min_cost_form(args: list[str]) -> list[str] | None:
    """`plan --objective min-cost REST` as `plan cost REST` (the issue's form), or None when `args` is not that."""
    for i, arg in enumerate(args):
        if arg == "--objective" and i + 1 < len(args) and args[i + 1] == "min-cost":
            return ["cost", *args[:i], *args[i + 2:]]
        if arg == "--objective=min-cost":
            return ["cost", *args[:i], *args[i + 1:]]
    return None


class _PlanGroup(click.Group):
    """`kvsim plan`, a group of three subcommands; `plan --objective min-cost ...` is `plan cost ...`, and the
    options of the single command it was (`plan --vary ...`, `plan --choose-router ...`) get a one-line error naming
    the subcommands instead of click's 'No such option'."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            cost = _min_cost_form(args)
            if cost is None:
                raise UsageExit(_SUBCOMMANDS)
            args = cost
        return super().parse_args(ctx, args)


@main.group(cls=_PlanGroup, short_help="Plan for a target: the cheapest capacity, the best router, the cheapest fleet.")
def plan() -> None:
    """Plan a deployment for a target: `capacity` finds, per router, the cheapest worker count, GPU KV or host (CPU)
    KV per worker that meets it; `router` finds which router and settings meet targets and constraints best; `cost`
    (or `kvsim plan --objective min-cost --constraint ...`) finds the cheapest GPU, worker count, router and host KV
    that meet constraints, and says which constraint binds."""


def _options(*decorators: Callable) -> Callable:
    """The options `decorators` declare, in the order given, as one decorator (shared by both subcommands)."""
    def apply(command: Callable) -> Callable:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command
    return apply


_workload_options = _options(
    scenario_option(" (workload, model, engine, time model)"),
    click.option("--prefixes", type=click.IntRange(min=1), default=None,
                 help="Distinct shared prefixes N. Default: the scenario's."),
    click.option("--zipf", type=click.FloatRange(min=0), default=None,
                 help="Zipf exponent of prefix popularity (0 = uniform). Default: the scenario's popularity."),
    click.option("--concurrency", type=click.IntRange(min=1), default=None,
                 help="Requests in flight. Default: the scenario's."),
)
_target_options = _options(
    click.option("--target-hit-rate", type=click.FloatRange(0, 1), default=None, help="Request hit rate to reach."),
    click.option("--target-ttft-p99-ms", type=click.FloatRange(min=0), default=None,
                 help="TTFT p99 (ms) not to exceed (needs a calibrated scenario)."),
)
_cluster_options = _options(
    click.option("--cpu-kv-gib", "cpu_kv_gib", type=click.FloatRange(min=0), default=None, help=CPU_KV_HELP),
    click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP),
    hardware_options,
    click.option("--repeats", type=click.IntRange(min=2), default=3, show_default=True,
                 help="Simulated runs per candidate."),
    executor_options,
)


def _out_options(writes: str, replays: str) -> Callable:
    """`--out DIR` (writing `writes`, journaling every simulation) and `--resume` (each router's `replays` replays)."""
    return _options(
        click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
                     help=f"Write {writes}; every finished simulation is journaled in DIR/runs.jsonl."),
        click.option("--resume", is_flag=True, default=False,
                     help=f"Continue the plan journaled in --out DIR/runs.jsonl: each router's {replays} replays, "
                          "taking its finished simulations from the journal."),
    )


def _workload_overrides(prefixes: int | None, zipf: float | None, concurrency: int | None) -> dict[str, object]:
    """The scenario overrides of the workload options every plan subcommand takes (`_workload_options`)."""
    overrides: dict[str, object] = {}
    if prefixes is not None:
        overrides["workload.prefixes"] = prefixes
    if zipf is not None:
        overrides.update({"workload.popularity": "zipf" if zipf > 0 else "uniform", "workload.zipf_exponent": zipf})
    if concurrency is not None:
        overrides["workload.concurrency"] = concurrency
    return overrides


def _plan_base(scenario_path, prefixes, zipf, workers, concurrency, cpu_kv_gib, engine, model, gpu, kv_gib, *,
               slo=None, vary: str | None = None) -> Scenario:
    """The scenario both subcommands plan on, with the command's what-ifs applied, or a one-line error."""
    if kv_gib is not None and vary == "kv-gib":
        raise click.UsageError("--kv-gib fixes the GPU KV per worker; --vary kv-gib searches it: give one")
    base, _ = load_or_exit(scenario_path, gpu, shared_prefix="plan")
    base = on_hardware(with_slo(on_engine(base, engine), slo), model, gpu, kv_gib)
    if cpu_kv_gib is not None and vary == "cpu-kv-gib":
        raise click.UsageError("--cpu-kv-gib fixes the host tier; --vary cpu-kv-gib searches it: give one")
    base = on_cpu_kv(base, cpu_kv_gib)
    if vary == "cpu-kv-gib":
        on_cpu_kv(base, 1.0)  # a one-line error now if the engine has no host tier
    overrides = _workload_overrides(prefixes, zipf, concurrency)
    if workers is not None:
        overrides["cluster.workers"] = workers
    try:
        return base.with_overrides(**overrides) if overrides else base
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


@plan.command(name="router", short_help="Which router and settings meet targets and constraints best.")
@_workload_options
@click.option("--router", "routers", callback=router_list, required=True,
              help="The candidate routers, comma-separated: NAME or NAME:key=value,... (options given are held "
                   "fixed; see `kvsim routers`). Each is tuned over its default search space (`kvsim tune`) on the "
                   "scenario's workload as it is, with the same --budget and seeds.")
@_target_options
@click.option("--constraint", "constraints", multiple=True, callback=parse_constraints,
              help=f"{CONSTRAINT_HELP} The targets are constraints too.")
@click.option("--objective", callback=parse_objective, default=None,
              help="maximize:COLUMN or minimize:COLUMN among the settings that meet the constraints. "
                   + OBJECTIVE_DEFAULT_HELP)
@click.option("--budget", type=click.IntRange(min=1), default=60, show_default=True,
              help="Simulations per router (trials x repeats).")
@click.option("--seed", type=int, default=None, help="Base seed. Default: the scenario's.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Number of workers. Default: the scenario's.")
@_cluster_options
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@_out_options("DIR/plan.csv (a row per router) and DIR/plan.png, then DIR/manifest.json listing them", "search")
@format_option("the rows of plan.csv (a row per router)")
@click.pass_context
def plan_router(ctx, scenario_path, prefixes, zipf, concurrency, routers, target_hit_rate, target_ttft_p99_ms,
                constraints, objective, budget, seed, workers, cpu_kv_gib, engine, model, gpu, kv_gib, repeats, jobs,
                executor_kind, dask_scheduler, slo, out_dir, resume) -> None:
    """Find which of the --router candidates, and which of its settings, meets the targets and --constraint best
    for the --objective.

    Each router is tuned as `kvsim tune` does (trial 0 its defaults, then optuna's sampler) with --budget
    simulations on the same seeds; the table shows each router's best setting, the answer and its --router text.
    The answer is settled only when its objective's 95 % interval does not overlap another router's (else they are
    indistinguishable at this number of repeats); constraints are met, not met or undecided on the interval.
    """
    base = _plan_base(scenario_path, prefixes, zipf, workers, concurrency, cpu_kv_gib, engine, model, gpu, kv_gib, slo=slo)
    targets = ([Constraint("request_hit_rate", ">=", target_hit_rate)] if target_hit_rate is not None else []) + (
        [Constraint("ttft_p99_ms", "<=", target_ttft_p99_ms)] if target_ttft_p99_ms is not None else [])
    out = checked_out_dir(out_dir)
    constraints = (*targets, *constraints)
    defaulted = objective is None
    objective = default_objective(base) if defaulted else objective
    command = resume_command(ctx)
    # NOTE: what decides which trials each router's search asks (not --jobs or --executor).
    inputs = repr((routers, objective, constraints, budget, repeats, seed))
    with journaled_search("plan-choose-router", base, out=out, resume=resume, command=command, inputs=inputs,
                          at_most=len(routers) * (budget - budget % repeats)) as journal, \
            open_executor_or_exit(executor_kind, jobs, dask_scheduler) as executor:
        choice = choose_router(base, routers, objective=objective, constraints=constraints, budget=budget,
                               repeats=repeats, seed=seed, jobs=jobs, executor=executor, store=journal)
    show_choice(base, choice, objective=objective, budget=budget, repeats=repeats, out=out, command=command,
                defaulted=defaulted, kv=kv_origin(model, gpu, kv_gib))


@plan.command(name="capacity",
              short_help="The cheapest worker count, GPU KV or host KV per worker for a target, per router.")
@_workload_options
@click.option("--vary", type=click.Choice(sorted(["workers", "kv-gib", "cpu-kv-gib"])), required=True,
              help="What may change: the worker count, the GPU KV cache per worker in GiB, or the host (CPU) KV tier "
                   "per worker in GiB (vLLM's --kv-offloading-size).")
@_target_options
@click.option("--min", "low", type=float, callback=finite_float, default=None,
              help="Smallest value to try. Default: 1 worker / 1 GiB / 0 GiB of host KV.")
@click.option("--max", "high", type=float, callback=finite_float, default=None,
              help="Largest value to try. Default: 64 workers / 32 GiB / 64 GiB of host KV.")
@click.option("--step", type=click.FloatRange(min=0.01), default=0.25, show_default=True,
              help="Resolution of kv-gib and cpu-kv-gib.")
@click.option("--router", "routers", callback=router_list, default=None,
              help="Routers to plan for: NAME or NAME:key=value,..., comma-separated (see `kvsim routers`). "
                   "Default: the scenario's.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Workers while varying kv-gib or cpu-kv-gib. Default: the scenario's.")
@_cluster_options
@click.option("--horizon", type=click.IntRange(min=50), default=1000, show_default=True,
              help="Measured requests per simulated run, after a discarded transient that lets every reachable "
                   "(worker, prefix) pair be visited (steady state).")
@_out_options("DIR/plan.csv (a row per router) and DIR/plan.png", "bisection")
@format_option("the rows of plan.csv (a row per router)")
@click.pass_context
def plan_capacity(ctx, scenario_path, prefixes, zipf, concurrency, vary, target_hit_rate, target_ttft_p99_ms, low,
                  high, step, routers, workers, cpu_kv_gib, engine, model, gpu, kv_gib, repeats, jobs, executor_kind,
                  dask_scheduler, horizon, out_dir, resume) -> None:
    """Find, per router, the cheapest setting that meets a target: how many workers (--vary workers), how much GPU
    KV per worker (kv-gib) or how much host (CPU) KV per worker (cpu-kv-gib).

    The analytic block model screens the range; simulation confirms by bisection with repeats (steady state), and
    the table reports the simulated mean at the answer with its 95 % interval beside the analytic answer.
    """
    from sim.studies.plan import VARY_UNITS, PlanSpec, PlanTarget, configure, make_grid
    from sim.studies.plan import plan as run_plan

    base = _plan_base(scenario_path, prefixes, zipf, workers, concurrency, cpu_kv_gib, engine, model, gpu, kv_gib,
                      vary=vary)
    try:
        target = PlanTarget(target_hit_rate, target_ttft_p99_ms)
        low = (0.0 if vary == "cpu-kv-gib" else 1.0) if low is None else low
        high = {"workers": 64.0, "kv-gib": 32.0, "cpu-kv-gib": 64.0}[vary] if high is None else high
        for hint, value in (("--min", low), ("--max", high)):
            if vary == "workers" and (value != int(value) or value < 1):
                raise click.BadParameter(f"{value:g}: --vary workers takes whole numbers of workers >= 1",
                                         param_hint=hint)
            if vary == "kv-gib" and value <= 0:
                raise click.BadParameter(f"{value:g}: --vary kv-gib takes GiB of KV cache > 0", param_hint=hint)
            if vary == "cpu-kv-gib" and value < 0:
                raise click.BadParameter(f"{value:g}: --vary cpu-kv-gib takes GiB of host KV >= 0 (0: none)",
                                         param_hint=hint)
        if low > high:
            raise click.BadParameter(f"--min {low:g} is above --max {high:g}", param_hint="--min")
        spec = PlanSpec(vary=vary, grid=make_grid(vary, low, high, step), target=target, repeats=repeats,
                        horizon_requests=horizon, routers=tuple(routers or [base.router.name]))
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    out = checked_out_dir(out_dir)
    # NOTE: what decides which candidates the bisections simulate (not --jobs or --executor).
    inputs = repr(spec)
    with journaled_search("plan-vary", base, out=out, resume=resume, command=resume_command(ctx), inputs=inputs,
                          at_most=None) as journal, \
            progress_bar("plan") as step, open_executor_or_exit(executor_kind, jobs, dask_scheduler) as executor:
        step(0, note="screening")
        try:
            plans = run_plan(base, spec, jobs=jobs, executor=executor, progress=lambda msg: step(note=msg),
                             store=journal)
        except (ScenarioError, ValueError) as err:
            raise click.ClickException(str(err)) from None
    unit = VARY_UNITS[vary]
    what = " and ".join(x for x in (f"request hit rate >= {target_hit_rate}" if target_hit_rate is not None else "",
                                    f"TTFT p99 <= {target_ttft_p99_ms} ms" if target_ttft_p99_ms is not None else "") if x)
    kv = "varied" if vary == "kv-gib" else kv_origin(model, gpu, kv_gib)
    table = Table(title=f"{base.name}: {setup_text(base, kv)}; N={base.workload.prefixes} "
                        f"({base.workload.popularity}): cheapest {vary} for {what}")
    for col in ("router", "answer", "simulated hit rate", "simulated TTFT p99 ms", "analytic answer",
                "simulated below answer", "runs"):
        table.add_column(col, justify="left" if col == "router" else "right", key=col == "router")
    rows = []
    for p in plans:
        at = p.at_answer
        below = next((e for e in reversed(p.evaluations) if p.answer is not None and e.value < p.answer), None)
        table.add_row(
            p.router, "none in range" if p.answer is None else f"{p.answer:g} {unit}",
            "-" if at is None else f"{at.hit_rate:.3f} ± {at.hit_rate_ci95:.3f}",
            "-" if at is None else f"{at.ttft_p99:.0f} ± {at.ttft_p99_ci95:.0f}",
            "-" if p.analytic_answer is None else f"{p.analytic_answer:g} {unit}",
            "-" if below is None else f"{below.value:g}: {below.hit_rate:.3f} / {below.ttft_p99:.0f} ms",
            str(len(p.evaluations) * repeats),
        )
        primary_is_hit = target_hit_rate is not None
        row = {"router": p.router, "vary": vary, "answer": "" if p.answer is None else p.answer, "unit": unit,
               "predicted": "" if at is None else (at.hit_rate if primary_is_hit else at.ttft_p99),
               "target": target_hit_rate if primary_is_hit else target_ttft_p99_ms,
               "analytic_answer": "" if p.analytic_answer is None else p.analytic_answer,
               "metric": "request_hit_rate" if primary_is_hit else "ttft_p99_ms",
               "predicted_ci95": "" if at is None else (at.hit_rate_ci95 if primary_is_hit else at.ttft_p99_ci95)}
        if primary_is_hit and target_ttft_p99_ms is not None:
            row.update({"predicted_ttft_p99_ms": "" if at is None else at.ttft_p99, "target_ttft_p99_ms": target_ttft_p99_ms})
        # NOTE: a fixed fleet's price is known without simulating: the answer's configuration priced.
        row["usd_per_hour"] = "" if p.answer is None else configure(base, spec, p.router, p.answer).fleet_usd_per_hour()
        rows.append(row)
    console.print(table)
    console.print(f"steady state: {horizon} measured requests per run after a discarded transient, {repeats} runs per "
                  f"candidate; intervals are 95 % over runs")
    columns = ["router", "vary", "answer", "unit", "predicted", "target", "analytic_answer", "metric",
               "predicted_ci95"] + (["predicted_ttft_p99_ms", "target_ttft_p99_ms"]
                                    if target_hit_rate is not None and target_ttft_p99_ms is not None else []) + [
                   "usd_per_hour"]
    console.data(rows, columns)
    if note := kv_rule_note(base, kv):
        console.print(note, highlight=False)
    if out_dir:
        out = Path(out_dir)
        write_atomic(out / "plan.csv", csv_bytes(rows, columns))
        write_atomic(out / "plan.png", plan_figure(plans, target_hit_rate=target_hit_rate,
                                                   target_ttft_p99_ms=target_ttft_p99_ms, unit=unit,
                                                   title=f"{base.name}: {what}"))
        console.print(f"wrote {out / 'plan.csv'} and {out / 'plan.png'}")


def choose_router(base: Scenario, routers: list[str], *, objective, constraints, budget: int, repeats: int,
                  seed: int | None, jobs: int | None, executor=None, store=None):
    """`kvsim plan router`'s search: each router tuned behind a progress bar (`store`: the journal)."""
    from sim.studies.plan import choose_router as run_choice

    with progress_bar("plan") as step:
        def progress(router: str, done: int, total: int, note: str) -> None:
            step(0, note=f"{router} {done}/{total} simulations, {note}")

        try:
            choice = run_choice(base, routers, objective=objective, constraints=constraints,
                                budget_simulations=budget, repeats=repeats, seed=seed, jobs=jobs, progress=progress,
                                executor=executor, store=store)
        except ScenarioError as err:
            raise click.ClickException(str(err)) from None
        except ValueError as err:  # the message names the column, knob or option at fault
            raise click.UsageError(str(err)) from None
    return choice


def show_choice(base: Scenario, choice, *, objective, budget: int, repeats: int, out: Path | None,
                command: str, defaulted: bool = False, kv: str = "the scenario's") -> None:
    """Print the choice's table, its verdict and answer; with `out`, write plan.csv and plan.png as one set with the
    manifest."""
    from dataclasses import replace

    from sim.studies.tune import verdict_columns

    first = choice.results[0]
    named = first.named_columns
    shown = list(dict.fromkeys([*named, HIT_RATE]))
    column = objective.metric.column
    what = ", ".join(c.text() for c in first.constraints) or "no constraints"
    verdict = choice.verdict()
    table = Table(title=f"{base.name}: {setup_text(base, kv)}; {base.cluster.workers} workers, "
                        f"N={base.workload.prefixes}, concurrency={base.workload.concurrency}: which router for "
                        f"{objective.text()} with {what}")
    status_cols = ["constraints"] if first.constraints else []
    for col in ("router", "best setting", *shown, *status_cols, "verdict", f"default's {column}", "runs"):
        table.add_column(col, justify="left" if col in ("router", "best setting", "constraints", "verdict") else "right",
                         key=col == "router", prose=col == "best setting")
    rows = []
    for i, result in enumerate(choice.results):
        t = result.answer
        table.add_row(marked(result.router), t.router,
                      *(value_text(t, c) for c in shown), *([verdict.statuses[i]] if status_cols else []),
                      verdict.label(i), value_text(result.baseline, column), str(len(result.trials) * result.repeats))
        rows.append({"router": result.router, "vary": "router", "answer": t.router, "unit": "",
                     "predicted": t.means.get(column, math.nan), "target": what, "analytic_answer": "",
                     "metric": column, "predicted_ci95": t.ci95.get(column, math.nan),
                     "feasible": str(t.feasible).lower(), "trials": len(result.trials),
                     **{f"mean_{c}": t.means.get(c, math.nan) for c in named},
                     f"default_{column}": result.baseline.means.get(column, math.nan),
                     **verdict_columns(verdict, i),
                     HIT_RATE: t.means.get(HIT_RATE, math.nan), f"{HIT_RATE}_ci95": t.ci95.get(HIT_RATE, math.nan),
                     **{c: t.means.get(c, math.nan) for c in PLAN_COST_COLUMNS}})
    console.print(table)
    console.print(f"each router tuned over its default search space (`kvsim routers`) with {budget // repeats} "
                  f"trials x {repeats} runs on the same seeds; means ± 95 % over runs", highlight=False)
    console.print(f"objective: {objective_text(objective, defaulted=defaulted)}" + (
        "; constraints judged with the 95 % interval: met (all of it meets), not met (all of it fails), undecided (it "
        "straddles the limit)" if first.constraints else ""), highlight=False)
    if note := own_policy_note([r.router for r in choice.results]):
        console.print(note, highlight=False)
    answer = choice.answer
    labels = [marked(r.router) for r in choice.results]
    if choice.best is None:
        misses = "; ".join(constraint_text(c, answer.answer) for c in answer.constraints
                           if not c.met(answer.answer.means.get(c.column, math.nan)))
        console.print(f"no router meets {what} on the mean; the closest is {answer.answer.router} ({misses})",
                      highlight=False)
    else:
        head = "answer" if verdict.settled and verdict.status in ("", "met") else "no settled answer; top on the mean"
        values = ", ".join(f"{c} {value_text(answer.answer, c)}" for c in dict.fromkeys((column, HIT_RATE)))
        console.print(f"{head}: {answer.answer.router}, {values} (its default: {column} "
                      f"{value_text(answer.baseline, column)})", highlight=False)
        console.print(f"  {settled_text(verdict, labels, repeats, 'routers')}", highlight=False)
        if first.constraints:
            console.print("  constraints: " + "; ".join(constraint_text(c, answer.answer) for c in first.constraints),
                          highlight=False)
            if safe := safe_text(verdict, labels, 'routers'):
                console.print(f"  {safe}", highlight=False)
    console.print(f"paste: {paste_text(answer, answer.answer)}", highlight=False,
                  soft_wrap=True)  # NOTE: one line, to copy whole, however narrow the terminal
    if note := kv_rule_note(base, kv):
        console.print(note, highlight=False)
    columns = ["router", "vary", "answer", "unit", "predicted", "target", "analytic_answer", "metric",
               "predicted_ci95", "feasible", "trials", *(f"mean_{c}" for c in named), f"default_{column}",
               "constraint_status", "verdict", "repeats_to_separate", HIT_RATE, f"{HIT_RATE}_ci95",
               *PLAN_COST_COLUMNS]
    console.data(rows, columns)
    if out is not None:
        labelled = replace(choice, results=tuple(replace(r, router=marked(r.router)) for r in choice.results))
        note = own_policy_note([r.router for r in choice.results], figure=True)
        files = {
            "plan.csv": csv_bytes(rows, columns),
            "plan.png": choose_router_figure(labelled, title=(
                f"{base.name}: which router for {objective.text()} with {what}\n{base.cluster.workers} workers, "
                f"N={base.workload.prefixes}, concurrency={base.workload.concurrency}; each tuned with {budget // repeats} "
                f"trials x {repeats} runs" + (f"\n{note}" if note else ""))),
        }
        write_output_set(out, files, runs=sum(len(r.trials) * r.repeats for r in choice.results), command=command)
        console.print(f"wrote {out / 'plan.csv'} and {out / 'plan.png'}")


def _gpu_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[tuple[str, int]] | None:
    """`--gpu l4,a100-80gb,h100x2`: hardware profiles x tensor-parallel degree, or a one-line error."""
    from sim.timing.hardware import parse_gpu

    if value is None:
        return None
    try:
        return [parse_gpu(v) for v in value.split(",") if v.strip()] or None
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@plan.command(name="cost", short_help="The cheapest GPU, worker count, router and host KV meeting constraints.")
@_workload_options
@click.option("--constraint", "constraints", multiple=True, callback=parse_constraints,
              help=f"{CONSTRAINT_HELP} At least one; the answer says which binds.")
@click.option("--gpu", "gpus", callback=_gpu_list, default=None,
              help="Candidate GPUs, comma-separated NAME[xTP] (`kvsim hardware`; each worker on its own device, timed "
                   "by the roofline model, KV per worker as vLLM would allocate it unless --kv-gib). Default: the "
                   "scenario's devices.")
@click.option("--workers", callback=int_list, default=None,
              help="Candidate worker counts, comma-separated. Default: the scenario's.")
@click.option("--router", "routers", callback=router_list, default=None,
              help="Candidate routers, comma-separated: NAME or NAME:key=value,... (see `kvsim routers`). Default: the "
                   "scenario's.")
@click.option("--cpu-kv-gib", "cpu_kv_gibs", callback=gib_list, default=None,
              help="Candidate host (CPU) KV tiers per worker in GiB, comma-separated (0: none; not priced: an "
                   "instance's host memory comes with it). Default: the scenario's.")
@click.option("--model", default=None, help="Serve this model (a shipped one or a config.json). Default: the scenario's.")
@click.option("--kv-gib", "kv_gib", type=click.FloatRange(min=0, min_open=True), callback=finite_float, default=None,
              help="GPU KV cache per worker in GiB on every candidate. Default: vLLM's rule on each GPU (with --gpu), "
                   "else the scenario's.")
@gpu_price_option
@click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP)
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Simulated runs per candidate (seeds seed .. seed + repeats - 1); constraints are judged on the "
                   "means.")
@click.option("--budget", type=click.IntRange(min=1), default=200, show_default=True,
              help="At most this many simulations; the walk up the price list stops there.")
@executor_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/plan.csv (a row per candidate simulated, cheapest first) and DIR/manifest.json.")
@format_option("the rows of plan.csv (a row per candidate simulated)")
def plan_cost(scenario_path, prefixes, zipf, concurrency, constraints, gpus, workers, routers, cpu_kv_gibs, model,
              kv_gib, gpu_price_usd, engine, slo, repeats, budget, jobs, executor_kind, dask_scheduler,
              out_dir) -> None:
    """Find the cheapest configuration that meets every --constraint: which GPU (--gpu), how many workers
    (--workers), which router (--router) and how much host KV (--cpu-kv-gib), and say which constraint binds.

    Cheapest is the fleet's price per hour (each device's GPUs x its price per GPU-hour: `kvsim hardware`, the
    scenario's device.price_per_hour_usd or --gpu-price-usd). The candidates are tried from the cheapest up, each
    simulated --repeats times on the same seeds, until the first meets every constraint on the means; the binding
    constraint is the one that rules out the next-cheaper candidate (the one it violates most). Also:
    `kvsim plan --objective min-cost --constraint 'ttft_p99_ms<=500' ...`.
    """
    from sim.studies.cost_plan import candidates as all_candidates, plan_cost as run_plan
    from sim.studies.tune import UnknownColumn

    if not constraints:
        raise click.UsageError("give at least one --constraint, e.g. --constraint 'ttft_p99_ms<=500'")
    out = checked_out_dir(out_dir)
    base, _ = load_or_exit(scenario_path, gpus[0] if gpus else None, shared_prefix="plan")
    base = with_slo(on_engine(base, engine), slo)
    overrides = _workload_overrides(prefixes, zipf, concurrency)
    try:
        base = base.with_overrides(**overrides) if overrides else base
        if kv_gib is not None and not gpus and model is None:
            from sim.scenario import with_kv_gib
            base = with_kv_gib(base, kv_gib)
        for gib in cpu_kv_gibs or ():
            on_cpu_kv(base, gib)  # a one-line error now if the engine has no host tier
        found = all_candidates(
            base, gpus=gpus, workers=workers or [base.cluster.workers], routers=routers or [base.router.name],
            cpu_kv_gibs=cpu_kv_gibs or [cpu_kv_gib_of(base)], model=model,
            kv_gib=kv_gib if (gpus or model is not None) else None,
            adjust=lambda s: on_gpu_price(s, gpu_price_usd))
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    with progress_bar("plan cost") as step, open_executor_or_exit(executor_kind, jobs, dask_scheduler) as executor:
        try:
            result = run_plan(found, constraints, repeats=repeats, budget_simulations=budget, jobs=jobs,
                              executor=executor, progress=lambda msg: step(note=msg))
        except (UnknownColumn, ValueError) as err:
            raise click.UsageError(str(err)) from None
        except ScenarioError as err:
            raise click.ClickException(str(err)) from None
    _show_cost_plan(base, result, repeats=repeats, out=out)


COST_SHOWN = ("usd_per_million_tokens", "usd_per_million_slo_requests")
"""The cost columns `plan cost`'s table shows beside the constrained ones."""


def _show_cost_plan(base: Scenario, result, *, repeats: int, out: Path | None) -> None:
    """The trials' table (cheapest first), the answer and what binds; with `out`, plan.csv and the manifest."""
    from sim.studies.cost_plan import failure_text

    named = list(dict.fromkeys(c.column for c in result.constraints))
    shown = [c for c in COST_SHOWN if c not in named]
    what = ", ".join(c.text() for c in result.constraints)
    table = Table(title=f"{base.name}: the cheapest configuration with {what}; {workload_text(base)}")
    for col in ("gpu", "workers", "router", "host KV GiB", "$/h", *named, *shown, "status"):
        table.add_column(col, justify="left" if col in ("gpu", "router", "status") else "right", key=col == "gpu",
                         prose=col == "status")
    rows = []
    for t in result.trials:
        c = t.candidate
        status = ("answer" if t is result.answer else "meets") if t.feasible else f"fails: {failure_text(t)}"

        def shown_value(column: str) -> str:
            mean, half = t.means.get(column, math.nan), t.ci95.get(column, math.nan)
            if math.isnan(mean):
                return "-"
            return f"{mean:.4g}" + ("" if math.isnan(half) else f" ± {half:.2g}")

        table.add_row(c.gpu, str(c.workers), c.router, f"{c.cpu_kv_gib:g}", f"{c.usd_per_hour:.2f}",
                      *(shown_value(col) for col in named), *(shown_value(col) for col in shown), status)
        role = "answer" if t is result.answer else "next-cheaper" if t is result.next_cheaper else ""
        rows.append({"gpu": c.gpu, "workers": c.workers, "router": c.router, "cpu_kv_gib": c.cpu_kv_gib,
                     "usd_per_hour": c.usd_per_hour, "feasible": str(t.feasible).lower(), "role": role,
                     "violated": ";".join(v.text() for v in t.violated) or (c.problem and "memory"),
                     **{col: t.means.get(col, math.nan) for col in named},
                     **{f"{col}_ci95": t.ci95.get(col, math.nan) for col in named},
                     **{col: t.means.get(col, math.nan) for col in COST_COLUMNS if col not in named}})
    columns = ["gpu", "workers", "router", "cpu_kv_gib", "usd_per_hour", "feasible", "role", "violated",
               *(x for col in named for x in (col, f"{col}_ci95")), *(c for c in COST_COLUMNS if c not in named)]
    console.print(table)
    console.print(f"tried from the cheapest fleet up ($/h: each device's GPUs x its price per GPU-hour, `kvsim "
                  f"hardware`); {repeats} runs per candidate on the same seeds, constraints judged on the means "
                  f"(± 95 % over runs)", highlight=False)
    answer = result.answer
    if answer is None:
        why = (f"the budget ran out after {len(result.trials)} candidates" if result.budget_exhausted
               else f"none of the {len(result.trials)} candidates meets them")
        console.print(f"no configuration meets {what}: {why}", highlight=False)
    else:
        a = answer.candidate
        console.print(f"answer: {a.label()}, ${a.usd_per_hour:.2f}/h "
                      f"(usd_per_million_tokens {answer.means.get('usd_per_million_tokens', math.nan):.4g})",
                      highlight=False)
        below = result.next_cheaper
        if below is None:
            console.print("binds: nothing (the cheapest candidate meets every constraint; the range tried is the "
                          "limit)", highlight=False)
        else:
            console.print(f"binds: {result.binding} (the next-cheaper candidate, {below.candidate.label()} at "
                          f"${below.candidate.usd_per_hour:.2f}/h: {failure_text(below)})", highlight=False)
        if result.untried:
            console.print(f"{len(result.untried)} dearer candidates not simulated", highlight=False)
    console.data(rows, columns)
    if out is not None:
        write_output_set(out, {"plan.csv": csv_bytes(rows, columns)},
                         runs=sum(repeats for t in result.trials if t.candidate.scenario is not None),
                         command="kvsim plan cost")
        console.print(f"wrote {out / 'plan.csv'}")
