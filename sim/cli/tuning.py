"""`kvsim tune`: search a router's options (and optionally workers or KV per worker) for an objective."""

from __future__ import annotations

import math
import time

import click
import yaml

from sim.cli.app import (
    ENGINE_HELP, SLO_HELP, checked_out_dir, console, executor_options, load_or_exit, main, on_engine, one_engine,
    open_executor_or_exit, progress_bar, router_list, scenario_option, setup_text, slo_option, with_slo,
)
from sim.cli.render import Table, format_option
from sim.cli.study_runs import journaled_search, resume_command
from sim.results.output_set import write_output_set
from sim.results.report import csv_bytes
from sim.results.study_figures import tune_figure
from sim.scenario import Scenario, ScenarioError
from sim.config import GIB
from sim.routing.knobs import SYNTAX
from sim.routing.spec import format_value
from sim.studies.search_space import parse_space, space_text
from sim.cli.verdicts import constraint_text, objective_text, pm, repeats_text, safe_text, settled_text, spec_for
from sim.studies.tune import BATCH_TRIALS, Constraint, Objective, default_objective, parse_pareto

OBJECTIVE_DEFAULT_HELP = ("Default: maximize:throughput_rps (throughput), or maximize:goodput_rps (goodput, requests/s "
                          "meeting the SLO) when an SLO is set (--slo or the scenario's slo).")
OBJECTIVE_HELP = ("maximize:COLUMN or minimize:COLUMN (any numeric column of summary.csv, e.g. request_hit_rate, "
                  "ttft_p99_ms, throughput_rps), min-workers (fewest workers that meet the constraints; needs workers "
                  "in --space), min-cost (the lowest fleet price per hour, usd_per_hour, that meets them; ties go to "
                  "the lower usd_per_million_tokens) or pareto (both --pareto metrics). " + OBJECTIVE_DEFAULT_HELP)
CONSTRAINT_HELP = ("COLUMN<=NUMBER or COLUMN>=NUMBER, e.g. ttft_p99_ms<=200; repeatable. The search steers by the mean "
                   "over repeats; the answer says whether the whole 95 % interval meets it (met), fails it (not met) "
                   "or straddles it (undecided).")
HIT_RATE = "request_hit_rate"
"""Shown in every table and verdict of tune and plan router, whatever the objective."""


def parse_objective(ctx: click.Context, param: click.Parameter, value: str | None) -> Objective | None:
    try:
        return None if value is None else Objective.parse(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def parse_constraints(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[Constraint, ...]:
    try:
        return tuple(Constraint.parse(v) for v in value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def parse_pareto_option(ctx: click.Context, param: click.Parameter, value: str | None):
    try:
        return None if value is None else parse_pareto(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def tuning_base(scenario_path, prefixes, workers, concurrency, engine, slo=None) -> Scenario:
    """The scenario with the command's what-ifs applied, or a one-line error."""
    base, _ = load_or_exit(scenario_path, shared_prefix="tune")
    base = with_slo(on_engine(base, engine), slo)
    overrides = {k: v for k, v in {"workload.prefixes": prefixes, "cluster.workers": workers,
                                   "workload.concurrency": concurrency}.items() if v is not None}
    try:
        return base.with_overrides(**overrides) if overrides else base
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


def run_tune(base: Scenario, router: str, space_option: str | None, *, label: str, **kwargs):
    """`sim.studies.tune.tune` behind a progress bar (quiet off a terminal); bad input as one-line click errors."""
    from sim.studies.tune import tune

    try:
        space = None if space_option is None else parse_space(space_option)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--space") from None
    with progress_bar(label, 0) as step:
        def progress(done: int, total: int, note: str) -> None:
            step(completed=done, total=total, note=note)

        try:
            return tune(base, router, space, progress=progress, **kwargs)
        except ScenarioError as err:
            raise click.ClickException(str(err)) from None
        except ValueError as err:  # the messages name the knob, column or option at fault
            raise click.UsageError(str(err)) from None


def value_text(trial, column: str) -> str:
    """`mean ± 95 % half-width` of a trial's column."""
    iv = trial.interval(column)
    return pm(iv, spec_for(column, iv.mean))


def shown_columns(result) -> list[str]:
    """The columns the question names, and the request hit rate if it does not."""
    return list(dict.fromkeys([*result.named_columns, HIT_RATE]))


def gain_text(result) -> str:
    """The answer's objective against the default's: the difference and whether it is beyond the intervals."""
    column = result.metric.column
    gain = result.answer.means.get(column, math.nan) - result.baseline.means.get(column, math.nan)
    if math.isnan(gain):
        return ""
    apart, needed = result.against_default()
    if apart is None:
        return f"{column} {gain:+.4g} vs the default, on 1 run: no interval to tell whether it is a gain"
    if apart:
        return f"{column} {gain:+.4g} vs the default, beyond the 95 % intervals"
    clause = repeats_text(needed)
    return (f"{column} {gain:+.4g} vs the default, within the 95 % intervals: indistinguishable from the default at "
            f"{result.repeats} repeats" + (f"; {clause}" if clause else ""))


def paste_text(result, trial) -> str:
    """The answer as command-line text: --router SPEC and the cluster knobs' options."""
    parts = [f"--router {trial.router}"]
    if "workers" in trial.params:
        parts.append(f"--workers {trial.params['workers']}")
    if "kv-gib" in trial.params:
        parts.append(f"(KV per worker {format_value(trial.params['kv-gib'])} GiB: engine.kv_cache_bytes "
                     f"{int(round(float(trial.params['kv-gib']) * GIB))})")
    return " ".join(parts)


def best_yaml(result, trial) -> bytes:
    """A scenario fragment for the answer (router, and cluster/engine when searched), its metrics and its verdict."""
    from sim.routing.spec import split_router_spec

    name, options = split_router_spec(trial.router)
    doc: dict[str, object] = {"router": {"name": name, "options": options}}
    if "workers" in trial.params:
        doc["cluster"] = {"workers": int(trial.params["workers"])}
    if "kv-gib" in trial.params:
        doc["engine"] = {"kv_cache_bytes": int(round(float(trial.params["kv-gib"]) * GIB))}
    doc["tune"] = {
        "spec": trial.router, "trial": trial.number, "feasible": trial.feasible,
        "objective": result.objective.text(), "constraints": [c.text() for c in result.constraints],
        "repeats": result.repeats, "seeds": f"{result.seed}..{result.seed + result.repeats - 1}",
        "metrics": {c: {"mean": trial.means.get(c), "ci95": None if math.isnan(trial.ci95.get(c, math.nan))
                        else trial.ci95[c]} for c in result.named_columns},
        "default": {c: result.baseline.means.get(c) for c in result.named_columns},
    }
    verdict = result.verdict()
    doc["tune"].update({"constraint_status": verdict.status, "verdict": verdict.label(verdict.answer)})
    return yaml.safe_dump(doc, sort_keys=False).encode()


@main.command()
@scenario_option()
@click.option("--prefixes", type=click.IntRange(min=1), default=None,
              help="Distinct shared prefixes N. Default: the scenario's.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Workers (the default trial's when workers is in --space). Default: the scenario's.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None, help="Requests in flight. Default: the scenario's.")
@click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP)
@click.option("--router", callback=router_list, default=None,
              help="The router to tune: NAME, or NAME:key=value,... with options held fixed (see `kvsim routers`). "
                   "Default: the scenario's.")
@click.option("--space", "space_option", default=None,
              help=f"Knobs to search: {SYNTAX}. Keys: the router's options, and workers / kv-gib (KV cache GiB per "
                   "worker). Default: the router's search space (`kvsim routers`).")
@click.option("--objective", callback=parse_objective, default=None, help=OBJECTIVE_HELP)
@click.option("--constraint", "constraints", multiple=True, callback=parse_constraints, help=CONSTRAINT_HELP)
@click.option("--pareto", callback=parse_pareto_option, default=None,
              help="The front's two metrics COL1,COL2 (each optionally max: or min:; latencies are minimised by "
                   "default). Default: the objective's column and ttft_p99_ms.")
@click.option("--budget", type=click.IntRange(min=1), default=120, show_default=True,
              help="Simulations in all (trials x repeats), the default trial included.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per trial, on seeds seed .. seed + repeats - 1 for every trial.")
@click.option("--seed", type=int, default=None, help="Base seed (of the runs and of the sampler). Default: the scenario's.")
@executor_options
@click.option("--batch", type=click.IntRange(min=1), default=BATCH_TRIALS, show_default=True,
              help="Trials asked from the sampler at once; the answer depends on it, not on --jobs.")
@click.option("--sampler", type=click.Choice(["tpe", "nsga2", "random"]), default="tpe", show_default=True,
              help="optuna sampler: TPE (with constraints), NSGA-II, or random search.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Trials shown in the table.")
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/tune.csv (a row per trial), DIR/tune.png (the trials on the two Pareto metrics) and "
                   "DIR/best.yaml (the answer as a scenario fragment), then DIR/manifest.json listing them; every "
                   "finished simulation is journaled in DIR/runs.jsonl.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue the tune journaled in --out DIR/runs.jsonl: the search replays, taking its finished "
                   "simulations from the journal (same scenario and search options needed).")
@format_option("the rows of tune.csv (a row per trial)")
@click.pass_context
def tune(ctx, scenario_path, prefixes, workers, concurrency, engine, router, space_option, objective, constraints,
         pareto, budget, repeats, seed, jobs, executor_kind, dask_scheduler, batch, sampler, top, slo, out_dir,
         resume) -> None:
    """Search a router's options for the setting that best meets an objective under constraints.

    Trial 0 is the router's defaults; then optuna's sampler proposes settings in batches, each simulated --repeats
    times on the same seeds (common random numbers). Prints the best trials, the front of the two --pareto metrics
    and the best setting as --router text to paste; it is called best only when its objective's 95 % interval does
    not overlap the other trials' (else they are indistinguishable at this number of repeats), and constraints are
    met, not met or undecided on the interval.
    """
    base = tuning_base(scenario_path, prefixes, workers, concurrency, engine, slo)
    if router is not None and len(router) != 1:
        raise click.BadParameter("give one router (tune searches one router's options)", param_hint="--router")
    spec = router[0] if router else base.router.name
    defaulted = objective is None
    objective = default_objective(base) if defaulted else objective
    out = checked_out_dir(out_dir)
    command = resume_command(ctx)
    # NOTE: what decides which trials the sampler asks (not --jobs or --executor, which only decide where they run).
    inputs = repr((spec, space_option, objective, constraints, pareto, budget, repeats, seed, batch, sampler))
    started = time.perf_counter()
    with journaled_search("tune", base, out=out, resume=resume, command=command, inputs=inputs,
                          at_most=budget - budget % repeats) as journal, \
            open_executor_or_exit(executor_kind, jobs, dask_scheduler) as executor:
        result = run_tune(base, spec, space_option, label="tune", objective=objective, constraints=constraints,
                          pareto=pareto, budget_simulations=budget, repeats=repeats, seed=seed, jobs=jobs,
                          batch_trials=batch, sampler=sampler, executor=executor, store=journal)
    wall_s = time.perf_counter() - started
    show_result(result, base, top=top, wall_s=wall_s, defaulted=defaulted)
    rows, columns = result.rows()
    console.data(rows, columns)
    if out is not None:
        what = result.objective.text() + "".join(f", {c.text()}" for c in result.constraints)
        files = {
            "tune.csv": csv_bytes(rows, columns),
            "tune.png": tune_figure(result, title=(
                f"{base.name}: tuning {result.router}, {base.cluster.workers} workers, N={base.workload.prefixes}, "
                f"concurrency={base.workload.concurrency}\n{what}; {len(result.trials)} trials x {result.repeats} runs "
                f"(means, 95 % intervals on the front)")),
            "best.yaml": best_yaml(result, result.answer),
        }
        write_output_set(out, files, runs=len(result.trials) * result.repeats, command=command)
        console.print(f"wrote {out / 'tune.csv'} ({len(rows)} trials), {out / 'tune.png'} and {out / 'best.yaml'}")


def show_result(result, base: Scenario, *, top: int, wall_s: float, defaulted: bool = False) -> None:
    shown_cols = shown_columns(result)
    knobs = [k.key for k in result.space]
    verdict = result.verdict()
    index = {t.config_key: i for i, t in enumerate(verdict.candidates)}
    table = Table(title=f"{base.name}: {setup_text(base)}; tuning {result.router}, {base.cluster.workers} workers, "
                        f"N={base.workload.prefixes}, concurrency={base.workload.concurrency}: "
                        f"{result.objective.text()}" + "".join(f", {c.text()}" for c in result.constraints)
                        + f" (mean ± 95 % over {result.repeats} runs)")
    status_cols = ["constraints"] if result.constraints else []
    for col in ("trial", *knobs, *shown_cols, *status_cols, "front", "verdict", ""):
        table.add_column(col, justify="left" if col in ("", "constraints", "front", "verdict") else "right",
                         key=col == "trial")
    shown, seen = [], set()
    for t in result.ranked():
        if t.config_key not in seen:
            seen.add(t.config_key)
            shown.append(t)
    shown = shown[:top] + ([result.baseline] if result.baseline not in shown[:top] else [])
    for t in shown:
        role = ("default " if t.is_baseline else "") + (
            ("answer" if result.best is not None else "closest") if t.number == result.closest else "")
        i = index[t.config_key]
        table.add_row(str(t.number), *(format_value(t.params[k]) for k in knobs),
                      *(value_text(t, c) for c in shown_cols), *([verdict.statuses[i]] if status_cols else []),
                      "*" if t.on_front else "", verdict.label(i), role.strip())
    console.print(table)
    sims = len(result.trials) * result.repeats
    console.print(f"{len(result.trials)} trials x {result.repeats} runs = {sims} simulations (seeds {result.seed}.."
                  f"{result.seed + result.repeats - 1} for every trial) in {wall_s:.0f} s; space "
                  f"{space_text(result.space) or '(empty: the defaults only)'}", highlight=False)
    console.print(f"objective: {objective_text(result.objective, defaulted=defaulted)}; verdict: whether a trial's "
                  f"{result.metric.column} is separated from the answer's beyond the 95 % intervals (they do not "
                  "overlap)", highlight=False)
    baseline, answer = result.baseline, result.answer
    summary = ", ".join(f"{c} {value_text(answer, c)}" for c in shown_cols)
    before = ", ".join(f"{c} {value_text(baseline, c)}" for c in shown_cols)
    if result.best is None:
        misses = "; ".join(constraint_text(c, answer) for c in result.constraints
                           if not c.met(answer.means.get(c.column, math.nan)))
        console.print(f"no trial meets {', '.join(c.text() for c in result.constraints)} on the mean; the closest is "
                      f"trial {answer.number} ({misses})", highlight=False)
    else:
        console.print(f"default (trial 0): {before}", highlight=False)
        head = "best" if verdict.settled else "top on the mean"
        console.print(f"{head} (trial {answer.number}): {summary}", highlight=False)
        labels = [str(t.number) for t in verdict.candidates]
        console.print(f"  {settled_text(verdict, labels, result.repeats, 'settings', ('trial ', 'trials '))}",
                      highlight=False)
        if result.constraints:
            console.print("  constraints: " + "; ".join(constraint_text(c, answer) for c in result.constraints),
                          highlight=False)
            if safe := safe_text(verdict, labels, 'settings', 'trial '):
                console.print(f"  {safe}", highlight=False)
        if not answer.is_baseline and (gain := gain_text(result)):
            console.print(f"  {gain}", highlight=False)
    console.print(f"paste: {paste_text(result, answer)}", highlight=False,
                  soft_wrap=True)  # NOTE: one line, to copy whole, however narrow the terminal
