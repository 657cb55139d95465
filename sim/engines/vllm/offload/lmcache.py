"""LMCache 0.5.6 in-process (`kv_connector="LMCacheConnectorV1"`, mode A) as a host KV tier of a vLLM worker
(`engine.cpu_kv_connector: lmcache`): the same seam as vLLM's `OffloadingConnector` (the scheduler calls the same
methods), with LMCache's rules. Rules and citations: docs/engines/lmcache-0.5.6-rules.md §1 (cited "§1.n"); the
aliases `AD`, `CE`, `CPU`, `LRU1`, `TD`, `CFG` are that page's.

The arithmetic of one admission, in tokens (C = chunk tokens, 256 by default; G = the GPU hit, capped at N - 1):

    | chunk 0 | chunk 1 | ... | chunk h-1 |  miss ...            LMCache hit = h * C (full chunks, from chunk 0,
    0                                  hit                         first miss stops, over all N tokens: not capped)
    | GPU hit G          | ext = hit - G (- 1 if hit == N) |       ext <= 0: no load
    | floor(G/C)*C .. hit: the retrieve copies these tokens again (the GPU-hit part of the first chunk included)

* Lookup (§1.4): once per admission, its result kept for the request's later tries until it is allocated (`AD`
  1401-1403); the hit chunks are pinned (not evictable) until the load, and touched in reverse so that the head
  ends most recent (§1.8).
* Load (§1.5): synchronous in the admitting step: the request is scheduled at once with G + ext computed
  (`load_kv_async=False`), and the step's forward pass waits for the copy (`LmcacheTransfers`).
* Store (§1.2, §1.3): the full C-token chunks of the prompt, each in the step whose prefill completes it, from the
  LMCache hit upward (GPU-hit chunks above it are offered again); synchronous at the end of the forward pass, so a
  stored chunk is visible from the next step and its copy time is on the step. Partial chunks and decode tokens are
  never stored (`save_unfull_chunk=False`, `save_decode_cache=False`).
* Pool (§1.7, §1.9): LRU, inserts at the most recent end in store order (head first). A store allocates a buffer
  for every offered chunk first, evicting the least recent unpinned chunk while none is free; if nothing can be
  evicted the rest of the offer is dropped and never offered again. Only then are resident chunks noticed: their
  buffers are freed, nothing is refreshed (so a duplicate can evict).
* GPU blocks are never held for a store (§1.10).

Not modelled: TP ranks (one backend per worker; capacity = `cpu_kv_bytes`, i.e. max_local_cpu_size x TP), the ZMQ
lookup round trip, layer-wise loading (`use_layerwise`), LMCache's disk and remote backends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sim.engines.interface import CacheEvent, HostLink
from sim.engines.vllm.offload.connector import ConnectorStep, OffloadCounters, TransferJob
from sim.engines.vllm.request_state import RequestState

ChunkKey = object
"""A chunk's key: the chained hash of its last GPU block (a prefix hash, as LMCache's chained chunk hash, `TD`
358-365)."""


@dataclass(frozen=True, slots=True)
class StoreResult:
    """What one `LmcacheCpuBackend.store` did."""

    stored: tuple[ChunkKey, ...]
    """New chunks inserted, in offer order."""
    evicted: tuple[ChunkKey, ...]
    """Chunks evicted to allocate buffers, least recent first."""
    num_dropped: int
    """Offered chunks that got no buffer (nothing evictable): dropped, never offered again."""


class LmcacheCpuBackend:
    """LMCache 0.5.6's `LocalCPUBackend` with its LRU policy (`CPU`, `LRU1`), counted in chunks of equal size.

    Invariants: `len(chunks) <= num_chunks`; a chunk with pins > 0 is never evicted; the OrderedDict runs from the
    least to the most recently used chunk."""

    def __init__(self, num_chunks: int) -> None:
        if num_chunks < 1:
            raise ValueError(f"an LMCache CPU backend needs at least one chunk, got {num_chunks}")
        self.num_chunks = num_chunks
        self.chunks: OrderedDict[ChunkKey, int] = OrderedDict()
        """Resident chunk -> pin count, least recent first."""
        self.num_evicted_chunks = 0

    def __contains__(self, key: ChunkKey) -> bool:
        return key in self.chunks

    def lookup(self, keys: Sequence[ChunkKey]) -> int:
        """The resident prefix of `keys` (stop at the first miss), pinned and touched in reverse (head most recent:
        `CE` 1254-1276, `CPU` 127-142). Peek is `contains`, which pins and touches nothing."""
        chunks = self.chunks
        n = 0
        for key in keys:
            if key not in chunks:
                break
            n += 1
        for key in reversed(keys[:n]):
            chunks[key] += 1
            chunks.move_to_end(key)
        return n

    def unpin(self, keys: Iterable[ChunkKey]) -> None:
        chunks = self.chunks
        for key in keys:
            if key in chunks and chunks[key] > 0:
                chunks[key] -= 1

    def store(self, keys: Sequence[ChunkKey]) -> StoreResult:
        """Allocate a buffer per offered chunk, evicting while none is free (`CPU` 686-746), then put each (`CE`
        504-530): a resident key frees its buffer and is not touched; a new one goes to the most recent end."""
        chunks = self.chunks
        evicted: list[ChunkKey] = []
        num_buffers = 0
        for _ in keys:
            if len(chunks) + num_buffers >= self.num_chunks:
                victim = next((k for k, pins in chunks.items() if pins == 0), None)
                if victim is None:
                    break  # nothing evictable: the rest of the offer is dropped (`CE` 510-525)
                del chunks[victim]
                evicted.append(victim)
            num_buffers += 1
        stored = []
        for key in keys[:num_buffers]:
            if key not in chunks:
                chunks[key] = 0
                stored.append(key)
        self.num_evicted_chunks += len(evicted)
        return StoreResult(tuple(stored), tuple(evicted), len(keys) - num_buffers)


@dataclass(slots=True)
class _Tracker:
    """LMCache's request tracker for one request (`AD` `RequestTracker`)."""

    hit_chunks: int
    """The lookup's hit in chunks (pinned until the load or the allocation without one)."""
    num_saved_tokens: int = 0
    """Tokens below this are never offered for storing (set to the LMCache hit at allocation, `AD` 193)."""
    allocated: bool = False
    job_ids: set[int] = field(default_factory=set)


class LmcacheConnector:
    """One worker's LMCache in-process connector (module docstring), with the `OffloadingConnector`'s interface.
    Its jobs are all synchronous: they are the step's `jobs_to_flush` (the forward pass waits for them) and are
    reported done when the step ends."""

    sync_load = True
    """The scheduler admits a hit request at once with its loaded tokens computed (vLLM's `load_kv_async=False`)."""

    def __init__(self, backend: LmcacheCpuBackend, *, block_size: int, chunk_tokens: int,
                 kv_bytes_per_token: int) -> None:
        if chunk_tokens % block_size:
            raise ValueError(f"engine.lmcache_chunk_tokens: {chunk_tokens} is not a multiple of the block size "
                             f"{block_size}")
        self.backend = backend
        self.medium = "CPU"
        self.block_size = block_size
        self.chunk_tokens = chunk_tokens
        self.blocks_per_chunk = chunk_tokens // block_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self.counters = OffloadCounters()
        self.events: list[CacheEvent] | None = None
        self._trackers: dict[RequestState, _Tracker] = {}
        self._jobs: dict[int, TransferJob] = {}
        self._next_job_id = 0
        self._step = ConnectorStep()
        self._chunk_blocks: dict[ChunkKey, tuple] = {}
        """Resident chunk -> its GPU block hashes, kept only while events are recorded."""

    # ------------------------------------------------------------------ state
    @property
    def has_jobs(self) -> bool:
        return bool(self._jobs)

    @property
    def blocks_decode_stretch(self) -> bool:
        return False  # nothing is deferred to a later step: stores happen in the step that computes the chunk

    @property
    def has_work(self) -> bool:
        return bool(self._jobs)

    @property
    def num_evicted_chunks(self) -> int:
        return self.backend.num_evicted_chunks

    def chosen_medium(self, state: RequestState) -> str:
        return self.medium

    def job(self, job_id: int) -> TransferJob:
        return self._jobs[job_id]

    def _key(self, state: RequestState, chunk: int) -> ChunkKey:
        return state.block_hash((chunk + 1) * self.blocks_per_chunk - 1)

    def _keys(self, state: RequestState, start: int, stop: int) -> list[ChunkKey]:
        return [self._key(state, c) for c in range(start, stop)]

    # ------------------------------------------------------------------ admission
    def lookup(self, state: RequestState, num_gpu_hit_tokens: int) -> int:
        """Tokens beyond the GPU hit to load (0: none); never defers (`AD` 1401-1532)."""
        tracker = self._trackers.get(state)
        if tracker is None or tracker.allocated:
            if tracker is not None:
                self._forget(state)
            keys = self._keys(state, 0, state.num_tokens // self.chunk_tokens)
            tracker = self._trackers[state] = _Tracker(self.backend.lookup(keys))
        hit = tracker.hit_chunks * self.chunk_tokens
        ext = hit - num_gpu_hit_tokens
        if hit == state.num_tokens:
            ext -= 1  # a full hit recomputes the last token (`AD` 1451-1455)
        return max(ext, 0)

    def record_lookup(self, state: RequestState, num_gpu_hit_tokens: int, num_external_tokens: int,
                      *, preempted: bool) -> None:
        queries = state.num_tokens - num_gpu_hit_tokens
        if queries:
            self.counters.prefix_cache.record(queries, num_external_tokens, preempted=preempted)

    def after_alloc(self, state: RequestState, num_gpu_hit_tokens: int, num_external_tokens: int) -> None:
        """The request got blocks: with a load, one synchronous retrieve from the chunk holding G up to the hit
        (`AD` 817-868); without one, the lookup's pins are released."""
        tracker = self._trackers.get(state)
        if tracker is None:
            return  # a promoted or resumed request: no lookup this admission
        tracker.allocated = True
        C = self.chunk_tokens
        tracker.num_saved_tokens = tracker.hit_chunks * C
        hit_keys = self._keys(state, 0, tracker.hit_chunks)
        if num_external_tokens == 0:
            self.backend.unpin(hit_keys)
            return
        start = num_gpu_hit_tokens // C
        job = self._new_job(state, False, tuple(range(start, tracker.hit_chunks)))
        self._step.jobs_to_flush.append(job.job_id)
        self.counters.num_load_jobs += 1
        self.counters.num_loaded_chunks += len(job.chunk_indices)

    def _new_job(self, state: RequestState, is_store: bool, chunks: tuple[int, ...]) -> TransferJob:
        job = TransferJob(self._next_job_id, state, is_store, chunks,
                          len(chunks) * self.chunk_tokens * self.kv_bytes_per_token)
        self._next_job_id += 1
        self._jobs[job.job_id] = job
        self._trackers[state].job_ids.add(job.job_id)
        return job

    # ------------------------------------------------------------------ end of schedule()
    def build_step(self, scheduled: Iterable[tuple[RequestState, int]], preempted: Sequence[RequestState]) -> ConnectorStep:
        """This step's stores: each scheduled request's prompt chunks that its new tokens complete, put into the
        backend now (the put is synchronous at the end of this forward pass, so visible from the next step) and
        copied as a job the step waits for (`AD` 318-361, 1145-1236)."""
        step, self._step = self._step, ConnectorStep()
        C = self.chunk_tokens
        for state, n in scheduled:
            tracker = self._trackers.get(state)
            if tracker is None or not tracker.allocated:
                continue
            end = min(state.num_computed_tokens + n, state.request.prompt_tokens) // C * C
            if end <= tracker.num_saved_tokens:
                continue
            first = tracker.num_saved_tokens // C
            tracker.num_saved_tokens = end  # advanced whatever the store keeps (`AD` 359-360): never retried
            keys = self._keys(state, first, end // C)
            result = self.backend.store(keys)
            if self.events is not None:
                self._record_events(state, first, keys, result)
            # NOTE: every allocated buffer is copied, duplicates included (the copy precedes the put's dedup).
            num_copied = len(keys) - result.num_dropped
            if num_copied:
                job = self._new_job(state, True, tuple(range(first, first + num_copied)))
                step.jobs_to_flush.append(job.job_id)
                self.counters.num_store_jobs += 1
                self.counters.num_stored_chunks += len(result.stored)
        for state in preempted:
            self._forget(state)
        return step

    def _record_events(self, state: RequestState, first: int, keys: list[ChunkKey], result: StoreResult) -> None:
        # NOTE: the events name GPU blocks, as the other tiers' do, so that a router's tier index walks the same
        # hashes: a chunk stored or removed is its blocks_per_chunk blocks.
        assert self.events is not None
        k, blocks = self.blocks_per_chunk, self._chunk_blocks
        if result.evicted:
            self.events.append(CacheEvent("removed", tuple(h for key in result.evicted for h in blocks.pop(key, ())),
                                          None, self.block_size, self.medium))
        if result.stored:
            stored = set(result.stored)
            hashes: list = []
            for c, key in enumerate(keys, first):
                if key in stored:
                    blocks[key] = tuple(state.block_hashes(c * k, (c + 1) * k))
                    hashes.extend(blocks[key])
            self.events.append(CacheEvent("stored", tuple(hashes), None, self.block_size, self.medium))

    def _forget(self, state: RequestState) -> None:
        tracker = self._trackers.pop(state, None)
        if tracker is not None and not tracker.allocated:
            self.backend.unpin(self._keys(state, 0, tracker.hit_chunks))

    def request_finished(self, state: RequestState) -> None:
        tracker = self._trackers.get(state)
        if tracker is not None and not tracker.job_ids:
            self._forget(state)

    # ------------------------------------------------------------------ the worker reports
    def complete(self, job_ids: Iterable[int]) -> list[RequestState]:
        """Jobs done (at the end of the step that ran them): a load unpins its chunks. Returns no request: a
        synchronous load left none waiting."""
        for jid in job_ids:
            job = self._jobs.pop(jid)
            state = job.request
            tracker = self._trackers.get(state)
            if not job.is_store and tracker is not None:
                self.backend.unpin(self._keys(state, 0, tracker.hit_chunks))
            if tracker is not None:
                tracker.job_ids.discard(jid)
                if state.finished_s is not None and not tracker.job_ids:
                    self._trackers.pop(state, None)
        return []


class LmcacheTransfers:
    """The LMCache tier's copies in simulated time: each step's retrieves run before its forward pass and its
    stores after it, both blocking (§1.3, §1.5); kvsim puts their sum before the forward pass as the step's stall
    (the step lasts as long; the copies run load first, then store, on the host link's two directions). Every job
    is reported done at the end of its step."""

    def __init__(self, connector: LmcacheConnector, link: HostLink) -> None:
        self.connector = connector
        self.link = link
        self._step_jobs: list[int] = []

    def start_step(self, step: ConnectorStep, now_s: float) -> float:
        self._step_jobs = list(step.jobs_to_flush)
        if not self._step_jobs:
            return 0.0
        jobs = [self.connector.job(j) for j in self._step_jobs]
        t = now_s
        for job in jobs:
            if not job.is_store:
                done = self.link.copy_done_s(to_device=True, start_s=t, num_bytes=job.num_bytes)
                job.request.tier_load_s += done - t
                t = done
        for job in jobs:
            if job.is_store:
                t = self.link.copy_done_s(to_device=False, start_s=t, num_bytes=job.num_bytes)
        return t - now_s

    def end_step(self, now_s: float) -> list[int]:
        done, self._step_jobs = self._step_jobs, []
        return done

    def seen_by(self, step_start_s: float) -> list[int]:
        return []

    def next_done_s(self) -> float | None:
        return None
