"""A disaggregated replay's P/D figures (`PdFigures`), counted as its requests finish, in bounded memory."""

from __future__ import annotations

from sim.results.pd_figures import PdFigures
from sim.results.records import RequestRecord
from sim.results.streaming_stats import LogHistogram


class PdTally:
    """A disaggregated replay's P/D figures, counted request by request in memory that does not grow with the trace
    (`sim.results.streaming_stats`): the counts and the sums of the TTFT's parts are exact, the transfer's
    percentiles come from a log-spaced histogram (within 1 % of `PdFigures.of`'s exact ones over the same records).

    Every request counts in the TTFT split (a request prefilled locally on its decode worker has no transfer);
    only remote prefills count in the transfer's percentiles, as in `PdFigures.of`."""

    __slots__ = ("requests", "remote_prefill_requests", "transfer_tokens", "ttft_s", "queue_s", "prefill_s",
                 "transfer_s", "transfer_ms")

    def __init__(self) -> None:
        self.requests = 0
        self.remote_prefill_requests = 0
        self.transfer_tokens = 0
        self.ttft_s = self.queue_s = self.prefill_s = self.transfer_s = 0.0
        self.transfer_ms = LogHistogram()

    def add(self, r: RequestRecord) -> None:
        self.requests += 1
        self.ttft_s += r.ttft_s
        self.queue_s += r.ttft_queue_s
        self.prefill_s += r.ttft_prefill_s
        self.transfer_s += r.ttft_transfer_s
        if r.pd_prefill_worker != r.worker:
            self.remote_prefill_requests += 1
            self.transfer_tokens += r.transfer_tokens
            self.transfer_ms.add(r.ttft_transfer_s * 1000)

    def merge(self, other: PdTally) -> None:
        """Add `other`'s requests (another process's part of the same replay)."""
        self.requests += other.requests
        self.remote_prefill_requests += other.remote_prefill_requests
        self.transfer_tokens += other.transfer_tokens
        self.ttft_s += other.ttft_s
        self.queue_s += other.queue_s
        self.prefill_s += other.prefill_s
        self.transfer_s += other.transfer_s
        self.transfer_ms.merge(other.transfer_ms)

    def figures(self, *, prefill_workers: int, decode_workers: int, utilisation: tuple[float, float]) -> PdFigures:
        nan = float("nan")

        def mean_ms(total_s: float) -> float:
            return 1000 * total_s / self.requests if self.requests else nan

        other_s = self.ttft_s - self.queue_s - self.prefill_s - self.transfer_s
        return PdFigures(
            prefill_workers=prefill_workers, decode_workers=decode_workers,
            remote_prefill_requests=self.remote_prefill_requests, transfer_tokens=self.transfer_tokens,
            transfer_ms=(self.transfer_ms.percentile(50), self.transfer_ms.percentile(99)),
            ttft_mean_ms=(mean_ms(self.queue_s), mean_ms(self.prefill_s), mean_ms(self.transfer_s), mean_ms(other_s)),
            utilisation=utilisation,
        )
