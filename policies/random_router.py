"""A Kubernetes Service (iptables/nftables mode) with a new connection per request: a uniform random pod."""

from __future__ import annotations

from policies.base import RouterBase
from sim.workloads.request import Request
from sim.routing.interface import ClusterView


class RandomRouter(RouterBase):
    name = "random"
    summary = "uniform random worker per request (a Service with a new connection per request)"
    ignores_cluster_state = True

    def route(self, request: Request, view: ClusterView) -> int:
        return self.rng.randrange(self.num_workers)
