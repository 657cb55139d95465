"""SGLang 0.5.23's RadixAttention prefix cache: a radix tree of token segments with lock refs and leaf eviction.

Mirrors `python/sglang/srt/mem_cache/radix_cache.py` (`RadixCache`, `TreeNode`) operation for operation, with
kvsim's token identities (`sim.engines.sglang.tokens`) in place of token ids and a token count in place of the KV
index tensors (which slot holds a token changes no hit and no eviction). Checked against SGLang's own class by
`tests/engines/sglang/test_sglang_tree_oracle.py`.

Contract, as upstream:
* `match_prefix(key)` returns the longest cached prefix of the page-aligned key (a multiple of `page_size`
  tokens) and the node it ends in; if the match ends inside a node, that node is split there. Every node on the
  path gets the call's access time.
* `insert(key)` walks the same way (splitting where the key diverges inside a node), stamps the path, adds the
  rest of the key as one new leaf, and returns how many tokens were already there: their KV is a duplicate,
  which the caller frees.
* `inc_lock_ref(node)` / `dec_lock_ref(node)` count holders on every node from `node` up to the root; a node
  with holders is *protected*, otherwise *evictable*. `evictable_size + protected_size` = tokens in the tree.
* `evict(n)` pops evictable leaves (no children, no holders) smallest priority first (`evict_policy`), frees
  whole nodes until at least n tokens are freed or none is left, and pushes a parent that becomes an evictable
  leaf (so a cold branch is eaten from its tip towards the root). SGLang builds that heap from every evictable
  leaf at each call; this tree keeps one lazy heap across calls (see `RadixCache.evict`): the same leaves go, in
  the same order.
Times are ticks of a logical clock: SGLang uses `time.monotonic()`, of which only the order matters.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from operator import attrgetter

from sim.engines.interface import CacheEvent
from sim.engines.sglang.evict_policy import EVICTION_POLICIES, lru
from sim.engines.sglang.tokens import Tokens


_EVICT_SCANS = 4
"""Leaves an evict finds by scanning for the minimum before it builds SGLang's heap (see `RadixCache.evict`; only
for a policy whose priorities may fall, `mru`)."""
_last_access_time = attrgetter("last_access_time")

_PRIORITIES_NEVER_FALL = frozenset({"lru", "lfu", "fifo", "filo", "priority", "slru"})
"""Policies under which a node's (priority, id) never decreases while it lives: access times only grow (ticks),
hit counts and request priorities only rise (`+= 1`, `max`), creation times are fixed. Their trees keep a lazy heap
of leaves across evicts (`RadixCache.evict`); `mru`'s `-last_access_time` falls at every access, so it scans."""


def _eviction_order(priority: Callable[[TreeNode], object]) -> Callable[[TreeNode], tuple]:
    """`node -> (priority(node), node.id)`; for LRU an attrgetter, which builds the pair in C."""
    if priority is lru:
        return attrgetter("last_access_time", "id")
    return lambda node: (priority(node), node.id)


class TreeNode:
    """A segment of tokens below its parent. The root holds nothing and is always locked."""

    __slots__ = ("children", "parent", "key", "lock_ref", "last_access_time", "creation_time", "hit_count",
                 "priority", "id", "in_heap")

    evicted = False
    """No device copy: never, in the plain tree (a class attribute; `HiTreeNode` holds it per node). A lock moves
    only device tokens between evictable and protected."""

    def __init__(self, cache: RadixCache, priority: int = 0) -> None:
        self.children: dict[Hashable, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: Tokens = Tokens()
        self.lock_ref = 0
        # NOTE: two `time.monotonic()` calls upstream, in this order (`cache.tick()` twice, inlined: a node is made per
        # request chunk).
        clock = cache._clock
        self.last_access_time = clock + 1
        self.creation_time = cache._clock = clock + 2
        self.hit_count = 0
        self.priority = priority
        self.id = cache._node_ids = cache._node_ids + 1
        self.in_heap = False
        """Whether the tree's lazy leaf heap holds an entry for this node (at most one: see `RadixCache.evict`)."""

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref})"


class RadixCache:
    """One worker's radix tree (see the module docstring). `page_size` tokens per page; `eviction_policy` one of
    `EVICTION_POLICIES`. The tree owns its queue of cache events (`stored` per new node, `removed` per evicted node,
    page by page, `cleared` per reset, as SGLang's `KVCacheEventRecorder`): recording is off until `enable_events`,
    and `take_events` hands out what was queued since the last call."""

    has_host_tier = False
    """A host (CPU) tier beside the device (`HiRadixCache`): matches also report host-only tokens."""
    node_class = TreeNode
    """The class of the tree's nodes (a subclass's nodes carry its own state: `HiTreeNode`)."""

    def __init__(self, *, page_size: int = 1, eviction_policy: str = "lru") -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, got {eviction_policy!r}")
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        self._priority = EVICTION_POLICIES[eviction_policy]
        self._eviction_order = _eviction_order(self._priority)
        """A node's place in eviction order, (priority, id), as SGLang's heap entries compare."""
        self._clock = 0
        self._node_ids = 0
        self.records_events = False
        """Whether events are queued (read-only: `enable_events` turns it on)."""
        self._events: list[CacheEvent] = []
        """Cache events not yet taken, in emission order (empty while not recording)."""
        self.evictable_leaves: set[TreeNode] = set()
        self._leaf_heap: list[tuple[object, int, TreeNode]] | None = (
            [] if eviction_policy in _PRIORITIES_NEVER_FALL and not self.has_host_tier else None)
        """The lazy heap of `evict` ((priority, id, node) entries), or None where priorities may fall (`mru`) and in
        a tree with a host tier (`HiRadixCache` has its own leaves and evict)."""
        self.num_evicted_tokens = 0
        self.reset()

    # ------------------------------------------------------------------ clock and ids
    def tick(self) -> int:
        """The next logical time (one per `time.monotonic()` call upstream)."""
        self._clock += 1
        return self._clock

    def next_node_id(self) -> int:
        self._node_ids += 1
        return self._node_ids

    # ------------------------------------------------------------------ public API
    def reset(self) -> None:
        self.root_node = self.node_class(self, priority=-(1 << 62))
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves.clear()
        if self._leaf_heap:
            for _, _, node in self._leaf_heap:
                node.in_heap = False
            self._leaf_heap.clear()
        if self.records_events:
            self._events.append(CacheEvent("cleared"))

    def page_aligned(self, key: Tokens) -> Tokens:
        P = self.page_size
        if P == 1 or key.length % P == 0:
            return key
        return key.slice(0, key.length // P * P)

    def child_key(self, key: Tokens, offset: int = 0) -> Hashable:
        return key.page_key(offset, self.page_size)

    def _match_len(self, node_key: Tokens, key: Tokens, offset: int = 0) -> int:
        """`RadixKey.match_at`: leading tokens of `node_key` equal to `key`'s from `offset`, whole pages only."""
        n = node_key.match(key, offset)
        return n if self.page_size == 1 else n // self.page_size * self.page_size

    def match_prefix(self, key: Tokens) -> tuple[int, TreeNode]:
        """(matched tokens, last node) for the page-aligned `key`; splits the last node at the match's end."""
        key = self.page_aligned(key)
        if key.length == 0:
            return 0, self.root_node
        return self._match_prefix_helper(self.root_node, key)

    def touch_prefix(self, key: Tokens) -> None:
        """Refresh recency along `key`'s cached path (`RadixCache.touch_prefix`: a match that keeps nothing)."""
        key = self.page_aligned(key)
        if key.length:
            self._match_prefix_helper(self.root_node, key)

    def peek_prefix(self, key: Tokens) -> int:
        """Matched tokens of the page-aligned `key`, with no side effect (no split, no access time): a router's
        peek."""
        key = self.page_aligned(key)
        P, length = self.page_size, key.length
        node, matched = self.root_node, 0
        # NOTE: `child_key` and `_match_len` inlined (the walk's per-node cost is what a long context pays per node).
        # NOTE: `at` is where token `matched` lies in the key's runs, for the child's page and the match; the match
        # says where it ended, which is where the walk goes on when the node matched whole (a multiple of P).
        at = (0, 0)
        while matched < length:
            child = node.children.get(key.page_key_at(matched, P, at))
            if child is None:
                break
            n, at = child.key.match_located(key, at)
            if P > 1:
                n = n // P * P
            matched += n
            if n < child.key.length:
                break
            node = child
        return matched

    def insert(self, key: Tokens, *, priority: int = 0, inserted_len: int = 0) -> tuple[int, TreeNode]:
        """Insert the page-aligned `key`; returns (tokens already in the tree, last node)."""
        return self._insert_helper(self.root_node, self.page_aligned(key), priority, inserted_len)

    def checkpoint_insert(self, lock: TreeNode | None, lock_len: int, key: Tokens, *, prompt_len: int,
                          inserted_len: int) -> TreeNode:
        """What a request's checkpoint (`RadixCache.checkpoint`, `KvPool.checkpoint`) does to the tree, in SGLang's
        order: `insert(key, priority=0, inserted_len=inserted_len)`; if `0 < prompt_len < len(key)`, `insert(key[:
        prompt_len], priority=1, inserted_len=prompt_len)` (a node boundary at the prompt's end); `match_prefix(key)`
        (the path's stamps); the request's lock moved from `lock` (None: none) to the node `key` ends in, which is
        returned. `key` is page-aligned; `lock`, if any, is locked and its path holds `key`'s first `lock_len`
        tokens when `lock_len <= len(key)` (the inserts then walk down from it: a long context's path is mostly
        the request's locked prefix)."""
        if self.has_host_tier:
            # NOTE: a tree with more state hooks every node of the walk in order (`HiRadixCache._on_insert_path`)
            node = self.insert(key, priority=0, inserted_len=inserted_len)[1]
            if 0 < prompt_len < key.length:
                self.insert(key.slice(0, prompt_len), priority=1, inserted_len=prompt_len)
            node = self.match_prefix(key)[1]
            self.move_lock(lock, node)
            return node
        root = self.root_node
        anchor, anchor_len = (lock, lock_len) if lock is not None and lock is not root and lock_len <= key.length \
            else (root, 0)
        node = self._insert_under(anchor, anchor_len, key, 0, inserted_len)
        if 0 < prompt_len < key.length:
            # NOTE: the prompt's path is a prefix of `key`'s: it goes down from the deepest node above the anchor that
            # ends at or before the prompt's end (locked, as the anchor's ancestors are).
            while anchor_len > prompt_len:
                anchor_len -= anchor.key.length
                anchor = anchor.parent
            self._insert_under(anchor, anchor_len, key.slice(0, prompt_len), 1, prompt_len)
        # NOTE: the match's stamps (the last, so every stamp of the inserts on this path is overwritten: the inserts
        # skip the nodes above their anchor), walking up once, which also finds whether the old lock is on the path.
        if key.length:
            access_time = self.tick()
            on_path = False
            stamped = node
            while stamped is not None:
                stamped.last_access_time = access_time
                if stamped is lock:
                    on_path = True
                stamped = stamped.parent
        else:  # SGLang's match of an empty key stamps nothing: the insert's stamp of the root, where it ended, stays
            root.last_access_time = self._clock
            on_path = lock is root
        self._move_lock(lock, node, on_path=on_path)
        return node

    def _insert_under(self, anchor: TreeNode, anchor_len: int, key: Tokens, priority: int,
                      inserted_len: int) -> TreeNode:
        """`insert(key, priority=priority, inserted_len=inserted_len)[1]` where the path to `anchor` (locked, so that
        nothing evicted or changed it) holds `key`'s first `anchor_len` tokens: walked down from `anchor`, with the
        hits and priorities an insert gives the nodes above it but not their stamps, which the caller overwrites
        (`checkpoint_insert`)."""
        access_time = self.tick()
        # NOTE: going up, a node's end falls (a hit only where it is past `inserted_len`) and its priority does not
        # fall (an insert raises a whole path to at least its priority, a split copies the child's, a new leaf takes
        # the insert's: checked by `check_invariants`), so the walk stops at the first node needing neither; the
        # root's priority is at least that node's.
        node, end, root = anchor, anchor_len, self.root_node
        while node is not root and (end > inserted_len or node.priority < priority):
            if node.priority < priority:
                node.priority = priority
            if end > inserted_len:
                node.hit_count += 1
            end -= node.key.length
            node = node.parent
        if node is root and root.priority < priority:
            root.priority = priority
        return self._insert_from(anchor, anchor_len, key, priority, inserted_len, access_time)[1]

    def evict(self, num_tokens: int) -> int:
        """Free whole evictable leaves, lowest priority first, until `num_tokens` are freed; returns the number."""
        # NOTE: SGLang builds a heap of every evictable leaf, pops the lowest (priority, id) and pushes a parent that
        # the eviction leaves an unlocked leaf: each pop takes the lowest current (priority, id) of the evictable
        # leaves. Rebuilding that heap (or scanning for its top) per call cost a pass over hundreds of leaves for
        # an evict that mostly frees one, so the tree keeps one heap across calls, lazily:
        #   * every evictable leaf has exactly one entry, whose priority is at most the node's current one
        #     (`_update_leaf_status` pushes a node becoming a leaf unless it has an entry: `in_heap`; priorities
        #     never fall, `_PRIORITIES_NEVER_FALL`, so an entry made earlier is not above the node's priority);
        #   * other entries are stale: nodes that were since locked, gained a child or were evicted.
        # A popped entry is dropped if its node is no evictable leaf, pushed again with the node's priority if
        # that rose (the node's place is later), and otherwise is the lowest current (priority, id) of all leaves:
        # every other leaf's current one is at least its entry's, which is above this one (ids are unique, so no
        # two entries tie and no node is ever compared).
        heap = self._leaf_heap
        if heap is None:
            return self._evict_scanning(num_tokens)
        leaves = self.evictable_leaves
        get_priority = self._priority
        by_access = get_priority is lru
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        num_evicted = 0
        # NOTE: the top is read in place: a stale one is popped, one whose priority rose is replaced by its new entry
        # (one sift instead of a pop and a push: most popped entries are of leaves stamped since they were pushed).
        while num_evicted < num_tokens and leaves:
            entry = heap[0]  # every evictable leaf has an entry, so the heap is not empty
            x = entry[2]
            if x not in leaves:
                heappop(heap)
                x.in_heap = False
                continue
            priority = x.last_access_time if by_access else get_priority(x)
            if priority != entry[0]:
                heapreplace(heap, (priority, x.id, x))
                continue
            heappop(heap)
            x.in_heap = False
            num_evicted += x.key.length
            self._delete_leaf(x)  # pushes the parent if it is now an evictable leaf
            if self.records_events:
                self._record_remove(x)
        self.num_evicted_tokens += num_evicted
        return num_evicted

    def _evict_scanning(self, num_tokens: int) -> int:
        """`evict` for a policy whose priorities may fall (`mru`), where no heap entry can be kept across calls."""
        # NOTE: SGLang's heap always holds exactly `evictable_leaves` (nothing else changes during an evict). Most
        # evicts free a leaf or two out of hundreds: the first _EVICT_SCANS are found by scanning the set for its
        # minimum, and only a longer evict builds the heap, from the set as it is.
        leaves = self.evictable_leaves
        num_evicted = 0
        for _ in range(_EVICT_SCANS):
            if num_evicted >= num_tokens or not leaves:
                self.num_evicted_tokens += num_evicted
                return num_evicted
            x = self._lowest_leaf(leaves)
            num_evicted += x.key.length
            self._delete_leaf(x)
            if self.records_events:
                self._record_remove(x)
        get_priority = self._priority
        heap = [(get_priority(node), node.id, node) for node in leaves]
        heapq.heapify(heap)
        while num_evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            num_evicted += x.key.length
            self._delete_leaf(x)
            parent = x.parent
            if len(parent.children) == 0 and parent.lock_ref == 0:
                heapq.heappush(heap, (get_priority(parent), parent.id, parent))
            if self.records_events:
                self._record_remove(x)
        self.num_evicted_tokens += num_evicted
        return num_evicted

    def _lowest_leaf(self, leaves: set[TreeNode]) -> TreeNode:
        """The leaf of lowest (priority, id): SGLang's heap top."""
        if self._priority is lru:
            # NOTE: the common case in C: one leaf holds the oldest access time (a walk stamps one path, with at
            # most one leaf on it), so no id is needed to break a tie.
            nodes = list(leaves)
            times = list(map(_last_access_time, nodes))
            oldest = min(times)
            if times.count(oldest) == 1:
                return nodes[times.index(oldest)]
        return min(leaves, key=self._eviction_order)

    def inc_lock_ref(self, node: TreeNode, until: TreeNode | None = None) -> int:
        """Add a holder on `node` and its ancestors (up to, not including, `until`: default the root); returns the
        change in evictable tokens (<= 0)."""
        delta = 0
        root = self.root_node if until is None else until
        # NOTE: a node's leaf status reads only whether it has holders (and its children and tiers, which a lock does
        # not change), so only a node going from 0 to 1 holder is updated.
        while node is not root:
            if node.lock_ref == 0:
                if not node.evicted:
                    n = node.key.length
                    self.evictable_size_ -= n
                    self.protected_size_ += n
                    delta -= n
                node.lock_ref = 1
                self._update_leaf_status(node)
            else:
                node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Drop a holder from `node` and its ancestors; returns the change in evictable tokens (>= 0)."""
        delta = 0
        root = self.root_node
        while node is not root:  # NOTE: only a node going from 1 to 0 holders changes leaf status (`inc_lock_ref`)
            if node.lock_ref == 1:
                if not node.evicted:
                    n = node.key.length
                    self.evictable_size_ += n
                    self.protected_size_ -= n
                    delta += n
                node.lock_ref = 0
                self._update_leaf_status(node)
            elif node.lock_ref < 1:
                raise RuntimeError(f"{node!r}: lock released more often than taken")
            else:
                node.lock_ref -= 1
            node = node.parent
        return delta

    def move_lock(self, old: TreeNode | None, new: TreeNode) -> None:
        """`dec_lock_ref(old)` (if any), then `inc_lock_ref(new)`: the same holders, sizes and leaves after. Where
        `old` is on `new`'s path (a checkpoint moves a request's lock down the path it extends), the nodes from `old`
        up lose and regain a holder, so only those below it, down to `new`, are touched."""
        if old is None or self.has_host_tier:  # NOTE: a host tier's leaves also hang on its tiers: moved the plain way
            self._move_lock(old, new, on_path=old is new)
            return
        node, root = new, self.root_node
        while node is not old and node is not root:
            node = node.parent
        self._move_lock(old, new, on_path=node is old)

    def _move_lock(self, old: TreeNode | None, new: TreeNode, *, on_path: bool) -> None:
        """`move_lock(old, new)` where the caller knows whether `old` is on `new`'s path (`new` itself included)."""
        if old is None:
            self.inc_lock_ref(new)
        elif on_path:  # the nodes from `old` up would lose and regain a holder
            self.inc_lock_ref(new, until=old)
        else:  # `old` is on another branch
            self.dec_lock_ref(old)
            self.inc_lock_ref(new)

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        total, stack = 0, [self.root_node]
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total

    def path_tokens(self, node: TreeNode) -> Tokens:
        """The tokens from the root to the end of `node`."""
        keys = []
        while node is not self.root_node:
            keys.append(node.key)
            node = node.parent
        return Tokens(run for key in reversed(keys) for run in key.runs)

    def path_length(self, node: TreeNode) -> int:
        """Tokens from the root to the end of `node` (`len(path_device_indices(node))`)."""
        n = 0
        while node is not self.root_node:
            n += len(node.key)
            node = node.parent
        return n

    # ------------------------------------------------------------------ internals (as upstream)
    def _match_prefix_helper(self, node: TreeNode, key: Tokens) -> tuple[int, TreeNode]:
        # NOTE: SGLang slices the key after each node; walking an offset instead is the same comparison.
        access_time = self.tick()
        node.last_access_time = access_time
        matched = 0
        P, length = self.page_size, key.length
        # NOTE: `child_key` and `_match_len` inlined, one dict lookup per node (as `peek_prefix`).
        at = (0, 0)  # NOTE: where token `matched` lies in the key's runs (as `peek_prefix`)
        child = node.children.get(key.page_key_at(0, P, at)) if length else None
        while child is not None:
            child.last_access_time = access_time
            prefix_len, at = child.key.match_located(key, at)
            if P > 1:
                prefix_len = prefix_len // P * P
            if prefix_len < child.key.length:
                node = self._split_node(child, prefix_len)
                matched += prefix_len
                break
            matched += prefix_len
            node = child
            if matched >= length:
                break
            child = node.children.get(key.page_key_at(matched, P, at))
        return matched, node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """`child` becomes `new_node -> child`, `new_node` holding its first `split_len` tokens."""
        new_node = self.node_class(self, priority=child.priority)
        new_node.hit_count = child.hit_count
        suffix = child.key.slice(split_len)
        new_node.children = {suffix.page_key(0, self.page_size): child}
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.key = child.key.slice(0, split_len)
        child.parent = new_node
        child.key = suffix
        new_node.parent.children[new_node.key.page_key(0, self.page_size)] = new_node
        return new_node

    def _insert_helper(self, node: TreeNode, key: Tokens, priority: int, inserted_len: int) -> tuple[int, TreeNode]:
        access_time = self.tick()
        node.last_access_time = access_time
        node.priority = max(node.priority, priority)
        if len(key) == 0:
            return 0, node
        return self._insert_from(node, 0, key, priority, inserted_len, access_time)

    def _insert_from(self, node: TreeNode, total_prefix_length: int, key: Tokens, priority: int, inserted_len: int,
                     access_time: int) -> tuple[int, TreeNode]:
        """The walk of `_insert_helper` from `node`, which ends at token `total_prefix_length` of `key`."""
        P, length = self.page_size, key.length
        if total_prefix_length >= length:
            return total_prefix_length, node
        on_insert_path = self._on_insert_path
        at = key._locate(total_prefix_length) if total_prefix_length else (0, 0)  # as `peek_prefix`
        child_key = key.page_key_at(total_prefix_length, P, at)
        child = node.children.get(child_key)
        while child is not None:  # NOTE: `child_key` and `_match_len` inlined (as `peek_prefix`)
            node = child
            node.last_access_time = access_time
            prefix_len, at = node.key.match_located(key, at)
            if P > 1 and prefix_len % P:
                prefix_len = prefix_len // P * P
                at = None  # the match ended inside a page: the walk stops at the split below
            total_prefix_length += prefix_len
            if prefix_len < node.key.length:
                node = self._split_node(node, prefix_len)
            if node.priority < priority:
                node.priority = priority
            # NOTE: nodes this request already inserted were counted back then (SGLang's hit count for LFU).
            on_insert_path(node, total_prefix_length > inserted_len)
            if total_prefix_length >= length:
                break
            if at is None:
                at = key._locate(total_prefix_length)
            child_key = key.page_key_at(total_prefix_length, P, at)
            child = node.children.get(child_key)
        if total_prefix_length < length:
            node = self._add_leaf(node, child_key, key.slice(total_prefix_length), priority)
            self._on_insert_path(node, total_prefix_length + node.key.length > inserted_len)
        return total_prefix_length, node

    def _on_insert_path(self, node: TreeNode, new_hit: bool) -> None:
        """An insert reached `node` (walked past or added as the new leaf); `new_hit`: past what the request
        inserted before, so it counts a hit (the hook a tree with more state extends: `HiRadixCache`)."""
        if new_hit:
            node.hit_count += 1

    def _add_leaf(self, parent: TreeNode, child_key: Hashable, key: Tokens, priority: int) -> TreeNode:
        """A new evictable leaf holding `key` under `parent` (at `child_key`, its first page), stored in the events."""
        new_node = self.node_class(self, priority=priority)
        new_node.parent = parent
        new_node.key = key
        parent.children[child_key] = new_node
        self.evictable_size_ += key.length
        self._update_leaf_status(parent)
        self._update_leaf_status(new_node)
        if self.records_events:
            self._record_store(new_node)
        return new_node

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        if parent.children.pop(node.key.page_key(0, self.page_size), None) is not node:
            raise RuntimeError(f"{node!r} is not a child of its parent")
        self.evictable_size_ -= node.key.length
        self.evictable_leaves.discard(node)
        self._update_leaf_status(parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)
            if not node.in_heap and self._leaf_heap is not None:
                node.in_heap = True
                heapq.heappush(self._leaf_heap, (self._priority(node), node.id, node))

    # ------------------------------------------------------------------ events (SGLang's KVCacheEventRecorder)
    def enable_events(self) -> None:
        """Queue cache events from now on (idempotent)."""
        self.records_events = True

    def take_events(self) -> list[CacheEvent]:
        """The events queued since the last call, in emission order, handed over; the tree starts a new queue."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def _pages(self, node: TreeNode) -> tuple[Hashable, ...]:
        """The node's pages as event identities: each page's key (a token, or its canonical runs)."""
        key, P = node.key, self.page_size
        return tuple(key.page_key(start, min(P, len(key) - start)) for start in range(0, len(key), P))

    def _record_store(self, node: TreeNode) -> None:
        parent = node.parent
        parent_hash = self._pages(parent)[-1] if parent is not self.root_node and len(parent.key) else None
        self._events.append(CacheEvent("stored", self._pages(node), parent_hash=parent_hash, block_size=self.page_size))

    def _record_remove(self, node: TreeNode) -> None:
        self._events.append(CacheEvent("removed", self._pages(node), block_size=self.page_size))

    # ------------------------------------------------------------------ checking
    def check_invariants(self) -> None:
        """Raise if the tree's bookkeeping is impossible (tests and property tests)."""
        evictable = protected = 0
        leaves = set()
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if len(node.key) == 0 or len(node.key) % self.page_size:
                raise AssertionError(f"{node!r} holds {len(node.key)} tokens, not whole pages of {self.page_size}")
            if node.parent.children.get(self.child_key(node.key)) is not node:
                raise AssertionError(f"{node!r} is not under its first page in its parent")
            if node.priority > node.parent.priority:
                raise AssertionError(f"{node!r} has priority {node.priority} above its parent's {node.parent.priority} "
                                     "(an insert raises a whole path)")
            if node.lock_ref > node.parent.lock_ref and node.parent is not self.root_node:
                raise AssertionError(f"{node!r} has more holders than its parent (a lock counts up to the root)")
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if node.lock_ref == 0 and not node.children:
                leaves.add(node)
            stack.extend(node.children.values())
        if (evictable, protected) != (self.evictable_size_, self.protected_size_):
            raise AssertionError(f"sizes {(self.evictable_size_, self.protected_size_)} but the tree holds "
                                 f"{(evictable, protected)} (evictable, protected)")
        if leaves != self.evictable_leaves:
            raise AssertionError("evictable_leaves is not the set of unlocked leaves")
