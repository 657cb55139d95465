"""vLLM v1's block pool: physical KV blocks, their reference counts, the prefix-cache map and the free queue.

Mirrors `vllm/v1/core/block_pool.py` (`BlockPool`, `FreeKVCacheBlockQueue`, `BlockHashToBlockMap`).
Block ids are plain ints; per-block state lives in lists indexed by block id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from itertools import compress, islice, repeat, takewhile
from operator import is_, is_not, itemgetter, not_, sub

from sim.engines.interface import CacheEvent
from sim.workloads.request import BlockHash

NULL_BLOCK_ID = 0
_is_cached = partial(is_not, None)
"""True for anything but None (a C-level predicate): a block's hash, which may be a falsy 0, or no hash."""
_is_none = partial(is_, None)
_BATCH_MIN_BLOCKS = 8
"""Allocations and frees of at least this many blocks run as passes over the whole batch that run in C; a decode
step's one block keeps the plain loop, whose set-up is cheaper. At least 2."""
_TRIM_MIN_ENTRIES = 4096
"""The free queue's consumed entries are dropped once there are at least this many and they are half its list."""
_COMPACT_POOL_MULTIPLE = 4
_COMPACT_SLACK = 64
"""The free queue is compacted once its stale entries outnumber its free blocks by more than
`_COMPACT_POOL_MULTIPLE` x the pool's blocks + `_COMPACT_SLACK`: its length stays within a few times the pool's, and
a compaction (a pass over the queue in Python) comes at most once per that many touches."""


class BlockPool:
    """Fixed pool of `num_blocks` KV blocks; block 0 is vLLM's null block and is never handed out.

    Invariants (checked by `check_invariants`, relied on everywhere):
    * A block is in the free queue **iff** its ref count is 0 and it is not the null block.
    * The free queue's head is the next block to allocate; its tail is the most recently freed cached block.
      Initially it holds ids 1..num_blocks-1 in id order.
    * A block with a hash is registered in the cache map under that hash, whether it is held (ref > 0) or
      free (ref == 0, an *evictable* cached block). Eviction is lazy: a cached block loses its hash only when
      it reaches the head of the free queue and is reallocated.
    * Identical blocks are not de-duplicated (vLLM block tables are append-only). Several blocks may carry the
      same hash; lookups return the first one registered that is still cached.

    Free order: `free()` takes a request's blocks in the order given (callers pass them tail block first).
    A block whose ref count reaches 0 goes to the **tail** of the queue if it has a hash; without a hash it goes
    to the **head** when `unhashed_to_head` (vLLM >= 0.24, PR #42656) and to the tail otherwise (<= 0.23).

    The free queue is a list read from a head index (`_free[_head:]`, head first) with lazy removal: a block
    leaving it from the middle (a hit on an evictable cached block, `touch`) stays in it as a stale entry, counted
    in `_stale[block]`, and the pop that reaches it skips it. A block's stale entries always precede its live one:
    only a cached block is touched out of the queue, it keeps its hash while held, so it comes back at the tail.
    The queue is compacted when stale entries outnumber the free blocks by a few times the pool's size
    (`_COMPACT_POOL_MULTIPLE`). Popping n blocks is a slice and a move of the head (a deque pops one at a time;
    an OrderedDict's pops cost several times a deque's, and allocation is the hottest loop of a replay); a group
    prepended goes into the consumed slots before the head, and the consumed prefix is dropped once it is at
    least half the list (`_TRIM_MIN_ENTRIES`), so memory stays within twice the queue.

    Events: the pool owns the queue of cache events not yet published, in emission order, as vLLM's `BlockPool`
    owns its `kv_event_queue`. Recording is off (and costs nothing) until `enable_events` (a subscriber,
    `sim.engines.event_feed`; vLLM's `enable_kv_cache_events`). The pool queues a `removed` event per evicted block,
    in eviction order (vLLM `_maybe_evict_cached_block`), and the `stored` event of each caching pass the cache
    manager reports (`record_stored`); `take_events` hands the queue out and starts a new one.
    """

    __slots__ = (
        "num_blocks",
        "unhashed_to_head",
        "_ref_cnt",
        "_hash",
        "_free",
        "_head",
        "_num_free",
        "_stale",
        "_num_stale",
        "_cached",
        "_duplicates",
        "num_evicted_blocks",
        "block_size",
        "records_events",
        "_events",
    )

    def __init__(self, num_blocks: int, *, unhashed_to_head: bool = True, block_size: int = 0) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.unhashed_to_head = unhashed_to_head
        self._ref_cnt = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._free: list[int] = list(range(1, num_blocks))
        """The free queue from `_head` on, head first, with stale entries (see the class notes)."""
        self._head = 0
        """Index in `_free` of the queue's head; the entries before it are consumed."""
        self._num_free = num_blocks - 1
        self._stale = [0] * num_blocks
        """Stale entries of each block in `_free` (ahead of its live one, if any)."""
        self._num_stale = 0
        self._cached: dict[BlockHash, int] = {}
        self._duplicates: dict[BlockHash, list[int]] = {}
        self.num_evicted_blocks = 0
        self.block_size = block_size
        """Tokens per block (only for the events' `block_size`)."""
        self.records_events = False
        """Whether events are queued (read-only: `enable_events` turns it on)."""
        self._events: list[CacheEvent] = []
        """Cache events not yet taken, in emission order (empty while not recording)."""

    # ------------------------------------------------------------------ queries (no side effects)
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Free-queue length: never-used, unhashed and evictable cached blocks alike (vLLM's `get_num_free_blocks`)."""
        return self._num_free

    def usage(self, num_blocks_taken: int = 0) -> float:
        """vLLM's `get_usage` (`kv_cache_usage_perc`): the fraction of usable blocks out of the free queue, so
        evictable cached blocks count as free; with `num_blocks_taken`, as it will be once that many more blocks
        have left the queue (evicting a cached block is still one fewer free)."""
        return 1.0 - (self._num_free - num_blocks_taken) / (self.num_blocks - 1)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached) + sum(len(v) for v in self._duplicates.values())

    def cached_hashes(self) -> set[BlockHash]:
        """Every hash some block is cached under. A peek: changes nothing."""
        return set(self._cached)

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        return self._cached.get(block_hash)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref_cnt[block_id]

    def block_hash(self, block_id: int) -> BlockHash | None:
        return self._hash[block_id]

    def free_queue(self) -> list[int]:
        """Block ids in allocation order (head first)."""
        stale = self._stale.copy()
        out = []
        for b in islice(self._free, self._head, None):
            if stale[b]:
                stale[b] -= 1
            else:
                out.append(b)
        return out

    def lookup(self, block_hashes: Iterable[BlockHash]) -> list[int | None]:
        """The block cached under each hash, or None. A peek: changes nothing."""
        return list(map(self._cached.get, block_hashes))

    def leading_cached_blocks(self, block_hashes: Iterable[BlockHash]) -> list[int]:
        """The blocks cached under the leading hashes, up to the first hash that is not cached. A peek."""
        # NOTE: takewhile over map stops at the first miss and runs in C: a long prompt whose prefix breaks early
        # (its context was computed on another worker, or evicted) costs no lookups past the break. A cached block
        # id is never 0 (the null block), so `bool` tells it from None, at a cheaper call than `is not None`.
        return list(takewhile(bool, map(self._cached.get, block_hashes)))

    def cached_mask(self, block_hashes: Iterable[BlockHash]) -> list[bool]:
        """Whether each hash is cached. A peek: changes nothing."""
        return list(map(self._cached.__contains__, block_hashes))

    def num_leading_cached(self, block_hashes: Iterable[BlockHash]) -> int:
        """How many of `block_hashes`, from the first, are cached before the first that is not. A peek."""
        # NOTE: takewhile(bool, map(...)) stops at the first miss and runs in C: no work past it.
        return len(list(takewhile(bool, map(self._cached.__contains__, block_hashes))))

    # ------------------------------------------------------------------ mutations
    def num_evictable(self, block_ids: Sequence[int]) -> int:
        """How many of `block_ids` are free (ref 0: in the free queue, so taking them takes free blocks). A peek."""
        if len(block_ids) > 1:
            return itemgetter(*block_ids)(self._ref_cnt).count(0)
        return sum(self._ref_cnt[b] == 0 for b in block_ids)

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on hit blocks; a block at ref 0 leaves the free queue (and so cannot be evicted)."""
        ref, stale = self._ref_cnt, self._stale
        n = len(block_ids)
        left = itemgetter(*block_ids)(ref).count(0) if n >= _BATCH_MIN_BLOCKS else -1
        if left == 0:
            # NOTE: a long hit is mostly all held (a shared prefix others run with) or all free (a context whose
            # request ended): each of those takes a plainer loop than the mixed case.
            for b in block_ids:
                ref[b] += 1
        elif left == n:
            for b in block_ids:
                ref[b] = 1
                stale[b] += 1
        else:
            left = 0
            for b in block_ids:
                if ref[b] == 0:
                    stale[b] += 1
                    left += 1
                ref[b] += 1
        if left:
            self._num_free -= left
            self._num_stale += left
            if self._num_stale > self._num_free + _COMPACT_POOL_MULTIPLE * self.num_blocks + _COMPACT_SLACK:
                self._compact()

    def _compact(self) -> None:
        """Drop the stale entries from the free queue (amortised: runs once stale entries outnumber free blocks)."""
        self._free = self.free_queue()
        self._head = 0
        self._stale = [0] * self.num_blocks
        self._num_stale = 0

    def _pop_free(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` live blocks off the head of the free queue, skipping stale entries."""
        self._num_free -= num_blocks
        free, head = self._free, self._head
        end = head + num_blocks
        out = free[head:end]
        if self._num_stale:
            stale = self._stale
            if (any(itemgetter(*out)(stale)) if num_blocks > 1 else stale[out[0]]):
                # NOTE: some popped entries are stale: keep the live ones in order and pop on until there are enough.
                live = []
                skipped = 0
                for b in out:
                    if stale[b]:
                        stale[b] -= 1
                        skipped += 1
                    else:
                        live.append(b)
                while len(live) < num_blocks:
                    b = free[end]
                    end += 1
                    if stale[b]:
                        stale[b] -= 1
                        skipped += 1
                    else:
                        live.append(b)
                self._num_stale -= skipped
                out = live
        if end >= _TRIM_MIN_ENTRIES and 2 * end >= len(free):
            # NOTE: amortised: the entries this moves are no more than those consumed since the last trim.
            del free[:end]
            end = 0
        self._head = end
        return out

    def get_new_blocks(self, num_blocks: int, cache_hashes: Sequence[BlockHash] = ()) -> list[int]:
        """Pop `num_blocks` from the head of the free queue, evicting any cached hash they still carry; the first
        `len(cache_hashes)` of them are then registered under those hashes (`cache_blocks`, in the same pass)."""
        if num_blocks > self._num_free:
            raise RuntimeError(f"cannot allocate {num_blocks} blocks: only {self._num_free} free")
        if num_blocks >= _BATCH_MIN_BLOCKS:
            return self._get_new_blocks_batch(num_blocks, cache_hashes)
        ref, hashes, cached, dups = self._ref_cnt, self._hash, self._cached, self._duplicates
        out = self._pop_free(num_blocks)
        removed: list[BlockHash] = []
        n_cache = len(cache_hashes)
        for i, b in enumerate(out):
            h = hashes[b]
            if h is not None:
                # NOTE: the common case inline (the block is its hash's only copy); duplicates take the long way.
                if not dups or h not in dups:
                    if cached.get(h) != b:
                        raise RuntimeError(f"block {b} carries hash {h!r} but is not registered under it")
                    del cached[h]
                else:
                    self._uncache(h, b)
                hashes[b] = None
                removed.append(h)
            ref[b] = 1
            if i < n_cache:
                # NOTE: registering before the next pop is equivalent to vLLM's pop-all-then-cache: should a later
                # popped block still carry this hash, its eviction promotes this block, the state vLLM ends in.
                new_hash = cache_hashes[i]
                hashes[b] = new_hash
                if new_hash in cached:
                    dups.setdefault(new_hash, []).append(b)
                else:
                    cached[new_hash] = b
        if removed:
            self._evicted(removed)
        return out

    def get_new_block(self) -> int:
        """`get_new_blocks(1)[0]` without a hash to register (a decode's next block), on a shorter path."""
        if not self._num_free:
            raise RuntimeError("cannot allocate 1 block: only 0 free")
        b = self._pop_free(1)[0]
        hashes = self._hash
        h = hashes[b]
        if h is not None:
            dups = self._duplicates
            if not dups or h not in dups:
                if self._cached.get(h) != b:
                    raise RuntimeError(f"block {b} carries hash {h!r} but is not registered under it")
                del self._cached[h]
            else:
                self._uncache(h, b)
            hashes[b] = None
            self._evicted((h,))
        self._ref_cnt[b] = 1
        return b

    def _get_new_blocks_batch(self, num_blocks: int, cache_hashes: Sequence[BlockHash]) -> list[int]:
        """`get_new_blocks` as passes over the whole batch that run in C: pop every block, evict the hashes they
        carry (in pop order), then register the new hashes, as vLLM's `get_new_blocks` then `cache_full_blocks` do.
        Same state and events as the block-by-block loop, which registers each block before popping the next: a
        new hash that a later popped block still carries is a duplicate there until that block's eviction promotes
        the first duplicate registered; here it is evicted first and the new block registered after the copies
        that were already duplicates, so the same block answers lookups and the same copies stay in the same
        order."""
        ref, hashes, cached, dups = self._ref_cnt, self._hash, self._cached, self._duplicates
        out = self._pop_free(num_blocks)
        old = itemgetter(*out)(hashes)
        removed: Sequence[BlockHash] = ()
        num_unhashed = old.count(None)
        if num_unhashed != num_blocks:
            if num_unhashed:
                removed = list(filter(_is_cached, old))
                evicted = list(compress(out, map(_is_cached, old)))
            else:
                removed, evicted = old, out  # NOTE: the common case once the cache is full: every block evicts.
            if not dups or dups.keys().isdisjoint(removed):
                # NOTE: a hash without duplicates is cached under its one block: evicting it is a pop.
                if list(map(cached.pop, removed, repeat(None, len(removed)))) != evicted:
                    raise RuntimeError("a popped block carries a hash it is not registered under")
            else:
                for b, h in zip(evicted, removed):
                    self._uncache(h, b)
        new = cache_hashes[:num_blocks] if len(cache_hashes) > num_blocks else cache_hashes
        n_cache = len(new)
        # NOTE: every popped block is taken once and loses any old hash; the first n_cache take the new ones.
        for b, h in zip(out, new):
            ref[b] = 1
            hashes[b] = h
        if n_cache < num_blocks:
            for b in out[n_cache:]:
                ref[b] = 1
            if removed:
                for b in out[n_cache:]:
                    hashes[b] = None
        if n_cache:
            size = len(cached)
            if cached.keys().isdisjoint(new):
                cached.update(zip(new, out))
            if len(cached) != size + n_cache:
                # NOTE: a new hash already cached (or repeated in the batch): the first registered keeps lookups.
                # No entry points into the batch but those registered just now: the popped blocks were evicted.
                taken = set(out)
                for h in new:
                    if cached.get(h) in taken:
                        del cached[h]
                for b, h in zip(out, new):
                    if h in cached:
                        dups.setdefault(h, []).append(b)
                    else:
                        cached[h] = b
        if removed:
            self._evicted(removed)
        return out

    def _evicted(self, removed: Sequence[BlockHash]) -> None:
        """Count the hashes `removed` by allocations and publish them: one BlockRemoved per evicted block, in
        eviction order, as vLLM emits them."""
        self.num_evicted_blocks += len(removed)
        if self.records_events:
            B = self.block_size
            self._events.extend([CacheEvent("removed", (h,), None, B) for h in removed])

    def cache_blocks(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash]) -> None:
        """`cache_block` for pairs of blocks and hashes, in order."""
        hashes, cached = self._hash, self._cached
        if (len(block_ids) >= _BATCH_MIN_BLOCKS and len(block_hashes) == len(block_ids)
                and itemgetter(*block_ids)(hashes).count(None) == len(block_ids)):
            # NOTE: the loop below in C when none of the hashes is cached yet (and none repeats).
            size = len(cached)
            if cached.keys().isdisjoint(block_hashes):
                cached.update(zip(block_hashes, block_ids))
                if len(cached) == size + len(block_ids):
                    for b, h in zip(block_ids, block_hashes):
                        hashes[b] = h
                    return
                for h in block_hashes:
                    cached.pop(h, None)
        for b, h in zip(block_ids, block_hashes):
            if hashes[b] is not None:
                raise RuntimeError(f"block {b} already carries hash {hashes[b]!r}")
            hashes[b] = h
            if h in cached:
                self._duplicates.setdefault(h, []).append(b)
            else:
                cached[h] = b

    def cache_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Register a newly full block under its hash (first registered wins lookups; duplicates are kept)."""
        if self._hash[block_id] is not None:
            raise RuntimeError(f"block {block_id} already carries hash {self._hash[block_id]!r}")
        self._hash[block_id] = block_hash
        if block_hash in self._cached:
            self._duplicates.setdefault(block_hash, []).append(block_id)
        else:
            self._cached[block_hash] = block_id

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the order given (callers pass a request's blocks tail first)."""
        ref, hashes, free = self._ref_cnt, self._hash, self._free
        if not isinstance(block_ids, list):
            block_ids = list(block_ids)
        if len(block_ids) >= _BATCH_MIN_BLOCKS:
            # NOTE: the loop below as passes that run in C (a request's blocks are distinct).
            refs = itemgetter(*block_ids)(ref)
            if refs.count(1) == len(refs):
                # NOTE: the common case: the request was the blocks' only holder.
                for b in block_ids:
                    ref[b] = 0
                released = block_ids
            else:
                left = list(map(sub, refs, [1] * len(refs)))
                if min(left) < 0:
                    raise RuntimeError(f"block {block_ids[left.index(min(left))]} freed more often than it was taken")
                for b, n in zip(block_ids, left):
                    ref[b] = n
                released = list(compress(block_ids, map(not_, left)))
        else:
            released = []
            for b in block_ids:
                n = ref[b] - 1
                ref[b] = n
                if n == 0:
                    released.append(b)
                elif n < 0:
                    raise RuntimeError(f"block {b} freed more often than it was taken")
        if not released:
            return
        self._num_free += len(released)
        if not self.unhashed_to_head:
            free.extend(released)
            return
        released_hashes = itemgetter(*released)(hashes) if len(released) > 1 else (hashes[released[0]],)
        if None not in released_hashes:
            free.extend(released)
            return
        free.extend(compress(released, map(_is_cached, released_hashes)))
        # NOTE: prepended as a group that keeps its given order, so the request's last unhashed block is reused first:
        # into the consumed slots before the head when there are enough of them.
        group = list(compress(released, map(_is_none, released_hashes)))
        head = self._head
        if head >= len(group):
            self._head = head - len(group)
            free[self._head:head] = group
        else:
            free[:head] = group
            self._head = 0

    # ------------------------------------------------------------------ events
    def enable_events(self) -> None:
        """Queue cache events from now on (idempotent)."""
        self.records_events = True

    def record_stored(self, block_hashes: tuple[BlockHash, ...], parent_hash: BlockHash | None) -> None:
        """Queue the `stored` event of one caching pass: `block_hashes` newly cached, in position order, after the
        block `parent_hash` (None: from the first block). Nothing while not recording."""
        if self.records_events:
            self._events.append(CacheEvent("stored", block_hashes, parent_hash=parent_hash,
                                           block_size=self.block_size))

    def take_events(self) -> list[CacheEvent]:
        """The events queued since the last call, in emission order, handed over (vLLM `BlockPool.take_events`);
        the pool starts a new queue."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def queued_events(self) -> tuple[CacheEvent, ...]:
        """The events queued and not yet taken, in emission order, without taking them (for observers that
        attribute events to the calls that recorded them)."""
        return tuple(self._events)

    def _uncache(self, block_hash: BlockHash, block_id: int) -> None:
        dups = self._duplicates.get(block_hash)
        if self._cached.get(block_hash) == block_id:
            if dups:
                self._cached[block_hash] = dups.pop(0)
                if not dups:
                    del self._duplicates[block_hash]
            else:
                del self._cached[block_hash]
        elif dups is not None and block_id in dups:
            dups.remove(block_id)
            if not dups:
                del self._duplicates[block_hash]
        else:
            raise RuntimeError(f"block {block_id} carries hash {block_hash!r} but is not registered under it")

    # ------------------------------------------------------------------ checking
    def check_invariants(self) -> None:
        """Raise if the pool's state is impossible (used by tests and property tests)."""
        ref, hashes = self._ref_cnt, self._hash
        queue = self.free_queue()
        if len(queue) != len(set(queue)) or len(queue) != self._num_free:
            raise AssertionError(f"free queue {queue} repeats a block or has not {self._num_free} blocks")
        if sum(self._stale) != self._num_stale or len(self._free) - self._head != self._num_free + self._num_stale:
            raise AssertionError("stale entries miscounted")
        in_queue = set(queue)
        if ref[NULL_BLOCK_ID] != 0 or NULL_BLOCK_ID in in_queue or hashes[NULL_BLOCK_ID] is not None:
            raise AssertionError("the null block was handed out, freed or cached")
        for b in range(1, self.num_blocks):
            in_free = b in in_queue
            if in_free != (ref[b] == 0):
                raise AssertionError(f"block {b}: ref_cnt={ref[b]} but in_free_queue={in_free}")
        registered: dict[int, BlockHash] = {b: h for h, b in self._cached.items()}
        for h, bs in self._duplicates.items():
            if h not in self._cached:
                raise AssertionError(f"duplicates of {h!r} without a primary block")
            for b in bs:
                registered[b] = h
        for b in range(1, self.num_blocks):
            if hashes[b] is not None and registered.get(b) != hashes[b]:
                raise AssertionError(f"block {b} has hash {hashes[b]!r} but is not registered under it")
        for b, h in registered.items():
            if hashes[b] != h:
                raise AssertionError(f"map says block {b} holds {h!r}, block says {hashes[b]!r}")
