"""The CPU tier's eviction policies, one class per file behind `base.CachePolicy`, as vLLM splits
`vllm/v1/kv_offload/cpu/policies/`. `CACHE_POLICIES` is the one registry: a policy is one class plus one line here."""

from __future__ import annotations

from sim.engines.vllm.offload.policies.arc import ArcPolicy
from sim.engines.vllm.offload.policies.base import CachePolicy, ChunkHash, ChunkStatus, RequestAccess
from sim.engines.vllm.offload.policies.lru import LruPolicy


def _registry(*classes: type[CachePolicy]) -> dict[str, type[CachePolicy]]:
    registry: dict[str, type[CachePolicy]] = {}
    for cls in classes:
        if not cls.name or cls.name in registry:
            raise RuntimeError(f"CPU eviction policy {cls.name!r} is empty or registered twice")
        registry[cls.name] = cls
    return registry


CACHE_POLICIES = _registry(LruPolicy, ArcPolicy)
"""`eviction_policy` (vLLM's `kv_connector_extra_config` `eviction_policy`; the scenario's
`engine.cpu_eviction_policy`) -> the policy class."""

__all__ = ["CACHE_POLICIES", "ArcPolicy", "CachePolicy", "ChunkHash", "ChunkStatus", "LruPolicy", "RequestAccess"]
