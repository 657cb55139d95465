"""The routing extension point: what a router may see of the cluster, and what it must answer.

`policies/` implements these protocols; the runner builds routers from the `policies.ROUTERS` registry.
A router never reaches into a worker: it sees the cluster only through `ClusterView`, whose cache queries are
peeks (they change no recency, like libCacheSim's `find(..., update_cache=false)`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from sim.block_pool import BlockHash
from sim.request import Request


class ClusterView(Protocol):
    """Read-only view of the cluster at routing time."""

    @property
    def num_workers(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    def cached_mask(self, worker: int, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """For each of `block_hashes`, whether `worker`'s prefix cache has it now (exact state, as from KV events
        with no lag; every hash is answered, with no stop at a miss)."""
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
