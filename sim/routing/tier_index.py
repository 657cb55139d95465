"""What a router knows of the workers' KV tiers beyond the GPU: an index fed by the tiers' KV events (`CacheEvent`
with a `medium`), as Dynamo's KV router indexes `StorageTier::HostPinned` events per worker and llm-d's KV-cache
indexer keys blocks by the event's medium (a fleet-wide tier under one `pool:` pseudo-pod that covers every pod).

Media: "CPU" (a worker's host tier: its own set of blocks) and "SHARED" (the cluster-shared store: one set, every
worker's). Events are applied when published (no lag, no loss); a stored event adds its blocks, a removed event
drops them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from sim.engines.interface import CacheEvent
from sim.routing.interface import ClusterView


class TierIndex:
    """Per worker the blocks its host tier holds, and the blocks the shared store holds, from tier events.

    Invariant: `host[w]` is the set of blocks worker w's host tier reported stored and not since removed; `shared`
    likewise for the store (whichever worker's offer stored or evicted them).
    """

    def __init__(self, view: ClusterView) -> None:
        self.host: list[set[Hashable]] = [set() for _ in range(view.num_workers)]
        self.shared: set[Hashable] = set()
        subscribe = getattr(view, "subscribe_tier_events", None)
        if subscribe is not None:
            for w in range(view.num_workers):
                subscribe(w, lambda batch, _now_s, w=w: self._apply(w, batch))

    def _apply(self, worker: int, batch: Sequence[CacheEvent]) -> None:
        for event in batch:
            held = self.shared if event.medium == "SHARED" else self.host[worker]
            if event.kind == "stored":
                held.update(event.block_hashes)
            elif event.kind == "removed":
                held.difference_update(event.block_hashes)
            else:
                held.clear()

    def remove_worker(self, worker: int) -> None:
        """Forget `worker`'s host tier (it left the fleet; a new instance's host tier starts empty). The shared
        store is the cluster's and stays."""
        self.host[worker].clear()

    @staticmethod
    def _run(held: set, keys: Sequence[Hashable], start: int) -> int:
        """Keys held in a row from `start` on."""
        n = 0
        for key in keys[start:]:
            if key not in held:
                break
            n += 1
        return n

    def host_extension_blocks(self, worker: int, keys: Sequence[Hashable], gpu_blocks: int) -> int:
        """Blocks of `keys` after the GPU's `gpu_blocks` that the worker's host tier holds in a row (Dynamo's
        HostPinned extension: lower tiers extend the device match)."""
        return self._run(self.host[worker], keys, gpu_blocks)

    def shared_blocks(self, keys: Sequence[Hashable]) -> int:
        """The leading run of `keys` the shared store holds (Dynamo's `SharedCacheHits`)."""
        return self._run(self.shared, keys, 0)

    def weighted_depth(self, worker: int, keys: Sequence[Hashable], gpu_blocks: int,
                       weights: Mapping[str, float]) -> float:
        """llm-d's LongestPrefix score over the tiers: the leading `gpu_blocks` at weight weights["GPU"], then
        block by block the largest weight among the media holding it ("CPU": the worker's host tier, "SHARED":
        the store), stopping at the first block no medium holds."""
        score = gpu_blocks * weights.get("GPU", 1.0)
        host, shared = self.host[worker], self.shared
        w_cpu, w_shared = weights.get("CPU", 0.0), weights.get("SHARED", 0.0)
        for key in keys[gpu_blocks:]:
            in_host, in_shared = key in host, key in shared
            if not (in_host or in_shared):
                break
            score += max(w_cpu if in_host else 0.0, w_shared if in_shared else 0.0)
        return score
