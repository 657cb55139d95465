"""`kvsim`: the command line. Validates input at the edge, runs, prints, and writes files atomically."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import click
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.analytic import formula_hit_rate
from sim.reference import load_reference, measured
from sim.report import (
    SUMMARY_COLUMNS, aggregate, csv_bytes, hit_rate_figure, plan_figure, replay_figure, ttft_cdf_figure, write_atomic,
)
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
              help="Write DIR/summary.csv (a row per run), DIR/hit_rate.png and DIR/ttft_cdf.png.")
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
        outcomes = run_sweep(base, points, jobs=jobs, progress=lambda: bar.advance(task))
    rows = [o.row for o in outcomes]

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
        write_atomic(out / "ttft_cdf.png", ttft_cdf_figure(outcomes, title=f"{base.name}: TTFT distribution"))
        console.print(f"wrote {out / 'summary.csv'} ({len(rows)} rows), {out / 'hit_rate.png'} and {out / 'ttft_cdf.png'}")


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


def _holdout(ctx: click.Context, param: click.Parameter, value: str | None):
    if not value:
        return None
    key, sep, values = value.partition("=")
    if not sep or key not in ("workers", "prefixes", "concurrency"):
        raise click.BadParameter(f"{value!r}: expected workers=..., prefixes=... or concurrency=..., e.g. prefixes=7,12")
    try:
        chosen = {int(v) for v in values.split(",") if v.strip()}
    except ValueError:
        raise click.BadParameter(f"{value!r}: the values must be whole numbers") from None
    return key, chosen


@main.command()
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None,
              help="Scenario to calibrate. Default: the built-in service-baseline scenario.")
@click.option("--measured", "measured_path", type=click.Path(dir_okay=False), default=None,
              help="Measured figures (tidy CSV: workers, prefixes, concurrency, metric, value, unit, aggregation). "
                   "Default: the scenario's reference, unless --runs are given.")
@click.option("--runs", "run_paths", multiple=True, type=click.Path(dir_okay=False),
              help="Measured run CSVs (with sidecars) to fit to; repeatable.")
@click.option("--ttft", "ttft_source", type=click.Choice(["client", "server"]), default="client", show_default=True,
              help="For --runs: fit the client-timed TTFT, or the server's queue + time to first token.")
@click.option("--fit", "fit_params", default=None,
              help="Parameters to fit, comma-separated (time_model.<field>, cluster.request_overhead_s, "
                   "device.<name>.speed, device.<name>.sharing_efficiency). Default: the scenario's calibration.parameters.")
@click.option("--holdout", callback=_holdout, default=None,
              help="Measured points to report but not fit, e.g. prefixes=7,12 or concurrency=8.")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Simulated runs per measured point and evaluation.")
@click.option("--starts", type=click.IntRange(min=0), default=12, show_default=True, help="Quasi-random starting points scored before refining.")
@click.option("--refine", type=click.IntRange(min=1), default=2, show_default=True, help="Best starts refined by least squares.")
@click.option("--max-evaluations", type=click.IntRange(min=1), default=60, show_default=True, help="Objective evaluations per refinement.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes. Default: all cores.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="Write the fitted scenario (YAML) here.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Write the residuals (CSV: point, metric, measured, predicted, error, used_in_fit) here.")
def calibrate(scenario_path, measured_path, run_paths, ttft_source, fit_params, holdout, repeats, starts, refine,
              max_evaluations, jobs, out_path, report_path) -> None:
    """Fit the step-time model (and per-request overheads, device speeds) to measured latencies.

    Every evaluation simulates each measured point with fixed seeds, so the same inputs give the same
    parameters. The fitted scenario records which points were fitted and the residuals; the table shows
    measured vs predicted for every figure, fitted or held out. Takes a few minutes.
    """
    from sim.calibrate import fit, parameter_bounds, read_parameter, targets_from_reference, targets_from_runs
    from sim.run_csv import RunFileError, read_run

    base, path = _load(scenario_path)
    ref_path = Path(measured_path) if measured_path else (
        path.parent / base.reference if base.reference and not run_paths else None)
    if ref_path is None and not run_paths:
        raise click.BadParameter("the scenario has no reference: give --measured or --runs", param_hint="--measured")
    targets = []
    if ref_path is not None:
        try:
            targets += targets_from_reference(load_reference(ref_path))
        except (OSError, ValueError) as err:
            raise click.ClickException(f"--measured: cannot read {ref_path}: {err}") from None
    try:
        runs = [read_run(p) for p in run_paths]
        targets += targets_from_runs(runs, ttft_source=ttft_source)
    except RunFileError as err:
        raise click.ClickException(str(err)) from None
    if not targets:
        raise click.ClickException("the measurements hold no TTFT or throughput figures to fit")
    params = [p.strip() for p in fit_params.split(",") if p.strip()] if fit_params else list(base.calibration.parameters)
    if holdout:
        key, chosen = holdout
        index = {"workers": 0, "prefixes": 1, "concurrency": 2}[key]
        is_held_out = lambda t: t.point[index] in chosen  # noqa: E731
    else:
        is_held_out = lambda t: False  # noqa: E731
    try:
        for p in params:
            parameter_bounds(p)
            read_parameter(base, p)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--fit") from None

    with Progress(TextColumn("calibrate: {task.description}"), TimeElapsedColumn(), console=err_console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=None)
        try:
            result = fit(base, targets, params, holdout=is_held_out, repeats=repeats, runs=runs,
                         ttft_source=ttft_source, jobs=jobs, starts=starts,
                         refine=refine, max_evaluations=max_evaluations,
                         progress=lambda n, r: bar.update(task, description=f"evaluation {n}, rms log error {r:.3f}"))
        except ValueError as err:
            raise click.ClickException(str(err)) from None

    table = Table(title=f"{base.name}: measured vs predicted after {result.evaluations} evaluations")
    for col in ("point", "metric", "measured", "predicted", "error", "used"):
        table.add_column(col, justify="left" if col in ("point", "metric", "used") else "right")
    for r in result.residuals:
        w, n, c = r.target.point
        where = f"{w} workers, N={n}, C={c}"
        table.add_row(where if r.target.case == f"{w}/{n}/{c}" else f"{r.target.case} ({where})", r.target.metric, f"{r.target.measured:.1f}",
                      f"{r.predicted:.1f}", f"{100 * r.error:+.1f} %", "fit" if r.used_in_fit else "held out")
    console.print(table)
    for name, value in result.parameters.items():
        console.print(f"  {name} = {value:.4g}  (was {result.initial[name]:.4g})")
    fit_err = result.rms_log_error(used_in_fit=True)
    hold_err = result.rms_log_error(used_in_fit=False)
    console.print(f"RMS log error: fitted {fit_err:.3f}" + ("" if math.isnan(hold_err) else f", held out {hold_err:.3f}"))

    def labels(used: bool) -> list[str]:
        by_case: dict[str, list[str]] = {}
        for r in result.residuals:
            if r.used_in_fit == used:
                by_case.setdefault(r.target.case, []).append(r.target.metric)
        return [f"{case}: {', '.join(m)}" for case, m in sorted(by_case.items())]

    fitted = result.scenario.model_copy(update={"calibration": base.calibration.model_copy(update={
        "parameters": params, "fitted_on": labels(True), "held_out": labels(False),
        "fit_rms_log_error": round(fit_err, 4),
        "holdout_rms_log_error": None if math.isnan(hold_err) else round(hold_err, 4),
    })})
    out = Path(out_path)
    if base.reference is not None:  # keep pointing at the same file from where the fitted scenario is written
        own_reference = (path.parent / base.reference).resolve()
        fitted = fitted.model_copy(update={"reference": os.path.relpath(own_reference, out.resolve().parent)})
    sources = ([ref_path.name] if ref_path else []) + [Path(p).name for p in run_paths]
    header = (f"# Calibrated by `kvsim calibrate` from {path.name} against {', '.join(sources)}.\n"
              f"# Fitted: {', '.join(f'{k} = {v:.4g}' for k, v in result.parameters.items())}.\n")
    write_atomic(out, (header + yaml.safe_dump(fitted.model_dump(mode="json"), sort_keys=False)).encode())
    if report_path:
        rows = [{"point": r.target.case, "metric": r.target.metric,
                 "measured": r.target.measured, "predicted": r.predicted, "error": r.error,
                 "used_in_fit": r.used_in_fit} for r in result.residuals]
        write_atomic(Path(report_path), csv_bytes(rows, list(rows[0])))
    console.print(f"wrote {out}" + (f" and {report_path}" if report_path else ""))


@main.command()
@click.option("--endpoint", "endpoints", multiple=True, required=True,
              help="Server base URL (http://HOST:PORT); repeat for each worker. Order = worker index.")
@click.option("--prefixes", type=click.IntRange(min=1), required=True, help="Distinct shared prefixes N.")
@click.option("--concurrency", type=click.IntRange(min=1), required=True, help="Requests kept in flight (closed loop).")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Measured requests. Default: the scenario's max(min_requests, requests_per_prefix x N).")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None,
              help="Scenario whose workload (prefix, tail and output tokens, warm-ups) and seed to use.")
@click.option("--router", default="random", show_default=True, help="Client-side router (one that needs no cache state).")
@click.option("--prefix-tokens", type=click.IntRange(min=0), default=None, help="Override the scenario's prefix tokens.")
@click.option("--tail-tokens", type=click.IntRange(min=1), default=None, help="Override the scenario's tail tokens.")
@click.option("--output-tokens", type=click.IntRange(min=1), default=None, help="Override the scenario's output tokens.")
@click.option("--seed", type=int, default=None, help="Stream seed. Default: the scenario's.")
@click.option("--max-token-id", type=click.IntRange(min=4), default=8191, show_default=True,
              help="Largest token id in prompts (vocabulary size - 1); ids start at 3.")
@click.option("--model", default=None, help="Model name for requests. Default: the first one /v1/models lists.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=120.0, show_default=True,
              help="Seconds before a silent request is abandoned (and retried).")
@click.option("--retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Retries of a failed request (connection error, timeout, HTTP 5xx/429).")
@click.option("--no-reset", is_flag=True, help="Do not POST /reset_prefix_cache before the run.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="Run CSV to write; the setup goes to the sidecar with the same stem and .json.")
def measure(endpoints, prefixes, concurrency, requests, scenario_path, router, prefix_tokens, tail_tokens,
            output_tokens, seed, max_token_id, model, timeout_s, retries, no_reset, out_path) -> None:
    """Send real servers exactly the stream kvsim simulates, and write a run CSV + sidecar.

    Warm-ups (one per prefix) go first, one at a time; then CONCURRENCY requests stay in flight, each on a new
    connection, routed on the client. TTFT is timed at the first streamed chunk; cached tokens come from
    usage.prompt_tokens_details (vLLM needs --enable-prompt-tokens-details); /metrics counters are read before
    and after. Exits non-zero if any request failed after its retries.
    """
    from sim.measure import MeasureConfig
    from sim.measure import measure as run_measure
    from sim.openai_client import Endpoint, EndpointError
    from sim.run_csv import sidecar_path, write_run_bytes

    base, _ = _load(scenario_path)
    allowed = [n for n in _router_names()]
    if router not in allowed:
        raise click.BadParameter(f"unknown router {router}; allowed: {', '.join(allowed)}", param_hint="--router")
    try:
        eps = [Endpoint.parse(e) for e in endpoints]
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--endpoint") from None
    overrides = {"workload.prefixes": prefixes, "workload.concurrency": concurrency}
    for key, value in (("prefix_tokens", prefix_tokens), ("tail_tokens", tail_tokens), ("output_tokens", output_tokens)):
        if value is not None:
            overrides[f"workload.{key}"] = value
    if requests is not None:
        overrides.update({"workload.min_requests": requests, "workload.requests_per_prefix": 0})
    try:
        workload = base.with_overrides(**overrides).workload
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    cfg = MeasureConfig(endpoints=eps, workload=workload, router=router,
                        router_options=base.router.options if router == base.router.name else {},
                        seed=base.seed if seed is None else seed, max_token_id=max_token_id, model=model,
                        timeout_s=timeout_s, retries=retries, reset_cache=not no_reset)
    total = workload.num_requests + workload.prefixes * workload.warmup_per_prefix
    with Progress(TextColumn("measure"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("requests", total=total)
        try:
            rows, setup = run_measure(cfg, progress=lambda: bar.advance(task))
        except (EndpointError, ValueError) as err:
            raise click.ClickException(str(err)) from None
    out = Path(out_path)
    csv_data, side_data = write_run_bytes(rows, setup)
    write_atomic(out, csv_data)
    write_atomic(sidecar_path(out), side_data)
    measured_rows = [r for r in rows if not r["warmup"] and not r["error"]]
    hits = sum(1 for r in measured_rows if r["cached_tokens"] > 0)
    console.print(f"wrote {out} and {sidecar_path(out).name}: {len(measured_rows)} measured requests, "
                  f"request hit rate {hits / max(1, len(measured_rows)):.3f}, "
                  f"{setup['measured_duration_s']:.1f} s")
    if setup["failed_requests"]:
        first = next(r["error"] for r in rows if r["error"])
        raise click.ClickException(f"{setup['failed_requests']} request(s) failed after retries; first: {first}")


def _tolerances(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
    from sim.validate import Tolerance

    try:
        return [Tolerance.parse(v) for v in values]
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(dir_okay=False), metavar="RUN.csv...")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None,
              help="Base scenario for what a run does not describe (time model, devices). Default: the built-in one.")
@click.option("--routing", type=click.Choice(["recorded", "simulated"]), default="recorded", show_default=True,
              help="recorded: each request goes to the worker it went to; simulated: the run's router decides.")
@click.option("--ttft", "ttft_source", type=click.Choice(["client", "server"]), default="client", show_default=True,
              help="Compare the client-timed TTFT, or the server's queue + time to first token with kvsim's engine "
                   "queue + prefill (needs the server_ttft_ms and server_queue_ms columns).")
@click.option("--tolerance", "tolerances", multiple=True, callback=_tolerances,
              help="METRIC=LIMIT, absolute (request_hit_rate=0.03) or relative (ttft_p50_ms=25%); repeatable. "
                   "Exit 1 if a figure is outside.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write one row per (run, metric): run, metric, measured, predicted, error.")
def validate(runs, scenario_path, routing, ttft_source, tolerances, out_path) -> None:
    """Simulate measured runs (run CSV + JSON sidecar, see README) and compare kvsim's prediction with them.

    Rates are compared in points (predicted - measured), times in ms and throughput in requests/s; the
    relative error is shown beside.
    """
    from sim.run_csv import RunFileError, read_run
    from sim.validate import compare

    base, _ = _load(scenario_path)
    loaded = []
    for path in runs:
        try:
            loaded.append(read_run(path))
        except RunFileError as err:
            raise click.ClickException(str(err)) from None
    comparisons = []
    for run in loaded:
        try:
            comparisons += compare(base, run, routing=routing, ttft_source=ttft_source)
        except (ScenarioError, ValueError) as err:
            raise click.ClickException(str(err)) from None
    table = Table(title=f"measured vs kvsim ({routing} routing, {ttft_source} TTFT, base scenario {base.name})")
    for col in ("run", "metric", "measured", "predicted", "error", "relative", "check"):
        table.add_column(col, justify="left" if col in ("run", "metric", "check") else "right")
    failed = []
    for c in comparisons:
        bad = [t for t in tolerances if t.violated_by(c)]
        check = "" if not any(t.metric == c.metric for t in tolerances) else ("FAIL" if bad else "ok")
        if bad:
            failed.append(c)
        spec = ".3f" if c.metric in ("request_hit_rate", "full_hit_rate", "token_hit_rate") else ".1f"
        table.add_row(c.run, c.metric, _fmt(c.measured, spec), _fmt(c.predicted, spec), _fmt(c.error, "+" + spec),
                      _fmt(100 * c.relative_error, "+.1f") + " %", check)
    console.print(table)
    if out_path:
        rows = [{"run": c.run, "metric": c.metric, "measured": c.measured, "predicted": c.predicted,
                 "error": c.error} for c in comparisons]
        write_atomic(Path(out_path), csv_bytes(rows, ["run", "metric", "measured", "predicted", "error"]))
        console.print(f"wrote {out_path}")
    if failed:
        worst = failed[0]
        raise click.ClickException(f"{len(failed)} figure(s) outside tolerance, e.g. {worst.run} {worst.metric}: "
                                   f"measured {worst.measured:.4g}, predicted {worst.predicted:.4g}")


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
@click.option("--router", "routers", callback=_router_list, default=None,
              help="Routers to plan for, comma-separated. Default: the scenario's.")
@click.option("--repeats", type=click.IntRange(min=2), default=3, show_default=True, help="Simulated runs per candidate.")
@click.option("--horizon", type=click.IntRange(min=50), default=1000, show_default=True,
              help="Measured requests per simulated run, after a discarded transient that lets every reachable "
                   "(worker, prefix) pair be visited (steady state).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes. Default: all cores.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/plan.csv (a row per router) and DIR/plan.png.")
def plan(scenario_path, prefixes, zipf, target_hit_rate, target_ttft_p99_ms, vary, low, high, step, workers, routers,
         repeats, horizon, jobs, out_dir) -> None:
    """Find, per router, the cheapest setting that meets a target: how many workers, or how much KV per worker.

    The analytic block model screens the range; simulation confirms by bisection with repeats (steady state),
    and the table reports the simulated mean at the answer with its 95 % interval beside the analytic answer.
    """
    from sim.plan import VARY_UNITS, PlanSpec, PlanTarget, make_grid
    from sim.plan import plan as run_plan

    base, _ = _load(scenario_path)
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
    table = Table(title=f"{base.name}, N={base.workload.prefixes} ({base.workload.popularity}): cheapest {vary} for {what}")
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


@main.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--workers", type=click.IntRange(min=1), required=True, help="Number of workers.")
@click.option("--kv-tokens", type=click.IntRange(min=1), default=None,
              help="Usable KV capacity per worker in tokens (blocks = tokens / block size, plus vLLM's null block).")
@click.option("--kv-blocks", type=click.IntRange(min=2), default=None,
              help="KV blocks per worker as vLLM counts them (num_gpu_blocks, null block included).")
@click.option("--kv-bytes", type=click.IntRange(min=1), default=None,
              help="KV bytes per worker (with the scenario's model.kv_bytes_per_token).")
@click.option("--router", callback=_router_list, default=None, help="Router. Default: the scenario's (round-robin).")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None,
              help="Engine, time model and devices. Default: the built-in trace-replay scenario (Dynamo mocker-like).")
@click.option("--block-size", type=click.IntRange(min=1), default=None,
              help="Engine block size in tokens; must divide --trace-block-size. Default: the scenario's (64).")
@click.option("--trace-block-size", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens per hash id in the trace (Mooncake: 512).")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Replay speed: arrival times are divided by it.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N requests.")
@click.option("--bin", "bin_s", type=click.FloatRange(min=0.001), default=60.0, show_default=True,
              help="Seconds of trace time per point of the figure.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/summary.csv (one row), DIR/workers.csv and DIR/replay.png.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes to split the workers over, for routers that ignore the cluster's state (round-robin, "
                   "random); same results. Default: all cores.")
def replay(trace, workers, kv_tokens, kv_blocks, kv_bytes, router, scenario_path, block_size, trace_block_size,
           speed, limit, bin_s, out_dir, jobs) -> None:
    """Replay a Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids) open loop.

    Every request is sent at its timestamp (divided by --speed), routed then, and served by vLLM-like workers.
    Reported: prefix reuse = cached prompt tokens / prompt tokens (Dynamo's prefix_cache_reused_ratio), vLLM's
    token hit rate (prefix_cache_hits / queries), request hit rate, TTFT percentiles, throughput and the load of
    each worker. Memory stays bounded by the caches and the requests in flight, whatever the trace's length.
    With a router that ignores the cluster's state, the workers are split over --jobs processes.
    """
    import os
    import time as _time

    from sim.replay import replay as run_replay
    from sim.scenario import builtin_scenario_path
    from sim.traces import TraceError, read_mooncake

    base, _ = _load(scenario_path or str(builtin_scenario_path("trace-replay")))
    given = [x for x in (kv_tokens, kv_blocks, kv_bytes) if x is not None]
    if len(given) > 1:
        raise click.BadParameter("give only one of --kv-tokens, --kv-blocks, --kv-bytes", param_hint="--kv-tokens")
    B = block_size or base.engine.block_size
    overrides: dict[str, object] = {"cluster.workers": workers, "engine.block_size": B}
    if kv_tokens is not None:
        overrides["engine.num_gpu_blocks_override"] = kv_tokens // B + 1
    elif kv_blocks is not None:
        overrides["engine.num_gpu_blocks_override"] = kv_blocks
    elif kv_bytes is not None:
        overrides.update({"engine.kv_cache_bytes": kv_bytes, "engine.num_gpu_blocks_override": None})
    if router is not None:
        if len(router) != 1:
            raise click.BadParameter("give one router", param_hint="--router")
        overrides.update({"router.name": router[0], "router.options": {}})
    try:
        scenario = base.with_overrides(**overrides)
        t0 = _time.perf_counter()
        result = run_replay(scenario, lambda: read_mooncake(trace, block_size=B, trace_block_tokens=trace_block_size,
                                                            speed=speed, limit=limit),
                            bin_s=bin_s, jobs=jobs or os.cpu_count() or 1)
        wall_s = _time.perf_counter() - t0
    except (ScenarioError, TraceError) as err:
        raise click.ClickException(str(err)) from None
    st = result.stats
    queries = sum(w.prefix_cache.queries for w in result.workers)
    hits = sum(w.prefix_cache.hits for w in result.workers)
    row = {
        "requests": st.requests, "rejected": result.rejected, "prefix_reuse": st.prefix_reuse,
        "token_hit_rate": hits / queries if queries else float("nan"), "request_hit_rate": st.request_hit_rate,
        "ttft_p50_ms": st.ttft_ms.percentile(50), "ttft_p90_ms": st.ttft_ms.percentile(90),
        "ttft_p99_ms": st.ttft_ms.percentile(99), "e2e_p50_ms": st.e2e_ms.percentile(50),
        "throughput_rps": st.throughput_rps, "preemptions": sum(w.preemptions for w in result.workers),
        "evicted_blocks": sum(w.evicted_blocks for w in result.workers), "simulated_s": result.simulated_s,
        "wall_s": wall_s, "jobs": result.jobs, "workers": workers, "kv_blocks_per_worker": scenario.num_gpu_blocks, "block_size": B,
        "router": scenario.router.name,
    }
    table = Table(title=f"replay of {Path(trace).name}: {workers} workers x {scenario.num_gpu_blocks - 1} blocks of "
                        f"{B} tokens, {scenario.router.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in row.items():
        table.add_row(key, _fmt(value, ".4g") if isinstance(value, float) else str(value))
    console.print(table)
    load = Table(title="per worker")
    for col in ("worker", "requests", "share of prompt tokens", "token hit rate", "preemptions"):
        load.add_column(col, justify="right")
    worker_rows = []
    for w, n, tokens in zip(result.workers, st.requests_per_worker, st.prompt_tokens_per_worker):
        p = w.prefix_cache
        worker_rows.append({"worker": w.worker, "requests": n, "prompt_tokens": tokens,
                            "token_hit_rate": p.hits / p.queries if p.queries else float("nan"),
                            "preemptions": w.preemptions})
        load.add_row(str(w.worker), str(n), f"{tokens / max(1, st.prompt_tokens):.3f}",
                     _fmt(worker_rows[-1]["token_hit_rate"]), str(w.preemptions))
    console.print(load)
    console.print(f"{st.requests} requests in {wall_s:.2f} s wall = {st.requests / wall_s:.0f} requests/s")
    if out_dir:
        out = Path(out_dir)
        write_atomic(out / "summary.csv", csv_bytes([row], list(row)))
        write_atomic(out / "workers.csv", csv_bytes(worker_rows, list(worker_rows[0])))
        write_atomic(out / "replay.png", replay_figure(st, title=f"{Path(trace).name}: {workers} workers, "
                                                                  f"{scenario.router.name}"))
        console.print(f"wrote {out / 'summary.csv'}, {out / 'workers.csv'} and {out / 'replay.png'}")


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
