"""A Kubernetes Service (iptables/nftables mode) with a new connection per request: a uniform random pod.

Membership: kube-proxy programs the Service's ready endpoints (EndpointSlice `conditions.ready`); a terminating pod
leaves the set (it is used only when no endpoint is ready, `ProxyTerminatingEndpoints`, which a draining fleet with a
ready worker never reaches) and a new pod joins when it is ready. The draw is uniform over the routable workers.
"""

from __future__ import annotations

from policies.base import RouterBase
from sim.workloads.request import Request
from sim.routing.interface import ClusterView


class RandomRouter(RouterBase):
    name = "random"
    summary = "uniform random worker per request (a Service with a new connection per request)"
    ignores_cluster_state = True

    def route(self, request: Request, view: ClusterView) -> int:
        # NOTE: randrange(n) and indexing draw exactly what randrange(num_workers) drew for a fixed fleet.
        workers = self.workers
        return workers[self.rng.randrange(len(workers))]
