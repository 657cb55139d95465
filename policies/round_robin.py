"""IPVS's default `rr` scheduler (and Dynamo's frontend default): workers in turn."""

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
        worker = self._next % self.num_workers
        self._next += 1
        return worker
