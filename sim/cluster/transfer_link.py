"""The KV transfer from a prefill worker to a decode worker (P/D disaggregation: NIXL reads over RDMA or NVLink)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class KvTransferLink:
    """One decode worker's inbound link (its NIC): transfers to it queue FIFO, one at a time; a transfer of n bytes
    requested at `start_s` completes at

        max(start_s, previous transfer's completion) + latency_s + overhead_s + n / bandwidth_bytes_per_s

    (`overhead_s`: the per-transfer cost beside the wire, e.g. NIXL's notification and descriptor setup). The
    prefill side's outbound link is not modelled (a prefill worker's transfers to different decode workers do not
    queue behind each other)."""

    __slots__ = ("bandwidth_bytes_per_s", "latency_s", "overhead_s", "_free_at_s")

    def __init__(self, *, bandwidth_bytes_per_s: float, latency_s: float, overhead_s: float) -> None:
        if bandwidth_bytes_per_s <= 0 or latency_s < 0 or overhead_s < 0:
            raise ValueError(f"a KV transfer link needs bandwidth > 0, latency >= 0 and overhead >= 0, got "
                             f"{bandwidth_bytes_per_s}, {latency_s}, {overhead_s}")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.latency_s = latency_s
        self.overhead_s = overhead_s
        self._free_at_s = 0.0

    def transfer_done_s(self, *, start_s: float, num_bytes: int) -> float:
        if num_bytes == 0:
            return start_s  # nothing to read: only the completion notice, which takes no link time here
        done = (max(start_s, self._free_at_s) + self.latency_s + self.overhead_s
                + num_bytes / self.bandwidth_bytes_per_s)
        self._free_at_s = done
        return done


@dataclass(slots=True)
class RemoteKv:
    """A `sim.engines.interface.RemoteKvSource`: one request's prompt KV, on `prefill_worker`, read over `link`;
    `on_read(done_s)` is told when the read will be complete (the prefill worker frees its blocks then)."""

    link: KvTransferLink
    kv_bytes_per_token: float
    """Bytes per token still to move when the decode side asks (layer-wise: one layer's)."""
    prefill_worker: int
    on_read: Callable[[float], object]

    def load_done_s(self, *, start_s: float, num_tokens: int) -> float:
        done_s = self.link.transfer_done_s(start_s=start_s, num_bytes=num_tokens * self.kv_bytes_per_token)
        self.on_read(done_s)
        return done_s
