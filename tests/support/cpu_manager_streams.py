"""Differential testing of kvsim's CPU offloading manager against vLLM's own `CPUOffloadingManager`.

A stream is a list of runs; a run is a manager configuration and a list of operations
(benchmarks/oracles/vllm/offloading/manager_oracle.py documents the format). vLLM answers it through
`manager_oracle.py` under the oracle venv; kvsim answers it here (`replay_kvsim`) through
`sim.engines.vllm.offload.CpuOffloadingManager`; both answers must be equal op by op: lookup answers, granted
stores with their slots and evictions in order (or None), LRU order (under ARC: T1, T2, B1, B2 in order and
target_t1_size) and ref counts, and the stats.

The random runs are generated with kvsim's own manager deciding which ops are legal next (vLLM asserts on, say, a
load of a chunk that is not ready), so that the stream is fixed once generated; if kvsim's idea of what is legal
were wrong, vLLM would fail the run.

Regenerate the golden answers: `KVSIM_VLLM_PYTHON=<oracle venv>/bin/python python -m tests.support.cpu_manager_streams`.
"""

from __future__ import annotations

import random

from sim.engines.vllm.offload import CpuOffloadingManager, LookupResult
from tests.support.oracle_support import Oracle
from tests.support.paths import GOLDEN, REPO

ORACLE = Oracle(script=REPO / "benchmarks" / "oracles" / "vllm" / "offloading" / "manager_oracle.py",
                env_var="KVSIM_VLLM_PYTHON", golden_dir=GOLDEN / "cpu_manager", version_key="vllm_version",
                setup="benchmarks/oracles/vllm/offloading/README.md", timeout_s=600)
ORACLE_VLLM_VERSION = "0.33.0"
TOKENS_PER_CHUNK = 16


def new_manager(spec: dict) -> CpuOffloadingManager:
    return CpuOffloadingManager(spec["num_chunks"], eviction_policy=spec.get("eviction_policy", "lru"),
                                store_threshold=spec.get("store_threshold", 1),
                                max_tracker_size=spec.get("max_tracker_size", 64_000))


def state(m: CpuOffloadingManager) -> dict:
    order = {"arc": m.arc_state()} if m.eviction_policy == "arc" else {"lru_order": m.lru_order()}
    return {**order, "ref_counts": sorted([h, r] for h, r in m.ref_counts().items())}


def apply(m: CpuOffloadingManager, op: dict):
    """One op on kvsim's manager, answered as manager_oracle.py answers it."""
    kind = op["op"]
    if kind == "new_request":
        m.on_new_request(op["request"], {h: t for h, t in op["end_tokens"]})
    elif kind == "lookup":
        return m.lookup(op["hash"]).value
    elif kind == "prepare_load":
        return list(m.prepare_load(op["request"], op["hashes"]))
    elif kind == "complete_load":
        m.complete_load(op["hashes"])
    elif kind == "prepare_store":
        out = m.prepare_store(op["request"], op["hashes"])
        if out is not None:
            return {"store": list(out.chunk_hashes_to_store), "chunk_ids": list(out.chunk_ids),
                    "evicted": list(out.evicted_chunk_hashes)}
    elif kind == "complete_store":
        m.complete_store(op["hashes"], success=op.get("success", True))
    elif kind == "request_finished":
        m.request_finished(op["request"])
    elif kind == "reset_cache":
        m.reset_cache()
    elif kind == "state":
        return state(m)
    else:
        raise ValueError(f"unknown op {kind!r}")
    return None


def vllm_stats(m: CpuOffloadingManager) -> dict:
    """kvsim's counters as vLLM's `get_stats().reduce()` reports them when taken once, at the end (`CM` 465-500)."""
    c = m.counters()
    usage = c.num_used_chunks / m.num_chunks
    write_usage = c.num_write_pending_chunks / m.num_chunks
    stats: dict = {"vllm:kv_offload_cpu_cache_usage_perc": usage}
    if c.num_allocation_attempts:
        stats["vllm:kv_offload_cpu_allocation_size_count"] = c.num_allocation_attempts
        stats["vllm:kv_offload_cpu_allocation_size_sum"] = c.num_allocation_chunks
    stats["vllm:kv_offload_cpu_cache_write_usage_perc"] = write_usage
    stats["vllm:kv_offload_cpu_cache_read_usage_perc"] = max(usage - write_usage, 0.0)
    if m.store_threshold >= 2:
        stats["vllm:kv_offload_stores_skipped"] = c.num_stores_skipped
    return stats


def replay_run(spec: dict) -> dict:
    m = new_manager(spec)
    results = []
    for op in spec["ops"]:
        results.append(apply(m, op))
        m.check_invariants()
    return {"results": results, "final": {**state(m), "stats": vllm_stats(m)}}


def replay_kvsim(stream: dict) -> dict:
    return {"runs": [replay_run(spec) for spec in stream["runs"]]}


def differences(vllm_answer: dict, kvsim_answer: dict) -> list[str]:
    diffs = []
    if len(vllm_answer["runs"]) != len(kvsim_answer["runs"]):
        return [f"{len(vllm_answer['runs'])} runs from vLLM, {len(kvsim_answer['runs'])} from kvsim"]
    for i, (v, k) in enumerate(zip(vllm_answer["runs"], kvsim_answer["runs"])):
        for j, (rv, rk) in enumerate(zip(v["results"], k["results"])):
            if rv != rk:
                diffs.append(f"run {i} op {j}: vLLM {rv!r}, kvsim {rk!r}")
                break  # later ops of a diverged run say nothing new
        if v["final"] != k["final"]:
            diffs.append(f"run {i} final: vLLM {v['final']!r}, kvsim {k['final']!r}")
    return diffs


# --- the streams ---


def probe_run() -> dict:
    """The rules doc's probe (§4.4): 6 chunks; A stores k1..k3, D stores k4..k6, G re-offers A's chunks and
    finishes; four new single stores evict k6, k5, k4, k3."""
    ops: list[dict] = []

    def request(rid: str, hashes: list[int]) -> None:
        ops.append({"op": "new_request", "request": rid,
                    "end_tokens": [[h, (i + 1) * TOKENS_PER_CHUNK] for i, h in enumerate(hashes)]})
        ops.append({"op": "prepare_store", "request": rid, "hashes": hashes})
        ops.append({"op": "complete_store", "request": rid, "hashes": hashes, "success": True})
        ops.append({"op": "request_finished", "request": rid})

    request("A", [1, 2, 3])
    request("D", [4, 5, 6])
    request("G", [1, 2, 3])
    ops.append({"op": "state"})
    for h in (7, 8, 9, 10):
        request(f"N{h}", [h])
    return {"num_chunks": 6, "ops": ops}


def random_run(seed: int, *, store_threshold: int = 1, max_tracker_size: int = 64_000,
               eviction_policy: str = "lru", min_chunks: int = 2, requests: tuple[int, int] = (4, 10)) -> dict:
    """A random but legal interleaving of up to three live requests over a few shared prefixes."""
    rng = random.Random(seed)
    spec = {"num_chunks": rng.randint(min_chunks, 8), "store_threshold": store_threshold,
            "max_tracker_size": max_tracker_size, "ops": []}
    if eviction_policy != "lru":  # the LRU streams' specs (and so their digests) stay as they were recorded
        spec["eviction_policy"] = eviction_policy
    m = new_manager(spec)
    ops: list[dict] = spec["ops"]

    def emit(op: dict):
        ops.append(op)
        return apply(m, op)

    docs = [[100 * d + i for i in range(1, rng.randint(2, 7))] for d in range(rng.randint(2, 4))]
    live: dict[str, dict] = {}
    pending_loads: list[list[int]] = []
    pending_stores: list[list[int]] = []
    num_started = 0
    num_requests = rng.randint(*requests)
    while num_started < num_requests or live or pending_loads or pending_stores:
        choices = []
        if num_started < num_requests and len(live) < 3:
            choices.append("start")
        if live:
            choices += ["advance"] * 3
        if pending_loads:
            choices.append("complete_load")
        if pending_stores:
            choices += ["complete_store"] * 2
        choices += ["lookup", "state"]
        if not (pending_loads or pending_stores) and rng.random() < 0.05:
            choices.append("reset_cache")
        choice = rng.choice(choices)
        if choice == "start":
            doc = rng.choice(docs)
            hashes = doc[:rng.randint(1, len(doc))]
            rid = f"r{num_started}"
            num_started += 1
            emit({"op": "new_request", "request": rid,
                  "end_tokens": [[h, (i + 1) * TOKENS_PER_CHUNK] for i, h in enumerate(hashes)]})
            num_hits = 0
            for h in hashes:  # the scheduler's maximal prefix lookup
                if emit({"op": "lookup", "hash": h}) != LookupResult.HIT.value:
                    break
                num_hits += 1
            if num_hits and rng.random() < 0.7:
                emit({"op": "prepare_load", "request": rid, "hashes": hashes[:num_hits]})
                pending_loads.append(hashes[:num_hits])
            cuts = sorted(rng.sample(range(num_hits + 1, len(hashes) + 1), k=min(2, len(hashes) - num_hits)))
            live[rid] = {"hashes": hashes, "start": num_hits, "cuts": cuts}
        elif choice == "advance":
            rid = rng.choice(sorted(live))
            r = live[rid]
            if not r["cuts"]:
                emit({"op": "request_finished", "request": rid})
                del live[rid]
                continue
            end = r["cuts"].pop(0)
            # Sometimes the offer also carries resident chunks (a re-offer of a GPU-hit prefix).
            start = 0 if rng.random() < 0.3 else r["start"]
            r["start"] = end
            out = emit({"op": "prepare_store", "request": rid, "hashes": r["hashes"][start:end]})
            if out and out["store"]:
                pending_stores.append(out["store"])
        elif choice == "complete_load":
            emit({"op": "complete_load", "request": "-", "hashes": pending_loads.pop(rng.randrange(len(pending_loads)))})
        elif choice == "complete_store":
            emit({"op": "complete_store", "request": "-", "success": rng.random() < 0.85,
                  "hashes": pending_stores.pop(rng.randrange(len(pending_stores)))})
        elif choice == "lookup":
            emit({"op": "lookup", "hash": rng.choice(rng.choice(docs))})
        elif choice == "state":
            emit({"op": "state"})
        else:
            emit({"op": "reset_cache"})
    return spec


STREAMS = {
    "probe": lambda: {"runs": [probe_run()]},
    "random_lru": lambda: {"runs": [random_run(seed) for seed in range(40)]},
    "random_threshold": lambda: {"runs": [random_run(1000 + seed, store_threshold=2, max_tracker_size=4)
                                          for seed in range(20)]},
    # ARC on 3-8 chunks: evictions from both lists, B1 and B2 ghost hits moving the target, reuse at finish.
    "random_arc": lambda: {"runs": [random_run(2000 + seed, eviction_policy="arc", min_chunks=3, requests=(8, 16))
                                    for seed in range(40)]},
}


def build_stream(name: str) -> dict:
    return STREAMS[name]()


if __name__ == "__main__":
    ORACLE.regenerate(STREAMS, build_stream)
