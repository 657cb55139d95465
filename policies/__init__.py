"""Routing policies. `ROUTERS` is the one registry: adding a router is one class plus one line here."""

from __future__ import annotations

from policies.base import RouterBase
from policies.kv_aware import KvAwareRouter
from policies.prefix_hash import PrefixHashRouter
from policies.preble import PrebleRouter
from policies.random_router import RandomRouter
from policies.recorded import RecordedRouter
from policies.round_robin import RoundRobinRouter
from policies.sglang_gateway import SglangCacheAwareRouter


def _registry(*classes: type[RouterBase]) -> dict[str, type[RouterBase]]:
    registry: dict[str, type[RouterBase]] = {}
    for cls in classes:
        if not cls.name or cls.name in registry:
            raise RuntimeError(f"router name {cls.name!r} is empty or registered twice")
        registry[cls.name] = cls
    return registry


ROUTERS = _registry(RandomRouter, RoundRobinRouter, PrefixHashRouter, KvAwareRouter, RecordedRouter, SglangCacheAwareRouter, PrebleRouter)

__all__ = ["ROUTERS"]
