"""vLLM 0.33.0's `LRUCachePolicy` for the CPU tier (`vllm/v1/kv_offload/cpu/policies/lru.py`, cited `LRU`): ranks
and vLLM's min-heap of them with lazy invalidation (`LRU` 66-99); an entry that cannot be evicted now (pinned,
write-pending or protected) goes back on the heap at its rank."""

from __future__ import annotations

import heapq
from typing import ClassVar

from sim.engines.vllm.offload.policies.base import ChunkHash, ChunkStatus, RequestAccess

Rank = tuple[int, int]


class LruPolicy:
    """`LRUCachePolicy` (`LRU` 26-233): a rank per resident chunk, the least evictable one evicted first.
    `chunks` is the manager's resident-chunk dict (LRU needs no capacity: `num_chunks` is not used).

    Ordering. Every chunk has a rank; the evictable chunk with the smallest `(rank, chunk_hash)` is evicted
    first. Ranks are drawn from one counter that only increases:
    * `insert` (a store is granted): `(request_rank, -end_token)`, so within a request tails go before heads, and
      a request that first touched the policy earlier goes before a later one. A chunk with no end token known
      gets a fresh `(counter, 0)`.
    * A request's first observation of a resident chunk raises it to `(request_rank, -end_token)` if that is
      higher: a provisional rank while the request runs (`LRU` 133-153).
    * `request_finished` commits: every chunk the request observed, head to tail by end token, gets fresh ranks
      assigned tail first, so its head ends most recent (`LRU` 155-164).
    NOTE: a running request's provisional rank can be older than a just-finished request's commit, so the
    running request's chunks are evicted first (offloading/README.md, self-test 3).
    """

    name: ClassVar[str] = "lru"
    __slots__ = ("chunks", "ranks", "heap", "next_rank")

    def __init__(self, chunks: dict[ChunkHash, ChunkStatus], num_chunks: int) -> None:
        self.chunks = chunks
        self.ranks: dict[ChunkHash, Rank] = {}
        self.heap: list[tuple[Rank, ChunkHash]] = []
        """Every rank a chunk was given, least first; an entry whose rank is no longer the chunk's is stale
        (vLLM's lazy-invalidation heap, `LRU` 66-99)."""
        self.next_rank = 0

    def _request_rank(self, access: RequestAccess) -> int:
        if access.request_rank is None:
            self.next_rank += 1
            access.request_rank = self.next_rank
        return access.request_rank

    def _set_rank(self, chunk_hash: ChunkHash, rank: Rank) -> None:
        self.ranks[chunk_hash] = rank
        heapq.heappush(self.heap, (rank, chunk_hash))
        if len(self.heap) > 4 * len(self.ranks) + 64:
            # NOTE: compaction: stale entries (re-ranked or evicted chunks) would otherwise pile up.
            self.heap = [(r, h) for h, r in self.ranks.items()]
            heapq.heapify(self.heap)

    def on_access(self, access: RequestAccess, new: list[ChunkHash]) -> None:
        """A request's first observation of chunks (`LRU` on_request_access 133-153)."""
        # NOTE: the request rank is drawn here even if none of the chunks is resident (`LRU` 138).
        request_rank = self._request_rank(access)
        for h in new:
            end_token = access.chunk_end_tokens.get(h)
            if end_token is None or h not in self.chunks:
                continue
            rank = (request_rank, -end_token)
            if self.ranks[h] < rank:
                self._set_rank(h, rank)

    def on_store_misses(self, access: RequestAccess, new: list[ChunkHash]) -> None:
        """NOTE: LRU inherits on_store_miss -> touch, which re-ranks only resident chunks (`LRU` 129-131, 63-68),
        and misses are never resident: a no-op."""

    def insert(self, chunk_hash: ChunkHash, access: RequestAccess) -> None:
        end_token = access.chunk_end_tokens.get(chunk_hash)
        if end_token is None:
            self.next_rank += 1
            self._set_rank(chunk_hash, (self.next_rank, 0))
        else:
            self._set_rank(chunk_hash, (self._request_rank(access), -end_token))

    def evict(self, num: int, protected: set) -> list[ChunkHash]:
        """The `num` evictable, unprotected chunks of least rank, in rank order (the caller checked there are
        enough), forgotten here. Ranks are unique, so ties never compare hashes."""
        heap, ranks, chunks = self.heap, self.ranks, self.chunks
        victims: list[ChunkHash] = []
        chosen: set[ChunkHash] = set()
        kept: list[tuple[Rank, ChunkHash]] = []
        while len(victims) < num:
            rank, h = heapq.heappop(heap)
            if ranks.get(h) != rank or h in chosen:
                continue  # stale (re-ranked since, or gone), or a duplicate entry of one rank given twice
            if chunks[h].ref_cnt != 0 or h in protected:
                kept.append((rank, h))  # not evictable now, but may be later at this same rank
                continue
            victims.append(h)
            chosen.add(h)
        for entry in kept:
            heapq.heappush(heap, entry)
        for h in victims:
            del ranks[h]
        return victims

    def remove(self, chunk_hash: ChunkHash) -> None:
        del self.ranks[chunk_hash]

    def on_request_finished(self, order: list[ChunkHash], access: RequestAccess) -> None:
        """Fresh ranks, tail first (`LRU` 155-164)."""
        for h in reversed(order):
            if h in self.chunks:  # evicted or failed stores draw no rank (`LRU` _assign_new_rank)
                self.next_rank += 1
                self._set_rank(h, (self.next_rank, 0))

    def reset(self) -> None:
        self.ranks.clear()
        self.heap.clear()
        self.next_rank = 0

    def order(self) -> list[ChunkHash]:
        return [h for _, h in sorted((r, h) for h, r in self.ranks.items())]

    def check(self) -> None:
        if self.chunks.keys() != self.ranks.keys():
            raise AssertionError("ranks out of step with chunks")
