"""A worker's network path to a cluster-shared KV store (Mooncake Store, an LMCache server, Dynamo's G3 storage),
on which the store's loads and stores queue."""

from __future__ import annotations


class StoreBandwidth:
    """The shared store's aggregate bandwidth per direction, one FIFO queue per direction for the whole cluster
    (Mooncake's or LMCache server's memory nodes serve every worker's copies): a copy of n bytes holds it for
    n / bandwidth once the copies queued before it in its direction are done."""

    __slots__ = ("bandwidth_bytes_per_s", "_free_at_s")

    def __init__(self, *, bandwidth_bytes_per_s: float) -> None:
        if bandwidth_bytes_per_s <= 0:
            raise ValueError(f"store bandwidth must be > 0, got {bandwidth_bytes_per_s}")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self._free_at_s = [0.0, 0.0]  # [into the store, out of the store]

    def done_s(self, *, to_device: bool, start_s: float, num_bytes: int) -> float:
        d = int(to_device)
        done = max(start_s, self._free_at_s[d]) + num_bytes / self.bandwidth_bytes_per_s
        self._free_at_s[d] = done
        return done


class NetworkLinkQueue:
    """Copies between one device and the shared store over the device's NIC: each direction is one FIFO queue; a
    copy of n bytes occupies it for `overhead_s + n / bandwidth_bytes_per_s` (the per-transfer cost: request set-up,
    registration, the store's metadata lookup) once the copies queued before it in its direction are done, and
    completes `latency_s` later (the network's latency is pipelined: it does not hold the queue). With `store`, the
    copy also queues on the store's aggregate bandwidth and completes when both are done (the slower path is the
    bottleneck). Workers sharing a device share its NIC. An `sim.engines.interface.HostLink`.
    """

    __slots__ = ("bandwidth_bytes_per_s", "latency_s", "overhead_s", "store", "_free_at_s")

    def __init__(self, *, bandwidth_bytes_per_s: float, latency_s: float, overhead_s: float = 0.0,
                 store: StoreBandwidth | None = None) -> None:
        if bandwidth_bytes_per_s <= 0 or latency_s < 0 or overhead_s < 0:
            raise ValueError(f"network link needs bandwidth > 0, latency >= 0 and overhead >= 0, got "
                             f"{bandwidth_bytes_per_s}, {latency_s}, {overhead_s}")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.latency_s = latency_s
        self.overhead_s = overhead_s
        self.store = store
        self._free_at_s = [0.0, 0.0]  # [device -> store, store -> device]

    def copy_done_s(self, *, to_device: bool, start_s: float, num_bytes: int) -> float:
        d = int(to_device)
        nic_done = max(start_s, self._free_at_s[d]) + self.overhead_s + num_bytes / self.bandwidth_bytes_per_s
        self._free_at_s[d] = nic_done
        done = nic_done
        if self.store is not None:
            done = max(done, self.store.done_s(to_device=to_device, start_s=start_s + self.overhead_s,
                                               num_bytes=num_bytes))
        return done + self.latency_s
