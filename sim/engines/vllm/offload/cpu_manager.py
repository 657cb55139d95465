"""A pure-Python mirror of vLLM 0.33.0's scheduler-side CPU offloading manager; its LRU and ARC policies are in
`policies/`.

Mirrors `vllm/v1/kv_offload/cpu/manager.py` (`CPUOffloadingManager`, cited `CM`),
`vllm/v1/kv_offload/cpu/policies/lru.py` (`LRUCachePolicy`, cited `LRU`), `vllm/v1/kv_offload/cpu/policies/arc.py`
(`ARCCachePolicy`, cited `ARC`) and `policies/base.py` (`CachePolicy`, cited `PB`), line numbers of 0.33.0. The
manager only keeps metadata: which chunk hashes the CPU tier holds, in which slot, whether a store is still in
flight, how many loads read each chunk, and the recency order. The copies themselves belong to the worker.

Differences from vLLM, all on purpose:
* Chunk hashes are opaque, hashable and mutually comparable values (kvsim's block hashes); vLLM's `OffloadKey`
  is the block hash bytes plus a 4-byte KV cache group index. Only one KV cache group is modelled.
* vLLM keeps per-request state on the scheduler's `ReqContext`; here it is keyed by `request_id` and dropped at
  `request_finished`. A finished request id that is used again starts a new request (vLLM would assert if a
  finished context observed a new key, `CM` 175-177).
* Counters are cumulative (kvsim's rule: record counters, derive rates later); vLLM's `get_stats` drains the
  allocation histogram and the skipped-stores counter per stats interval.
* As in vLLM the policy is an object of its own, one class per file in `policies/` (`LruPolicy`, `ArcPolicy`),
  that the manager tells of accesses, misses, inserts, evictions, removals and finished requests; under ARC the
  manager's `_chunks` dict is the union of T1 and T2 (for lookups and counts). `CM.touch` (policy `touch`,
  `ARC` 99-114) is not mirrored: no scheduler code calls it in 0.33.0 (only the tiering manager, rules doc §4.4).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sim.engines.vllm.offload.policies import (
    CACHE_POLICIES,
    ArcPolicy,
    CachePolicy,
    ChunkHash,
    ChunkStatus,
    LruPolicy,
    RequestAccess,
)


class LookupResult(enum.Enum):
    """vLLM's `LookupResult` as the CPU manager answers it (`CM` 198-205); it never answers `RETRY`."""

    MISS = "MISS"
    HIT_PENDING = "HIT_PENDING"
    """Resident but its store is still in flight: not readable yet."""
    HIT = "HIT"


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """What `prepare_store` granted: the chunks to copy, the slots they go to, and what was evicted for them."""

    chunk_hashes_to_store: tuple[ChunkHash, ...]
    """The new chunks to write, in offer order (resident ones and threshold-skipped ones are left out)."""
    chunk_ids: tuple[int, ...]
    """The CPU slot of each chunk to store (same order)."""
    evicted_chunk_hashes: tuple[ChunkHash, ...]
    """The chunks evicted to make room, in eviction order (least recent first)."""


@dataclass(frozen=True, slots=True)
class CpuManagerCounters:
    """Cumulative counters; vLLM's names (`CM` 465-500, `OffloadingConnectorStats`) are given per field."""

    num_allocation_attempts: int = 0
    """`prepare_store` calls with at least one chunk to store, failed ones included
    (`vllm:kv_offload_cpu_allocation_size_count`)."""
    num_allocation_chunks: int = 0
    """Chunks asked for by those attempts (`vllm:kv_offload_cpu_allocation_size_sum`)."""
    num_allocation_failures: int = 0
    """Attempts that returned None. vLLM counts these at the scheduler (`vllm:kv_offload_allocation_failure`,
    offloading/scheduler.py 1587, 1716, 1993), not in the manager."""
    num_stores_skipped: int = 0
    """New chunks not stored because they were offered fewer than `store_threshold` times
    (`vllm:kv_offload_stores_skipped`, only when the threshold is >= 2)."""
    num_evicted_chunks: int = 0
    """Chunks evicted by `prepare_store` (vLLM emits them as `removed` offloading events only)."""
    num_used_chunks: int = 0
    """Gauge: slots that are write-pending or pinned by a load (`cpu_cache_usage_perc * num_chunks`)."""
    num_write_pending_chunks: int = 0
    """Gauge: slots with a store in flight (`cpu_cache_write_usage_perc * num_chunks`)."""


class CpuOffloadingManager:
    """The CPU tier's chunk pool and recency, as vLLM 0.33.0's `CPUOffloadingManager` + `LRUCachePolicy` (the
    default, `eviction_policy="lru"`) or + `ARCCachePolicy` (`eviction_policy="arc"`).

    Invariants:
    * A resident chunk is *write-pending* (ref_cnt -1, lookup answers HIT_PENDING), *pinned* (ref_cnt > 0: loads
      in flight), or *evictable* (ref_cnt 0). Only evictable chunks are ever evicted; nothing is evicted for a
      load. `num_chunks` = never-used slots + free-list slots + resident chunks.
    * Resident chunks are never stored again; `prepare_store` is all or nothing for one call: it returns None,
      allocating and evicting nothing, unless every new chunk gets a slot, evicting only evictable chunks that
      are not in the offer itself (`CM` 320-336).
    * Slots: never-used slot ids first in increasing order, then the free list, last freed first (`CM` 103-120).

    Ordering: the policy's (`policies.lru.LruPolicy`, `policies.arc.ArcPolicy`, registered in
    `policies.CACHE_POLICIES`), which the manager tells of observations, store misses, inserts, evictions, failed
    stores, finished requests and resets (`policies.base.CachePolicy`).
    """

    __slots__ = (
        "num_chunks",
        "eviction_policy",
        "store_threshold",
        "max_tracker_size",
        "_num_allocated_slots",
        "_free_slots",
        "_chunks",
        "_policy",
        "_generation",
        "_requests",
        "_offer_counts",
        "_num_evictable",
        "_num_write_pending",
        "_num_allocation_attempts",
        "_num_allocation_chunks",
        "_num_allocation_failures",
        "_num_stores_skipped",
        "_num_evicted_chunks",
    )

    def __init__(self, num_chunks: int, *, eviction_policy: str = "lru", store_threshold: int = 1,
                 max_tracker_size: int = 64_000) -> None:
        if num_chunks < 1:
            raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
        if eviction_policy not in CACHE_POLICIES:
            raise ValueError(f"eviction_policy must be {' or '.join(map(repr, CACHE_POLICIES))}, "
                             f"got {eviction_policy!r}")
        if store_threshold < 1 or max_tracker_size < 1:
            raise ValueError(f"store_threshold and max_tracker_size must be >= 1, got {store_threshold}, "
                             f"{max_tracker_size}")
        self.num_chunks = num_chunks
        self.eviction_policy = eviction_policy
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self._num_allocated_slots = 0
        self._free_slots: list[int] = []
        self._chunks: dict[ChunkHash, ChunkStatus] = {}
        self._policy: CachePolicy = CACHE_POLICIES[eviction_policy](self._chunks, num_chunks)
        self._generation = 0
        self._requests: dict[str, RequestAccess] = {}
        # NOTE: offers are counted only with a threshold >= 2 (`CM` 94-96); least recently offered first.
        self._offer_counts: OrderedDict[ChunkHash, int] | None = OrderedDict() if store_threshold >= 2 else None
        self._num_evictable = 0
        self._num_write_pending = 0
        self._num_allocation_attempts = 0
        self._num_allocation_chunks = 0
        self._num_allocation_failures = 0
        self._num_stores_skipped = 0
        self._num_evicted_chunks = 0

    # --- requests ---

    def on_new_request(self, request_id: str, chunk_end_tokens: Mapping[ChunkHash, int] | None = None) -> None:
        """Start tracking a request; `chunk_end_tokens` maps its chunks to their end-token positions (vLLM's
        `ReqContext.set_offload_key_position`), which order its chunks for recency."""
        access = self._access(request_id)
        if chunk_end_tokens:
            access.chunk_end_tokens.update(chunk_end_tokens)

    def set_chunk_end_token(self, request_id: str, chunk_hash: ChunkHash, end_token: int) -> None:
        self._access(request_id).chunk_end_tokens[chunk_hash] = end_token

    def _access(self, request_id: str) -> RequestAccess:
        access = self._requests.get(request_id)
        # NOTE: state from before a reset_cache is stale and starts over (`CM` 150-161, `LRU` 51-61); the
        # positions live on vLLM's ReqContext and survive.
        if access is None or access.generation != self._generation:
            fresh = RequestAccess(generation=self._generation)
            if access is not None:
                fresh.chunk_end_tokens = access.chunk_end_tokens
            access = self._requests[request_id] = fresh
        return access

    def _observe(self, access: RequestAccess, chunk_hashes: Iterable[ChunkHash]) -> None:
        """A request's first observation of chunks (`CM` 163-189, then the policy's on_request_access)."""
        new = [h for h in chunk_hashes if h not in access.seen]
        if not new:
            return
        access.observed.extend(new)
        access.seen.update(new)
        self._policy.on_access(access, new)

    def request_finished(self, request_id: str) -> None:
        """Commit the request's recency: under LRU its observed chunks get fresh ranks, tail first (`CM` 421-448,
        `LRU` 155-164); under ARC, tail first, its reused chunks go to T2's MRU end and its insertion-only ones to
        their list's MRU end (`ARC` 117-139). Unknown (or already finished) requests are ignored."""
        access = self._requests.pop(request_id, None)
        if access is None or access.generation != self._generation:
            return
        order = list(access.observed)
        # NOTE: sorted by end token only if every observed chunk has one (policies/base.py order_request_keys).
        if all(h in access.chunk_end_tokens for h in order):
            order.sort(key=access.chunk_end_tokens.__getitem__)
        self._policy.on_request_finished(order, access)

    # --- lookup and load ---

    def lookup(self, chunk_hash: ChunkHash) -> LookupResult:
        """Peek: no side effects (`CM` 198-205); in particular recency is unchanged."""
        chunk = self._chunks.get(chunk_hash)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.ref_cnt >= 0 else LookupResult.HIT_PENDING

    def prepare_load(self, request_id: str, chunk_hashes: Sequence[ChunkHash]) -> tuple[int, ...]:
        """Pin ready chunks for a load and return their slots (`CM` 213-241). The request observes them."""
        for h in chunk_hashes:
            chunk = self._chunks.get(h)
            if chunk is None or chunk.ref_cnt < 0:
                raise ValueError(f"prepare_load of chunk {h!r} that is "
                                 f"{'not resident' if chunk is None else 'still being stored'}")
        slots = []
        for h in chunk_hashes:
            chunk = self._chunks[h]
            if chunk.ref_cnt == 0:
                self._num_evictable -= 1
            chunk.ref_cnt += 1
            slots.append(chunk.chunk_id)
        access = self._access(request_id)
        self._observe(access, chunk_hashes)
        access.reused.update(h for h in chunk_hashes if h not in access.inserted)
        return tuple(slots)

    def complete_load(self, chunk_hashes: Sequence[ChunkHash]) -> None:
        """Unpin after a load; at ref 0 the chunk is evictable again, at its existing rank (`CM` 247-258)."""
        for h in chunk_hashes:
            chunk = self._chunks.get(h)
            if chunk is None or chunk.ref_cnt <= 0:
                raise ValueError(f"complete_load of chunk {h!r} that is not being loaded "
                                 f"(ref_cnt {None if chunk is None else chunk.ref_cnt})")
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._num_evictable += 1

    # --- store ---

    def _count_offers(self, chunk_hashes: Sequence[ChunkHash]) -> None:
        """vLLM `_record_accesses` (`CM` 129-148): offered chunks already tracked move to the recent end and are
        never dropped by this offer; new ones displace the least recently offered."""
        counts = self._offer_counts
        assert counts is not None
        num_tracked_offered = 0
        for h in chunk_hashes:
            if h in counts:
                counts.move_to_end(h)
                counts[h] += 1
                num_tracked_offered += 1
        num_unprotected = len(counts) - num_tracked_offered
        for h in chunk_hashes:
            if h in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if num_unprotected == 0:
                    continue
                counts.popitem(last=False)
                num_unprotected -= 1
            counts[h] = 1

    def prepare_store(self, request_id: str, chunk_hashes: Sequence[ChunkHash]) -> PrepareStoreOutput | None:
        """Allocate slots for the offered chunks that are not resident, evicting if needed; None if there is no
        room (`CM` 260-372). Even a None changes the offer counts and the request's observations."""
        if len(set(chunk_hashes)) != len(chunk_hashes):
            raise ValueError(f"prepare_store offer has duplicate chunk hashes: {list(chunk_hashes)!r}")
        if self._offer_counts is not None:
            self._count_offers(chunk_hashes)
        new = [h for h in chunk_hashes if h not in self._chunks]
        # NOTE: write-pending resident chunks are neither stored nor observed (`CM` 274-280).
        ready_resident = [h for h in chunk_hashes if h in self._chunks and self._chunks[h].ref_cnt >= 0]
        if self._offer_counts is not None:
            kept = [h for h in new if self._offer_counts.get(h, 0) >= self.store_threshold]
            self._num_stores_skipped += len(new) - len(kept)
            new = kept
        access = self._access(request_id)
        # NOTE: vLLM tells the policy of these misses once per request (`CM` 293-301).
        self._policy.on_store_misses(access, new)
        access.store_missed.update(new)
        recorded = set(new) | set(ready_resident)
        self._observe(access, [h for h in chunk_hashes if h in recorded])
        access.reused.update(h for h in ready_resident if h not in access.inserted)
        if not new:
            return PrepareStoreOutput((), (), ())

        self._num_allocation_attempts += 1
        self._num_allocation_chunks += len(new)
        num_to_evict = len(new) - (len(self._free_slots) + self.num_chunks - self._num_allocated_slots)
        evicted: list[ChunkHash] = []
        if num_to_evict > 0:
            # NOTE: chunks in the offer itself are protected: one already stored must stay (`CM` 331-334).
            protected = set(chunk_hashes)
            chunks = self._chunks
            num_protected = sum(1 for h in protected if h in chunks and chunks[h].ref_cnt == 0)
            if num_to_evict > self._num_evictable - num_protected:
                self._num_allocation_failures += 1
                return None
            for h in self._policy.evict(num_to_evict, protected):
                self._free_slots.append(self._chunks.pop(h).chunk_id)
                evicted.append(h)
            self._num_evictable -= num_to_evict
            self._num_evicted_chunks += num_to_evict

        slots = []
        for h in new:
            if self._num_allocated_slots < self.num_chunks:
                slot = self._num_allocated_slots
                self._num_allocated_slots += 1
            else:
                slot = self._free_slots.pop()
            slots.append(slot)
            self._chunks[h] = ChunkStatus(slot)
            self._policy.insert(h, access)
        self._num_write_pending += len(new)
        access.inserted.update(new)
        return PrepareStoreOutput(tuple(new), tuple(slots), tuple(evicted))

    def complete_store(self, chunk_hashes: Sequence[ChunkHash], *, success: bool = True) -> None:
        """Finish stores: on success the chunks become ready and evictable at the rank they already have; on
        failure they are dropped and their slots freed. Chunks not write-pending are ignored (`CM` 374-419)."""
        for h in chunk_hashes:
            chunk = self._chunks.get(h)
            if chunk is None or chunk.ref_cnt >= 0:
                continue
            self._num_write_pending -= 1
            if success:
                chunk.ref_cnt = 0
                self._num_evictable += 1
            else:
                del self._chunks[h]
                self._policy.remove(h)
                self._free_slots.append(chunk.chunk_id)

    def reset_cache(self) -> None:
        """Drop every chunk, pinned or not, and restart ranks and slots (`CM` 450-463, `LRU` clear); under ARC also
        the ghost lists and the target (`ARC` 142-147)."""
        self._policy.reset()
        self._chunks.clear()
        self._generation += 1
        self._num_evictable = 0
        self._num_write_pending = 0
        self._free_slots.clear()
        self._num_allocated_slots = 0

    # --- reading state ---

    def lru_order(self) -> list[ChunkHash]:
        """Every resident chunk, pinned and write-pending ones included, first = evicted first once evictable.
        LRU only: ARC has no single order (which list it evicts from depends on the target); under ARC this
        raises ValueError, use `arc_state()`."""
        if not isinstance(self._policy, LruPolicy):
            raise ValueError("lru_order() is for eviction_policy 'lru'; this manager is 'arc': use arc_state()")
        return self._policy.order()

    def arc_state(self) -> dict:
        """ARC's lists as vLLM holds them, LRU end first: {"t1", "t2"} resident chunks (pinned and write-pending
        ones included), {"b1", "b2"} ghosts, and "target_t1_size" (as a float). ARC only (ValueError under LRU)."""
        if not isinstance(self._policy, ArcPolicy):
            raise ValueError("arc_state() is for eviction_policy 'arc'; this manager is 'lru': use lru_order()")
        return self._policy.state()

    def ref_counts(self) -> dict[ChunkHash, int]:
        """Resident chunk -> ref count (-1 write-pending, 0 evictable, n > 0 pinned by n loads)."""
        return {h: c.ref_cnt for h, c in self._chunks.items()}

    def chunk_id(self, chunk_hash: ChunkHash) -> int | None:
        chunk = self._chunks.get(chunk_hash)
        return None if chunk is None else chunk.chunk_id

    def counters(self) -> CpuManagerCounters:
        num_resident = len(self._chunks)
        return CpuManagerCounters(
            num_allocation_attempts=self._num_allocation_attempts,
            num_allocation_chunks=self._num_allocation_chunks,
            num_allocation_failures=self._num_allocation_failures,
            num_stores_skipped=self._num_stores_skipped,
            num_evicted_chunks=self._num_evicted_chunks,
            num_used_chunks=num_resident - self._num_evictable,
            num_write_pending_chunks=self._num_write_pending,
        )

    def check_invariants(self) -> None:
        num_evictable = sum(1 for c in self._chunks.values() if c.ref_cnt == 0)
        num_pending = sum(1 for c in self._chunks.values() if c.ref_cnt < 0)
        slots = [c.chunk_id for c in self._chunks.values()] + self._free_slots
        if (num_evictable, num_pending) != (self._num_evictable, self._num_write_pending):
            raise AssertionError(f"evictable/pending {num_evictable}/{num_pending} != counted "
                                 f"{self._num_evictable}/{self._num_write_pending}")
        if sorted(slots) != list(range(self._num_allocated_slots)):
            raise AssertionError(f"slots {sorted(slots)} of {self._num_allocated_slots} allocated")
        self._policy.check()
