"""vLLM's KV offloading tier (0.33.0, `vllm/v1/kv_offload` and the `OffloadingConnector`), as a host (CPU) KV tier
of a vLLM worker (`engine.cpu_kv_bytes`): the CPU manager (`cpu_manager`) and its LRU or ARC policy (`policies`),
the connector's scheduler side (`connector`: lookup, deferrals, load and store jobs, flushes) and its copies in
simulated time (`transfers`).

Rules and source citations: docs/engines/vllm-0.33-offloading-rules.md; copy timing:
sim/timing/host-link.md.
"""

from sim.engines.vllm.offload.connector import ConnectorStep, OffloadCounters, OffloadingConnector, TransferJob
from sim.engines.vllm.offload.cpu_manager import (
    CpuManagerCounters,
    CpuOffloadingManager,
    LookupResult,
    PrepareStoreOutput,
)
from sim.engines.vllm.offload.transfers import HostTransfers

__all__ = ["ConnectorStep", "CpuManagerCounters", "CpuOffloadingManager", "HostTransfers", "LookupResult",
           "OffloadCounters", "OffloadingConnector", "PrepareStoreOutput", "TransferJob"]
