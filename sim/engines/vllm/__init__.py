"""vLLM v1: block prefix cache (`block_pool`, `kv_cache_manager`), step scheduler, decode stretches, behind
`VllmEngine` (the engine interface, `sim.engines.interface`)."""

from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec

__all__ = ["VllmEngine", "VllmEngineSpec"]
