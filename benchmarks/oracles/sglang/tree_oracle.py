#!/usr/bin/env python3
"""SGLang tree oracle: replay a stream of radix-tree operations through SGLang 0.5.23's own `RadixCache`.

Run it with the SGLang venv's interpreter (see README.md in this folder):

    .venv-sglang/bin/python benchmarks/oracles/sglang/tree_oracle.py ops.json > out.json

Input (stdin or the file named by the first argument), one JSON object:

    {"page_size": 1, "eviction_policy": "lru",
     "ops": [{"op": "match", "key": RUNS}, {"op": "insert", "key": RUNS, "priority": 0, "inserted_len": 0},
             {"op": "lock", "node": I}, {"op": "unlock", "node": I}, {"op": "evict", "num_tokens": N}]}

A key is a list of runs `[k, start, n]`: the tokens `k * 1_000_000 + start .. + n - 1` (so distinct runs never
share a token id; kvsim reads the same runs as token identities). `node: I` names the node returned by op I (a
match or an insert). Output: per op `{"prefix_len"}` (match, insert), `{"delta"}` (lock, unlock: evictable-size
change) or `{"evicted", "removed"}` (evict: tokens freed and the evicted nodes' keys as runs, in order), each
with `evictable`, `protected`; at the end the tree as a sorted list of `[path runs, lock_ref]`. Exit 2 on bad input.
"""

from __future__ import annotations

import json
import sys
from array import array

from token_runs import ids_of, runs_of


def main() -> int:
    spec = json.load(open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin)
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    class CountingAllocator:
        """Stands in for the token-to-KV allocator: the tree frees evicted segments into it."""

        device = "cpu"
        page_size = spec.get("page_size", 1)

        def free_segment(self, *_args, **_kwargs) -> None:
            pass

    cache = RadixCache.create_simulated(page_size=spec.get("page_size", 1), mock_allocator=CountingAllocator())
    if spec.get("eviction_policy", "lru") != "lru":
        from sglang.srt.mem_cache.utils import get_eviction_strategy

        cache.eviction_policy = spec["eviction_policy"]
        cache.eviction_strategy = get_eviction_strategy(spec["eviction_policy"])
    removed: list = []
    delete_leaf = cache._delete_leaf

    def recording_delete_leaf(node):
        removed.append(runs_of(node.key.token_ids[: len(node.key)]))
        delete_leaf(node)

    cache._delete_leaf = recording_delete_leaf
    nodes: dict[int, object] = {}
    results = []
    for i, op in enumerate(spec["ops"]):
        kind = op["op"]
        if kind == "match":
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(ids_of(op["key"]))))
            nodes[i] = m.last_device_node
            out = {"prefix_len": m.device_prefix_len}
        elif kind == "insert":
            r = cache.insert(InsertParams(key=RadixKey(ids_of(op["key"])), priority=op.get("priority", 0),
                                          inserted_len=op.get("inserted_len", 0)))
            nodes[i] = r.last_device_node
            out = {"prefix_len": r.prefix_len}
        elif kind == "lock":
            out = {"delta": cache.inc_lock_ref(nodes[op["node"]]).delta}
        elif kind == "unlock":
            out = {"delta": cache.dec_lock_ref(nodes[op["node"]]).delta}
        elif kind == "evict":
            removed.clear()
            res = cache.evict(EvictParams(num_tokens=op["num_tokens"]))
            out = {"evicted": res.num_tokens_evicted, "removed": list(removed)}
        else:
            print(f"op {i}: unknown op {kind!r}", file=sys.stderr)
            return 2
        out.update(evictable=cache.evictable_size(), protected=cache.protected_size())
        results.append(out)
    tree = []
    stack = [(cache.root_node, array("q"))]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            child_path = path + child.key.token_ids[: len(child.key)]
            tree.append([runs_of(child_path), child.lock_ref])
            stack.append((child, child_path))
    tree.sort()
    import sglang

    json.dump({"sglang_version": sglang.__version__, "results": results, "tree": tree}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
