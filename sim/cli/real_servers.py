"""`kvsim measure` and `kvsim validate`: drive real OpenAI-compatible servers, and compare their run CSVs with
the simulator."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sim.cli.app import (
    UsageExit, checked_out_file, console, err_console, fmt, load_or_exit, main, positional_or_option, router_names,
    scenario_option,
)
from sim.cli.render import Table, format_option
from sim.results.report import csv_bytes, write_atomic
from sim.results.stats import ratio
from sim.scenario import ScenarioError


@main.command()
@click.option("--endpoint", "endpoints", multiple=True, required=True,
              help="Server base URL (http://HOST:PORT); repeat for each worker. Order = worker index.")
@click.option("--prefixes", type=click.IntRange(min=1), required=True, help="Distinct shared prefixes N.")
@click.option("--concurrency", type=click.IntRange(min=1), required=True, help="Requests kept in flight (closed loop).")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Measured requests. Default: the scenario's max(min_requests, requests_per_prefix x N).")
@scenario_option(" whose workload (prefix, tail and output tokens, warm-ups), seed and block size to use")
@click.option("--router", default="random", show_default=True, help="Client-side router (one that needs no cache state).")
@click.option("--prefix-tokens", type=click.IntRange(min=0), default=None, help="Override the scenario's prefix tokens.")
@click.option("--tail-tokens", type=click.IntRange(min=1), default=None, help="Override the scenario's tail tokens.")
@click.option("--output-tokens", type=click.IntRange(min=1), default=None, help="Override the scenario's output tokens.")
@click.option("--seed", type=int, default=None, help="Stream seed. Default: the scenario's.")
@click.option("--max-token-id", type=click.IntRange(min=4), default=8191, show_default=True,
              help="Largest token id in prompts (vocabulary size - 1); ids start at 3.")
@click.option("--served-model-name", "model", default=None,
              help="Model name the requests ask for (the server's --served-model-name). Default: the first one "
                   "/v1/models lists.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=120.0, show_default=True,
              help="Seconds before a silent request is abandoned (and retried).")
@click.option("--retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Retries of a failed request (connection error, timeout, HTTP 5xx/429).")
@click.option("--no-reset", is_flag=True,
              help="Do not empty the servers' prefix caches first (vLLM: POST /reset_prefix_cache, SGLang: POST /flush_cache).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="Run CSV to write; the setup goes to the sidecar with the same stem and .json.")
def measure(endpoints, prefixes, concurrency, requests, scenario_path, router, prefix_tokens, tail_tokens,
            output_tokens, seed, max_token_id, model, timeout_s, retries, no_reset, out_path) -> None:
    """Send real servers (vLLM or SGLang, recognised per endpoint) exactly the stream kvsim simulates, and write a
    run CSV + sidecar.

    Warm-ups (one per prefix) go first, one at a time; then CONCURRENCY requests stay in flight, each on a new
    connection, routed on the client. TTFT is timed at the first streamed chunk; cached tokens come from
    usage.prompt_tokens_details (vLLM needs --enable-prompt-tokens-details, SGLang --enable-cache-report);
    /metrics counters are read before and after (SGLang: where --enable-metrics serves them). On SGLang the
    router hashes prompts in blocks of the scenario's engine.block_size. Exits non-zero if any request failed
    after its retries.
    """
    from sim.servers.measure import MeasureConfig
    from sim.servers.measure import measure as run_measure
    from sim.servers.openai_client import Endpoint, EndpointError
    from sim.servers.run_csv import sidecar_path, write_run_bytes

    checked_out_file(out_path)
    base, _ = load_or_exit(scenario_path, shared_prefix="measure")
    allowed = [n for n in router_names()]
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
                        timeout_s=timeout_s, retries=retries, reset_cache=not no_reset,
                        hash_block_size=base.engine.block_size)
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
                  f"request hit rate {ratio(hits, len(measured_rows)):.3f}, "
                  f"{setup['measured_duration_s']:.1f} s")
    if setup["failed_requests"]:
        first = next(r["error"] for r in rows if r["error"])
        raise click.ClickException(f"{setup['failed_requests']} request(s) failed after retries; first: {first}")


def _check(c, tolerances, failed: list) -> str:
    """The check column of comparison `c` ('' when no tolerance names its metric; a run that is one of a group of
    repeats is checked as the group); a comparison outside a tolerance is appended to `failed`."""
    if not any(t.metric == c.metric for t in tolerances):
        return ""
    if getattr(c, "in_repeats", False):
        return "repeats"
    if any(t.violated_by(c) for t in tolerances):
        failed.append(c)
        return "FAIL"
    return "ok"


def _spec(metric: str) -> str:
    return ".3f" if metric in ("request_hit_rate", "full_hit_rate", "token_hit_rate") else ".1f"


def _tolerances(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
    from sim.studies.validate import Tolerance

    try:
        return [t for v in values for t in Tolerance.parse_list(v)]
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@main.command()
@click.argument("run_files", nargs=-1, type=click.Path(dir_okay=False), metavar="[RUN.csv]...")
@click.option("--runs", "run_paths", multiple=True, type=click.Path(dir_okay=False),
              help="Measured run CSVs (with sidecars) to compare with; repeatable (or give them as RUN.csv...).")
@scenario_option(": the base for what a run does not describe (time model, devices)")
@click.option("--routing", type=click.Choice(["recorded", "simulated"]), default="recorded", show_default=True,
              help="recorded: each request goes to the worker it went to; simulated: the run's router decides.")
@click.option("--ttft", "ttft_source", type=click.Choice(["client", "server"]), default="client", show_default=True,
              help="Compare the client-timed TTFT, or the server's queue + time to first token with kvsim's engine "
                   "queue + prefill (needs the server_ttft_ms and server_queue_ms columns; TPOT then from "
                   "server_generation_ms where recorded).")
@click.option("--tolerance", "tolerances", multiple=True, callback=_tolerances,
              help="METRIC=LIMIT,..., absolute (request_hit_rate=0.03) or relative (ttft_p50_ms=25%), e.g. "
                   "request_hit_rate=0.03,ttft_p50_ms=25%; repeatable. Exit 1 if a figure is outside.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write one row per (run, metric): run, metric, measured, predicted, error.")
@format_option("the rows --out writes (a row per run and metric)")
def validate(run_files, run_paths, scenario_path, routing, ttft_source, tolerances, out_path) -> None:
    """Simulate measured runs and compare kvsim's prediction with them.

    The runs, RUN.csv... or --runs FILE, are run CSVs with their JSON sidecars (docs/commands/measure-validate.md).

    Rates are compared in points (predicted - measured), times in ms and throughput in requests/s; the
    relative error is shown beside. Runs whose sidecars describe the same setup are repeats: they are also
    compared as a group, the prediction against the measured range over the repeats (its error is how far it lies
    outside), with a bootstrap interval of the predicted percentiles; tolerances then apply to the group, so that
    the machine's own spread is not counted as kvsim's error.
    """
    from sim.servers.run_csv import RunFileError, read_run
    from sim.studies.validate import compare_runs

    runs = positional_or_option(run_files, run_paths, "RUN.csv...", "--runs")
    if not runs:
        raise UsageExit("give the measured runs: RUN.csv... or --runs FILE (repeatable)")
    checked_out_file(out_path)

    base, _ = load_or_exit(scenario_path, shared_prefix="validate")
    loaded = []
    for path in runs:
        try:
            loaded.append(read_run(path))
        except RunFileError as err:
            raise click.ClickException(str(err)) from None
    try:
        comparisons, grouped = compare_runs(base, loaded, routing=routing, ttft_source=ttft_source)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    table = Table(title=f"measured vs kvsim ({routing} routing, {ttft_source} TTFT, base scenario {base.name})")
    for col in ("run", "metric", "measured", "predicted", "error", "relative", "check"):
        table.add_column(col, justify="left" if col in ("run", "metric", "check") else "right",
                         key=col in ("run", "metric"))
    failed = []
    for c in comparisons:
        check = _check(c, tolerances, failed)
        spec = _spec(c.metric)
        table.add_row(c.run, c.metric, fmt(c.measured, spec), fmt(c.predicted, spec), fmt(c.error, "+" + spec),
                      fmt(100 * c.relative_error, "+.1f") + " %", check)
    console.print(table)
    if grouped:
        rtable = Table(title="repeats: the measured range over runs of one setup against the prediction "
                             "(error = how far outside the range; predicted 90 % bootstrap interval over its requests)")
        for col in ("runs", "metric", "measured", "range", "predicted", "interval", "error", "relative", "check"):
            rtable.add_column(col, justify="left" if col in ("runs", "metric", "check") else "right",
                              key=col in ("runs", "metric"))
        for c in grouped:
            check = _check(c, tolerances, failed)
            spec = _spec(c.metric)
            lo, hi = c.predicted_interval
            rtable.add_row(c.run, c.metric, fmt(c.measured, spec),
                           f"{fmt(c.measured_low, spec)}–{fmt(c.measured_high, spec)}", fmt(c.predicted, spec),
                           "" if lo != lo else f"{fmt(lo, spec)}–{fmt(hi, spec)}", fmt(c.error, "+" + spec),
                           fmt(100 * c.relative_error, "+.1f") + " %", check)
        console.print(rtable)
    rows = [{"run": c.run, "metric": c.metric, "measured": c.measured, "predicted": c.predicted,
             "error": c.error} for c in comparisons]
    columns = ["run", "metric", "measured", "predicted", "error"]
    if grouped:
        columns += ["measured_low", "measured_high", "predicted_low", "predicted_high"]
        rows += [{"run": c.run, "metric": c.metric, "measured": c.measured, "predicted": c.predicted,
                  "error": c.error, "measured_low": c.measured_low, "measured_high": c.measured_high,
                  "predicted_low": c.predicted_interval[0], "predicted_high": c.predicted_interval[1]}
                 for c in grouped]
    console.data(rows, columns)
    if out_path:
        write_atomic(Path(out_path), csv_bytes(rows, columns))
        console.print(f"wrote {out_path}")
    if failed:
        worst = failed[0]
        raise click.ClickException(f"{len(failed)} figure(s) outside tolerance, e.g. {worst.run} {worst.metric}: "
                                   f"measured {worst.measured:.4g}, predicted {worst.predicted:.4g}")
