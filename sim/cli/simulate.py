"""`kvsim sweep` and `kvsim run` simulate points of a scenario; `kvsim routers`, `engines`, `hardware` and `schema` list
what a scenario can name."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import click

from sim.cli.app import (
    ARRIVAL_CURVE_FORM, arrival_curve_option, on_arrival_curve,
    CPU_KV_DETAIL, CPU_KV_HELP, ENGINE_HELP, SLO_HELP, capacity_text, checked_out_dir, console, engine_list,
    executor_options, fmt, gib_list, gpu_price_option, hardware_options, hit_rates_legend, int_list, kv_origin, kv_rule_note,
    load_or_exit, main, on_cpu_kv, on_engine, on_gpu_price, on_hardware, on_shared_kv, one_engine, positional_or_option,
    reference_measurements, shared_kv_columns, shared_kv_option, cpu_kv_connector_option, on_cpu_kv_connector,
    on_peer_fetch, peer_fetch_option,
    router_list, scenario_option, setup_text, slo_option, with_slo, workload_keys, workload_text,
)
from sim.cli import render
from sim.cli.autoscaling import autoscaled, autoscaling_options, on_autoscaling, show_fleet, write_fleet_files
from sim.cli.render import Table, format_option
from sim.cli.app import on_pd, pd_options
from sim.cli.turn_table import show_turns, turn_files
from sim.results.output_set import write_output_set
from sim.results.report import aggregate, csv_bytes, request_rows, summary_columns, write_atomic
from sim.scenario import ScenarioError
from sim.scenario import cpu_kv_gib as cpu_kv_gib_of
from sim.studies.reference import measured
from sim.routing.spec import format_value, router_label, router_overrides


@main.command()
@scenario_option()
@click.option("--prefixes", callback=int_list, required=True, help="Distinct shared prefixes N, comma-separated (e.g. 2,7,12,24).")
@click.option("--workers", callback=int_list, default=None, help="Worker counts, comma-separated (e.g. 3,6). Default: the scenario's.")
@click.option("--concurrency", callback=int_list, default=None, help="Requests in flight (closed loop), comma-separated. Default: the scenario's.")
@click.option("--router", "routers", callback=router_list, default=None,
              help="Routers, comma-separated: NAME or NAME:key=value,... (a token without = starts "
                   "the next router; see `kvsim routers`). Default: the scenario's.")
@click.option("--engine", "engines", callback=engine_list, default=None,
              help="Engines, comma-separated (vllm, sglang; see `kvsim engines`): every point runs on each, with the "
                   "same request stream. Default: the scenario's.")
@click.option("--cpu-kv-gib", "cpu_kv_gib", callback=gib_list, default=None,
              help="Host (CPU) KV tiers per worker to sweep, in GiB, comma-separated (e.g. 0,16); each is "
                   + CPU_KV_DETAIL)
@cpu_kv_connector_option
@shared_kv_option
@peer_fetch_option
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Runs per point; repeat r uses seed + r.")
@click.option("--seed", type=int, default=None, help="Base seed. Default: the scenario's.")
@executor_options
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@hardware_options
@gpu_price_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/summary.csv (a row per run), DIR/hit_rate.png and DIR/ttft_cdf.png (and DIR/engines.png "
                   "with several engines), then DIR/manifest.json listing them; every finished run is journaled "
                   "in DIR/runs.jsonl as it completes.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue the sweep journaled in --out DIR/runs.jsonl: skip its finished runs (same scenario "
                   "needed). Without it the journal starts afresh.")
@format_option("the rows of summary.csv (a row per run)")
@pd_options
@click.pass_context
def sweep(ctx, scenario_path, prefixes, workers, concurrency, routers, engines, cpu_kv_gib, cpu_kv_connector,
          shared_kv_gib, peer_fetch, repeats,
          seed, jobs, executor_kind, dask_scheduler, slo, model, gpu, kv_gib, out_dir, resume, prefill_workers=None,
          decode_workers=None, gpu_price_usd=None) -> None:
    """Run a grid of points and compare the hit rate with the formula and the measurements.

    The table shows, per (workers, N, concurrency, router), the mean over repeats of the request hit rate
    (requests with any cached token), beside the formula min(1, C/N) with C = KV tokens per worker / prompt
    tokens, and the measured value where the scenario's reference has one (for the scenario's own router).
    With an SLO (--slo or the scenario's slo block) the table also shows the fraction of requests meeting it.

    Runs go to --executor (local processes or a Dask cluster); the same seed gives the same summary.csv bytes on
    any executor and --jobs. Interrupted (SIGINT, SIGTERM: exit 130, 143), a sweep with --out continues with
    --resume.
    """
    from sim.cli.study_runs import resume_command, run_sweep_points
    from sim.studies.analytic import formula_hit_rate
    from sim.studies.sweep import sweep_points

    base, path = load_or_exit(scenario_path, gpu, shared_prefix="sweep")
    base = on_shared_kv(on_pd(on_gpu_price(on_hardware(with_slo(base, slo), model, gpu, kv_gib), gpu_price_usd),
                              prefill_workers, decode_workers), shared_kv_gib)
    base = on_cpu_kv_connector(base, cpu_kv_connector)
    if peer_fetch:
        if cpu_kv_gib and min(cpu_kv_gib) == 0:
            raise click.UsageError("--peer-fetch: every point needs a host tier to fetch into; give --cpu-kv-gib "
                                   "values > 0")
        # NOTE: the points set their own host tier (all > 0); the base takes the first so that it validates.
        base = on_peer_fetch(on_cpu_kv(base, cpu_kv_gib[0]) if cpu_kv_gib else base, True)
    if base.cluster.disaggregation is not None and workers and workers != [base.cluster.workers]:
        raise click.UsageError(f"--workers: a disaggregated cluster has prefill + decode workers "
                               f"({base.cluster.workers}); give the pools with --prefill-workers/--decode-workers")
    for kind in engines or ():
        # NOTE: one-line errors for an engine without a shared store or without peer fetch.
        on_peer_fetch(on_shared_kv(on_engine(base, kind), shared_kv_gib), peer_fetch)
    measurements = reference_measurements(base, path)
    reference = measured(measurements, "request_hit_rate")
    points = sweep_points(
        workers=workers or [base.cluster.workers],
        prefixes=prefixes,
        concurrency=concurrency or [base.workload.concurrency],
        routers=routers or [base.router.name],
        repeats=repeats,
        seed=base.seed if seed is None else seed,
        engines=engines or [None],
        cpu_kv_gib=cpu_kv_gib or [None],
    )
    out = checked_out_dir(out_dir)

    try:
        # NOTE: every point still to run (its scenario and router) is checked before any runs.
        outcomes = run_sweep_points("sweep", base, points, out=out, resume=resume, executor_kind=executor_kind,
                                    jobs=jobs, dask_scheduler=dask_scheduler, command=resume_command(ctx))
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    rows = [o.row for o in outcomes]

    capacity = base.kv_capacity_requests
    aggregated = aggregate(rows)
    kv = kv_origin(model, gpu, kv_gib)
    table = Table(title=f"{base.name}: {setup_text(base, kv, workers)}; request hit rate (mean of {repeats} "
                        f"run{'s' * (repeats > 1)})")
    with_goodput = base.slo.to_slo().is_set  # NOTE: without an SLO every request meets it: nothing to show
    # NOTE: the host-tier columns only when a tier is swept or set: a GPU-only table stays as it was.
    tiers = bool(cpu_kv_gib) or any(float(r.get("cpu_kv_gib", 0)) > 0 for r in rows)
    tier_cols = ("CPU GiB", "GPU hit", "CPU hit", "TTFT GPU-hit p50", "TTFT CPU-hit p50", "TTFT miss p50") if tiers else ()
    keys = ("workers", "N", "conc", "router", "engine", *tier_cols[:1])
    for col in (*keys, "hit rate", "formula", "measured",
                "sim-meas", "full hit", "token hit", "TTFT p50 ms", "TTFT p99 ms", "req/s", *tier_cols[1:],
                *(("SLO met",) if with_goodput else ())):
        table.add_column(col, justify="left" if col in ("router", "engine") else "right", key=col in keys)
    errors = []
    for row in aggregated:
        key = (row["workers"], row["prefixes"], row["concurrency"])
        # NOTE: the reference was measured with the scenario's own router, engine and host tier (none).
        ours = (row["router"] == base.router.name and row["engine"] == base.engine.kind
                and float(row.get("cpu_kv_gib", 0.0)) == cpu_kv_gib_of(base) and not base.shared_kv_bytes)
        meas = reference.get(key) if ours else None
        hit = float(row["request_hit_rate"])
        sd = f" ±{row['request_hit_rate_sd']:.3f}" if repeats > 1 else ""
        diff = ""
        if meas is not None:
            errors.append(hit - meas)
            diff = f"{100 * (hit - meas):+.1f} pp"
        tier_values = ((fmt(row["gpu_hit_rate"]), fmt(row["cpu_hit_rate"]), fmt(row["ttft_gpu_hit_p50_ms"], ".0f"),
                        fmt(row["ttft_cpu_hit_p50_ms"], ".0f"), fmt(row["ttft_miss_p50_ms"], ".0f")) if tiers else ())
        table.add_row(
            str(row["workers"]), str(row["prefixes"]), str(row["concurrency"]), str(row["router"]), str(row["engine"]),
            *((f"{float(row['cpu_kv_gib']):g}",) if tiers else ()),
            f"{hit:.3f}{sd}", f"{formula_hit_rate(capacity, int(row['prefixes'])):.3f}",
            "-" if meas is None else f"{meas:.3f}", diff,
            fmt(row["full_hit_rate"]), fmt(row["token_hit_rate"]),
            fmt(row["ttft_p50_ms"], ".0f"), fmt(row["ttft_p99_ms"], ".0f"), fmt(row["throughput_rps"], ".1f"),
            *tier_values,
            *((fmt(row["goodput_fraction"]),) if with_goodput else ()),
        )
    console.print(table)
    console.print(f"conc: concurrency (requests in flight); "
                  f"{hit_rates_legend('hit rate' + ' (± sd over repeats)' * (repeats > 1), 'token hit')}; "
                  f"full hit: share of requests whose whole shared prefix was cached; formula: min(1, C/N), "
                  f"{capacity_text(capacity)}", highlight=False)
    if note := kv_rule_note(base, kv):
        console.print(note, highlight=False)
    columns = summary_columns(rows)
    console.data(rows, columns)
    if errors:
        rmse = math.sqrt(sum(e * e for e in errors) / len(errors))
        console.print(f"request hit rate vs measured over {len(errors)} points: RMSE {100 * rmse:.2f} pp, "
                      f"max |error| {100 * max(abs(e) for e in errors):.2f} pp")
    if out is not None:
        from sim.results.figures import engine_figure, hit_rate_figure, ttft_cdf_figure  # NOTE: matplotlib here only

        files = {"summary.csv": csv_bytes(rows, columns)}
        shown = {k: v for k, v in reference.items()
                 if k[0] in {p.workers for p in points} and k[2] in {p.concurrency for p in points}}
        # NOTE: the reference was measured with the scenario's own router and engine; its points are drawn beside
        # that router's predictions only (hit rates: labelled as such; TTFT: on that router's panels).
        own = (router_label(base.router.name, base.router.options), base.engine.kind)
        label = f"measured ({base.router.name}, {base.engine.kind})"
        files["hit_rate.png"] = hit_rate_figure(
            aggregated, capacity_requests=capacity, measured=shown, measured_label=label,
            title=f"{base.name}: request hit rate vs prefixes")
        ttft_measured: dict[tuple[int, int, int], dict[str, float]] = defaultdict(dict)
        for m in measurements:
            if m.metric.startswith("ttft_") and m.unit in ("ms", ""):
                ttft_measured[(m.workers, m.prefixes, m.concurrency)][m.metric] = m.value
        files["ttft_cdf.png"] = ttft_cdf_figure(
            outcomes, title=f"{base.name}: TTFT distribution (repeats pooled)", measured=dict(ttft_measured),
            measured_group=own)
        if len({row["engine"] for row in rows}) > 1:
            files["engines.png"] = engine_figure(
                aggregated, capacity_requests=capacity, measured=shown, measured_engine=base.engine.kind,
                title=f"{base.name}: request hit rate by engine ({repeats} run{'s' * (repeats > 1)} per point)")
        written = write_output_set(out, files, runs=len(rows), command=resume_command(ctx))
        console.print(f"wrote {', '.join(map(str, written))} ({len(rows)} rows)")


@main.command(name="run")
@click.argument("scenario_file", required=False, type=click.Path(dir_okay=False), metavar="[SCENARIO]")
@scenario_option(" (or give it as SCENARIO)")
@click.option("--prefixes", type=click.IntRange(min=1), default=None,
              help="Distinct shared prefixes N (a shared-prefix workload only). Default: the scenario's.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Number of workers. Default: the scenario's.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Requests in flight; with a sessions workload, sessions at once (a closed loop, replacing "
                   "Poisson session starts). Default: the scenario's.")
@click.option("--router", callback=router_list, default=None, help="Router: NAME or NAME:key=value,... (see `kvsim routers`). "
              "Default: the scenario's.")
@click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP)
@click.option("--cpu-kv-gib", "cpu_kv_gib", type=click.FloatRange(min=0), default=None, help=CPU_KV_HELP)
@cpu_kv_connector_option
@shared_kv_option
@peer_fetch_option
@click.option("--seed", type=int, default=None, help="Seed. Default: the scenario's.")
@click.option("--arrival-curve", "arrival_curve", callback=arrival_curve_option, default=None, metavar="SPEC",
              help="Open loop: requests (with sessions: session starts) arrive at a rate that follows a curve, "
                   "exact Poisson arrivals by time-rescaling, instead of the scenario's arrivals. SPEC is "
                   + ARRIVAL_CURVE_FORM + ".")
@click.option("--duration-s", "duration_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With an arrival curve: send its arrivals in [0, S) s of the measured phase (their number replaces "
                   "the scenario's request or session count), e.g. 86400 for a day.")
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@hardware_options
@gpu_price_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/summary.csv (one row) and DIR/requests.csv (a row per request, warm-ups flagged); "
                   "with sessions also DIR/turns.csv (a row per turn).")
@format_option("the row of summary.csv")
@pd_options
@autoscaling_options
def run_command(scenario_file, scenario_path, prefixes, workers, concurrency, router, engine, cpu_kv_gib,
                cpu_kv_connector, shared_kv_gib, peer_fetch, seed, arrival_curve, duration_s, slo, model, gpu, kv_gib, out_dir,
                prefill_workers=None, decode_workers=None, gpu_price_usd=None, autoscaler=None, min_workers=None,
                max_workers=None, timeline_bin_s=None) -> None:
    """Run one point of a scenario and print its summary.

    The scenario is SCENARIO or --scenario FILE (default: the built-in service-baseline); goodput counts the
    requests that meet --slo or the scenario's slo block. --arrival-curve makes the load vary over time (a day:
    --arrival-curve diurnal:mean_rps=4,amplitude=0.8 --duration-s 86400). A sessions workload (chat, agent: scenarios/chat.yaml,
    scenarios/agent.yaml) also prints a row per turn (hit rates, TTFT, re-prefilled tokens, gap survival) and
    writes DIR/turns.csv. With --autoscaler the fleet is elastic (--workers: those ready at time 0) and --out
    also writes DIR/timeline.csv, DIR/instances.csv and DIR/timeline.png (docs/concepts/autoscaling.md).
    """
    from sim.runner import run
    from sim.results.summary import summarize
    from sim.studies.analytic import formula_hit_rate

    scenario_path = positional_or_option(scenario_file, scenario_path, "SCENARIO", "--scenario")
    out = checked_out_dir(out_dir)
    base, _ = load_or_exit(scenario_path, gpu)
    base = on_cpu_kv(on_hardware(with_slo(on_engine(base, engine), slo), model, gpu, kv_gib), cpu_kv_gib)
    base = on_cpu_kv_connector(on_pd(on_gpu_price(base, gpu_price_usd), prefill_workers, decode_workers),
                               cpu_kv_connector)
    if base.cluster.disaggregation is not None and workers is not None and workers != base.cluster.workers:
        raise click.UsageError(f"--workers: a disaggregated cluster has prefill + decode workers "
                               f"({base.cluster.workers}); give the pools with --prefill-workers/--decode-workers")
    base = on_peer_fetch(on_shared_kv(base, shared_kv_gib), peer_fetch)
    base = on_arrival_curve(base, arrival_curve, duration_s, concurrency=concurrency)
    elastic = autoscaled(base, autoscaler)
    overrides: dict = {k: v for k, v in {"cluster.workers": None if elastic else workers, "seed": seed}.items()
                       if v is not None}
    if base.has_sessions:
        if prefixes is not None:
            raise click.UsageError("--prefixes: a sessions workload has no shared prefixes N; its system prompts "
                                   "are workload.groups in the scenario file")
        if concurrency is not None:
            overrides.update({"workload.concurrent_sessions": concurrency, "workload.session_rate_per_s": None})
    else:
        overrides.update({k: v for k, v in {"workload.prefixes": prefixes, "workload.concurrency": concurrency}.items()
                          if v is not None})
    if router is not None:
        if len(router) != 1:
            raise click.BadParameter("give one router", param_hint="--router")
        overrides.update(router_overrides(router[0], base.router.name, base.router.options))
    try:
        scenario = base.with_overrides(**overrides) if overrides else base
        scenario = on_autoscaling(scenario, autoscaler, min_workers=min_workers, max_workers=max_workers,
                                  initial_workers=workers if elastic else None, timeline_bin_s=timeline_bin_s)
        result = run(scenario)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    summary = summarize(result)
    host_gib = cpu_kv_gib_of(scenario)
    prefixes_key, concurrency_key = workload_keys(scenario)
    row = {"workers": result.num_workers, "prefixes": prefixes_key,
           "concurrency": concurrency_key, "router": router_label(scenario.router.name, scenario.router.options),
           "engine": scenario.engine.kind, "cpu_kv_gib": host_gib, "repeat": 0, "seed": scenario.seed,
           **summary.row(), **shared_kv_columns(scenario)}
    kv = kv_origin(model, gpu, kv_gib)
    table = Table(title=f"{scenario.name}: {setup_text(scenario, kv)}; {result.num_workers} workers, "
                        f"{workload_text(scenario)}, router={scenario.router.name}, seed={scenario.seed}")
    table.add_column("metric", justify="left", key=True)
    table.add_column("value")
    columns = summary_columns([row])
    for key in columns[columns.index("requests"):]:
        table.add_row(key, fmt(row[key], ".4g"))
    if scenario.has_sessions:
        console.print(table)
        console.print(f"{hit_rates_legend('request_hit_rate', 'token_hit_rate')}; with sessions, summary.csv's "
                      f"prefixes are workload.groups and concurrency workload.concurrent_sessions (0: Poisson "
                      f"session starts)", highlight=False)
    else:
        table.add_row("formula min(1, C/N)",
                      f"{formula_hit_rate(scenario.kv_capacity_requests, scenario.workload.prefixes):.3f}")
        console.print(table)
        console.print(f"{hit_rates_legend('request_hit_rate', 'token_hit_rate')}; in the formula min(1, C/N), "
                      f"{capacity_text(scenario.kv_capacity_requests)}", highlight=False)
    if note := kv_rule_note(scenario, kv):
        console.print(note, highlight=False)
    workers_table = Table(title="per worker (measured phase)")
    tier = host_gib > 0
    # NOTE: a worker's prefix-cache counters are the GPU's (vLLM's prefix_cache_*); CPU hits are counted apart.
    for col in ("worker", "device", "requests", "GPU token hit rate" if tier else "token hit rate", "evicted blocks",
                "preemptions", "steps",
                *(("CPU stored", "CPU loaded", "CPU evicted") if tier else ())):
        workers_table.add_column(col, key=col == "worker")
    for w, n in zip(result.workers, summary.requests_per_worker):
        e = w.engine
        workers_table.add_row(str(w.worker), w.device, str(n), fmt(w.token_hit_rate),
                              str(e.evicted_blocks), str(e.preemptions), str(w.steps),
                              *((str(e.cpu_stored_blocks), str(e.cpu_loaded_blocks), str(e.cpu_evicted_blocks))
                                if tier else ()))
    console.print(workers_table)
    show_turns(summary.session_figures, host_tier=tier)
    if result.fleet is not None:
        show_fleet(result.fleet)
    console.data([row], columns)
    if out_dir:
        out = Path(out_dir)
        write_atomic(out / "summary.csv", csv_bytes([row], columns))
        records, record_columns = request_rows(result.records, shared_tier=result.shared_tier)
        write_atomic(out / "requests.csv", csv_bytes(records, record_columns))
        turns = turn_files(summary.session_figures)
        for name, data in turns.items():
            write_atomic(out / name, data)
        written = [str(out / name) for name in ("summary.csv", "requests.csv", *turns)]
        if result.fleet is not None:
            written += write_fleet_files(out, result.fleet, title=f"{scenario.name}: autoscaled "
                                         f"{scenario.cluster.autoscaling.autoscaler.name}, {scenario.router.name}")
        console.print(f"wrote {', '.join(written[:-1])} and {written[-1]} ({len(records)} requests)")


def _default_text(info) -> str:
    """What a config field defaults to, as the listings print it."""
    from pydantic import BaseModel

    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "a section: its fields below"
    return f"default {format_value(value)}"


def _show_options(fields: dict, *, indent: int = 4, prefix: str = "") -> None:
    """A config model's fields, one entry each (`name (default): description`, continuation lines indented); a field
    that is a section of its own is followed by its fields as `name.field`."""
    from pydantic import BaseModel

    for name, info in fields.items():
        render.entry(f"{prefix}{name}", info.description or "", detail=f"({_default_text(info)})", indent=indent)
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            _show_options(type(default).model_fields, indent=indent, prefix=f"{prefix}{name}.")


@main.command()
def engines() -> None:
    """List the engines and their options (the `engine:` section of a scenario)."""
    from sim.engines.registry import ENGINES

    for kind in sorted(ENGINES):
        spec = ENGINES[kind].Spec
        render.entry(kind, spec.__doc__.strip().splitlines()[0])
        _show_options(spec.model_fields)


@main.command()
def hardware() -> None:
    """List the hardware profiles (--gpu NAME[xTP], a roofline time model's `hardware`) and the shipped models
    (--model NAME); every number's source is in sim/timing/hardware.yaml."""
    from sim.timing.spec import RooflineTimeModelSpec
    from sim.timing.architecture import load_architecture, shipped_models
    from sim.timing.hardware import hardware_profiles

    profiles = hardware_profiles().values()
    render.entry("hardware profiles (--gpu NAME[xTP])", "dense bf16 peaks; links per direction, the host link = PCIe "
                 "to pinned CPU memory; $/GPU-h: an on-demand list price per GPU (cloud instance price / its GPUs) "
                 "or, for consumer and laptop GPUs, an amortised-purchase-plus-power assumption, as of the date in "
                 "its source and not re-checked since (--gpu-price-usd overrides); sources in "
                 "sim/timing/hardware.yaml")
    table = Table()
    for col in ("name", "TFLOP/s", "memory GB/s", "memory GB", "TP link GB/s", "host link GB/s", "$/GPU-h"):
        table.add_column(col, justify="left" if col == "name" else "right", key=col == "name")
    for p in profiles:
        table.add_row(p.name, f"{p.peak_flops / 1e12:.1f}", f"{p.memory_bandwidth / 1e9:,.0f}",
                      f"{p.memory_bytes / 1e9:.0f}", f"{p.interconnect_bandwidth / 1e9:.0f}",
                      f"{p.host_bandwidth / 1e9:.4g}",
                      "none" if p.price_per_hour_usd != p.price_per_hour_usd else f"{p.price_per_hour_usd:.4g}")
    console.print(table)
    console.print()
    for p in profiles:
        render.entry(p.name, p.description + (f"; also --gpu {', '.join(p.aliases)}" if p.aliases else ""))
    console.print()
    models = Table(title="shipped models (--model NAME, or a config.json path)")
    for col in ("name", "layers", "hidden", "heads / KV heads", "parameters", "KV bytes/token"):
        models.add_column(col, justify="left" if col == "name" else "right", key=col == "name")
    for name in shipped_models():
        _, a = load_architecture(name)
        models.add_row(name, str(a.num_hidden_layers), str(a.hidden_size),
                       f"{a.num_attention_heads} / {a.num_key_value_heads}", f"{a.num_params / 1e9:.2f} B",
                       f"{a.kv_bytes_per_token:,}")
    console.print(models)
    console.print()
    render.entry("roofline time model options (`time_model: {kind: roofline, ...}`)")
    _show_options(RooflineTimeModelSpec.model_fields)


@main.command()
def schema() -> None:
    """Print the scenario file's JSON Schema (for editor completion and validation, e.g. a YAML language server's
    `# yaml-language-server: $schema=...`)."""
    import json

    from sim.scenario import Scenario

    click.echo(json.dumps(Scenario.model_json_schema(), indent=2))


@main.command()
@click.argument("names", nargs=-1, metavar="[NAME]...")
def routers(names: tuple[str, ...]) -> None:
    """List the routers: each one's summary, options with their defaults (as --router NAME:key=value,...) and what
    `kvsim tune` searches; with NAME..., what each option of those routers means."""
    from policies import PD_ROUTERS, ROUTERS
    from policies.base import RouterOptions
    from policies.disaggregated import PdRouterOptions
    from sim.studies.search_space import space_text

    unknown = [n for n in names if n not in ROUTERS and n not in PD_ROUTERS]
    if unknown:
        raise click.BadParameter(f"unknown router {', '.join(unknown)}; allowed: "
                                 f"{', '.join(sorted(ROUTERS) + sorted(PD_ROUTERS))}", param_hint="NAME")
    common = RouterOptions.model_fields

    def own(name: str) -> dict:
        if name in PD_ROUTERS:
            return dict(PD_ROUTERS[name].Options.model_fields)
        return {k: v for k, v in ROUTERS[name].Options.model_fields.items() if k not in common}

    def defaults(fields: dict) -> str:
        return ", ".join(f"{k}={_default_text(v).removeprefix('default ')}" for k, v in fields.items())

    if names:
        render.entry("every router also takes")
        _show_options(common)
    else:
        render.entry("every router also takes", defaults(common))
    for name in [n for n in names if n in ROUTERS] if names else sorted(ROUTERS):
        cls = ROUTERS[name]
        render.entry(name, cls.summary)
        if names:
            _show_options(own(name))
        elif own(name):
            render.entry("options", defaults(own(name)), indent=4)
        if cls.search_space:
            render.entry("kvsim tune searches by default", space_text(cls.search_space), indent=4)
    pd_names = [n for n in names if n in PD_ROUTERS] if names else sorted(PD_ROUTERS)
    if pd_names:
        render.entry("disaggregated routers", "for --prefill-workers/--decode-workers (cluster.disaggregation): a "
                     "prefill-stage and a decode-stage choice, each over its pool; an aggregated router there routes "
                     "each pool (as pd-stages with it on both)")
    for name in pd_names:
        render.entry(name, PD_ROUTERS[name].summary, indent=2)
        if names:
            _show_options(own(name))
        else:
            render.entry("options", defaults(own(name)), indent=4)
    if not names:
        console.print("`kvsim routers NAME...` says what each option of those routers means.", highlight=False)
