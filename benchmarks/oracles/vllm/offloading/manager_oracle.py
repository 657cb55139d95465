"""Drive vLLM 0.33.0's own `CPUOffloadingManager` through a list of operations: the oracle for kvsim's mirror
(`sim/engines/vllm/offload/cpu_manager.py`, tested in tests/engines/vllm/test_cpu_manager.py).

Run under the oracle venv: `.venv-vllm-oracle/bin/python manager_oracle.py < ops.json > answer.json`.

Input: {"num_chunks": n, "eviction_policy": "lru", "store_threshold": 1, "max_tracker_size": 64000,
        "ops": [op, ...]}. Chunk hashes are non-negative ints; hash i is vLLM's OffloadKey
`make_offload_key(i.to_bytes(32, "big"), 0)`, so byte order equals int order (it breaks rank ties the same way).
Ops and their results (one per op, in order):
  {"op": "new_request", "request": id, "end_tokens": [[hash, end_token], ...]}  -> null
  {"op": "lookup", "hash": h}                                   -> "MISS" | "HIT_PENDING" | "HIT"
  {"op": "prepare_load", "request": id, "hashes": [...]}        -> [chunk_id, ...]
  {"op": "complete_load", "request": id, "hashes": [...]}       -> null
  {"op": "prepare_store", "request": id, "hashes": [...]}       -> null (None) |
                                   {"store": [hash...], "chunk_ids": [...], "evicted": [hash...]}
  {"op": "complete_store", "request": id, "hashes": [...], "success": bool} -> null
  {"op": "request_finished", "request": id}                     -> null
  {"op": "reset_cache"}                                         -> null
  {"op": "state"}   -> {"lru_order": [hash...] (all resident, by LRU rank, first = evicted first),
                        "ref_counts": [[hash, ref_cnt], ...] sorted by hash}
                       with eviction_policy "arc", ARCCachePolicy's lists in their OrderedDict order (LRU end
                       first) instead of "lru_order": {"arc": {"t1": [...], "t2": [...], "b1": [...], "b2": [...],
                       "target_t1_size": float}, "ref_counts": ...}
A stream may also be {"runs": [input, ...]}: each run on a fresh manager, answered as {"vllm_version", "runs": [...]}.
Output: {"vllm_version", "results": [...], "final": state plus "stats": get_stats().reduce() taken once at the
end (so the allocation histogram and stores_skipped cover the whole run)}.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import vllm  # noqa: E402
from vllm.v1.kv_offload.base import ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy  # noqa: E402


def key(h: int):
    return make_offload_key(int(h).to_bytes(32, "big"), 0)


def name(k) -> int:
    return int.from_bytes(k[:-4], "big")


def state(m: CPUOffloadingManager) -> dict:
    policy = m._policy
    if isinstance(policy, ARCCachePolicy):
        chunks = {**policy.t1, **policy.t2}
        return {"arc": {"t1": [name(k) for k in policy.t1], "t2": [name(k) for k in policy.t2],
                        "b1": [name(k) for k in policy.b1], "b2": [name(k) for k in policy.b2],
                        "target_t1_size": float(policy.target_t1_size)},
                "ref_counts": sorted([name(k), chunks[k].ref_cnt] for k in chunks)}
    chunks = policy.chunks
    order = sorted(chunks, key=lambda k: (policy._ranks[k], k))
    return {"lru_order": [name(k) for k in order],
            "ref_counts": sorted([name(k), chunks[k].ref_cnt] for k in chunks)}


def run(spec: dict) -> dict:
    m = CPUOffloadingManager(num_chunks=spec["num_chunks"], cache_policy=spec.get("eviction_policy", "lru"),
                             store_threshold=spec.get("store_threshold", 1),
                             max_tracker_size=spec.get("max_tracker_size", 64_000))
    contexts: dict[str, ReqContext] = {}
    results = []
    for op in spec["ops"]:
        kind = op["op"]
        ctx = contexts.get(op.get("request"))
        keys = [key(h) for h in op.get("hashes", [])]
        out = None
        if kind == "new_request":
            ctx = contexts[op["request"]] = ReqContext(req_id=op["request"])
            for h, end_token in op["end_tokens"]:
                ctx.set_offload_key_position(key(h), end_token)
            m.on_new_request(ctx)
        elif kind == "lookup":
            out = m.lookup(key(op["hash"]), ctx).name
        elif kind == "prepare_load":
            out = [int(i) for i in m.prepare_load(keys, ctx).block_ids]
        elif kind == "complete_load":
            m.complete_load(keys, ctx)
        elif kind == "prepare_store":
            r = m.prepare_store(keys, ctx)
            if r is not None:
                out = {"store": [name(k) for k in r.keys_to_store],
                       "chunk_ids": [int(i) for i in r.store_spec.block_ids],
                       "evicted": [name(k) for k in r.evicted_keys]}
        elif kind == "complete_store":
            m.complete_store(keys, ctx, success=op.get("success", True))
        elif kind == "request_finished":
            m.on_request_finished(ctx)
        elif kind == "reset_cache":
            m.reset_cache()
        elif kind == "state":
            out = state(m)
        else:
            raise SystemExit(f"unknown op {kind!r}")
        results.append(out)
    final = state(m)
    final["stats"] = m.get_stats().reduce()
    return {"results": results, "final": final}


def main() -> None:
    stream = json.load(sys.stdin)
    if "runs" in stream:
        answer = {"runs": [run(spec) for spec in stream["runs"]]}
    else:
        answer = run(stream)
    json.dump({"vllm_version": vllm.__version__, **answer}, sys.stdout)


if __name__ == "__main__":
    main()
