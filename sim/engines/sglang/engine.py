"""SGLang behind the engine interface: the radix tree, the scheduler and its event loop, as one `Engine`."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from sim.engines.event_feed import EventFeed
from sim.engines.interface import (
    CacheListener,
    EngineCounters,
    EngineLoad,
    HostLink,
    RemoteKvSource,
    StepOutcome,
    StepPlan,
    StepTimeModel,
)
from sim.engines.sglang.decode_stretch import SglangDecodeStretch
from sim.engines.sglang.hicache_transfers import HiCacheTransfers
from sim.engines.sglang.hiradix_cache import HiRadixCache, host_capacity_tokens
from sim.engines.sglang.kv_pool import ceil_div
from sim.engines.sglang.radix_cache import RadixCache
from sim.engines.sglang.request_state import SglangRequest
from sim.engines.sglang.scheduler import Scheduler, SchedulerLimits
from sim.engines.sglang.spec import SglangEngineSpec
from sim.engines.sglang.tokens import page_aligned_prompt, prompt_tokens
from sim.workloads.request import BlockHash, Request


class SglangPrefixCache:
    """The radix tree as routers and the records see it (`PrefixCache`): peeks that split and stamp nothing,
    SGLang's token usage, and its KV events page by page (published once per processed batch)."""

    def __init__(self, tree: RadixCache, pool, *, hash_block_size: int) -> None:
        self.tree = tree
        self.pool = pool
        self._hash_block_size = hash_block_size
        self._feed = EventFeed(tree)

    @property
    def block_size(self) -> int:
        return self.tree.page_size

    def tokens(self, request: Request):
        return prompt_tokens(request, self._hash_block_size)

    def aligned_tokens(self, request: Request):
        """`tree.page_aligned(self.tokens(request))`, built once per request for all workers' peeks."""
        return page_aligned_prompt(request, self._hash_block_size, self.tree.page_size)

    def peek_prefix_tokens(self, request: Request) -> int:
        return self.tree.peek_prefix(self.aligned_tokens(request))

    def block_keys(self, request: Request) -> Sequence[BlockHash]:
        key = self.aligned_tokens(request)
        P = self.tree.page_size
        return tuple(key.page_key(start, P) for start in range(0, len(key), P))

    def usage(self) -> float:
        """`sglang:token_usage` (`KvPool.token_usage`): cached, unlocked tokens count as free."""
        return self.pool.token_usage()

    def subscribe(self, listener: CacheListener) -> None:
        self._feed.subscribe(listener)

    def publish(self, now_s: float) -> None:
        """Hand the events recorded since the last call to the subscribers, stamped `now_s`."""
        self._feed.publish(now_s)


class SglangEngine:
    """One SGLang worker (its scheduler's event loop, overlap scheduling by default)."""

    kind: ClassVar[str] = "sglang"
    Spec: ClassVar[type[SglangEngineSpec]] = SglangEngineSpec

    def __init__(self, spec: SglangEngineSpec, *, kv_bytes_per_token: int, host_link: HostLink | None = None) -> None:
        self.spec = spec
        n = spec.max_total_num_tokens(kv_bytes_per_token)
        self.hicache: HiCacheTransfers | None = None
        if spec.cpu_kv_bytes:
            if host_link is None:
                raise ValueError("engine.cpu_kv_bytes needs a host link to time its copies")
            self.tree = HiRadixCache(
                page_size=spec.page_size, eviction_policy=spec.radix_eviction_policy,
                host_capacity=host_capacity_tokens(spec.cpu_kv_bytes, kv_bytes_per_token, spec.page_size),
                write_policy=spec.hicache_write_policy)
        else:
            self.tree = RadixCache(page_size=spec.page_size, eviction_policy=spec.radix_eviction_policy)
        limits = SchedulerLimits(
            max_total_tokens=n, max_running_requests=spec.running_request_limit(kv_bytes_per_token),
            chunked_prefill_size=spec.chunked_prefill_size, max_prefill_tokens=spec.max_prefill_tokens,
            overlap=not spec.disable_overlap_schedule, schedule_conservativeness=spec.schedule_conservativeness,
        )
        self.scheduler = Scheduler(limits, self.tree, schedule_policy=spec.schedule_policy)
        self.cache = SglangPrefixCache(self.tree, self.scheduler.pool, hash_block_size=spec.block_size)
        if spec.cpu_kv_bytes:
            self.hicache = HiCacheTransfers(self.tree, self.scheduler, host_link, kv_bytes_per_token=kv_bytes_per_token)
        # NOTE: SGLang truncates max_new_tokens at intake so that a request fits (`init_req_max_new_tokens`).
        self._max_req_len = min(spec.max_model_len - 1, n - 1)
        self._prealloc: deque[tuple[SglangRequest, RemoteKvSource]] = deque()
        """P/D decode side: requests waiting for KV slots (SGLang's `DecodePreallocQueue`), in arrival order."""
        self._transfers: list[tuple[float, int, SglangRequest]] = []
        """P/D decode side: requests whose KV is on its way (`DecodeTransferQueue`), a heap by completion."""

    def add_remote_decode(self, request: Request, *, worker: int, arrival_s: float) -> SglangRequest:
        state = self.add_request(request, worker=worker, arrival_s=arrival_s)
        state.hold_kv = True
        return state

    def release_remote_decode(self, state: SglangRequest) -> None:
        self.scheduler.release_held(state)

    def add_remote_prefilled(self, request: Request, *, worker: int, arrival_s: float,
                             source: RemoteKvSource) -> SglangRequest:
        """P/D decode side (SGLang 0.5.23, `disaggregation/decode.py`): the request waits in the prealloc queue
        until its whole prompt's slots fit (no decode radix cache by default: nothing is matched, the whole prompt
        moves), then in the transfer queue until the KV has arrived; it then joins the running batch with the
        prefill server's token as its first, and its KV is freed, not cached, when it ends."""
        if request.output_tokens <= 1:
            raise ValueError(f"request {request.request_id}: a request of one output token ends on SGLang's prefill "
                             "server; kvsim's SGLang decode side needs at least two")
        state = self._new_state(request, worker, arrival_s)
        state.cache_on_finish = False
        self._prealloc.append((state, source))
        return state

    def _advance_pd(self, now_s: float) -> None:
        """Move arrived transfers to the scheduler's prebuilt list and preallocate the queue's head requests."""
        transfers, scheduler = self._transfers, self.scheduler
        while transfers and transfers[0][0] <= now_s:
            scheduler.prebuilt.append(heapq.heappop(transfers)[2])
        pool, queue = scheduler.pool, self._prealloc
        while queue:
            state, source = queue[0]
            tokens = state.input_len
            pages = ceil_div(tokens, pool.page_size)
            pool.evict_to_free_tokens(pages * pool.page_size)
            if pages * pool.page_size > pool.available_size() or pool.available_rows() <= 0:
                break  # FIFO: the head waits for room
            queue.popleft()
            pool._take(state, pages)
            state.holds_kv = True
            pool.rows_in_use += 1
            state.kv_allocated_len = state.kv_committed_len = tokens
            state.prefix_len = state.extend_end = tokens
            state.num_cached_tokens = 0
            state.admitted_s = now_s
            state.num_remote_kv_tokens = tokens
            state.remote_kv_start_s = now_s
            done_s = state.remote_kv_done_s = source.load_done_s(start_s=now_s, num_tokens=tokens)
            heapq.heappush(transfers, (done_s, state.request.request_id, state))

    def add_request(self, request: Request, *, worker: int, arrival_s: float) -> SglangRequest:
        state = self._new_state(request, worker, arrival_s)
        self.scheduler.add_request(state)
        return state

    def _new_state(self, request: Request, worker: int, arrival_s: float) -> SglangRequest:
        spec = self.spec
        origin = self.cache.tokens(request)
        if spec.ignore_eos:
            max_new, eos_at = request.output_tokens, None
        else:
            max_new = spec.max_new_tokens or request.output_tokens
            eos_at = request.output_tokens - 1
        input_len = len(origin)
        pool = self.scheduler.pool
        max_new = max(1, min(max_new, self._max_req_len - input_len - 1,
                             pool.max_total_tokens - pool.ceil_paged(input_len) - pool.page_size - 1))
        return SglangRequest(request, worker, arrival_s, origin=origin, max_new_tokens=max_new,
                             ignore_eos=spec.ignore_eos, eos_at=eos_at)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self._prealloc or self._transfers)

    @property
    def num_requests(self) -> int:
        return self.scheduler.num_requests + len(self._prealloc) + len(self._transfers)

    def load(self) -> EngineLoad:
        load = self.scheduler.load()
        if not (self._prealloc or self._transfers):
            return load
        return EngineLoad(num_running=load.num_running,
                          num_waiting=load.num_waiting + len(self._prealloc) + len(self._transfers),
                          kv_usage=load.kv_usage)

    def schedule(self, now_s: float) -> StepPlan:
        if self._prealloc or self._transfers:
            self._advance_pd(now_s)
        step = self.scheduler.schedule(now_s)
        if self.hicache is not None:
            return self.hicache.after_schedule(step, now_s)
        return step if step is not None else StepPlan()

    def update_from_output(self, plan: StepPlan, now_s: float) -> StepOutcome:
        if self.hicache is not None:
            self.hicache.before_result(now_s)
        outcome = self.scheduler.update_from_output(plan, now_s)
        if self.hicache is not None:
            self.hicache.after_result(now_s)
        # NOTE: SGLang publishes the batch's KV events after processing its result.
        self.cache.publish(now_s)
        return outcome

    def plan_decode_stretch(self, time_model: StepTimeModel, *, speed: float,
                            now_s: float) -> SglangDecodeStretch | None:
        if self._prealloc or self._transfers or self.scheduler.prebuilt:
            return None  # P/D arrivals would change the batch: step
        if self.hicache is not None and self.hicache.busy:
            return None  # NOTE: HiCache copies in flight: each step may reap an ack (stretches skip the loop's checks)
        return SglangDecodeStretch.plan(self.scheduler, time_model, speed=speed, now_s=now_s)

    def finish_stretch(self, stretch: SglangDecodeStretch, num_steps: int, now_s: float) -> list[SglangRequest]:
        stretch.finish(num_steps)
        return []  # a stretch stops before any request's last token

    def counters(self) -> EngineCounters:
        tree = self.tree
        evicted, P = tree.num_evicted_tokens, tree.page_size
        if self.hicache is None:
            return EngineCounters(prefix_cache=self.scheduler.stats.copy(), evicted_blocks=evicted // P,
                                  evicted_tokens=evicted, preemptions=self.scheduler.num_retractions)
        return EngineCounters(prefix_cache=self.scheduler.stats.copy(), evicted_blocks=evicted // P,
                              evicted_tokens=evicted, preemptions=self.scheduler.num_retractions,
                              cpu_stored_blocks=tree.num_stored_tokens // P,
                              cpu_loaded_blocks=tree.num_loaded_tokens // P,
                              cpu_evicted_blocks=tree.num_host_evicted_tokens // P)

    def next_background_s(self) -> float | None:
        # NOTE: P/D transfers and held prefills; with HiCache, when the next copy completes (its ack unlocks device
        # KV a waiting request may need)
        if self.scheduler.prebuilt:
            return 0.0
        ack_s = None if self.hicache is None else self.tree.next_ack_s()
        if self._transfers:
            return self._transfers[0][0] if ack_s is None else min(self._transfers[0][0], ack_s)
        if ack_s is not None:
            return ack_s
        return math.inf if (self.scheduler.held or self._prealloc) else None

    def describe_stall(self) -> str:
        return self.scheduler.describe_stall()
