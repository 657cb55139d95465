"""IPVS's default `rr` scheduler (and Dynamo's frontend default): workers in turn.

Membership follows Dynamo's `PushRouter::round_robin` (`lib/runtime/src/pipeline/network/egress/push_router.rs`):
one counter, incremented per request, taken modulo the *current* number of instances, indexing the current instance
list: `endpoints[counter % len(endpoints)]`. The counter is not reset when the list changes, so after a join or a
leave the turn continues from wherever the counter's remainder now points (a worker may be skipped or take two turns
in a row once). NOTE: IPVS `rr` keeps a cursor on the destination list instead (a removed destination moves it
back one); the two agree on a fixed fleet, and kvsim follows Dynamo's form.
"""

from __future__ import annotations

from policies.base import RouterBase
from sim.workloads.request import Request
from sim.routing.interface import ClusterView


class RoundRobinRouter(RouterBase):
    name = "round-robin"
    summary = "workers in turn (kube-proxy IPVS rr, Dynamo round_robin)"
    ignores_cluster_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._next = 0

    def route(self, request: Request, view: ClusterView) -> int:
        workers = self.workers
        worker = workers[self._next % len(workers)]
        self._next += 1
        return worker
