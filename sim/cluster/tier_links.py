"""The KV tiers a worker's engine is built with, per device: its host link and its way to the cluster-shared store."""

from __future__ import annotations

from sim.cluster.host_link import HostLinkQueue
from sim.cluster.network_link import NetworkLinkQueue, StoreBandwidth
from sim.engines.interface import EngineSpec, SharedTier
from sim.engines.registry import build_shared_store
from sim.scenario import DeviceSpec, Scenario


class TierLinks:
    """Tier links for the workers of one engine spec: the cluster-shared store (one for the cluster, built here when
    the spec has `shared_kv_bytes`), and per device its host link (`HostLinkQueue`, when the spec has a host tier)
    and its NIC to the store (`NetworkLinkQueue`, queued also on the store's aggregate bandwidth if set). Call once
    per device: the workers sharing a device share its links."""

    def __init__(self, scenario: Scenario, spec: EngineSpec) -> None:
        self._scenario = scenario
        self._spec = spec
        self.shared_store = None
        self._store_bandwidth = None
        if getattr(spec, "shared_kv_bytes", 0):
            self.shared_store = build_shared_store(spec, kv_bytes_per_token=scenario.model.kv_bytes_per_token)
            if spec.shared_link.store_bandwidth is not None:
                self._store_bandwidth = StoreBandwidth(bandwidth_bytes_per_s=spec.shared_link.store_bandwidth)

    def host_link(self, dev: DeviceSpec) -> HostLinkQueue | None:
        if not getattr(self._spec, "cpu_kv_bytes", 0):
            return None
        bandwidth, latency = self._scenario.device_host_link(dev)
        return HostLinkQueue(bandwidth_bytes_per_s=bandwidth, latency_s=latency)

    def shared_tier(self, dev: DeviceSpec) -> SharedTier | None:
        if self.shared_store is None:
            return None
        bandwidth, latency, overhead = self._scenario.device_shared_link(dev)
        return SharedTier(self.shared_store, NetworkLinkQueue(
            bandwidth_bytes_per_s=bandwidth, latency_s=latency, overhead_s=overhead, store=self._store_bandwidth))
