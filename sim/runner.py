"""The composition root: `run(scenario) -> RunResult`. Builds the cluster and its router, sends the workload.

Pure: nothing is printed or written here.
"""

from __future__ import annotations

from typing import Any

import simpy

from policies import AUTOSCALERS, PD_ROUTERS, ROUTERS
from sim.cluster.arrivals import closed_loop, one_at_a_time, poisson, sessions, timed
from sim.cluster.cluster import Cluster
from sim.cluster.collector import fewer_collections
from sim.cluster.disaggregated import DisaggregatedCluster
from sim.config import Problem, ProblemsError, suggestion
from sim.results.cost import DeviceTime
from sim.results.records import RequestRecord, RunResult
from sim.results.timeline import FleetRecord
from sim.routing.interface import Router
from sim.routing.replicas import ReplicatedRouter
from sim.routing.spec import RouterSpec
from sim.scaling import Autoscaler, AutoscalerFactory
from sim.scenario import Scenario, ScenarioError
from sim.workloads.arrival_curve import ConstantCurve, arrival_times_s
from sim.workloads.session_workload import SessionWorkload
from sim.workloads.shared_prefix import RequestStream, rng_for, shared_prefix_stream


def router_class(name: str):
    """The registered router class `name` (its `Options`, `parse_options` and `search_space`), for studies that
    must read a router's options without importing `policies`; a ScenarioError names the allowed routers."""
    factory = ROUTERS.get(name) or PD_ROUTERS.get(name)
    if factory is None:
        raise ScenarioError(f"router.name: {unknown_router(name)}")
    return factory


def unknown_router(name: str) -> str:
    """`unknown router 'NAME'`, with the nearest registered name (or all of them)."""
    return f"unknown router {name!r}; {suggestion(name, sorted(ROUTERS) + sorted(PD_ROUTERS))}"


def router_problems(data: Any) -> list[Problem]:
    """What is wrong with the `router:` section of a scenario file's `data` that only the router registry can see:
    an unknown name, or each option its router does not take (a check for `load_scenario`, which sits below the
    registry). Nothing when the section itself is malformed: the scenario's own validation says so."""
    try:
        spec = RouterSpec.model_validate(data.get("router", {}) if isinstance(data, dict) else {})
    except ValueError:  # pydantic's ValidationError too
        return []
    if spec.name not in ROUTERS and spec.name not in PD_ROUTERS:
        return [Problem(("router", "name"), unknown_router(spec.name))]
    try:
        router_class(spec.name).parse_options(dict(spec.options))
    except ProblemsError as err:
        return [Problem(("router", "options", *p.loc), p.message) for p in err.problems]
    return []


def build_router(scenario: Scenario) -> Router:
    """The scenario's router; with option `replicas: R` > 1, R of them behind a random spread
    (`sim.routing.replicas.ReplicatedRouter`), replica r drawing from its own random stream."""
    spec = scenario.router
    factory = router_class(spec.name)
    if scenario.cluster.disaggregation is not None:
        return build_pd_router(scenario)
    if getattr(factory, "disaggregated", False):
        raise ScenarioError(f"router.name: {spec.name} routes a disaggregated cluster; set cluster.disaggregation "
                            f"(kvsim --prefill-workers P --decode-workers D) or use one of: {', '.join(sorted(ROUTERS))}")

    def build(replica: int) -> Router:
        return factory(
            num_workers=scenario.cluster.workers,
            block_size=scenario.engine.block_size,
            rng=rng_for(scenario.seed, "router" if replica == 0 else f"router-{replica}"),
            options=dict(spec.options),
        )

    try:
        router = build(0)
        replicas = router.options.replicas
        if replicas == 1:
            return router
        return ReplicatedRouter(lambda r: router if r == 0 else build(r), replicas,
                                rng_for(scenario.seed, "router-replicas"))
    except ValueError as err:
        raise ScenarioError(f"router.options ({spec.name}): {err}") from None


def build_pd_router(scenario: Scenario):
    """A disaggregated cluster's router: the scenario's disaggregated router, or an aggregated one on each pool
    (`pd-stages` with that router and its options for both the prefill and the decode pool)."""
    spec, pd = scenario.router, scenario.cluster.disaggregation
    name, options = spec.name, dict(spec.options)
    if name not in PD_ROUTERS:
        if options.get("replicas", 1) != 1:
            raise ScenarioError(f"router.options ({name}): replicas is not supported on a disaggregated cluster")
        name, options = "pd-stages", {"prefill_router": name, "prefill_options": options,
                                      "decode_router": name, "decode_options": options}
    try:
        return PD_ROUTERS[name](num_prefill_workers=pd.prefill.workers, num_decode_workers=pd.decode.workers,
                                block_size=scenario.engine.block_size, rng=rng_for(scenario.seed, "router"),
                                options=options, stage_routers=ROUTERS)
    except ValueError as err:
        raise ScenarioError(f"router.options ({spec.name}): {err}") from None


def autoscaler_class(name: str) -> AutoscalerFactory:
    """The registered autoscaler `name` (`policies.AUTOSCALERS`); a ScenarioError names the allowed ones."""
    factory = AUTOSCALERS.get(name)
    if factory is None:
        raise ScenarioError(f"cluster.autoscaling.autoscaler.name: unknown autoscaler {name!r}; "
                            f"{suggestion(name, sorted(AUTOSCALERS))}")
    return factory


def autoscaler_problems(data: Any) -> list[Problem]:
    """What is wrong with a scenario file's `cluster.autoscaling.autoscaler` that only the autoscaler registry can see
    (a check for `load_scenario`, as `router_problems`): an unknown name, or each option its autoscaler does not
    take. Nothing when the section is absent or malformed (the scenario's own validation says so)."""
    cluster = data.get("cluster") if isinstance(data, dict) else None
    scaling = cluster.get("autoscaling") if isinstance(cluster, dict) else None
    spec = scaling.get("autoscaler") if isinstance(scaling, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return []
    loc = ("cluster", "autoscaling", "autoscaler")
    factory = AUTOSCALERS.get(spec["name"])
    if factory is None:
        return [Problem((*loc, "name"), f"unknown autoscaler {spec['name']!r}; "
                                        f"{suggestion(spec['name'], sorted(AUTOSCALERS))}")]
    options = spec.get("options") or {}
    parse = getattr(factory, "parse_options", None)
    if parse is None or not isinstance(options, dict):
        return []
    try:
        parse(dict(options))
    except ProblemsError as err:
        return [Problem((*loc, "options", *p.loc), p.message) for p in err.problems]
    return []


def build_autoscaler(scenario: Scenario) -> Autoscaler | None:
    """The scenario's autoscaler (`cluster.autoscaling.autoscaler`), built with the fleet's bounds; None for a fixed
    fleet. Bad options are a ScenarioError naming them."""
    spec = scenario.cluster.autoscaling
    if spec is None:
        return None
    factory = autoscaler_class(spec.autoscaler.name)
    try:
        return factory(min_workers=spec.min_workers, max_workers=spec.max_workers,
                       options=dict(spec.autoscaler.options))
    except ValueError as err:
        raise ScenarioError(f"cluster.autoscaling.autoscaler.options ({spec.autoscaler.name}): {err}") from None


def elastic_device_time(scenario: Scenario, fleet: FleetRecord, start_s: float, end_s: float
                      ) -> tuple[DeviceTime, ...]:
    """An autoscaled fleet's `DeviceTime`: one entry per instance that held its slot's device in [start_s, end_s],
    for the seconds it did (starting, ready and draining), on that slot's device."""
    devices = scenario.cluster.devices()
    out = []
    for span in fleet.instances:
        seconds = span.provisioned_s(start_s, end_s)
        if seconds > 0:
            dev = devices[span.slot]
            hardware, gpus, price = scenario.device_price(dev)
            out.append(DeviceTime(device=dev.name, hardware=hardware, gpus=gpus, price_per_hour_usd=price,
                                  seconds=seconds))
    return tuple(out)


def build_cluster(env: simpy.Environment, scenario: Scenario, router, *, fast_forward: bool = True):
    """The scenario's cluster: aggregated (`Cluster`, elastic with `cluster.autoscaling`) or, with
    `cluster.disaggregation`, `DisaggregatedCluster`."""
    if scenario.cluster.disaggregation is not None:
        return DisaggregatedCluster(env, scenario, router, fast_forward=fast_forward)
    return Cluster(env, scenario, router, fast_forward=fast_forward, autoscaler=build_autoscaler(scenario))


def run(scenario: Scenario, stream: RequestStream | None = None, *, fast_forward: bool = True) -> RunResult:
    """Simulate one scenario: warm-ups one at a time, then the measured requests (closed loop, Poisson, or Poisson
    at a rate that follows `workload.arrival_curve`); a sessions workload is driven by the session driver
    (`sim.cluster.arrivals.sessions`: session starts at a rate or a curve's, or C sessions at once), with no warm-up.

    `stream` replaces the scenario's generated workload (e.g. the requests of a measured run). `fast_forward`
    advances decode-only stretches as one event (same results; off only to check that)."""
    env = simpy.Environment()
    cluster = build_cluster(env, scenario, build_router(scenario), fast_forward=fast_forward)
    if scenario.has_sessions:
        if stream is not None:
            raise ScenarioError(f"scenario {scenario.name!r}: a sessions workload is not replaced by a request stream")
        stream = RequestStream((), ())
    arrival_times = None if scenario.has_sessions else curve_arrivals(scenario)
    if stream is None and not scenario.has_sessions:
        stream = shared_prefix_stream(scenario.workload, block_size=scenario.engine.block_size, seed=scenario.seed,
                                      num_requests=None if arrival_times is None else len(arrival_times))
    records: list[RequestRecord] = []
    marks: dict[str, object] = {}

    def experiment():
        yield env.process(one_at_a_time(env, cluster, stream.warmups, records))
        marks["start_s"] = env.now
        marks["warm"] = cluster.counters()
        marks["busy"] = [d.busy_s for d in cluster.devices]
        workload = scenario.workload
        if scenario.has_sessions:
            source = SessionWorkload(workload, block_size=scenario.engine.block_size, seed=scenario.seed)
            yield env.process(sessions(env, cluster, source, records.append,
                                       concurrency=workload.concurrent_sessions))
        elif arrival_times is not None:
            yield env.process(timed(env, cluster, stream.requests, arrival_times, records))
        elif not workload.open_loop:
            yield env.process(closed_loop(env, cluster, stream.requests, workload.concurrency, records))
        else:  # arrival_rate_rps, or a constant curve without duration_s: the same Poisson draws
            rate_rps = (workload.arrival_rate_rps if workload.arrival_curve is None
                        else workload.arrival_curve.rate_rps)
            yield env.process(poisson(env, cluster, stream.requests, rate_rps, rng_for(scenario.seed, "arrivals"),
                                      records))
        marks["end_s"] = env.now

    done = env.process(experiment())
    fleet = getattr(cluster, "fleet", None)
    # NOTE: an autoscaler ticks for ever: an autoscaled run ends with its experiment.
    with fewer_collections():
        env.run(until=done if fleet is not None else None)
    if "end_s" not in marks:
        raise RuntimeError(f"scenario {scenario.name!r}: the simulation stopped before every request completed")
    end = cluster.counters()
    return RunResult(
        scenario_name=scenario.name,
        num_workers=len(cluster.workers),
        records=tuple(sorted(records, key=lambda r: r.request_id)),
        workers=tuple(e.minus(w) for e, w in zip(end, marks["warm"])),
        measured_start_s=marks["start_s"],
        measured_end_s=marks["end_s"],
        slo=scenario.slo.to_slo(),
        **pool_figures(scenario, cluster, marks),
        shared_tier=scenario.shared_kv_bytes > 0,
        peer_fetch=scenario.peer_fetch,
        **_fleet_fields(scenario, None if fleet is None else fleet.result(env.now), marks),
    )


def curve_arrivals(scenario: Scenario) -> list[float] | None:
    """A shared-prefix workload's arrival times (s after the warm-ups) from its `arrival_curve` (stream `arrivals`):
    those in [0, duration_s), else the first `num_requests`. None without a curve, and for a constant curve without
    duration_s, which `poisson` draws as `arrival_rate_rps` does (the same draws, the same results)."""
    w = scenario.workload
    if w.arrival_curve is None:
        return None
    curve = w.arrival_curve.curve()
    if isinstance(curve, ConstantCurve) and w.duration_s is None:
        return None
    times = list(arrival_times_s(curve, rng_for(scenario.seed, "arrivals"), until_s=w.duration_s,
                                 limit=None if w.duration_s is not None else w.num_requests))
    if len(times) <= w.discard_first:
        raise ScenarioError(f"workload.arrival_curve: {len(times)} arrival(s) in duration_s {w.duration_s:g} s, "
                            f"none left to measure after discard_first {w.discard_first}; lengthen duration_s or "
                            "raise the rate")
    return times


def _fleet_fields(scenario: Scenario, fleet: FleetRecord | None, marks: dict[str, object]) -> dict[str, object]:
    """The run's device time over the measured phase and, autoscaled, its fleet."""
    if fleet is None:
        # NOTE: a fixed fleet is paid for over the whole measured phase, busy or idle.
        return {"device_time": scenario.fleet_device_time(marks["end_s"] - marks["start_s"])}
    return {"fleet": fleet, "device_time": elastic_device_time(scenario, fleet, marks["start_s"], marks["end_s"])}


def pool_figures(scenario: Scenario, cluster, marks: dict[str, object]) -> dict[str, object]:
    """A disaggregated run's `RunResult` fields: its pools' sizes and each pool's device utilisation over the
    measured phase (nothing for an aggregated run)."""
    pd = scenario.cluster.disaggregation
    if pd is None:
        return {}
    span_s = marks["end_s"] - marks["start_s"]
    busy = [d.busy_s - b for d, b in zip(cluster.devices, marks["busy"])]
    P = pd.prefill.workers

    def utilisation(part: list[float]) -> float:
        return sum(part) / (len(part) * span_s) if span_s > 0 else float("nan")

    return {"pools": (P, pd.decode.workers), "pool_utilisation": (utilisation(busy[:P]), utilisation(busy[P:]))}
