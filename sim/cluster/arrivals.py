"""How requests are sent: one at a time (warm-ups), a closed loop with C requests in flight, Poisson arrivals."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import simpy

from sim.cluster.cluster import Cluster
from sim.results.records import RequestRecord
from sim.workloads.request import Request


def one_at_a_time(env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], out: list[RequestRecord]):
    """SimPy process: send each request after the previous one completed."""
    for request in requests:
        record = yield cluster.send(request)
        out.append(record)


def closed_loop(
    env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], concurrency: int, out: list[RequestRecord]
):
    """SimPy process: C clients share one ordered stream; each sends its next request when its last one completes.

    Every request is routed independently when sent (a new connection per request).
    """
    stream: Iterator[Request] = iter(requests)

    def client():
        for request in stream:
            record = yield cluster.send(request)
            out.append(record)

    clients = [env.process(client()) for _ in range(concurrency)]
    yield env.all_of(clients)


def poisson(env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], rate_rps: float,
            rng: random.Random, out: list[RequestRecord]):
    """SimPy process: an open loop sending requests at exponential gaps (mean 1 / rate_rps), without waiting for
    responses; ends when every request has completed."""
    pending = []
    for request in requests:
        yield env.timeout(rng.expovariate(rate_rps))
        pending.append(cluster.send(request))
    results = yield env.all_of(pending)
    out.extend(results[e] for e in pending)
