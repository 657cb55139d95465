"""What a router sees: the prefix-state mechanisms (exact, events with lag and loss, approximate history), scraped
metrics, replicas, router specs and the reuse ledger, each on a tiny narrated scenario with exact expected state."""

from __future__ import annotations

import random

import pytest
import simpy

from policies.kv_aware import KvAwareRouter
from sim.cluster.reuse import ReuseLedger
from sim.engines.interface import CacheEvent, EngineLoad
from sim.routing.interface import PrefixStateSpec
from sim.routing.prefix_index import WorkerMaskIndex
from sim.routing.replicas import ReplicatedRouter
from sim.routing.routing_history import RoutingHistory
from sim.routing.scraper import MetricsScraper
from sim.routing.spec import router_label, router_overrides, split_router_list, split_router_spec
from sim.workloads.request import Request
from tests.support.router_fakes import B, FakeView, build, prompt, send


def keys(n, tag="p"):
    return [(tag, i) for i in range(n)]


# ------------------------------------------------------------------ the index
def test_index_depth_is_each_workers_run_from_the_first_key():
    # Worker 0 holds keys 0-1, worker 1 keys 0-3, worker 2 only key 3: depths 2, 4, 0 (a gap ends a worker's run).
    index = WorkerMaskIndex(3)
    k = keys(5)
    index.add_all(k[:2], 0)
    index.add_all(k[:4], 1)
    index.add(k[3], 2)
    assert index.depths(k) == [2, 4, 0]
    index.add(k[1], 1)  # set semantics: a duplicate store changes nothing
    index.remove(k[1], 1)
    assert index.depths(k) == [2, 1, 0]
    index.remove(k[4], 2)  # removing what a worker does not hold changes nothing
    index.remove_worker(0)
    assert index.depths(k) == [0, 1, 0] and len(index) == 3


# ------------------------------------------------------------------ approximate: the routing history
def test_history_forgets_at_its_ttl_and_a_repeat_refreshes_it():
    h = RoutingHistory(2, ttl_s=120.0)
    h.record(keys(3), 0, now_s=0.0)
    h.record(keys(2), 1, now_s=10.0)
    assert h.depths(keys(3), now_s=119.9) == [3, 2]
    assert h.depths(keys(3), now_s=120.0) == [0, 2]  # worker 0's entries expire at exactly 0 + 120 s
    h.record(keys(2), 1, now_s=100.0)  # a repeat refreshes worker 1's entries to 100 + 120
    assert h.depths(keys(3), now_s=200.0) == [0, 2]
    assert h.depths(keys(3), now_s=220.0) == [0, 0] and h.forgotten_keys == 5


def test_history_lookups_do_not_refresh():
    h = RoutingHistory(1, ttl_s=10.0)
    h.record(keys(1), 0, now_s=0.0)
    assert h.depths(keys(1), now_s=9.0) == [1]
    assert h.depths(keys(1), now_s=10.0) == [0]


def test_history_prunes_to_its_target_leaves_first():
    # Dynamo's approximate tree: above 10 entries, prune to 0.8 x 10 = 8, earliest recorded first; within one
    # request, its deepest keys first (a tree evicts leaves).
    h = RoutingHistory(1, capacity_keys=10, prune_to=0.8)
    h.record(keys(6, "a"), 0, now_s=0.0)
    h.record(keys(5, "b"), 0, now_s=1.0)  # 11 entries > 10: drop 3, all of "a"'s deepest
    assert len(h) == 8
    assert h.depths(keys(6, "a"), now_s=1.0) == [3] and h.depths(keys(5, "b"), now_s=1.0) == [5]


def test_history_per_worker_lru_drops_a_prefixes_root_first_like_llm_d():
    # llm-d's per-pod LRU adds a request's hashes in order, so its oldest entry is the prompt's first block: once
    # that is gone, nothing of the prompt matches any more (matching stops at the first missing block).
    h = RoutingHistory(2, capacity_keys=4, per_worker=True, leaves_first=False)
    h.record(keys(4, "a"), 0, now_s=0.0)
    h.record(keys(4, "a"), 1, now_s=0.0)
    h.record(keys(1, "b"), 0, now_s=1.0)  # worker 0 over its 4: its LRU entry ("a", 0) goes
    assert h.depths(keys(4, "a"), now_s=1.0) == [0, 4]


def test_history_enforced_only_at_its_check_ticks():
    # AIBrix checks every 1 s: an entry whose 2 s TTL ends at 2.5 s is still seen at 2.9 s, gone at the 3 s tick.
    h = RoutingHistory(1, ttl_s=2.0, check_interval_s=1.0)
    h.record(keys(2), 0, now_s=0.5)
    assert h.depths(keys(2), now_s=2.9) == [2]
    assert h.depths(keys(2), now_s=3.0) == [0]
    # SGLang-style size limit enforced at ticks: the tree may exceed it in between.
    g = RoutingHistory(1, capacity_keys=3, check_interval_s=60.0)
    g.record(keys(5), 0, now_s=1.0)
    assert len(g) == 5 and g.depths(keys(5), now_s=59.0) == [5]
    assert g.depths(keys(5), now_s=60.0) == [3]  # leaves first: keys 3 and 4 went


def test_approximate_state_never_sees_an_eviction():
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view, state="approximate")
    a = prompt(1, 7)
    w = send(r, a, view)
    view.cached[w].clear()  # the engine evicted everything: the router cannot know
    view.now_s = 60.0
    assert r.prefix.match_tokens(prompt(2, 7))[w] == 127 * B
    assert r.believed_prefix_tokens(a) == 0  # it believed nothing of a itself when it routed it


# ------------------------------------------------------------------ events
def test_event_index_applies_each_batch_after_the_lag():
    view = FakeView(2)
    state = view.prefix_state(PrefixStateSpec(mode="events", event_lag_s=0.5))
    req = prompt(1, 7)
    view.emit(1, "stored", req.block_hashes[:127], now_s=1.0)
    view.now_s = 1.49
    assert state.match_tokens(req) == [0, 0]  # published at 1.0, due at 1.5
    view.now_s = 1.5
    assert state.match_tokens(req) == [0, 127 * B]
    view.emit(1, "removed", req.block_hashes[100:101], now_s=2.0)
    view.now_s = 2.2
    assert state.match_tokens(req) == [0, 127 * B]  # the router still believes the removed block is there
    view.now_s = 2.5
    assert state.match_tokens(req) == [0, 100 * B]
    view.emit(1, "cleared", now_s=3.0)
    view.now_s = 3.5
    assert state.match_tokens(req) == [0, 0]


def test_event_index_without_lag_equals_the_cache():
    view = FakeView(2)
    state = view.prefix_state(PrefixStateSpec(mode="events"))
    req = prompt(1, 7)
    view.emit(0, "stored", req.block_hashes[:40])
    assert state.match_tokens(req) == [view.cached_prefix_tokens(0, req), 0] == [40 * B, 0]


def test_lost_events_leave_the_index_wrong_in_both_directions():
    view = FakeView(1)
    state = view.prefix_state(PrefixStateSpec(mode="events", event_loss=0.5))
    req = prompt(1, 7)
    for i in range(127):
        view.emit(0, "stored", req.block_hashes[i:i + 1])
    believed = state.match_tokens(req)[0] // B
    assert state.events_lost > 0 and believed < 127  # a lost store ends the router's run early
    assert state.events_applied + state.events_lost == 127


def test_predicted_entries_count_before_the_events_arrive():
    # Dynamo --router-predicted-ttl-secs: the router's own choice counts at once, the larger of the two wins.
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view, state="events", event_lag_s=10.0)
    r.prefix = view.prefix_state(PrefixStateSpec(mode="events", event_lag_s=10.0, predicted_ttl_s=5.0))
    a = prompt(1, 7)
    w = send(r, a, view)
    view.now_s = 1.0
    assert r.prefix.match_tokens(prompt(2, 7))[w] == 127 * B  # a's prefix, before any event arrived
    view.now_s = 5.0
    assert r.prefix.match_tokens(prompt(2, 7))[w] == 0


# ------------------------------------------------------------------ scraped metrics
def test_scraper_reads_every_interval_and_parks_while_idle():
    env = simpy.Environment()
    state = {"running": 0}
    busy = {"on": False}
    scraper = MetricsScraper(env, 0.05, lambda: [EngineLoad(num_running=state["running"])], lambda: busy["on"])

    def workload():
        yield env.timeout(0.01)
        busy["on"], state["running"] = True, 3
        scraper.wake()
        yield env.timeout(0.03)
        assert scraper.loads[0].num_running == 0  # 0.04 s: the 0.05 s scrape has not happened yet
        yield env.timeout(0.02)
        assert scraper.loads[0].num_running == 3  # 0.06 s: read at 0.05 s
        state["running"] = 0
        busy["on"] = False

    env.process(workload())
    env.run()  # ends: the scraper parks once a scrape found the cluster idle
    assert env.now == pytest.approx(0.10) and scraper.num_scrapes == 3  # at 0, 0.05, 0.10


# ------------------------------------------------------------------ replicas
def test_replicas_each_keep_their_own_history():
    view = FakeView(2)
    rng = random.Random(0)
    router = ReplicatedRouter(lambda r: build(KvAwareRouter, n=2, seed=r, view=view, state="approximate"), 2, rng)
    a, b = router.replicas
    routed_by_a = 0
    for rid in range(20):
        req = prompt(rid, 7)
        router.route(req, view)
        routed_by_a += router._owner[rid] is a
        router.on_dispatch(req, 0)
    assert 0 < routed_by_a < 20
    # Each history holds prefix 7's 127 blocks and the 21 own blocks of each request that replica routed, only.
    assert len(a.prefix.history) == 127 + 21 * routed_by_a
    assert len(b.prefix.history) == 127 + 21 * (20 - routed_by_a)
    assert (a.in_flight[0], b.in_flight[0]) == (routed_by_a, 20 - routed_by_a)


# ------------------------------------------------------------------ specs
def test_router_specs_split_where_a_token_has_no_equals():
    assert split_router_list("kv-aware:state=events,event_lag_s=0.5,random, llm-d:preset=precise") == [
        "kv-aware:state=events,event_lag_s=0.5", "random", "llm-d:preset=precise"]
    assert split_router_spec("kv-aware:temperature=0.5,state=exact,x=true,y=null") == (
        "kv-aware", {"temperature": 0.5, "state": "exact", "x": True, "y": None})
    assert router_label("p2c", {}) == "p2c" and router_label("a", {"b": True, "c": None}) == "a:b=true,c=null"
    for bad in ("=1", "kv-aware:", "kv-aware:temperature", "kv-aware:a=1,a=2"):
        with pytest.raises(ValueError):
            split_router_list(bad) if bad == "=1" else split_router_spec(bad)
    # A bare name equal to the scenario's router keeps the scenario's options; a spec brings its own.
    assert router_overrides("kv-aware", "kv-aware", {"temperature": 1}) == {
        "router.name": "kv-aware", "router.options": {"temperature": 1}}
    assert router_overrides("kv-aware:state=events", "kv-aware", {"temperature": 1})["router.options"] == {
        "state": "events"}


# ------------------------------------------------------------------ reuse ledger
def test_reuse_ledger_tells_routing_losses_from_memory_losses():
    # Three requests of prefix 7 (127 shared blocks of 148): the first to worker 0, the next two to worker 1.
    # Available: 0, then 127 blocks twice. Captured: 0, 0 (worker 1 had not seen it), then 127.
    ledger = ReuseLedger(2, B)
    assert ledger.dispatch(prompt(1, 7).block_hashes, 2371, 0) == (0, 0)
    assert ledger.dispatch(prompt(2, 7).block_hashes, 2371, 1) == (127 * B, 0)
    assert ledger.dispatch(prompt(3, 7).block_hashes, 2371, 1) == (127 * B, 127 * B)
    # A repeat of a whole prompt is capped as the engines cap a hit: prompt_tokens - 1, in whole blocks.
    whole = Request(9, 32, 1, (("w", 0), ("w", 1)))
    ledger.dispatch(whole.block_hashes, 32, 0)
    assert ledger.dispatch(whole.block_hashes, 32, 0) == (16, 16)


def test_each_worker_may_have_its_own_event_lag():
    # Worker 0's events arrive after 0.1 s, worker 1's after 1 s: a batch worker 1 published first is applied last.
    view = FakeView(2)
    state = view.prefix_state(PrefixStateSpec(mode="events", event_lag_s=(0.1, 1.0)))
    req = prompt(1, 7)
    view.emit(1, "stored", req.block_hashes[:10], now_s=0.0)
    view.emit(0, "stored", req.block_hashes[:20], now_s=0.5)
    view.now_s = 0.6
    assert state.match_tokens(req) == [20 * B, 0]
    view.now_s = 1.0
    assert state.match_tokens(req) == [20 * B, 10 * B]
    r = build(KvAwareRouter, n=2, view=view, state="events", event_lag_s=[0.1, 1.0])
    assert r.prefix_state_spec().event_lag_s == (0.1, 1.0)
    with pytest.raises(ValueError, match="one lag >= 0 per worker"):
        build(KvAwareRouter, n=2, view=view, state="events", event_lag_s=[0.1])


# ------------------------------------------------------------------ a worker leaves
def test_an_event_fed_index_drops_a_removed_workers_blocks_and_its_batches_still_in_flight():
    # Lag 1 s. At t=0 worker 0 stores a0 a1 and worker 1 b0 b1; at t=0.5 worker 0 stores a2 and worker 1 b2 (due at
    # 1.5). At t=1 the first batches have landed. Worker 0 is removed at t=1: its blocks leave the index and its
    # batch still in flight is dropped; at t=2 worker 0 holds nothing while worker 1's late batch has landed.
    view = FakeView(2)
    state = view.prefix_state(PrefixStateSpec(mode="events", event_lag_s=1.0))
    view.emit(0, "stored", keys(2, "a"))
    view.emit(1, "stored", keys(2, "b"))
    view.now_s = 0.5
    view.emit(0, "stored", [("a", 2)])
    view.emit(1, "stored", [("b", 2)])
    req_a, req_b = Request(0, 48, 1, tuple(keys(3, "a"))), Request(1, 48, 1, tuple(keys(3, "b")))
    view.now_s = 1.0
    assert state.match_tokens(req_a) == [2 * B, 0] and state.match_tokens(req_b) == [0, 2 * B]
    state.remove_worker(0)
    view.now_s = 2.0
    assert state.match_tokens(req_a) == [0, 0]
    assert state.match_tokens(req_b) == [0, 3 * B]


def test_a_renewed_slot_forgets_what_its_draining_instance_published_after_it_left():
    # Worker 1 leaves routing (it drains) and still stores x0 x1 while finishing; a new instance then starts in slot
    # 1: the router's index holds nothing for it (the new engine's cache is empty), whatever the old one published.
    view = FakeView(2)
    r = build(KvAwareRouter, n=2, view=view, state="events")
    r.set_workers((0,), (0,))
    view.emit(1, "stored", keys(2, "x"))
    req = Request(0, 40, 1, tuple(keys(2, "x")))
    assert r.prefix_tokens(req) == [0, 2 * B]
    r.set_workers((0, 1), (0, 2))
    assert r.prefix_tokens(req) == [0, 0]


def test_an_approximate_router_forgets_what_it_sent_to_a_worker_that_left():
    view = FakeView(3)
    r = build(KvAwareRouter, n=3, view=view, state="approximate")
    req = prompt(0, 5)
    r.on_dispatch(req, 2)
    assert r.prefix_tokens(req)[2] == 148 * B
    r.set_workers((0, 1), (0, 1))
    assert r.prefix_tokens(req) == [0, 0, 0]


def test_events_of_one_batch_apply_in_order_a_clear_included():
    # One published batch: worker 0 stores a prompt, clears its cache, then stores another prompt's first blocks.
    # Runs of one kind are applied together, in the batch's order: only the last store is left.
    view = FakeView(2)
    state = view.prefix_state(PrefixStateSpec(mode="events"))
    a, b = prompt(1, 7), prompt(2, 8)
    batch = [CacheEvent("stored", a.block_hashes[:3]), CacheEvent("stored", a.block_hashes[3:5]),
             CacheEvent("cleared"), CacheEvent("stored", b.block_hashes[:2]), CacheEvent("removed", b.block_hashes[1:2])]
    for listener in view.listeners[0]:
        listener(batch, 0.0)
    assert state.match_tokens(a) == [0, 0]
    assert state.match_tokens(b) == [B, 0]
    assert state.events_applied == 5
