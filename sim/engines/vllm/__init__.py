"""vLLM v1: block prefix cache (`block_pool`, `kv_cache_manager`), step scheduler, decode stretches, behind
`engine.VllmEngine` (the engine interface, `sim.engines.interface`); `spec.VllmEngineSpec` is its scenario section."""
