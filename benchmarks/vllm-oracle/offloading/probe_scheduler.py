"""Throwaway probe: vLLM 0.33.0's own v1 Scheduler with the OffloadingConnector
(SCHEDULER role) enabled through CacheConfig.kv_offloading_size, on CPU, no
weights, no GPU. The worker side is faked: a load submitted in step k completes
at the end of step k (+load_delay steps); a store job created in step k is
submitted at the start of step k+1 (as OffloadingConnectorWorker.prepare_store_kv
defers it) and completes at the end of that step (+store_delay); jobs_to_flush
complete in the step that names them.

Run: /work/main/.venv-vllm-oracle/bin/python /work/research-15/probe_scheduler.py
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    KVEventsConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (  # noqa: E402
    OffloadingConnectorStats,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

MODEL_DIR = "/work/main/tests/fixtures/qwen3-0.6b"
BS = 16
# FullAttentionSpec(16 tokens, 8 heads, 128 dim, bf16), one layer:
# page = 2 (K,V) * 16 * 8 * 128 * 2 B = 65536 B per GPU block.
PAGE = 2 * BS * 8 * 128 * 2


def make_scheduler(num_gpu_blocks, cpu_chunks, extra=None, max_batched=8192):
    model_config = ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True,
                               dtype="bfloat16", max_model_len=4096, seed=0)
    sched_config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=max_batched,
                                   max_model_len=4096, enable_chunked_prefill=True,
                                   is_encoder_decoder=False)
    bpc = (extra or {}).get("block_size", BS) // BS
    # kv_offloading_size is GiB; pick it so that exactly cpu_chunks chunks fit
    # (num_chunks = cpu_bytes // round_up(page*bpc, mmap.PAGESIZE)).
    gib = cpu_chunks * PAGE * bpc / (1 << 30)
    cache_config = CacheConfig(block_size=BS, enable_prefix_caching=True,
                               prefix_caching_hash_algo="sha256",
                               kv_offloading_size=gib)
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=sched_config,
        cache_config=cache_config,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
    )
    ktc = vllm_config.kv_transfer_config
    if extra:
        ktc.kv_connector_extra_config.update(extra)
    vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_gpu_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(
            ["model.layers.0.self_attn.attn"],
            FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128,
                              dtype=torch.bfloat16))],
    )
    s = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                  structured_output_manager=StructuredOutputManager(vllm_config),
                  block_size=BS, hash_block_size=BS, log_stats=True)
    return s


class FakeWorker:
    def __init__(self, load_delay=0, store_delay=0):
        self.load_delay, self.store_delay = load_delay, store_delay
        self.unsubmitted = []          # store jobs created last step
        self.inflight = []             # (due_step, job_id, req_id or None)

    def step(self, k, meta):
        done_now = {}
        if meta.jobs_to_flush:
            for jid in meta.jobs_to_flush:
                if meta.store_jobs.pop(jid, None) is not None:
                    self.unsubmitted.append(jid)
        if meta.jobs_to_flush:           # worker.wait(jobs_to_flush): done this step
            self.inflight = [(k if jid in meta.jobs_to_flush else due, jid, rid)
                             for due, jid, rid in self.inflight]
        for jid in self.unsubmitted:     # submitted at this step's start
            due = k if (meta.jobs_to_flush and jid in meta.jobs_to_flush) else k + self.store_delay
            self.inflight.append((due, jid, None))
        self.unsubmitted = []
        for jid, job in meta.load_jobs.items():
            self.inflight.append((k if job.sync else k + self.load_delay, jid,
                                  None if job.sync else job.req_id))
        self.unsubmitted.extend(meta.store_jobs)  # wait_for_save: defer
        recv, keep = set(), []
        for due, jid, rid in self.inflight:
            if due <= k:
                done_now[jid] = 1
                if rid is not None:
                    recv.add(rid)
            else:
                keep.append((due, jid, rid))
        self.inflight = keep
        return KVConnectorOutput(
            finished_recving=recv or None,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done_now)
            if done_now else None)


hash_fn = get_hash_fn_by_name("sha256")
kv_cache_utils.init_none_hash(hash_fn)
hasher = kv_cache_utils.get_request_block_hasher(BS, hash_fn)


def req(rid, toks, max_tokens=2):
    return Request(request_id=rid, prompt_token_ids=list(toks),
                   sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   pooling_params=None, block_hasher=hasher)


def drive(s, worker, arrivals, max_steps=60, verbose=True):
    """arrivals: {step: [Request, ...]}. Returns per-request admission info."""
    conn = s.connector.scheduler
    info = {}
    k = 0
    while k < max_steps and (s.has_requests() or any(st >= k for st in arrivals)):
        for r in arrivals.get(k, []):
            s.add_request(r)
        out = s.schedule()
        meta = out.kv_connector_metadata
        for nr in out.scheduled_new_reqs:
            info.setdefault(nr.req_id, {})["admit_step"] = k
            info[nr.req_id]["num_computed_at_admit"] = nr.num_computed_tokens
        kvo = worker.step(k, meta)
        ids = list(out.num_scheduled_tokens)
        toks = [[] if s.requests[r].is_prefill_chunk else [7] for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=toks, kv_connector_output=kvo)
        if verbose:
            loads = {j: (t.req_id, len(conn._jobs[j].keys) if j in conn._jobs else "?")
                     for j, t in meta.load_jobs.items()}
            stores = {j: (t.req_id, len(t.dst_spec.block_ids)) for j, t in meta.store_jobs.items()}
            waiting = {r.request_id: r.status.name for r in s.requests.values()
                       if r.status.name.startswith("WAITING")}
            print(f"  step {k:2d} sched={dict(out.num_scheduled_tokens)} "
                  f"loads={loads} stores={stores} flush={sorted(meta.jobs_to_flush or [])} "
                  f"waiting={waiting} done={sorted((kvo.kv_connector_worker_meta.completed_jobs if kvo.kv_connector_worker_meta else {}))}")
        res = s.update_from_output(out, mro)
        for eco in res.values():
            for o in eco.outputs:
                if o.new_token_ids and "first_token_step" not in info.setdefault(o.request_id, {}):
                    info[o.request_id]["first_token_step"] = k

            st = eco.scheduler_stats
            if st is not None and st.connector_prefix_cache_stats is not None:
                cs = st.connector_prefix_cache_stats
                if cs.queries or cs.hits:
                    print(f"    connector_prefix_cache_stats: queries={cs.queries} hits={cs.hits} "
                          f"by_source={ {kk.value: v for kk, v in cs.hits_by_source.items()} }")
            if st is not None and st.kv_connector_stats is not None:
                red = OffloadingConnectorStats(data=st.kv_connector_stats).reduce()
                interesting = {kk: v for kk, v in red.items() if "usage" not in kk and "delay" not in kk}
                if interesting:
                    print(f"    kv_connector_stats: {interesting}")
        k += 1
    return info


def cpu_keys(s):
    pol = s.connector.scheduler.manager._policy
    return len(getattr(pol, "chunks", {}) or {})


def main():
    # ---- Scenario 1: store timing, CPU hit after GPU eviction, async load ----
    print("\n### S1: 70-token prompt, tiny GPU (12 blocks), CPU 16 chunks, block_size=16")
    s = make_scheduler(num_gpu_blocks=12, cpu_chunks=32)
    c = s.connector
    print("  kv_transfer_config:", s.vllm_config.kv_transfer_config.kv_connector,
          s.vllm_config.kv_transfer_config.kv_role,
          dict(s.vllm_config.kv_transfer_config.kv_connector_extra_config))
    m = c.scheduler.manager
    print("  manager:", type(m).__name__, "policy:", type(m._policy).__name__,
          "num_chunks:", m._num_chunks, "offload_prompt_only:", c.scheduler.config.offload_prompt_only)
    A = list(range(1000, 1070))                 # 70 tokens: 4 full blocks + 6
    flood = [list(range(5000 + 200 * i, 5000 + 200 * i + 150)) for i in range(2)]
    arrivals = {0: [req("A", A)], 6: [req("F0", flood[0])], 10: [req("F1", flood[1])],
                16: [req("A2", A)]}
    info = drive(s, FakeWorker(), arrivals)
    print("  admission:", info)
    print("  CPU resident chunks:", cpu_keys(s))

    # ---- Scenario 2: prompt of exactly 4 blocks, repeated while GPU-resident ----
    print("\n### S2: 64-token prompt (4 full blocks) repeated after it finished; GPU still holds it")
    s = make_scheduler(num_gpu_blocks=64, cpu_chunks=16)
    B = list(range(2000, 2064))
    info = drive(s, FakeWorker(), {0: [req("B", B)], 6: [req("B2", B)]})
    print("  admission:", info)

    # ---- Scenario 3: blocks_per_chunk=2 (kv_connector_extra_config block_size=32) ----
    print("\n### S3: block_size=32 offload chunks (2 GPU blocks each); 70-token prompt, GPU flushed")
    s = make_scheduler(num_gpu_blocks=12, cpu_chunks=16, extra={"block_size": 32})
    print("  blocks_per_chunk:", s.connector.scheduler.config.blocks_per_chunk,
          "num_chunks:", s.connector.scheduler.manager._num_chunks)
    info = drive(s, FakeWorker(), {0: [req("A", A)], 6: [req("F0", flood[0])],
                                    10: [req("F1", flood[1])], 16: [req("A2", A)]})
    print("  admission:", info)

    # ---- Scenario 4: request arrives while the prefix's store is still in flight ----
    print("\n### S4: store_delay=4 steps; B2 (same 64-token prompt) arrives at step 2, store of B still in flight")
    s = make_scheduler(num_gpu_blocks=64, cpu_chunks=16)
    info = drive(s, FakeWorker(store_delay=4), {0: [req("B", B, max_tokens=8)], 2: [req("B2", B)]})
    print("  admission:", info)

    # ---- Scenario 4b: GPU blocks with an in-flight store are reallocated -> flush ----
    print("\n### S4b: store_delay=5; A finishes, F0 reuses A's GPU blocks while A's store is in flight")
    s = make_scheduler(num_gpu_blocks=12, cpu_chunks=32)
    info = drive(s, FakeWorker(store_delay=5), {0: [req("A", A)], 2: [req("F0", flood[0])],
                                                 4: [req("A2", A)]})
    print("  admission:", info)

    # ---- Scenario 5: slow load (load_delay=3) and a second request on the same chunks ----
    print("\n### S5: load_delay=3; A2 and A3 both want A's CPU chunks (GPU flushed)")
    s = make_scheduler(num_gpu_blocks=12, cpu_chunks=32)
    info = drive(s, FakeWorker(load_delay=3), {0: [req("A", A)], 6: [req("F0", flood[0])],
                                                10: [req("F1", flood[1])],
                                                16: [req("A2", A)], 17: [req("A3", A + [9, 9])]})
    print("  admission:", info)

    # ---- Scenario 6: sync loads (sync_load_budget_bytes > 0) ----
    print("\n### S6: sync_load_budget_bytes=1 GiB: CPU hit loaded within the admitting step")
    s = make_scheduler(num_gpu_blocks=12, cpu_chunks=32, extra={"sync_load_budget_bytes": 1 << 30})
    info = drive(s, FakeWorker(), {0: [req("A", A)], 6: [req("F0", flood[0])],
                                    10: [req("F1", flood[1])], 16: [req("A2", A)]})
    print("  admission:", info)

    # ---- Scenario 7: offload_prompt_only=False: generated blocks are stored too ----
    print("\n### S7: offload_prompt_only=False, 20-token prompt, 40 generated tokens")
    s = make_scheduler(num_gpu_blocks=64, cpu_chunks=32, extra={"offload_prompt_only": False})
    info = drive(s, FakeWorker(), {0: [req("D", list(range(3000, 3020)), max_tokens=40)]}, verbose=False)
    print("  stored chunks:", len(s.connector.scheduler.manager._policy.chunks),
          "(prompt+output = 60 tokens, finish clamp num_tokens-1 = 59 -> 3 full blocks)")
    s = make_scheduler(num_gpu_blocks=64, cpu_chunks=32)
    info = drive(s, FakeWorker(), {0: [req("D", list(range(3000, 3020)), max_tokens=40)]}, verbose=False)
    print("  default (prompt only) stored chunks:", len(s.connector.scheduler.manager._policy.chunks))
    print("  torch.cuda initialized:", torch.cuda.is_initialized())


if __name__ == "__main__":
    main()
