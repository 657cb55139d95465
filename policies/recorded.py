"""Replays a recorded assignment: request i goes where it went in a measured run (for `kvsim validate`)."""

from __future__ import annotations

from pydantic import Field

from policies.base import RouterBase, RouterOptions
from sim.workloads.request import Request
from sim.routing.interface import ClusterView


class RecordedOptions(RouterOptions):
    workers: dict[int, int] = Field(description="Worker index by request id, as measured.")


class RecordedRouter(RouterBase):
    name = "recorded"
    summary = "sends each request to the worker it went to in a measured run (validate's default)"
    Options = RecordedOptions
    ignores_cluster_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        bad = {r: w for r, w in self.options.workers.items() if not 0 <= w < self.num_workers}
        if bad:
            raise ValueError(f"workers: request {next(iter(bad))} was sent to worker {next(iter(bad.values()))}, "
                             f"but the cluster has {self.num_workers}")

    def route(self, request: Request, view: ClusterView) -> int:
        try:
            worker = self.options.workers[request.request_id]
        except KeyError:
            raise ValueError(f"recorded router: no worker recorded for request {request.request_id}") from None
        if worker not in self.workers:
            # A measured assignment names fixed workers: replaying it on a fleet that changed has no answer.
            raise ValueError(f"recorded router: request {request.request_id} was recorded on worker {worker}, which is "
                             f"not routable now (routable: {', '.join(map(str, self.workers))})")
        return worker
