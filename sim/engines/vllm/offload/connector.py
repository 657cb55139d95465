"""The scheduler side of vLLM 0.33.0's `OffloadingConnector` (what `--kv-offloading-size` turns on): which CPU
chunks a request may load at admission, which of its chunks are stored and when, and the transfer jobs that result.

Mirrors `vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py` (`OffloadingConnectorScheduler`,
cited `OS` with 0.33.0 line numbers) for one full-attention KV cache group, one GPU block per chunk
(`blocks_per_chunk = 1`), prompt-only stores, async loads and no store threshold: the connector's defaults. The
rules, with every citation, are in docs/engines/vllm-0.33-offloading-rules.md (cited "rules").
The CPU pool and its recency are `CpuOffloadingManager`; the copies belong to whoever runs the jobs (the engine's
`HostTransfers`, or an oracle's lockstep fake worker).

The arithmetic of one admission, in tokens (chunks are blocks of `B` tokens):

    | GPU hit (local, capped at num_tokens - 1) | CPU hit: whole chunks, first miss stops | rest: prefill |
    0                                           G                                        G + ext
                                    lookup scans chunks G // B .. num_tokens // B - 1 (NOT capped at num_tokens - 1)

A hit of fewer than one chunk counts as none; a hit reaching `num_tokens` (a block-aligned prompt) recomputes its
last token after the load (rules §2.2, §6.1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sim.engines.interface import CacheEvent, PrefixCacheStats
from sim.engines.vllm.offload.cpu_manager import CpuOffloadingManager, LookupResult
from sim.engines.vllm.offload.peer_fetch import PeerFetch
from sim.engines.vllm.request_state import RequestState


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One copy between GPU and CPU that the worker side must run and report (vLLM's `TransferJob`)."""

    job_id: int
    request: RequestState
    is_store: bool
    """GPU -> CPU (a store) or CPU -> GPU (a load)."""
    chunk_indices: tuple[int, ...]
    """The request's chunk (= block) positions copied, in position order."""
    num_bytes: int
    block_ids: tuple[int, ...] = ()
    """A store's source GPU blocks (what a flush fences)."""


@dataclass(slots=True)
class ConnectorStep:
    """What one `schedule()` handed the worker side (vLLM's `OffloadingConnectorMetadata`)."""

    load_jobs: list[TransferJob] = field(default_factory=list)
    """Created by this step's admissions; the worker starts them before this step's forward pass."""
    store_jobs: list[TransferJob] = field(default_factory=list)
    """Created by this step's `build_step`; the worker starts them at the next step's start (`OW` 272-284)."""
    jobs_to_flush: list[int] = field(default_factory=list)
    """In-flight jobs the worker must finish before this step's forward pass: stores reading a block that this
    step reallocated, and a preempted request's jobs (`OS` 2136-2165)."""
    evicted: list[tuple[RequestState, tuple]] = field(default_factory=list)
    """CPU chunks evicted to make room, per store offer in order: (the offering request, chunk hashes evicted
    least recent first); vLLM's `BlockRemoved(medium="CPU")` events."""
    pull_jobs: list[TransferJob] = field(default_factory=list)
    """Peer pulls (G2 peer fetch) created by this step's lookups; the worker starts them on its NIC at the step's
    start."""


@dataclass(slots=True)
class _RequestOffload:
    """vLLM's `RequestOffloadState` for one request (one group)."""

    next_stored_chunk: int = 0
    """Chunks below this are not offered for storing again (reset at every lookup)."""
    block_ids: list[int] = field(default_factory=list)
    """The request's GPU blocks as the connector was told of them (vLLM's `group_state.block_ids`): kept after
    the request's blocks are freed, so that a finish pass can still store from them."""
    job_ids: set[int] = field(default_factory=set)
    finished: bool = False
    """`finished_signaled`: the finish pass ran; the state is dropped once no job is left."""


@dataclass(slots=True)
class OffloadCounters:
    """Cumulative counters of the connector (vLLM's names per field)."""

    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    """vLLM's `connector_prefix_cache_stats`: per admission that looked up with tokens beyond the GPU hit, those
    tokens (`vllm:external_prefix_cache_queries`) and the ones loaded from CPU (`vllm:external_prefix_cache_hits`;
    `prompt_tokens_cached_by_source{source="host"}`); re-admissions after preemption apart."""
    num_load_jobs: int = 0
    num_loaded_chunks: int = 0
    num_store_jobs: int = 0
    num_stored_chunks: int = 0
    num_deferred_lookups: int = 0
    """Lookups answered "not yet" (a chunk still being stored or loaded, or the request's own jobs in flight)."""
    num_flushed_jobs: int = 0
    num_peer_fetched_chunks: int = 0
    """Chunks pulled from a peer's host tier into this one (G2 peer fetch), counted when the pull completes."""


class OffloadingConnector:
    """One worker's `OffloadingConnectorScheduler` (see the module docstring for what is modelled).

    Call order per engine step, as vLLM's Scheduler makes it:
    * `lookup(state, gpu_hit)` for every fresh admission attempt (`num_computed_tokens == 0`), every step the
      request is tried: the CPU hit in tokens, or None (defer: the request stays waiting, unscheduled).
    * `after_alloc(state, ext)` once the request got its blocks: with `ext > 0` a load job is created, its chunks
      pinned and marked being loaded; the request then waits (0 tokens) until `complete` reports the load.
    * `build_step(scheduled, finished)` after all admissions and before computed tokens advance: flush detection,
      then one store job per request with new full prompt chunks (all or nothing: a full CPU tier drops the offer
      and it is retried next step), then the finish pass of requests that finished since the last call (their
      recency commits *after* this step's stores draw ranks: rules §4.4, self-test 3).
    * `complete(job_ids)` when the worker reports jobs done (after a forward pass): stores become loadable, loads
      unpin; returns the requests whose load finished.
    * `request_finished(state)` when a request ends, before its blocks are freed (vLLM frees at once; a pending
      store on a reallocated block is then flushed).
    """

    sync_load = False
    """Loads are asynchronous (vLLM's `load_kv_async=True`): a hit request waits for its load before it is scheduled;
    the LMCache connector is the synchronous one."""

    def __init__(self, manager: CpuOffloadingManager, *, block_size: int, bytes_per_block: int,
                 medium: str = "CPU", defer_on_pending: bool = True) -> None:
        self.manager = manager
        self.medium = medium
        """The tier's medium as its KV events name it (vLLM `BlockStored.medium`: "CPU" for this connector's host
        tier; kvsim names a cluster-shared store "SHARED", sim/engines/vllm/offload/multi.py)."""
        self.defer_on_pending = defer_on_pending
        """A lookup reaching a chunk whose store is in flight defers the request (vLLM's OffloadingConnector, `OS`
        788-796); False: the chunk is a miss and the hit stops before it (a shared store, whose put is visible
        only once written: sim/engines/vllm/offload/multi.py)."""
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.counters = OffloadCounters()
        self._requests: dict[RequestState, _RequestOffload] = {}
        self._jobs: dict[int, TransferJob] = {}
        self._next_job_id = 0
        self._chunks_being_loaded: set = set()
        self._step = ConnectorStep()
        self._allocated_block_ids: set[int] = set()
        self._pending_finished: list[RequestState] = []
        self._store_retries: set[RequestState] = set()
        """Requests whose last store offer found no room: they offer again at their next step."""
        self._block_fences: dict[int, set[int]] = {}
        """GPU block id -> in-flight store jobs reading it, for requests that have finished (`OS` 2336-2376)."""
        self.peer_fetch: PeerFetch | None = None
        """G2 peer fetch (sim/engines/vllm/offload/peer_fetch.py): None, off."""
        self._pulls: dict[int, tuple[CpuOffloadingManager, tuple]] = {}
        """Peer pulls in flight: job id -> (the holder's manager, the chunk hashes pinned there)."""
        self.pulled = False
        """A pull completed since the last `build_step`: its request's next lookup hits, so the next step is due at
        once (the lookup that deferred ran before the completion was reported)."""
        self.events: list[CacheEvent] | None = None
        """The tier's KV events since they were last taken, once someone subscribed (None: not recorded): stored
        chunks when their store completes, evicted ones when a store offer evicts them (rules §5.2)."""

    # ------------------------------------------------------------------ state
    @property
    def has_jobs(self) -> bool:
        """Jobs in flight: vLLM keeps stepping while they are (`has_pending_push_work`, `OS` 2198-2216)."""
        return bool(self._jobs)

    @property
    def blocks_decode_stretch(self) -> bool:
        """Something the next step's `build_step` does besides plain decodes: a finish pass or a store to offer
        again (stores in flight alone do not: their completions change nothing a decode step reads)."""
        return bool(self._pending_finished or self._store_retries)

    @property
    def has_work(self) -> bool:
        """Jobs in flight, finished requests whose finish pass has not run (vLLM's engine takes one more step for
        those, `has_finished_requests`, `S` 3157-3177), or store offers to retry: steps that are not plain decodes."""
        return bool(self._jobs) or self.blocks_decode_stretch

    @property
    def num_evicted_chunks(self) -> int:
        """Chunks the CPU tier evicted to make room so far (its manager's count)."""
        return self.manager.counters().num_evicted_chunks

    def chosen_medium(self, state: RequestState) -> str:
        """The medium a hit of this connector loads from (one tier: its own)."""
        return self.medium

    def job(self, job_id: int) -> TransferJob:
        return self._jobs[job_id]

    def _state(self, state: RequestState) -> _RequestOffload:
        st = self._requests.get(state)
        if st is None:
            st = self._requests[state] = _RequestOffload()
        return st

    def _chunk_hashes(self, state: RequestState, start: int, stop: int) -> list:
        hashes = state.block_hashes(start, stop)
        manager, B = self.manager, self.block_size
        for i, h in enumerate(hashes, start):
            manager.set_chunk_end_token(state, h, (i + 1) * B)
        return hashes

    # ------------------------------------------------------------------ admission
    def lookup(self, state: RequestState, num_gpu_hit_tokens: int) -> int | None:
        """Tokens beyond the GPU hit that can be loaded from CPU (0: none), or None to defer (`OS` 1218-1277,
        849-1054)."""
        st = self._state(state)
        st.next_stored_chunk = 0
        st.block_ids = []
        if st.job_ids:
            self.counters.num_deferred_lookups += 1
            return None  # its own stores (or a load) still in flight (`OS` 1247-1252)
        B = self.block_size
        num_chunks = state.num_tokens // B
        if num_chunks * B - num_gpu_hit_tokens < B:
            return 0
        start = num_gpu_hit_tokens // B
        manager = self.manager
        hits = 0
        pending = False
        for h in state.block_hashes(start, num_chunks):
            result = manager.lookup(h)
            if result is LookupResult.MISS or (result is LookupResult.HIT_PENDING and not self.defer_on_pending):
                break
            hits += 1
            pending |= result is LookupResult.HIT_PENDING
        if (self.peer_fetch is not None and not pending and num_chunks - (start + hits) >= self.peer_fetch.min_blocks
                and self._pull(state, start + hits, num_chunks)):
            self.counters.num_deferred_lookups += 1
            return None  # a peer's chunks are being pulled into this tier: wait, as for a pending store
        num_hit_tokens = (start + hits) * B - num_gpu_hit_tokens
        if num_hit_tokens < B:
            return 0
        if pending:
            self.counters.num_deferred_lookups += 1
            return None  # a chunk is resident but its store has not completed (`OS` 788-796)
        if self._chunks_being_loaded and not self._chunks_being_loaded.isdisjoint(
                state.block_hashes(start, start + hits)):
            self.counters.num_deferred_lookups += 1
            return None  # another request's load is bringing these chunks in (`OS` 1021-1045)
        return num_hit_tokens

    def _pull(self, state: RequestState, first: int, num_chunks: int) -> bool:
        """G2 peer fetch: the first peer (worker order) holding chunk `first` gives its contiguous run of the
        request's chunks from there; they are allocated here (all or nothing, evicting as a store does) and pinned
        there, and a pull job is queued for the NIC. False if no peer holds chunk `first` or there is no room."""
        wanted = state.block_hashes(first, num_chunks)
        for holder in self.peer_fetch.peers:
            run = 0
            for h in wanted:
                if holder.lookup(h) is not LookupResult.HIT:
                    break
                run += 1
            if run:
                break
        else:
            return False
        hashes = self._chunk_hashes(state, first, first + run)
        out = self.manager.prepare_store(state, hashes)
        if out is None or not out.chunk_hashes_to_store:
            return False
        if out.evicted_chunk_hashes:
            self._step.evicted.append((state, out.evicted_chunk_hashes))
            if self.events is not None:
                self.events.append(CacheEvent("removed", out.evicted_chunk_hashes, None, self.block_size,
                                              self.medium))
        pulled = out.chunk_hashes_to_store
        holder.prepare_load(state, pulled)
        stored = set(pulled)
        indices = tuple(i for i, h in enumerate(hashes, first) if h in stored)
        job = TransferJob(self._next_job_id, state, False, indices, len(indices) * self.bytes_per_block)
        self._next_job_id += 1
        self._jobs[job.job_id] = job
        self._pulls[job.job_id] = (holder, pulled)
        self._step.pull_jobs.append(job)
        return True

    def is_pull(self, job_id: int) -> bool:
        """A peer pull (run on the NIC), not a copy over the host link."""
        return job_id in self._pulls

    def record_lookup(self, state: RequestState, num_gpu_hit_tokens: int, num_external_tokens: int,
                      *, preempted: bool) -> None:
        """The connector's prefix-cache stats of one admission (`S` 1487-1506)."""
        queries = state.num_tokens - num_gpu_hit_tokens
        if queries:
            self.counters.prefix_cache.record(queries, num_external_tokens, preempted=preempted)

    def after_alloc(self, state: RequestState, num_gpu_hit_tokens: int, num_external_tokens: int) -> None:
        """The request got blocks for its GPU hit + `num_external_tokens` (+ new tokens) (`OS` 1351-1500)."""
        self._allocated_block_ids.update(state.block_ids)
        st = self._state(state)
        st.block_ids = list(state.block_ids)
        if num_external_tokens == 0:
            return
        B = self.block_size
        start = num_gpu_hit_tokens // B
        stop = -(-(num_gpu_hit_tokens + num_external_tokens) // B)
        hashes = self._chunk_hashes(state, start, stop)
        self.manager.prepare_load(state, hashes)
        # NOTE: a request that loaded does not offer the chunks below its hit end for storing again (`OS` 1468-1472).
        st.next_stored_chunk = stop
        job = self._new_job(state, is_store=False, chunk_indices=tuple(range(start, stop)))
        self._chunks_being_loaded.update(hashes)
        self._step.load_jobs.append(job)
        self.counters.num_load_jobs += 1
        self.counters.num_loaded_chunks += stop - start

    def _new_job(self, state: RequestState, *, is_store: bool, chunk_indices: tuple[int, ...],
                 block_ids: tuple[int, ...] = ()) -> TransferJob:
        job = TransferJob(self._next_job_id, state, is_store, chunk_indices, len(chunk_indices) * self.bytes_per_block,
                          block_ids)
        self._next_job_id += 1
        self._jobs[job.job_id] = job
        self._state(state).job_ids.add(job.job_id)
        return job

    # ------------------------------------------------------------------ end of schedule()
    def build_step(self, scheduled: Iterable[tuple[RequestState, int]], preempted: Sequence[RequestState]) -> ConnectorStep:
        """Flushes, store jobs and the finish pass of one `schedule()` (`OS` 2103-2196); `scheduled` is each
        scheduled request with its new tokens, in schedule order, before its computed tokens advance."""
        step, self._step = self._step, ConnectorStep()
        self.pulled = False
        scheduled = list(scheduled)
        for state, _n in scheduled:
            st = self._state(state)
            if len(state.block_ids) > len(st.block_ids):
                new = state.block_ids[len(st.block_ids):]
                self._allocated_block_ids.update(new)
                st.block_ids.extend(new)
        load_ids = {j.job_id for j in step.load_jobs}
        flush: set[int] = set()
        for state in preempted:
            st = self._requests.get(state)
            if st is not None:
                flush.update(j for j in st.job_ids if j not in load_ids)
        if self._block_fences and not self._allocated_block_ids.isdisjoint(self._block_fences):
            for bid in self._allocated_block_ids:
                flush.update(self._block_fences.get(bid, ()))
        finished, self._pending_finished = self._pending_finished, []
        for state, n in scheduled:
            self._offer_store(step, state, state.num_computed_tokens + n, flush)
        for state in finished:
            # NOTE: a finished request's last sampled token has no KV; prompt-only stores stop at the prompt.
            self._offer_store(step, state, max(state.request.prompt_tokens, state.num_tokens - 1), flush)
        for state in finished:
            st = self._requests.get(state)
            if st is None:
                continue
            st.finished = True
            self._store_retries.discard(state)
            self.manager.request_finished(state)
            if not st.job_ids:
                del self._requests[state]
        step.jobs_to_flush = sorted(flush)
        self.counters.num_flushed_jobs += len(flush)
        self._allocated_block_ids = set()
        return step

    def _offer_store(self, step: ConnectorStep, state: RequestState, num_tokens_after: int, flush: set[int]) -> None:
        st = self._requests.get(state)
        if st is None:
            return
        B = self.block_size
        # NOTE: offload_prompt_only (the default): only full chunks of the prompt are ever stored (`OS` 762-771).
        num_offloadable = min(num_tokens_after, state.num_tokens, state.request.prompt_tokens)
        num_chunks = min(num_offloadable // B, len(st.block_ids))
        start = st.next_stored_chunk
        if num_chunks <= start:
            st.next_stored_chunk = max(start, num_chunks)
            self._store_retries.discard(state)
            return
        hashes = self._chunk_hashes(state, start, num_chunks)
        out = self.manager.prepare_store(state, hashes)
        if out is None:
            self._store_retries.add(state)
            return  # no room: the same chunks are offered again next time (`OS` 1988-1996)
        self._store_retries.discard(state)
        st.next_stored_chunk = num_chunks
        if out.evicted_chunk_hashes:
            step.evicted.append((state, out.evicted_chunk_hashes))
            if self.events is not None:
                self.events.append(CacheEvent("removed", out.evicted_chunk_hashes, None, B, self.medium))
        if not out.chunk_hashes_to_store:
            return
        stored = set(out.chunk_hashes_to_store)
        indices = tuple(i for i, h in enumerate(hashes, start) if h in stored)
        job = self._new_job(state, is_store=True, chunk_indices=indices,
                            block_ids=tuple(st.block_ids[i] for i in indices))
        step.store_jobs.append(job)
        self.counters.num_store_jobs += 1
        self.counters.num_stored_chunks += len(indices)
        if state.finished_s is not None:
            # NOTE: a request that finished before its last store was created fences the (freed) blocks now, and a
            # block this very step reallocated flushes the job at once (`OS` 2094-2099).
            for bid in job.block_ids:
                self._block_fences.setdefault(bid, set()).add(job.job_id)
                if bid in self._allocated_block_ids:
                    flush.add(job.job_id)

    def request_finished(self, state: RequestState) -> None:
        """The request ended; its blocks are freed right after (`OS` 2336-2376). Its finish pass runs in the next
        `build_step`; in-flight stores fence their source blocks until they complete."""
        st = self._requests.get(state)
        if st is None:
            return
        self._pending_finished.append(state)
        for jid in st.job_ids:
            for bid in self._jobs[jid].block_ids:
                self._block_fences.setdefault(bid, set()).add(jid)

    # ------------------------------------------------------------------ the worker reports
    def complete(self, job_ids: Iterable[int]) -> list[RequestState]:
        """Jobs the worker finished (`OS` 2264-2310); returns the requests whose load is done, in job order."""
        loaded = []
        manager = self.manager
        for jid in job_ids:
            job = self._jobs.pop(jid)
            state = job.request
            pull = self._pulls.pop(jid, None)
            if pull is not None:
                holder, pulled = pull
                manager.complete_store(pulled)
                holder.complete_load(pulled)
                # NOTE: the read commits on the holder as a finished request's would (its recency: a use).
                holder.request_finished(state)
                self.counters.num_peer_fetched_chunks += len(pulled)
                self.pulled = True
                if self.events is not None:
                    self.events.append(CacheEvent("stored", tuple(pulled), None, self.block_size, self.medium))
                continue
            hashes = [state.block_hash(i) for i in job.chunk_indices]
            if job.is_store:
                manager.complete_store(hashes)
                if self.events is not None:
                    self.events.append(CacheEvent("stored", tuple(hashes), None, self.block_size, self.medium))
            else:
                manager.complete_load(hashes)
                self._chunks_being_loaded.difference_update(hashes)
                loaded.append(state)
            fences = self._block_fences
            for bid in job.block_ids:
                jobs = fences.get(bid)
                if jobs is not None:
                    jobs.discard(jid)
                    if not jobs:
                        del fences[bid]
            st = self._requests[state]
            st.job_ids.discard(jid)
            if st.finished and not st.job_ids:
                del self._requests[state]
        return loaded
