"""The routing history stored as runs (one per record) forgets exactly what the entry-per-key history it replaced
forgot: a narrated story of stale places and a partly dropped run, and a property test that drives both with the
same records, lookups and worker removals under every expiry setting (age, size, per worker, prune_to, check interval,
drop order)."""

from __future__ import annotations

import math
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.routing.prefix_index import WorkerMaskIndex
from sim.routing.routing_history import RoutingHistory


class EntryHistory:
    """The naive model: kvsim's history before runs, one OrderedDict entry per (key, worker), oldest first."""

    def __init__(self, num_workers, *, ttl_s=None, capacity_keys=None, per_worker=False, prune_to=1.0,
                 check_interval_s=0.0, leaves_first=True):
        self.index = WorkerMaskIndex(num_workers)
        self.ttl_s, self.capacity_keys, self.prune_to = ttl_s, capacity_keys, prune_to
        self.check_interval_s, self.leaves_first, self.per_worker = check_interval_s, leaves_first, per_worker
        self.scopes = [OrderedDict() for _ in range(num_workers if per_worker else 1)]
        self.last_check = -1
        self.held = [0] * num_workers
        self.forgotten_keys = 0

    def __len__(self):
        return sum(len(s) for s in self.scopes)

    def keys_held(self, worker, now_s):
        self.enforce(now_s)
        return self.held[worker]

    def record(self, keys, worker, now_s):
        self.enforce(now_s)
        scope = self.scopes[worker if self.per_worker else 0]
        for key in (reversed(keys) if self.leaves_first else keys):
            if scope.pop((key, worker), "absent") == "absent":
                self.held[worker] += 1
            scope[(key, worker)] = now_s
        self.index.add_all(keys, worker)
        if self.check_interval_s == 0:
            self.prune(scope)

    def depths(self, keys, now_s):
        self.enforce(now_s)
        return self.index.depths(keys)

    def remove_worker(self, worker):
        for scope in self.scopes:
            for key, w in [entry for entry in scope if entry[1] == worker]:
                del scope[(key, w)]
                self.index.remove(key, w)
        self.held[worker] = 0

    def enforce(self, now_s):
        if self.check_interval_s > 0:
            tick = math.floor(now_s / self.check_interval_s)
            if tick == self.last_check:
                return
            self.last_check = tick
            now_s = tick * self.check_interval_s
        for scope in self.scopes:
            if self.ttl_s is not None:
                self.drop_oldest(scope, sum(1 for stamp in scope.values() if stamp + self.ttl_s <= now_s))
            if self.check_interval_s > 0:
                self.prune(scope)

    def prune(self, scope):
        if self.capacity_keys is not None and len(scope) > self.capacity_keys:
            self.drop_oldest(scope, len(scope) - math.floor(self.prune_to * self.capacity_keys))

    def drop_oldest(self, scope, count):
        for _ in range(count):
            key, worker = scope.popitem(last=False)[0]
            self.held[worker] -= 1
            self.index.remove(key, worker)
            self.forgotten_keys += 1


def chain(root, n):
    return [(root, i) for i in range(n)]


def test_a_repeat_leaves_a_stale_place_and_a_partly_dropped_run_keeps_its_order():
    # Capacity 5, leaves first. t=0: worker 0 records a0 a1 a2 (run 1 drops a2, a1, a0). t=1: a0 a1 b2 (run 2):
    # a0 and a1 move to run 2, so run 1 holds only a2 live. 4 entries: a2 | b2 a1 a0.
    h = RoutingHistory(1, capacity_keys=5)
    h.record(chain("a", 3), 0, now_s=0.0)
    h.record([("a", 0), ("a", 1), ("b", 2)], 0, now_s=1.0)
    assert len(h) == 4 and h.keys_held(0, 1.0) == 4
    # t=2: c0 c1 c2 makes 7 entries, 2 over: a2 (all of run 1) then b2 (the first of run 2) go.
    h.record(chain("c", 3), 0, now_s=2.0)
    assert len(h) == 5 and h.forgotten_keys == 2
    assert h.depths(chain("a", 3), 2.0) == [2]
    assert h.depths([("a", 0), ("a", 1), ("b", 2)], 2.0) == [2]
    # t=3: one more key drops a1 (run 2's next live entry), then a0.
    h.record(chain("d", 2), 0, now_s=3.0)
    assert h.depths(chain("a", 1), 3.0) == [0] and h.forgotten_keys == 4 and len(h) == 5


def test_a_mostly_stale_run_is_compacted_and_keeps_its_drop_order():
    # Root first (llm-d's order), capacity 7. t=0: a0..a5 (run 1). t=1: a0..a3 again (run 2): run 1 has 2 live keys
    # of 6, so it keeps only [a4, a5]. t=2: b0 b1 makes 8 entries: the oldest, a4, goes; a5 stays.
    h = RoutingHistory(1, capacity_keys=7, leaves_first=False)
    h.record(chain("a", 6), 0, now_s=0.0)
    h.record(chain("a", 4), 0, now_s=1.0)
    assert h._scopes[0][0].keys == [("a", 4), ("a", 5)]
    h.record(chain("b", 2), 0, now_s=2.0)
    assert h.forgotten_keys == 1 and h.depths(chain("a", 6), 2.0) == [4]
    assert h.index.holders(("a", 5)) == 1


settings_strategy = st.fixed_dictionaries({
    "ttl_s": st.one_of(st.none(), st.sampled_from([0.5, 1.0, 3.0])),
    "capacity_keys": st.one_of(st.none(), st.integers(1, 12)),
    "per_worker": st.booleans(),
    "prune_to": st.sampled_from([1.0, 0.8, 0.5]),
    "check_interval_s": st.sampled_from([0.0, 0.0, 1.0]),
    "leaves_first": st.booleans(),
})
operations = st.lists(st.tuples(st.sampled_from(["record", "record", "record", "depths", "remove"]), st.integers(0, 2),
                                st.integers(0, 2), st.integers(0, 6), st.sampled_from([0.0, 0.0, 0.25, 1.0])),
                      min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(config=settings_strategy, ops=operations)
def test_runs_forget_exactly_what_entries_forgot(config, ops):
    runs, entries = RoutingHistory(3, **config), EntryHistory(3, **config)
    now = 0.0
    for op, root, worker, length, step in ops:
        now += step
        keys = chain(root, length)
        if op == "record":
            runs.record(keys, worker, now)
            entries.record(keys, worker, now)
        elif op == "remove":
            runs.remove_worker(worker)
            entries.remove_worker(worker)
        else:
            assert runs.depths(keys, now) == entries.depths(keys, now)
        assert [runs.keys_held(w, now) for w in range(3)] == [entries.keys_held(w, now) for w in range(3)]
        assert len(runs) == len(entries) and runs.forgotten_keys == entries.forgotten_keys
        assert runs.index._masks == entries.index._masks


def test_removing_a_worker_drops_its_runs_and_keys_and_later_pruning_takes_the_oldest_of_the_rest():
    # One shared scope, capacity 6. Worker 0 records a0 a1 (t=0), worker 1 b0 b1 (t=1), worker 0 c0 c1 (t=2):
    # 6 entries. Worker 0 leaves: its 4 entries go (not counted as forgotten), worker 1's stay. Worker 2 then
    # records d0..d5 (t=3): 8 entries, 2 over capacity: b0 b1, the oldest left, go.
    h = RoutingHistory(3, capacity_keys=6)
    h.record(chain("a", 2), 0, now_s=0.0)
    h.record(chain("b", 2), 1, now_s=1.0)
    h.record(chain("c", 2), 0, now_s=2.0)
    h.remove_worker(0)
    assert len(h) == 2 and h.keys_held(0, 2.0) == 0 and h.forgotten_keys == 0
    assert h.depths(chain("a", 2), 2.0) == [0, 0, 0] and h.depths(chain("b", 2), 2.0) == [0, 2, 0]
    h.record(chain("d", 6), 2, now_s=3.0)
    assert h.forgotten_keys == 2 and h.depths(chain("b", 2), 3.0) == [0, 0, 0]
    assert h.depths(chain("d", 6), 3.0) == [0, 0, 6]
