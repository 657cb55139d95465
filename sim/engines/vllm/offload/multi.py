"""KV tiers chained as vLLM's `MultiConnector` chains connectors
(`vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py`, cited `MC`): a worker's host (CPU) tier and a
cluster-shared store, each an `OffloadingConnector` over its own manager and link.

The rules of `MC` that decide where KV comes from and where it goes:
* Load from one tier only: `get_num_new_matched_tokens` asks the connectors in order and the *first* one reporting
  a non-zero hit is the one the request loads from (`_requests_to_connector`), even if a later tier holds more; a
  connector answering "not yet" (None) makes the whole lookup "not yet" and the later ones are not asked.
* Stores go to every tier: `update_state_after_alloc` gives the chosen connector the request's blocks and external
  tokens and every other one empty blocks and 0 tokens, so each later offers the request's computed prompt chunks
  (`build_connector_meta` of every connector), and `request_finished` reaches all of them.
So with [host, shared] a request that finds any of its continuation in the host tier loads that and prefills the
rest, even if the shared store holds more of it; what it computes is written through to both tiers.

A cluster-shared store (Mooncake Store, an LMCache server, Dynamo's G3) is the same connector logic over one
`CpuOffloadingManager` that every worker's shared connector uses: one capacity and one recency for the cluster,
and a chunk any worker stored is a hit for every worker once its store completed. Where that is not the product:
* Visibility: a chunk whose store is in flight is a miss for the shared store (`defer_on_pending=False`: Mooncake
  `Put` and LMCache's remote `put` are visible once written), where vLLM's host tier defers the request.
* Pinning: a chunk being loaded by any worker cannot be evicted (vLLM's ref counts across the cluster); Mooncake
  leases an object for a while after a read instead (`default_kv_lease_ttl`), LMCache does not pin remote chunks.
* Recency: the manager's policy (lru or arc as vLLM's host tier orders it, with request ranks drawn from one
  counter for the cluster); Mooncake evicts by approximate LRU at a high-water mark (`eviction_ratio`), LMCache's
  server by LRU. Placement, replication and the store's metadata service are not modelled.
* Stores: prompt-only full chunks, all-or-nothing per offer, as the host tier stores (no store threshold).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sim.engines.interface import HostLink, PrefixCacheStats
from sim.engines.vllm.offload.connector import ConnectorStep, OffloadingConnector
from sim.engines.vllm.offload.transfers import HostTransfers
from sim.engines.vllm.request_state import RequestState

TierJobId = tuple[int, int]
"""(tier index in the chain, the tier connector's job id)."""


@dataclass(slots=True)
class MultiStep:
    """One `schedule()`'s connector steps, one per tier in chain order (vLLM's `MultiKVConnectorMetadata`)."""

    steps: list[ConnectorStep] = field(default_factory=list)


@dataclass(slots=True)
class TierCounters:
    """One tier's cumulative counters on one worker (summable over workers)."""

    num_loaded_chunks: int = 0
    num_stored_chunks: int = 0
    num_evicted_chunks: int = 0
    """Chunks this worker's store offers evicted from the tier (for a shared store, this worker's share)."""


class MultiConnector:
    """One worker's `MultiConnector` over tier connectors in chain order (see the module docstring); the scheduler
    calls it exactly as it calls an `OffloadingConnector`, and the jobs it hands out are `TierJobId`s."""

    sync_load = False
    """Its tiers load asynchronously (LMCache, the synchronous one, is not chained)."""

    def __init__(self, tiers: Sequence[OffloadingConnector]) -> None:
        if not tiers:
            raise ValueError("a MultiConnector needs at least one tier")
        self.tiers = list(tiers)
        self.prefix_cache = PrefixCacheStats()
        """The scheduler's `connector_prefix_cache_stats`, over the chain (`S` 1487-1506)."""
        self._chosen: dict[RequestState, int] = {}
        """The tier each request's last lookup chose to load from (`MC` `_requests_to_connector`)."""
        self.counters = [TierCounters() for _ in self.tiers]
        self._shared = [t for t in self.tiers if t.medium == "SHARED"]

    # ------------------------------------------------------------------ state
    @property
    def has_jobs(self) -> bool:
        return any(t.has_jobs for t in self.tiers)

    @property
    def blocks_decode_stretch(self) -> bool:
        """A tier's own reasons, or a copy to or from the shared store in flight: other workers read the store,
        and a store that completes inside a stretch would become visible to them only at its end (step by step it
        is taken at the first step that sees it), so a worker with shared copies in flight steps one at a time."""
        return any(t.blocks_decode_stretch for t in self.tiers) or any(t.has_jobs for t in self._shared)

    @property
    def has_work(self) -> bool:
        return any(t.has_work for t in self.tiers)

    def job(self, job_id: TierJobId):
        return self.tiers[job_id[0]].job(job_id[1])

    def chosen_medium(self, state: RequestState) -> str | None:
        """The medium of the tier `state`'s last lookup loads from (None: no tier hit)."""
        i = self._chosen.get(state)
        return None if i is None else self.tiers[i].medium

    # ------------------------------------------------------------------ admission
    def lookup(self, state: RequestState, num_gpu_hit_tokens: int) -> int | None:
        """The first tier with a non-zero hit wins; a tier deferring defers (`MC` get_num_new_matched_tokens)."""
        self._chosen.pop(state, None)
        hit = 0
        for i, tier in enumerate(self.tiers):
            ext = tier.lookup(state, num_gpu_hit_tokens)
            if ext is None:
                return None
            if hit == 0 and ext > 0:
                hit = ext
                self._chosen[state] = i
        return hit

    def record_lookup(self, state: RequestState, num_gpu_hit_tokens: int, num_external_tokens: int,
                      *, preempted: bool) -> None:
        queries = state.num_tokens - num_gpu_hit_tokens
        if queries:
            self.prefix_cache.record(queries, num_external_tokens, preempted=preempted)

    def after_alloc(self, state: RequestState, num_gpu_hit_tokens: int, num_external_tokens: int) -> None:
        """The chosen tier loads; every other tier is told of 0 external tokens (`MC` update_state_after_alloc)."""
        chosen = self._chosen.get(state) if num_external_tokens else None
        for i, tier in enumerate(self.tiers):
            if i == chosen:
                before = tier.counters.num_loaded_chunks
                tier.after_alloc(state, num_gpu_hit_tokens, num_external_tokens)
                self.counters[i].num_loaded_chunks += tier.counters.num_loaded_chunks - before
            else:
                tier.after_alloc(state, num_gpu_hit_tokens, 0)
        if chosen is None:
            self._chosen.pop(state, None)

    # ------------------------------------------------------------------ end of schedule()
    def build_step(self, scheduled: Iterable[tuple[RequestState, int]], preempted: Sequence[RequestState]) -> MultiStep:
        scheduled = list(scheduled)
        step = MultiStep()
        for i, tier in enumerate(self.tiers):
            before = tier.counters.num_stored_chunks
            sub = tier.build_step(scheduled, preempted)
            c = self.counters[i]
            c.num_stored_chunks += tier.counters.num_stored_chunks - before
            c.num_evicted_chunks += sum(len(hashes) for _state, hashes in sub.evicted)
            step.steps.append(sub)
        return step

    def request_finished(self, state: RequestState) -> None:
        self._chosen.pop(state, None)
        for tier in self.tiers:
            tier.request_finished(state)

    # ------------------------------------------------------------------ the worker reports
    def complete(self, job_ids: Iterable[TierJobId]) -> list[RequestState]:
        by_tier: list[list[int]] = [[] for _ in self.tiers]
        for i, jid in job_ids:
            by_tier[i].append(jid)
        loaded: list[RequestState] = []
        for tier, ids in zip(self.tiers, by_tier):
            if ids:
                loaded.extend(tier.complete(ids))
        return loaded


class MultiTransfers:
    """The tiers' copies, each tier's jobs on its own link (`HostTransfers` per tier): host tier on the device's
    host link, the shared store on the device's network link. Job ids are `TierJobId`s, reported tier by tier in
    chain order, each tier's in submission order."""

    def __init__(self, connector: MultiConnector, links: Sequence[HostLink]) -> None:
        self.tiers = [HostTransfers(tier, link) for tier, link in zip(connector.tiers, links, strict=True)]

    def start_step(self, step: MultiStep, now_s: float) -> float:
        return max(t.start_step(s, now_s) for t, s in zip(self.tiers, step.steps))

    def end_step(self, now_s: float) -> list[TierJobId]:
        return [(i, j) for i, t in enumerate(self.tiers) for j in t.end_step(now_s)]

    def seen_by(self, step_start_s: float) -> list[TierJobId]:
        return [(i, j) for i, t in enumerate(self.tiers) for j in t.seen_by(step_start_s)]

    def next_done_s(self) -> float | None:
        times = [s for t in self.tiers if (s := t.next_done_s()) is not None]
        return min(times) if times else None
