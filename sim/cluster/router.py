"""The routing extension point: what a router may see of the cluster, and what it must answer.

`policies/` implements these protocols; the runner builds routers from the `policies.ROUTERS` registry.
A router never reaches into a worker: it sees the cluster only through `ClusterView`, whose cache queries are
peeks (they change no recency, like libCacheSim's `find(..., update_cache=false)`).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Protocol

from sim.workloads.request import Request


class ClusterView(Protocol):
    """Read-only view of the cluster at routing time."""

    @property
    def num_workers(self) -> int: ...

    @property
    def block_size(self) -> int:
        """Block size (tokens) of the requests' `block_hashes`."""
        ...

    def cached_prefix_tokens(self, worker: int, request: Request) -> int:
        """How many leading tokens of `request`'s prompt `worker`'s prefix cache holds now, in the cache's own
        granularity (vLLM whole blocks, SGLang pages) and without the engine's hit cap: exact state, as from KV
        events with no lag. A peek: it changes nothing in the cache."""
        ...

    def in_flight(self, worker: int) -> int:
        """Requests dispatched to `worker` and not yet completed (the router-side load count)."""
        ...


class Router(Protocol):
    """A routing policy. `route` picks a worker index; the hooks let it keep its own state (load, history).

    Hooks are called by the cluster in time order: `on_dispatch` right after `route`, `on_first_token` when the
    first output token reaches the router, `on_complete` when the response ends. A router may declare
    `ignores_cluster_state = True` when its choices depend on nothing but the requests routed before (see
    `policies.base.RouterBase`): replays then split over processes.
    """

    name: ClassVar[str]

    def route(self, request: Request, view: ClusterView) -> int: ...

    def on_dispatch(self, request: Request, worker: int) -> None: ...

    def on_first_token(self, request: Request, worker: int) -> None: ...

    def on_complete(self, request: Request, worker: int) -> None: ...


class RouterFactory(Protocol):
    """How the runner builds a router: the class itself, called with the cluster's shape and the options."""

    name: ClassVar[str]

    def __call__(self, *, num_workers: int, block_size: int, rng: random.Random, options: dict[str, Any]) -> Router: ...
