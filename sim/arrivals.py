"""How requests are sent: one at a time (warm-ups) and a closed loop with C requests in flight."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import simpy

from sim.cluster import Cluster
from sim.records import RequestRecord
from sim.request import Request


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
