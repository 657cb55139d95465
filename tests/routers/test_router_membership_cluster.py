"""Routers on a simulated cluster whose membership changes mid-stream: the workers' real engines publish their KV
events, requests complete on workers that left, and every router sends each request to a worker routable at that
moment (a stand-in for the fleet, which calls `set_workers` when workers become ready or start draining)."""

from __future__ import annotations

import pytest
import simpy

from policies import ROUTERS
from sim.cluster.cluster import Cluster
from sim.runner import build_router
from sim.scenario import load_scenario
from sim.workloads.shared_prefix import shared_prefix_stream

CHANGES = [  # (time s, routable slots, their instance ids): 3 leaves, 1 leaves, 3 comes back as a new instance
    (2.0, (0, 1, 2), (0, 1, 2)),
    (4.0, (0, 2), (0, 2)),
    (6.0, (0, 2, 3), (0, 2, 4)),
]

VARIANTS = [(name, {}) for name in ROUTERS if name != "recorded"] + [
    ("kv-aware", {"state": "events", "event_lag_s": 0.2}),
    ("kv-aware", {"state": "approximate", "replicas": 2}),
    ("llm-d", {"preset": "precise"}),
    ("kvsim", {"state": "events"}),
]


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(VARIANTS)])
def test_every_request_goes_to_a_worker_routable_when_it_is_routed(name, options):
    base, _ = load_scenario(None)
    scenario = base.with_overrides(**{"cluster.workers": 4, "workload.prefixes": 6, "router.name": name,
                                      "router.options": options})
    env = simpy.Environment()
    router = build_router(scenario)
    cluster = Cluster(env, scenario, router)
    stream = shared_prefix_stream(scenario.workload, block_size=scenario.engine.block_size, seed=scenario.seed)
    requests = (stream.warmups + tuple(stream.requests))[:120]
    routable = {"now": (0, 1, 2, 3)}
    routed: list[tuple[int, tuple[int, ...]]] = []
    records = []
    route = cluster.route

    def checked_route(request):
        worker = route(request)
        routed.append((worker, routable["now"]))
        return worker

    cluster.route = checked_route

    def membership():
        for at_s, workers, instances in CHANGES:
            yield env.timeout(at_s - env.now)
            routable["now"] = workers
            router.set_workers(workers, instances)

    def arrivals():
        for request in requests:
            cluster.send(request, records.append)
            yield env.timeout(0.07)

    env.process(membership())
    env.process(arrivals())
    env.run()
    assert len(records) == len(requests)
    assert all(worker in workers for worker, workers in routed)
    # every phase routed requests (the warm-ups are sent like the rest here, 0.07 s apart)
    assert {workers for _, workers in routed} == {(0, 1, 2, 3), (0, 1, 2), (0, 2), (0, 2, 3)}
