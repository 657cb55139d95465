"""Workers join and leave (`Router.set_workers`): each router's own rule on a membership change, narrated on a tiny
fleet with exact expected choices. The fleet names a worker by its slot; a worker that comes back in a slot after
stopping is a new instance (a new id: what a hashing router hashes)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from policies.kv_aware import KvAwareRouter
from policies.kvsim_router import KvsimRouter
from policies.llm_d import LlmdRouter
from policies.preble import PrebleRouter
from policies.prefix_hash import PrefixHashRouter
from policies.round_robin import RoundRobinRouter
from policies.sglang_gateway import SglangCacheAwareRouter
from policies.sticky import StickyRouter
from policies.vllm_router import VllmRouterLoadAware, VllmRouterSession
from sim.routing.replicas import ReplicatedRouter
from sim.workloads.request import Request
from tests.support.router_fakes import FakeView, build, prompt, send


def homes(router, view, keys=range(100)):
    """Key -> the worker its request goes to (key k: a request of prefix k, session k)."""
    return {k: router.route(prompt(k, k), view) for k in keys}


# ------------------------------------------------------------------ the contract
def test_a_fixed_fleet_has_every_slot_routable_with_its_index_as_instance_id():
    r = build(RoundRobinRouter, n=3)
    assert r.workers == (0, 1, 2) and r.instances == (0, 1, 2)


@pytest.mark.parametrize("workers, instances", [((), ()), ((1, 0), (1, 0)), ((0, 3), (0, 3)), ((0, 1), (0,))])
def test_set_workers_refuses_an_empty_unordered_out_of_range_or_unpaired_set(workers, instances):
    r = build(RoundRobinRouter, n=3)
    with pytest.raises(ValueError, match=r"set_workers: workers must be ascending slots in 0\.\.2, never empty"):
        r.set_workers(workers, instances)


def test_a_replicated_router_passes_the_change_to_every_replica():
    replicated = ReplicatedRouter(lambda i: build(RoundRobinRouter, n=3), 2, random.Random(0))
    replicated.set_workers((0, 2), (0, 2))
    assert [r.workers for r in replicated.replicas] == [(0, 2), (0, 2)]


# ------------------------------------------------------------------ consistent hashing: only the keys that must move
@pytest.mark.parametrize("cls, on_two, spread", [
    (PrefixHashRouter, 23, Counter({1: 9, 0: 8, 3: 6})),
    (VllmRouterSession, 25, Counter({3: 13, 1: 6, 0: 6})),
])
def test_a_leave_moves_exactly_the_departed_workers_keys_to_their_ring_successors(cls, on_two, spread):
    # 4 workers, 100 keys. Worker 2 leaves: its keys (23 for prefix-hash's ring, 25 for the uhashring session ring)
    # move, each to the next point clockwise, spread over the other three; the other keys stay where they were.
    view = FakeView(4)
    r = build(cls, n=4)
    before = homes(r, view)
    r.set_workers((0, 1, 3), (0, 1, 3))
    after = homes(r, view)
    moved = {k for k in before if after[k] != before[k]}
    assert moved == {k for k in before if before[k] == 2} and len(moved) == on_two
    assert Counter(after[k] for k in moved) == spread


@pytest.mark.parametrize("cls, taken, back_home", [(PrefixHashRouter, 21, 5), (VllmRouterSession, 31, 15)])
def test_a_join_moves_only_the_keys_the_new_instance_now_owns_and_the_old_instance_would_take_its_own_back(
        cls, taken, back_home):
    # After worker 2 left, a new instance (id 7) starts in slot 2: it takes the keys whose first point clockwise is
    # now one of its own (21 and 31 keys), all to slot 2, and no other key moves. Its points are not the old
    # instance's, so only some of those keys had lived on slot 2 before (5 and 15). Had instance 2 itself come back,
    # the ring would be the first one again: every key home.
    view = FakeView(4)
    r = build(cls, n=4)
    first = homes(r, view)
    r.set_workers((0, 1, 3), (0, 1, 3))
    without = homes(r, view)
    r.set_workers((0, 1, 2, 3), (0, 1, 7, 3))
    joined = homes(r, view)
    moved = {k for k in without if joined[k] != without[k]}
    assert {joined[k] for k in moved} == {2} and len(moved) == taken
    assert len({k for k in moved if first[k] == 2}) == back_home
    r.set_workers((0, 1, 2, 3), (0, 1, 2, 3))
    assert homes(r, view) == first


def test_loadaware_session_fallback_rehashes_on_the_same_ring_as_session():
    view = FakeView(4)
    session = build(VllmRouterSession, n=4)
    loadaware = build(VllmRouterLoadAware, n=4, session_key=True)
    for r in (session, loadaware):
        r.set_workers((0, 1, 3), (0, 1, 3))
    assert homes(loadaware, view, range(30)) == homes(session, view, range(30))


def test_bounded_load_counts_only_the_routable_workers():
    # 3 of 4 workers routable, worker 3 draining with 5 requests. Total in flight over the routable ones is 0:
    # capacity ceil(1.25 x 1 / 3) = 1, so the key's home takes it; the draining worker's 5 do not count.
    r = build(PrefixHashRouter, n=4, load_factor=1.25)
    r.set_workers((0, 1, 2), (0, 1, 2))
    r.in_flight[3] = 5
    req = prompt(0, 5)
    assert r.route(req, FakeView(4)) == next(r.ring_walk(req))


# ------------------------------------------------------------------ round robin: Dynamo's counter over the current list
def test_round_robin_keeps_its_counter_and_indexes_the_current_list():
    # Requests 0-3 go 0, 1, 2, 0 (counter 4). Worker 1 leaves: counter 4, 5, 6 over (0, 2) -> 0, 2, 0. A new
    # instance joins slot 1: counter 7, 8, 9 over (0, 1, 2) -> 1, 2, 0.
    r = build(RoundRobinRouter, n=3)
    view = FakeView(3)
    assert [r.route(prompt(i, 0), view) for i in range(4)] == [0, 1, 2, 0]
    r.set_workers((0, 2), (0, 2))
    assert [r.route(prompt(i, 0), view) for i in range(3)] == [0, 2, 0]
    r.set_workers((0, 1, 2), (0, 3, 2))
    assert [r.route(prompt(i, 0), view) for i in range(3)] == [1, 2, 0]


# ------------------------------------------------------------------ sticky: a departed pod's connections close
def test_a_session_whose_pod_leaves_re_picks_a_routable_pod_and_the_pool_drops_the_connection():
    view = FakeView(3)
    r = build(StickyRouter, n=3, seed=1)
    first = Request(0, 64, 4, (("a", 0),), session_id=9)
    pod = send(r, first, view)
    r.on_complete(first, pod)
    assert send(r, Request(1, 64, 4, (("a", 0),), session_id=9), view) == pod  # the idle connection is reused
    r.on_complete(Request(1, 64, 4, (("a", 0),), session_id=9), pod)
    rest = tuple(w for w in range(3) if w != pod)
    r.set_workers(rest, rest)
    assert r.session_pools[9].connections == []
    again = send(r, Request(2, 64, 4, (("a", 0),), session_id=9), view)
    assert again in rest and [c.pod for c in r.session_pools[9].connections] == [again]


def test_a_request_in_flight_on_a_closed_connection_still_completes():
    view = FakeView(2)
    r = build(StickyRouter, n=2, seed=0, max_requests_per_connection=1, session_clients=False)
    req = prompt(0, 0)
    pod = send(r, req, view)
    other = 1 - pod
    r.set_workers((other,), (other,))
    r.on_complete(req, pod)  # its connection left the pool with its pod: nothing to close twice
    assert r.pods() == [] and r.in_flight[pod] == 0


# ------------------------------------------------------------------ SGLang: the tree removes the tenant
def test_sglang_removes_a_departed_worker_from_the_tree_and_a_new_one_starts_empty():
    # Worker 1 served prefix 5, so the tree sends prefix 5 there. It leaves: the tree forgets it, and prefix 5 is a
    # miss, sent to the least loaded routable worker (0). A new instance in slot 1 holds nothing and has processed
    # nothing.
    view = FakeView(3)
    r = build(SglangCacheAwareRouter, n=3, min_load_tie="fewest_processed")
    r.on_dispatch(prompt(0, 5), 1)
    assert r.route(prompt(1, 5), view) == 1
    r.set_workers((0, 2), (0, 2))
    assert r.prefix.history.keys_held(1, 0.0) == 0
    assert r.route(prompt(2, 5), view) == 0
    r.set_workers((0, 1, 2), (0, 3, 2))
    assert r.processed == [0, 0, 0] and r.prefix_tokens(prompt(3, 5)) == [0, 0, 0]


# ------------------------------------------------------------------ Dynamo: indexer removal, session re-selection
def test_kv_aware_forgets_a_departed_workers_blocks_and_rebinds_its_sessions():
    # KV events: worker 1 holds prefix 5. It leaves: the index drops its blocks (remove_worker) and a hard binding to
    # it is not used; the request goes to the best routable worker and the session is bound there.
    view = FakeView(3)
    r = build(KvAwareRouter, n=3, view=view, state="events", session_affinity_ttl_s=60)
    req = prompt(0, 5)
    view.emit(1, "stored", req.block_hashes[:100])
    sess = Request(1, req.prompt_tokens, 4, req.block_hashes, session_id=3)
    assert send(r, sess, view) == 1
    r.set_workers((0, 2), (0, 2))
    assert r.prefix_tokens(req)[1] == 0
    moved = send(r, Request(2, req.prompt_tokens, 4, req.block_hashes, session_id=3), view)
    assert moved in (0, 2) and r._sessions[3].worker == moved


# ------------------------------------------------------------------ kvsim: homes on a departed worker are released
def test_kvsim_releases_the_homes_of_a_departed_worker():
    view = FakeView(3)
    r = build(KvsimRouter, n=3, view=view)
    w = send(r, prompt(0, 5), view)
    assert r._claimed[w] == 2371
    rest = tuple(x for x in range(3) if x != w)
    r.set_workers(rest, rest)
    assert r._claimed == [0, 0, 0] and not r._homes
    assert send(r, prompt(1, 5), view) in rest


# ------------------------------------------------------------------ Preble: a GPU that leaves leaves every allocation
def test_preble_takes_a_departed_gpu_out_of_every_allocation():
    view = FakeView(2)
    r = build(PrebleRouter, n=2, view=view)
    send(r, prompt(0, 5), view)
    send(r, prompt(1, 5), view)  # exploit: the shared prefix is allocated to the first GPU
    gpu = r.route(prompt(2, 5), view)
    assert any(gpu in gpus for gpus in r.alloc.values())
    r.set_workers((1 - gpu,), (1 - gpu,))
    assert all(gpu not in gpus for gpus in r.alloc.values())
    assert r.route(prompt(3, 5), view) == 1 - gpu


# ------------------------------------------------------------------ llm-d: the no-hit LRU keeps pod names
def test_llm_d_no_hit_lru_ranks_a_new_pod_in_a_reused_slot_as_never_used():
    # Cold requests went to pods 0, then 1, then 2 (the LRU: 0 oldest). Pod 2 stops and a new pod takes slot 2: it
    # is never used, so it ranks first (1.0); pods 0 and 1 rank after it, and the departed pod's name still holds
    # the newest place, as upstream's LRU keeps it.
    view = FakeView(3)
    r = build(LlmdRouter, n=3, view=view, no_hit_lru_weight=1.0, prefix_cache_weight=0.0, queue_weight=0.0,
              kv_cache_utilization_weight=0.0)
    for i, w in enumerate((0, 1, 2)):
        r._cold[i] = True
        r.on_dispatch(prompt(i, 100 + i), w)
    r.set_workers((0, 1), (0, 1))
    r.set_workers((0, 1, 2), (0, 1, 5))
    scores = r._no_hit_lru_scores([0, 1, 2])
    assert [scores(w) for w in (0, 1, 2)] == [0.5, 0.0, 1.0]
    assert list(r._lru) == [0, 1, 2]
