"""A device's link to host memory (PCIe, one copy engine per direction), on which a host KV tier's copies queue."""

from __future__ import annotations


class HostLinkQueue:
    """Copies between one device and host memory: each direction is one FIFO queue (the device's copy engines
    run host-to-device and device-to-host copies concurrently, each direction one copy at a time); a copy of n
    bytes takes `latency_s + n / bandwidth_bytes_per_s` once the copies queued before it in its direction are
    done. Workers sharing a device share its link. An `sim.engines.interface.HostLink`.
    """

    __slots__ = ("bandwidth_bytes_per_s", "latency_s", "_free_at_s")

    def __init__(self, *, bandwidth_bytes_per_s: float, latency_s: float) -> None:
        if bandwidth_bytes_per_s <= 0 or latency_s < 0:
            raise ValueError(f"host link needs bandwidth > 0 and latency >= 0, got {bandwidth_bytes_per_s}, "
                             f"{latency_s}")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.latency_s = latency_s
        self._free_at_s = [0.0, 0.0]  # [device -> host, host -> device]

    def copy_done_s(self, *, to_device: bool, start_s: float, num_bytes: int) -> float:
        d = int(to_device)
        done = max(start_s, self._free_at_s[d]) + self.latency_s + num_bytes / self.bandwidth_bytes_per_s
        self._free_at_s[d] = done
        return done
