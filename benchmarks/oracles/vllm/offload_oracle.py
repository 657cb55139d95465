#!/usr/bin/env python3
"""vLLM oracle with the CPU KV offloading tier (OffloadingConnector, --kv-offloading-size).

Same input as oracle.py plus an optional "offload" object; see offloading/README.md.

    .venv-vllm-oracle/bin/python benchmarks/oracles/vllm/offload_oracle.py stream.json > out.json

Without "offload" the stream is handed to oracle.py's own _validate() and run() unchanged, so the output is
byte-for-byte oracle.py's. With "offload", every worker's Scheduler is built with
CacheConfig.kv_offloading_size = cpu_bytes / 2**30 (the connector turns it back into cpu_bytes_to_use), the
connector's kv_connector_extra_config gets eviction_policy, and a fake worker answers the connector's load / store
jobs after `transfer_steps` steps (timing convention: offloading/README.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle  # noqa: E402  (sets the vLLM environment variables before any vllm import)
from oracle import (  # noqa: E402
    VOCAB_SIZE, OracleError, _event_rows, _free_queue_ids, _validate, record_gpu_events,
)

OFFLOAD_DEFAULTS = {"cpu_bytes": None, "eviction_policy": "lru", "transfer_steps": 1}


def _validate_offload(off) -> dict:
    if not isinstance(off, dict):
        raise OracleError("offload must be a JSON object")
    unknown = set(off) - set(OFFLOAD_DEFAULTS)
    if unknown:
        raise OracleError(f"unknown offload keys: {sorted(unknown)}")
    o = {k: off.get(k, v) for k, v in OFFLOAD_DEFAULTS.items()}
    for k in ("cpu_bytes", "transfer_steps"):
        if not isinstance(o[k], int) or isinstance(o[k], bool):
            raise OracleError(f"offload.{k} must be an integer, got {o[k]!r}")
    if o["cpu_bytes"] < 1 or o["cpu_bytes"] >= 1 << 53:
        raise OracleError("offload.cpu_bytes must be in [1, 2**53)")
    if o["transfer_steps"] < 1:
        raise OracleError("offload.transfer_steps must be >= 1")
    if o["eviction_policy"] not in ("lru", "arc"):
        raise OracleError(f"offload.eviction_policy must be lru or arc, got {o['eviction_policy']!r}")
    return o


class FakeWorker:
    """The worker side of one engine's OffloadingConnector (OW / GW in the rules doc), without copies.

    Step k's kv_connector_metadata comes out of schedule() of step k. Loads in it are handed to the worker in
    step k (start_kv_transfers before the forward pass); stores in it are handed in step k+1 (prepare_store_kv
    defers them to the next step's start_kv_transfers). A job handed in step h is reported finished in the
    KVConnectorOutput of step h + T - 1 (T = transfer_steps), so update_from_output of that step processes it and
    schedule() of step h + T is the first to see it. Jobs named in jobs_to_flush, and sync loads, are reported in
    the step that names them (the worker waits for them before the forward pass).
    """

    def __init__(self, transfer_steps: int):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput

        self._meta_cls, self._out_cls = OffloadingWorkerMetadata, KVConnectorOutput
        self.T = transfer_steps
        self.unsubmitted: list[int] = []           # store jobs created last step, handed this step
        self.inflight: list[tuple[int, int, str | None]] = []   # (due step, job id, req id of an async load)

    def busy(self) -> bool:
        return bool(self.unsubmitted or self.inflight)

    def step(self, k: int, meta) -> tuple[object, list[int], list[int]]:
        flush = set(meta.jobs_to_flush or ())
        new_stores = [j for j in meta.store_jobs if j not in flush]
        handed = []
        for jid in self.unsubmitted + [j for j in meta.store_jobs if j in flush]:
            self.inflight.append((k if jid in flush else k + self.T - 1, jid, None))
            handed.append(jid)
        self.unsubmitted = []
        self.inflight = [(k if jid in flush else due, jid, rid) for due, jid, rid in self.inflight]
        for jid, job in meta.load_jobs.items():
            self.inflight.append((k if job.sync else k + self.T - 1, jid, None if job.sync else job.req_id))
            handed.append(jid)
        self.unsubmitted = new_stores
        done, recv, keep = {}, set(), []
        for due, jid, rid in self.inflight:
            if due <= k:
                done[jid] = 1
                if rid is not None:
                    recv.add(rid)
            else:
                keep.append((due, jid, rid))
        self.inflight = keep
        out = self._out_cls(
            finished_recving=recv or None,
            kv_connector_worker_meta=self._meta_cls(completed_jobs=done) if done else None,
        )
        return out, sorted(handed), sorted(done)


def run_offload(cfg: dict, off: dict) -> dict:
    import random

    import torch
    import vllm
    from vllm.config import CacheConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.metrics.stats import PrefixCacheStats
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    bs = cfg["block_size"]
    nw = cfg["num_workers"]

    def make_scheduler():
        model_config = ModelConfig(model=cfg["model_dir"], skip_tokenizer_init=True, dtype="bfloat16",
                                   max_model_len=cfg["max_model_len"], seed=0)
        scheduler_config = SchedulerConfig(max_num_seqs=cfg["max_num_seqs"],
                                           max_num_batched_tokens=cfg["max_num_batched_tokens"],
                                           max_model_len=cfg["max_model_len"], enable_chunked_prefill=True,
                                           is_encoder_decoder=False)
        cache_config = CacheConfig(block_size=bs, enable_prefix_caching=True, prefix_caching_hash_algo="sha256",
                                   kv_offloading_size=off["cpu_bytes"] / (1 << 30))
        vllm_config = VllmConfig(
            model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
        )
        ktc = vllm_config.kv_transfer_config
        if ktc is None or ktc.kv_connector != "OffloadingConnector":
            raise OracleError(f"kv_offloading_size did not select the OffloadingConnector: {ktc!r}", 4)
        ktc.kv_connector_extra_config["eviction_policy"] = off["eviction_policy"]
        vllm_config.cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
        kv_cache_config = KVCacheConfig(
            num_blocks=cfg["num_gpu_blocks"], kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(
                block_size=bs, num_kv_heads=8, head_size=128, dtype=torch.bfloat16))],
        )
        return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vllm_config),
                         block_size=bs, hash_block_size=bs, log_stats=True)

    scheds = [make_scheduler() for _ in range(nw)]
    for s in scheds:
        if s.vllm_config.scheduler_config.async_scheduling:
            raise OracleError("async scheduling is on; the oracle needs the sync loop", 4)
        if s.connector.scheduler.config.blocks_per_chunk != 1:
            raise OracleError("internal: blocks_per_chunk != 1", 4)
    workers_fake = [FakeWorker(off["transfer_steps"]) for _ in range(nw)]

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(bs, hash_fn)

    step_now = [0]
    reqs = cfg["requests"]
    objs: dict[str, Request] = {}
    rec: dict[str, dict] = {}
    # Chunk names: a CPU chunk key is named [request_id, chunk_index] after the first store job that wrote it on
    # that worker (vLLM's sha256 values are seeded per process and cannot be compared).
    key_name: list[dict] = [{} for _ in range(nw)]
    evicted_now: list[list] = [[] for _ in range(nw)]

    def key_index(rid: str) -> dict:
        return {make_offload_key(h, 0): i for i, h in enumerate(objs[rid].block_hashes)}

    for w, s in enumerate(scheds):
        kvm = s.kv_cache_manager
        orig_rec = kvm.record_prefix_cache_stats

        def wrapped(request, num_hits, _orig=orig_rec):
            r = rec[request.request_id]
            if request.num_preemptions == 0 and r["gpu_hit_tokens"] is None:
                r["gpu_hit_tokens"] = num_hits
            return _orig(request, num_hits)

        kvm.record_prefix_cache_stats = wrapped
        conn = s.connector
        orig_match = conn.get_num_new_matched_tokens

        def match(request, num_computed_tokens, _orig=orig_match):
            ext, is_async = _orig(request, num_computed_tokens)
            if ext is None:
                d = rec[request.request_id]["deferred_steps"]
                if not d or d[-1] != step_now[0]:
                    d.append(step_now[0])
            return ext, is_async

        conn.get_num_new_matched_tokens = match
        orig_alloc = conn.update_state_after_alloc

        def after_alloc(request, blocks, num_external_tokens, _orig=orig_alloc):
            r = rec[request.request_id]
            if request.num_preemptions == 0 and r["cpu_hit_tokens"] is None:
                r["cpu_hit_tokens"] = num_external_tokens
                if num_external_tokens:
                    r["load_step"] = step_now[0]
            return _orig(request, blocks, num_external_tokens)

        conn.update_state_after_alloc = after_alloc
        # NOTE: the Scheduler hands the connector `finished_req_ids` as a set of strings, whose iteration order
        # depends on the process's hash seed; the connector's finish pass commits LRU recency in that order. Any
        # order is one vLLM can produce, so the oracle pins it to the order the requests finished (the order
        # `_free_request` ran: schedule order within a step), which kvsim follows.
        finish_order: list[str] = []
        orig_free = s._free_request

        def free_request(request, *a, _orig=orig_free, _order=finish_order, **kw):
            _order.append(request.request_id)
            return _orig(request, *a, **kw)

        s._free_request = free_request
        orig_meta = conn.build_connector_meta

        def build_meta(scheduler_output, _orig=orig_meta, _order=finish_order):
            done = scheduler_output.finished_req_ids
            if done:
                ordered = [rid for rid in _order if rid in done]
                if set(ordered) != set(done):
                    raise OracleError("internal: a finished request id not seen by _free_request", 4)
                scheduler_output.finished_req_ids = ordered
            _order.clear()
            return _orig(scheduler_output)

        conn.build_connector_meta = build_meta
        mgr = conn.scheduler.manager
        orig_store = mgr.prepare_store

        def prepare_store(keys, req_context, *a, _orig=orig_store, _w=w, **kw):
            res = _orig(keys, req_context, *a, **kw)
            if res is not None and res.evicted_keys:
                evicted_now[_w].append((req_context.req_id, list(res.evicted_keys)))
            return res

        mgr.prepare_store = prepare_store

    # GPU KV events, exactly as oracle.py records them.
    raw_events, stored_origin = record_gpu_events(scheds, step_now)

    rng = random.Random(cfg["seed"])
    stats = [PrefixCacheStats() for _ in range(nw)]
    cstats = [PrefixCacheStats() for _ in range(nw)]
    by_source: list[dict] = [{} for _ in range(nw)]
    kvstats = [OffloadingConnectorStats() for _ in range(nw)]
    step_rows: list[list[dict]] = [[] for _ in range(nw)]

    def add_stats(acc, st):
        if st is None:
            return
        for f in ("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits"):
            setattr(acc, f, getattr(acc, f) + getattr(st, f))

    def submit(idx: int) -> None:
        r = reqs[idx]
        req = Request(request_id=r["id"], prompt_token_ids=list(r["prompt_token_ids"]),
                      sampling_params=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
                      pooling_params=None, block_hasher=hasher)
        objs[r["id"]] = req
        rec[r["id"]] = {
            "id": r["id"], "worker": r["worker"], "gpu_hit_tokens": None, "cpu_hit_tokens": None, "load_step": None,
            "waiting_for_remote_kvs_steps": [], "deferred_steps": [], "admit_step": None, "hit_tokens": None,
            "first_token_step": None, "finish_step": None, "num_preemptions": 0,
        }
        scheds[r["worker"]].add_request(req)

    def job_row(conn, jid, job, w):
        st = conn._jobs.get(jid)
        if st is None:
            raise OracleError(f"job {jid} not tracked by the connector", 4)
        idx = key_index(job.req_id)
        try:
            chunks = sorted(idx[key] for key in st.keys)
        except KeyError:
            raise OracleError(f"job {jid}: a key outside request {job.req_id}'s chunks", 4)
        if st.is_store:
            for key in st.keys:
                key_name[w].setdefault(key, [job.req_id, idx[key]])
        return {"job": jid, "request": job.req_id, "chunks": chunks}

    def name(w, key):
        n = key_name[w].get(key)
        if n is None:
            raise OracleError("a CPU chunk never written by a store job", 4)
        return n

    concurrency = cfg["concurrency"]
    next_idx = 0
    while next_idx < min(concurrency, len(reqs)):
        submit(next_idx)
        next_idx += 1

    zero_streak = [0] * nw
    k = 0
    while True:
        active = [w for w in range(nw) if scheds[w].has_requests()]
        if not active and next_idx >= len(reqs):
            break
        if not active:
            raise OracleError("internal error: no active worker but requests left", 4)
        finished_this_step: list[str] = []
        step_now[0] = k
        for w in active:
            s = scheds[w]
            conn = s.connector.scheduler
            out = s.schedule()
            meta = out.kv_connector_metadata
            for nr in out.scheduled_new_reqs:
                r = rec[nr.req_id]
                if r["admit_step"] is None:
                    r["admit_step"] = k
                    r["hit_tokens"] = nr.num_computed_tokens
            for rid, req in s.requests.items():
                if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    rec[rid]["waiting_for_remote_kvs_steps"].append(k)
            loads = [job_row(conn, j, t, w) for j, t in sorted(meta.load_jobs.items())]
            stores = [job_row(conn, j, t, w) for j, t in sorted(meta.store_jobs.items())]
            evicted = [{"for_request": rid, "chunks": [name(w, key) for key in keys]}
                       for rid, keys in evicted_now[w]]
            evicted_now[w] = []
            kvo, handed, done = workers_fake[w].step(k, meta)
            flush = sorted(meta.jobs_to_flush or ())
            ids = list(out.num_scheduled_tokens)
            toks = [[] if s.requests[r].is_prefill_chunk else [rng.randrange(VOCAB_SIZE)] for r in ids]
            mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                    sampled_token_ids=toks, kv_connector_output=kvo)
            res = s.update_from_output(out, mro)
            if loads or stores or evicted or flush or handed or done:
                step_rows[w].append({"step": k, "load_jobs": loads, "store_jobs": stores, "jobs_to_flush": flush,
                                     "evicted": evicted, "handed_to_worker": handed, "completed": done})
            for eco in res.values():
                st = eco.scheduler_stats
                if st is not None:
                    add_stats(stats[w], st.prefix_cache_stats)
                    cps = st.connector_prefix_cache_stats
                    if cps is not None:
                        add_stats(cstats[w], cps)
                        for src, v in (getattr(cps, "hits_by_source", None) or {}).items():
                            key = getattr(src, "value", str(src))
                            by_source[w][key] = by_source[w].get(key, 0) + v
                    if st.kv_connector_stats is not None:
                        kvstats[w].aggregate(OffloadingConnectorStats(data=st.kv_connector_stats))
                for o in eco.outputs:
                    r = rec[o.request_id]
                    if o.new_token_ids and r["first_token_step"] is None:
                        r["first_token_step"] = k
                    if o.finish_reason is not None:
                        r["finish_step"] = k
                        r["num_preemptions"] = objs[o.request_id].num_preemptions
                        finished_this_step.append(o.request_id)
            if evicted_now[w]:
                raise OracleError("eviction outside schedule()", 4)
            busy = workers_fake[w].busy() or bool(conn._jobs)
            if out.total_num_scheduled_tokens == 0 and not busy and not handed and not done:
                zero_streak[w] += 1
                n_run, n_wait = s.get_request_counts()
                preempted = bool(out.preempted_req_ids)
                if (n_wait and not n_run and not preempted) or zero_streak[w] > 1:
                    raise OracleError(f"worker {w} stalled at step {k}: scheduled nothing with {n_wait} waiting "
                                      f"and {n_run} running, no transfer in flight", 3)
            else:
                zero_streak[w] = 0
        step_now[0] = k + 1
        for _ in finished_this_step:
            if next_idx < len(reqs):
                submit(next_idx)
                next_idx += 1
        k += 1

    if next_idx != len(reqs) or any(r["finish_step"] is None for r in rec.values()):
        raise OracleError("internal error: loop ended with unfinished requests", 4)
    for rid, r in rec.items():
        if r["num_preemptions"] == 0 and r["hit_tokens"] is not None:
            total = (r["gpu_hit_tokens"] or 0) + (r["cpu_hit_tokens"] or 0)
            n = len(objs[rid].prompt_token_ids)
            if r["hit_tokens"] != (n - 1 if total == n else total):
                raise OracleError(f"internal check failed for {rid}: admitted with {r['hit_tokens']} computed, "
                                  f"gpu {r['gpu_hit_tokens']} + cpu {r['cpu_hit_tokens']}", 4)

    events = []
    for w, s in enumerate(scheds):
        if s.kv_cache_manager.block_pool.kv_event_queue:
            raise OracleError(f"worker {w}: KV events left untaken after the run", 4)
        events.append(_event_rows(raw_events[w], stored_origin, bs, BlockStored, BlockRemoved, AllBlocksCleared))

    workers = []
    for w, s in enumerate(scheds):
        kvm = s.kv_cache_manager
        add_stats(stats[w], kvm.make_prefix_cache_stats())
        st, cs = stats[w], cstats[w]
        mgr = s.connector.scheduler.manager
        pol = mgr._policy
        if off["eviction_policy"] == "lru":
            order = sorted(pol.chunks, key=lambda key: pol._ranks[key])
            resident = {"lru_order": [name(w, key) for key in order]}
        else:
            resident = {"t1": [name(w, key) for key in pol.t1], "t2": [name(w, key) for key in pol.t2],
                        "target_t1_size": pol.target_t1_size}
        all_chunks = pol.chunks if off["eviction_policy"] == "lru" else {**pol.t1, **pol.t2}
        not_ready = sorted(name(w, key) for key, c in all_chunks.items() if c.ref_cnt != 0)
        reduced = kvstats[w].reduce()
        connector_stats = {kk: reduced[kk] for kk in sorted(reduced)
                           if "time" not in kk and "delay" not in kk}
        workers.append({
            "requests": st.requests, "queries": st.queries, "hits": st.hits,
            "preempted_requests": st.preempted_requests, "preempted_queries": st.preempted_queries,
            "preempted_hits": st.preempted_hits, "num_free_blocks_end": kvm.block_pool.get_num_free_blocks(),
            "cpu_num_chunks": mgr._num_chunks,
            "cpu_resident_end": resident,
            "cpu_not_ready_or_pinned_end": not_ready,
            "connector_prefix_cache_stats": {
                "requests": cs.requests, "queries": cs.queries, "hits": cs.hits,
                "preempted_requests": cs.preempted_requests, "preempted_queries": cs.preempted_queries,
                "preempted_hits": cs.preempted_hits, "hits_by_source": dict(sorted(by_source[w].items())),
            },
            "kv_connector_stats": connector_stats,
            "jobs_in_flight_end": len(s.connector.scheduler._jobs),
        })

    return {
        "vllm_version": vllm.__version__,
        "num_steps": k,
        "offload": off,
        "requests": [rec[r["id"]] for r in reqs],
        "workers": workers,
        "free_queue_end": [_free_queue_ids(s.kv_cache_manager.block_pool) for s in scheds],
        "events": events,
        "offload_steps": step_rows,
    }


def answer(spec) -> dict:
    """A stream with "offload" runs with the connector; one without is oracle.py's, byte for byte."""
    if isinstance(spec, dict) and "offload" in spec:
        spec = dict(spec)
        off = _validate_offload(spec.pop("offload"))
        return run_offload(_validate(spec), off)
    return oracle.run(_validate(spec))


def main(argv: list[str]) -> int:
    return oracle.main(argv, answer, name="offload_oracle.py", usage=__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
