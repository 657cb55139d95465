"""The routing extension point: what a router may see of the cluster, and what it must answer.

`policies/` implements these protocols; the runner builds routers from the `policies.ROUTERS` registry.
A router never reaches into a worker: it sees the cluster only through `ClusterView`, whose cache queries are
peeks (they change no recency, like libCacheSim's `find(..., update_cache=false)`).

What a router sees is chosen by mechanism, not coded per router:
* prefix state, through `ClusterView.prefix_state(PrefixStateSpec)`: `exact` (peeks, as KV events without lag),
  `events` (an index fed by the engines' KV events, with lag and loss) or `approximate` (the router's own routing
  history, forgotten by age and size, blind to evictions); see `sim.routing.prefix_state`;
* load: the router's own in-flight counts (`policies.base.RouterBase` keeps them per router replica), or engine
  metrics scraped every `scrape_interval_s` (`ClusterView.scraped_load`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from sim.engines.interface import CacheListener, EngineLoad
from sim.workloads.request import BlockHash, Request

StateMode = Literal["exact", "events", "approximate"]


@dataclass(frozen=True, slots=True)
class PrefixStateSpec:
    """How a router learns what the workers' prefix caches hold.

    * `exact`: a peek into each cache at routing time.
    * `events`: an index of the engines' KV events (stored / removed / cleared), each batch applied `event_lag_s`
      (one value, or one per worker) after the engine published it, each event lost with probability
      `event_loss`. With `predicted_ttl_s`, the router also records its own choices for that long, and a worker's
      match is the larger of the two (Dynamo `--router-predicted-ttl-secs`, llm-d `speculativeIndexing`).
    * `approximate`: only the router's own routing history (`sim.routing.routing_history.RoutingHistory`: `ttl_s`,
      `capacity_keys`, `per_worker`, `prune_to`, `check_interval_s`, `leaves_first`).

    `key_block_tokens`: the prefix granularity of `approximate` keys and predictions; None is the engine's own
    block (page) size, as Dynamo hashes; otherwise in whole blocks of the requests, rounded up (a router hashing
    characters: 4 characters a token).
    """

    mode: StateMode = "exact"
    event_lag_s: float | tuple[float, ...] = 0.0
    """One lag for every worker's events, or one per worker."""
    event_loss: float = 0.0
    predicted_ttl_s: float | None = None
    ttl_s: float | None = None
    capacity_keys: int | None = None
    per_worker: bool = False
    prune_to: float = 1.0
    check_interval_s: float = 0.0
    leaves_first: bool = True
    key_block_tokens: int | None = None


class PrefixState(Protocol):
    """A router's belief about the workers' caches. `match_tokens` must not change any cache; `record` is called by
    the router base right after each routing decision (the approximate history records it there)."""

    mode: StateMode

    def match_tokens(self, request: Request) -> list[int]:
        """Per worker, the leading prompt tokens the router believes cached there now (whole keys)."""
        ...

    def record(self, request: Request, worker: int) -> None: ...

    def remove_worker(self, worker: int) -> None:
        """Forget everything believed of `worker` (it left the routable set, or a new instance took its slot)."""
        ...


class ClusterView(Protocol):
    """Read-only view of the cluster at routing time."""

    @property
    def num_workers(self) -> int: ...

    @property
    def block_size(self) -> int:
        """Block size (tokens) of the requests' `block_hashes`."""
        ...

    @property
    def now_s(self) -> float:
        """Simulated time now."""
        ...

    def cached_prefix_tokens(self, worker: int, request: Request) -> int:
        """How many leading tokens of `request`'s prompt `worker`'s prefix cache holds now, in the cache's own
        granularity (vLLM whole blocks, SGLang pages) and without the engine's hit cap: exact state, as from KV
        events with no lag. A peek: it changes nothing in the cache."""
        ...

    def cached_prefix_tokens_all(self, request: Request) -> list[int]:
        """`cached_prefix_tokens` of every worker, in worker order."""
        ...

    def in_flight(self, worker: int) -> int:
        """Requests dispatched to `worker` and not yet completed, by any router replica (the cluster's count)."""
        ...

    def engine_load(self, worker: int) -> EngineLoad:
        """`worker`'s engine metrics now (exact, unscraped)."""
        ...

    def scraped_load(self, worker: int, interval_s: float) -> EngineLoad:
        """`worker`'s engine metrics as last scraped by a scraper polling every `interval_s` from time 0 (0: now)."""
        ...

    def cache_block_size(self) -> int:
        """Tokens per block (page) of the engines' KV events and `cache_block_keys`."""
        ...

    def cache_block_keys(self, request: Request) -> Sequence[BlockHash]:
        """`request`'s full prompt blocks as the engines' KV events name them."""
        ...

    def cache_num_blocks(self, worker: int) -> int:
        """KV blocks (pages) of `worker`'s cache as its metrics report them (vLLM `cache_config_info`
        `num_gpu_blocks`, SGLang `num_pages`); 0 if not reported."""
        ...

    def sync_caches(self) -> None:
        """Bring every worker's cache to now (decode steps started by now are applied, publishing their events)."""
        ...

    def subscribe_cache(self, worker: int, listener: CacheListener) -> None:
        """Receive `worker`'s KV event batches from now on."""
        ...

    def prefix_state(self, spec: PrefixStateSpec) -> PrefixState:
        """A new prefix state of `spec`'s kind over this cluster (each router replica builds its own)."""
        ...

    # NOTE: a view may also have `subscribe_tier_events(worker, listener)`: `worker`'s KV tier events (host tier,
    # shared store; `CacheEvent.medium` set), which `sim.routing.tier_index.TierIndex` reads when it exists.


class Router(Protocol):
    """A routing policy. `route` picks a worker index; the hooks let it keep its own state (load, history).

    `bind` is called once, when the cluster is built and before the first request. Hooks are called by the cluster
    in time order: `on_dispatch` right after `route`, `on_first_token` when the first output token reaches the
    router, `on_complete` when the response ends. `believed_prefix_tokens` (after `on_dispatch`) is what the router
    believed the chosen worker holds of the request, or None for exact state (for the view-error counters). A
    router may declare `ignores_cluster_state = True` when its choices depend on nothing but the requests routed
    before (see `policies.base.RouterBase`): replays then split over processes. `processing_s` is the router's own
    time per request, added to the hop.
    """

    name: ClassVar[str]
    processing_s: float

    def bind(self, view: ClusterView) -> None: ...

    def route(self, request: Request, view: ClusterView) -> int: ...

    def on_dispatch(self, request: Request, worker: int) -> None: ...

    def believed_prefix_tokens(self, request: Request) -> int | None: ...

    def on_first_token(self, request: Request, worker: int) -> None: ...

    def on_complete(self, request: Request, worker: int) -> None: ...

    def set_workers(self, workers: tuple[int, ...], instances: tuple[int, ...]) -> None:
        """The routable workers changed (an autoscaled fleet, `sim.scaling`): from now on `route` picks only
        from `workers` (ascending worker indices, never empty); `instances[i]` is the instance id of the worker in
        slot `workers[i]` (a new worker in a reused slot has a new id: what a hashing router hashes, as a new pod
        has a new name). A worker that left may still complete requests (`on_complete`: it drains). Never called
        for a fixed fleet, whose workers are all routable with instance id = index."""
        ...


class RouterFactory(Protocol):
    """How the runner builds a router: the class itself, called with the cluster's shape and the options."""

    name: ClassVar[str]

    def __call__(self, *, num_workers: int, block_size: int, rng: random.Random, options: dict[str, Any]) -> Router: ...


# ---------------------------------------------------------------------------------------------- two-stage routing
PdStage = Literal["prefill", "decode"]
"""Which pool of a disaggregated cluster a hook or a view is about."""


@dataclass(frozen=True, slots=True)
class PdChoice:
    """A disaggregated router's answer for one request, made when the request reaches the router.

    * `prefill_worker`: the prefill pool's worker (its index in the pool, 0..P-1) that computes the prompt, or
      None: no remote prefill, the decode worker prefills locally (Dynamo's conditional disaggregation, llm-d's
      prefill-header decision, SGLang never).
    * `decode_worker`: the decode pool's worker (0..D-1), or None: chosen later by `route_decode`, when the
      prefill worker's response (its KV transfer parameters) is back at the router (Dynamo's order: prefill,
      then decode). Must be given when `prefill_worker` is None.
    """

    prefill_worker: int | None
    decode_worker: int | None

    def __post_init__(self) -> None:
        if self.prefill_worker is None and self.decode_worker is None:
            raise ValueError("PdChoice: a request with no prefill worker needs a decode worker")


class DisaggregatedRouter(Protocol):
    """A router in front of a disaggregated cluster: two pools (`prefill`, `decode`), each seen through a
    `ClusterView` of its own whose workers are numbered 0..n-1 within the pool (the cluster maps them to its own
    worker indices). A policy for one pool can be any aggregated `Router` bound to that pool's view.

    Call order, per request (the cluster calls; times are simulated):
    1. `route_pd(request, prefill, decode)` when the request reaches the router -> `PdChoice`.
    2. Remote prefill (`prefill_worker` given): `on_dispatch(request, w, "prefill")`; the prefill worker runs the
       prompt as a request of one output token (vLLM/Dynamo `max_tokens=1`, `do_remote_decode`); when its response
       is back, `on_complete(request, w, "prefill")`. Then, if the decode worker was not chosen,
       `route_decode(request, decode, prefill_worker=w)`.
    3. Decode (or local prefill + decode): `on_dispatch(request, d, "decode")`; the decode worker receives the KV
       over the transfer link (remote prefill) and decodes; `on_first_token(request, d, "decode")` when the
       client's first token reaches the router, `on_complete(request, d, "decode")` when the response ends.
    `bind` is called once, before the first request. `processing_s` is the router's own time per routing
    decision, added to each hop it routes.
    """

    name: ClassVar[str]
    processing_s: float

    def bind(self, prefill: ClusterView, decode: ClusterView) -> None: ...

    def route_pd(self, request: Request, prefill: ClusterView, decode: ClusterView) -> PdChoice: ...

    def route_decode(self, request: Request, decode: ClusterView, *, prefill_worker: int) -> int: ...

    def on_dispatch(self, request: Request, worker: int, stage: PdStage) -> None: ...

    def on_first_token(self, request: Request, worker: int, stage: PdStage) -> None: ...

    def on_complete(self, request: Request, worker: int, stage: PdStage) -> None: ...


class DisaggregatedRouterFactory(Protocol):
    """How the runner builds a disaggregated router: the pools' sizes, the options, and `stage_routers` (the
    aggregated router registry, name -> `RouterFactory`) for a policy that lets existing routers route a pool."""

    name: ClassVar[str]
    disaggregated: ClassVar[bool]

    def __call__(self, *, num_prefill_workers: int, num_decode_workers: int, block_size: int, rng: random.Random,
                 options: dict[str, Any], stage_routers: dict[str, RouterFactory]) -> DisaggregatedRouter: ...
