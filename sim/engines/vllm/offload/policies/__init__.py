"""The CPU tier's eviction policies, one class per file behind `base.CachePolicy`, as vLLM splits
`vllm/v1/kv_offload/cpu/policies/`. `CACHE_POLICIES` is the one registry: a policy is one class plus one line here."""

from __future__ import annotations

from sim.engines.vllm.offload.policies.arc import ArcPolicy
from sim.engines.vllm.offload.policies.base import CachePolicy, ChunkHash, ChunkStatus, RequestAccess
from sim.engines.vllm.offload.policies.lru import LruPolicy

_CLASSES: tuple[type[CachePolicy], ...] = (LruPolicy, ArcPolicy)
CACHE_POLICIES: dict[str, type[CachePolicy]] = {cls.name: cls for cls in _CLASSES}
"""`eviction_policy` (vLLM's `kv_connector_extra_config` `eviction_policy`; the scenario's
`engine.cpu_eviction_policy`) -> the policy class."""
if len(CACHE_POLICIES) != len(_CLASSES) or "" in CACHE_POLICIES:
    raise RuntimeError(f"a CPU eviction policy name is empty or registered twice: {[c.name for c in _CLASSES]}")

__all__ = ["CACHE_POLICIES", "ArcPolicy", "CachePolicy", "ChunkHash", "ChunkStatus", "LruPolicy", "RequestAccess"]
