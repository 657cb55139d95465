"""`kvsim calibrate`: fit the step-time model to measured TTFTs (a reference CSV and/or run CSVs)."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import click
import yaml

from sim.cli.app import (
    checked_out_file, console, executor_options, load_or_exit, main, open_executor_or_exit, progress_bar,
    scenario_option,
)
from sim.cli.render import Table, format_option
from sim.cli.study_runs import journaled_search, resume_command
from sim.config import key_value
from sim.scenario import SHIPPED
from sim.studies.reference import load_reference, reference_path
from sim.results.report import csv_bytes, write_atomic


def _holdout(ctx: click.Context, param: click.Parameter, value: str | None):
    if not value:
        return None
    form = "workers=..., prefixes=... or concurrency=..., e.g. prefixes=7,12"
    try:
        key, values = key_value(value, form)  # NOTE: one key; its value is a list (commas belong to it)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    if key not in ("workers", "prefixes", "concurrency"):
        raise click.BadParameter(f"{value!r} is not {form}")
    try:
        chosen = {int(v) for v in values.split(",") if v.strip()}
    except ValueError:
        raise click.BadParameter(f"{value!r}: the values must be whole numbers") from None
    return key, chosen


@main.command()
@scenario_option(" to calibrate (its reference CSV is the default --measured)")
@click.option("--measured", "measured_path", type=click.Path(dir_okay=False), default=None,
              help="Measured figures (tidy CSV: workers, prefixes, concurrency, metric, value, unit, aggregation). "
                   "Default: the scenario's reference, unless --runs are given.")
@click.option("--runs", "run_paths", multiple=True, type=click.Path(dir_okay=False),
              help="Measured run CSVs (with sidecars) to fit to; repeatable.")
@click.option("--ttft", "ttft_source", type=click.Choice(["client", "server"]), default="client", show_default=True,
              help="For --runs: fit the client-timed TTFT and TPOT, or the server's (queue + time to first token; TPOT "
                   "from vLLM's generation time where the run recorded it).")
@click.option("--fit", "fit_params", default=None,
              help="Parameters to fit, comma-separated (time_model.<field>, cluster.request_overhead_s, "
                   "device.<name>.speed, device.<name>.sharing_efficiency, device.<name>.host_load, device.<name>.idle_load, device.<name>.step_occupancy, device.<name>.pause_s, device.<name>.pause_fraction, device.<name>.handoff_s). Default: the scenario's calibration.parameters, else the time model's own (linear: base_s, prefill_token_s, decode_seq_s; roofline: step_overhead_s, compute_ and memory_efficiency; both with cluster.request_overhead_s).")
@click.option("--metrics", "metric_names", default=None,
              help="Fit only these measured figures, comma-separated (e.g. ttft_p50,ttft_hit_p50,throughput_rps; "
                   "any of ttft[_hit|_miss]_p50|p90|p99, e2e_p50|p90|p99, tpot_p50|p90|p99, throughput_rps); the "
                   "others are reported. Default: all but TPOT.")
@click.option("--holdout", callback=_holdout, default=None,
              help="Measured points to report but not fit, e.g. prefixes=7,12 or concurrency=8.")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Simulated runs per measured point and evaluation.")
@click.option("--starts", type=click.IntRange(min=0), default=12, show_default=True, help="Quasi-random starting points scored before refining.")
@click.option("--refine", type=click.IntRange(min=1), default=2, show_default=True, help="Best starts refined by least squares.")
@click.option("--max-evaluations", type=click.IntRange(min=1), default=60, show_default=True, help="Objective evaluations per refinement.")
@executor_options
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="Write the fitted scenario (YAML) here; every finished simulation is journaled beside it, in "
                   "<out>.runs.jsonl.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Write the residuals (CSV: point, metric, measured, predicted, error, used_in_fit) here.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue the calibration journaled in <out>.runs.jsonl: the fit replays, taking its finished "
                   "simulations from the journal (same scenario, measurements and fit options needed).")
@format_option("the residuals (the rows --report writes)")
@click.pass_context
def calibrate(ctx, scenario_path, measured_path, run_paths, ttft_source, fit_params, metric_names, holdout, repeats,
              starts, refine,
              max_evaluations, jobs, executor_kind, dask_scheduler, out_path, report_path, resume) -> None:
    """Fit the step-time model (and per-request overheads, device speeds) to measured latencies.

    Every evaluation simulates each measured point with fixed seeds, so the same inputs give the same
    parameters. The fitted scenario records which points were fitted and the residuals; the table shows
    measured vs predicted for every figure, fitted or held out. Takes a few minutes.
    """
    from sim.studies.calibrate import fit, parameter_bounds, read_parameter, targets_from_reference, targets_from_runs
    from sim.servers.run_csv import RunFileError, read_run

    checked_out_file(out_path)
    checked_out_file(report_path, "--report")
    base, path = load_or_exit(scenario_path, shared_prefix="calibrate")
    own_reference = reference_path(base, path)
    ref_path = Path(measured_path) if measured_path else (own_reference if not run_paths else None)
    if ref_path is None and not run_paths:
        raise click.BadParameter("the scenario has no reference: give --measured or --runs", param_hint="--measured")
    targets = []
    if ref_path is not None:
        source = "--measured" if measured_path else "reference"
        if not ref_path.exists():  # NOTE: calibrating needs measurements; other commands run without them
            raise click.ClickException(f"{source}: {ref_path} not found; calibrating needs measurements: give "
                                       "--measured FILE or --runs RUN.csv, or point the scenario's reference at them")
        try:
            targets += targets_from_reference(load_reference(ref_path))
        except (OSError, ValueError) as err:
            raise click.ClickException(f"{source}: cannot read {ref_path}: {err}") from None
    try:
        runs = [read_run(p) for p in run_paths]
        targets += targets_from_runs(runs, ttft_source=ttft_source)
    except RunFileError as err:
        raise click.ClickException(str(err)) from None
    if not targets:
        raise click.ClickException("the measurements hold no TTFT or throughput figures to fit")
    params = [p.strip() for p in fit_params.split(",") if p.strip()] if fit_params else base.calibration_parameters
    from sim.studies.calibrate import FITTABLE_METRICS, REPORT_ONLY_METRICS

    if metric_names:
        chosen_metrics = {m.strip().removesuffix("_ms") for m in metric_names.split(",") if m.strip()}
        unknown = sorted(chosen_metrics - FITTABLE_METRICS)
        if unknown:
            raise click.BadParameter(f"unknown metric(s) {', '.join(unknown)}; allowed: "
                                     f"{', '.join(sorted(FITTABLE_METRICS))}", param_hint="--metrics")
        report_only = frozenset(FITTABLE_METRICS - chosen_metrics)
    else:
        report_only = REPORT_ONLY_METRICS
    if holdout:
        key, chosen = holdout
        index = {"workers": 0, "prefixes": 1, "concurrency": 2}[key]
        is_held_out = lambda t: t.point[index] in chosen or t.metric in report_only  # noqa: E731
    else:
        is_held_out = lambda t: t.metric in report_only  # noqa: E731
    try:
        for p in params:
            parameter_bounds(p)
            read_parameter(base, p)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--fit") from None

    # NOTE: what the simulations and the optimiser's path depend on besides the base scenario (not --jobs or
    # --executor, which only decide where they run): the measured figures, the measured runs (requests, routing),
    # and the fit options.
    runs_digest = hashlib.sha256(repr(runs).encode()).hexdigest()
    inputs = repr((params, holdout and (holdout[0], sorted(holdout[1])), repeats, starts, refine, max_evaluations,
                   ttft_source, targets, runs_digest, sorted(report_only)))
    with journaled_search("calibrate", base, out=None, resume=resume, command=resume_command(ctx), inputs=inputs,
                          at_most=None, path=Path(f"{out_path}.runs.jsonl")) as journal, \
            progress_bar("calibrate") as step, open_executor_or_exit(executor_kind, jobs, dask_scheduler) as executor:
        step(0, note="starting")
        try:
            result = fit(base, targets, params, holdout=is_held_out, repeats=repeats, runs=runs,
                         ttft_source=ttft_source, jobs=jobs, starts=starts,
                         refine=refine, max_evaluations=max_evaluations, executor=executor, store=journal,
                         progress=lambda n, r: step(note=f"evaluation {n}, rms log error {r:.3f}"))
        except ValueError as err:
            raise click.ClickException(str(err)) from None

    table = Table(title=f"{base.name}: measured vs predicted after {result.evaluations} evaluations")
    for col in ("point", "metric", "measured", "predicted", "error", "used"):
        table.add_column(col, justify="left" if col in ("point", "metric", "used") else "right",
                         key=col in ("point", "metric"))
    for r in result.residuals:
        w, n, c = r.target.point
        where = f"{w} workers, N={n}, concurrency {c}"
        table.add_row(where if r.target.case == f"{w}/{n}/{c}" else f"{r.target.case} ({where})", r.target.metric, f"{r.target.measured:.1f}",
                      f"{r.predicted:.1f}", f"{100 * r.error:+.1f} %",
                      "fit" if r.used_in_fit else "reported" if r.target.metric in report_only else "held out")
    console.print(table)
    for name, value in result.parameters.items():
        console.print(f"  {name} = {value:.4g}  (was {result.initial[name]:.4g})")
    fit_err = result.rms_log_error(used_in_fit=True)
    hold_err = result.rms_log_error(used_in_fit=False, exclude=report_only)
    console.print(f"RMS log error: fitted {fit_err:.3f}" + ("" if math.isnan(hold_err) else f", held out {hold_err:.3f}"))

    def labels(used: bool) -> list[str]:
        by_case: dict[str, list[str]] = {}
        for r in result.residuals:
            if r.used_in_fit == used and (used or r.target.metric not in report_only):
                by_case.setdefault(r.target.case, []).append(r.target.metric)
        return [f"{case}: {', '.join(m)}" for case, m in sorted(by_case.items())]

    fitted = result.scenario.model_copy(update={"calibration": base.calibration.model_copy(update={
        "parameters": params, "fitted_on": labels(True), "held_out": labels(False),
        "fit_rms_log_error": round(fit_err, 4),
        "holdout_rms_log_error": None if math.isnan(hold_err) else round(hold_err, 4),
    })})
    out = Path(out_path)
    if base.reference is not None and not base.reference.startswith(SHIPPED):
        # keep pointing at the same file from where the fitted scenario is written (a shipped one is found anywhere)
        fitted = fitted.model_copy(update={"reference": os.path.relpath(own_reference.resolve(),
                                                                        out.resolve().parent)})
    sources = ([ref_path.name] if ref_path else []) + [Path(p).name for p in run_paths]
    header = (f"# Calibrated by `kvsim calibrate` from {path.name} against {', '.join(sources)}.\n"
              f"# Fitted: {', '.join(f'{k} = {v:.4g}' for k, v in result.parameters.items())}.\n")
    data = fitted.model_dump(mode="json")
    if not fitted.slo.to_slo().is_set:
        del data["slo"]  # an unset SLO is the default: no block of nulls in the written file
    write_atomic(out, (header + yaml.safe_dump(data, sort_keys=False)).encode())
    rows = [{"point": r.target.case, "metric": r.target.metric,
             "measured": r.target.measured, "predicted": r.predicted, "error": r.error,
             "used_in_fit": r.used_in_fit} for r in result.residuals]
    columns = ["point", "metric", "measured", "predicted", "error", "used_in_fit"]
    console.data(rows, columns)
    if report_path:
        write_atomic(Path(report_path), csv_bytes(rows, columns))
    console.print(f"wrote {out}" + (f" and {report_path}" if report_path else ""))
