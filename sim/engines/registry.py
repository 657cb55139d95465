"""The engine registry: `ENGINES` is the one literal registry of engines. Adding an engine is one package
(`sim/engines/<kind>/`: its spec, its cache and scheduler, its `Engine` class) plus one line here.

Each entry knows its scenario model (`Spec`, what a scenario's `engine:` section validates against) eagerly and its
engine class by name: the class, and with it the engine's whole cache and scheduler, is imported on the first
`build_engine` of its kind, so that reading a scenario or an interface type loads no engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass

from sim.engines.interface import Engine, EngineClass, EngineSpec, HostLink, SharedTier
from sim.engines.sglang.spec import SglangEngineSpec
from sim.engines.vllm.spec import VllmEngineSpec


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One engine: its `kind` (the scenario's `engine.kind`), its scenario model and where its class lives."""

    kind: str
    Spec: type
    engine_path: str
    """`module:Class` of the engine (an `EngineClass`), imported on first use."""

    def engine_class(self) -> EngineClass:
        module, _, name = self.engine_path.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if cls.kind != self.kind or cls.Spec is not self.Spec:
            raise RuntimeError(f"engine {self.engine_path} has kind {cls.kind!r} and spec {cls.Spec.__name__}; "
                               f"the registry says {self.kind!r} and {self.Spec.__name__}")
        return cls


def _registry(*entries: EngineEntry) -> dict[str, EngineEntry]:
    registry: dict[str, EngineEntry] = {}
    for entry in entries:
        if not entry.kind or entry.kind in registry:
            raise RuntimeError(f"engine kind {entry.kind!r} is empty or registered twice")
        registry[entry.kind] = entry
    return registry


ENGINES = _registry(
    EngineEntry("vllm", VllmEngineSpec, "sim.engines.vllm.engine:VllmEngine"),
    EngineEntry("sglang", SglangEngineSpec, "sim.engines.sglang.engine:SglangEngine"),
)


def build_engine(spec: EngineSpec, *, kv_bytes_per_token: int, host_link: HostLink | None = None,
                 shared_tier: SharedTier | None = None) -> Engine:
    """The engine of `spec.kind`, built from its spec; `host_link` times a host KV tier's copies, if it has one;
    `shared_tier` is the cluster-shared KV store and this worker's link to it, if the scenario has one."""
    cls = ENGINES[spec.kind].engine_class()
    if shared_tier is None:
        return cls(spec, kv_bytes_per_token=kv_bytes_per_token, host_link=host_link)
    return cls(spec, kv_bytes_per_token=kv_bytes_per_token, host_link=host_link, shared_tier=shared_tier)


def build_shared_store(spec: EngineSpec, *, kv_bytes_per_token: int) -> object:
    """The cluster-shared KV store of `spec` (one per cluster), built by its engine class; ValueError for an engine
    kind without one."""
    cls = ENGINES[spec.kind].engine_class()
    make = getattr(cls, "shared_store", None)
    if make is None:
        raise ValueError(f"engine.kind {spec.kind!r} has no cluster-shared KV tier in kvsim (only vllm)")
    return make(spec, kv_bytes_per_token)


def bind_peer_fetch(engines: Sequence[Engine], links: Sequence[HostLink]) -> None:
    """G2 peer fetch: give every engine the other engines' host tiers, in worker order, and its device's NIC
    (`links[i]` is engine i's)."""
    stores = [e.peer_store() for e in engines]
    for i, (engine, link) in enumerate(zip(engines, links, strict=True)):
        engine.bind_peers([s for j, s in enumerate(stores) if j != i], link)


__all__ = ["ENGINES", "EngineEntry", "bind_peer_fetch", "build_engine", "build_shared_store"]
