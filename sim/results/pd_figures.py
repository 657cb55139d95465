"""A disaggregated run's own figures: how requests were prefilled, the KV transfers, the TTFT's parts, and how busy
each pool's devices were."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from sim.results.records import RequestRecord
from sim.results.stats import percentile


@dataclass(frozen=True, slots=True)
class PdFigures:
    """Over the measured requests of a disaggregated run (`summary.csv`'s `PD_COLUMNS`):

    * `remote_prefill_requests`: requests prefilled on a prefill worker (the rest were prefilled locally on their
      decode worker: conditional disaggregation); `transfer_tokens`: prompt tokens moved, summed;
    * `transfer_p50_ms` / `transfer_p99_ms`: the transfer's duration (start to end on the decode worker's link) over
      the remote prefills;
    * `ttft_{queue,prefill,transfer,other}_mean_ms`: the mean TTFT split into engine queues, the prefill, the
      transfer, and the rest (hops, overheads, the decode worker's last-token step); the four sum to the mean TTFT;
    * `{prefill,decode}_utilisation`: the pool's device busy time over (devices x the measured phase).
    """

    prefill_workers: int
    decode_workers: int
    remote_prefill_requests: int
    transfer_tokens: int
    transfer_ms: tuple[float, float]
    ttft_mean_ms: tuple[float, float, float, float]
    utilisation: tuple[float, float]

    @classmethod
    def of(cls, measured: tuple[RequestRecord, ...], *, prefill_workers: int, decode_workers: int,
           utilisation: tuple[float, float]) -> PdFigures:
        remote = [r for r in measured if r.pd_prefill_worker != r.worker]
        transfers = sorted(r.ttft_transfer_s for r in remote)
        nan = float("nan")

        def mean_ms(values: list[float]) -> float:
            return 1000 * fmean(values) if values else nan

        queue = [r.ttft_queue_s for r in measured]
        prefill = [r.ttft_prefill_s for r in measured]
        transfer = [r.ttft_transfer_s for r in measured]
        other = [r.ttft_s - q - p - t for r, q, p, t in zip(measured, queue, prefill, transfer)]
        return cls(
            prefill_workers=prefill_workers, decode_workers=decode_workers,
            remote_prefill_requests=len(remote), transfer_tokens=sum(r.transfer_tokens for r in remote),
            transfer_ms=tuple(1000 * percentile(transfers, q) if transfers else nan for q in (50, 99)),
            ttft_mean_ms=(mean_ms(queue), mean_ms(prefill), mean_ms(transfer), mean_ms(other)),
            utilisation=utilisation,
        )

    def row(self) -> dict[str, float | int]:
        queue, prefill, transfer, other = self.ttft_mean_ms
        return {
            "prefill_workers": self.prefill_workers,
            "decode_workers": self.decode_workers,
            "remote_prefill_requests": self.remote_prefill_requests,
            "transfer_tokens": self.transfer_tokens,
            "transfer_p50_ms": self.transfer_ms[0],
            "transfer_p99_ms": self.transfer_ms[1],
            "ttft_queue_mean_ms": queue,
            "ttft_prefill_mean_ms": prefill,
            "ttft_transfer_mean_ms": transfer,
            "ttft_other_mean_ms": other,
            "prefill_utilisation": self.utilisation[0],
            "decode_utilisation": self.utilisation[1],
        }

