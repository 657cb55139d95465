"""vLLM v1 behind the engine interface: the scheduler, its KV cache manager and decode stretches, as one `Engine`."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from sim.engines.interface import EngineCounters, EngineLoad, StepOutcome, StepPlan, StepTimeModel
from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.decode_stretch import DecodeStretch
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.request_state import RequestState
from sim.engines.vllm.scheduler import Scheduler, SchedulerLimits
from sim.engines.vllm.spec import VllmEngineSpec
from sim.workloads.request import Request


class VllmEngine:
    """One vLLM v1 worker (synchronous engine loop, as vLLM runs on CPU and as the oracle checks it).

    `cache` is the `KVCacheManager` (the worker's `PrefixCache`); `scheduler` does the work. The rules that changed
    between releases come from `spec.vllm_version` (`sim.engines.vllm.behaviour`).
    """

    kind: ClassVar[str] = "vllm"
    Spec: ClassVar[type[VllmEngineSpec]] = VllmEngineSpec

    def __init__(self, spec: VllmEngineSpec, *, kv_bytes_per_token: int) -> None:
        behaviour = VllmBehaviour.for_version(spec.vllm_version)
        self.spec = spec
        self.cache = KVCacheManager(
            num_blocks=spec.num_blocks(kv_bytes_per_token), block_size=spec.block_size,
            max_model_len=spec.max_model_len, unhashed_to_head=behaviour.unhashed_to_head,
            free_tail_first=spec.free_order == "tail-first",
        )
        self.scheduler = Scheduler(SchedulerLimits(spec.max_num_batched_tokens, spec.max_num_seqs, spec.max_model_len),
                                   self.cache, behaviour)
        # NOTE: `Engine.schedule` is the scheduler's own method: the worker calls it every step, and binding it
        # here saves a frame per call.
        self.schedule: Callable[[float], StepPlan] = self.scheduler.schedule

    def add_request(self, request: Request, *, worker: int, arrival_s: float) -> RequestState:
        state = RequestState(request, worker, arrival_s, block_size=self.cache.block_size)
        self.scheduler.add_request(state)
        return state

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.waiting or s.running)

    @property
    def num_requests(self) -> int:
        return self.scheduler.num_requests

    def load(self) -> EngineLoad:
        s = self.scheduler
        return EngineLoad(num_running=len(s.running), num_waiting=len(s.waiting), kv_usage=self.cache.usage())

    def update_from_output(self, plan: StepPlan, now_s: float) -> StepOutcome:
        outcome = self.scheduler.update_from_output(plan, now_s)
        if self.cache.pool.events:
            # NOTE: vLLM's engine core takes the step's KV events after processing its output.
            self.cache.publish(now_s)
        return outcome

    def plan_decode_stretch(self, time_model: StepTimeModel, *, speed: float, now_s: float) -> DecodeStretch | None:
        s = self.scheduler
        if s.waiting or not s.running:
            return None  # the common case, decided without a call: a step with work to admit or nothing running
        return DecodeStretch.plan(s, time_model, speed=speed, now_s=now_s, max_model_len=self.spec.max_model_len)

    def finish_stretch(self, stretch: DecodeStretch, num_steps: int, now_s: float) -> list[RequestState]:
        stretch.apply(num_steps)
        finished = stretch.finished()
        if finished:
            self.scheduler.finish(finished, now_s)
        return finished

    def counters(self) -> EngineCounters:
        evicted = self.cache.pool.num_evicted_blocks
        return EngineCounters(prefix_cache=self.cache.stats.copy(), evicted_blocks=evicted,
                              evicted_tokens=evicted * self.cache.block_size,
                              preemptions=self.scheduler.num_preemptions)

    def describe_stall(self) -> str:
        s = self.scheduler
        head = s.waiting[0]
        return (f"nothing schedulable with {len(s.waiting)} waiting and {len(s.running)} running; head request "
                f"{head.request.request_id} needs {head.num_tokens} tokens, {self.cache.num_free_blocks} blocks free")
