"""`kvsim`: the command line. Validates input at the edge, runs, prints, and writes files atomically."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.reference import formula_hit_rate, load_reference, measured
from sim.report import SUMMARY_COLUMNS, aggregate, csv_bytes, hit_rate_figure, write_atomic
from sim.scenario import Scenario, ScenarioError, load_scenario

# NOTE: piped output (CI logs, files) gets a wide table instead of rich's 80-column default.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True)


def _router_names() -> list[str]:
    from policies import ROUTERS  # the CLI is a composition root: it may import policies

    return sorted(ROUTERS)


def _int_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of whole numbers, e.g. 2,7,12") from None
    if not items or any(v < 1 for v in items):
        raise click.BadParameter(f"{value!r}: every value must be a whole number >= 1")
    return items


def _router_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    allowed = _router_names()
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise click.BadParameter(f"unknown router {', '.join(unknown) or repr(value)}; allowed: {', '.join(allowed)}")
    return names


def _load(path: str | None) -> tuple[Scenario, Path]:
    try:
        return load_scenario(path)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


def _reference_for(scenario: Scenario, scenario_path: Path) -> dict[tuple[int, int, int], float]:
    if scenario.reference is None:
        return {}
    ref_path = scenario_path.parent / scenario.reference
    try:
        return measured(load_reference(ref_path), "request_hit_rate")
    except (OSError, ValueError) as err:
        raise click.ClickException(f"reference: cannot read {ref_path}: {err}") from None


def _fmt(value: object, spec: str = ".3f") -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else format(value, spec)
    return str(value)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="kvsim")
def main() -> None:
    """kvsim: predict prefix-cache hit rate, TTFT and throughput of LLM serving workers under a router.

    A worker is a vLLM v1 engine (block-level prefix cache, step scheduler) on a device; a scenario file
    (YAML) describes the model, engine, workload, cluster and router. Without --scenario the built-in
    `service-baseline` scenario (the measured reference experiment) is used.
    """


@main.command()
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None,
              help="Scenario YAML file. Default: the built-in service-baseline scenario.")
@click.option("--prefixes", callback=_int_list, required=True, help="Distinct shared prefixes N, comma-separated (e.g. 2,7,12,24).")
@click.option("--workers", callback=_int_list, default=None, help="Worker counts, comma-separated (e.g. 3,6). Default: the scenario's.")
@click.option("--concurrency", callback=_int_list, default=None, help="Requests in flight (closed loop), comma-separated. Default: the scenario's.")
@click.option("--router", "routers", callback=_router_list, default=None,
              help="Routers, comma-separated (see `kvsim routers`). Default: the scenario's.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Runs per point; repeat r uses seed + r.")
@click.option("--seed", type=int, default=None, help="Base seed. Default: the scenario's.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes. Default: all cores.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/summary.csv (a row per run) and DIR/hit_rate.png.")
def sweep(scenario_path, prefixes, workers, concurrency, routers, repeats, seed, jobs, out_dir) -> None:
    """Run a grid of points and compare the hit rate with the formula and the measurements.

    The table shows, per (workers, N, concurrency, router), the mean over repeats of the request hit rate
    (requests with any cached token), beside the formula min(1, C/N) with C = KV tokens per worker / prompt
    tokens, and the measured value where the scenario's reference has one (for the scenario's own router).
    """
    from sim.sweep import run_sweep, sweep_points

    base, path = _load(scenario_path)
    reference = _reference_for(base, path)
    points = sweep_points(
        workers=workers or [base.cluster.workers],
        prefixes=prefixes,
        concurrency=concurrency or [base.workload.concurrency],
        routers=routers or [base.router.name],
        repeats=repeats,
        seed=base.seed if seed is None else seed,
    )
    try:
        for point in points:
            point.scenario(base)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    out = Path(out_dir) if out_dir else None

    with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("runs", total=len(points))
        rows = run_sweep(base, points, jobs=jobs, progress=lambda: bar.advance(task))

    capacity = base.kv_capacity_requests
    aggregated = aggregate(rows)
    table = Table(title=f"{base.name}: request hit rate (mean of {repeats} run{'s' * (repeats > 1)}), C = {capacity:.2f}")
    for col in ("workers", "N", "conc", "router", "hit rate", "formula", "measured", "sim-meas",
                "full hit", "token hit", "TTFT p50 ms", "TTFT p99 ms", "req/s"):
        table.add_column(col, justify="left" if col == "router" else "right")
    errors = []
    for row in aggregated:
        key = (row["workers"], row["prefixes"], row["concurrency"])
        meas = reference.get(key) if row["router"] == base.router.name else None
        hit = float(row["request_hit_rate"])
        sd = f" ±{row['request_hit_rate_sd']:.3f}" if repeats > 1 else ""
        diff = ""
        if meas is not None:
            errors.append(hit - meas)
            diff = f"{100 * (hit - meas):+.1f} pp"
        table.add_row(
            str(row["workers"]), str(row["prefixes"]), str(row["concurrency"]), str(row["router"]),
            f"{hit:.3f}{sd}", f"{formula_hit_rate(capacity, int(row['prefixes'])):.3f}",
            "-" if meas is None else f"{meas:.3f}", diff,
            _fmt(row["full_hit_rate"]), _fmt(row["token_hit_rate"]),
            _fmt(row["ttft_p50_ms"], ".0f"), _fmt(row["ttft_p99_ms"], ".0f"), _fmt(row["throughput_rps"], ".1f"),
        )
    console.print(table)
    if errors:
        rmse = math.sqrt(sum(e * e for e in errors) / len(errors))
        console.print(f"request hit rate vs measured over {len(errors)} points: RMSE {100 * rmse:.2f} pp, "
                      f"max |error| {100 * max(abs(e) for e in errors):.2f} pp")
    if out is not None:
        write_atomic(out / "summary.csv", csv_bytes(rows, SUMMARY_COLUMNS))
        shown = {k: v for k, v in reference.items() if k[0] in {p.workers for p in points}}
        write_atomic(out / "hit_rate.png", hit_rate_figure(
            aggregated, capacity_requests=capacity, measured=shown, title=f"{base.name}: request hit rate vs prefixes"))
        console.print(f"wrote {out / 'summary.csv'} ({len(rows)} rows) and {out / 'hit_rate.png'}")


@main.command(name="run")
@click.argument("scenario_path", required=False, type=click.Path(dir_okay=False), metavar="[SCENARIO]")
@click.option("--prefixes", type=click.IntRange(min=1), default=None, help="Distinct shared prefixes N. Default: the scenario's.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Number of workers. Default: the scenario's.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None, help="Requests in flight. Default: the scenario's.")
@click.option("--router", callback=_router_list, default=None, help="Router (see `kvsim routers`). Default: the scenario's.")
@click.option("--seed", type=int, default=None, help="Seed. Default: the scenario's.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/summary.csv (one row) and DIR/requests.csv (a row per request, warm-ups flagged).")
def run_command(scenario_path, prefixes, workers, concurrency, router, seed, out_dir) -> None:
    """Run one point of SCENARIO (default: the built-in service-baseline) and print its summary."""
    from sim.runner import run
    from sim.summary import summarize

    base, _ = _load(scenario_path)
    overrides = {k: v for k, v in {
        "workload.prefixes": prefixes, "cluster.workers": workers, "workload.concurrency": concurrency,
        "seed": seed,
    }.items() if v is not None}
    if router is not None:
        if len(router) != 1:
            raise click.BadParameter("give one router", param_hint="--router")
        overrides["router.name"] = router[0]
        if router[0] != base.router.name:
            overrides["router.options"] = {}
    try:
        scenario = base.with_overrides(**overrides) if overrides else base
        result = run(scenario)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    summary = summarize(result)
    row = {"workers": result.num_workers, "prefixes": scenario.workload.prefixes,
           "concurrency": scenario.workload.concurrency, "router": scenario.router.name,
           "repeat": 0, "seed": scenario.seed, **summary.row()}
    table = Table(title=f"{scenario.name}: {result.num_workers} workers, N={scenario.workload.prefixes}, "
                        f"C={scenario.workload.concurrency}, router={scenario.router.name}, seed={scenario.seed}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in SUMMARY_COLUMNS[6:]:
        table.add_row(key, _fmt(row[key], ".4g"))
    table.add_row("formula min(1, C/N)", f"{formula_hit_rate(scenario.kv_capacity_requests, scenario.workload.prefixes):.3f}")
    console.print(table)
    workers_table = Table(title="per worker (measured phase)")
    for col in ("worker", "device", "requests", "token hit rate", "evicted blocks", "preemptions", "steps"):
        workers_table.add_column(col, justify="right")
    for w, n in zip(result.workers, summary.requests_per_worker):
        stats = w.prefix_cache
        workers_table.add_row(str(w.worker), w.device, str(n),
                              _fmt(stats.hits / stats.queries if stats.queries else float("nan")),
                              str(w.evicted_blocks), str(w.preemptions), str(w.steps))
    console.print(workers_table)
    if out_dir:
        out = Path(out_dir)
        write_atomic(out / "summary.csv", csv_bytes([row], SUMMARY_COLUMNS))
        records = [asdict(r) | {"ttft_ms": r.ttft_s * 1000, "e2e_ms": r.e2e_s * 1000} for r in result.records]
        columns = list(records[0]) if records else []
        write_atomic(out / "requests.csv", csv_bytes(records, columns))
        console.print(f"wrote {out / 'summary.csv'} and {out / 'requests.csv'} ({len(records)} requests)")


@main.command()
def routers() -> None:
    """List the routers and their options."""
    from policies import ROUTERS

    for name in sorted(ROUTERS):
        cls = ROUTERS[name]
        console.print(f"[bold]{name}[/bold]: {cls.summary}")
        for field, info in cls.Options.model_fields.items():
            console.print(f"    {field} (default {info.default!r}): {info.description}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
