"""vLLM 0.33.0's `ARCCachePolicy` for the CPU tier (`vllm/v1/kv_offload/cpu/policies/arc.py`, cited `ARC`): vLLM's four
OrderedDicts (T1, T2, B1, B2) and `target_t1_size` as they are. `ARC.touch` (`ARC` 99-114) is not mirrored: no
scheduler code calls it in 0.33.0 (only the tiering manager, rules doc §4.4)."""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from sim.engines.vllm.offload.policies.base import ChunkHash, ChunkStatus, RequestAccess


class ArcPolicy:
    """`ARCCachePolicy` (`ARC` 16-214). `chunks` is the manager's resident-chunk dict: the union of T1 and T2,
    holding the same `ChunkStatus` objects.

    Ordering (the manager's `arc_state()` reads it). Resident chunks are in exactly one of T1 (not
    reused yet) and T2 (reused), each an ordered list, LRU end first; B1 / B2 are ghost lists of chunks evicted
    from T1 / T2 (never resident, disjoint, each at most `num_chunks` long); `0 <= target_t1_size <= num_chunks`.
    * `prepare_store`: the request's store misses not seen by it before, tail of the offer first, adapt the target
      if they are ghosts: one in B1 raises it by `max(1, |B2|/|B1|)` (capped at num_chunks), one in B2 lowers it
      by `max(1, |B1|/|B2|)` (floored at 0), and the ghost moves to its list's MRU end (`ARC` 78-96, `CM`
      293-301). This happens before any eviction, even if the store then gets None. Granted chunks are appended
      to T1 in offer order and dropped from the ghosts (`ARC` 66-71), after the eviction.
    * Eviction, one victim at a time, scanning each list from its LRU end without restarting: T1's next
      evictable unprotected chunk while `|T1| - (taken from T1 so far) >= int(target_t1_size)`, else T2's, falling
      back to the other list; then the victims go to the MRU end of B1 / B2 in victim order and each ghost list
      is trimmed from its LRU end to `num_chunks` (`ARC` 150-214).
    * `request_finished`, over the observed chunks tail to head (the same order as LRU's commit): a chunk the
      request only inserted moves to the MRU end of its list; a chunk it reused (loaded, or re-offered while
      ready, and not inserted by it) moves from T1 to T2's MRU end, or to T2's MRU end (`ARC` 117-139).
      Observing a chunk (prepare_load / prepare_store) changes nothing by itself (`PB` 96-107), and neither do
      completions, pins or unpins (`PB` 154-160).
    * A failed store drops its chunk from T1 or T2 without any ghost entry (`ARC` 74-76); `reset_cache` clears
      all four lists and the target (`ARC` 142-147).
    """

    name: ClassVar[str] = "arc"
    __slots__ = ("chunks", "num_chunks", "t1", "t2", "b1", "b2", "target_t1_size")

    def __init__(self, chunks: dict[ChunkHash, ChunkStatus], num_chunks: int) -> None:
        self.chunks = chunks
        self.num_chunks = num_chunks
        self.t1: OrderedDict[ChunkHash, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[ChunkHash, ChunkStatus] = OrderedDict()
        self.b1: OrderedDict[ChunkHash, None] = OrderedDict()
        self.b2: OrderedDict[ChunkHash, None] = OrderedDict()
        self.target_t1_size: float = 0.0

    def on_access(self, access: RequestAccess, new: list[ChunkHash]) -> None:
        """ARC inherits the base no-op on_request_access (`PB` 96-107)."""

    def on_store_misses(self, access: RequestAccess, new: list[ChunkHash]) -> None:
        """The request's misses not told before adapt the target to ghost hits, tail of the offer first
        (`ARC` 92-96, `CM` 293-301)."""
        for h in reversed([h for h in new if h not in access.store_missed]):
            self._adapt_to_ghost_hit(h)

    def _adapt_to_ghost_hit(self, chunk_hash: ChunkHash) -> None:
        """`ARC._adapt_to_ghost_hit` (`ARC` 78-89), its expressions kept as they are (`max(1, ratio)` is the int 1
        when the ratio is at most 1; the cap is the int num_chunks)."""
        b1, b2 = self.b1, self.b2
        if chunk_hash in b1:
            delta = max(1, len(b2) / len(b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.num_chunks)
            b1.move_to_end(chunk_hash)
        elif chunk_hash in b2:
            delta = max(1, len(b1) / len(b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            b2.move_to_end(chunk_hash)

    def insert(self, chunk_hash: ChunkHash, access: RequestAccess) -> None:
        """`ARC.insert` (`ARC` 66-71): T1's MRU end, out of the ghost lists."""
        self.t1[chunk_hash] = self.chunks[chunk_hash]
        self.b1.pop(chunk_hash, None)
        self.b2.pop(chunk_hash, None)

    def evict(self, num: int, protected: set) -> list[ChunkHash]:
        """`ARC.evict` (`ARC` 150-214): the `num` victims in selection order, moved to the ghost lists, which are then
        trimmed to num_chunks. The caller checked that `num` evictable unprotected chunks exist; every one of them
        is reachable (the T1 and T2 scans only skip chunks that are not candidates), so the selection never fails
        here."""
        t1, t2 = self.t1, self.t2
        candidates: list[tuple[ChunkHash, bool]] = []  # (chunk, from T1)
        virtual_t1_size = len(t1)
        target = int(self.target_t1_size)
        # Monotonic scans from each list's LRU end (`ARC` 162-165).
        t1_iter = iter(t1.items())
        t2_iter = iter(t2.items())

        def next_candidate(entries) -> ChunkHash | None:
            for h, chunk in entries:
                if chunk.ref_cnt == 0 and h not in protected:
                    return h
            return None

        for _ in range(num):
            h = None
            from_t1 = False
            if virtual_t1_size >= target:
                h = next_candidate(t1_iter)
                if h is not None:
                    from_t1 = True
                    virtual_t1_size -= 1
            if h is None:
                h = next_candidate(t2_iter)
            if h is None:
                h = next_candidate(t1_iter)
                if h is None:
                    raise AssertionError("ARC eviction found fewer candidates than the evictable count promised")
                from_t1 = True
                virtual_t1_size -= 1
            candidates.append((h, from_t1))

        b1, b2 = self.b1, self.b2
        victims = []
        for h, from_t1 in candidates:
            if from_t1:
                del t1[h]
                b1[h] = None
            else:
                del t2[h]
                b2[h] = None
            victims.append(h)
        for ghost in (b1, b2):
            for _ in range(len(ghost) - self.num_chunks):
                ghost.popitem(last=False)
        return victims

    def remove(self, chunk_hash: ChunkHash) -> None:
        """`ARC.remove` (`ARC` 74-76): a failed store leaves no ghost entry."""
        if self.t1.pop(chunk_hash, None) is None:
            self.t2.pop(chunk_hash, None)

    def on_request_finished(self, order: list[ChunkHash], access: RequestAccess) -> None:
        """`ARC.on_request_finished` (`ARC` 117-139) with `CM` 443-448's classification: insertion-only = inserted
        minus reused; `access.reused` never holds a chunk inserted before it was reused (`CM` 185-189)."""
        t1, t2 = self.t1, self.t2
        reused = access.reused
        insertion_only = access.inserted - reused
        for h in reversed(order):
            if h in insertion_only:
                # A store is not a frequency hit: keep the chunk's list, restore tail-to-head recency.
                if h in t1:
                    t1.move_to_end(h)
                elif h in t2:
                    t2.move_to_end(h)
                continue
            if h in reused:
                if h in t1:
                    t2[h] = t1.pop(h)  # NOTE: even if write-pending again (re-stored since it was reused)
                elif h in t2:
                    t2.move_to_end(h)

    def reset(self) -> None:
        """`ARC` 142-147."""
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.target_t1_size = 0.0

    def state(self) -> dict:
        return {"t1": list(self.t1), "t2": list(self.t2), "b1": list(self.b1), "b2": list(self.b2),
                "target_t1_size": float(self.target_t1_size)}

    def check(self) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        if t1.keys() & t2.keys() or (t1.keys() | t2.keys()) != self.chunks.keys():
            raise AssertionError("T1 and T2 must partition the resident chunks")
        if any(self.chunks[h] is not c for lst in (t1, t2) for h, c in lst.items()):
            raise AssertionError("T1/T2 hold a chunk object other than the resident one")
        if b1.keys() & b2.keys() or (b1.keys() | b2.keys()) & self.chunks.keys():
            raise AssertionError("ghost lists must be disjoint from each other and from the resident chunks")
        if len(b1) > self.num_chunks or len(b2) > self.num_chunks:
            raise AssertionError(f"ghost lists longer than {self.num_chunks}: {len(b1)}, {len(b2)}")
        if not 0 <= self.target_t1_size <= self.num_chunks:
            raise AssertionError(f"target_t1_size {self.target_t1_size} outside [0, {self.num_chunks}]")
