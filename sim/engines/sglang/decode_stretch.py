"""Fast-forwarding an SGLang worker through decode-only batches: k identical decode batches advanced as one event.

When nothing waits and every running request is decoding, SGLang's loop repeats the same iteration: form the
decode batch of the running requests (`update_running_batch`: allocate one slot each, decay `new_token_ratio`),
then process a decode result (append a token each). Until a request is about to finish (or to leave the next
batch because its in-flight result finishes it by length), or memory would need an eviction, nothing else
happens, and the radix tree does not change at all. So k such batches are known in advance:

    overlap:  device runs D_1 .. D_k; batches D_2 .. D_{k+1} are formed meanwhile (D_1 was formed before)
    normal:   device runs D_1 .. D_k; each is formed right before it runs

and their times form an arithmetic series (`sim.engines.stretch`). The stretch stops one batch before the first
request's last token, so every finish, every exclusion and every admission is stepped as usual. An arrival cuts
the stretch after the batch in progress, where SGLang's next iteration would ingest it; the state is then the
stepped one exactly, the next batch (overlap: D_{j+1}) formed and launched. Checked against stepping in
`tests/engines/sglang/test_sglang_engine.py`.
"""

from __future__ import annotations

from sim.engines.interface import StepTimeModel
from sim.engines.sglang.request_state import SglangRequest
from sim.engines.sglang.scheduler import Scheduler
from sim.engines.stretch import MIN_STEPS, StretchTiming


class SglangDecodeStretch(StretchTiming):
    """`num_steps` decode batches of the scheduler's running requests from `start_s` (timing: `StretchTiming`).

    The scheduler decides whether its loop is in a steady decode state and advances it (`steady_decode_context`,
    `run_decode_batches`, `resume_after_decode_batches`); the pool answers for room and usage (`decode_batch_fits`,
    `pages_for_decode_steps`, `token_usage`). The stretch decides how many batches and tracks how many it applied.
    """

    __slots__ = ("scheduler", "requests", "applied")

    def __init__(self, scheduler: Scheduler, start_s: float, first_step_s: float, step_growth_s: float,
                 num_steps: int) -> None:
        super().__init__(start_s, first_step_s, step_growth_s, num_steps)
        self.scheduler = scheduler
        self.requests: tuple[SglangRequest, ...] = tuple(scheduler.running_batch.reqs)
        self.applied = 0

    @classmethod
    def plan(cls, scheduler: Scheduler, time_model: StepTimeModel, *, speed: float,
             now_s: float) -> SglangDecodeStretch | None:
        context = scheduler.steady_decode_context()
        if context is None:
            return None
        reqs = scheduler.running_batch.reqs
        steps = None
        for r in reqs:
            if r.finished() or r.is_retracted:
                return None
            stop = r.max_new_tokens if r.ignore_eos or r.eos_at is None else min(r.max_new_tokens, r.eos_at + 1)
            # NOTE: stop one batch before a request's last token: its finish (and, under overlap, its exclusion from
            # the batch formed while that result is in flight) is stepped.
            left = stop - r.num_output_tokens - 1
            steps = left if steps is None else min(steps, left)
        if steps is None or steps < MIN_STEPS:
            return None
        # every batch formed in the stretch must find room without evicting
        pool = scheduler.pool
        # NOTE: fitting is monotone in k (the batches before the k-th take more pages the larger k is); most stretches
        # fit whole, so that is asked first.
        if pool.decode_batch_fits(reqs, steps):
            lo = steps
        elif not pool.decode_batch_fits(reqs, MIN_STEPS):
            return None
        else:
            lo, hi = MIN_STEPS, steps - 1
            while lo < hi:  # the largest k that fits
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if pool.decode_batch_fits(reqs, mid) else (lo, mid - 1)
        series = time_model.decode_steps(len(reqs), context)
        if series is None:
            return None
        first_s, growth_s = series
        return cls(scheduler, now_s, first_s / speed, growth_s / speed, lo)

    def usage_after(self, k: int) -> float:
        """token_usage after k batches: the requests take more private pages in the k - applied batches still to
        apply (as `apply` would), which leave the available slots."""
        d = min(k, self.num_steps) - self.applied
        pool = self.scheduler.pool
        return pool.token_usage(pool.pages_for_decode_steps(self.requests, d))

    def apply(self, k: int) -> None:
        """The requests after k batches: k more outputs each and k more formed batches' slots (overlap: the batches
        D_2..D_{k+1}; normal: D_1..D_k), and k decays of new_token_ratio."""
        k = min(k, self.num_steps)
        d = k - self.applied
        if d <= 0:
            return
        self.scheduler.run_decode_batches(self.requests, d)
        self.applied = k

    def finish(self, k: int) -> None:
        """End the stretch after k batches: under overlap the next batch (D_{k+1}) is the one launched."""
        self.apply(k)
        self.scheduler.resume_after_decode_batches(self.requests)
