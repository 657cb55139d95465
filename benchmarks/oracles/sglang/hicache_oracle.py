#!/usr/bin/env python3
"""SGLang HiCache oracle: replay a stream of tree operations through SGLang 0.5.23's own `UnifiedRadixCache` with
its host tier (`init_hicache`: `HostPoolGroup` + `HybridCacheController`), on CPU.

Run it with the SGLang venv's interpreter (see README.md in this folder):

    .venv-sglang/bin/python benchmarks/oracles/sglang/hicache_oracle.py ops.json > out.json

0.5.23 has no `HiRadixCache`: the host tier is `UnifiedRadixCache.init_hicache()` (docs/engines/hicache-0.5.23-rules.md).
It runs on CPU with three in-memory patches and nothing changed in the venv (rules §5):
* `pool_host.common._cuda_host_register` is a no-op (pinning the host buffer calls `cudaHostRegister`:
  `RuntimeError: Found no NVIDIA driver`);
* `MHATokenToKVPoolHost.backup_from_device_all_layer` / `load_to_device_per_layer` are no-ops (their copy kernel
  `transfer_kv_all_layer_direct_lf_pf` comes from `sgl_kernel`, absent here; the KV bytes change no decision);
* token ids are `array('q')` (as the scheduler passes them).
CPU events report completion at once, so every copy is acknowledged at the first `check_hicache_events`.

Input (stdin or the file named by the first argument), one JSON object:

    {"page_size": 1, "device_tokens": 64, "host_ratio": 2.0, "write_policy": "write_through", "core": "python",
     "ops": [{"op": "insert", "key": RUNS, "inserted_len": 0}, {"op": "match", "key": RUNS},
             {"op": "lock", "node": I}, {"op": "unlock", "node": I}, {"op": "evict", "num_tokens": N},
             {"op": "load", "node": I}, {"op": "ack"}]}

A key is a list of runs `[k, start, n]` (token_runs.py). `insert` takes `len(key)` fresh device slots (the caller
makes room first) and inserts them; the tree frees the duplicate part. `match` names its device node (for lock /
unlock) and its best match node (for load: `load_back`). `ack` is what the scheduler runs each step:
`flush_pending_backups`, `ready_to_load_host_cache`, `check_hicache_events`. Output: per op `{"prefix_len"}`
(insert), `{"device", "host"}` (match), `{"delta"}` (lock, unlock), `{"evicted"}` (evict), `{"loaded"}` (load), each
with `evictable`, `protected` and `host_available`; at the end the tree as a sorted list of
`[path runs, tiers ("D", "H", "DH"), lock_ref]`. Exit 2 on bad input.
"""

from __future__ import annotations

import json
import os
import sys
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from token_runs import ids_of, runs_of  # noqa: E402

POLICIES = ("write_through", "write_through_selective", "write_back")


def main() -> int:
    spec = json.load(open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin)
    policy = spec.get("write_policy", "write_through")
    core = spec.get("core", "python")
    if policy not in POLICIES or core not in ("python", "rust"):
        print(f"write_policy must be one of {POLICIES}, core python or rust", file=sys.stderr)
        return 2
    P = spec.get("page_size", 1)
    N = spec.get("device_tokens", 64)

    import probe_classes  # noqa: F401  (its import stubs for packages the venv lacks)
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs
    import sglang.srt.mem_cache.pool_host.common as pool_host_common
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    pool_host_common._cuda_host_register = lambda *args, **kwargs: None
    MHATokenToKVPoolHost.backup_from_device_all_layer = lambda self, *args, **kwargs: None
    MHATokenToKVPoolHost.load_to_device_per_layer = lambda self, *args, **kwargs: None

    sa = ServerArgs(model_path="dummy", device="cpu", page_size=P, enable_hierarchical_cache=True,
                    hicache_ratio=spec.get("host_ratio", 2.0), hicache_io_backend="direct",
                    hicache_mem_layout="page_first_direct", hicache_write_policy=policy,
                    radix_eviction_policy=spec.get("eviction_policy", "lru"))
    get_context().set_server_args(sa)
    kv = MHATokenToKVPool(size=N, page_size=P, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=2,
                          device="cpu", enable_alt_stream=False, enable_memory_saver=False)
    if P == 1:
        alloc = TokenToKVPoolAllocator(N, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(N, page_size=P, dtype=torch.bfloat16, device="cpu", kvcache=kv,
                                            need_sort=False)
    r2t = ReqToTokenPool(size=8, max_context_len=4096, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(disable=False, req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=P,
                             eviction_policy=spec.get("eviction_policy", "lru"),
                             tree_components=(ComponentType.FULL,),
                             tree_core_backend="python" if core == "python" else None)
    cache = UnifiedRadixCache(params)
    cache.init_hicache(sa, params)
    host = cache.cache_controller.mem_pool_host
    FULL = ComponentType.FULL

    handles: dict[int, tuple] = {}  # op index -> (device node id, best match node id)
    receipts: dict[int, list] = {}
    results = []
    for i, op in enumerate(spec["ops"]):
        kind = op["op"]
        if kind == "insert":
            ids = ids_of(op["key"])
            n = len(ids) // P * P
            value = alloc.alloc(n)
            if value is None:
                print(f"op {i}: no {n} free device slots for the insert", file=sys.stderr)
                return 2
            r = cache.insert(InsertParams(key=RadixKey(array("q", ids[:n])), value=value,
                                          inserted_len=op.get("inserted_len", 0)))
            out = {"prefix_len": r.prefix_len}
        elif kind == "match":
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", ids_of(op["key"])))))
            handles[i] = (m.last_device_node, m.best_match_node)
            out = {"device": m.device_prefix_len, "host": m.host_hit_length}
        elif kind == "lock":
            before = cache.evictable_size()
            receipts.setdefault(op["node"], []).append(cache.inc_lock_ref(handles[op["node"]][0]).to_dec_params())
            out = {"delta": cache.evictable_size() - before}
        elif kind == "unlock":
            before = cache.evictable_size()
            cache.dec_lock_ref(handles[op["node"]][0], receipts[op["node"]].pop())
            out = {"delta": cache.evictable_size() - before}
        elif kind == "evict":
            out = {"evicted": cache.evict(EvictParams(num_tokens=op["num_tokens"])).num_tokens_evicted}
        elif kind == "load":
            host_len = results[op["node"]]["host"]
            ok = cache.load_back(handles[op["node"]][1])
            out = {"loaded": host_len if ok else 0}
        elif kind == "ack":
            cache.flush_pending_backups()
            cache.ready_to_load_host_cache()
            cache.check_hicache_events()
            out = {}
        else:
            print(f"op {i}: unknown op {kind!r}", file=sys.stderr)
            return 2
        out.update(evictable=cache.evictable_size(), protected=cache.protected_size(),
                   host_available=host.available_size())
        results.append(out)

    tree = []
    core_tree = cache.tree_core
    stack = [(core_tree.root_node, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            ids = path + list(child.key.token_ids[: len(child.key)])
            tiers = ("" if child.evicted else "D") + ("H" if child.backuped else "")
            tree.append([runs_of(ids), tiers, child.component_data[FULL].lock_ref])
            stack.append((child, ids))
    tree.sort()
    import sglang

    json.dump({"sglang_version": sglang.__version__, "host_capacity": host.size, "results": results, "tree": tree},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
