"""The radix tree in tiny narrated scenarios with exact expected state, and against a naive model."""

from __future__ import annotations

import heapq
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engines.sglang import radix_cache
from sim.engines.sglang.evict_policy import EVICTION_POLICIES
from sim.engines.sglang.radix_cache import RadixCache
from sim.engines.sglang.tokens import Tokens, prompt_tokens
from sim.workloads.request import Request

P7 = ("p", 7)


def toks(*runs) -> Tokens:
    """Tokens from (key, n) runs starting at offset 0, or (key, start, n) runs."""
    return Tokens([r if len(r) == 3 else (r[0], 0, r[1]) for r in runs])


def test_tokens_are_runs_with_token_exact_slices_and_matches():
    a = toks((P7, 2032), ("u", 339))
    assert len(a) == 2371 and a.slice(2000, 2040).runs == ((P7, 2000, 32), ("u", 0, 8))
    b = toks((P7, 2032), ("v", 10))
    assert a.match(b) == 2032 and b.match(a, 0) == 2032
    assert toks((P7, 100)).match(a) == 100  # a shorter prefix matches in full
    assert a.slice(0, 5).match(a.slice(1)) == 0  # shifted tokens are other tokens
    # canonical: a run cut in two pieces is the same sequence
    assert Tokens([(P7, 0, 10), (P7, 10, 5)]) == toks((P7, 15))
    assert a.page_key(2030, 4) == ((P7, 2030, 2), ("u", 0, 2)) and a.page_key(5, 1) == (P7, 5)


def test_prompt_tokens_fall_back_to_block_hashes():
    r = Request(3, 40, 1, block_hashes=(("p", 1, 0), ("p", 1, 1)))
    t = prompt_tokens(r, 16)
    assert len(t) == 40 and t.token(17) == (("p", 1, 1), 1) and t.token(33) == (("tail", 3), 1)
    runs = Request(4, 40, 1, (), token_runs=((P7, 30), ("u4", 10)))
    assert prompt_tokens(runs, 16).runs == ((P7, 0, 30), ("u4", 0, 10))


def test_a_match_inside_a_node_splits_it_and_stamps_the_path():
    # One prompt in the tree; a second prompt with the same 2,032-token prefix and another tail matches 2,032 tokens
    # and splits the node there: root -> [prefix 2032] -> [tail 339].
    c = RadixCache()
    c.insert(toks((P7, 2032), ("u1", 339)))
    assert c.evictable_size() == 2371
    n, node = c.match_prefix(toks((P7, 2032), ("u2", 100)))
    assert n == 2032 and len(node.key) == 2032 and len(node.children) == 1
    assert [len(ch.key) for ch in node.children.values()] == [339]
    # the prefix node was created by the split, after the match stamped the tail: it is newer
    (tail,) = node.children.values()
    assert node.last_access_time > tail.last_access_time
    c.check_invariants()


def test_insert_returns_what_was_there_and_adds_one_leaf():
    c = RadixCache()
    assert c.insert(toks((P7, 2032), ("u1", 339)))[0] == 0
    prefix_len, leaf = c.insert(toks((P7, 2032), ("u2", 5)))
    assert prefix_len == 2032 and len(leaf.key) == 5 and c.total_size() == 2032 + 339 + 5
    assert c.insert(toks((P7, 2032), ("u2", 5)))[0] == 2037  # a duplicate adds nothing
    assert c.total_size() == 2376


def test_locked_paths_are_protected_and_eviction_takes_old_leaves_first():
    # Three prompts on one prefix: A (oldest), B (locked), C (newest). Evicting 1 token takes A's tail whole (339);
    # evicting more takes C's tail, then nothing else (the prefix is B's path, locked).
    c = RadixCache()
    c.insert(toks((P7, 2032), ("a", 339)))
    _, b = c.insert(toks((P7, 2032), ("b", 100)))
    c.insert(toks((P7, 2032), ("c", 50)))
    assert c.inc_lock_ref(b) == -(100 + 2032)
    assert (c.evictable_size(), c.protected_size()) == (389, 2132)
    assert c.evict(1) == 339
    assert c.evict(10**6) == 50
    assert c.total_size() == 2132 and c.evictable_size() == 0
    # unlocked, the tree is eaten from the tip: b's tail, then the prefix (a parent pushed once its leaf is gone)
    assert c.dec_lock_ref(b) == 2132
    assert c.evict(101) == 2132 and c.total_size() == 0
    c.check_invariants()


def test_pages_round_matches_and_inserts_down():
    c = RadixCache(page_size=16)
    c.insert(toks((P7, 100)))  # 96 tokens go in: 6 pages
    assert c.total_size() == 96
    assert c.match_prefix(toks((P7, 50), ("x", 20)))[0] == 48  # diverges inside page 4: 3 whole pages
    assert c.peek_prefix(toks((P7, 100))) == 96


def test_peek_changes_nothing():
    c = RadixCache()
    c.insert(toks((P7, 200)))
    before = [(n.last_access_time, len(n.key)) for n in c.root_node.children.values()]
    assert c.peek_prefix(toks((P7, 100), ("z", 3))) == 100
    assert [(n.last_access_time, len(n.key)) for n in c.root_node.children.values()] == before  # no split, no stamp


def test_lfu_keeps_the_node_hit_more_often():
    c = RadixCache(eviction_policy="lfu")
    c.insert(toks(("a", 10)))
    c.insert(toks(("b", 10)))
    c.insert(toks(("a", 10)))  # a second insert counts a hit on a's node
    c.enable_events()
    c.evict(1)
    evicted = [e.block_hashes[0] for e in c.take_events() if e.kind == "removed"]
    assert evicted == [("b", 0)]  # b's node (its first page is token ("b", 0)); LRU would have taken a, inserted first


def test_events_report_stored_nodes_and_removed_nodes_page_by_page():
    c = RadixCache(page_size=4)
    c.enable_events()
    c.insert(toks((P7, 8)))
    c.insert(toks((P7, 8), ("u", 4)))
    c.evict(4)
    events = c.take_events()
    kinds = [(e.kind, len(e.block_hashes), e.parent_hash is not None) for e in events]
    assert kinds == [("stored", 2, False), ("stored", 1, True), ("removed", 1, False)]
    assert events[1].parent_hash == events[0].block_hashes[-1]
    assert c.take_events() == []  # handed out once


# ---------------------------------------------------------------------------------------------- naive model
KEYS = st.sampled_from(["a", "b", "c"])
SEQ = st.lists(st.tuples(KEYS, st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=4)


def _naive_match(paths: list[Tokens], key: Tokens) -> int:
    """Longest common prefix of `key` with any root-to-leaf path (what a trie of whole sequences answers)."""
    return max((p.match(key) for p in paths), default=0)


def _expanded(t: Tokens) -> list:
    """The sequence token by token: what the runs stand for."""
    return [(key, start + i) for key, start, n in t.runs for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(SEQ, SEQ, st.integers(0, 30), st.integers(0, 30))
def test_runs_slice_and_match_as_token_lists_do(a_runs, b_runs, start, stop):
    # Runs of one key with consecutive offsets (("a", 0, 2), ("a", 2, 3)) merge, so equal runs, runs cut inside and
    # whole-run skips (the fast path of `match`) all occur.
    a, b = Tokens(a_runs), Tokens(b_runs + a_runs)
    ta, tb = _expanded(a), _expanded(b)
    piece = a.slice(start, stop)
    assert _expanded(piece) == ta[start:stop] and len(piece) == len(ta[start:stop])
    assert piece == Tokens(piece.runs)  # still canonical
    joined = piece + b.slice(stop)  # merges only where the two meet: as canonical as runs built at once
    assert joined.runs == Tokens(piece.runs + b.slice(stop).runs).runs and len(joined) == len(piece) + len(b) - min(
        stop, len(b))
    for offset in range(len(tb) + 1):
        rest = tb[offset:]
        naive = next((i for i, (x, y) in enumerate(zip(ta, rest)) if x != y), min(len(ta), len(rest)))
        assert a.match(b, offset) == naive


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "match", "evict", "lock"]), SEQ, st.integers(1, 30)),
                max_size=40),
       st.sampled_from([1, 2]))
@pytest.mark.slow
def test_tree_matches_a_naive_trie_of_its_paths(ops, page_size):
    c = RadixCache(page_size=page_size)
    locked = []
    for kind, seq, n in ops:
        key = Tokens(seq)
        if kind == "insert":
            c.insert(key)
        elif kind == "evict":
            before = c.total_size()
            freed = c.evict(n)
            assert c.total_size() == before - freed
            assert freed >= min(n, before - c.protected_size()) or c.evictable_size() == 0
        elif kind == "lock":
            _, node = c.match_prefix(key)
            c.inc_lock_ref(node)
            locked.append(node)
        leaves = []
        stack = [c.root_node]
        while stack:
            node = stack.pop()
            if not node.children and node is not c.root_node:
                leaves.append(c.path_tokens(node))
            stack.extend(node.children.values())
        expected = _naive_match(leaves, c.page_aligned(key))
        expected = expected // page_size * page_size
        assert c.peek_prefix(key) == expected
        if kind == "match":
            assert c.match_prefix(key)[0] == expected
        c.check_invariants()
    for node in locked:
        c.dec_lock_ref(node)
    assert c.protected_size() == 0
    c.evict(10**6)
    assert c.total_size() == 0


class _SglangEvictTree(RadixCache):
    """SGLang's `RadixCache.evict` as upstream: a heap built from every evictable leaf at each call."""

    def evict(self, num_tokens: int) -> int:
        get_priority = self._priority
        heap = [(get_priority(node), node.id, node) for node in self.evictable_leaves]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            num_evicted += len(x.key)
            self._delete_leaf(x)
            parent = x.parent
            if len(parent.children) == 0 and parent.lock_ref == 0:
                heapq.heappush(heap, (get_priority(parent), parent.id, parent))
            if self.records_events:
                self._record_remove(x)
        self.num_evicted_tokens += num_evicted
        return num_evicted


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "match", "touch", "evict", "lock", "unlock"]), SEQ,
                          st.integers(1, 40)), max_size=40),
       st.sampled_from(sorted(EVICTION_POLICIES)), st.sampled_from([1, 2]))
@pytest.mark.slow
def test_eviction_by_a_lazy_heap_or_scanning_equals_sglangs_heap(ops, policy, page_size):
    """An evict pops the tree's lazy heap kept across calls (or, for `mru`, finds its first leaves by scanning for
    the minimum (priority, id) and builds SGLang's heap past `_EVICT_SCANS`): the same leaves leave in the same order
    as from SGLang's heap built at each call, whether the scan finds all of them, none or the default."""
    scans = (None, 0, 10**6, radix_cache._EVICT_SCANS)
    trees = [_SglangEvictTree(page_size=page_size, eviction_policy=policy)]
    trees += [RadixCache(page_size=page_size, eviction_policy=policy) for _ in scans[1:]]
    locked: list[list] = [[] for _ in scans]
    for tree in trees:
        tree.enable_events()
    for kind, seq, n in ops:
        key = Tokens(seq)
        freed = []
        for tree, held, k in zip(trees, locked, scans):
            if kind == "insert":
                tree.insert(key, priority=n % 3)
            elif kind == "match":
                tree.match_prefix(key)
            elif kind == "touch":
                tree.touch_prefix(key)
            elif kind == "lock":
                held.append(tree.match_prefix(key)[1])
                tree.inc_lock_ref(held[-1])
            elif kind == "unlock" and held:
                tree.dec_lock_ref(held.pop(n % len(held)))
            elif kind == "evict":
                with mock.patch.object(radix_cache, "_EVICT_SCANS", k if k is not None else radix_cache._EVICT_SCANS):
                    freed.append(tree.evict(n))
            tree.check_invariants()
        assert len(set(freed)) <= 1
        events = [tree.take_events() for tree in trees]
        assert all(e == events[0] for e in events[1:])
        assert len({(t.evictable_size(), t.protected_size(), t.num_evicted_tokens) for t in trees}) == 1


def test_the_lazy_heap_skips_a_touched_leaf_to_its_new_place():
    """Two leaves: `a` (older) then `b`. A match refreshes `a`, whose heap entry still has its old access time; the
    evict pops that entry, finds the time moved, pushes `a` back, and takes `b` first, as SGLang's heap would."""
    tree = RadixCache(eviction_policy="lru")
    tree.insert(toks(("a", 4)))
    tree.insert(toks(("b", 4)))
    tree.match_prefix(toks(("a", 4)))
    assert tree.evict(1) == 4
    assert tree.peek_prefix(toks(("a", 4))) == 4 and tree.peek_prefix(toks(("b", 4))) == 0
    # the root's child `a` keeps one live entry: the one pushed back (its first was popped)
    assert [entry[2] for entry in tree._leaf_heap] == [tree.root_node.children[toks(("a", 4)).page_key(0, 1)]]
    assert tree.evict(1) == 4 and tree.total_size() == 0 and not tree._leaf_heap


def _dump(tree: RadixCache) -> list:
    """Every node, depth first in child order, with everything an operation may change."""
    out, stack = [], [(tree.root_node, 0)]
    while stack:
        node, depth = stack.pop()
        out.append((depth, node.id, node.key.runs, node.lock_ref, node.last_access_time, node.creation_time,
                    node.hit_count, node.priority))
        stack.extend((child, depth + 1) for child in node.children.values())
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "lock", "move", "unlock", "evict"]), SEQ, st.integers(0, 40)),
                max_size=30),
       st.sampled_from(["lru", "lfu", "mru"]), st.sampled_from([1, 2]))
def test_move_lock_is_dec_then_inc(ops, policy, page_size):
    """`move_lock(old, new)` (a checkpoint's lock moving down its path, or to another branch) leaves the same holders,
    sizes and evictable leaves as `dec_lock_ref(old)` then `inc_lock_ref(new)`, so later evicts take the same nodes."""
    trees = [RadixCache(page_size=page_size, eviction_policy=policy) for _ in range(2)]
    held: list[list] = [[], []]
    for tree in trees:
        tree.enable_events()
    for kind, seq, n in ops:
        key = Tokens(seq)
        for t, (tree, locks) in enumerate(zip(trees, held)):
            if kind == "insert":
                tree.insert(key)
            elif kind == "lock":
                locks.append(tree.match_prefix(key)[1])
                tree.inc_lock_ref(locks[-1])
            elif kind == "move" and locks:
                i = n % len(locks)
                new = tree.insert(key)[1]
                if t == 0:
                    tree.move_lock(locks[i], new)
                else:
                    tree.dec_lock_ref(locks[i])
                    tree.inc_lock_ref(new)
                locks[i] = new
            elif kind == "unlock" and locks:
                tree.dec_lock_ref(locks.pop(n % len(locks)))
            elif kind == "evict":
                tree.evict(n)
            tree.check_invariants()
        assert _dump(trees[0]) == _dump(trees[1])
        assert trees[0].take_events() == trees[1].take_events()
        assert (trees[0].evictable_size(), trees[0].protected_size()) == (trees[1].evictable_size(),
                                                                         trees[1].protected_size())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "lock", "checkpoint", "unlock", "evict"]), SEQ,
                          st.integers(0, 40)), max_size=30),
       st.sampled_from(["lru", "lfu", "priority", "mru"]), st.sampled_from([1, 2]))
def test_checkpoint_insert_is_sglangs_inserts_match_and_lock_move(ops, policy, page_size):
    """A checkpoint's tree work in one call (`checkpoint_insert`: the inserts walk down from the request's lock and
    skip the stamps above it, one walk up stamps the path and finds the old lock) leaves the same tree, stamps, hit
    counts, priorities, ids, holders, events and later evictions as SGLang's sequence from the root: insert the key,
    insert its prompt part with priority 1, match the key, release the old lock and lock the match's node."""
    trees = [RadixCache(page_size=page_size, eviction_policy=policy) for _ in range(2)]
    held: list[list] = [[], []]
    for tree in trees:
        tree.enable_events()
    for kind, seq, n in ops:
        for t, (tree, locks) in enumerate(zip(trees, held)):
            if kind == "insert":
                tree.insert(Tokens(seq), priority=n % 3, inserted_len=n)
            elif kind == "lock":
                locks.append(tree.match_prefix(Tokens(seq))[1])
                tree.inc_lock_ref(locks[-1])
            elif kind == "unlock" and locks:
                tree.dec_lock_ref(locks.pop(n % len(locks)))
            elif kind == "evict":
                tree.evict(n)
            elif kind == "checkpoint":
                # the request's lock (or none), a key extending its path (or cut inside it), a prompt end anywhere
                lock = locks[n % len(locks)] if locks and n % 5 else None
                path = tree.path_tokens(lock) if lock is not None else Tokens()
                key = path + Tokens(seq)
                key = tree.page_aligned(key.slice(0, len(key) - n % 7) if n % 3 == 0 else key)
                lock_len = len(path)
                prompt_len = n % (len(key) + 2) // page_size * page_size
                inserted_len = (n * 7) % (len(key) + 3)
                if t == 0:
                    end = tree.checkpoint_insert(lock, lock_len, key, prompt_len=prompt_len, inserted_len=inserted_len)
                else:
                    tree.insert(key, priority=0, inserted_len=inserted_len)
                    if 0 < prompt_len < len(key):
                        tree.insert(key.slice(0, prompt_len), priority=1, inserted_len=prompt_len)
                    end = tree.match_prefix(key)[1]
                    if lock is not None:
                        tree.dec_lock_ref(lock)
                    tree.inc_lock_ref(end)
                if lock is not None:
                    locks[locks.index(lock)] = end
                else:
                    locks.append(end)
            tree.check_invariants()
        assert _dump(trees[0]) == _dump(trees[1])
        assert trees[0].take_events() == trees[1].take_events()
        assert (trees[0].evictable_size(), trees[0].protected_size(), trees[0].num_evicted_tokens) == (
            trees[1].evictable_size(), trees[1].protected_size(), trees[1].num_evicted_tokens)
