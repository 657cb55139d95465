"""`kvsim compare`: every router (or a list) on one workload, the same request stream, repeats with intervals."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import click

from sim.cli.app import (
    ENGINE_HELP, NEEDS_A_RECORDING, SHARED_FIRST_BLOCK, SLO_HELP, checked_out_dir, console, executor_options, fmt,
    hit_rates_legend, int_list, load_or_exit, main, on_engine, one_engine, router_list, router_names, scenario_option,
    setup_text, slo_option, with_slo,
)
from sim.cli.render import Table, format_option
from sim.cli.replaying import trace_base, trace_overrides
from sim.cli.verdicts import lead_text, marked, own_policy_note
from sim.results.output_set import write_output_set
from sim.results.report import SUMMARY_COLUMNS, csv_bytes
from sim.results.study_figures import compare_bars_figure, compare_figure
from sim.scenario import ScenarioError

OPTIONAL_COLUMNS = (
    ("goodput_rps", "goodput req/s", ".2f"), ("goodput_fraction", "goodput share", ".3f"),
    ("imbalance_max_mean", "load max/mean", ".2f"), ("jain_index", "Jain", ".3f"),
)
"""Columns shown when the rows have them (the SLO and balance columns of newer summaries)."""


def _pm(agg: dict, metric: str, spec: str) -> str:
    """`mean ± ci95` of a metric of an aggregated row ('-' when absent, no ± when a single run)."""
    mean = agg.get(metric)
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    half = agg.get(f"{metric}_ci95", math.nan)
    return format(mean, spec) + ("" if math.isnan(half) else f" ± {format(half, spec)}")


@main.command()
@scenario_option(default="the built-in service-baseline scenario (trace-replay with --trace)")
@click.option("--prefixes", callback=int_list, default=None,
              help="Distinct shared prefixes N, one or comma-separated (the built-in workload; not with --trace).")
@click.option("--workers", callback=int_list, default=None, help="Worker counts, one or comma-separated. Default: the scenario's.")
@click.option("--concurrency", callback=int_list, default=None,
              help="Requests in flight (closed loop), one or comma-separated. Default: the scenario's. Not with --trace.")
@click.option("--router", "routers", callback=router_list, default=None,
              help="Routers, comma-separated: NAME or NAME:key=value,... (a token without = starts the next router; "
                   "see `kvsim routers`). Default: every router but recorded.")
@click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Runs per router and point; repeat r uses seed + r, the same for every router.")
@click.option("--seed", type=int, default=None, help="Base seed. Default: the scenario's.")
@executor_options
@click.option("--trace", "trace_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A Mooncake JSONL trace: the workload is the trace, replayed open loop for each router "
                   "(as `kvsim replay`).")
@click.option("--kv-tokens", type=click.IntRange(min=1), default=None,
              help="With --trace: usable KV capacity per worker in tokens. Default: the scenario's.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="With --trace: replay only the first N requests.")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="With --trace: arrival times are divided by it.")
@click.option("--trace-block-size", type=click.IntRange(min=1), default=512, show_default=True,
              help="With --trace: tokens per hash id in the trace (Mooncake: 512).")
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/compare.csv (a row per router and point), DIR/summary.csv (a row per run), "
                   "DIR/compare.png (hit rate vs TTFT p99) and DIR/compare_hit_rate.png (hit rate per router), then "
                   "DIR/manifest.json listing them; every finished run is journaled in DIR/runs.jsonl.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue the comparison journaled in --out DIR/runs.jsonl: skip its finished runs.")
@format_option("the rows of compare.csv (a row per router and point)")
@click.pass_context
def compare(ctx, scenario_path, prefixes, workers, concurrency, routers, engine, repeats, seed, jobs, executor_kind,
            dask_scheduler, trace_path, kv_tokens, limit, speed, trace_block_size, slo, out_dir, resume) -> None:
    """Compare routers on one workload: every router sees the same request stream (repeat r: seed + r).

    Per point (workers, N, concurrency) a table of the routers by request hit rate, highest first: mean ± 95 %
    t-interval over the repeats of the hit rate, token hit rate, TTFT p50 and p99 and throughput; the fraction of
    the bound min(1, W·C/N) (C = KV tokens per worker / prompt tokens: the prompts one worker holds) the router
    reaches; ★ marks the Pareto frontier (no other router has both a higher hit rate and a lower TTFT p99). With
    --trace the hit rate is the prefix reuse (cached / prompt tokens) and the bound the reuse available (one
    infinite cache shared by the cluster). Below each table, on the hit rate and on throughput (goodput with
    --slo): the leader only when its 95 % interval does not overlap the runner-up's, else which routers are
    indistinguishable at this number of repeats and an estimate of the repeats that would separate them.
    """
    from sim.studies.compare import aggregate_routers, compare_columns

    if trace_path is None:
        for name, value in (("--kv-tokens", kv_tokens), ("--limit", limit)):
            if value is not None:
                raise click.UsageError(f"{name} goes with --trace")
    else:
        for name, value in (("--prefixes", prefixes), ("--concurrency", concurrency)):
            if value is not None:
                raise click.UsageError(f"{name} does not apply to --trace (the trace fixes the prompts and when "
                                       "they are sent)")
    if routers is None:
        routers = [n for n in router_names() if n not in NEEDS_A_RECORDING]
    from sim.cli.study_runs import resume_command

    out = checked_out_dir(out_dir)
    runs = dict(out=out, resume=resume, executor_kind=executor_kind, jobs=jobs, dask_scheduler=dask_scheduler,
                command=resume_command(ctx))

    primary = "prefix_reuse"
    if trace_path is None:
        base, _ = load_or_exit(scenario_path)
        base = with_slo(on_engine(base, engine), slo)
        if base.has_sessions:
            # NOTE: sessions: the point is (workers, groups, sessions at once); no formula, the bound is the reuse
            # available, as for a trace.
            prefixes = prefixes or [base.workload.groups]
            concurrency = concurrency or [base.workload.concurrent_sessions or 0]
            capacity, primary = None, "token_hit_rate"
        else:
            if prefixes is None:
                raise click.UsageError("give --prefixes (the built-in workload) or --trace FILE")
            capacity = base.kv_capacity_requests
        rows = _run_builtin(base, prefixes, workers, concurrency, routers, repeats, seed, runs)
        what = f"{base.name}"
        setup = setup_text(base, workers=workers)
    else:
        base = with_slo(trace_base(scenario_path, engine), slo)
        overrides, B = trace_overrides(base, block_size=None, kv_tokens=kv_tokens, kv_blocks=None, kv_bytes=None,
                                       reuse_breakdown=True)
        try:
            base = base.with_overrides(**overrides)
        except ScenarioError as err:
            raise click.ClickException(str(err)) from None
        rows = _run_trace(base, trace_path, B, trace_block_size, speed, limit, workers, routers, repeats, seed, runs)
        capacity = None
        what = f"{Path(trace_path).name} ({base.capacity_tokens:,} KV tokens per worker)"
        setup = setup_text(base, "--kv-tokens" if kv_tokens else "the scenario's", workers)

    from sim.studies.tune import default_objective

    aggregated = aggregate_routers(rows, capacity_requests=capacity, primary_metric=primary,
                                   objective=default_objective(base).column)
    _print_tables(aggregated, what=f"{what}: {setup}", capacity=capacity, repeats=repeats,
                  sessions=primary == "token_hit_rate")
    console.data(aggregated, compare_columns(aggregated))
    if out is not None:
        extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in SUMMARY_COLUMNS]
        intervals = f"mean ± 95% CI over {repeats} runs" if repeats > 1 else "1 run: no interval"
        # NOTE: the figures label routers as the tables do, kvsim's own policy marked and the mark explained.
        labelled = [{**a, "router": marked(str(a["router"]))} for a in aggregated]
        note = own_policy_note([str(a["router"]) for a in aggregated], figure=True)
        note = f"\n{note}" if note else ""
        files = {
            "compare.csv": csv_bytes(aggregated, compare_columns(aggregated)),
            "summary.csv": csv_bytes(rows, [*SUMMARY_COLUMNS, *extra]),
            "compare.png": compare_figure(
                labelled, capacity_requests=capacity,
                title=f"{what}: {'prefix reuse' if capacity is None else 'hit rate'} against TTFT p99 per router "
                      f"({intervals}){note}"),
            "compare_hit_rate.png": compare_bars_figure(
                labelled, capacity_requests=capacity,
                title=f"{what}: {'prefix reuse' if capacity is None else 'request hit rate'} per router ({intervals})"
                      f"{note}"),
        }
        written = write_output_set(out, files, runs=len(rows), command=resume_command(ctx))
        console.print(f"wrote {', '.join(map(str, written))} ({len(aggregated)} routers x points, {len(rows)} runs)")


def _run_builtin(base, prefixes, workers, concurrency, routers, repeats, seed, runs: dict) -> list[dict]:
    from sim.cli.study_runs import run_sweep_points
    from sim.studies.sweep import sweep_points

    points = sweep_points(
        workers=workers or [base.cluster.workers], prefixes=prefixes,
        concurrency=concurrency or [base.workload.concurrency], routers=routers, repeats=repeats,
        seed=base.seed if seed is None else seed,
    )
    try:
        outcomes = run_sweep_points("compare", base, points, **runs)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    return [o.row for o in outcomes]


def _run_trace(base, trace_path, block_size, trace_block_size, speed, limit, workers, routers, repeats, seed,
               runs: dict) -> list[dict]:
    from sim.cli.study_runs import run_journaled
    from sim.studies.compare import run_trace, trace_points
    from sim.workloads.traces import TraceError, read_mooncake

    points = trace_points(workers=workers or [base.cluster.workers], routers=routers, repeats=repeats,
                          seed=base.seed if seed is None else seed)
    # NOTE: a partial of a module-level function pickles, so each process opens the trace itself.
    open_trace = functools.partial(read_mooncake, trace_path, block_size=block_size,
                                   trace_block_tokens=trace_block_size, speed=speed, limit=limit)
    try:
        return run_journaled(
            "compare", base, points,
            run=lambda ex, todo, step, on: run_trace(base, todo, open_trace, executor=ex, progress=step, on_row=on),
            to_json=lambda row: row, from_json=lambda point, row: row,
            inputs=repr((str(Path(trace_path).resolve()), block_size, trace_block_size, speed, limit)), **runs)
    except (ScenarioError, TraceError) as err:
        raise click.ClickException(str(err)) from None


def _print_tables(aggregated: list[dict], *, what: str, capacity: float | None, repeats: int,
                  sessions: bool = False) -> None:
    from sim.studies.compare import POINT_KEYS, interval_of, lead

    trace = capacity is None
    optional = [c for c in OPTIONAL_COLUMNS if any(c[0] in a for a in aggregated)]
    points: dict[tuple, list[dict]] = {}
    for agg in aggregated:
        points.setdefault(tuple(agg[k] for k in POINT_KEYS), []).append(agg)
    for (workers, n, conc), block in points.items():
        first = block[0]
        runs = f"mean ± 95% CI over {repeats} runs" if repeats > 1 else "1 run: no interval"
        if sessions:
            title = f"{what}: {workers} workers, {n} groups, {f'{conc} sessions at once' if conc else 'Poisson sessions'} ({runs})"
            caption = (f"bound: reuse available (one infinite cache shared by the workers) = {fmt(first['bound'])}; "
                       "of bound = token hit / bound")
        elif trace:
            title = f"{what}, {workers} workers ({runs})"
            caption = (f"bound: reuse available (one infinite cache shared by the workers) = {fmt(first['bound'])}; "
                       "of bound = prefix reuse / bound")
        else:
            title = f"{what}: {workers} workers, N = {n}, concurrency {conc} ({runs})"
            caption = (f"bound min(1, W·C/N) = min(1, {workers}·{capacity:.2f}/{n}) = {first['bound']:.3f} "
                       f"(C: prompts one worker's KV holds); random routing min(1, C/N) = "
                       f"{first['random_expectation']:.3f}; of bound = hit rate / bound")
        table = Table(title=title, caption=caption)
        first_col = "token hit" if sessions else "prefix reuse" if trace else "hit rate"
        cols = ["front", "router", first_col, "request hit" if trace else "token hit", "of bound", "TTFT p50 ms",
                "TTFT p99 ms", "req/s", "max share", *(c[1] for c in optional)]
        for col in cols:
            named = col in ("router", "front")
            table.add_column(col, justify="left" if named else "right", key=named)
        for agg in block:
            table.add_row(
                "★" if agg["on_front"] else "", marked(str(agg["router"])),
                _pm(agg, agg["primary_metric"], ".3f"),
                _pm(agg, "request_hit_rate" if trace else "token_hit_rate", ".3f"),
                fmt(agg["fraction_of_bound"], ".2f"),
                _pm(agg, "ttft_p50_ms", ".0f"), _pm(agg, "ttft_p99_ms", ".0f"),
                _pm(agg, "throughput_rps", ".1f"), fmt(agg.get("max_worker_share", math.nan), ".2f"),
                *(fmt(agg.get(key, math.nan), spec) for key, _, spec in optional),
            )
        console.print(table)
        labels = [marked(str(a["router"])) for a in block]
        for metric in dict.fromkeys((first["primary_metric"], first["objective"])):
            if (found := lead(block, metric)) is not None:
                leader, st, others = found
                console.print(lead_text(metric, labels, [interval_of(a, metric) for a in block], leader, st, others,
                                        repeats, what="routers"), highlight=False)
    primary = "token hit" if sessions else "prefix reuse" if capacity is None else "hit rate"
    legend = (hit_rates_legend("request hit", "token hit") if sessions else
              f"{hit_rates_legend('request hit', 'prefix reuse')}; {SHARED_FIRST_BLOCK}" if trace else
              hit_rates_legend("hit rate", "token hit"))
    console.print(f"★ on the Pareto frontier: no other router has both a higher {primary} and a lower TTFT p99 "
                  "(at least as good in both, better in one); max share: the busiest worker's share of the requests; "
                  "a router leads only when its 95 % interval does not overlap the runner-up's; " + legend,
                  highlight=False)
    if note := own_policy_note([str(a["router"]) for a in aggregated]):
        console.print(note, highlight=False)
