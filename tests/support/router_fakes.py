"""A fake cluster view for narrated router tests: the test sets what each worker caches, its engine metrics and
the time, emits KV events by hand, and binds routers to it (`build`)."""

from __future__ import annotations

import random

from sim.engines.interface import CacheEvent, EngineLoad
from sim.routing.interface import PrefixStateSpec
from sim.routing.prefix_state import build_prefix_state
from sim.workloads.request import Request

B = 16


class FakeView:
    """Workers' cached block hashes (`cached[w]`), engine loads (`loads[w]`: live; `scraped[w]`: what a scraper last
    read), cluster in-flight counts and the clock (`now_s`), all set by the test. KV events reach subscribers only
    through `emit`. Cache keys are the requests' own block hashes (block size `B`)."""

    def __init__(self, num_workers, cached=None, in_flight=None, loads=None, scraped=None, block_size=B):
        self.num_workers = num_workers
        self.block_size = block_size
        self.cached = cached or {w: set() for w in range(num_workers)}
        self.in_flight_counts = in_flight or [0] * num_workers
        self.loads = loads or [EngineLoad() for _ in range(num_workers)]
        self.scraped = scraped
        self.now_s = 0.0
        self.peeks = 0
        self.listeners: dict[int, list] = {w: [] for w in range(num_workers)}
        self.scrape_intervals: list[float] = []
        self.num_blocks = 0  # what `cache_num_blocks` reports (0: not reported)

    def cached_prefix_tokens(self, worker, request):
        """The worker's leading run of cached blocks, in tokens (the cache's peek)."""
        self.peeks += 1
        n = 0
        for h in request.block_hashes:
            if h not in self.cached[worker]:
                break
            n += 1
        return n * self.block_size

    def cached_prefix_tokens_all(self, request):
        return [self.cached_prefix_tokens(w, request) for w in range(self.num_workers)]

    def in_flight(self, worker):
        return self.in_flight_counts[worker]

    def engine_load(self, worker):
        return self.loads[worker]

    def scraped_load(self, worker, interval_s):
        self.scrape_intervals.append(interval_s)
        return (self.scraped or self.loads)[worker]

    def cache_block_size(self):
        return self.block_size

    def cache_block_keys(self, request):
        return request.block_hashes

    def cache_num_blocks(self, worker):
        return self.num_blocks

    def sync_caches(self):
        pass

    def subscribe_cache(self, worker, listener):
        self.listeners[worker].append(listener)

    def prefix_state(self, spec: PrefixStateSpec):
        return build_prefix_state(spec, self, random.Random(0))

    # ------------------------------------------------------------------ test controls
    def emit(self, worker, kind, hashes=(), now_s=None):
        """Worker `worker`'s engine publishes one KV event (and, for realism, its cache changes with it)."""
        now = self.now_s if now_s is None else now_s
        if kind == "stored":
            self.cached[worker].update(hashes)
        elif kind == "removed":
            self.cached[worker].difference_update(hashes)
        else:
            self.cached[worker].clear()
        for listener in self.listeners[worker]:
            listener([CacheEvent(kind, tuple(hashes), block_size=self.block_size)], now)


def prompt(rid, prefix, prompt_tokens=2371, shared_blocks=127):
    """A request whose first `shared_blocks` blocks are prefix `prefix`'s and the rest its own."""
    hashes = tuple(("p", prefix, i) if i < shared_blocks else ("u", rid, i) for i in range(prompt_tokens // B))
    return Request(rid, prompt_tokens, 64, hashes, prefix_id=prefix)


def build(cls, n=6, seed=0, view=None, **options):
    """Router `cls` for `n` workers with `options`, bound to `view` (a fresh `FakeView(n)` by default)."""
    router = cls(num_workers=n, block_size=B, rng=random.Random(seed), options=options)
    router.bind(view if view is not None else FakeView(n))
    return router


def send(router, request, view):
    """Route `request` and dispatch it (the cluster's `route`): the chosen worker."""
    worker = router.route(request, view)
    router.on_dispatch(request, worker)
    return worker
