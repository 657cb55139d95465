"""SGLang 0.5.23's HiCache (`--enable-hierarchical-cache`): the radix tree with a host (CPU) tier beside the device.

0.5.23 has no `HiRadixCache` class: the host tier is `UnifiedRadixCache.init_hicache()`
(`mem_cache/unified_radix_cache.py`) over the tree core `unified_cache/unified_tree_core.py` and the FULL component
`unified_cache/components/full.py`. The rules, with file:line, are docs/engines/hicache-0.5.23-rules.md (cited §n);
this class is `RadixCache` (`sim.engines.sglang.radix_cache`) plus what they add:

* A node holds its tokens on the device, the host, or both (`evicted`: no device copy; `backuped`: a host copy).
  `evictable_size_` / `protected_size_` count device tokens only; the host pool counts `host_used` tokens of
  `host_capacity` (§1).
* **Writes** (§2): an insert counts a hit on each node it walks past what the request inserted before and on its new
  leaf (`_inc_hit_count_and_check`: not for device-evicted nodes, never under write_back); a node reaching the
  policy's threshold (write_through 1, write_through_selective 2) is backed up with its unbacked ancestors, root
  first. Each backup takes host slots at once (evicting host leaves if short; a chain stops at the first that does
  not fit), sets the host copy at once, and device-locks the node's path until its copy is acknowledged
  (`pending_writes`; `check_events`). Under write_back nothing is written on insert.
* **Device eviction** (§3): the LRU D-leaf (device copy, no child with a device copy, unlocked): backed up ->
  demoted (device slots freed, the node stays host-only); not backed up -> deleted (write-through) or, under
  write_back, backed up synchronously then demoted (its subtree dropped if the host has no room).
* **Host eviction** (§3): only on demand (a backup short of host slots), the LRU H-leaf (host-only, no children,
  unlocked), then its childless dead ancestors; under write_back, nodes on both tiers give up their host copy first.
* **Match** (§4): walks through host-only nodes (stops at a dead one): the device prefix and its last node, plus the
  host-only tokens after it (`host_hit_length`) and the deepest node matched (`best_match_node`); every node on the
  matched path, host-only ones included, gets the access time.
* **Load-back** (§4): all the host-only nodes from the best match up to the first device node, if at least
  `LOAD_BACK_THRESHOLD` tokens (else declined: the request recomputes them), device slots freed by eviction if
  short; the nodes get device copies at once and stay device-locked until the load is acknowledged
  (`pending_loads`).
* An insert over a host-only node gives it the request's fresh KV (`_unevict_node_on_insert`): both tiers, no copy.

Cache events are the device's (stored when a node gains a device copy, removed when it loses one), as the plain
tree's; the host tier publishes none (kvsim's events carry no medium).
"""

from __future__ import annotations

import heapq
from sim.engines.sglang.radix_cache import RadixCache, TreeNode
from sim.engines.sglang.tokens import Tokens

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
"""`--hicache-write-policy` values (arg_groups/fields/memory.py:121-127); SGLang's default is write_through."""
WRITE_THROUGH_THRESHOLD = {"write_through": 1, "write_through_selective": 2, "write_back": 2}
"""Hits that back a node up (unified_radix_cache.py:558-576); write_back's is never used."""
LOAD_BACK_THRESHOLD = 10
"""Fewest host-only tokens a load-back moves (hard-coded, unified_radix_cache.py:558-576; §4)."""


def host_capacity_tokens(host_bytes: int, kv_bytes_per_token: int, page_size: int) -> int:
    """The host pool's slots for `--hicache-size` of `host_bytes`: S = floor(bytes / bytes per token), then
    (floor(S / P) + 1) x P, every slot allocatable (pool_host/base.py:211-229, 497-500; §1)."""
    s = host_bytes // kv_bytes_per_token
    return (s // page_size + 1) * page_size


class Copy:
    """One device<->host copy the tree issued: its node (None for a write_back backup, which holds no lock), its
    tokens, and when it completes on the host link (None until its owner submits it)."""

    __slots__ = ("node", "tokens", "done_s")

    def __init__(self, node: TreeNode | None, tokens: int) -> None:
        self.node = node
        self.tokens = tokens
        self.done_s: float | None = None


class HiTreeNode(TreeNode):
    """A tree node with its tiers: `evicted` (no device copy), `backuped` (a host copy), `host_lock_ref` (pinned on
    the host while a load-back is built), `write_pending` (a write-through copy not yet acknowledged)."""

    __slots__ = ("evicted", "backuped", "host_lock_ref", "write_pending", "load_pending")

    def __init__(self, cache: RadixCache, priority: int = 0) -> None:
        super().__init__(cache, priority)
        self.evicted = False
        self.backuped = False
        self.host_lock_ref = 0
        self.write_pending = False
        self.load_pending: Copy | None = None
        """The load-back (not yet acknowledged) that gave the node its device copy (`load_back_pending_id`)."""

    def __repr__(self) -> str:
        tiers = ("D" if not self.evicted else "") + ("H" if self.backuped else "")
        return f"HiTreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref}, tiers={tiers or '-'})"


class HiRadixCache(RadixCache):
    """One worker's radix tree with a host tier of `host_capacity` tokens under `write_policy` (module docstring).

    Copies are not timed here: the tree queues what its owner must time (`new_writes`, `new_loads`: `Copy`s in issue
    order), the owner sets their `done_s`, and `check_events(now)` reaps those complete, as SGLang's
    `check_hicache_events` reaps the cache controller's acks."""

    has_host_tier = True
    node_class = HiTreeNode

    def __init__(self, *, page_size: int = 1, eviction_policy: str = "lru", host_capacity: int,
                 write_policy: str = "write_through") -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}")
        if host_capacity < 1:
            raise ValueError(f"host_capacity must be >= 1 token, got {host_capacity}")
        self.host_capacity = host_capacity
        self.write_policy = write_policy
        self.write_back = write_policy == "write_back"
        self.write_through_threshold = WRITE_THROUGH_THRESHOLD[write_policy]
        self.host_used = 0
        self.host_leaves: set[HiTreeNode] = set()
        self.duplicates: dict[HiTreeNode, None] = {}
        """write_back only: nodes registered as settled on both tiers, in registration order; entries go stale
        lazily and are swept by host eviction, as SGLang's `full_host_duplicates`."""
        self.pending_writes: list[Copy] = []
        """Write-through backups issued and not acknowledged, in issue order (each holds a device lock)."""
        self.pending_loads: list[Copy] = []
        """Load-backs issued and not acknowledged (each holds a device lock on its best-match node)."""
        self.new_writes: list[Copy] = []
        """Backups issued since the owner last took them (`take_new_writes`), to be timed."""
        self.new_loads: list[Copy] = []
        self._insert_backups: list[HiTreeNode] = []
        """Nodes the running insert brought to the write-through threshold, in the order reached."""
        self.num_stored_tokens = 0
        self.num_loaded_tokens = 0
        self.num_host_evicted_tokens = 0
        self.num_unbacked_evicted_tokens = 0
        """write-through device evictions of nodes without a host copy (`write_through_unbacked_eviction`)."""
        super().__init__(page_size=page_size, eviction_policy=eviction_policy)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        super().reset()
        self.host_leaves.clear()
        self.duplicates.clear()
        self.host_used = 0

    def host_available(self) -> int:
        return self.host_capacity - self.host_used

    def take_new_loads(self) -> list[Copy]:
        """The load-backs issued since the last call (a batch's), handed over."""
        loads, self.new_loads = self.new_loads, []
        return loads

    def take_new_writes(self) -> list[Copy]:
        """The backups issued since the last call, handed over."""
        writes, self.new_writes = self.new_writes, []
        return writes

    # ------------------------------------------------------------------ match
    def match_prefix_tiers(self, key: Tokens) -> tuple[int, HiTreeNode, int, HiTreeNode]:
        """(device prefix tokens, last device node, host-only tokens after it, best match node) for the
        page-aligned `key` (`_match_prefix_helper`, unified_tree_core.py:905-990): the walk goes through host-only
        nodes and stops at a dead one; the last node is split at the match's end."""
        key = self.page_aligned(key)
        if len(key) == 0:
            return 0, self.root_node, 0, self.root_node
        return self._match_tiers(key)

    def _match_prefix_helper(self, node: HiTreeNode, key: Tokens) -> tuple[int, TreeNode]:
        """The base's `match_prefix` and `touch_prefix`: (device-matched tokens, last device node) of the tier walk;
        the host part: `match_prefix_tiers`."""
        device_len, device_node, _, _ = self._match_tiers(key)
        return device_len, device_node

    def _match_tiers(self, key: Tokens) -> tuple[int, HiTreeNode, int, HiTreeNode]:
        """`match_prefix_tiers` for a page-aligned, non-empty `key`."""
        access_time = self.tick()
        root = self.root_node
        root.last_access_time = access_time
        node, matched, length = root, 0, len(key)
        device_len, device_node = 0, root
        child_key = self.child_key(key)
        while matched < length and child_key in node.children:
            child = node.children[child_key]
            if child.evicted and not child.backuped:
                break
            child.last_access_time = access_time
            prefix_len = self._match_len(child.key, key, matched)
            if prefix_len < len(child.key):
                node = self._split_node(child, prefix_len)
                matched += prefix_len
                if not node.evicted:
                    device_len, device_node = matched, node
                break
            matched += prefix_len
            node = child
            if not node.evicted:
                device_len, device_node = matched, node
            if matched < length:
                child_key = self.child_key(key, matched)
        return device_len, device_node, matched - device_len, node

    def peek_prefix(self, key: Tokens) -> int:
        """Device-matched tokens of the page-aligned `key`, with no side effect (a router's peek: the device tier)."""
        key = self.page_aligned(key)
        node, matched = self.root_node, 0
        while matched < len(key):
            child = node.children.get(self.child_key(key, matched))
            if child is None or child.evicted:
                break
            n = self._match_len(child.key, key, matched)
            matched += n
            if n < len(child.key):
                break
            node = child
        return matched

    # ------------------------------------------------------------------ insert
    def _insert_helper(self, node: HiTreeNode, key: Tokens, priority: int, inserted_len: int) -> tuple[int, TreeNode]:
        """The base's insert; then the nodes it brought to the write-through threshold are backed up, in the order
        reached (`_on_insert_path` queues them)."""
        result = super()._insert_helper(node, key, priority, inserted_len)
        backups, self._insert_backups = self._insert_backups, []
        for target in backups:
            self._backup_chain(target)
        return result

    def _on_insert_path(self, node: HiTreeNode, new_hit: bool) -> None:
        if node.evicted:
            # NOTE: the request's fresh KV becomes the node's device copy (`_unevict_node_on_insert`).
            self._set_device(node, True)
            self._track_duplicate(node)
        # NOTE: a new leaf is on the device, so under write_back this counts nothing, as SGLang's insert
        if new_hit and self._inc_hit_count_and_check(node):
            self._insert_backups.append(node)

    def _inc_hit_count_and_check(self, node: HiTreeNode) -> bool:
        """unified_tree_core.py:1104-1123."""
        if node.evicted or self.write_back:
            return False
        node.hit_count += 1
        return not node.backuped and node.hit_count >= self.write_through_threshold

    def _split_node(self, child: HiTreeNode, split_len: int) -> HiTreeNode:
        """The base's split; the new node takes the child's tiers, locks and pending copies."""
        new_node = super()._split_node(child, split_len)
        new_node.evicted = child.evicted
        new_node.backuped = child.backuped
        new_node.host_lock_ref = child.host_lock_ref
        new_node.write_pending = child.write_pending
        new_node.load_pending = child.load_pending
        self._update_leaf_status(new_node)
        self._update_leaf_status(child)
        self._track_duplicate(new_node)
        return new_node

    # ------------------------------------------------------------------ backups (device -> host)
    def _track_duplicate(self, node: HiTreeNode) -> None:
        """`_update_duplicate_tracking` (write_back only matters): register a node settled on both tiers (keeping an
        earlier registration's place), else drop it."""
        if not self.write_back:
            return
        if not node.evicted and node.backuped and not node.write_pending and node.load_pending is None:
            self.duplicates.setdefault(node, None)
        else:
            self.duplicates.pop(node, None)

    def _backup_chain(self, node: HiTreeNode) -> None:
        """Write-through: `node` and its unbacked ancestors, root first; the chain stops at the first that finds
        no host room (`_execute_and_commit_kv_backup`, unified_radix_cache.py:1681-1716)."""
        chain = [node]
        ancestor = node.parent
        while ancestor is not self.root_node and not ancestor.backuped:
            chain.append(ancestor)
            ancestor = ancestor.parent
        for target in reversed(chain):
            if target.backuped:
                continue
            copy = self._backup(target)
            if copy is None:
                return
            copy.node = target
            self.inc_lock_ref(target)
            target.write_pending = True
            self.pending_writes.append(copy)

    def _backup(self, node: HiTreeNode) -> Copy | None:
        """Take host slots for `node` (evicting host leaves if short) and mark it backed up; None if no room."""
        n = len(node.key)
        if self.host_available() < n:
            needed = n - self.host_available()
            if self.evict_host(needed) < needed:
                return None
        self.host_used += n
        node.backuped = True
        self.num_stored_tokens += n
        copy = Copy(None, n)
        self.new_writes.append(copy)
        self._update_leaf_status(node)
        return copy

    def check_events(self, now_s: float) -> None:
        """`check_hicache_events` (unified_radix_cache.py:3651-3707): the leading pending copies complete by
        `now_s` are acknowledged (FIFO, writes then loads): a write-through's device lock goes
        (`_finish_write_through_ack`), a load-back's too (`loading_check`)."""
        writes = self.pending_writes
        k = 0
        while k < len(writes) and writes[k].done_s is not None and writes[k].done_s <= now_s:
            node = writes[k].node
            node.write_pending = False
            self.dec_lock_ref(node)
            k += 1
        if k:
            del writes[:k]
        loads = self.pending_loads
        k = 0
        while k < len(loads) and loads[k].done_s is not None and loads[k].done_s <= now_s:
            copy = loads[k]
            x = copy.node
            while x is not None and x is not self.root_node:  # `finish_load_back` (unified_tree_core.py:2740-)
                if x.load_pending is copy:
                    x.load_pending = None
                    self._track_duplicate(x)
                x = x.parent
            self.dec_lock_ref(copy.node)
            k += 1
        if k:
            del loads[:k]

    def next_ack_s(self) -> float | None:
        """When the next pending copy completes (None: none is timed)."""
        times = [c.done_s for c in (*self.pending_writes[:1], *self.pending_loads[:1]) if c.done_s is not None]
        return min(times) if times else None

    # ------------------------------------------------------------------ device eviction
    def _is_device_leaf(self, node: HiTreeNode) -> bool:
        if node is self.root_node or node.evicted or node.lock_ref > 0:
            return False
        return not any(not child.evicted for child in node.children.values())

    def _is_host_leaf(self, node: HiTreeNode) -> bool:
        return (node is not self.root_node and node.evicted and node.backuped and not node.children
                and node.host_lock_ref == 0 and node.lock_ref == 0)

    def _update_leaf_status(self, node: HiTreeNode) -> None:
        if self._is_device_leaf(node):
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)
        if self._is_host_leaf(node):
            self.host_leaves.add(node)
        else:
            self.host_leaves.discard(node)

    def evict(self, num_tokens: int) -> int:
        """Free device copies of D-leaves, lowest priority first, until `num_tokens` device tokens are freed
        (unified_radix_cache.py:952-1058): demote a backed-up leaf, delete an unbacked one (write-through), or back
        it up first (write_back)."""
        get_priority = self._priority
        heap = [(get_priority(node), node.id, node) for node in self.evictable_leaves]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if x not in self.evictable_leaves:
                continue
            n = len(x.key)
            parent = x.parent
            if x.backuped:
                self._demote(x)
            elif not self.write_back:
                self.num_unbacked_evicted_tokens += n
                self._delete_subtree(x)
            elif self._backup(x) is not None:
                self._track_duplicate(x)  # NOTE: acknowledged synchronously, a settled duplicate until demoted
                self._demote(x)
            elif not self._drop_subtree(x):
                continue  # NOTE: locked below: stays on the device until host room frees
            num_evicted += n
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (get_priority(parent), parent.id, parent))
        self.num_evicted_tokens += num_evicted
        return num_evicted

    def _set_device(self, node: HiTreeNode, on_device: bool) -> None:
        """Give `node` a device copy or take it away, keeping the device sizes and leaf sets."""
        n = len(node.key)
        sign = 1 if on_device else -1
        if node.lock_ref > 0:
            self.protected_size_ += sign * n
        else:
            self.evictable_size_ += sign * n
        node.evicted = not on_device
        self._update_leaf_status(node)
        self._update_leaf_status(node.parent)
        if self.records_events:
            (self._record_store if on_device else self._record_remove)(node)

    def _demote(self, node: HiTreeNode) -> None:
        self._set_device(node, False)

    def _delete_subtree(self, node: HiTreeNode) -> None:
        """Remove `node` and everything below it from the tree (device and host copies)."""
        stack = [node]
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            if not x.evicted:
                self.evictable_size_ -= len(x.key)
                if self.records_events:
                    self._record_remove(x)
            if x.backuped:
                self.host_used -= len(x.key)
            self.evictable_leaves.discard(x)
            self.host_leaves.discard(x)
        parent = node.parent
        if parent.children.pop(self.child_key(node.key), None) is not node:
            raise RuntimeError(f"{node!r} is not a child of its parent")
        node.parent = None
        self._update_leaf_status(parent)

    def _drop_subtree(self, node: HiTreeNode) -> bool:
        """write_back with no host room: drop the victim's subtree unless part of it is locked
        (`drop_subtree_no_host`, unified_tree_core.py:1825-1870)."""
        stack = list(node.children.values())
        while stack:
            x = stack.pop()
            if x.lock_ref > 0 or x.host_lock_ref > 0:
                return False
            stack.extend(x.children.values())
        self._delete_subtree(node)
        return True

    # ------------------------------------------------------------------ host eviction
    def evict_host(self, num_tokens: int) -> int:
        """Free host copies until `num_tokens` are freed (`drive_host_eviction`, unified_tree_core.py:1931-1960):
        under write_back, copies of nodes also on the device first (non-D-leaves, then D-leaves), then host-only
        leaves by the eviction policy, each with its childless dead ancestors. Returns the tokens freed."""
        freed = 0
        if self.write_back:
            # `_reclaim_full_host_duplicates` (unified_tree_core.py:1975-): pass 1 spares D-leaves (about to be
            # demoted), pass 2 takes them; stale entries and released ones are swept after the walk
            swept = []
            for spare_leaves in (True, False):
                if freed >= num_tokens:
                    break
                for node in self.duplicates:
                    if freed >= num_tokens:
                        break
                    if node.evicted or not node.backuped:
                        swept.append(node)
                        continue
                    if spare_leaves and node in self.evictable_leaves:
                        continue
                    if node.write_pending or node.load_pending is not None or node.host_lock_ref:
                        continue
                    node.backuped = False
                    self.host_used -= len(node.key)
                    freed += len(node.key)
                    self._update_leaf_status(node)
                    swept.append(node)
            for node in swept:
                self.duplicates.pop(node, None)
        get_priority = self._priority
        heap = [(get_priority(node), node.id, node) for node in self.host_leaves]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if x not in self.host_leaves:
                continue
            freed += len(x.key)
            self.num_host_evicted_tokens += len(x.key)
            parent = x.parent
            self._delete_subtree(x)
            while parent is not self.root_node and not parent.children and parent.evicted and not parent.backuped:
                grand = parent.parent  # a dead tombstone: nothing left below it
                self._delete_subtree(parent)
                parent = grand
            if parent in self.host_leaves:
                heapq.heappush(heap, (get_priority(parent), parent.id, parent))
        return freed

    # ------------------------------------------------------------------ load-back (host -> device)
    def host_only_path(self, node: HiTreeNode) -> list[HiTreeNode]:
        """The host-only nodes from `node` up to the first device node (full.py:395-425), deepest first."""
        path = []
        while node is not self.root_node and node.evicted:
            path.append(node)
            node = node.parent
        return path

    def load_back(self, node: HiTreeNode, make_room) -> int:
        """Load the host-only nodes above `node` back to the device (`load_back`, unified_radix_cache.py:1820-1937):
        all or nothing; declined (0) below `LOAD_BACK_THRESHOLD` tokens or when `make_room(tokens)` (the pool's
        evict-for-alloc) cannot free device slots for them. Returns the tokens loaded."""
        path = self.host_only_path(node)
        tokens = sum(len(x.key) for x in path)
        if tokens < max(1, LOAD_BACK_THRESHOLD):
            return 0
        self.inc_lock_ref(node)
        try:
            if not make_room(tokens):
                return 0
        finally:
            self.dec_lock_ref(node)
        copy = Copy(node, tokens)
        for x in reversed(path):
            self._set_device(x, True)
            x.load_pending = copy
        self.inc_lock_ref(node)
        self.pending_loads.append(copy)
        self.new_loads.append(copy)
        self.num_loaded_tokens += tokens
        return tokens

    def inc_host_lock(self, node: HiTreeNode) -> None:
        while node is not self.root_node:
            node.host_lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent

    def dec_host_lock(self, node: HiTreeNode) -> None:
        while node is not self.root_node:
            node.host_lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent

    # ------------------------------------------------------------------ checking
    def total_size(self) -> int:
        """Device tokens in the tree."""
        return self.evictable_size_ + self.protected_size_

    def tiers(self) -> list[tuple[Tokens, str, int]]:
        """Every node as (path tokens, tiers "D"/"H"/"DH", lock_ref), in depth-first order (tests)."""
        out = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            tiers = ("" if node.evicted else "D") + ("H" if node.backuped else "")
            out.append((self.path_tokens(node), tiers, node.lock_ref))
            stack.extend(node.children.values())
        return out

    def check_invariants(self) -> None:
        evictable = protected = host = 0
        dleaves, hleaves = set(), set()
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if len(node.key) == 0 or len(node.key) % self.page_size:
                raise AssertionError(f"{node!r} holds {len(node.key)} tokens, not whole pages of {self.page_size}")
            if node.evicted and not node.backuped:
                raise AssertionError(f"{node!r} is dead (neither tier) but still in the tree")
            if node.parent.children.get(self.child_key(node.key)) is not node:
                raise AssertionError(f"{node!r} is not under its first page in its parent")
            if not node.evicted and node.parent is not self.root_node and node.parent.evicted:
                raise AssertionError(f"{node!r} is on the device below a host-only parent")
            if not node.evicted:
                if node.lock_ref > 0:
                    protected += len(node.key)
                else:
                    evictable += len(node.key)
            if node.backuped:
                host += len(node.key)
            if self._is_device_leaf(node):
                dleaves.add(node)
            if self._is_host_leaf(node):
                hleaves.add(node)
            stack.extend(node.children.values())
        if (evictable, protected, host) != (self.evictable_size_, self.protected_size_, self.host_used):
            raise AssertionError(f"sizes {(self.evictable_size_, self.protected_size_, self.host_used)} but the tree "
                                 f"holds {(evictable, protected, host)} (evictable, protected, host)")
        if self.host_used > self.host_capacity:
            raise AssertionError(f"host holds {self.host_used} tokens of {self.host_capacity}")
        if dleaves != self.evictable_leaves or hleaves != self.host_leaves:
            raise AssertionError("leaf sets out of date")

