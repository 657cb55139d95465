"""Fast-forwarding a vLLM worker through decode-only steps: k identical-shape steps advanced as one event.

When a worker has nothing waiting (or nothing it can admit: `Scheduler.admission_stays_blocked`) and every
running request is decoding, the next steps are known in advance up to the step in which the first request samples
its last token: each step schedules one token per request, in running order, and only the block boundaries change
the cache (a request needs a new block every `block_size` tokens). The step time grows linearly with the steps
(`sim.engines.stretch`). Exactness is kept where it matters:

* blocks are allocated in the order step-by-step simulation would (by step, then running order), so the free
  queue and every eviction are the same; the stretch only starts if all the blocks it needs are free, so nothing
  can be preempted inside it;
* an arrival cuts the stretch after the step in progress, where the engine would have seen it;
* a router's peek first applies the steps already started (`apply(steps_started_by(now))`).
Only a worker alone on its device takes stretches (on a shared device other workers' steps change its speed). While
someone listens to the cache's events, `apply` replays the steps that change the cache one by one, in step order,
and publishes each step's events stamped with that step's end, as the engine would have (`_apply_publishing`).
"""

from __future__ import annotations

from sim.engines.interface import StepTimeModel
from sim.engines.stretch import MIN_STEPS, StretchTiming
from sim.engines.vllm.request_state import RequestState
from sim.engines.vllm.scheduler import Scheduler


class DecodeStretch(StretchTiming):
    """`num_steps` decode steps of the scheduler's running requests from `start_s` (timing: `StretchTiming`)."""

    __slots__ = ("scheduler", "requests", "computed0", "outputs0", "applied")

    def __init__(self, scheduler: Scheduler, start_s: float, first_step_s: float, step_growth_s: float,
                 num_steps: int) -> None:
        super().__init__(start_s, first_step_s, step_growth_s, num_steps)
        self.scheduler = scheduler
        self.requests: list[RequestState] = list(scheduler.running)
        self.computed0 = [r.num_computed_tokens for r in self.requests]
        self.outputs0 = [r.num_output_tokens for r in self.requests]
        self.applied = 0

    @classmethod
    def plan(cls, scheduler: Scheduler, time_model: StepTimeModel, *, speed: float, now_s: float,
             max_model_len: int) -> DecodeStretch | None:
        """A stretch for the scheduler's current state, or None when the next step is not a plain decode step.
        Requests may wait if their admission stays blocked through the stretch (`admission_stays_blocked`): the
        steps then look the waiting head up, fail and change nothing."""
        if not scheduler.running:
            return None
        waiting = scheduler.blocks_decode_stretch
        if waiting and scheduler.stalled_head is None:
            return None
        running = scheduler.running
        n = len(running)
        if n > scheduler.limits.max_num_batched_tokens:
            return None
        steps = None
        context = 0
        for r in running:
            c = r.num_computed_tokens
            request = r.request
            if request.prompt_tokens + r.num_output_tokens - c != 1 or c < request.prompt_tokens:
                return None  # a prefill (or recomputation) is in progress (num_tokens - c != 1)
            limit = request.output_tokens - r.num_output_tokens  # tokens still to sample, incl. this step's
            if max_model_len - 2 - c < limit:
                limit = max_model_len - 2 - c
            if steps is None or limit < steps:
                steps = limit
            context += c
        if steps is None or steps < MIN_STEPS:
            return None
        kv = scheduler.kv
        B = kv.block_size
        needed = 0
        for r in running:
            needed += -(-(r.num_computed_tokens + steps) // B) - len(r.block_ids)  # cdiv, inlined
        if needed > kv.num_free_blocks:
            return None  # a block may run out: step one at a time (and preempt as vLLM would)
        if waiting and not scheduler.admission_stays_blocked(steps):
            return None
        series = time_model.decode_steps(n, context)
        if series is None:
            return None  # no closed form for this time model
        first, growth = series
        return cls(scheduler, now_s, first / speed, growth / speed, steps)

    def finished(self) -> list[RequestState]:
        """The requests whose last token the applied steps sampled (only the stretch's last step can), in running
        order: the worker ends them at the end of that step, as `Scheduler.update_from_output` would."""
        if self.applied < self.num_steps:
            return []  # cut short: every request has more tokens to sample than the stretch has steps (`plan`)
        return [r for r in self.requests if r.num_output_tokens >= r.request.output_tokens]

    def _schedule_step(self, idx: int, j: int) -> None:
        """Request idx as the scheduler leaves it at step j: its counters, then its one slot (and the blocks that
        slot fills) through `allocate_slots`."""
        r = self.requests[idx]
        r.num_computed_tokens = self.computed0[idx] + j
        r.num_output_tokens = self.outputs0[idx] + j
        kv = self.scheduler.kv
        if not kv.allocate_slots(r, 1):
            raise RuntimeError(f"decode stretch: no block for request {r.request.request_id} at step {j}, "
                               f"although {kv.num_free_blocks} were checked free")

    def _apply_publishing(self, lo: int, k: int) -> None:
        """Steps lo..k-1 with KV events: a request's step j changes the cache only where its token starts a block
        ((c0 + j) % B == 0: an allocation, maybe evicting) or ends one ((c0 + j + 1) % B == 0: the block is cached).
        Those requests go through `allocate_slots` at step j, in running order, as a stepped engine schedules them;
        the step's events are published stamped with the step's end. Other steps change nothing but counters."""
        kv = self.scheduler.kv
        B = kv.block_size
        touched: dict[int, list[int]] = {}
        for idx, c in enumerate(self.computed0):
            for first in (lo + (-(c + lo)) % B, lo + (-(c + lo + 1)) % B):  # block starts, block ends
                for j in range(first, k, B):
                    touched.setdefault(j, []).append(idx)
        for j in sorted(touched):
            for idx in sorted(set(touched[j])):
                self._schedule_step(idx, j)
            kv.publish(self.start_s + self.elapsed_s(j + 1))

    def usage_after(self, k: int) -> float:
        """kv_cache_usage_perc after k steps: request r allocates a block at each step j with (c0 + j) % B == 0,
        i.e. floor((c0 + k - 1) / B) - floor((c0 + lo - 1) / B) of them in steps [lo, k); each takes one block off
        the free queue (evicting a cached one is still one fewer free)."""
        k, lo = min(k, self.num_steps), self.applied
        kv = self.scheduler.kv
        B = kv.block_size
        new = 0 if k <= lo else sum((c + k - 1) // B - (c + lo - 1) // B for c in self.computed0)
        return kv.usage(new)

    def apply(self, k: int) -> None:
        """Bring the requests and the cache to the state after the first k steps (idempotent, incremental)."""
        k = min(k, self.num_steps)
        lo = self.applied
        if k <= lo:
            return
        kv = self.scheduler.kv
        B = kv.block_size
        if kv.records_events:
            self._apply_publishing(lo, k)
        else:
            boundaries = []
            for idx, c in enumerate(self.computed0):
                first = lo + (-(c + lo)) % B  # first step >= lo that computes the first token of a new block
                if first < k:  # NOTE: most stretches are shorter than a block: none or one boundary a request
                    if first + B >= k:
                        boundaries.append((first, idx))
                    else:
                        boundaries.extend((j, idx) for j in range(first, k, B))
            if boundaries:
                boundaries.sort()
                for j, idx in boundaries:
                    self._schedule_step(idx, j)
        # NOTE: with events, every block that filled was cached (and its event published) at its own step, so the
        # caching here finds nothing new and records nothing.
        for r, c, out in zip(self.requests, self.computed0, self.outputs0):
            r.num_computed_tokens = c + k
            r.num_output_tokens = out + k
            if (c + k) // B > (c + lo) // B:  # a block filled in these steps (else caching is a no-op)
                kv.cache_full_blocks(r, c + k)
        self.applied = k
