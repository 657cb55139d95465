"""NVIDIA Dynamo's KV router with its default cost (`lib/kv-router/src/scheduling/selector/default.rs`).

For each worker w, with B the block size and ISL the prompt length in tokens:
    overlap_w   = the request's leading blocks cached on w, up to w's first miss (Dynamo's radix-tree walk,
                  `RadixTree::find_matches`: a worker drops out of the walk at the first node it does not hold
                  and scores the depth it reached; a block it holds after that gap does not count)
    prefill_w   = (active_prefill_tokens_w + ISL - overlap_w * B) / B          (blocks, a float)
    decode_w    = active_blocks_w + new_blocks_w
    cost_w      = overlap_score_weight * prefill_w + decode_w
argmin with uniform random tie-break (temperature 0), or softmax sampling at temperature T > 0.
Router-side load (Dynamo's active-sequence tracking): at dispatch a request adds ISL - overlap * B prefill tokens
(removed at its first token) and its full-block hashes to the worker's active set (ref-counted, removed at
completion); `active_blocks_w` is that set's size and `new_blocks_w` the request's blocks not in it.
Cache state is exact (KV events without lag): overlaps are peeks into the workers' caches.
"""

from __future__ import annotations

import math
from itertools import compress, repeat
from operator import add, not_, sub

from pydantic import Field

from policies.base import PrefixStateOptions, RouterBase
from sim.cluster.reuse import held_prefix
from sim.workloads.request import Request
from sim.cluster.router import ClusterView


class KvAwareOptions(PrefixStateOptions):
    overlap_score_weight: float = Field(1.0, ge=0, description="Weight of the prefill term (Dynamo --router-kv-overlap-score-weight); 0 = load only, no prefix state.")
    temperature: float = Field(0.0, ge=0, description="Softmax temperature over costs; 0 = argmin with random tie-break.")


class KvAwareRouter(RouterBase):
    name = "kv-aware"
    summary = "Dynamo KV router default cost: prefill blocks after overlap + active blocks"
    Options = KvAwareOptions
    needs_cache_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._prefill_tokens = [0] * self.num_workers
        # block hash -> in-flight requests holding it. NOTE: prefix-closed (a union of whole prompts' chained
        # hashes), so a request's hashes already active are a leading run, found by binary search.
        self._active: list[dict] = [{} for _ in range(self.num_workers)]
        self._pending_prefill: dict[int, int] = {}
        self._chosen_overlap: dict[int, int] = {}

    def overlaps(self, request: Request, view: ClusterView) -> list[int]:
        if self.options.overlap_score_weight == 0:
            return [0] * self.num_workers
        B = self.block_size
        return [t // B for t in self.prefix_tokens(request)]

    def costs(self, request: Request, view: ClusterView) -> tuple[list[float], list[int]]:
        B = self.block_size
        isl = request.prompt_tokens
        weight = self.options.overlap_score_weight
        overlap = self.overlaps(request, view)
        costs = []
        hashes = request.block_hashes
        for w in range(self.num_workers):
            active = self._active[w]
            prefill_blocks = (self._prefill_tokens[w] + isl - overlap[w] * B) / B
            new_blocks = len(hashes) - held_prefix(active, hashes)
            costs.append(weight * prefill_blocks + len(active) + new_blocks)
        return costs, overlap

    def route(self, request: Request, view: ClusterView) -> int:
        costs, overlap = self.costs(request, view)
        worker = self._select(costs)
        self._chosen_overlap[request.request_id] = overlap[worker]
        return worker

    def _select(self, costs: list[float]) -> int:
        lo, hi = min(costs), max(costs)
        if self.options.temperature > 0 and hi > lo:
            t = self.options.temperature
            weights = [math.exp(-(c - lo) / (t * (hi - lo))) for c in costs]
            u = self.rng.random() * sum(weights)
            acc = 0.0
            for w, p in enumerate(weights):
                acc += p
                if acc >= u:
                    return w
            return len(costs) - 1
        ties = [w for w, c in enumerate(costs) if c == lo]
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)

    def after_dispatch(self, request: Request, worker: int) -> None:
        overlap = self._chosen_overlap.pop(request.request_id, 0)
        tokens = max(request.prompt_tokens - overlap * self.block_size, 0)
        self._pending_prefill[request.request_id] = tokens
        self._prefill_tokens[worker] += tokens
        # NOTE: ref counts +1 for every hash in C-level calls (a request's chained hashes are distinct).
        active = self._active[worker]
        hashes = request.block_hashes
        active.update(zip(hashes, map(add, map(active.get, hashes, repeat(0)), repeat(1))))

    def after_first_token(self, request: Request, worker: int) -> None:
        self._prefill_tokens[worker] -= self._pending_prefill.pop(request.request_id, 0)

    def after_complete(self, request: Request, worker: int) -> None:
        self.after_first_token(request, worker)
        active = self._active[worker]
        hashes = request.block_hashes
        left = list(map(sub, map(active.__getitem__, hashes), repeat(1)))
        active.update(zip(hashes, left))
        for h in compress(hashes, map(not_, left)):
            del active[h]
