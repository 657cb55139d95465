"""Throwaway probe: drive vLLM 0.33.0's scheduler-side CPUOffloadingManager
(LRU and ARC policies) directly, on CPU, with a handful of fake block hashes.

Run: /work/main/.venv-vllm-oracle/bin/python /work/research-15/probe_manager.py
"""

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

# Import check: which heavy modules come in with the scheduler-side classes.
from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

print("torch imported:", "torch" in sys.modules,
      "| torch.cuda initialized:", sys.modules["torch"].cuda.is_initialized())


def K(i: int):
    # OffloadKey = block hash bytes + 4-byte group index (group 0).
    return make_offload_key(i.to_bytes(32, "big"), 0)


def name(k) -> str:
    return f"k{int.from_bytes(k[:-4], 'big')}"


def ctx(req_id: str, keys, tokens_per_chunk=16) -> ReqContext:
    c = ReqContext(req_id=req_id)
    for pos, k in enumerate(keys, 1):
        c.set_offload_key_position(k, pos * tokens_per_chunk)
    return c


def show(m, keys, label):
    print(f"  {label}: " + " ".join(f"{name(k)}={m.lookup(k, None).name}" for k in keys))


def run(policy: str):
    print(f"\n=== policy={policy}, capacity=4 chunks ===")
    m = CPUOffloadingManager(num_chunks=4, cache_policy=policy, enable_events=True)
    a = [K(i) for i in (1, 2, 3)]        # request A: 3-chunk prefix
    b = [K(i) for i in (1, 2, 10, 11)]   # request B: shares 2 chunks with A
    every = [K(i) for i in (1, 2, 3, 10, 11)]

    # Request A: store its 3 chunks (scheduler does this in build_connector_meta).
    ca = ctx("A", a)
    m.on_new_request(ca)
    out = m.prepare_store(a, ca)
    print("  A prepare_store ->", [name(k) for k in out.keys_to_store],
          "evicted", [name(k) for k in out.evicted_keys])
    show(m, a, "after prepare_store (not yet complete)")
    m.complete_store(out.keys_to_store, ca)
    show(m, a, "after complete_store")
    m.on_request_finished(ca)

    # Request B: lookup (scheduler: _maximal_prefix_lookup), load hits, store the rest.
    cb = ctx("B", b)
    m.on_new_request(cb)
    hits = 0
    for k in b:
        if m.lookup(k, cb) is not LookupResult.HIT:
            break
        hits += 1
    print("  B consecutive CPU hits:", hits)
    spec = m.prepare_load(b[:hits], cb)
    print("  B prepare_load -> CPU chunk ids", list(spec.block_ids))
    out = m.prepare_store(b[hits:], cb)  # needs 2 chunks, 1 free -> evict 1
    print("  B prepare_store ->", [name(k) for k in out.keys_to_store],
          "evicted", [name(k) for k in out.evicted_keys])
    m.complete_store(out.keys_to_store, cb)
    m.complete_load(b[:hits], cb)
    m.on_request_finished(cb)
    show(m, every, "final residency")

    # Full tier with everything pinned: prepare_store returns None (store dropped).
    cc = ctx("C", [K(20)])
    m.on_new_request(cc)
    pin = [k for k in every if m.lookup(k, cc) is LookupResult.HIT]
    m.prepare_load(pin, cc)
    print("  C prepare_store with all chunks pinned ->", m.prepare_store([K(20)], cc))
    m.complete_load(pin, cc)

    # Store of an already-resident key: nothing to store, no eviction.
    out = m.prepare_store(pin[:1], cc)
    print("  prepare_store(resident key) -> keys_to_store", out.keys_to_store)

    print("  events:")
    for ev in m.take_events():
        print(f"    {'REMOVED' if ev.removed else 'STORED '} {ev.medium.value}",
              [name(k) for k in ev.keys])
    st = m.get_stats()
    print("  stats:", st.reduce())


def run_threshold():
    print("\n=== store_threshold=2 (a chunk must be offered twice) ===")
    m = CPUOffloadingManager(num_chunks=4, store_threshold=2)
    for rid in ("A", "B"):
        c = ctx(rid, [K(1)])
        m.on_new_request(c)
        out = m.prepare_store([K(1)], c)
        print(f"  {rid} prepare_store(k1) -> {[name(k) for k in out.keys_to_store]}")
        m.complete_store(out.keys_to_store, c)
        m.on_request_finished(c)
    print("  stats:", m.get_stats().reduce())


run("lru")
run("arc")
run_threshold()


def run_lru_order():
    print("\n=== LRU eviction order (capacity 6) ===")
    m = CPUOffloadingManager(num_chunks=6, cache_policy="lru")
    a = [K(i) for i in (1, 2, 3)]
    d = [K(i) for i in (4, 5, 6)]
    for rid, keys in (("A", a), ("D", d)):
        c = ctx(rid, keys)
        m.on_new_request(c)
        out = m.prepare_store(keys, c)
        m.complete_store(out.keys_to_store, c)
        m.on_request_finished(c)
    # Request G re-offers A's chunks (as a GPU-hit request does when it loaded nothing):
    # resident+ready keys are 'reused', nothing is stored, recency refreshed at finish.
    g = ctx("G", a)
    m.on_new_request(g)
    out = m.prepare_store(a, g)
    print("  G re-offers A's chunks -> keys_to_store", [name(k) for k in out.keys_to_store])
    m.on_request_finished(g)
    # Now store 4 new chunks one request at a time and watch evictions.
    for i in (7, 8, 9, 10):
        c = ctx(f"N{i}", [K(i)])
        m.on_new_request(c)
        out = m.prepare_store([K(i)], c)
        print(f"  store k{i} -> evicted", [name(k) for k in out.evicted_keys])
        m.complete_store(out.keys_to_store, c)
        m.on_request_finished(c)


run_lru_order()
