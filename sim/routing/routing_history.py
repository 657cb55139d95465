"""Approximate prefix state: the router's own record of what it sent where, forgotten by age and size."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence

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

    Stored as runs, not entries: each record is one run (its keys in drop order, all stamped alike); a key recorded
    again moves to the new run, and its old place is left stale (the key's locator names the newer run). A scope is
    its runs in record order, oldest first, so its live entries read in order are exactly the entries in
    last-recorded order: age and size evictions both take from the front, a run at a time while a whole run goes.
    A run left with no live entry is dropped at once, one left mostly stale is compacted. Enforcement at a check
    time only ever sees entries recorded before it: the check that falls between two operations is applied lazily
    at the second, before it.
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
        self._scopes: list[OrderedDict[int, _Run]] = [OrderedDict() for _ in range(num_workers if per_worker else 1)]
        """Per scope, run number -> run, oldest first (an OrderedDict: popping its front stays O(1))."""
        self._scope_entries = [0] * len(self._scopes)
        """Live (key, worker) entries per scope."""
        self._run_of: list[dict[Hashable, int]] = [{} for _ in range(num_workers)]
        """Per worker, key -> the number of the run that holds its live entry."""
        self._next_run = 0
        self._last_check = -1
        self._held = [0] * num_workers
        self.forgotten_keys = 0
        """(key, worker) entries dropped by age or size so far."""

    def __len__(self) -> int:
        return sum(self._scope_entries)

    def keys_held(self, worker: int, now_s: float) -> int:
        """How many keys `worker` holds in the history now (SGLang's per-tenant tree size, in keys)."""
        self._enforce(now_s)
        return self._held[worker]

    def record(self, keys: Sequence[Hashable], worker: int, now_s: float) -> None:
        self._enforce(now_s)
        scope_id = worker if self.per_worker else 0
        scope = self._scopes[scope_id]
        # NOTE: a repeated key keeps its first place in the run, as it did as an OrderedDict entry.
        ordered = list(dict.fromkeys(reversed(keys) if self.leaves_first else keys))
        if not ordered:
            return
        run_of = self._run_of[worker]
        number = self._next_run
        self._next_run += 1
        # NOTE: one loop over the keys (Python 3.11's loop beats C passes of map over bound methods): each key is
        # located in the new run; a repeat moves to the back (most recent), so its old run loses a live entry; a
        # new entry also gets the worker's bit in the index (a repeat has it: live entries are the index's bits).
        get = run_of.get
        masks = self.index.masks_for_update()
        held = masks.get
        bit = 1 << worker
        moved: dict[int, int] = {}
        new_entries = 0
        for key in ordered:
            old = get(key)
            if old is None:
                new_entries += 1
                masks[key] = held(key, 0) | bit
            else:
                moved[old] = moved.get(old, 0) + 1
            run_of[key] = number
        stale_runs = []
        for old_number, count in moved.items():
            run = scope[old_number]
            run.live -= count
            if not run.live:
                del scope[old_number]
            elif run.live * 2 < len(run.keys) - run.start:
                stale_runs.append((old_number, run))
        self._held[worker] += new_entries
        self._scope_entries[scope_id] += new_entries
        for old_number, run in stale_runs:
            # NOTE: a run mostly stale keeps only its live keys, so memory stays within twice the live entries
            # (a history with no TTL and no capacity would otherwise keep every key ever recorded).
            run.keys = [key for key in run.keys if get(key) == old_number]
            run.start = 0
        scope[number] = _Run(now_s, worker, ordered)
        if self.check_interval_s == 0:
            self._prune(scope_id)

    def remove_worker(self, worker: int) -> None:
        """Forget every entry of `worker` (it left the fleet): its runs leave their scope, its keys the index. Not
        counted in `forgotten_keys` (that is forgetting by age or size)."""
        run_of = self._run_of[worker]
        if not run_of:
            return
        scope_id = worker if self.per_worker else 0
        scope = self._scopes[scope_id]
        for number in [n for n, run in scope.items() if run.worker == worker]:
            del scope[number]
        self._scope_entries[scope_id] -= self._held[worker]
        self._held[worker] = 0
        self._run_of[worker] = {}
        self.index.remove_all(list(run_of), worker)

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
        for scope_id, scope in enumerate(self._scopes):
            if ttl is not None and scope:
                expired = 0
                for run in scope.values():  # oldest first; a run's entries share its stamp
                    if run.stamp_s + ttl > now_s:
                        break
                    expired += run.live
                self._drop_oldest(scope_id, expired)
            if interval > 0:
                self._prune(scope_id)

    def _prune(self, scope_id: int) -> None:
        capacity = self.capacity_keys
        entries = self._scope_entries[scope_id]
        if capacity is None or entries <= capacity:
            return
        self._drop_oldest(scope_id, entries - math.floor(self.prune_to * capacity))

    def _drop_oldest(self, scope_id: int, count: int) -> None:
        """Drop the scope's `count` oldest live entries: whole runs from the front, then the first live entries of
        the next run."""
        if count <= 0:
            return
        scope = self._scopes[scope_id]
        held = self._held
        self._scope_entries[scope_id] -= count
        self.forgotten_keys += count
        left = count
        while left:
            number, run = next(iter(scope.items()))
            worker = run.worker
            run_of = self._run_of[worker]
            keys, start = run.keys, run.start
            if run.live <= left:
                if run.live == len(keys) - start:  # no stale place left: a slice
                    live = keys[start:]
                else:
                    get = run_of.get  # the run's live entries are its keys still located in it
                    live = [key for key in keys if get(key) == number]
                del scope[number]
            else:
                if run.live == len(keys) - start:
                    live = keys[start:start + left]
                    start += left
                else:
                    live = []
                    get = run_of.get
                    while len(live) < left:
                        key = keys[start]
                        start += 1
                        if get(key) == number:
                            live.append(key)
                run.start = start
                run.live -= left
            # NOTE: loops, not map over bound methods or slot wrappers (slower on Python 3.11).
            for key in live:
                del run_of[key]
            held[worker] -= len(live)
            left -= len(live)
            self.index.remove_all(live, worker)


class _Run:
    """One record: `keys` in drop order, from `start` on (the ones before were dropped), `live` of them still
    located here (the others were recorded again later)."""

    __slots__ = ("stamp_s", "worker", "keys", "start", "live")

    def __init__(self, stamp_s: float, worker: int, keys: list[Hashable]) -> None:
        self.stamp_s = stamp_s
        self.worker = worker
        self.keys = keys
        self.start = 0
        self.live = len(keys)
