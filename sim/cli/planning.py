"""`kvsim plan`: the cheapest worker count or KV size per worker that reaches a hit-rate or TTFT target."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.cli.app import ENGINE_HELP, console, err_console, load_or_exit, main, on_engine, one_engine, router_list
from sim.results.report import csv_bytes, plan_figure, write_atomic
from sim.scenario import ScenarioError


@main.command()
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None,
              help="Scenario (workload, model, engine, time model). Default: the built-in calibrated reference.")
@click.option("--prefixes", type=click.IntRange(min=1), default=None, help="Distinct prefixes N. Default: the scenario's.")
@click.option("--zipf", type=click.FloatRange(min=0), default=None,
              help="Zipf exponent of prefix popularity (0 = uniform). Default: the scenario's popularity.")
@click.option("--target-hit-rate", type=click.FloatRange(0, 1), default=None, help="Request hit rate to reach.")
@click.option("--target-ttft-p99-ms", type=click.FloatRange(min=0), default=None,
              help="TTFT p99 (ms) not to exceed (needs a calibrated scenario).")
@click.option("--vary", type=click.Choice(sorted(["workers", "kv-gib"])), required=True,
              help="What may change: the worker count, or the KV cache per worker in GiB.")
@click.option("--min", "low", type=float, default=None, help="Smallest value to try. Default: 1 worker / 1 GiB.")
@click.option("--max", "high", type=float, default=None, help="Largest value to try. Default: 64 workers / 32 GiB.")
@click.option("--step", type=click.FloatRange(min=0.01), default=0.25, show_default=True, help="Resolution of kv-gib.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Workers while varying kv-gib. Default: the scenario's.")
@click.option("--router", "routers", callback=router_list, default=None,
              help="Routers to plan for: NAME or NAME:key=value,..., comma-separated (see `kvsim routers`). "
                   "Default: the scenario's.")
@click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP)
@click.option("--repeats", type=click.IntRange(min=2), default=3, show_default=True, help="Simulated runs per candidate.")
@click.option("--horizon", type=click.IntRange(min=50), default=1000, show_default=True,
              help="Measured requests per simulated run, after a discarded transient that lets every reachable "
                   "(worker, prefix) pair be visited (steady state).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes. Default: all cores.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/plan.csv (a row per router) and DIR/plan.png.")
def plan(scenario_path, prefixes, zipf, target_hit_rate, target_ttft_p99_ms, vary, low, high, step, workers, routers,
         engine, repeats, horizon, jobs, out_dir) -> None:
    """Find, per router, the cheapest setting that meets a target: how many workers, or how much KV per worker.

    The analytic block model screens the range; simulation confirms by bisection with repeats (steady state),
    and the table reports the simulated mean at the answer with its 95 % interval beside the analytic answer.
    """
    from sim.studies.plan import VARY_UNITS, PlanSpec, PlanTarget, make_grid
    from sim.studies.plan import plan as run_plan

    base, _ = load_or_exit(scenario_path)
    base = on_engine(base, engine)
    overrides: dict[str, object] = {}
    if prefixes is not None:
        overrides["workload.prefixes"] = prefixes
    if zipf is not None:
        overrides.update({"workload.popularity": "zipf" if zipf > 0 else "uniform", "workload.zipf_exponent": zipf})
    if workers is not None:
        overrides["cluster.workers"] = workers
    try:
        base = base.with_overrides(**overrides) if overrides else base
        target = PlanTarget(target_hit_rate, target_ttft_p99_ms)
        low = (1.0 if vary == "workers" else 1.0) if low is None else low
        high = (64.0 if vary == "workers" else 32.0) if high is None else high
        spec = PlanSpec(vary=vary, grid=make_grid(vary, low, high, step), target=target, repeats=repeats,
                        horizon_requests=horizon, routers=tuple(routers or [base.router.name]))
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    with Progress(TextColumn("plan: {task.description}"), TimeElapsedColumn(), console=err_console,
                  transient=True) as bar:
        task = bar.add_task("screening", total=None)
        try:
            plans = run_plan(base, spec, jobs=jobs, progress=lambda msg: bar.update(task, description=msg))
        except (ScenarioError, ValueError) as err:
            raise click.ClickException(str(err)) from None
    unit = VARY_UNITS[vary]
    what = " and ".join(x for x in (f"request hit rate >= {target_hit_rate}" if target_hit_rate is not None else "",
                                    f"TTFT p99 <= {target_ttft_p99_ms} ms" if target_ttft_p99_ms is not None else "") if x)
    table = Table(title=f"{base.name} on {base.engine.kind}, N={base.workload.prefixes} ({base.workload.popularity}): "
                        f"cheapest {vary} for {what}")
    for col in ("router", "answer", "simulated hit rate", "simulated TTFT p99 ms", "analytic answer",
                "simulated below answer", "runs"):
        table.add_column(col, justify="left" if col == "router" else "right")
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
        rows.append(row)
    console.print(table)
    console.print(f"steady state: {horizon} measured requests per run after a discarded transient, {repeats} runs per "
                  f"candidate; intervals are 95 % over runs")
    if out_dir:
        out = Path(out_dir)
        columns = ["router", "vary", "answer", "unit", "predicted", "target", "analytic_answer", "metric",
                   "predicted_ci95"] + (["predicted_ttft_p99_ms", "target_ttft_p99_ms"]
                                        if target_hit_rate is not None and target_ttft_p99_ms is not None else [])
        write_atomic(out / "plan.csv", csv_bytes(rows, columns))
        write_atomic(out / "plan.png", plan_figure(plans, target_hit_rate=target_hit_rate,
                                                   target_ttft_p99_ms=target_ttft_p99_ms, unit=unit,
                                                   title=f"{base.name}: {what}"))
        console.print(f"wrote {out / 'plan.csv'} and {out / 'plan.png'}")
