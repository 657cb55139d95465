"""SGLang 0.5.23's scheduler for one worker: its event loop, batch formation, decode retraction and result processing.

Mirrors `python/sglang/srt/managers/scheduler.py` (`event_loop_overlap` / `event_loop_normal`,
`get_next_batch_to_run`, `_get_new_batch_prefill_raw`, `update_running_batch`), `schedule_batch.py`
(`prepare_for_extend`, `retract_decode`, `filter_batch`, `merge_batch`) and
`scheduler_components/batch_result_processor.py`, for one plain (non-hybrid, no speculative decoding) model. The
rules, with file:line, are in `docs/engines/sglang-0.5.23-semantics.md`; the engine oracle
(`tests/engines/sglang/test_sglang_engine_oracle.py`) checks this class decision by decision against SGLang's own code.

The loop, one iteration at a time (overlap scheduling, SGLang's default):

    ingest arrivals -> schedule batch B_i -> launch B_i -> wait for B_{i-1} and process its result -> repeat

so B_i is formed before B_{i-1}'s result is processed: a prompt prefilled in B_k enters the tree when B_k is
processed, after B_{k+1} was formed (a request in B_{k+1} misses it), and a request finishing in B_k frees its KV
for B_{k+2}. Without overlap each batch's result is processed before the next is formed. A prefill batch is formed
whenever any waiting request can be admitted; otherwise the running requests decode (prefill and decode are
separate batches).

Time is the worker's: `schedule(now_s)` runs iterations until the loop must wait for the device, and returns the
batch the device runs next; `update_from_output(plan, now_s)` is the end of that wait (the result processed).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.engines.interface import EngineLoad, PrefixCacheStats, StepOutcome, StepPlan
from sim.engines.sglang.kv_pool import KvPool
from sim.engines.sglang.radix_cache import RadixCache
from sim.engines.sglang.request_state import SglangRequest
from sim.engines.sglang.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy, init_next_round_input

RETRACT_DECODE_STEPS = 20
"""`SGLANG_RETRACT_DECODE_STEPS`: after a retraction, free room for this many decode steps of the rest."""


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_total_tokens: int
    max_running_requests: int
    chunked_prefill_size: int | None
    max_prefill_tokens: int
    overlap: bool
    schedule_conservativeness: float = 1.0


class NewTokenRatio:
    """`NewTokenRatioTracker`: the share of running requests' remaining outputs admission reserves (for requests
    that may stop early; `ignore_eos` requests always reserve in full). Decays each decode step, jumps on
    retraction, resets when the worker is fully idle."""

    __slots__ = ("init", "min", "decay", "current", "_init_values")

    def __init__(self, schedule_conservativeness: float = 1.0) -> None:
        self.init = min(0.7 * schedule_conservativeness, 1.0)
        self.min = min(self.init * 0.14, 1.0)
        self.decay = (self.init - self.min) / 600
        self.current = self.init
        self._init_values: list[float] | None = None

    def decay_step(self) -> None:
        self.current = max(self.current - self.decay, self.min)

    def decay_steps(self, num_steps: int) -> None:
        """`num_steps` decode steps' decays."""
        # NOTE: repeated, not multiplied, to round as stepping does; but from `init` (where an idle worker starts) the
        # values are always the same, so they are computed once (`_from_init`); and once at the floor it stays.
        current, decay, floor = self.current, self.decay, self.min
        if current == self.init:
            values = self._from_init()
            self.current = values[min(num_steps, len(values) - 1)]
            return
        for _ in range(num_steps):
            current -= decay
            if current <= floor:
                current = floor
                break
        self.current = current

    def _from_init(self) -> list[float]:
        """The values after 0, 1, 2 ... decays from `init`, down to the floor."""
        values = self._init_values
        if values is None:
            values, current = [self.init], self.init
            while current > self.min:
                current = max(current - self.decay, self.min)
                values.append(current)
            self._init_values = values
        return values


class Batch:
    """A `ScheduleBatch`: its requests (in batch order), the `batch_is_full` latch it carries, its mode."""

    __slots__ = ("reqs", "batch_is_full", "mode", "chunked_req", "admitted")

    def __init__(self, reqs: list[SglangRequest], mode: str = "extend", chunked_req: SglangRequest | None = None,
                 admitted: list[SglangRequest] | None = None):
        self.reqs = reqs
        self.batch_is_full = False
        self.mode = mode
        self.chunked_req = chunked_req
        self.admitted = admitted or []
        """Requests this prefill batch took from the waiting queue (not the continuing chunk)."""

    def filter(self, exclude: list[SglangRequest] | None = None) -> None:
        """`filter_batch`: drop finished requests and `exclude`."""
        exclude = exclude or []
        self.reqs = [r for r in self.reqs if not r.finished() and r not in exclude]


@dataclass(slots=True)
class SglangStep(StepPlan):
    """A launched batch: the step shape for the time model, and what result processing will iterate over."""

    mode: str = "extend"
    reqs: tuple[SglangRequest, ...] = ()
    """The batch's requests when it was launched (SGLang processes a copy of the batch)."""
    host_loads: list = field(default_factory=list)
    """HiCache: the load-backs (`hiradix_cache.Copy`) this batch's admissions issued; the device runs them beside
    its forward pass (`ready_to_load_host_cache`)."""

    @classmethod
    def decode(cls, reqs) -> SglangStep:
        """The decode batch of `reqs`: one token each, attending to their committed KV but the newest slot."""
        step = cls(mode="decode", reqs=tuple(reqs))
        step.num_scheduled_tokens = dict.fromkeys(step.reqs, 1)
        step.num_decode_seqs = len(step.reqs)
        step.num_decode_context_tokens = sum(r.kv_committed_len - 1 for r in step.reqs)
        return step


class Scheduler:
    """One worker's SGLang scheduler (see the module docstring)."""

    def __init__(self, limits: SchedulerLimits, tree: RadixCache, *, schedule_policy: str = "fcfs") -> None:
        self.limits = limits
        self.tree = tree
        self.pool = KvPool(tree, max_total_tokens=limits.max_total_tokens,
                           max_running_requests=limits.max_running_requests)
        self.policy = SchedulePolicy(schedule_policy, tree)
        self.ratio = NewTokenRatio(limits.schedule_conservativeness)
        self.stats = PrefixCacheStats()
        self.inbox: list[SglangRequest] = []
        self.waiting: list[SglangRequest] = []
        self.running_batch = Batch([], mode="decode")
        self.chunked_req: SglangRequest | None = None
        self.last_batch: Batch | None = None
        self.num_retractions = 0
        self._launched: deque[SglangStep] = deque()
        """Launched batches the device has not started (the head is what the loop waits for)."""
        self._awaiting: SglangStep | None = None
        self._next_last_batch: Batch | None = None
        self._last_step: SglangStep | None = None
        """The step of `last_batch` (under overlap: launched, its result not processed yet)."""
        self._retracted_now: list[SglangRequest] = []
        self._now_s = 0.0
        self.prebuilt: list[SglangRequest] = []
        """P/D decode side: requests whose prompt KV has arrived, to join the running batch at the next iteration
        (SGLang's prebuilt batch: no forward, the prefill server's token is their first)."""
        self.prebuilt_first_tokens: list[SglangRequest] = []
        """Of those, the ones joined since the last result: their first token goes out with it."""
        self.held: set[SglangRequest] = set()
        """P/D prefill side: finished requests whose KV is kept (locked in the tree) until the decode side has it."""
        self.on_launch = None
        """Called with each batch as it is launched (an observer for the differential tests)."""

    # ------------------------------------------------------------------ the loop
    @property
    def has_work(self) -> bool:
        last = self.last_batch
        return bool(self.inbox or self.waiting or self.running_batch.reqs or self._launched or self._awaiting
                    or self.chunked_req is not None or (last is not None and last.mode == "extend" and last.reqs)
                    or self.prebuilt)

    @property
    def has_launched_batch(self) -> bool:
        """A batch is launched that the device has not started (under overlap: the one after the running one)."""
        return bool(self._launched)

    @property
    def num_requests(self) -> int:
        return len(self.inbox) + len(self.waiting) + len(self.running_batch.reqs)

    def add_request(self, req: SglangRequest) -> None:
        self.inbox.append(req)

    def load(self) -> EngineLoad:
        """SGLang's scheduler metrics: running requests (`num_running_reqs`), queued ones, arrived but not yet
        ingested included (`num_queue_reqs`), and `token_usage`."""
        running = len(self.running_batch.reqs)
        return EngineLoad(num_running=running, num_waiting=self.num_requests - running,
                          kv_usage=self.pool.token_usage())

    def describe_stall(self) -> str:
        """Why the loop formed no batch while requests wait (for the error the worker raises)."""
        head = self.waiting[0] if self.waiting else None
        what = (f"head request {head.request.request_id} needs {head.fill_len} tokens" if head is not None
                else "no request waiting")
        return (f"nothing schedulable with {len(self.waiting)} waiting and {len(self.running_batch.reqs)} running; "
                f"{what}, {self.pool.available_size()} KV slots free, {self.tree.evictable_size_} evictable")

    def schedule(self, now_s: float) -> SglangStep | None:
        """Run loop iterations until the loop waits for a batch; return the batch the device runs next."""
        if self._awaiting is None:
            self._iterate(now_s)
        return self._launched.popleft() if self._launched else None

    def _iterate(self, now_s: float) -> None:
        self._now_s = now_s
        overlap = self.limits.overlap
        while True:
            if self.inbox:
                self.waiting.extend(self.inbox)  # ingest_requests -> _add_request_to_queue
                self.inbox.clear()
            if self.prebuilt:
                self._join_prebuilt(now_s)
            batch = self._get_next_batch_to_run()
            step = self._launch(batch) if batch is not None else None
            if overlap:
                if self.last_batch is not None:
                    # NOTE: B_i is launched; the loop now waits for B_{i-1}, which the device runs first.
                    self._await(self._last_step, batch)
                    self._last_step = step
                    return
                if batch is None:
                    self._on_idle()
                    return
                self.last_batch, self._last_step = batch, step
                continue
            if batch is None:
                self._on_idle()
                self.last_batch = None
                return
            self._await(step, batch)
            return

    def _join_prebuilt(self, now_s: float) -> None:
        """P/D decode side: requests whose KV has arrived join the running batch with the prefill server's token
        as their first (`process_prebuilt`: no forward pass), and decode from there."""
        for req in self.prebuilt:
            req.num_output_tokens = 1
            req.first_token_s = now_s
            req.update_finish_state()
            self.prebuilt_first_tokens.append(req)
        self.running_batch.reqs = self.running_batch.reqs + self.prebuilt
        self.running_batch.batch_is_full = False
        self.prebuilt = []

    def release_held(self, req: SglangRequest) -> None:
        """P/D prefill side: the decode side has the KV of finished `req`: unlock it (it stays cached)."""
        if req not in self.held:
            raise RuntimeError(f"request {req.request.request_id} holds no KV to release")
        self.held.discard(req)
        self.pool.release_kv_cache(req, checkpoint=True)

    def _await(self, step: SglangStep, next_last: Batch | None) -> None:
        """The loop waits for `step`'s result; once processed, `next_last` is the last batch."""
        self._awaiting = step
        self._next_last_batch = next_last

    def _launch(self, batch: Batch) -> SglangStep:
        if batch.mode == "extend":
            step = SglangStep(mode="extend", reqs=tuple(batch.reqs))
            scheduled = step.num_scheduled_tokens
            pairs = context = 0
            for r in batch.reqs:
                n = r.extend_len
                scheduled[r] = n
                pairs += n * r.prefix_len + n * (n + 1) // 2
                context += r.prefix_len
            step.num_prefill_tokens = sum(scheduled.values())
            step.num_prefill_attention_pairs = pairs
            step.num_prefill_context_tokens = context
            step.admitted = list(batch.admitted)
            if self.tree.has_host_tier:
                step.host_loads = self.tree.take_new_loads()
        else:
            step = SglangStep.decode(batch.reqs)
            step.preempted = self._retracted_now
        self._retracted_now = []
        self._launched.append(step)
        if self.on_launch is not None:
            self.on_launch(step)
        return step

    def _on_idle(self) -> None:
        if not self.running_batch.reqs and not self.waiting and self.chunked_req is None:
            self.ratio.current = self.ratio.init

    # ------------------------------------------------------------------ decode stretches
    def steady_decode_context(self) -> int | None:
        """The KV tokens the next decode batch attends to, if the loop repeats decode batches of the running
        batch's requests until something arrives: nothing arrived or waiting, no chunked prefill, no result
        awaited, the last batch is the running batch, and under overlap exactly the decode batch of these
        requests launched (without overlap, nothing launched). Else None. Whether a request finishes or must
        leave the batch is the caller's to check (`SglangDecodeStretch.plan`)."""
        if self.inbox or self.waiting or self.chunked_req is not None or self._awaiting is not None:
            return None
        running = self.running_batch
        reqs = running.reqs
        if not reqs or self.last_batch is not running:
            return None
        if self.limits.overlap:
            # the batch the device runs next must already be the decode batch of exactly these requests
            launched = self._launched
            if len(launched) != 1 or launched[0] is not self._last_step:
                return None
            first = launched[0]
            if first.mode != "decode" or first.reqs != tuple(reqs):
                return None
            return first.num_decode_context_tokens
        if self._launched:
            return None
        return sum(r.kv_committed_len for r in reqs)

    def run_decode_batches(self, reqs: Sequence[SglangRequest], num_batches: int) -> None:
        """`num_batches` more decode batches of `reqs` formed and their results processed, at once (a decode
        stretch; `steady_decode_context` held and the pool checked the room with `decode_batch_fits`): each
        request takes the slots of `num_batches` decode steps and samples as many tokens, none its last, and
        new_token_ratio decays once per batch."""
        pool = self.pool
        for r in reqs:
            pool.alloc_for_decode_steps(r, num_batches)
            r.num_output_tokens += num_batches
        self.ratio.decay_steps(num_batches)

    def resume_after_decode_batches(self, reqs: Sequence[SglangRequest]) -> None:
        """The loop after a decode stretch of `reqs` (`run_decode_batches` applied): under overlap the batch formed
        while the stretch's last one ran, the decode batch of `reqs`, is launched and is the last batch; without
        overlap nothing is in flight."""
        if self.limits.overlap:
            step = SglangStep.decode(reqs)
            self._launched.clear()
            self._launched.append(step)
            self._last_step = step

    # ------------------------------------------------------------------ get_next_batch_to_run
    def _get_next_batch_to_run(self) -> Batch | None:
        if self.tree.has_host_tier:
            self.tree.check_events(self._now_s)  # NOTE: HiCache acks first (`_process_hicache_events`)
        exclude: list[SglangRequest] = []
        chunked = self.chunked_req
        if chunked is not None:
            exclude.append(chunked)
            if chunked.extend_end > chunked.prefix_len:
                # NOTE: a middle chunk enters the tree at the start of the next pass (stash_chunked_request).
                self.pool.checkpoint_kv_cache(chunked)
        running = self.running_batch
        last = self.last_batch
        if last is not None and last.mode == "extend":
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            n = len(last.reqs)
            last.filter(exclude)
            if len(last.reqs) < n:
                running.batch_is_full = False
            if last.reqs and last is not running:
                if not running.reqs:
                    running = last
                else:
                    running.reqs = running.reqs + last.reqs
        n = len(running.reqs)
        running.filter()
        if len(running.reqs) < n:
            running.batch_is_full = False
        self.running_batch = running
        new_batch = self._get_new_batch_prefill(running)
        if new_batch is not None:
            return new_batch
        if running.reqs:
            decode = self._update_running_batch(running)
            return decode if decode is not None and decode.reqs else None
        return None

    def _num_allocatable_reqs(self, running_bs: int, held: int = 0) -> int:
        return min(self.limits.max_running_requests - running_bs, self.pool.available_rows() + held)

    def _get_new_batch_prefill(self, running: Batch) -> Batch | None:
        if not running.reqs:
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        if self._num_allocatable_reqs(len(running.reqs)) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting)
        adder = PrefillAdder(self.pool, running.reqs, self.ratio.current,
                             rem_input_tokens=self.limits.max_prefill_tokens,
                             rem_chunk_tokens=self.limits.chunked_prefill_size)
        continuing = self.chunked_req
        if continuing is not None:
            init_next_round_input(continuing, None)
            self.chunked_req = adder.add_chunked_req(continuing)
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(1 for r in adder.can_run_list if r.holds_kv)
            if len(adder.can_run_list) >= self._num_allocatable_reqs(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            init_next_round_input(req, self.tree)
            res = adder.add_one_req(req)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or bool(running.reqs)
                break
        if not adder.can_run_list:
            return None
        admitted = set(adder.can_run_list)
        self.waiting = [r for r in self.waiting if r not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = Batch(list(adder.can_run_list), mode="extend", chunked_req=self.chunked_req,
                      admitted=[r for r in adder.can_run_list if r is not continuing])
        self._prepare_for_extend(batch)
        return batch

    def _prepare_for_extend(self, batch: Batch) -> None:
        now = self._now_s
        for r in batch.reqs:
            if not r.retracted_stain:
                if r.num_cached_tokens is None:
                    r.num_cached_tokens = r.prefix_len
                    r.num_cpu_hit_tokens = r.host_loaded_length
                    r.admitted_s = now
                    self.stats.record(r.input_len, r.prefix_len, preempted=False)
                r.already_computed = r.extend_end
            elif r.is_retracted:
                self.stats.record(r.fill_len, r.prefix_len, preempted=True)
            r.is_retracted = False
        self.pool.alloc_for_extend(batch.reqs)

    # ------------------------------------------------------------------ decode
    def _reqs_finishing_inflight(self, batch: Batch) -> list[SglangRequest]:
        """Overlap only: requests of the in-flight (unprocessed) batch whose result will finish them by length."""
        if not self.limits.overlap or self.last_batch is None or self._last_step is None:
            return []
        queued = set(self._last_step.reqs)
        return [r for r in batch.reqs if r in queued and r.next_output_finishes_by_length()]

    def _update_running_batch(self, batch: Batch) -> Batch | None:
        initial_bs = len(batch.reqs)
        finishing = self._reqs_finishing_inflight(batch)
        batch.filter(finishing)
        if not batch.reqs:
            batch.batch_is_full = False
            return batch
        full = not self.pool.check_decode_mem(batch.reqs)
        if full and finishing:
            batch.batch_is_full = False
            return None
        if full:
            retracted, self.ratio.current = self._retract_decode(batch)
            self.waiting.extend(retracted)
            self._retracted_now = retracted
        else:
            self.ratio.decay_step()
        if len(batch.reqs) < initial_bs:
            batch.batch_is_full = False
        if not batch.reqs:
            return batch
        self.pool.alloc_for_decode(batch.reqs)
        batch.mode = "decode"
        return batch

    def _retract_decode(self, batch: Batch) -> tuple[list[SglangRequest], float]:
        """`retract_decode`: retract the requests with the fewest outputs (then the longest prompts) until the
        rest can decode, keeping at least one; returns them and the new ratio estimate."""
        reqs = batch.reqs
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].num_output_tokens, -reqs[i].input_len), reverse=True)
        retracted: list[SglangRequest] = []
        first = True
        while first or not self.pool.check_decode_mem([reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            req = reqs[order.pop()]
            self.pool.release_kv_cache(req, checkpoint=False)
            self.pool.evict_to_free_tokens(len(order) * RETRACT_DECODE_STEPS)
            _reset_for_retract(req)
            retracted.append(req)
        if len(order) <= 1 and not self.pool.check_decode_mem([reqs[i] for i in order]):
            last = reqs[order[-1]]
            raise RuntimeError(f"SGLang would abort request {last.request.request_id}: out of KV memory even after "
                               f"retracting every other request ({self.pool.available_size()} slots free)")
        batch.reqs = [reqs[i] for i in order]
        self.num_retractions += len(retracted)
        kept = batch.reqs
        ratio = (sum(r.num_output_tokens for r in kept) + RETRACT_DECODE_STEPS * len(kept)) / (
            sum(r.max_new_tokens for r in kept) + 1)
        return retracted, min(1.0, ratio)

    # ------------------------------------------------------------------ result processing
    def update_from_output(self, step: SglangStep, now_s: float) -> StepOutcome:
        """The batch the loop waited for is done: process its result (`process_batch_result_prefill/_decode`)."""
        if step is not self._awaiting:
            raise RuntimeError("SGLang scheduler: a result arrived for a batch the loop was not waiting for")
        first_token: list[SglangRequest] = []
        finished: list[SglangRequest] = []
        pool = self.pool
        if step.mode == "extend":
            for req in step.reqs:
                if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                    continue
                if req.inflight_middle_chunks > 0:
                    req.inflight_middle_chunks -= 1
                    continue
                self._append_token(req, now_s, first_token)
                if req.finished():
                    finished.append(req)
                    if req.hold_kv:
                        # NOTE: SGLang's disagg prefill caches the prompt (locked) and releases it after the transfer.
                        pool.checkpoint_kv_cache(req)
                        self.held.add(req)
                    else:
                        pool.release_kv_cache(req, checkpoint=True)
                else:
                    pool.checkpoint_kv_cache(req)
        else:
            for req in step.reqs:
                if self.limits.overlap and (req.finished() or req.is_retracted):
                    continue
                self._append_token(req, now_s, first_token)
                if req.finished():
                    finished.append(req)
                    pool.release_kv_cache(req, checkpoint=req.cache_on_finish)
        if self.prebuilt_first_tokens:
            first_token = self.prebuilt_first_tokens + first_token
            finished = [r for r in self.prebuilt_first_tokens if r.finished()] + finished
            for req in self.prebuilt_first_tokens:
                if req.finished():  # one output token: done at the prebuilt batch
                    pool.release_kv_cache(req, checkpoint=req.cache_on_finish)
            self.prebuilt_first_tokens = []
        for req in finished:
            req.finished_s = now_s
        self.last_batch = self._next_last_batch
        self._awaiting = self._next_last_batch = None
        return StepOutcome(first_token, finished)

    @staticmethod
    def _append_token(req: SglangRequest, now_s: float, first_token: list[SglangRequest]) -> None:
        req.num_output_tokens += 1
        if req.first_token_s is None:
            req.first_token_s = now_s
            first_token.append(req)
        req.update_finish_state()


def _reset_for_retract(req: SglangRequest) -> None:
    req.num_preemptions += 1
    req.prefix_len = 0
    req.last_node = None
    req.cache_protected_len = 0
    req.cache_inserted_len = 0
    req.num_matched_prefix_tokens = 0
    req.lock = None
    req.extend_end = None
    req.is_retracted = True
    req.retracted_stain = True
    req.inflight_middle_chunks = 0
    req.already_computed = 0
    req.kv_committed_len = 0
    req.host_hit_length = 0
    req.best_match_node = None
    req.host_loaded_length = 0
