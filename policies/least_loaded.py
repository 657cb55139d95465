"""Least-loaded routing: the worker with the fewest of this router's in-flight requests (or prompt tokens).

Upstream rule, checked against the code:
* Dynamo `--router-mode least-loaded` (`ai-dynamo/dynamo` `lib/runtime/src/pipeline/network/egress/push_router.rs`
  `PushRouter::least_loaded` @020ac7f, `lib/runtime/src/component/client.rs`
  `RoutingOccupancyState::select_exact_min_and_increment`): load = the router process's own count of requests
  dispatched to an instance whose response stream has not ended (incremented under a lock at selection, decremented
  when the stream is dropped); argmin over the free instances; ties broken uniformly at random by reservoir sampling.
  Older releases took `min_by_key`, i.e. the first minimum in instance order.
* KubeAI `LeastLoad`, its default strategy (`kubeai-project/kubeai` `internal/loadbalancer/balance_least_load.go`
  @f442a2c): the endpoint with the fewest in-flight requests, strict `<` over a Go map, so ties go to whichever
  tied endpoint the (randomised) map iteration meets first.

Decision, with in_flight the router's own counts (`RouterBase.in_flight`, per router replica):

    load_w = in_flight[w]                (load=requests, both products)
           = in_flight_tokens[w]         (load=tokens: prompt tokens in flight, a variant neither product ships)
    w*     = uniform choice among argmin_w load_w          (w over the routable workers)

Membership: Dynamo selects over the client's current free instances (an instance that left discovery is not a
candidate; a new one starts at 0 in flight); KubeAI over the endpoints of its current EndpointSlice. A worker that
left keeps its count until its requests complete, and is not a candidate meanwhile.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from policies.base import RouterBase, RouterOptions
from sim.routing.interface import ClusterView
from sim.workloads.request import Request


class LeastLoadedOptions(RouterOptions):
    load: Literal["requests", "tokens"] = Field(
        "requests", description="What is counted per worker: in-flight requests (Dynamo --router-mode least-loaded, "
                                "KubeAI LeastLoad) or in-flight prompt tokens (a variant; neither product has it).")


class LeastLoadedRouter(RouterBase):
    """Fewest in-flight requests (or prompt tokens) of this router; ties uniformly at random from `self.rng`.

    Invariant: the choice depends only on this router's own dispatch/complete hooks, never on the cluster view.
    """

    name = "least-loaded"
    summary = "fewest router in-flight requests (Dynamo least-loaded, KubeAI LeastLoad); random ties"
    Options = LeastLoadedOptions

    def route(self, request: Request, view: ClusterView) -> int:
        loads = self.in_flight if self.options.load == "requests" else self.in_flight_tokens
        # NOTE: a uniform draw among the tied workers is what Dynamo's reservoir sampling yields in distribution.
        return self.random_argmin(loads)
