"""Serving engines behind one interface (`sim.engines.interface`). `ENGINES` is the one registry: adding an engine is
one package (`sim/engines/<kind>/`: its spec, its cache and scheduler, its `Engine` class) plus one line here."""

from __future__ import annotations

from sim.engines.interface import Engine, EngineClass, HostLink
from sim.engines.sglang import SglangEngine
from sim.engines.vllm import VllmEngine


def _registry(*classes: EngineClass) -> dict[str, EngineClass]:
    registry: dict[str, EngineClass] = {}
    for cls in classes:
        if not cls.kind or cls.kind in registry:
            raise RuntimeError(f"engine kind {cls.kind!r} is empty or registered twice")
        registry[cls.kind] = cls
    return registry


ENGINES = _registry(VllmEngine, SglangEngine)


def build_engine(spec, *, kv_bytes_per_token: int, host_link: HostLink | None = None) -> Engine:
    """The engine of `spec.kind`, built from its spec; `host_link` times a host KV tier's copies, if it has one."""
    return ENGINES[spec.kind](spec, kv_bytes_per_token=kv_bytes_per_token, host_link=host_link)


__all__ = ["ENGINES", "Engine", "build_engine"]
