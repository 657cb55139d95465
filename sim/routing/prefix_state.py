"""The three ways a router learns what the caches hold (`sim.routing.interface.PrefixStateSpec`), one class each."""

from __future__ import annotations

import heapq
import random
from collections.abc import Hashable, Sequence
from itertools import chain, groupby
from operator import itemgetter

from sim.routing.interface import ClusterView, PrefixStateSpec
from sim.engines.interface import CacheEvent
from sim.routing.prefix_index import WorkerMaskIndex
from sim.routing.routing_history import RoutingHistory
from sim.workloads.request import Request


_kind = itemgetter(0)
_hashes = itemgetter(1)
"""`CacheEvent.kind` and `.block_hashes` (a NamedTuple: read by position, in C)."""


class ExactState:
    """Peeks into every worker's cache: what an event-fed index knows with no lag and no loss."""

    mode = "exact"

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def match_tokens(self, request: Request) -> list[int]:
        return self._view.cached_prefix_tokens_all(request)

    def record(self, request: Request, worker: int) -> None:
        pass

    def remove_worker(self, worker: int) -> None:
        pass  # the peeks read the caches themselves: a new instance's cache is empty


class _Keys:
    """A request's prefix keys at one granularity: the engines' own blocks, or every m-th block hash of the stream
    (a chained hash names the whole prefix up to its block, so every m-th one names the prefixes of m blocks;
    m = key_block_tokens / block size, rounded up)."""

    def __init__(self, view: ClusterView, key_block_tokens: int | None) -> None:
        self._view = view
        if key_block_tokens is None:
            self.tokens_per_key = view.cache_block_size()
            self._step = 0
        else:
            # NOTE: a router's key that is not a whole number of the stream's blocks is matched in whole blocks,
            # rounded up (e.g. a 128-character key, 32 tokens, on a 64-token stream): the requests carry no finer
            # identity. The match is then short by less than one key per request.
            B = view.block_size
            self._step = max(1, -(-key_block_tokens // B))
            self.tokens_per_key = self._step * B

    def of(self, request: Request) -> Sequence[Hashable]:
        m = self._step
        if m == 0:
            return self._view.cache_block_keys(request)
        return request.block_hashes if m == 1 else request.block_hashes[m - 1::m]


class ApproximateState:
    """The router's own routing history (`RoutingHistory`): it records each decision and never sees an eviction."""

    mode = "approximate"

    def __init__(self, view: ClusterView, spec: PrefixStateSpec) -> None:
        self._view = view
        self._keys = _Keys(view, spec.key_block_tokens)
        self.history = RoutingHistory(view.num_workers, ttl_s=spec.ttl_s, capacity_keys=spec.capacity_keys,
                                      per_worker=spec.per_worker, prune_to=spec.prune_to,
                                      check_interval_s=spec.check_interval_s, leaves_first=spec.leaves_first)

    def match_tokens(self, request: Request) -> list[int]:
        t = self._keys.tokens_per_key
        return [d * t for d in self.history.depths(self._keys.of(request), self._view.now_s)]

    def record(self, request: Request, worker: int) -> None:
        self.history.record(self._keys.of(request), worker, self._view.now_s)

    def remove_worker(self, worker: int) -> None:
        self.history.remove_worker(worker)


class EventFedState:
    """An index of the engines' KV events, as Dynamo's KV indexer and llm-d's precise scorer keep one.

    Each worker's event batches are applied `event_lag_s` after the engine published them (one lag for all, or one
    per worker: batches wait in a heap by due time, ties in publication order); each event is lost with probability
    `event_loss` (a lost `removed` leaves a stale entry, a lost `stored` a missing one). Pending batches are applied
    when the router next looks, before it matches: the index is then exactly what it would be had each batch been
    applied at its due time. With `predicted_ttl_s`, the router's own choices are also recorded for that long and a
    worker's match is the larger of the two.
    """

    mode = "events"

    def __init__(self, view: ClusterView, spec: PrefixStateSpec, rng: random.Random) -> None:
        lags = spec.event_lag_s if isinstance(spec.event_lag_s, tuple) else (spec.event_lag_s,) * view.num_workers
        if len(lags) != view.num_workers or min(lags) < 0 or not 0 <= spec.event_loss < 1:
            raise ValueError(f"event_lag_s must be >= 0 (one value, or one per worker: {view.num_workers}) and "
                             f"event_loss in [0, 1), got {spec.event_lag_s}, {spec.event_loss}")
        self._view = view
        self._lags_s = lags
        self._loss = spec.event_loss
        self._rng = rng
        self._tokens_per_block = view.cache_block_size()
        self.index = WorkerMaskIndex(view.num_workers)
        self._pending: list[tuple[float, int, int, Sequence[CacheEvent]]] = []  # heap of (due, seq, worker, batch)
        self._seq = 0
        self.events_applied = 0
        self.events_lost = 0
        self._predicted = None
        if spec.predicted_ttl_s is not None:
            self._predicted = ApproximateState(view, PrefixStateSpec(
                mode="approximate", ttl_s=spec.predicted_ttl_s, key_block_tokens=spec.key_block_tokens))
        for w in range(view.num_workers):
            view.subscribe_cache(w, self._receiver(w))

    def _receiver(self, worker: int):
        lag_s = self._lags_s[worker]

        def receive(events: Sequence[CacheEvent], now_s: float) -> None:
            # NOTE: a decode stretch publishes a step's events when it is applied, stamped with the step's end,
            # which may still be ahead: those wait like lagged ones.
            if lag_s == 0 and not self._pending and now_s <= self._view.now_s:
                self._apply(worker, events)
            else:
                self._seq += 1
                heapq.heappush(self._pending, (now_s + lag_s, self._seq, worker, events))
        return receive

    def _apply(self, worker: int, events: Sequence[CacheEvent]) -> None:
        index, loss, rng = self.index, self._loss, self._rng
        if loss:
            for event in events:
                if rng.random() < loss:
                    self.events_lost += 1
                    continue
                self.events_applied += 1
                self._apply_one(index, worker, event.kind, event.block_hashes)
            return
        # NOTE: lossless: consecutive events of one kind are applied as one run (vLLM emits a removed event per
        # evicted block); runs keep their order, since a hash may be removed and stored again within one step. The
        # grouping and the runs' hashes are read in C (a batch may hold thousands of one-block events).
        self.events_applied += len(events)
        if len(events) == 1:
            event = events[0]
            self._apply_one(index, worker, event.kind, event.block_hashes)
            return
        for kind, group in groupby(events, _kind):
            self._apply_one(index, worker, kind, list(chain.from_iterable(map(_hashes, group))))

    @staticmethod
    def _apply_one(index: WorkerMaskIndex, worker: int, kind: str, hashes: Sequence) -> None:
        if kind == "stored":
            index.add_all(hashes, worker)
        elif kind == "removed":
            index.remove_all(hashes, worker)
        else:
            index.remove_worker(worker)

    def _catch_up(self) -> None:
        pending = self._pending
        if pending:
            now = self._view.now_s
            while pending and pending[0][0] <= now:
                _, _, worker, events = heapq.heappop(pending)
                self._apply(worker, events)

    def match_tokens(self, request: Request) -> list[int]:
        self._view.sync_caches()  # steps started by now publish their events (decode stretches apply lazily)
        self._catch_up()
        t = self._tokens_per_block
        matched = [d * t for d in self.index.depths(self._view.cache_block_keys(request))]
        if self._predicted is not None:
            matched = [max(a, b) for a, b in zip(matched, self._predicted.match_tokens(request))]
        return matched

    def record(self, request: Request, worker: int) -> None:
        if self._predicted is not None:
            self._predicted.record(request, worker)

    def remove_worker(self, worker: int) -> None:
        """Dynamo's indexer `remove_worker` (when an instance leaves discovery): the worker's blocks leave the index,
        and so do its event batches still in flight to the router. NOTE: Dynamo keys its index by instance id, so a
        late batch of a removed instance lands on an id nobody routes to; kvsim keys by slot, which a later instance
        may reuse, so the batches are dropped instead: the same routing either way."""
        self._pending = [entry for entry in self._pending if entry[2] != worker]
        heapq.heapify(self._pending)
        self.index.remove_worker(worker)
        if self._predicted is not None:
            self._predicted.remove_worker(worker)


def build_prefix_state(spec: PrefixStateSpec, view: ClusterView, rng: random.Random):
    """The prefix state `spec` asks for, over `view` (events subscribe to every worker's cache now)."""
    if spec.mode == "exact":
        return ExactState(view)
    if spec.mode == "events":
        return EventFedState(view, spec, rng)
    if spec.mode == "approximate":
        return ApproximateState(view, spec)
    raise ValueError(f"state: unknown mode {spec.mode!r}; allowed: exact, events, approximate")
