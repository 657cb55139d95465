"""Differential testing of the CPU KV tier against vLLM 0.33.0's own OffloadingConnector: streams, kvsim's lockstep
replay with the same fake worker, and the comparison.

vLLM's side is `benchmarks/oracles/vllm/offload_oracle.py` (its Scheduler with `kv_offloading_size` set, the
connector's scheduler side and CPU manager, a fake worker that reports transfer jobs after `transfer_steps` steps;
conventions in benchmarks/oracles/vllm/offloading/README.md). kvsim's side runs `sim.engines.vllm.scheduler.Scheduler`
with `OffloadingConnector` through the same loop and the same fake worker (`LockstepTransfers`, a port of the
oracle's `FakeWorker`). Compared exactly: per request the GPU and CPU hit tokens, the load step, the steps spent
waiting for the load and deferred, admission, first token and finish; per worker the GPU and connector prefix-cache
counters, the allocation counters, the CPU tier's final LRU order (ARC: T1, T2, target), the GPU free queue and KV
events; per step every load, store, flush and eviction decision and which jobs were handed to and reported by the
worker.

Chunk names: a CPU chunk is named [request id, chunk index] after the first store job that wrote it on that worker
(vLLM's sha256 values are seeded per process), on both sides.
"""

from __future__ import annotations

import random
from dataclasses import asdict

from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.offload.connector import ConnectorStep, OffloadingConnector
from sim.engines.vllm.offload.cpu_manager import CpuOffloadingManager
from sim.engines.vllm.request_state import RequestState
from sim.engines.vllm.scheduler import Scheduler, SchedulerLimits
from sim.workloads.request import Request
from tests.support.oracle_streams import ORACLE_VLLM_VERSION, _EventRecorder, chained_block_hashes, token_ids
from tests.support.oracle_support import Oracle
from tests.support.paths import GOLDEN, REPO

ORACLE = Oracle(script=REPO / "benchmarks" / "oracles" / "vllm" / "offload_oracle.py", env_var="KVSIM_VLLM_PYTHON",
                golden_dir=GOLDEN / "vllm_offload", version_key="vllm_version",
                setup="benchmarks/oracles/vllm/offloading/README.md", timeout_s=900)
CHUNK_BYTES = 65536
"""The oracle's KV page: 1 layer x 8 KV heads x 128 x bf16 x (K, V) x 16 tokens; cpu_bytes = chunks x this."""


# ---------------------------------------------------------------------------------------------- streams
def _base(num_gpu_blocks: int, chunks: int, *, transfer_steps: int = 1, workers: int = 1, mode: str = "one_at_a_time",
          concurrency: int = 1, batched: int = 8192, max_num_seqs: int = 256, seed: int = 0) -> dict:
    return {"block_size": 16, "num_gpu_blocks": num_gpu_blocks, "num_workers": workers, "mode": mode,
            "concurrency": concurrency, "max_num_batched_tokens": batched, "max_num_seqs": max_num_seqs,
            "seed": seed, "offload": {"cpu_bytes": chunks * CHUNK_BYTES, "eviction_policy": "lru",
                                      "transfer_steps": transfer_steps}}


def _r(rid: str, toks: list[int], max_tokens: int = 2, worker: int = 0) -> dict:
    return {"id": rid, "worker": worker, "prompt_token_ids": toks, "max_tokens": max_tokens}


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _narrated() -> dict[str, dict]:
    """The self-test's five narrated streams (offloading/README.md), plus two that exercise flushes and a full
    tier."""
    A = _seq(1000, 70)
    out = {
        # A is stored (4 chunks), two floods evict it from an 11-block GPU, A2 = A loads 64 tokens from CPU.
        "cpu_hit_after_gpu_eviction": (_base(12, 32), [_r("A", A), _r("F0", _seq(5000, 150)),
                                                       _r("F1", _seq(5200, 150)), _r("A2", A)]),
        # 40 generated tokens are never stored (prompt-only).
        "prompt_chunks_only": (_base(64, 32), [_r("D", _seq(3000, 40), max_tokens=40)]),
        # 6-chunk tier: C evicts B2, B1, B0, A2 (B's provisional rank is older than A's commit).
        "lru_eviction_order": (_base(64, 6), [_r("A", _seq(10000, 53)), _r("B", _seq(11000, 53)),
                                              _r("C", _seq(12000, 69))]),
        # A block-aligned prompt still on the GPU loads its last block from CPU.
        "block_aligned_last_block_from_cpu": (_base(64, 16), [_r("B", _seq(2000, 64)), _r("B2", _seq(2000, 64))]),
        # The same with 3-step transfers: B2 is deferred while B's store is in flight.
        "block_aligned_slow_transfers": (_base(64, 16, transfer_steps=3),
                                         [_r("B", _seq(2000, 64)), _r("B2", _seq(2000, 64))]),
        # Slow stores and a tiny GPU: a finished request's freed blocks are reallocated while their store is in
        # flight (a flush), and a 4-chunk tier fills with pending stores (allocation failures, retried).
        "flush_and_full_tier": (_base(9, 4, transfer_steps=4, mode="closed_loop", concurrency=2),
                                [_r(f"q{i}", _seq(20000 + 40 * (i % 3), 40 + (i % 2) * 16), max_tokens=1 + i % 3)
                                 for i in range(12)]),
    }
    return {name: dict(spec, requests=reqs) for name, (spec, reqs) in out.items()}


def _shared_prefix(*, seed: int, workers: int, prefixes: int, prefix_tokens: int, tail_tokens: int,
                   output_tokens: int, requests: int) -> list[dict]:
    """The reference workload's shape: N shared prefixes, a unique tail each, random worker (random routing)."""
    rng = random.Random(seed)
    prefix = [token_ids(seed * 1000 + p, prefix_tokens) for p in range(prefixes)]
    out = []
    for i in range(requests):
        p = rng.randrange(prefixes)
        out.append(_r(f"r{i}", prefix[p] + token_ids(seed * 100000 + i, tail_tokens), max_tokens=output_tokens,
                      worker=rng.randrange(workers)))
    return out


def _pressure(seed: int) -> list[dict]:
    """A tiny GPU pool, many requests in flight, shared prefixes of several lengths: preemption and eviction on
    both tiers."""
    rng = random.Random(seed)
    prefixes = [token_ids(seed * 100 + k, n) for k, n in enumerate((64, 96, 130))]
    return [_r(f"q{i}", prefixes[rng.randrange(3)] + token_ids(seed * 1000 + i, rng.randrange(1, 80)),
               max_tokens=rng.randrange(1, 60), worker=rng.randrange(2)) for i in range(60)]


def _build(name: str) -> dict:
    if name in NARRATED:
        return NARRATED[name]
    if name == "reference_n12_c8_3w":
        # 3 workers of ~5 prompts of GPU KV each, 12 prefixes, a CPU tier of ~8 prompts per worker (it evicts).
        return dict(_base(200, 300, workers=3, mode="closed_loop", concurrency=8, batched=2048, seed=12),
                    requests=_shared_prefix(seed=12, workers=3, prefixes=12, prefix_tokens=496, tail_tokens=85,
                                            output_tokens=16, requests=160))
    if name == "reference_n12_c8_3w_slow":
        return dict(_base(200, 300, workers=3, mode="closed_loop", concurrency=8, batched=2048, seed=13,
                          transfer_steps=3),
                    requests=_shared_prefix(seed=13, workers=3, prefixes=12, prefix_tokens=496, tail_tokens=85,
                                            output_tokens=16, requests=160))
    if name == "pressure":
        return dict(_base(30, 24, workers=2, mode="closed_loop", concurrency=8, batched=64, max_num_seqs=5,
                          seed=3, transfer_steps=2), requests=_pressure(77))
    if name == "pressure_arc":
        # The same shape under ARC, other requests, a smaller tier: evictions from T1 and T2, ghost hits moving the
        # target (to a non-integer value on worker 0), CPU hits.
        spec = _base(30, 20, workers=2, mode="closed_loop", concurrency=8, batched=64, max_num_seqs=5, seed=4,
                     transfer_steps=2)
        spec["offload"]["eviction_policy"] = "arc"
        return dict(spec, requests=_pressure(78))
    raise KeyError(name)


NARRATED = _narrated()
STREAMS = [*NARRATED, "reference_n12_c8_3w", "reference_n12_c8_3w_slow", "pressure", "pressure_arc"]


def build_stream(name: str) -> dict:
    return _build(name)


# ---------------------------------------------------------------------------------------------- kvsim side
class LockstepTransfers:
    """The oracle's `FakeWorker` for kvsim's connector (offloading/README.md, "Transfer timing convention"): loads
    of step k are handed in step k, stores of step k in step k+1; a job handed in step h is reported in step
    h + T - 1; flushed jobs are reported in the step that names them."""

    def __init__(self, transfer_steps: int) -> None:
        self.T = transfer_steps
        self.unsubmitted: list[int] = []
        self.inflight: list[tuple[int, int]] = []  # (due step, job id)

    def step(self, k: int, step: ConnectorStep) -> tuple[list[int], list[int]]:
        flush = set(step.jobs_to_flush)
        handed = []
        for jid in self.unsubmitted + [j.job_id for j in step.store_jobs if j.job_id in flush]:
            self.inflight.append((k if jid in flush else k + self.T - 1, jid))
            handed.append(jid)
        self.unsubmitted = []
        self.inflight = [(k if jid in flush else due, jid) for due, jid in self.inflight]
        for job in step.load_jobs:
            self.inflight.append((k + self.T - 1, job.job_id))
            handed.append(job.job_id)
        self.unsubmitted = [j.job_id for j in step.store_jobs if j.job_id not in flush]
        done = sorted(jid for due, jid in self.inflight if due <= k)
        self.inflight = [(due, jid) for due, jid in self.inflight if due > k]
        return sorted(handed), done


def replay_kvsim(stream: dict, vllm_version: str = ORACLE_VLLM_VERSION) -> dict:
    """kvsim's answer for `stream`, in offload_oracle.py's output format (minus `vllm_version` and `offload`)."""
    B = stream["block_size"]
    behaviour = VllmBehaviour.for_version(vllm_version)
    max_model_len = stream.get("max_model_len", 40960)
    off = stream["offload"]
    limits = SchedulerLimits(stream["max_num_batched_tokens"], stream["max_num_seqs"], max_model_len)
    nw = stream["num_workers"]
    reqs = stream["requests"]
    ids = [r["id"] for r in reqs]
    scheds, fakes, names = [], [], []
    for w in range(nw):
        kv = KVCacheManager(num_blocks=stream["num_gpu_blocks"], block_size=B, max_model_len=max_model_len,
                            unhashed_to_head=behaviour.unhashed_to_head)
        manager = CpuOffloadingManager(off["cpu_bytes"] // CHUNK_BYTES, eviction_policy=off["eviction_policy"])
        connector = OffloadingConnector(manager, block_size=B, bytes_per_block=CHUNK_BYTES)
        scheds.append(Scheduler(limits, kv, behaviour, connector))
        fakes.append(LockstepTransfers(off["transfer_steps"]))
        names.append({})
    recorders = [_EventRecorder(s.kv, ids) for s in scheds]
    rec: dict[int, dict] = {}
    step_now = [0]

    for w, s in enumerate(scheds):
        orig_record = s._record_lookup

        def record_lookup(state, num_hit, preempted, _orig=orig_record):
            r = rec[state.request.request_id]
            if state.num_preemptions == 0 and r["gpu_hit_tokens"] is None:
                r["gpu_hit_tokens"] = num_hit
            return _orig(state, num_hit, preempted)

        s._record_lookup = record_lookup
        conn = s.connector
        orig_lookup, orig_after = conn.lookup, conn.after_alloc

        def lookup(state, gpu_hit, _orig=orig_lookup):
            ext = _orig(state, gpu_hit)
            if ext is None:
                d = rec[state.request.request_id]["deferred_steps"]
                if not d or d[-1] != step_now[0]:
                    d.append(step_now[0])
            return ext

        def after_alloc(state, gpu_hit, ext, _orig=orig_after):
            r = rec[state.request.request_id]
            if state.num_preemptions == 0 and r["cpu_hit_tokens"] is None:
                r["cpu_hit_tokens"] = ext
                if ext:
                    r["load_step"] = step_now[0]
            return _orig(state, gpu_hit, ext)

        conn.lookup, conn.after_alloc = lookup, after_alloc

    def submit(idx: int) -> None:
        r = reqs[idx]
        req = Request(request_id=idx, prompt_tokens=len(r["prompt_token_ids"]), output_tokens=r["max_tokens"],
                      block_hashes=chained_block_hashes(r["prompt_token_ids"], B))
        rec[idx] = {"id": r["id"], "worker": r["worker"], "gpu_hit_tokens": None, "cpu_hit_tokens": None,
                    "load_step": None, "waiting_for_remote_kvs_steps": [], "deferred_steps": [], "admit_step": None,
                    "hit_tokens": None, "first_token_step": None, "finish_step": None, "num_preemptions": 0}
        scheds[r["worker"]].add_request(RequestState(req, r["worker"], 0.0, block_size=B))

    def job_row(job, w) -> dict:
        rid = ids[job.request.request.request_id]
        if job.is_store:
            start, stop = job.chunk_indices[0], job.chunk_indices[-1] + 1
            chosen = set(job.chunk_indices)
            for i, h in enumerate(job.request.block_hashes(start, stop), start):
                if i in chosen:
                    names[w].setdefault(h, [rid, i])
        return {"job": job.job_id, "request": rid, "chunks": list(job.chunk_indices)}

    concurrency = 1 if stream["mode"] == "one_at_a_time" else stream["concurrency"]
    next_idx = 0
    while next_idx < min(concurrency, len(reqs)):
        submit(next_idx)
        next_idx += 1
    step_rows: list[list[dict]] = [[] for _ in range(nw)]
    k = 0
    while True:
        active = [w for w in range(nw) if scheds[w].has_work]
        if not active and next_idx >= len(reqs):
            break
        if not active:
            raise RuntimeError("kvsim: no active worker but requests left")
        step_now[0] = k
        finished_now = 0
        for w in active:
            s = scheds[w]
            plan = s.schedule(float(k))
            for st in plan.admitted:
                r = rec[st.request.request_id]
                if r["admit_step"] is None:
                    r["admit_step"], r["hit_tokens"] = k, st.num_computed_tokens - plan.num_scheduled_tokens[st]
            for st in s.holding:
                if st.loading:
                    rec[st.request.request_id]["waiting_for_remote_kvs_steps"].append(k)
            cstep = s.take_connector_step()
            loads = [job_row(j, w) for j in cstep.load_jobs]
            stores = [job_row(j, w) for j in cstep.store_jobs]
            evicted = [{"for_request": ids[st.request.request_id], "chunks": [names[w][h] for h in hashes]}
                       for st, hashes in cstep.evicted]
            handed, done = fakes[w].step(k, cstep)
            outcome = s.update_from_output(plan, float(k), finished_jobs=done)
            s.kv.publish(float(k))
            flush = list(cstep.jobs_to_flush)
            if loads or stores or evicted or flush or handed or done:
                step_rows[w].append({"step": k, "load_jobs": loads, "store_jobs": stores, "jobs_to_flush": flush,
                                     "evicted": evicted, "handed_to_worker": handed, "completed": done})
            for st in outcome.first_token:
                rec[st.request.request_id]["first_token_step"] = k
            for st in outcome.finished:
                r = rec[st.request.request_id]
                r["finish_step"], r["num_preemptions"] = k, st.num_preemptions
                finished_now += 1
        for _ in range(finished_now):
            if next_idx < len(reqs):
                submit(next_idx)
                next_idx += 1
        k += 1
    for recorder in recorders:
        recorder.check_drained()

    workers = []
    for w, s in enumerate(scheds):
        st, c, mgr = s.kv.stats, s.connector.counters.prefix_cache, s.connector.manager
        mc = mgr.counters()
        kv_stats = {"vllm:kv_offload_cpu_allocation_size_count": mc.num_allocation_attempts,
                    "vllm:kv_offload_cpu_allocation_size_sum": mc.num_allocation_chunks}
        if mc.num_allocation_failures:
            kv_stats["vllm:kv_offload_allocation_failure"] = mc.num_allocation_failures
        workers.append({
            **asdict(st), "num_free_blocks_end": s.kv.num_free_blocks,
            "cpu_num_chunks": mgr.num_chunks,
            "cpu_resident_end": _resident(mgr, names[w]),
            "cpu_not_ready_or_pinned_end": sorted(names[w][h] for h, ref in mgr.ref_counts().items() if ref != 0),
            "connector_prefix_cache_stats": {**asdict(c), "hits_by_source": {"host": c.hits} if c.hits else {}},
            "kv_connector_stats": kv_stats,
            "jobs_in_flight_end": int(s.connector.has_jobs),
        })
    return {"num_steps": k, "requests": [rec[i] for i in range(len(reqs))], "workers": workers,
            "free_queue_end": [s.kv.pool.free_queue() for s in scheds], "events": [r.rows for r in recorders],
            "offload_steps": step_rows}


def _resident(mgr: CpuOffloadingManager, names: dict) -> dict:
    """The CPU tier's chunks at the end as offload_oracle.py reports them: LRU order, or ARC's T1 and T2 (LRU end
    first) and target (its ghost lists are not reported)."""
    if mgr.eviction_policy == "lru":
        return {"lru_order": [names[h] for h in mgr.lru_order()]}
    a = mgr.arc_state()
    return {"t1": [names[h] for h in a["t1"]], "t2": [names[h] for h in a["t2"]],
            "target_t1_size": a["target_t1_size"]}


# ---------------------------------------------------------------------------------------------- comparison
REQUEST_KEYS = ("gpu_hit_tokens", "cpu_hit_tokens", "load_step", "waiting_for_remote_kvs_steps", "deferred_steps",
                "admit_step", "hit_tokens", "first_token_step", "finish_step", "num_preemptions")
KV_STATS_COMPARED = ("vllm:kv_offload_cpu_allocation_size_count", "vllm:kv_offload_cpu_allocation_size_sum",
                     "vllm:kv_offload_allocation_failure")


def differences(expected: dict, actual: dict, *, limit: int = 12) -> list[str]:
    """Human-readable differences between the oracle's answer and kvsim's, most telling first."""
    out = []
    for e, a in zip(expected["requests"], actual["requests"]):
        for key in REQUEST_KEYS:
            if e[key] != a[key]:
                out.append(f"request {e['id']} (worker {e['worker']}): {key} vLLM={e[key]} kvsim={a[key]}")
    for w, (e, a) in enumerate(zip(expected["workers"], actual["workers"])):
        for key, value in e.items():
            if key == "kv_connector_stats":
                got = a[key]
                for stat in KV_STATS_COMPARED:
                    if value.get(stat) != got.get(stat):
                        out.append(f"worker {w}: {stat} vLLM={value.get(stat)} kvsim={got.get(stat)}")
            elif a.get(key) != value:
                out.append(f"worker {w}: {key} vLLM={value} kvsim={a.get(key)}")
    for w, (e, a) in enumerate(zip(expected["offload_steps"], actual["offload_steps"])):
        if e != a:
            first = next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), min(len(e), len(a)))
            out.append(f"worker {w}: transfer decisions differ from row {first} (vLLM {len(e)}, kvsim {len(a)} rows): "
                       f"vLLM {e[first:first + 2]} kvsim {a[first:first + 2]}")
    for w, (e, a) in enumerate(zip(expected["free_queue_end"], actual["free_queue_end"])):
        if e != a:
            out.append(f"worker {w}: GPU free queue differs")
    for w, (e, a) in enumerate(zip(expected["events"], actual["events"])):
        if e != a:
            first = next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), min(len(e), len(a)))
            out.append(f"worker {w}: GPU KV events differ from event {first}: vLLM {e[first:first + 3]} "
                       f"kvsim {a[first:first + 3]}")
    if expected["num_steps"] != actual["num_steps"]:
        out.append(f"steps: vLLM={expected['num_steps']} kvsim={actual['num_steps']}")
    return out[:limit]


if __name__ == "__main__":
    # Regenerate the golden answers: KVSIM_VLLM_PYTHON=<oracle venv>/bin/python python -m tests.support.offload_streams
    ORACLE.regenerate(STREAMS, build_stream)
