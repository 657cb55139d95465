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
from sim.engines.sglang.scheduler import Scheduler, SglangStep
from sim.engines.stretch import MIN_STEPS, StretchTiming


def _new_pages(committed: int, num_steps: int, page_size: int) -> int:
    """Pages a request whose KV holds `committed` tokens takes over its next `num_steps` decode allocations (a new
    page whenever its committed length is a multiple of the page size)."""
    if num_steps <= 0:
        return 0
    return (committed + num_steps - 1) // page_size - (committed - 1) // page_size


class SglangDecodeStretch(StretchTiming):
    """`num_steps` decode batches of the scheduler's running requests from `start_s` (timing: `StretchTiming`)."""

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
        s = scheduler
        if s.inbox or s.waiting or s.chunked_req is not None or s._awaiting is not None:
            return None
        running = s.running_batch
        reqs = running.reqs
        if not reqs or s.last_batch is not running:
            return None
        overlap = s.limits.overlap
        if overlap:
            # the batch the device runs next must already be the decode batch of exactly these requests
            if len(s._launched) != 1 or s._launched[0] is not s._last_step:
                return None
            first = s._launched[0]
            if first.mode != "decode" or first.reqs != tuple(reqs):
                return None
            context = first.num_decode_context_tokens
        else:
            if s._launched:
                return None
            context = sum(r.kv_committed_len for r in reqs)
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
        # every batch formed in the stretch must find room without evicting (alloc_for_decode evicts below bs x P)
        pool, P, n = s.pool, s.pool.page_size, len(reqs)

        def fits(k: int) -> bool:  # the k-th formed batch still sees n x P free slots
            taken = sum(_new_pages(r.kv_committed_len, k - 1, P) for r in reqs)
            return pool.available_size() - P * taken >= n * P

        if not fits(MIN_STEPS):
            return None
        lo, hi = MIN_STEPS, steps
        while lo < hi:  # the largest k that fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        series = time_model.decode_steps(n, context)
        if series is None:
            return None
        first_s, growth_s = series
        return cls(s, now_s, first_s / speed, growth_s / speed, lo)

    def usage_after(self, k: int) -> float:
        """token_usage after k batches: each request takes `_new_pages(committed, d, P)` more private pages in the
        d = k - applied batches still to apply (as `apply` would), which leave the available slots."""
        d = min(k, self.num_steps) - self.applied
        pool = self.scheduler.pool
        taken = 0 if d <= 0 else sum(_new_pages(r.kv_committed_len, d, pool.page_size) for r in self.requests)
        return pool.token_usage(taken)

    def apply(self, k: int) -> None:
        """The requests after k batches: k more outputs each and k more formed batches' slots (overlap: the batches
        D_2..D_{k+1}; normal: D_1..D_k), and k decays of new_token_ratio."""
        k = min(k, self.num_steps)
        d = k - self.applied
        if d <= 0:
            return
        s = self.scheduler
        pool, P = s.pool, s.pool.page_size
        for r in self.requests:
            pages = _new_pages(r.kv_committed_len, d, P)
            r.private_pages += pages
            pool.private_pages += pages
            r.kv_committed_len += d
            r.kv_allocated_len += d
            r.num_output_tokens += d
        ratio = s.ratio
        current, decay, floor = ratio.current, ratio.decay, ratio.min
        for _ in range(d):  # NOTE: repeated, not multiplied, to round as stepping does
            current = max(current - decay, floor)
        ratio.current = current
        self.applied = k

    def finish(self, k: int) -> None:
        """End the stretch after k batches: under overlap the next batch (D_{k+1}) is the one launched."""
        self.apply(k)
        s = self.scheduler
        if s.limits.overlap:
            step = SglangStep.decode(self.requests)
            s._launched.clear()
            s._launched.append(step)
            s._last_step = step
