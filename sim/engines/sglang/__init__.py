"""SGLang: RadixAttention (`radix_cache`, token identities in `tokens`), its scheduler and event loop
(`scheduler`, `schedule_policy`, `kv_pool`), behind `engine.SglangEngine` (the engine interface,
`sim.engines.interface`); `spec.SglangEngineSpec` is its scenario section."""
