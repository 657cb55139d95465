"""The CPU tier's eviction policies as the manager sees them (vLLM 0.33.0's `CachePolicy`,
`vllm/v1/kv_offload/cpu/policies/base.py`, cited `PB`): the records they share with the manager and the protocol
every policy implements.

The manager (`sim.engines.vllm.offload.cpu_manager.CpuOffloadingManager`) owns the resident chunks, their slots and
ref counts and the per-request observations; a policy owns the recency order and chooses victims. The manager tells
it, in this order within one call: a request's first observation of chunks (`on_access`), a store offer's misses
(`on_store_misses`, before any eviction), evictions (`evict`), granted stores (`insert`, after the eviction), failed
stores (`remove`), a request's end (`on_request_finished`) and `reset`. Completions, pins and unpins change no
recency (`PB` 154-160), so the policy is not told of them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

ChunkHash = Hashable


@dataclass(slots=True)
class ChunkStatus:
    """A resident chunk. `ref_cnt` is -1 while its store is in flight, else the number of loads reading it
    (vLLM `ChunkStatus`, policies/base.py 25-45)."""

    chunk_id: int
    ref_cnt: int = -1


@dataclass(slots=True)
class RequestAccess:
    """What one request has observed (vLLM `_RequestCacheAccess`, `CM` 35-46, plus the LRU `_RequestRank`)."""

    generation: int
    chunk_end_tokens: dict[ChunkHash, int] = field(default_factory=dict)
    observed: list[ChunkHash] = field(default_factory=list)
    """Chunks passed to prepare_load / prepare_store, in first-observation order."""
    seen: set[ChunkHash] = field(default_factory=set)
    inserted: set[ChunkHash] = field(default_factory=set)
    reused: set[ChunkHash] = field(default_factory=set)
    store_missed: set[ChunkHash] = field(default_factory=set)
    request_rank: int | None = None
    """Drawn from the global rank counter the first time the request touches the policy (`LRU` 51-61; LRU only)."""


class CachePolicy(Protocol):
    """One eviction policy of the CPU tier. `chunks` is the manager's dict of resident chunks, shared (the policy
    reads their ref counts and keys, never adds or removes one); `num_chunks` is the tier's capacity in chunks."""

    name: ClassVar[str]
    """The `eviction_policy` value that selects it."""

    def __init__(self, chunks: dict[ChunkHash, ChunkStatus], num_chunks: int) -> None: ...

    def on_access(self, access: RequestAccess, new: list[ChunkHash]) -> None:
        """The request observes `new` chunks for the first time (prepare_load / prepare_store, `PB` 96-107)."""
        ...

    def on_store_misses(self, access: RequestAccess, new: list[ChunkHash]) -> None:
        """A store offer's non-resident chunks (`access.store_missed` not yet updated with them)."""
        ...

    def insert(self, chunk_hash: ChunkHash, access: RequestAccess) -> None:
        """A store of `chunk_hash` was granted (the chunk is resident now, write-pending)."""
        ...

    def evict(self, num: int, protected: set) -> list[ChunkHash]:
        """Choose and forget `num` victims among the evictable (ref count 0) resident chunks not in `protected`,
        in eviction order. The caller checked that there are at least `num` of them, and removes them from
        `chunks` afterwards."""
        ...

    def remove(self, chunk_hash: ChunkHash) -> None:
        """A failed store: `chunk_hash` leaves the tier without being evicted."""
        ...

    def on_request_finished(self, order: list[ChunkHash], access: RequestAccess) -> None:
        """The request ended: commit its recency over the chunks it observed, `order` head to tail."""
        ...

    def reset(self) -> None:
        """Forget everything (`reset_cache`)."""
        ...

    def check(self) -> None:
        """Raise AssertionError if the policy's state is out of step with `chunks` (tests)."""
        ...
