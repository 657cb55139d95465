"""Workers as a router sees them: the `ClusterView` of an aggregated cluster and of each pool of a disaggregated one."""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from sim.cluster.worker import Worker
from sim.engines.interface import CacheListener, EngineLoad
from sim.routing.interface import PrefixState, PrefixStateSpec
from sim.routing.prefix_state import build_prefix_state
from sim.routing.scraper import MetricsScraper
from sim.workloads.request import BlockHash, Request
from sim.workloads.shared_prefix import rng_for


class WorkersView:
    """A router's `ClusterView` over `workers` (indices 0..n-1): cache queries are peeks into their prefix caches
    (a running decode stretch is applied first), prefix states and metric scrapers are built here, in-flight counts
    are the router's view of its own dispatches (`dispatched`).

    Each prefix state draws its event losses from a random stream of its own (`events_stream`-N), so losses do not
    shift routing draws.
    """

    def __init__(self, env: simpy.Environment, workers: Sequence[Worker], *, block_size: int, cache_num_blocks: int,
                 seed: int, events_stream: str = "router-events") -> None:
        self.env = env
        self.workers = list(workers)
        self._block_size = block_size
        # NOTE: every worker of a view runs one engine spec, so all report the same block count.
        self._cache_num_blocks = cache_num_blocks
        self._seed = seed
        self._events_stream = events_stream
        self._in_flight = [0] * len(self.workers)
        self._scrapers: dict[float, MetricsScraper] = {}
        self._num_prefix_states = 0
        self._cache_listeners: dict[int, list[CacheListener]] = {}
        self._tier_listeners: dict[int, list[CacheListener]] = {}

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def now_s(self) -> float:
        return self.env.now

    def cached_prefix_tokens(self, worker: int, request: Request) -> int:
        w = self.workers[worker]
        w.sync()
        return w.engine.cache.peek_prefix_tokens(request)

    def cached_prefix_tokens_all(self, request: Request) -> list[int]:
        """`cached_prefix_tokens` of every worker, in worker order (one call for exact-state routers)."""
        out = []
        for w in self.workers:
            w.sync()
            out.append(w.engine.cache.peek_prefix_tokens(request))
        return out

    def sync_caches(self) -> None:
        for w in self.workers:
            w.sync()

    def in_flight(self, worker: int) -> int:
        return self._in_flight[worker]

    def dispatched(self, worker: int, delta: int) -> None:
        """`worker` got (`delta` 1) or gave back (-1) a request; scrapers asleep on an idle view wake."""
        self._in_flight[worker] += delta
        for scraper in self._scrapers.values():
            scraper.wake()

    def engine_load(self, worker: int) -> EngineLoad:
        return self.workers[worker].load()

    def scraped_load(self, worker: int, interval_s: float) -> EngineLoad:
        if interval_s == 0:
            return self.engine_load(worker)
        scraper = self._scrapers.get(interval_s)
        if scraper is None:
            scraper = self._scrapers[interval_s] = MetricsScraper(
                self.env, interval_s, lambda: [self.engine_load(w) for w in range(len(self.workers))],
                lambda: any(self._in_flight))
        return scraper.loads[worker]

    def cache_block_size(self) -> int:
        return self.workers[0].engine.cache.block_size

    def cache_block_keys(self, request: Request) -> Sequence[BlockHash]:
        return self.workers[0].engine.cache.block_keys(request)

    def cache_num_blocks(self, worker: int) -> int:
        return self._cache_num_blocks

    def subscribe_cache(self, worker: int, listener: CacheListener) -> None:
        self.workers[worker].engine.cache.subscribe(listener)
        self._cache_listeners.setdefault(worker, []).append(listener)

    def cache_listeners(self, worker: int) -> list[CacheListener]:
        """Who subscribed to `worker`'s KV events (an autoscaled slot's next engine gets them too)."""
        return self._cache_listeners.get(worker, [])

    def tier_listeners(self, worker: int) -> list[CacheListener]:
        """Who subscribed to `worker`'s KV tier events."""
        return self._tier_listeners.get(worker, [])

    def subscribe_tier_events(self, worker: int, listener: CacheListener) -> None:
        """Receive `worker`'s KV tier events (`CacheEvent.medium` set) from now on; nothing for an engine without
        tiers."""
        subscribe = getattr(self.workers[worker].engine, "subscribe_tiers", None)
        if subscribe is not None:
            subscribe(listener)
            self._tier_listeners.setdefault(worker, []).append(listener)

    def prefix_state(self, spec: PrefixStateSpec) -> PrefixState:
        self._num_prefix_states += 1
        return build_prefix_state(spec, self, rng_for(self._seed, f"{self._events_stream}-{self._num_prefix_states}"))
