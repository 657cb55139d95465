"""vLLM v1's step scheduler for one worker, with no clock: `schedule()` plans a step, `update_from_output()` ends it.

Mirrors `vllm/v1/core/sched/scheduler.py` (synchronous engine loop, FCFS policy, chunked prefill, preemption by
recompute). The SimPy worker (`sim.cluster.worker`) calls it and decides how long each step takes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sim.engines.interface import StepOutcome, StepPlan
from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.kv_cache_manager import KVCacheManager
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
    """

    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager, behaviour: VllmBehaviour) -> None:
        self.limits = limits
        self.kv = kv
        self.behaviour = behaviour
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def add_request(self, state: RequestState) -> None:
        self.waiting.append(state)

    def schedule(self, now_s: float = 0.0) -> StepPlan:
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

        if not plan.preempted:
            self._admit_waiting(plan, budget, now_s)

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
        kv, waiting, running = self.kv, self.waiting, self.running
        behaviour = self.behaviour
        max_num_seqs = self.limits.max_num_seqs
        while waiting and budget > 0 and len(running) < max_num_seqs:
            state = waiting[0]
            hit_blocks = kv.find_longest_cache_hit(state) if state.num_computed_tokens == 0 else []
            num_hit_tokens = len(hit_blocks) * kv.block_size
            preempted_before = state.num_preemptions > 0
            if not behaviour.stats_at_admission_only:
                self._record_lookup(state, num_hit_tokens, preempted_before)
            num_new = min(state.num_tokens - num_hit_tokens, budget)
            if not kv.allocate_slots(
                state, num_new, hit_blocks, full_sequence_must_fit=behaviour.full_sequence_must_fit
            ):
                break
            waiting.popleft()
            running.append(state)
            if behaviour.stats_at_admission_only:
                self._record_lookup(state, num_hit_tokens, preempted_before)
            state.num_computed_tokens = num_hit_tokens
            if state.num_cached_tokens is None:
                state.num_cached_tokens = num_hit_tokens
                state.admitted_s = now_s
            plan.admitted.append(state)
            plan.num_scheduled_tokens[state] = num_new
            budget -= num_new

    def _record_lookup(self, state: RequestState, num_hit_tokens: int, preempted: bool) -> None:
        counted_as_preempted = preempted and not self.behaviour.count_preempted_lookups
        self.kv.stats.record(state.num_tokens, num_hit_tokens, preempted=counted_as_preempted)

    def _preempt(self, state: RequestState) -> None:
        self.kv.free(state)
        state.num_computed_tokens = 0
        state.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(state)

    def update_from_output(self, plan: StepPlan, now_s: float = 0.0) -> StepOutcome:
        """Sample one token for every scheduled request whose tokens are all computed; free the finished ones."""
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
        for state in finished:
            state.finished_s = now_s
            self.kv.free(state)
