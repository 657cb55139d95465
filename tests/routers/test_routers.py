"""Router tests: each decision rule on a small fake cluster view with exact expected choices and costs."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest

from policies import PD_ROUTERS, ROUTERS
from sim.config import LazyRegistry, named_registry
from policies.prefix_hash import PrefixHashRouter
from policies.random_router import RandomRouter
from policies.round_robin import RoundRobinRouter
from sim.workloads.request import Request
from tests.support.router_fakes import B, FakeView, build, prompt


def test_registry_lists_every_router_and_refuses_duplicates():
    assert {"random", "round-robin", "prefix-hash", "kv-aware", "recorded", "llm-d", "sglang-cache-aware",
            "aibrix-prefix-cache", "aibrix-least-kv-cache", "vllm-router-session", "vllm-router-prefix-aware",
            "vllm-router-loadaware", "least-loaded", "p2c", "sticky", "preble", "kvsim"} == set(ROUTERS)
    with pytest.raises(RuntimeError, match="^router name 'random' is empty or registered twice$"):
        named_registry("router", (RandomRouter, RandomRouter))
    with pytest.raises(RuntimeError, match="^disaggregated router name 'random' is empty or registered twice$"):
        named_registry("disaggregated router", (RandomRouter,), taken=ROUTERS)
    assert not set(PD_ROUTERS) & set(ROUTERS)


def test_the_lazy_registry_loads_a_router_when_looked_up_and_refuses_a_misnamed_one():
    # Issue 27 (whole commands): a command imports the module of the router it runs, not every router's.
    code = ("import sys\nfrom policies import ROUTERS\nbefore = {m for m in sys.modules if m.startswith('policies.')}\n"
            "ROUTERS['round-robin']\nprint(sorted(before), sorted({m for m in sys.modules if m.startswith('policies.')} "
            "- before), 'kv-aware' in ROUTERS, len(ROUTERS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "'policies.kv_aware'" not in " ".join(out) and "'policies.round_robin']" in " ".join(out)
    assert out[-2:] == ["True", "17"]
    assert all(cls.name == name for name, cls in [*ROUTERS.items(), *PD_ROUTERS.items()])
    with pytest.raises(RuntimeError, match="^router name 'random' is empty or registered twice$"):
        LazyRegistry("router", (("random", "policies.random_router:RandomRouter"),) * 2)
    with pytest.raises(RuntimeError, match="^router policies.random_router:RandomRouter is named 'random', "
                                           "registered as 'chance'$"):
        LazyRegistry("router", (("chance", "policies.random_router:RandomRouter"),))["chance"]
    with pytest.raises(KeyError):
        ROUTERS["no-such-router"]


def test_unknown_option_names_the_field_and_the_allowed_ones():
    with pytest.raises(ValueError, match="bogus: unknown option of prefix-hash; allowed: replicas, processing_s, prefix_blocks, load_factor, virtual_nodes"):
        build(PrefixHashRouter, bogus=1)
    with pytest.raises(ValueError, match="load_factor"):
        build(PrefixHashRouter, load_factor=0.5)


def test_random_is_uniform_and_seeded():
    view = FakeView(6)
    r1, r2 = build(RandomRouter, seed=3), build(RandomRouter, seed=3)
    picks = [r1.route(prompt(i, 0), view) for i in range(6000)]
    assert picks[:50] == [r2.route(prompt(i, 0), view) for i in range(50)]
    counts = Counter(picks)
    assert set(counts) == set(range(6)) and all(900 < c < 1100 for c in counts.values())


def test_round_robin_cycles():
    r = build(RoundRobinRouter, n=3)
    assert [r.route(prompt(i, 0), FakeView(3)) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_prefix_hash_is_sticky_per_prefix_and_spreads_prefixes():
    r = build(PrefixHashRouter)
    view = FakeView(6)
    homes = {p: r.route(prompt(0, p), view) for p in range(60)}
    assert all(r.route(prompt(i, p), view) == homes[p] for i in range(1, 5) for p in range(60))
    assert len(set(homes.values())) == 6


def test_prefix_hash_key_is_the_first_k_blocks_only():
    r = build(PrefixHashRouter, prefix_blocks=4)
    view = FakeView(6)
    a = Request(1, 100, 1, (("x", 0), ("x", 1), ("x", 2), ("x", 3), ("a", 4), ("a", 5)))
    b = Request(2, 100, 1, (("x", 0), ("x", 1), ("x", 2), ("x", 3), ("b", 4), ("b", 5)))
    assert r.route(a, view) == r.route(b, view)


def test_prefix_hash_bounded_load_spills_clockwise():
    r = build(PrefixHashRouter, load_factor=1.25)
    req = prompt(0, 5)
    ring = list(r.ring_walk(req))
    assert sorted(ring) == list(range(6))
    loads = r.in_flight  # the router's own in-flight counts
    loads[ring[0]] = 3  # total 3 -> capacity ceil(1.25 * 4 / 6) = 1: the home (3 + 1 > 1) is skipped
    view = FakeView(6)
    assert r.route(req, view) == ring[1]
    loads[ring[1]] = 2  # total 5 -> capacity ceil(1.25 * 6 / 6) = 2: ring[1] (2 + 1) is full, ring[2] takes it
    assert r.route(req, view) == ring[2]
    strict = build(PrefixHashRouter)
    strict.in_flight[:] = loads
    assert strict.route(req, view) == ring[0]


def test_recorded_router_replays_the_assignment_and_rejects_bad_ones():
    from policies.recorded import RecordedRouter

    r = RecordedRouter(num_workers=3, block_size=B, rng=random.Random(0), options={"workers": {0: 2, 1: 0}})
    assert [r.route(prompt(i, 0), FakeView(3)) for i in (0, 1)] == [2, 0]
    with pytest.raises(ValueError, match="no worker recorded for request 5"):
        r.route(prompt(5, 0), FakeView(3))
    with pytest.raises(ValueError, match="request 0 was sent to worker 4, but the cluster has 3"):
        RecordedRouter(num_workers=3, block_size=B, rng=random.Random(0), options={"workers": {0: 4}})


class BlindView:
    """A view that fails on any question: a router that claims to ignore the cluster must never ask one."""

    num_workers = 6
    block_size = B

    def __getattr__(self, name):
        raise AssertionError(f"asked the cluster view for {name}")


def _choices(router, requests, *, complete: bool):
    picks = []
    for r in requests:
        w = router.route(r, BlindView())
        router.on_dispatch(r, w)
        if complete:
            router.on_first_token(r, w)
            router.on_complete(r, w)
        picks.append(w)
    return picks


def test_routers_that_ignore_the_cluster_never_read_it_and_the_others_do():
    # `ignores_cluster_state` lets a replay split over processes (sim.replay); a router that reads the view or
    # depends on when requests complete, and claimed it did not, would silently route differently in each process.
    requests = [prompt(rid, rid % 3) for rid in range(24)]

    def fresh(name):
        cls = ROUTERS[name] if name != "prefix-hash bounded" else PrefixHashRouter
        options = ({"workers": {r.request_id: r.request_id % 6 for r in requests}} if name == "recorded"
                   else {"load_factor": 1.25} if name == "prefix-hash bounded" else {})
        router = cls(num_workers=6, block_size=B, rng=random.Random(0), options=options)
        router.bind(FakeView(6))
        return router

    # Preble's exploit path is sticky on three shared prefixes; its explore path weighs in-flight decode work, seen
    # here with distinct prompts whose sizes grow as their outputs shrink.
    explore = [Request(rid, 160 * (rid + 1), 200 - 15 * rid, tuple(("q", rid, i) for i in range(10 * (rid + 1))))
               for rid in range(12)]
    names = [*ROUTERS, "prefix-hash bounded"]
    for name in names:
        work = explore if name == "preble" else requests
        if fresh(name).ignores_cluster_state:
            assert _choices(fresh(name), work, complete=False) == _choices(fresh(name), work, complete=True), name
        else:
            try:
                differ = _choices(fresh(name), work, complete=False) != _choices(fresh(name), work, complete=True)
            except AssertionError:
                differ = True  # it read the view
            assert differ, f"{name} claims to read the cluster but routes the same without it"
    assert {n for n in names if fresh(n).ignores_cluster_state} == {"random", "recorded", "round-robin", "prefix-hash"}
