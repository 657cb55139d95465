"""vLLM v1's step scheduler for one worker, with no clock: `schedule()` plans a step, `update_from_output()` ends it.

Mirrors `vllm/v1/core/sched/scheduler.py` (synchronous engine loop, FCFS policy, chunked prefill, preemption by
recompute). The SimPy worker (`sim.cluster.worker`) calls it and decides how long each step takes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from sim.engines.interface import EngineLoad, StepOutcome, StepPlan
from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.offload.connector import ConnectorStep, OffloadingConnector
from sim.engines.vllm.offload.multi import MultiConnector
from sim.engines.vllm.request_state import RequestState


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int


class Scheduler:
    """One worker's vLLM v1 scheduler.

    Order of work in `schedule()` (as upstream):
    1. Running requests first, in admission order, each up to its remaining tokens within the token budget. When
       blocks run out, the **last admitted** running request is preempted (blocks freed tail first, progress
       reset, put at the head of the waiting queue); if that victim is the request itself, the loop stops.
    2. Waiting requests only if nothing was preempted in this step, FCFS while budget, `max_num_seqs` and blocks
       allow; the first one that does not fit stops admission (head-of-line blocking). Cached tokens use no
       budget; the last admitted one may be chunked.
    `num_computed_tokens` advances at schedule time; `update_from_output` samples a token for every request
    whose prompt is fully computed and frees finished requests' blocks immediately.

    With a CPU tier (`connector`, vLLM's OffloadingConnector) admission follows 0.33.0's waiting loop
    (`S` 1049-1612): requests holding KV blocks (`holding`: async loads, waiting or done) are drained before new
    ones; a fresh admission asks the connector after the GPU lookup; a CPU hit allocates blocks for the hit, puts
    the request in `holding` with 0 tokens (WAITING_FOR_REMOTE_KVS) and, once the load is reported done, caches
    those blocks and admits it from `holding`; a deferred lookup skips the request without blocking the ones
    behind it. Skipped requests go back to the front of their queue in their order.
    """

    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager, behaviour: VllmBehaviour,
                 connector: OffloadingConnector | MultiConnector | None = None) -> None:
        self.limits = limits
        self.kv = kv
        self.behaviour = behaviour
        self.connector = connector
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.holding: deque[RequestState] = deque()
        """vLLM's `kv_holding_waiting`: requests with KV blocks that wait (their load in flight, or done)."""
        self._loaded: set[RequestState] = set()
        """Requests whose async load is reported done (`finished_recving_kv_req_ids`), not yet promoted."""
        self._inflight_prefills: set[RequestState] = set()
        """Requests whose prefill (or load) is not done: their remaining blocks are reserved against async loads."""
        self._connector_step: ConnectorStep | None = None
        """The transfer jobs of the last `schedule()` (with a connector), until the worker side takes them."""
        self.num_preemptions = 0
        self.num_held_requests = 0
        """Finished P/D prefill requests whose blocks wait for the decode side to read them."""
        self._remote_loads: list[tuple[float, int, RequestState]] = []
        """P/D transfers in flight, a heap of (done_s, request id, request)."""
        self._stalled_head: RequestState | None = None
        """The waiting request the last admission stopped at (its blocks did not fit, or `max_num_seqs` was
        reached with it at the head); None if admission stopped for another reason or emptied the queue."""

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.holding
                    or (self.connector is not None and self.connector.has_work))

    @property
    def has_loaded_requests(self) -> bool:
        """A CPU load is reported done and its request waits to be promoted by the next `schedule()`."""
        return bool(self._loaded)

    @property
    def num_requests(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.holding)

    @property
    def stalled_head(self) -> RequestState | None:
        """The waiting request the last admission stopped at (see `admission_stays_blocked`), if still waiting."""
        head = self._stalled_head
        return head if self.waiting and self.waiting[0] is head else None

    @property
    def blocks_decode_stretch(self) -> bool:
        """The next step does more than decode the running requests, whatever they need: a request waits to be
        admitted, or holds KV blocks for a load to promote, or the connector has a finish pass or a store offer to
        retry (stores in flight alone do not count: their completions change nothing a decode step reads)."""
        return bool(self.waiting or self.holding) or (self.connector is not None
                                                     and self.connector.blocks_decode_stretch)

    def admission_stays_blocked(self, steps: int) -> bool:
        """Whether the next `steps` steps, if they only decode the running requests (none finishing before the last,
        none preempted), admit nothing either: the waiting head cannot be admitted now and nothing those steps do
        can change that. Then they are the decode steps a stretch advances (`DecodeStretch.plan`), the head's
        failed lookups having no effect.

        Only where the answer can be proved (vLLM >= 0.27 records no stats for a failed lookup; >= 0.19 admits a
        request only if its whole prompt fits, without a connector or a P/D transfer):

        * `max_num_seqs` running, or no token budget left after the decodes: as long as nothing finishes;
        * else the head's whole prompt does not fit, `need > free` with need = its blocks - the hit blocks that are
          held (`num_blocks_to_admit`), and decode steps only move `need - free` up: each allocation takes a free
          block (free - 1); if it evicts a hit block, the hit is cut there (need + the held hit blocks cut off) or a
          duplicate copy takes over (need - 1 at most, if that copy is held). A hit grows only if a step caches
          one of the hashes the head looks up: the running requests' blocks cached in those steps must not be
          among them (checked).
        """
        head = self.waiting[0]
        behaviour = self.behaviour
        if (self.connector is not None or self.holding or head.remote_kv is not None or head.loading
                or not behaviour.stats_at_admission_only or not behaviour.full_sequence_must_fit):
            return False
        running, limits = self.running, self.limits
        if len(running) >= limits.max_num_seqs or limits.max_num_batched_tokens <= len(running):
            return True
        kv = self.kv
        B = kv.block_size
        lookup = head.block_hashes(0, (head.num_tokens - 1) // B)
        hit_blocks = kv.pool.leading_cached_blocks(lookup)
        if kv.num_blocks_to_admit(head, hit_blocks) <= kv.num_free_blocks:
            return False
        newly_cached: set = set()
        for r in running:
            start, stop = r.num_cached_blocks, (r.num_computed_tokens + steps) // B + 1
            if stop > start:
                newly_cached.update(r.block_hashes(start, stop))
        return newly_cached.isdisjoint(lookup)

    def take_connector_step(self) -> ConnectorStep:
        """The transfer jobs the last `schedule()` created (vLLM's `kv_connector_metadata`), handed to the worker
        side that runs them, once."""
        step = self._connector_step
        if step is None:
            raise RuntimeError("no connector step to take: the scheduler has no connector, or no schedule() built "
                               "one since it was last taken")
        self._connector_step = None
        return step

    def add_request(self, state: RequestState) -> None:
        self.waiting.append(state)

    def load(self) -> EngineLoad:
        """vLLM's scheduler stats (`make_stats`): running requests, waiting ones (those holding KV blocks for a
        load included) and the KV cache usage."""
        return EngineLoad(num_running=len(self.running), num_waiting=len(self.waiting) + len(self.holding),
                          kv_usage=self.kv.usage())

    def describe_stall(self) -> str:
        """Why `schedule()` scheduled nothing while requests wait (for the error the worker raises)."""
        free = self.kv.num_free_blocks
        if self.holding:
            head = self.holding[0]
            return (f"nothing schedulable with {len(self.holding)} requests holding KV blocks (CPU loads), "
                    f"{len(self.waiting)} waiting and {len(self.running)} running; head request "
                    f"{head.request.request_id} holds {len(head.block_ids)} blocks "
                    f"({'loading' if head.loading else 'loaded'}, {head.num_computed_tokens} of {head.num_tokens} "
                    f"tokens), {free} blocks free")
        head = self.waiting[0]
        return (f"nothing schedulable with {len(self.waiting)} waiting and {len(self.running)} running; head request "
                f"{head.request.request_id} needs {head.num_tokens} tokens, {free} blocks free")

    def next_remote_load_s(self) -> float | None:
        """When the next P/D transfer in flight completes (None: none in flight)."""
        return self._remote_loads[0][0] if self._remote_loads else None

    def _take_remote_loads(self, now_s: float) -> None:
        """P/D transfers done by now are reported done (vLLM's `finished_recving`), promoted by this step."""
        loads = self._remote_loads
        while loads and loads[0][0] <= now_s:
            self._loaded.add(heapq.heappop(loads)[2])

    def schedule(self, now_s: float = 0.0) -> StepPlan:
        if self._remote_loads:
            self._take_remote_loads(now_s)
        plan = StepPlan()
        scheduled = plan.num_scheduled_tokens
        kv = self.kv
        budget = self.limits.max_num_batched_tokens
        running = self.running

        max_len = self.limits.max_model_len - 1
        i = 0
        while i < len(running) and budget > 0:
            state = running[i]
            computed = state.num_computed_tokens
            num_new = min(state.request.prompt_tokens + state.num_output_tokens - computed, budget, max_len - computed)
            if num_new <= 0:
                i += 1
                continue
            preempted_self = False
            while not kv.allocate_slots(state, num_new):
                victim = running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is state:
                    preempted_self = True
                    break
            if preempted_self:
                break  # nothing after it in the running list is left to schedule
            scheduled[state] = num_new
            budget -= num_new
            i += 1

        connector = self.connector
        if not plan.preempted:
            self._admit_waiting(plan, budget, now_s)
        if connector is not None:
            self._connector_step = connector.build_step(scheduled.items(), plan.preempted)
            inflight = self._inflight_prefills
            for state, n in scheduled.items():
                if state.num_computed_tokens + n >= state.num_tokens:
                    inflight.discard(state)

        prefill_tokens = decode_seqs = decode_context = pairs = prefill_context = 0
        for state, n in scheduled.items():
            computed = state.num_computed_tokens
            if n == 1 and computed >= state.request.prompt_tokens:
                decode_seqs += 1
                decode_context += computed
            else:
                prefill_tokens += n
                pairs += n * computed + n * (n + 1) // 2
                prefill_context += computed
            state.num_computed_tokens = computed + n
        plan.num_prefill_tokens = prefill_tokens
        plan.num_decode_seqs = decode_seqs
        plan.num_decode_context_tokens = decode_context
        plan.num_prefill_attention_pairs = pairs
        plan.num_prefill_context_tokens = prefill_context
        return plan

    def _admit_waiting(self, plan: StepPlan, budget: int, now_s: float) -> None:
        """Admit waiting requests (see the class docstring; `holding` stays empty without a connector)."""
        kv, running, connector = self.kv, self.running, self.connector
        behaviour = self.behaviour
        max_num_seqs = self.limits.max_num_seqs
        skipped_waiting: list[RequestState] = []
        skipped_holding: list[RequestState] = []
        self._stalled_head = None

        def skip(queue: deque[RequestState]) -> None:
            state = queue.popleft()
            (skipped_holding if state.num_computed_tokens > 0 else skipped_waiting).append(state)

        while budget > 0:
            queue = self.holding or self.waiting
            if not queue:
                break
            if len(running) >= max_num_seqs:
                self._stalled_head = queue[0]
                break
            state = queue[0]
            if state.loading:
                if state not in self._loaded:
                    skip(queue)
                    continue
                self._promote(state)
            # NOTE: only a fresh admission looks up; a promoted load (or, in vLLM, a resumed transfer) does not.
            looked_up = state.num_computed_tokens == 0
            hit_blocks = kv.find_longest_cache_hit(state) if looked_up else []
            num_gpu_hit = len(hit_blocks) * kv.block_size
            if looked_up and state.remote_kv is not None:
                if not self._admit_remote(state, hit_blocks, num_gpu_hit, now_s):
                    break
                if state.loading:
                    skip(queue)
                    continue
            num_ext = 0
            if looked_up and connector is not None:
                ext = connector.lookup(state, num_gpu_hit)
                if ext is None:
                    skip(queue)
                    continue
                num_ext = ext
            preempted_before = state.num_preemptions > 0
            if looked_up and not behaviour.stats_at_admission_only:
                self._record_lookup(state, num_gpu_hit, preempted_before)
            # NOTE: a synchronous tier (LMCache in-process, `load_kv_async=False`) loads in the admitting step: the
            # request is scheduled at once with its loaded tokens computed (sim/engines/vllm/offload/lmcache.py).
            sync_ext = num_ext if num_ext and connector.sync_load else 0
            if num_ext and not sync_ext:
                assert connector is not None
                reserved = sum(map(kv.num_blocks_to_finish, self._inflight_prefills))
                if not kv.allocate_for_load(state, hit_blocks, num_ext, reserved_blocks=reserved,
                                            full_sequence_must_fit=behaviour.full_sequence_must_fit):
                    break
                connector.after_alloc(state, num_gpu_hit, num_ext)
                connector.record_lookup(state, num_gpu_hit, num_ext, preempted=preempted_before)
                if behaviour.stats_at_admission_only:
                    self._record_lookup(state, num_gpu_hit, preempted_before)
                if not preempted_before and state.num_cached_tokens is None:
                    if connector.chosen_medium(state) == "SHARED":
                        state.num_shared_hit_tokens = num_ext
                    else:
                        state.num_cpu_hit_tokens = num_ext
                    state.load_admitted_s = now_s
                state.num_computed_tokens = num_gpu_hit + num_ext
                state.loading = True
                self._inflight_prefills.add(state)
                skip(queue)
                continue
            computed = num_gpu_hit + sync_ext if looked_up else state.num_computed_tokens
            num_new = min(state.num_tokens - computed, budget)
            if not kv.allocate_slots(
                state, sync_ext + num_new, hit_blocks, full_sequence_must_fit=behaviour.full_sequence_must_fit
            ):
                self._stalled_head = state
                break
            if connector is not None:
                connector.after_alloc(state, num_gpu_hit, sync_ext)
                if looked_up:
                    connector.record_lookup(state, num_gpu_hit, sync_ext, preempted=preempted_before)
                if sync_ext and not preempted_before and state.num_cached_tokens is None:
                    state.num_cpu_hit_tokens = sync_ext
                if computed + num_new < state.num_tokens:
                    self._inflight_prefills.add(state)
            if looked_up and behaviour.stats_at_admission_only:
                self._record_lookup(state, num_gpu_hit, preempted_before)
            queue.popleft()
            running.append(state)
            state.num_computed_tokens = computed
            if state.num_cached_tokens is None:
                state.num_cached_tokens = computed
                # NOTE: a load reaching the prompt's end recomputes its last token: the request's cached tokens
                # are one fewer than it loaded (vLLM's connector still counts the load in full).
                state.num_cpu_hit_tokens = min(state.num_cpu_hit_tokens, computed)
                state.num_shared_hit_tokens = min(state.num_shared_hit_tokens, computed)
                if state.load_admitted_s is not None:
                    state.tier_load_s = now_s - state.load_admitted_s
                state.admitted_s = now_s
            plan.admitted.append(state)
            plan.num_scheduled_tokens[state] = num_new
            budget -= num_new
        if skipped_holding:
            self.holding.extendleft(reversed(skipped_holding))
        if skipped_waiting:
            self.waiting.extendleft(reversed(skipped_waiting))

    def _admit_remote(self, state: RequestState, hit_blocks: list[int], num_gpu_hit: int, now_s: float) -> bool:
        """P/D decode side (vLLM's NixlConnector, `get_num_new_matched_tokens` with do_remote_prefill): the tokens
        to receive are the prompt past the local hit, loaded asynchronously into blocks allocated now
        (WAITING_FOR_REMOTE_KVS); a prompt wholly cached here receives nothing and is admitted as usual. False (and
        nothing changed) if the blocks do not fit: admission stops, as for any request.

            | local hit (hit_blocks, touched) | received from the prefill worker: new blocks, uncached |
            0                                 num_gpu_hit                                  prompt_tokens
        """
        num_remote = state.request.prompt_tokens - num_gpu_hit
        if num_remote <= 0:
            # NOTE: NIXL still notifies the prefill side, which frees its blocks.
            state.remote_kv.load_done_s(start_s=now_s, num_tokens=0)
            state.remote_kv = None
            return True
        if not self.kv.allocate_for_load(state, hit_blocks, num_remote,
                                         full_sequence_must_fit=self.behaviour.full_sequence_must_fit):
            return False
        source, state.remote_kv = state.remote_kv, None
        # NOTE: vLLM counts the local lookup in its prefix-cache stats; the received tokens are the connector's.
        self._record_lookup(state, num_gpu_hit, state.num_preemptions > 0)
        state.num_computed_tokens = num_gpu_hit + num_remote
        state.loading = True
        state.num_remote_kv_tokens = num_remote
        state.remote_kv_start_s = now_s
        done_s = source.load_done_s(start_s=now_s, num_tokens=num_remote)
        state.remote_kv_done_s = done_s
        heapq.heappush(self._remote_loads, (done_s, state.request.request_id, state))
        return True

    def _promote(self, state: RequestState) -> None:
        """The request's load is done: cache the loaded blocks and let it prefill the rest; a load that reached the
        prompt's end recomputes the last token (`S` 3467-3533)."""
        self._loaded.discard(state)
        state.loading = False
        self.kv.cache_full_blocks(state, state.num_computed_tokens)
        if state.num_computed_tokens == state.num_tokens:
            state.num_computed_tokens -= 1

    def _record_lookup(self, state: RequestState, num_hit_tokens: int, preempted: bool) -> None:
        counted_as_preempted = preempted and not self.behaviour.count_preempted_lookups
        self.kv.stats.record(state.num_tokens, num_hit_tokens, preempted=counted_as_preempted)

    def _preempt(self, state: RequestState) -> None:
        self._inflight_prefills.discard(state)
        self.kv.free(state)
        state.num_computed_tokens = 0
        state.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(state)

    def update_from_output(self, plan: StepPlan, now_s: float = 0.0, finished_jobs: Iterable[int] = ()) -> StepOutcome:
        """Sample one token for every scheduled request whose tokens are all computed; free the finished ones;
        then take the KV transfer jobs the worker reports done (`finished_jobs`, `S` 2581-2582)."""
        outcome = self._sample(plan, now_s)
        if self.connector is not None:
            self.complete_transfers(finished_jobs)
        return outcome

    def complete_transfers(self, job_ids: Iterable[int]) -> None:
        """The worker side reports KV transfer jobs done: the connector takes them, and requests whose load is done
        are promoted by the next `schedule()`."""
        loaded = self.connector.complete(job_ids)
        if loaded:
            self._loaded.update(loaded)

    def _sample(self, plan: StepPlan, now_s: float) -> StepOutcome:
        first_token: list[RequestState] = []
        finished: list[RequestState] = []
        for state in plan.num_scheduled_tokens:
            request = state.request
            if state.num_computed_tokens < request.prompt_tokens + state.num_output_tokens:
                continue  # a prefill chunk: no token yet
            state.num_output_tokens += 1
            if state.first_token_s is None:
                state.first_token_s = now_s
                first_token.append(state)
            if state.num_output_tokens >= request.output_tokens:
                finished.append(state)
        if finished:
            self.finish(finished, now_s)
        return StepOutcome(first_token, finished)

    def finish(self, finished: list[RequestState], now_s: float) -> None:
        """End requests that sampled their last token in the step ending now: out of the running list, blocks freed
        (each tail first, in the order given: schedule order)."""
        done = set(finished)
        self.running = [s for s in self.running if s not in done]
        connector = self.connector
        for state in finished:
            state.finished_s = now_s
            if connector is not None:
                self._inflight_prefills.discard(state)
                connector.request_finished(state)
            if state.hold_kv:
                # NOTE: NIXL's request_finished answers delay_free_blocks for a do_remote_decode request that ended
                # FINISHED_LENGTH_CAPPED: its blocks are freed when the decode side has read them.
                self.num_held_requests += 1
                continue
            self.kv.free(state)

    def release_held(self, state: RequestState) -> None:
        """The decode side has read a finished `do_remote_decode` request's blocks: free them (tail first)."""
        if not state.hold_kv or state.finished_s is None:
            raise RuntimeError(f"request {state.request.request_id} holds no KV to release "
                               f"(hold_kv={state.hold_kv}, finished_s={state.finished_s})")
        state.hold_kv = False
        self.num_held_requests -= 1
        self.kv.free(state)
