"""Several replicas of one router in front of the same workers, each with its own state (index, load counts)."""

from __future__ import annotations

import random
from collections.abc import Callable

from sim.routing.interface import ClusterView, Router
from sim.workloads.request import Request


class ReplicatedRouter:
    """`replicas` independent routers; each request goes to one of them, uniformly at random (a Service in front
    of the router pods, a new connection per request), and that replica routes it and gets its hooks.

    Each replica keeps its own state: an approximate index holds only what that replica routed, router-side load
    counts only its own requests (Dynamo without `--router-replica-sync`, llm-d's active-active EPPs, SGLang
    gateways), while event-fed indexes converge (every replica subscribes to the same events).
    """

    def __init__(self, build: Callable[[int], Router], replicas: int, rng: random.Random) -> None:
        if replicas < 2:
            raise ValueError(f"replicas must be >= 2 for a replicated router, got {replicas}")
        self.replicas = [build(r) for r in range(replicas)]
        first = self.replicas[0]
        self.name = first.name
        self.processing_s = first.processing_s
        self.ignores_cluster_state = all(getattr(r, "ignores_cluster_state", False) for r in self.replicas)
        self._rng = rng
        self._owner: dict[int, Router] = {}

    def bind(self, view: ClusterView) -> None:
        for r in self.replicas:
            r.bind(view)

    def route(self, request: Request, view: ClusterView) -> int:
        replica = self.replicas[self._rng.randrange(len(self.replicas))]
        self._owner[request.request_id] = replica
        return replica.route(request, view)

    def on_dispatch(self, request: Request, worker: int) -> None:
        self._owner[request.request_id].on_dispatch(request, worker)

    def believed_prefix_tokens(self, request: Request) -> int | None:
        return self._owner[request.request_id].believed_prefix_tokens(request)

    def on_first_token(self, request: Request, worker: int) -> None:
        self._owner[request.request_id].on_first_token(request, worker)

    def on_complete(self, request: Request, worker: int) -> None:
        self._owner.pop(request.request_id).on_complete(request, worker)

    def set_workers(self, workers: tuple[int, ...], instances: tuple[int, ...]) -> None:
        """Every replica watches the same discovery, so each sees the change."""
        for r in self.replicas:
            r.set_workers(workers, instances)
