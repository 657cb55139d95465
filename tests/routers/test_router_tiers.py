"""Routing on simulated tier hits: the tier index fed by the tiers' KV events (medium CPU per worker, SHARED for the
cluster), Dynamo's tier credits in kv-aware and llm-d's medium weights in its precise prefix scorer. With the
weights at kvsim's defaults (0) nothing is read and the costs are those of GPU hits alone."""

from __future__ import annotations

import pytest

from policies.kv_aware import KvAwareRouter
from policies.llm_d import LlmdRouter
from sim.engines.interface import CacheEvent
from sim.routing.tier_index import TierIndex
from tests.support.router_fakes import B, FakeView, build, prompt

PREFIX = tuple(("p", 7, i) for i in range(127))


class TieredView(FakeView):
    """A fake view whose workers also publish tier events (`emit_tier`)."""

    def __init__(self, n, **kwargs):
        super().__init__(n, **kwargs)
        self.tier_listeners = {w: [] for w in range(n)}

    def subscribe_tier_events(self, worker, listener):
        self.tier_listeners[worker].append(listener)

    def emit_tier(self, worker, kind, hashes, medium):
        for listener in self.tier_listeners[worker]:
            listener([CacheEvent(kind, tuple(hashes), None, B, medium)], self.now_s)


def test_the_tier_index_follows_stored_and_removed_events_per_medium():
    view = TieredView(2)
    index = TierIndex(view)
    view.emit_tier(0, "stored", PREFIX[:10], "CPU")
    view.emit_tier(1, "stored", PREFIX[:6], "SHARED")  # worker 1's offer stored them: the store is everyone's
    view.emit_tier(0, "removed", PREFIX[8:10], "CPU")
    assert index.host_extension_blocks(0, PREFIX, gpu_blocks=3) == 5  # blocks 3..7 in worker 0's host tier
    assert index.host_extension_blocks(1, PREFIX, gpu_blocks=0) == 0
    assert index.shared_blocks(PREFIX) == 6
    # llm-d's walk: 3 GPU blocks at 1, then blocks 3..7 at max(CPU 0.8, SHARED 0.5 for 3..5), then nothing.
    assert index.weighted_depth(0, PREFIX, 3, {"GPU": 1.0, "CPU": 0.8, "SHARED": 0.5}) == pytest.approx(3 + 5 * 0.8)
    assert index.weighted_depth(1, PREFIX, 0, {"GPU": 1.0, "CPU": 0.8, "SHARED": 0.5}) == pytest.approx(6 * 0.5)


def test_kv_aware_credits_host_tier_blocks_at_dynamos_weight_only_when_asked():
    # Worker 0's host tier holds the prefix's 127 blocks, its GPU none; worker 1 holds nothing anywhere.
    view = TieredView(2)
    plain = build(KvAwareRouter, n=2, view=view)
    tiered = build(KvAwareRouter, n=2, view=view, host_cache_hit_weight=0.75)
    view.emit_tier(0, "stored", PREFIX, "CPU")
    request = prompt(1, 7)
    assert plain.costs(request, view)[0] == [148.1875 + 148] * 2  # the default reads no tier
    costs, overlap = tiered.costs(request, view)
    assert overlap == [0, 0]
    assert costs == [148.1875 - 0.75 * 127 + 148, 148.1875 + 148]
    assert tiered.route(request, view) == 0


def test_kv_aware_credits_the_shared_store_beyond_each_workers_gpu_match():
    # The store holds 100 blocks of the prefix; worker 1's GPU holds 40 of them: its shared credit is for 60.
    view = TieredView(2, cached={0: set(), 1: set(PREFIX[:40])})
    r = build(KvAwareRouter, n=2, view=view, shared_cache_multiplier=0.5)
    view.emit_tier(0, "stored", PREFIX[:100], "SHARED")
    costs, overlap = r.costs(prompt(1, 7), view)
    assert overlap == [0, 40]
    assert costs == [148.1875 - 0.5 * 100 + 148, 148.1875 - 40 - 0.5 * 60 + 148]


def test_llm_d_precise_scores_host_tier_blocks_at_the_cpu_weight():
    # The precise producer reads KV events: worker 0 reports 20 blocks on the GPU and all 127 in its host tier,
    # worker 1 30 on the GPU. The walk scores 20 blocks at 1 and the next 107 at 0.8.
    view = TieredView(2)
    r = build(LlmdRouter, n=2, view=view, preset="precise", cpu_tier_weight=0.8)
    view.emit(0, "stored", PREFIX[:20])
    view.emit(1, "stored", PREFIX[:30])
    view.emit_tier(0, "stored", PREFIX, "CPU")
    full = len(prompt(1, 7).block_hashes)
    assert r._precise_scores(prompt(1, 7), view) == [pytest.approx((20 + 0.8 * 107) / full), pytest.approx(30 / full)]
