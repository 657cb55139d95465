"""Approximate prefix state: the router's own record of what it sent where, forgotten by age and size."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from itertools import repeat

from sim.routing.prefix_index import WorkerMaskIndex


class RoutingHistory:
    """What an approximate router believes: after each decision it records the request's prefix keys for the
    chosen worker; it never learns of the engines' evictions, only forgets by its own rules:

    * `ttl_s`: an entry is dropped `ttl_s` after it was last recorded (a repeat record refreshes it; a lookup does
      not: Dynamo `--router-ttl-secs`, AIBrix 20 min, Preble's 3-minute window). None: never by age.
    * `capacity_keys`: above this many (key, worker) entries, the oldest are dropped until `prune_to` x capacity
      remain (Dynamo: 2^20 blocks pruned to 0.8; llm-d / AIBrix LRU: prune_to 1). `per_worker`: the capacity is each
      worker's own (llm-d `lruCapacityPerServer`, SGLang `max_tree_size` per tenant) rather than the whole index's.
    * `check_interval_s`: age and size are enforced only at multiples of this period (AIBrix checks every 1 s,
      SGLang's eviction thread runs every `eviction_interval_secs`); 0: at every record and lookup.
    * `leaves_first`: among entries recorded at the same moment, the request's deepest keys are dropped first (a
      tree evicts leaves: Dynamo, SGLang); False drops its first key first (llm-d's per-pod LRU adds a request's
      hashes in order, so its oldest entry is the prefix's root).

    Invariant: each scope's `OrderedDict` is in last-recorded order, oldest first, so age and size evictions both
    pop from its front. Enforcement at a check time only ever sees entries recorded before it: the check that
    falls between two operations is applied lazily at the second, before it.
    """

    def __init__(self, num_workers: int, *, ttl_s: float | None = None, capacity_keys: int | None = None,
                 per_worker: bool = False, prune_to: float = 1.0, check_interval_s: float = 0.0,
                 leaves_first: bool = True) -> None:
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 or None, got {ttl_s}")
        if capacity_keys is not None and capacity_keys < 1:
            raise ValueError(f"capacity must be >= 1 or None, got {capacity_keys}")
        if not 0 < prune_to <= 1:
            raise ValueError(f"prune_to must be in (0, 1], got {prune_to}")
        self.index = WorkerMaskIndex(num_workers)
        self.ttl_s = ttl_s
        self.capacity_keys = capacity_keys
        self.prune_to = prune_to
        self.check_interval_s = check_interval_s
        self.leaves_first = leaves_first
        self.per_worker = per_worker
        self._scopes: list[OrderedDict] = [OrderedDict() for _ in range(num_workers if per_worker else 1)]
        self._last_check = -1
        self._held = [0] * num_workers
        self.forgotten_keys = 0
        """(key, worker) entries dropped by age or size so far."""

    def __len__(self) -> int:
        return sum(len(s) for s in self._scopes)

    def keys_held(self, worker: int, now_s: float) -> int:
        """How many keys `worker` holds in the history now (SGLang's per-tenant tree size, in keys)."""
        self._enforce(now_s)
        return self._held[worker]

    def record(self, keys: Sequence[Hashable], worker: int, now_s: float) -> None:
        self._enforce(now_s)
        scope = self._scopes[worker if self.per_worker else 0]
        entries = list(zip(reversed(keys) if self.leaves_first else keys, repeat(worker)))
        # NOTE: a repeat moves to the back (most recent): popped and re-added, both in C-level loops.
        before = len(scope)
        deque(map(scope.pop, entries, repeat(None)), maxlen=0)
        self._held[worker] += len(entries) - (before - len(scope))
        scope.update(zip(entries, repeat(now_s)))
        self.index.add_all(keys, worker)
        if self.check_interval_s == 0:
            self._prune(scope)

    def depths(self, keys: Sequence[Hashable], now_s: float) -> list[int]:
        self._enforce(now_s)
        return self.index.depths(keys)

    def _enforce(self, now_s: float) -> None:
        interval = self.check_interval_s
        if interval > 0:
            tick = math.floor(now_s / interval)
            if tick == self._last_check:
                return
            self._last_check = tick
            now_s = tick * interval
        ttl = self.ttl_s
        for scope in self._scopes:
            if ttl is not None and scope:
                expired = 0
                for stamp in scope.values():  # oldest first
                    if stamp + ttl > now_s:
                        break
                    expired += 1
                self._drop_oldest(scope, expired)
            if interval > 0:
                self._prune(scope)

    def _prune(self, scope: OrderedDict) -> None:
        capacity = self.capacity_keys
        if capacity is None or len(scope) <= capacity:
            return
        self._drop_oldest(scope, len(scope) - math.floor(self.prune_to * capacity))

    def _drop_oldest(self, scope: OrderedDict, count: int) -> None:
        if count <= 0:
            return
        popitem = scope.popitem
        dropped = [popitem(last=False)[0] for _ in range(count)]
        held = self._held
        for _, worker in dropped:
            held[worker] -= 1
        self.index.remove_pairs(dropped)
        self.forgotten_keys += count
