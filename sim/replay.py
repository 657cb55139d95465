"""Replay of timed requests (traces, synthetic Poisson streams) open loop, in one process or split over several, and
of sessions (session-structured traces) closed loop, in one process.

A router that ignores the cluster's state (round-robin, random, strict prefix-hash, recorded) sends each request
to the same worker whatever the workers do, and workers on different devices never interact. Such a replay splits
exactly by device: every process routes the whole stream (cheap), simulates only its own devices' workers and drops
the other requests; the statistics are then merged. Same numbers as one process, in about 1 / jobs of the time.
A closed-loop session replay does not split: when a turn is sent depends on when its parent finished, and that
depends on everything its worker serves, so no process could time its own workers' turns without the others'.
This module is the replay's composition root (like `sim.runner` for runs).
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import simpy

from sim.cluster.arrivals import sessions as drive_sessions
from sim.cluster.collector import fewer_collections
from sim.results.cost import DeviceTime, cost_columns
from sim.results.records import RequestRecord, WorkerCounters, prefix_cache_hit_rate, total_counters
from sim.results.streaming_pd import PdTally
from sim.results.summary import slo_columns
from sim.runner import build_cluster, build_router, elastic_device_time
from sim.scenario import Scenario
from sim.results.streaming_stats import StreamingStats
from sim.results.timeline import FleetRecord
from sim.workloads.sessions import Session
from sim.workloads.traces import TraceRequest

Trace = Iterable[TraceRequest]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """A trace replay: streaming statistics (bounded memory), per-worker counters, what was refused."""

    stats: StreamingStats
    workers: tuple[WorkerCounters, ...]
    simulated_s: float
    rejected: int
    """Requests longer than the engine accepts (max_model_len or the whole KV cache): vLLM answers them HTTP 400."""
    jobs: int = 1
    """Processes the replay was split over."""
    records: tuple[RequestRecord, ...] = ()
    """Every request's record, in completion order, when the replay was asked to keep them (`keep_records`);
    empty otherwise (a replay's memory is bounded by the caches, not by the trace)."""
    pools: tuple[int, int] | None = None
    """A disaggregated cluster's (prefill workers, decode workers): workers 0..P-1 prefill; None: aggregated."""
    pool_busy_s: tuple[float, float] = (0.0, 0.0)
    """A disaggregated cluster's device busy time summed per pool over the replay: (prefill, decode)."""
    pd: PdTally | None = None
    """A disaggregated cluster's transfers and TTFT split, counted as requests finished (None: aggregated)."""
    device_time: tuple[DeviceTime, ...] = ()
    """The time each device was provisioned over the replay, with its price (`sim.results.cost`): what the
    summary's GPU-hours and cost are derived from (empty: not filled)."""
    fleet: FleetRecord | None = None
    """An autoscaled cluster's fleet: its instances, decisions and timeline (None: a fixed fleet)."""

    def pd_row(self) -> dict[str, float | int]:
        """A disaggregated replay's P/D columns (`PD_COLUMNS`, as `kvsim run`'s summary has them), each pool's
        utilisation over the replay's span (first request sent to last finished); empty for an aggregated one."""
        if self.pools is None or self.pd is None:
            return {}
        span_s = self.stats.span_s
        utilisation = tuple(busy / (n * span_s) if span_s > 0 else float("nan")
                            for busy, n in zip(self.pool_busy_s, self.pools))
        return self.pd.figures(prefill_workers=self.pools[0], decode_workers=self.pools[1],
                               utilisation=utilisation).row()

    def row(self) -> dict[str, float | int]:
        """The replay's figures as flat columns (`kvsim replay`'s summary.csv, `kvsim compare --trace`): prefix reuse
        and vLLM's token hit rate from the counters, percentiles from the streaming histograms."""
        st = self.stats
        engine = total_counters(self.workers)
        return {
            "requests": st.requests, "rejected": self.rejected, "prefix_reuse": st.prefix_reuse,
            "reuse_available": st.reuse_available, "reuse_captured": st.reuse_captured,
            "view_false_hit_rate": st.view_false_hit_rate,
            "token_hit_rate": prefix_cache_hit_rate(engine.prefix_cache), "request_hit_rate": st.request_hit_rate,
            "ttft_p50_ms": st.ttft_ms.percentile(50), "ttft_p90_ms": st.ttft_ms.percentile(90),
            "ttft_p99_ms": st.ttft_ms.percentile(99), "e2e_p50_ms": st.e2e_ms.percentile(50),
            "throughput_rps": st.throughput_rps, "preemptions": engine.preemptions,
            "evicted_blocks": engine.evicted_blocks, "simulated_s": self.simulated_s,
            **self.slo_row(),
            "cpu_hit_rate": st.cpu_hit_rate, "cpu_prefix_reuse": st.cpu_prefix_reuse,
            "cpu_stored_blocks": engine.cpu_stored_blocks, "cpu_loaded_blocks": engine.cpu_loaded_blocks,
            "cpu_evicted_blocks": engine.cpu_evicted_blocks,
            # NOTE: only for a disaggregated cluster, so that an aggregated replay keeps its columns.
            **self.pd_row(),
            # NOTE: only for an autoscaled fleet, likewise.
            **(self.fleet.row() if self.fleet is not None else {}),
            **self.cost_row(),
        }

    def cost_row(self) -> dict[str, float]:
        """The cost columns (`sim.results.cost.COST_COLUMNS`) over the replay: its devices' time over the simulated
        span and the tokens and SLO-meeting requests of what finished."""
        st = self.stats
        return cost_columns(self.device_time, span_s=self.simulated_s, input_tokens=st.prompt_tokens,
                            output_tokens=st.output_tokens, slo_met_requests=st.slo_met_requests,
                            slo_set=st.slo.is_set)

    def slo_row(self) -> dict[str, float | int]:
        """The SLO, goodput, TPOT / E2E tail and load-balance columns, as `Summary.row()` names them."""
        st = self.stats
        return {
            **slo_columns(st.slo), "slo_met_requests": st.slo_met_requests, "goodput_rps": st.goodput_rps,
            "goodput_fraction": st.goodput_fraction, "tpot_p50_ms": st.tpot_ms.percentile(50),
            "tpot_p99_ms": st.tpot_ms.percentile(99), "e2e_p99_ms": st.e2e_ms.percentile(99),
            "imbalance_max_mean": st.imbalance_max_mean, "jain_index": st.jain_index,
            "ttft_slo_met": st.ttft_slo_met, "tpot_slo_met": st.tpot_slo_met, "e2e_slo_met": st.e2e_slo_met,
        }


def replay(scenario: Scenario, trace: Trace | Callable[[], Trace], *, bin_s: float = 60.0,
           fast_forward: bool = True, jobs: int = 1, executor=None, keep_records: bool = False) -> ReplayResult:
    """Replay timed requests open loop (each sent at its arrival time, routed then) through the scenario's cluster.

    The trace is consumed lazily and finished requests are folded into `StreamingStats` at once, so memory stays
    bounded by the caches and the requests in flight, not by the length of the trace. `trace` may be a function
    that opens the trace anew: then, with `jobs` > 1, the replay is split over up to `jobs` processes when
    `device_groups` allows it (one process otherwise). `keep_records` keeps every request's record (one process).
    """
    if executor is not None:
        jobs = executor.jobs
    groups = device_groups(scenario, jobs if callable(trace) and not keep_records else 1)
    if len(groups) <= 1:
        return with_device_time(scenario, _replay(scenario, trace() if callable(trace) else trace, bin_s=bin_s,
                                                  fast_forward=fast_forward, keep_records=keep_records))
    if executor is not None:
        # NOTE: the parts travel to the executor's processes (or machines), so the trace opener is pickled: give a
        # module-level function or a functools.partial of one, not a lambda.
        parts = executor.map(_replay_part, [(scenario, trace, owned, bin_s, fast_forward) for owned in groups])
        return with_device_time(scenario, _merge_parts(groups, parts))
    return with_device_time(scenario, _replay_split(scenario, trace, groups, bin_s=bin_s, fast_forward=fast_forward))


def with_device_time(scenario: Scenario, result: ReplayResult) -> ReplayResult:
    """`result` with its devices' time: a fixed fleet is provisioned for the whole simulated span, from 0 to the
    last event (`simulated_s`). A result that already carries its device time (an elastic fleet's, counted slot by
    slot as it ran) keeps it."""
    if result.device_time:
        return result
    return replace(result, device_time=scenario.fleet_device_time(result.simulated_s))


def _replay_part(args: tuple) -> ReplayResult:
    scenario, open_trace, owned, bin_s, fast_forward = args
    return _replay(scenario, open_trace(), bin_s=bin_s, fast_forward=fast_forward, owned=owned)


def device_groups(scenario: Scenario, jobs: int) -> list[frozenset[int]]:
    """How a replay of `scenario` splits over at most `jobs` processes: the workers each process simulates (whole
    devices, balanced by worker count). One group when it cannot split: one job, one device, a router that reads
    the cluster (its choices depend on what every worker does), a cluster-shared KV store (every worker reads what
    the others stored), G2 peer fetch (every worker reads the others' host tiers), an autoscaled fleet (who is
    routable depends on the whole load) or no `fork` on this platform."""
    workers = scenario.cluster.workers
    if (jobs <= 1 or scenario.shared_kv_bytes or scenario.peer_fetch or scenario.cluster.autoscaling is not None
            or not getattr(build_router(scenario), "ignores_cluster_state", False)
            or "fork" not in multiprocessing.get_all_start_methods()):
        return [frozenset(range(workers))]
    devices, first = [], 0
    for dev in scenario.cluster.devices():
        devices.append(range(first, first + dev.workers))
        first += dev.workers
    # NOTE: largest devices first, each to the group with the fewest workers so far (ties: the lowest index).
    groups: list[set[int]] = [set() for _ in range(min(jobs, len(devices)))]
    for device in sorted(devices, key=len, reverse=True):
        min(groups, key=len).update(device)
    return [frozenset(g) for g in groups]


def _simulation(scenario: Scenario, bin_s: float, fast_forward: bool, keep_records: bool):
    """A replay's SimPy environment, cluster, streaming statistics, the records list (filled only with
    `keep_records`), the callback that takes each finished request's record and, for a disaggregated cluster, the
    tally of its P/D figures (None otherwise)."""
    env = simpy.Environment()
    cluster = build_cluster(env, scenario, build_router(scenario), fast_forward=fast_forward)
    stats = StreamingStats(num_workers=len(cluster.workers), bin_s=bin_s, slo=scenario.slo.to_slo())
    records: list[RequestRecord] = []
    tally = PdTally() if scenario.cluster.disaggregation is not None else None
    if not keep_records and tally is None:
        return env, cluster, stats, records, stats.add, tally

    def on_record(record: RequestRecord) -> None:
        stats.add(record)
        if tally is not None:
            tally.add(record)
        if keep_records:
            records.append(record)

    return env, cluster, stats, records, on_record, tally


def _result(scenario: Scenario, env, cluster, stats: StreamingStats, rejected: int, records: list[RequestRecord],
            tally: PdTally | None) -> ReplayResult:
    """The replay's result once its environment has run out; a disaggregated cluster's pools and busy time too."""
    pd = scenario.cluster.disaggregation
    if pd is None:
        if cluster.fleet is None:
            return ReplayResult(stats, cluster.counters(), env.now, rejected, records=tuple(records))
        fleet = cluster.fleet.result(env.now)
        return ReplayResult(stats, cluster.counters(), env.now, rejected, records=tuple(records), fleet=fleet,
                            device_time=elastic_device_time(scenario, fleet, 0.0, env.now))
    P = pd.prefill.workers
    busy = [d.busy_s for d in cluster.devices]  # NOTE: a pool worker has a device of its own, prefill pool first
    return ReplayResult(stats, cluster.counters(), env.now, rejected, records=tuple(records),
                        pools=(P, pd.decode.workers), pool_busy_s=(sum(busy[:P]), sum(busy[P:])), pd=tally)


def replay_sessions(scenario: Scenario, sessions: Iterable[Session], *, bin_s: float = 60.0,
                    fast_forward: bool = True, keep_records: bool = False) -> ReplayResult:
    """Replay `sessions` (in start order) closed loop through the scenario's cluster, in one process (see the module
    docstring): each session starts at its `start_s`, and each request its completions make due is sent after its
    delay (`sim.cluster.arrivals.sessions`). Requests longer than the engine accepts are refused (counted in
    `rejected`), and what would have followed them in their session is never sent."""
    env, cluster, stats, records, on_record, tally = _simulation(scenario, bin_s, fast_forward, keep_records)
    max_tokens = scenario.max_request_tokens
    rejected = 0

    def admit(request) -> bool:
        nonlocal rejected
        if request.prompt_tokens + request.output_tokens > max_tokens:
            rejected += 1
            return False
        return True

    done = env.process(drive_sessions(env, cluster, sessions, on_record, on_session_end=stats.end_session,
                                      admit=admit))
    _run(env, cluster, done)
    return with_device_time(scenario, _result(scenario, env, cluster, stats, rejected, records, tally))


def _replay(scenario: Scenario, trace: Trace, *, bin_s: float, fast_forward: bool,
            owned: frozenset[int] | None = None, keep_records: bool = False) -> ReplayResult:
    env, cluster, stats, records, on_record, tally = _simulation(scenario, bin_s, fast_forward, keep_records)
    max_tokens = scenario.max_request_tokens
    rejected = 0

    def arrivals():
        nonlocal rejected
        for item in trace:
            request = item.request
            if request.prompt_tokens + request.output_tokens > max_tokens:
                rejected += 1
                continue
            worker = None
            if owned is not None:
                # NOTE: this router ignores the cluster, so it may route ahead of the clock; other processes
                # simulate the workers this one does not own.
                worker = cluster.route(request)
                if worker not in owned:
                    cluster.book_elsewhere(request, worker)
                    continue
            if item.arrival_s > env.now:
                yield env.timeout(item.arrival_s - env.now)
            if worker is None:
                cluster.send(request, on_record)  # route and dispatch (a disaggregated cluster: through its pools)
            else:
                cluster.dispatch(request, worker, on_record)
        if getattr(cluster, "fleet", None) is not None:
            yield cluster.fleet.all_completed()

    _run(env, cluster, env.process(arrivals()))
    return _result(scenario, env, cluster, stats, rejected, records, tally)


def _run(env: simpy.Environment, cluster, done: simpy.Event) -> None:
    """Run the replay to its end: until nothing is left or, with an autoscaler (which ticks for ever), until `done`
    (the driver, which waits for every request to complete)."""
    with fewer_collections():
        env.run(until=done if getattr(cluster, "fleet", None) is not None else None)


def _replay_split(scenario: Scenario, open_trace: Callable[[], Trace], groups: list[frozenset[int]], *,
                  bin_s: float, fast_forward: bool) -> ReplayResult:
    context = multiprocessing.get_context("fork")  # the trace opener is inherited, not pickled
    children = []
    try:
        for owned in groups:
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_run_part, args=(send, scenario, open_trace, owned, bin_s, fast_forward),
                                    daemon=True)
            child.start()
            send.close()
            children.append((child, receive))
        parts = []
        for child, receive in children:
            try:
                ok, value = receive.recv()
            except EOFError:
                child.join()
                raise RuntimeError(f"replay: a worker process died (exit code {child.exitcode})") from None
            if not ok:
                raise value
            parts.append(value)
    finally:
        for child, receive in children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()
    return _merge_parts(groups, parts)


def _merge_parts(groups: list[frozenset[int]], parts: list[ReplayResult]) -> ReplayResult:
    """One replay's result from its parts: the statistics merged, each worker's counters from the part that owned it."""
    stats = parts[0].stats
    for part in parts[1:]:
        stats.merge(part.stats)
    owner = {w: part for owned, part in zip(groups, parts) for w in owned}
    workers = tuple(owner[w.worker].workers[w.worker] for w in parts[0].workers)
    pd = parts[0].pd
    for part in parts[1:]:
        if pd is not None and part.pd is not None:
            pd.merge(part.pd)
    busy = tuple(sum(p.pool_busy_s[i] for p in parts) for i in range(2))  # a part's devices are its own
    return ReplayResult(stats, workers, max(p.simulated_s for p in parts), parts[0].rejected, jobs=len(parts),
                        pools=parts[0].pools, pool_busy_s=busy, pd=pd)


def _run_part(send, scenario: Scenario, open_trace: Callable[[], Trace], owned: frozenset[int], bin_s: float,
              fast_forward: bool) -> None:
    try:
        result = _replay(scenario, open_trace(), bin_s=bin_s, fast_forward=fast_forward, owned=owned)
        send.send((True, result))
    except BaseException as err:  # noqa: BLE001 - handed to the parent, which raises it
        try:
            pickle.dumps(err)
        except Exception:  # noqa: BLE001
            err = RuntimeError(f"{type(err).__name__}: {err}")
        send.send((False, err))
    finally:
        send.close()
