"""vLLM v1 behind the engine interface: the scheduler, its KV cache manager and decode stretches, as one `Engine`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from sim.engines.interface import (
    CacheListener,
    EngineCounters,
    EngineLoad,
    HostLink,
    RemoteKvSource,
    SharedTier,
    StepOutcome,
    StepPlan,
    StepTimeModel,
)
from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.decode_stretch import DecodeStretch
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.offload.connector import OffloadingConnector
from sim.engines.vllm.offload.cpu_manager import CpuOffloadingManager
from sim.engines.vllm.offload.lmcache import LmcacheConnector, LmcacheCpuBackend, LmcacheTransfers
from sim.engines.vllm.offload.multi import MultiConnector, MultiTransfers
from sim.engines.vllm.offload.peer_fetch import PeerFetch
from sim.engines.vllm.offload.transfers import HostTransfers
from sim.engines.vllm.request_state import RequestState
from sim.engines.vllm.scheduler import Scheduler, SchedulerLimits
from sim.engines.vllm.spec import VllmEngineSpec
from sim.workloads.request import Request


class VllmEngine:
    """One vLLM v1 worker (synchronous engine loop, as vLLM runs on CPU and as the oracle checks it).

    `cache` is the `KVCacheManager` (the worker's `PrefixCache`); `scheduler` does the work. The rules that changed
    between releases come from `spec.vllm_version` (`sim.engines.vllm.behaviour`). With `spec.cpu_kv_bytes` the
    scheduler has a host tier (`OffloadingConnector`) whose copies run on `host_link` (`HostTransfers`).
    """

    kind: ClassVar[str] = "vllm"
    Spec: ClassVar[type[VllmEngineSpec]] = VllmEngineSpec

    @staticmethod
    def shared_store(spec: VllmEngineSpec, kv_bytes_per_token: int) -> CpuOffloadingManager:
        """The cluster-shared KV store of `spec` (`engine.shared_kv_bytes`): one manager every worker's shared
        connector uses (sim/engines/vllm/offload/multi.py)."""
        return CpuOffloadingManager(spec.num_shared_chunks(kv_bytes_per_token),
                                    eviction_policy=spec.shared_eviction_policy)

    def __init__(self, spec: VllmEngineSpec, *, kv_bytes_per_token: int, host_link: HostLink | None = None,
                 shared_tier: SharedTier | None = None) -> None:
        behaviour = VllmBehaviour.for_version(spec.vllm_version)
        self.spec = spec
        self.cache = KVCacheManager(
            num_blocks=spec.num_blocks(kv_bytes_per_token), block_size=spec.block_size,
            max_model_len=spec.max_model_len, unhashed_to_head=behaviour.unhashed_to_head,
            free_tail_first=spec.free_order == "tail-first",
        )
        self.connector: OffloadingConnector | MultiConnector | LmcacheConnector | None = None
        self.transfers: HostTransfers | MultiTransfers | LmcacheTransfers | None = None
        self._bytes_per_block = spec.block_size * kv_bytes_per_token
        host = None
        if spec.cpu_kv_bytes and spec.cpu_kv_connector == "lmcache":
            if host_link is None:
                raise ValueError("engine.cpu_kv_bytes needs a host link to time its copies")
            lmcache = LmcacheConnector(LmcacheCpuBackend(spec.num_lmcache_chunks(kv_bytes_per_token)),
                                       block_size=spec.block_size, chunk_tokens=spec.lmcache_chunk_tokens,
                                       kv_bytes_per_token=kv_bytes_per_token)
            self.connector = lmcache
            self.transfers = LmcacheTransfers(lmcache, host_link)
        elif spec.cpu_kv_bytes:
            if host_link is None:
                raise ValueError("engine.cpu_kv_bytes needs a host link to time its copies")
            manager = CpuOffloadingManager(spec.num_cpu_chunks(kv_bytes_per_token),
                                           eviction_policy=spec.cpu_eviction_policy)
            host = OffloadingConnector(manager, block_size=spec.block_size, bytes_per_block=self._bytes_per_block)
        if spec.shared_kv_bytes:
            if shared_tier is None:
                raise ValueError("engine.shared_kv_bytes needs the cluster's shared store and a network link")
            assert isinstance(shared_tier.store, CpuOffloadingManager)
            shared = OffloadingConnector(shared_tier.store, block_size=spec.block_size,
                                         bytes_per_block=self._bytes_per_block, medium="SHARED",
                                         defer_on_pending=False)
            # NOTE: vLLM's MultiConnector order [host, shared]: a request loads from the first tier with a hit.
            tiers, links = ([host, shared], [host_link, shared_tier.link]) if host else ([shared], [shared_tier.link])
            self.connector = MultiConnector(tiers)
            self.transfers = MultiTransfers(self.connector, links)
        elif host is not None:
            self.connector = host
            self.transfers = HostTransfers(host, host_link)
        self._tier_listeners: list[CacheListener] = []
        self.scheduler = Scheduler(SchedulerLimits(spec.max_num_batched_tokens, spec.max_num_seqs, spec.max_model_len),
                                   self.cache, behaviour, self.connector)
        # NOTE: `Engine.schedule` is the scheduler's own method: the worker calls it every step, and binding it
        # here saves a frame per call.
        self.schedule: Callable[[float], StepPlan] = (self.scheduler.schedule if self.connector is None
                                                      else self._schedule_with_transfers)

    def _schedule_with_transfers(self, now_s: float) -> StepPlan:
        plan = self.scheduler.schedule(now_s)
        assert self.transfers is not None
        plan.stall_s = self.transfers.start_step(self.scheduler.take_connector_step(), now_s)
        if plan.is_empty:
            # NOTE: a step that computes nothing (only loads waiting, or copies in flight) still ends at once, as
            # vLLM's loop runs it: completions are taken and its stores start; the worker then sleeps until the
            # next copy completes (`next_background_s`) or a request arrives. A flush still makes it wait
            # (`stall_s`, which the worker waits too).
            self.update_from_output(plan, now_s + plan.stall_s)
        return plan

    def add_request(self, request: Request, *, worker: int, arrival_s: float) -> RequestState:
        state = RequestState(request, worker, arrival_s, block_size=self.cache.block_size)
        self.scheduler.add_request(state)
        return state

    def add_remote_prefilled(self, request: Request, *, worker: int, arrival_s: float,
                             source: RemoteKvSource) -> RequestState:
        state = RequestState(request, worker, arrival_s, block_size=self.cache.block_size, remote_kv=source)
        self.scheduler.add_request(state)
        return state

    def add_remote_decode(self, request: Request, *, worker: int, arrival_s: float) -> RequestState:
        state = RequestState(request, worker, arrival_s, block_size=self.cache.block_size, hold_kv=True)
        self.scheduler.add_request(state)
        return state

    def release_remote_decode(self, state: RequestState) -> None:
        self.scheduler.release_held(state)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_requests(self) -> int:
        return self.scheduler.num_requests

    def load(self) -> EngineLoad:
        return self.scheduler.load()

    def update_from_output(self, plan: StepPlan, now_s: float) -> StepOutcome:
        transfers = self.transfers
        if transfers is None:
            outcome = self.scheduler.update_from_output(plan, now_s)
        else:
            outcome = self.scheduler.update_from_output(plan, now_s, finished_jobs=transfers.end_step(now_s))
        # NOTE: vLLM's engine core takes the step's KV events after processing its output.
        self.cache.publish(now_s)
        if self._tier_listeners:
            self._publish_tiers(now_s)
        return outcome

    @property
    def tier_connectors(self) -> list[OffloadingConnector]:
        """The connectors of the engine's KV tiers, in chain order (none without a tier)."""
        c = self.connector
        return [] if c is None else list(c.tiers) if isinstance(c, MultiConnector) else [c]

    def subscribe_tiers(self, listener: CacheListener) -> None:
        """Publish the KV tiers' events (`CacheEvent.medium` set) to `listener` after each step, after the GPU
        cache's (vLLM appends the connector's events to the step's batch). Nothing is recorded until someone
        subscribes."""
        for tier in self.tier_connectors:
            if tier.events is None:
                tier.events = []
        self._tier_listeners.append(listener)

    def _publish_tiers(self, now_s: float) -> None:
        batch = []
        for tier in self.tier_connectors:
            if tier.events:
                batch.extend(tier.events)
                tier.events.clear()
        if batch:
            for listener in self._tier_listeners:
                listener(batch, now_s)

    def plan_decode_stretch(self, time_model: StepTimeModel, *, speed: float, now_s: float) -> DecodeStretch | None:
        s = self.scheduler
        if not s.running or (s.waiting and s.stalled_head is None):
            return None  # the common case, decided without a call: a step with work to admit or nothing running
        return DecodeStretch.plan(s, time_model, speed=speed, now_s=now_s, max_model_len=self.spec.max_model_len)

    def finish_stretch(self, stretch: DecodeStretch, num_steps: int, now_s: float) -> list[RequestState]:
        stretch.apply(num_steps)
        finished = stretch.finished()
        if finished:
            self.scheduler.finish(finished, now_s)
        if self.transfers is not None and num_steps:
            # NOTE: stores in flight may complete during a stretch; nothing in it reads the tier, so they are taken
            # at its end, as the checks of its steps saw them: done by the start of its last step (after the
            # finishes, as `update_from_output` orders them).
            done = self.transfers.seen_by(stretch.start_s + stretch.elapsed_s(num_steps - 1))
            if done:
                self.scheduler.complete_transfers(done)
                if self._tier_listeners:
                    self._publish_tiers(now_s)
        return finished

    def counters(self) -> EngineCounters:
        evicted = self.cache.num_evicted_blocks
        c = self.connector
        tiers = {}
        if isinstance(c, MultiConnector):
            for tier, counts in zip(c.tiers, c.counters):
                name = "cpu" if tier.medium == "CPU" else "shared"
                tiers[f"{name}_stored_blocks"] = counts.num_stored_chunks
                tiers[f"{name}_loaded_blocks"] = counts.num_loaded_chunks
                tiers[f"{name}_evicted_blocks"] = counts.num_evicted_chunks
        elif isinstance(c, LmcacheConnector):
            # NOTE: in GPU blocks, as the other tiers count (an LMCache chunk is blocks_per_chunk blocks).
            k = c.blocks_per_chunk
            tiers = {"cpu_stored_blocks": k * c.counters.num_stored_chunks,
                     "cpu_loaded_blocks": k * c.counters.num_loaded_chunks, "cpu_evicted_blocks": k * c.num_evicted_chunks}
        elif c is not None:
            tiers = {"cpu_stored_blocks": c.counters.num_stored_chunks,
                     "cpu_loaded_blocks": c.counters.num_loaded_chunks, "cpu_evicted_blocks": c.num_evicted_chunks}
            if c.peer_fetch is not None:
                tiers["peer_fetched_blocks"] = c.counters.num_peer_fetched_chunks
        B = self._bytes_per_block
        return EngineCounters(prefix_cache=self.cache.stats.copy(), evicted_blocks=evicted,
                              evicted_tokens=evicted * self.cache.block_size,
                              preemptions=self.scheduler.num_preemptions, **tiers,
                              host_link_bytes=B * (tiers.get("cpu_stored_blocks", 0) + tiers.get("cpu_loaded_blocks", 0)),
                              shared_link_bytes=B * (tiers.get("shared_stored_blocks", 0)
                                                     + tiers.get("shared_loaded_blocks", 0)))

    def peer_store(self) -> CpuOffloadingManager:
        """This worker's host tier as its peers read it (G2 peer fetch, `spec.peer_fetch`)."""
        assert isinstance(self.connector, OffloadingConnector) and self.spec.peer_fetch
        return self.connector.manager

    def bind_peers(self, peers: list, link: HostLink) -> None:
        """G2 peer fetch: the other workers' host tiers (`peer_store`, worker order, this one excluded) and this
        worker's NIC the pulls run on."""
        assert isinstance(self.connector, OffloadingConnector) and self.spec.peer_fetch
        self.connector.peer_fetch = PeerFetch(link, min_blocks=self.spec.peer_min_blocks, peers=list(peers))

    def next_background_s(self) -> float | None:
        remote_s = self.scheduler.next_remote_load_s()
        if self.transfers is None:
            if remote_s is None:
                # NOTE: finished P/D prefills hold blocks until the decode side reads them: wait for that.
                return math.inf if self.scheduler.num_held_requests else None
            return 0.0 if self.scheduler.has_loaded_requests else remote_s
        if self.scheduler.has_loaded_requests or (isinstance(self.connector, OffloadingConnector)
                                                  and self.connector.pulled):
            return 0.0  # a load reported done: the next step promotes it, at once (a peer pull: it looks up again)
        host_s = self.transfers.next_done_s()
        if host_s is None and remote_s is None:
            # NOTE: as without tiers: a P/D prefill worker may be waiting only for its held blocks' release.
            return math.inf if self.scheduler.num_held_requests else None
        return host_s if remote_s is None else remote_s if host_s is None else min(host_s, remote_s)

    def describe_stall(self) -> str:
        return self.scheduler.describe_stall()
