"""`kvsim replay`: replay a trace (Mooncake open loop; session traces closed loop) and report prefix reuse, TTFT and
throughput."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import click

from sim.cli.app import (
    ARRIVAL_CURVE_FORM, arrival_curve_option,
    CPU_KV_HELP, ENGINE_HELP, SHARED_FIRST_BLOCK, SLO_HELP, UsageExit, checked_out_dir, console, err_console,
    executor_options, fmt, hit_rates_legend, load_or_exit, main, on_cpu_kv, on_engine, one_engine, open_executor_or_exit, positional_or_option, progress_bar,
    on_shared_kv, shared_kv_columns, shared_kv_option, cpu_kv_connector_option, on_cpu_kv_connector,
    on_peer_fetch, peer_fetch_option, gpu_price_option, on_gpu_price,
    router_list, scenario_option, setup_text, slo_option, with_slo,
)
from sim.cli.figure_process import painter
from sim.cli.autoscaling import autoscaled, autoscaling_options, on_autoscaling, show_fleet, write_fleet_files
from sim.cli.render import Table, format_option
from sim.cli.app import on_pd, pd_options
from sim.cli.turn_table import show_turns, turn_files
from sim.results.report import request_rows
from sim.workloads.session_inference import DEFAULT_COMMON_REQUESTS
from sim.workloads.session_traces import SESSION_TIMINGS
from sim.workloads.trace_formats import SESSION_FORMATS, TRACE_FORMATS
from sim.results.report import csv_bytes, write_atomic
from sim.scenario import Scenario, ScenarioError
from sim.scenario import cpu_kv_gib as cpu_kv_gib_of
from sim.routing.spec import router_label, router_overrides


_PROGRESS_EVERY = 1000
"""Requests between progress-bar updates (each update costs about as much as routing a request)."""


def _count_lines(path: str, limit: int | None) -> int:
    """Non-blank lines of the trace (its requests), at most `limit`."""
    count = 0
    with open(path, "rb") as f:
        for line in f:
            count += bool(line.strip())
            if limit is not None and count >= limit:
                break
    return count


def _counted_trace(open_trace, step):
    """The trace `open_trace()` opens, advancing the progress bar as the replay consumes it (in arrival order)."""
    n = 0
    for n, item in enumerate(open_trace(), 1):
        if n % _PROGRESS_EVERY == 0:
            step(_PROGRESS_EVERY)
        yield item
    step(n % _PROGRESS_EVERY)


def _session_block_tokens(path: str, fmt: str) -> int:
    """Tokens per hash id of the session trace at `path`: Bailian's 16, a kvsim file's first line's block_size."""
    from sim.workloads.trace_formats import BAILIAN_BLOCK_TOKENS, KVSIM_BLOCK_TOKENS, MOONCAKE_BLOCK_TOKENS

    if fmt == "bailian":
        return BAILIAN_BLOCK_TOKENS
    if fmt == "agentic-mooncake":  # the header's block_size
        size = _first_line_field(path, "block_size")
        return size if isinstance(size, int) and size > 0 else MOONCAKE_BLOCK_TOKENS
    if fmt.startswith("mooncake"):
        return MOONCAKE_BLOCK_TOKENS
    size = _first_line_field(path, "block_size")
    return size if isinstance(size, int) and size > 0 else KVSIM_BLOCK_TOKENS


def _first_line_field(path: str, name: str):
    """Field `name` of the trace's first line (None if absent or unreadable: the replay's reader reports what is
    wrong, naming the line)."""
    from sim.workloads.traces import TraceError, json_object

    try:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"{}")
        return json_object(first, Path(path), 1).get(name)
    except (OSError, TraceError):
        return None


def _replay_mooncake(scenario, trace, trace_block_size, speed, limit, bin_s, keep_records, jobs, executor_kind,
                     dask_scheduler, *, arrival_curve=None):
    """Replay the Mooncake trace at `trace` open loop (split over processes when the router allows it), its times
    warped onto `arrival_curve` (a curve spec) when given."""
    import time as _time

    from sim.replay import device_groups
    from sim.replay import replay as run_replay
    from sim.studies.executor import available_cores
    from sim.workloads.traces import read_mooncake

    jobs = jobs or available_cores()
    # NOTE: --executor local keeps the forked split (the default); with --executor dask the parts of a split
    # replay are tasks of the Dask cluster, and the trace opener travels there (a partial pickles).
    executor = open_executor_or_exit(executor_kind, jobs, dask_scheduler) if executor_kind != "local" else None
    open_trace = functools.partial(read_mooncake, trace, block_size=scenario.engine.block_size,
                                   trace_block_tokens=trace_block_size, speed=speed, limit=limit)
    if arrival_curve is not None:
        open_trace = _warped_opener(open_trace, arrival_curve)
    with executor if executor is not None else contextlib.nullcontext():
        parts = executor.jobs if executor is not None else jobs
        split = len(device_groups(scenario, parts)) > 1 and not keep_records
        # NOTE: a bar only when someone watches and the replay runs here (a split replay runs elsewhere: a
        # spinner then); counting the trace's lines for its total is one quick pass over the file.
        total = _count_lines(trace, limit) if err_console.is_terminal and not split else None
        t0 = _time.perf_counter()
        with progress_bar(f"replay ({parts} processes)" if split else "replay", total) as step:
            opened = open_trace if total is None else functools.partial(_counted_trace, open_trace, step)
            result = run_replay(scenario, opened, bin_s=bin_s, jobs=jobs, executor=executor,
                                keep_records=keep_records)
    return result, _time.perf_counter() - t0


def _warped_opener(open_trace, curve_spec):
    """`open_trace` whose times are warped onto the curve (`sim.workloads.arrival_curve.warp_trace`): one pass over
    the trace first for its mean rate r̄ = requests / last arrival; the warp is said in one line."""
    from sim.workloads.arrival_curve import warp_mean_rps
    from sim.workloads.traces import TraceError

    n, last_s = 0, 0.0
    with progress_bar("read the trace's times"):
        for n, item in enumerate(open_trace(), 1):
            last_s = item.arrival_s
    curve = curve_spec.curve()
    try:
        mean_rps = warp_mean_rps(curve, n, last_s)
    except ValueError as err:
        raise TraceError(f"--arrival-curve: {err}") from None
    console.print(f"arrivals warped onto {curve_spec.text()}: {n:,} requests over {last_s:,.6g} s at "
                  f"{mean_rps:.4g}/s now span {curve.inverse(n):,.6g} s", highlight=False)
    return functools.partial(_warped, open_trace, curve, mean_rps)


def _warped(open_trace, curve, mean_rps: float):
    from sim.workloads.arrival_curve import warp_trace

    return warp_trace(open_trace(), curve, mean_rps=mean_rps)


def _replay_session_trace(scenario, trace, fmt, timing, trace_block_size, speed, limit, bin_s, keep_records, *,
                          jobs, executor_kind, infer_common_requests=None, arrival_curve=None):
    """Replay the session trace at `trace` (a Mooncake trace whose sessions are inferred, with
    `infer_common_requests`): closed loop in one process, or recorded (open loop, split like a Mooncake trace when
    the router allows it and no record is kept)."""
    import time as _time

    from sim.replay import replay as run_replay
    from sim.replay import replay_sessions
    from sim.studies.executor import available_cores
    from sim.workloads.agentic_traces import AgenticTrace
    from sim.workloads.session_traces import SessionTrace
    from sim.workloads.traces import TraceError

    t0 = _time.perf_counter()
    with progress_bar("index the trace"):
        if fmt == "agentic-mooncake":
            if timing != "closed-loop":
                raise TraceError(f"{trace}: --sessions {timing} needs recorded send times; agentic-mooncake records "
                                 "dependencies (replay it closed loop)")
            index = AgenticTrace(trace, block_size=scenario.engine.block_size, trace_block_tokens=trace_block_size,
                                 speed=speed, limit=limit)
        else:
            index = SessionTrace(trace, block_size=scenario.engine.block_size, fmt=fmt,
                                 trace_block_tokens=trace_block_size, speed=speed, limit=limit,
                                 infer_common_requests=infer_common_requests)
    if index.inference is not None:
        _show_inference(index)
    if arrival_curve is not None:
        curve = arrival_curve.curve()
        mean_rps = index.warp(curve, timing=timing)
        what = "turns" if timing == "recorded" else "session starts"
        console.print(f"{what} warped onto {arrival_curve.text()} from the trace's {mean_rps:.4g}/s",
                      highlight=False)
    if timing == "closed-loop":
        if (jobs or 1) > 1 or executor_kind != "local":
            console.print("closed-loop sessions replay in one process: when a turn is sent depends on when its "
                          "parent finished, which depends on every worker (--jobs/--executor ignored)",
                          highlight=False)
        with progress_bar("replay (sessions, closed loop)"):
            result = replay_sessions(scenario, index.sessions(), bin_s=bin_s, keep_records=keep_records)
    else:
        # NOTE: a forked split re-reads nothing: each process walks the index it inherited.
        with progress_bar("replay (sessions, recorded times)"):
            result = run_replay(scenario, index.recorded, bin_s=bin_s, jobs=jobs or available_cores(),
                                keep_records=keep_records)
    return index, result, _time.perf_counter() - t0


def _show_inference(index) -> None:
    """One paragraph on the sessions inferred from a Mooncake trace's hash ids (docs/concepts/session-traces.md)."""
    c = index.inference.counts
    shape = index.shape()
    sizes = ", ".join(f"{turns}: {n:,}" for turns, n in shape.sizes.items())
    gaps = ", ".join(f"p{q} {v:.0f} s" for q, v in shape.gap_quantiles_s.items())
    console.print(
        f"sessions inferred from hash ids: {c.linked:,} of {len(index):,} requests continue an earlier one "
        f"({c.linked / len(index):.1%}); common prefix: {c.common_ids:,} block ids carried by more than "
        f"{c.common_requests:,} requests; {c.siblings:,} that would continue an already continued turn and "
        f"{c.longer_parent:,} shorter than their candidate start new sessions. {shape.sessions:,} sessions, turns "
        f"per session {sizes}; gaps {gaps}", highlight=False)


def _shared_tier_columns(scenario, result) -> dict[str, float | int]:
    """A replay's shared-store columns: the store's GiB, its hit rates and the engines' shared-store counters (the
    replay's streaming stats keep no per-request TTFT split)."""
    from sim.results.records import total_counters

    st, engine = result.stats, total_counters(result.workers)
    return {**shared_kv_columns(scenario), "shared_hit_rate": st.shared_hit_rate,
            "shared_prefix_reuse": st.shared_prefix_reuse, "shared_stored_blocks": engine.shared_stored_blocks,
            "shared_loaded_blocks": engine.shared_loaded_blocks, "shared_evicted_blocks": engine.shared_evicted_blocks,
            "shared_link_bytes": engine.shared_link_bytes, "host_link_bytes": engine.host_link_bytes}


def _peer_fetch_columns(result) -> dict[str, float | int]:
    """A replay's G2 peer fetch columns (`PEER_FETCH_COLUMNS`), from the engines' counters."""
    from sim.results.records import total_counters
    from sim.results.summary import peer_fetch_row

    return peer_fetch_row(total_counters(result.workers))


def _requests_csv(records, session_trace, *, shared_tier: bool = False) -> bytes:
    """requests.csv of a replay, by request id; with a session trace, each request's parent's request id, its gap
    (the closed-loop delay after its parent finished) and its parent's finish time (empty for a first turn)."""
    records = sorted(records, key=lambda r: r.request_id)
    rows, columns = request_rows(records, shared_tier=shared_tier)
    if session_trace is not None:
        finished = {r.request_id: r.finished_s for r in records}
        for row in rows:
            parent = session_trace.parent_of(row["request_id"])
            row["parent_request_id"] = "" if parent is None else parent
            row["gap_s"] = "" if parent is None else session_trace.gap_s(row["request_id"])
            row["parent_finished_s"] = "" if parent is None else finished.get(parent, "")
        columns += ["parent_request_id", "gap_s", "parent_finished_s"]
    return csv_bytes(rows, columns)


def trace_base(scenario_path: str | None, engine: str | None) -> Scenario:
    """The scenario a trace is replayed on: `scenario_path` or the built-in trace-replay one, on `engine`."""
    from sim.scenario import builtin_scenario_path

    base, _ = load_or_exit(scenario_path or str(builtin_scenario_path("trace-replay")))
    return on_engine(base, engine)


def trace_overrides(base: Scenario, *, block_size: int | None, kv_tokens: int | None, kv_blocks: int | None,
                    kv_bytes: int | None, reuse_breakdown: bool | None) -> tuple[dict[str, object], int]:
    """The overrides of `base` for a replay (engine block size, KV capacity per worker given one way at most, the
    reuse breakdown) and the engine block size B the trace is read in."""
    given = [x for x in (kv_tokens, kv_blocks, kv_bytes) if x is not None]
    if len(given) > 1:
        raise click.BadParameter("give only one of --kv-tokens, --kv-blocks, --kv-bytes", param_hint="--kv-tokens")
    B = block_size or base.engine.block_size
    overrides: dict[str, object] = {"engine.block_size": B}
    if reuse_breakdown is not None:
        overrides["cluster.reuse_breakdown"] = reuse_breakdown
    if given:
        engine = base.engine.model_copy(update={"block_size": B})
        overrides.update(engine.capacity_overrides(tokens=kv_tokens, blocks=kv_blocks, kv_bytes=kv_bytes))
    return overrides, B


@main.command()
@click.argument("trace_file", required=False, type=click.Path(dir_okay=False), metavar="[TRACE]")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The JSONL trace to replay (or give it as TRACE): Mooncake, Qwen-Bailian or kvsim sessions.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Number of workers (required without an autoscaler); with --autoscaler, the workers ready at time 0.")
@click.option("--kv-tokens", type=click.IntRange(min=1), default=None,
              help="Usable KV capacity per worker in tokens (blocks = tokens / block size, plus vLLM's null block).")
@click.option("--kv-blocks", type=click.IntRange(min=2), default=None,
              help="KV blocks per worker as the engine counts them (vLLM num_gpu_blocks, null block included; SGLang pages).")
@click.option("--kv-bytes", type=click.IntRange(min=1), default=None,
              help="KV bytes per worker (with the scenario's model.kv_bytes_per_token).")
@click.option("--router", callback=router_list, default=None, help="Router: NAME or NAME:key=value,... (see `kvsim routers`). Default: the scenario's "
                   "(round-robin).")
@click.option("--engine", callback=one_engine, default=None, help=ENGINE_HELP)
@scenario_option(" (engine, time model and devices)",
                 default="the built-in trace-replay scenario (Dynamo mocker-like)")
@click.option("--trace-format", "trace_fmt", type=click.Choice(("auto", *TRACE_FORMATS)), default="auto", show_default=True,
              help="The trace's format: mooncake (timestamp ms, input_length, output_length, hash_ids; independent "
                   "requests), bailian (Qwen-Bailian: chat_id, parent_chat_id, timestamp s, ..., 16-token hash_ids) "
                   "kvsim (kvsim session JSONL: id, parent, timestamp_s, delay_s, ...), mooncake-sessions (Mooncake "
                   "rows with session_id and delay ms, each a turn's whole prompt, as Dynamo's mocker reads them) or "
                   "mooncake-delta (the same rows, each holding a turn's new input only), agentic-mooncake (Dynamo's "
                   "Agentic Mooncake v2: a header line, full prompts, dependency edges); auto: from the first "
                   "line's fields (never mooncake-delta). docs/concepts/session-traces.md.")
@click.option("--sessions", "session_timing", type=click.Choice(SESSION_TIMINGS), default=None,
              help="How a session trace's turns are sent: closed-loop (the default: a first turn at its timestamp, a "
                   "later turn when its parent has finished plus the recorded gap, its timestamp minus its parent's "
                   "or its delay_s) or recorded (every turn at its timestamp, open loop). Closed loop runs in one "
                   "process.")
@click.option("--infer-sessions", "infer_sessions", is_flag=True, default=False,
              help="On a Mooncake trace without session ids (Mooncake's conversation trace): infer each request's "
                   "parent from its hash ids (the most recent request whose full prompt blocks lead its ids and "
                   "share more than the trace's common prefix; a parent continued once) and replay the sessions as "
                   "a session trace's (--sessions). docs/concepts/session-traces.md.")
@click.option("--common-prefix-requests", "common_requests", type=click.IntRange(min=1), default=None,
              help="With --infer-sessions: a block id carried by more than K requests is a common prefix (a "
                   f"system prompt), no evidence of a session. Each turn carries its session's first blocks, so K "
                   f"also caps a session at about K turns: keep it above the longest conversation. Default "
                   f"{DEFAULT_COMMON_REQUESTS}.")
@click.option("--block-size", type=click.IntRange(min=1), default=None,
              help="Engine block size in tokens; must divide the trace's block size. Default: the scenario's (64), or "
                   "the trace's block size when the scenario's does not divide it (16 for Bailian).")
@click.option("--trace-block-size", type=click.IntRange(min=1), default=None,
              help="Tokens per hash id in the trace. Default: the format's (Mooncake 512, Bailian 16, kvsim the "
                   "lines' block_size or 16, mooncake-sessions and mooncake-delta 512).")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Replay speed: arrival times are divided by it.")
@click.option("--time-scale", "time_scale", type=click.FloatRange(min=0, min_open=True), default=None, metavar="F",
              help="Multiply the trace's timestamps (and a session trace's gaps) by F: 0.5 replays it twice as fast "
                   "(the same as --speed 1/F; give one of them).")
@click.option("--arrival-curve", "arrival_curve", callback=arrival_curve_option, default=None, metavar="SPEC",
              help="Warp the trace's timestamps onto a rate curve: each arrival t goes to Λ⁻¹(r̄·t), with Λ the "
                   "curve's cumulative rate and r̄ the trace's mean rate (requests / last timestamp), so the order "
                   "and the relative burstiness stay and the rate follows the curve; the last request lands where "
                   "the curve expects as many arrivals as the trace has. A session trace warps its sessions' starts "
                   "(closed loop; turns keep their gaps) or every turn (--sessions recorded). SPEC is "
                   + ARRIVAL_CURVE_FORM + ".")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Replay only the first N requests (lines); a session trace's turns beyond them are dropped.")
@click.option("--bin", "bin_s", type=click.FloatRange(min=0.001), default=60.0, show_default=True,
              help="Seconds of trace time per point of the figure.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write DIR/summary.csv (one row), DIR/workers.csv and DIR/replay.png; with sessions also "
                   "DIR/turns.csv (a row per turn).")
@click.option("--requests", "write_requests", is_flag=True, default=False,
              help="With --out: also write DIR/requests.csv, a row per request (with a session trace, its parent's "
                   "request id, its gap and its parent's finish time). Keeps every record in memory; one process.")
@click.option("--reuse-breakdown/--no-reuse-breakdown", default=None,
              help="Book reuse available and captured (default: the scenario's, on). It keeps every block hash ever "
                   "sent: turn it off for traces of millions of requests to keep memory bounded by the caches.")
@click.option("--slo", callback=slo_option, default=None, help=SLO_HELP)
@click.option("--cpu-kv-gib", "cpu_kv_gib", type=click.FloatRange(min=0), default=None, help=CPU_KV_HELP)
@cpu_kv_connector_option
@shared_kv_option
@peer_fetch_option
@executor_options
@gpu_price_option
@format_option("the row of summary.csv")
@pd_options
@autoscaling_options
def replay(trace_file, trace_path, workers, kv_tokens, kv_blocks, kv_bytes, router, engine, scenario_path, trace_fmt,
           session_timing, infer_sessions, common_requests, block_size, trace_block_size, speed, time_scale, arrival_curve,
           limit, bin_s, out_dir, write_requests, jobs,
           reuse_breakdown, slo, cpu_kv_gib, cpu_kv_connector, shared_kv_gib, peer_fetch, executor_kind, dask_scheduler, prefill_workers=None,
           decode_workers=None, gpu_price_usd=None, autoscaler=None, min_workers=None, max_workers=None,
           timeline_bin_s=None) -> None:
    """Replay a JSONL trace and report prefix reuse, TTFT and throughput.

    The trace, TRACE or --trace FILE, has a request per line. Mooncake: timestamp (ms), input_length, output_length,
    hash_ids; every request is sent at its timestamp (divided by --speed), open loop. Session traces (--trace-format
    bailian: Qwen-Bailian's chat_id, parent_chat_id, timestamp (s), input_length, output_length, type, turn,
    hash_ids; --trace-format kvsim: kvsim's session JSONL; --trace-format mooncake-sessions: Mooncake rows with
    session_id, each a turn's whole prompt; --trace-format mooncake-delta: the same rows, each holding a turn's new
    input only; or a Mooncake trace with --infer-sessions, whose parents are inferred from the hash ids) link each
    turn to the turn it continues: its prompt holds its
    parent's prompt and output, whose output blocks take the ids the turn gives them. --trace-format
    agentic-mooncake (Dynamo's Agentic Mooncake v2, detected by its header): each request is sent at the later of
    its not_before_ms and its dependencies' completion (or dispatch) plus delay_ms; prompts are full, outputs never
    reused, as Dynamo's mocker replays it. They replay closed loop by
    default (--sessions): a turn is sent when its parent has finished, plus the recorded gap (its timestamp minus
    its parent's, or its delay_s). Requests are routed when sent and served by the scenario's
    workers (vLLM-like by default; --engine sglang for SGLang's).
    Reported: prefix reuse = cached prompt tokens / prompt tokens (Dynamo's prefix_cache_reused_ratio), vLLM's
    token hit rate (prefix_cache_hits / queries), request hit rate, TTFT, TPOT and E2E percentiles, throughput,
    goodput (requests meeting --slo or the scenario's slo block), the load of each worker and its imbalance, and
    reuse available / captured (what infinite caches would hit: docs/concepts/hit-rate.md). Memory stays
    bounded by the caches and the requests in flight, whatever the trace's length, with --no-reuse-breakdown; the
    breakdown keeps every distinct block hash of the trace.
    With a router that ignores the cluster's state (round-robin, random, prefix-hash without a load factor), the
    workers are split over --jobs processes, with the same results.
    With --autoscaler (e.g. `--autoscaler hpa --min-workers 1 --max-workers 12`) the fleet is elastic: new workers
    start cold after a provisioning delay, surplus ones drain; one process (docs/concepts/autoscaling.md).
    """
    from sim.workloads.session_traces import trace_format
    from sim.workloads.traces import TraceError

    trace = positional_or_option(trace_file, trace_path, "TRACE", "--trace")
    if trace is None:
        raise UsageExit("give the trace to replay: TRACE or --trace FILE")
    checked_out_dir(out_dir)
    # NOTE: started now, so that matplotlib loads on the other core while the trace replays.
    figure = painter(will_draw=bool(out_dir))
    if write_requests and not out_dir:
        raise UsageExit("--requests writes DIR/requests.csv: give --out DIR")
    try:
        kind = trace_format(trace) if trace_fmt == "auto" else trace_fmt
    except TraceError as err:
        raise click.ClickException(str(err)) from None
    if common_requests is not None and not infer_sessions:
        raise UsageExit("--common-prefix-requests is for --infer-sessions")
    if infer_sessions and kind != "mooncake":
        raise UsageExit(f"--infer-sessions is for Mooncake traces without session ids; this trace is {kind}, whose "
                        "turns name their parent or session")
    if kind == "mooncake" and session_timing is not None and not infer_sessions:
        raise UsageExit(f"--sessions is for session traces ({', '.join(SESSION_FORMATS)}) or --infer-sessions; this "
                        f"trace is {kind} (independent requests, open loop)")
    sessions_of_trace = kind != "mooncake" or infer_sessions
    if time_scale is not None:
        if speed != 1.0:
            raise UsageExit("--time-scale F is --speed 1/F: give one of them")
        speed = 1 / time_scale
    if arrival_curve is not None and kind == "agentic-mooncake":
        raise UsageExit("--arrival-curve warps recorded times; an agentic-mooncake trace is sent by its dependencies "
                        "(warp a Mooncake or session trace)")
    base = on_shared_kv(on_cpu_kv(with_slo(trace_base(scenario_path, engine), slo), cpu_kv_gib), shared_kv_gib)
    base = on_gpu_price(on_peer_fetch(on_cpu_kv_connector(base, cpu_kv_connector), peer_fetch), gpu_price_usd)
    if sessions_of_trace and block_size is None:
        tb = trace_block_size or _session_block_tokens(trace, kind)
        if tb % base.engine.block_size:
            block_size = tb
            console.print(f"engine block size {tb} (the trace's; the scenario's {base.engine.block_size} does not "
                          "divide it): give --block-size for another", highlight=False)
    overrides, B = trace_overrides(base, block_size=block_size, kv_tokens=kv_tokens, kv_blocks=kv_blocks,
                                   kv_bytes=kv_bytes, reuse_breakdown=reuse_breakdown)
    elastic = autoscaled(base, autoscaler)
    if not elastic:
        if workers is None:
            raise UsageExit("give --workers N (or an autoscaler: --autoscaler NAME --max-workers N)")
        overrides["cluster.workers"] = workers
    if prefill_workers is not None or decode_workers is not None:
        base = on_pd(base, prefill_workers, decode_workers)
        if workers != base.cluster.workers:
            raise UsageExit(f"--workers {workers}: a disaggregated cluster has --prefill-workers + --decode-workers "
                            f"= {base.cluster.workers} workers")
    if router is not None:
        if len(router) != 1:
            raise click.BadParameter("give one router", param_hint="--router")
        overrides.update(router_overrides(router[0], base.router.name, base.router.options))
    session_trace = None
    try:
        scenario = base.with_overrides(**overrides)
        scenario = on_autoscaling(scenario, autoscaler, min_workers=min_workers, max_workers=max_workers,
                                  initial_workers=workers if elastic else None, timeline_bin_s=timeline_bin_s)
        workers = scenario.cluster.workers
        if sessions_of_trace:
            session_trace, result, wall_s = _replay_session_trace(
                scenario, trace, kind, session_timing or "closed-loop", trace_block_size, speed, limit, bin_s,
                write_requests, jobs=jobs, executor_kind=executor_kind, arrival_curve=arrival_curve,
                infer_common_requests=(common_requests or DEFAULT_COMMON_REQUESTS) if infer_sessions else None)
        else:
            result, wall_s = _replay_mooncake(scenario, trace, trace_block_size or 512, speed, limit, bin_s,
                                              write_requests, jobs, executor_kind, dask_scheduler,
                                              arrival_curve=arrival_curve)
    except (ScenarioError, TraceError) as err:
        raise click.ClickException(str(err)) from None
    st = result.stats
    sessions = st.session_figures()
    row = {
        **result.row(),
        "wall_s": wall_s, "jobs": result.jobs, "workers": workers, "kv_blocks_per_worker": scenario.num_blocks, "block_size": B,
        "router": router_label(scenario.router.name, scenario.router.options), "engine": scenario.engine.kind,
        "kv_tokens_per_worker": scenario.capacity_tokens,
        # NOTE: only with sessions, so that a replay without them keeps its columns.
        **(sessions.row() if sessions is not None else {}),
        # NOTE: only with a shared store, likewise.
        **(_shared_tier_columns(scenario, result) if scenario.shared_kv_bytes else {}),
        # NOTE: only with G2 peer fetch, likewise.
        **(_peer_fetch_columns(result) if scenario.peer_fetch else {}),
    }
    kv = next((f"--{name}" for name, value in (("kv-tokens", kv_tokens), ("kv-blocks", kv_blocks),
                                                ("kv-bytes", kv_bytes)) if value is not None), "the scenario's")
    table = Table(title=f"replay of {Path(trace).name}: {setup_text(scenario, kv)}; {workers} workers x "
                        f"{scenario.capacity_tokens:,} KV tokens (blocks of {B}), {scenario.router.name}")
    table.add_column("metric", justify="left", key=True)
    table.add_column("value")
    for key, value in row.items():
        table.add_row(key, fmt(value, ".4g") if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"{hit_rates_legend('request_hit_rate', 'prefix_reuse = token_hit_rate')}; {SHARED_FIRST_BLOCK}",
                  highlight=False)
    # NOTE: a disaggregated replay names each worker's pool: requests count on their decode worker, the hits on
    # the worker that prefilled (an aggregated replay's table and workers.csv keep their columns).
    pools = result.pools
    load = Table(title="per worker")
    for col in ("worker", *(("pool",) if pools else ()), "requests", "share of prompt tokens", "token hit rate",
                "preemptions"):
        load.add_column(col, key=col == "worker")
    worker_rows = []
    for w, n, tokens in zip(result.workers, st.requests_per_worker, st.prompt_tokens_per_worker):
        pool = ({"pool": "prefill" if w.worker < pools[0] else "decode"} if pools else {})
        worker_rows.append({"worker": w.worker, **pool, "requests": n, "prompt_tokens": tokens,
                            "token_hit_rate": w.token_hit_rate, "preemptions": w.engine.preemptions})
        load.add_row(str(w.worker), *pool.values(), str(n), f"{tokens / max(1, st.prompt_tokens):.3f}",
                     fmt(worker_rows[-1]["token_hit_rate"]), str(w.engine.preemptions))
    console.print(load)
    show_turns(sessions, host_tier=cpu_kv_gib_of(scenario) > 0)
    if st.sessions.cut:
        console.print(f"{st.sessions.cut:,} sessions closed early: more than {st.max_open_sessions:,} were open at "
                      f"once, so the longest idle ones were ended at their last request so far", highlight=False)
    if kind == "agentic-mooncake":
        console.print(f"{len(session_trace):,} requests in {len(session_trace.play_nodes):,} plays, each sent when its "
                      "dependencies allowed (closed loop)", highlight=False)
    elif session_trace is not None:
        console.print(f"{len(session_trace):,} turns: {session_trace.orphans:,} whose parent is not in the file "
                      f"(replayed as first turns), {session_trace.unlinked:,} whose prompt does not extend their "
                      f"parent's (not linked); {'closed loop' if result.jobs == 1 and (session_timing or 'closed-loop') == 'closed-loop' else 'recorded times'}",
                      highlight=False)
    if result.fleet is not None:
        show_fleet(result.fleet)
    console.print(f"{st.requests} requests in {wall_s:.2f} s wall = {st.requests / wall_s:.0f} requests/s")
    console.data([row], list(row))
    if out_dir:
        out = Path(out_dir)
        write_atomic(out / "summary.csv", csv_bytes([row], list(row)))
        write_atomic(out / "workers.csv", csv_bytes(worker_rows, list(worker_rows[0])))
        write_atomic(out / "replay.png", figure.png("replay_figure", st, title=f"{Path(trace).name}: {workers} "
                                                                             f"workers, {scenario.router.name}"))
        turns = turn_files(sessions)
        for name, data in turns.items():
            write_atomic(out / name, data)
        if write_requests:
            turns["requests.csv"] = b""
            write_atomic(out / "requests.csv", _requests_csv(result.records, session_trace,
                                                                shared_tier=scenario.shared_kv_bytes > 0))
        written = [str(out / name) for name in ("summary.csv", "workers.csv", "replay.png", *turns)]
        if result.fleet is not None:
            written += write_fleet_files(out, result.fleet, title=f"{Path(trace).name}: autoscaled "
                                         f"{scenario.cluster.autoscaling.autoscaler.name}, {scenario.router.name}")
        console.print(f"wrote {', '.join(written[:-1])} and {written[-1]}")
