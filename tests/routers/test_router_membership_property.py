"""Property: whatever the membership does, no router ever picks a worker that is not routable.

Every router of `policies.ROUTERS` (with its defaults, and the variants whose state or fallbacks differ) is driven
through random sequences of membership changes (workers leave, join, and come back as new instances in their old
slots), requests (shared prefixes, sessions), first tokens and completions, on a fake cluster whose caches follow the
dispatches through KV events, and whose slots are cleared when a worker stops, as the fleet does.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ROUTERS
from sim.workloads.request import Request
from tests.support.router_fakes import B, FakeView

NUM_SLOTS = 5

VARIANTS: list[tuple[str, dict]] = [(name, {}) for name in ROUTERS if name != "recorded"] + [
    ("prefix-hash", {"load_factor": 1.25}),
    ("kv-aware", {"state": "events", "event_lag_s": 0.5}),
    ("kv-aware", {"state": "approximate"}),
    ("kv-aware", {"temperature": 0.5}),
    ("kv-aware", {"router_selection_policy": "lmetric", "lmetric_window_requests": 8,
                  "lmetric_class_prefix_blocks": 1}),
    ("kv-aware", {"session_affinity_ttl_s": 30}),
    ("kv-aware", {"session_affinity_ttl_s": 30, "session_affinity_mode": "soft",
                  "router_selection_policy": "lmetric"}),
    ("llm-d", {"preset": "precise"}),
    ("llm-d", {"preset": "optimized-baseline"}),
    ("llm-d", {"preset": "payload-agnostic"}),
    ("llm-d", {"preset": "payload-agnostic", "session_affinity_strategy": "session_id"}),
    ("sglang-cache-aware", {"load_gate": "per_request", "min_load_tie": "fewest_processed",
                            "match_tenant": "first_inserted", "tree_budget": "shared"}),
    ("sglang-cache-aware", {"miss_fallback": "smallest_tree", "balance_abs_threshold": 1,
                            "balance_rel_threshold": 1.0}),
    ("aibrix-prefix-cache", {"running_requests": "this_gateway", "imbalance_abs_count": 1}),
    ("vllm-router-prefix-aware", {"prefix_min_match_length": 256}),
    ("vllm-router-loadaware", {"session_key": True}),
    ("sticky", {"connections": 2}),
    ("sticky", {"connections": 0}),
    ("sticky", {"connections": 2, "session_clients": False, "max_requests_per_connection": 2}),
    ("kvsim", {"session_affinity": True, "state": "events"}),
    ("preble", {"rebalance_after_requests_per_gpu": 0, "holder_pick": "position"}),
    ("preble", {"rebalance_after_requests_per_gpu": 0, "holder_pick": "gpu", "min_rebalancing_interval_s": 1}),
    ("p2c", {"load": "engine"}),
]


def test_the_variants_cover_every_router():
    assert {name for name, _ in VARIANTS} | {"recorded"} == set(ROUTERS)


def request(rid: int, prefix: int, session: int | None, own_blocks: int) -> Request:
    """Eight blocks of prefix `prefix`, then `own_blocks` of its own and a partial block."""
    hashes = tuple(("p", prefix, i) for i in range(8)) + tuple(("u", rid, i) for i in range(own_blocks))
    return Request(rid, len(hashes) * B + 5, 4, hashes, prefix_id=prefix, session_id=session)


membership = st.tuples(st.just("members"), st.integers(1, 2**NUM_SLOTS - 1), st.integers(0, 2**NUM_SLOTS - 1))
arrival = st.tuples(st.just("request"), st.integers(0, 3), st.one_of(st.none(), st.integers(0, 3)),
                    st.integers(0, 3))
progress = st.tuples(st.just("progress"), st.integers(0, 7), st.floats(0, 20))
script = st.lists(st.one_of(membership, arrival, arrival, progress), min_size=1, max_size=40)


class Fleet:
    """The fake cluster's side of a script: slots, instance ids, requests in flight and their first tokens."""

    def __init__(self, router, view: FakeView) -> None:
        self.router, self.view = router, view
        self.instances = {w: w for w in range(NUM_SLOTS)}
        self.routable = tuple(range(NUM_SLOTS))
        self.next_instance = NUM_SLOTS
        self.in_flight: list[tuple[Request, int, bool]] = []
        self.next_rid = 0

    def members(self, mask: int, renew: int) -> None:
        """Slots in `mask` are routable; a slot in `renew` that is not routable now (stopped) comes back as a new
        instance with an empty cache."""
        workers = tuple(w for w in range(NUM_SLOTS) if mask >> w & 1)
        for w in workers:
            if w not in self.routable and renew >> w & 1:
                self.instances[w] = self.next_instance
                self.next_instance += 1
                self.view.emit(w, "cleared")
        self.routable = workers
        self.router.set_workers(workers, tuple(self.instances[w] for w in workers))

    def send(self, prefix: int, session: int | None, own_blocks: int) -> int:
        req = request(self.next_rid, prefix, session, own_blocks)
        self.next_rid += 1
        worker = self.router.route(req, self.view)
        assert worker in self.routable, f"{self.router.name} chose {worker}; routable: {self.routable}"
        self.router.on_dispatch(req, worker)
        self.view.in_flight_counts[worker] += 1
        self.view.emit(worker, "stored", req.block_hashes)
        self.in_flight.append((req, worker, False))
        return worker

    def progress(self, pick: int, dt_s: float) -> None:
        self.view.now_s += dt_s
        if not self.in_flight:
            return
        i = pick % len(self.in_flight)
        req, worker, started = self.in_flight[i]
        if not started:
            self.router.on_first_token(req, worker)
            self.in_flight[i] = (req, worker, True)
            return
        del self.in_flight[i]
        self.router.on_complete(req, worker)
        self.view.in_flight_counts[worker] -= 1


def drive(name: str, options: dict, steps) -> None:
    view = FakeView(NUM_SLOTS)
    router = ROUTERS[name](num_workers=NUM_SLOTS, block_size=B, rng=random.Random(7), options=options)
    router.bind(view)
    fleet = Fleet(router, view)
    for step in steps:
        kind, *args = step
        getattr(fleet, {"members": "members", "request": "send", "progress": "progress"}[kind])(*args)


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(VARIANTS)])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=script)
def test_no_router_picks_a_worker_that_is_not_routable(name, options, steps):
    drive(name, options, steps)


@settings(max_examples=40, deadline=None)
@given(steps=script, recorded=st.lists(st.integers(0, NUM_SLOTS - 1), min_size=40, max_size=40))
def test_the_recorded_router_refuses_a_recorded_worker_that_is_not_routable(steps, recorded):
    """A measured assignment cannot be replayed on a fleet that changed: the recorded router either sends a request
    where it went, if that worker is routable, or says which worker is not."""
    view = FakeView(NUM_SLOTS)
    router = ROUTERS["recorded"](num_workers=NUM_SLOTS, block_size=B, rng=random.Random(0),
                                 options={"workers": dict(enumerate(recorded))})
    router.bind(view)
    fleet = Fleet(router, view)
    for kind, *args in steps:
        if kind != "request":
            getattr(fleet, kind)(*args)
            continue
        rid = fleet.next_rid
        if recorded[rid] in fleet.routable:
            assert fleet.send(*args) == recorded[rid]
        else:
            with pytest.raises(ValueError, match=f"request {rid} was recorded on worker {recorded[rid]}, which is "
                                                 f"not routable now"):
                fleet.send(*args)
            return
