"""SGLang: RadixAttention (`radix_cache`, token identities in `tokens`), its scheduler and event loop
(`scheduler`, `schedule_policy`, `kv_pool`), behind `SglangEngine` (the engine interface, `sim.engines.interface`)."""

from sim.engines.sglang.engine import SglangEngine
from sim.engines.sglang.spec import SglangEngineSpec

__all__ = ["SglangEngine", "SglangEngineSpec"]
