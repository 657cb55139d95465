"""vLLM's KV offloading tier (0.33.0, `vllm/v1/kv_offload`): so far only the scheduler-side CPU manager
(`cpu_manager`), not yet wired into the engine.

Rules and source citations: benchmarks/vllm-oracle/offloading/vllm-0.33-offloading-rules.md.
"""

from sim.engines.vllm.offload.cpu_manager import (
    CpuManagerCounters,
    CpuOffloadingManager,
    LookupResult,
    PrepareStoreOutput,
)

__all__ = ["CpuManagerCounters", "CpuOffloadingManager", "LookupResult", "PrepareStoreOutput"]
