#!/usr/bin/env python
"""SGLang engine oracle: replay a closed-loop request stream through SGLang 0.5.23's own scheduler code.

Run it with the SGLang side venv's interpreter (nothing is installed into it; see README.md, "Engine oracle"):

    .venv-sglang/bin/python benchmarks/oracles/sglang/engine_oracle.py stream.json > result.json
    .venv-sglang/bin/python benchmarks/oracles/sglang/engine_oracle.py < stream.json > result.json

What runs is SGLang's code: `Scheduler.get_next_batch_to_run` (hence `_get_new_batch_prefill_raw` with
`SchedulePolicy` + `PrefillAdder`, `update_running_batch` with `check_decode_mem` + `retract_decode`),
`Scheduler._add_request_to_queue`, `Scheduler.init_req_max_new_tokens`, `validate_input_length`,
`Scheduler.is_disable_overlap_for_batch`, `SchedulerBatchResultProcessor.process_batch_result_prefill/_decode`
(checkpoint and release into the tree), `ScheduleBatch` (prepare_for_extend / prepare_for_decode / filter / merge /
retract), the real allocator (`TokenToKVPoolAllocator` for page 1, `PagedTokenToKVPoolAllocator` for page > 1),
`ReqToTokenPool`, `NewTokenRatioTracker` and the tree cache class the server builds (`UnifiedRadixCache` with the
FULL component and its default Rust tree core; `RadixCache` on request), all on a `Scheduler.__new__` shell.
What is harness: the loop (a line-by-line mirror of `event_loop_overlap` / `event_loop_normal`), request intake
(instead of ZMQ + the tokenizer), `run_batch` (a fake model), `on_idle` (only its ratio reset when fully idle), the
in-memory import stubs of `probe_classes.py` and inert stand-ins for metrics, streaming, grammar, DP attention.

Input (one JSON object; every key but "requests" optional, defaults shown):

    {"page_size": 1, "max_total_tokens": 9362, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
     "max_running_requests": 256, "context_length": 40960, "schedule_policy": "fcfs",
     "radix_eviction_policy": "lru", "disable_overlap_schedule": false, "concurrency": 8, "tree_cache": "unified",
     "requests": [{"id": "r0", "prompt": [[k, start, n], ...], "max_new_tokens": 64, "ignore_eos": true,
                   "eos_after": null, "after": null}, ...]}

A prompt run [k, start, n] is the token ids k*1_000_000 + start .. + n - 1. Request number i (0-based) samples
(900_000 + i) * 1_000_000 + p at output position p, or EOS_TOKEN_ID at position eos_after when ignore_eos is false;
so a later prompt resends request j's outputs p .. p + n - 1 as the run [900_000 + j, p, n] (a session's next turn).
A request with "after": id is received when that request finishes (a session's next turn), not in the closed loop.
Output: see README.md ("Engine oracle"). Exit status: 0 ok, 2 bad input, 3 the stream stalled, 4 internal error.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from token_runs import SCALE, ids_of, runs_of

OUTPUT_K = 900_000  # request i samples token ids with k = OUTPUT_K + i
EOS_TOKEN_ID = 999_999  # k = 0: outside every prompt run (k >= 1) and every sampled-token run
HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULTS = {
    "page_size": 1,
    "max_total_tokens": 9362,
    "chunked_prefill_size": 8192,
    "max_prefill_tokens": 16384,
    "max_running_requests": 256,
    "context_length": 40960,
    "schedule_policy": "fcfs",
    "radix_eviction_policy": "lru",
    "disable_overlap_schedule": False,
    "concurrency": 8,
    "tree_cache": "unified",
    "hicache": None,
}
HICACHE_POLICIES = ("write_through", "write_through_selective", "write_back")
REQ_DEFAULTS = {"max_new_tokens": 64, "ignore_eos": True, "eos_after": None, "after": None}
# "random" needs a seeded RNG and "priority"/"routing-key" need request fields this format does not carry.
POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "hrrn", "shortest-prefill-first")
EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
TREES = ("unified", "radix", "unified-python")  # unified-python: UnifiedRadixCache on the Python tree core (checks)


class BadInput(Exception):
    pass


class Stalled(Exception):
    pass


# ---------------------------------------------------------------------------------------------------------------
# Input validation (before the ~5 s of SGLang imports)
# ---------------------------------------------------------------------------------------------------------------
def _int(v, name, lo=None):
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadInput(f"{name}: expected an integer, got {v!r}")
    if lo is not None and v < lo:
        raise BadInput(f"{name}: must be >= {lo}, got {v}")
    return v


def _bool(v, name):
    if not isinstance(v, bool):
        raise BadInput(f"{name}: expected true/false, got {v!r}")
    return v


def parse_spec(spec) -> dict:
    if not isinstance(spec, dict):
        raise BadInput("top level: expected a JSON object")
    unknown = set(spec) - set(DEFAULTS) - {"requests"}
    if unknown:
        raise BadInput(f"unknown keys: {sorted(unknown)}")
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in spec.items() if k != "requests"})
    for k in ("page_size", "max_total_tokens", "max_prefill_tokens", "max_running_requests", "context_length",
              "concurrency"):
        _int(cfg[k], k, 1)
    if cfg["chunked_prefill_size"] is not None:
        _int(cfg["chunked_prefill_size"], "chunked_prefill_size")  # <= 0 disables chunking, as in SGLang
    _bool(cfg["disable_overlap_schedule"], "disable_overlap_schedule")
    if cfg["schedule_policy"] not in POLICIES:
        raise BadInput(f"schedule_policy: one of {POLICIES}, got {cfg['schedule_policy']!r}")
    if cfg["radix_eviction_policy"] not in EVICTION_POLICIES:
        raise BadInput(f"radix_eviction_policy: one of {EVICTION_POLICIES}, got {cfg['radix_eviction_policy']!r}")
    if cfg["tree_cache"] not in TREES:
        raise BadInput(f"tree_cache: one of {TREES}, got {cfg['tree_cache']!r}")
    hc = cfg["hicache"]
    if hc is not None:
        if not isinstance(hc, dict) or set(hc) - {"write_policy", "host_ratio"}:
            raise BadInput("hicache: null or {\"write_policy\": ..., \"host_ratio\": ...}")
        if hc.get("write_policy", "write_through") not in HICACHE_POLICIES:
            raise BadInput(f"hicache.write_policy: one of {HICACHE_POLICIES}")
        if not isinstance(hc.get("host_ratio", 2.0), (int, float)) or hc.get("host_ratio", 2.0) <= 0:
            raise BadInput("hicache.host_ratio: a number > 0")
        if cfg["tree_cache"] == "radix":
            raise BadInput("hicache: needs tree_cache unified or unified-python")
    if cfg["max_total_tokens"] < 2 * cfg["page_size"]:
        raise BadInput("max_total_tokens: must hold at least two pages")
    reqs = spec.get("requests")
    if not isinstance(reqs, list):
        raise BadInput("requests: expected a list")
    seen, out = set(), []
    for i, r in enumerate(reqs):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise BadInput(f"{where}: expected an object")
        unknown = set(r) - set(REQ_DEFAULTS) - {"id", "prompt"}
        if unknown:
            raise BadInput(f"{where}: unknown keys {sorted(unknown)}")
        rr = dict(REQ_DEFAULTS)
        rr.update(r)
        if not isinstance(rr.get("id"), str) or not rr["id"]:
            raise BadInput(f"{where}.id: expected a non-empty string")
        if rr["id"] in seen:
            raise BadInput(f"{where}.id: duplicate id {rr['id']!r}")
        seen.add(rr["id"])
        runs = rr.get("prompt")
        if not isinstance(runs, list) or not runs:
            raise BadInput(f"{where}.prompt: expected a non-empty list of runs [k, start, n]")
        for j, run in enumerate(runs):
            if not isinstance(run, list) or len(run) != 3:
                raise BadInput(f"{where}.prompt[{j}]: expected [k, start, n]")
            k, start, n = (_int(x, f"{where}.prompt[{j}]") for x in run)
            if k < 1 or k >= 9_000_000 or start < 0 or n < 1 or start + n > SCALE:
                raise BadInput(f"{where}.prompt[{j}]: need 1 <= k < 9e6, start >= 0, n >= 1, start + n <= 1e6")
            if k >= OUTPUT_K and not (k - OUTPUT_K < i and start + n <= out[k - OUTPUT_K]["max_new_tokens"]):
                raise BadInput(f"{where}.prompt[{j}]: a run with k >= {OUTPUT_K} resends the outputs of request "
                               f"k - {OUTPUT_K}, which must come earlier in the list and sample start + n of them")
        _int(rr["max_new_tokens"], f"{where}.max_new_tokens", 1)
        _bool(rr["ignore_eos"], f"{where}.ignore_eos")
        if rr["eos_after"] is not None:
            _int(rr["eos_after"], f"{where}.eos_after", 0)
        if rr["after"] is not None and rr["after"] not in seen - {rr["id"]}:
            raise BadInput(f"{where}.after: null or the id of an earlier request, got {rr['after']!r}")
        out.append(rr)
    cfg["requests"] = out
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# The shell
# ---------------------------------------------------------------------------------------------------------------
def load_sglang():
    """Import SGLang with probe_classes' in-memory stubs (openai, partial_json_parser, setproctitle, einops,
    uvicorn, fastapi are absent from .venv-sglang and never called on the scheduling path)."""
    import logging

    sys.path.insert(0, HERE)
    import probe_classes  # noqa: F401  (installs the stubs; publishes a default ServerArgs)

    logging.disable(logging.NOTSET)  # the probe silences warnings; the oracle sends SGLang's logs to stderr
    return probe_classes


class EngineShell:
    def __init__(self, cfg: dict):
        from collections import deque
        from types import SimpleNamespace

        import torch
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.environ import envs
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.runtime_context import get_context, get_memory, get_parallel, get_schedule
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        P = cfg["page_size"]
        # the pool configurator re-aligns a --max-total-tokens cap to whole pages (kv_cache_configurator.py:3090-3224)
        N = cfg["max_total_tokens"] // P * P
        chunk = cfg["chunked_prefill_size"]
        sa = ServerArgs(
            model_path="dummy",
            device="cpu",
            page_size=P,
            max_total_tokens=cfg["max_total_tokens"],
            chunked_prefill_size=chunk,
            max_prefill_tokens=cfg["max_prefill_tokens"],
            max_running_requests=cfg["max_running_requests"],
            context_length=cfg["context_length"],
            schedule_policy=cfg["schedule_policy"],
            radix_eviction_policy=cfg["radix_eviction_policy"],
            disable_overlap_schedule=cfg["disable_overlap_schedule"],
            **({} if cfg["hicache"] is None else dict(
                enable_hierarchical_cache=True, hicache_ratio=float(cfg["hicache"].get("host_ratio", 2.0)),
                hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
                hicache_write_policy=cfg["hicache"].get("write_policy", "write_through"))),
        )
        get_context().set_server_args(sa)  # no resolve_once(): it would read the model config and probe the GPU

        # What ModelRunner / TpModelWorker.get_worker_info would report for a pool of exactly N tokens:
        # N as above; max_running_requests = min(requested, N // 2) (kv_cache_configurator.py:3119-3172);
        # max_req_len = min(context_len - 1, N - 1), max_req_input_len = max_req_len - 5 (tp_worker.py:568-572).
        max_running = min(get_schedule().max_running_requests, N // 2)
        ctx_len = cfg["context_length"]
        max_req_len = min(ctx_len - 1, N - 1)
        if not get_parallel().pp_max_micro_batch_size:  # scheduler.py:1236-1242
            get_context().override("scheduler.pp_max_micro_batch_size_default",
                                   pp_max_micro_batch_size=max(max_running // get_parallel().pp_size, 1))
        # The row width only has to hold the longest request (max_req_len + 1 tokens + one page); the server uses
        # context_len, which at 40960 x 2048 rows would cost 335 MB of int32 here for no decision.
        row_len = min(ctx_len, max_req_len + 1) + 2 * P + 8
        self.r2t = ReqToTokenPool(size=max_running, max_context_len=row_len, device="cpu", enable_memory_saver=False)
        kvcache = None
        if cfg["hicache"] is not None:
            # HiCache's host pool reads the device pool's geometry: a real (tiny) one, and the three CPU patches
            # (README.md, "HiCache oracle")
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
            import sglang.srt.mem_cache.pool_host.common as pool_host_common
            from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

            pool_host_common._cuda_host_register = lambda *args, **kwargs: None
            MHATokenToKVPoolHost.backup_from_device_all_layer = lambda self, *args, **kwargs: None
            MHATokenToKVPoolHost.load_to_device_per_layer = lambda self, *args, **kwargs: None
            kvcache = MHATokenToKVPool(size=N, page_size=P, dtype=torch.bfloat16, head_num=1, head_dim=8,
                                       layer_num=2, device="cpu", enable_alt_stream=False, enable_memory_saver=False)
        if P == 1:  # kv_cache_configurator.py:2795-2930, need_sort=False outside PD
            self.alloc = TokenToKVPoolAllocator(N, dtype=torch.bfloat16, device="cpu", kvcache=kvcache,
                                                need_sort=False)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(N, page_size=P, dtype=torch.bfloat16, device="cpu",
                                                     kvcache=kvcache, need_sort=False)
        kind = cfg["tree_cache"]
        params = CacheInitParams(  # kv_cache_builder.py:389 with the single-GPU, non-hybrid values
            disable=False,
            req_to_token_pool=self.r2t,
            token_to_kv_pool_allocator=self.alloc,
            page_size=P,
            eviction_policy=get_memory().radix_eviction_policy,
            eviction_policy_config=get_memory().radix_eviction_policy_config,
            chunked_prefill_size=get_schedule().chunked_prefill_size,
            tree_components=None if kind == "radix" else (ComponentType.FULL,),  # create_unified_radix_cache
            tree_core_backend="python" if kind == "unified-python" else None,
        )
        self.tree = RadixCache(params) if kind == "radix" else UnifiedRadixCache(params)
        self.hicache = cfg["hicache"] is not None
        if self.hicache:
            self.tree.init_hicache(sa, params)  # create_unified_radix_cache (mem_cache/registry.py:193-200)
        self.tree_kind = kind
        self.page_size = P
        self.N = N

        probe = sys.modules["probe_classes"]
        _Null, _Reporter, _Beams = probe._Null, probe._Reporter, probe._Beams
        model_config = SimpleNamespace(  # every ModelConfig field the scheduling path reads
            vocab_size=32000, is_encoder_decoder=False, self_opened_think_start_ids=None, think_end_ids=None,
            context_len=ctx_len, hf_eos_token_id=None, is_multimodal=False,
        )
        tp_worker = _Null()
        tp_worker.model_runner = _Null()
        tp_worker.model_runner.attn_backend = object()  # no extend_attention_block_m -> the 64 fallback
        tp_worker.model_runner.prefill_aware_swa = False
        overlap = not get_schedule().disable_overlap_schedule
        chunked_prefill_size = get_schedule().chunked_prefill_size  # init_chunked_prefill (scheduler.py:1351)
        if chunked_prefill_size is not None and chunked_prefill_size <= 0:
            chunked_prefill_size = None

        s = Scheduler.__new__(Scheduler)
        s.__dict__.update(
            server_args=sa, forward_ct=0, processed_tokens_counter=0, cur_batch_for_debug=None,
            # __init__'s "Parse args" block (scheduler.py:485-530)
            schedule_policy=get_schedule().schedule_policy,
            enable_priority_scheduling=get_schedule().enable_priority_scheduling,
            abort_on_priority_when_disabled=get_schedule().abort_on_priority_when_disabled,
            schedule_low_priority_values_first=get_schedule().schedule_low_priority_values_first,
            priority_scheduling_preemption_threshold=get_schedule().priority_scheduling_preemption_threshold,
            enable_lora=False, enable_overlap=overlap, enable_overlap_mlx=False, enable_pdmux=False,
            spec_algorithm=SpeculativeAlgorithm.NONE, page_size=P, enable_hierarchical_cache=self.hicache,
            enable_lmcache=False, enable_session_radix_cache=False, enable_hicache_storage=False,
            enable_unified_cache_external_linker=False, enable_decode_hicache=False,
            max_new_tokens_limit=envs.SGLANG_MAX_NEW_TOKENS_LIMIT.get(), enable_hisparse=False,
            attn_dp_enabled=False, enable_unified_memory=False,
            # model / worker info
            model_config=model_config, tp_worker=tp_worker, max_total_num_tokens=N,
            max_prefill_tokens=get_schedule().max_prefill_tokens, max_running_requests=max_running,
            max_queued_requests=get_schedule().max_queued_requests, max_req_len=max_req_len,
            max_req_input_len=max_req_len - 5, kv_shard_widening=1, sliding_window_size=None,
            is_hybrid_swa=False, is_hybrid_ssm=False, disable_radix_cache=False,
            req_to_token_pool=self.r2t, token_to_kv_pool_allocator=self.alloc, tree_cache=self.tree,
            # chunked prefill
            chunked_prefill_size=chunked_prefill_size, chunked_req=None, _pending_chunked_abort_req=None,
            prefill_decode_interval=get_schedule().prefill_decode_interval or 0,
            _prefill_decode_interval_remaining=0,
            prefill_decode_interval_min_bs=get_schedule().prefill_decode_interval_min_bs,
            is_mixed_chunk=chunked_prefill_size is not None and get_schedule().enable_mixed_chunk,
            dynamic_chunk_sizer=None, truncation_align_size=None,
            # queues and batches
            waiting_queue=[], running_batch=ScheduleBatch(reqs=[], batch_is_full=False), last_batch=None,
            result_queue=deque(), enable_skip_finishing_decode=False,
            # inert collaborators (no model, no IPC, no metrics)
            scheduler_stage_metrics=None, dllm_config=None, dllm_manager=_Null(), require_mlp_sync=False,
            grammar_manager=_Null(), min_free_slots_delayer=None, beam_coordinator=_Beams(),
            hisparse_coordinator=None, load_inquirer=_Null(), dp_attn_adapter=_Null(),
            ngram_embedding_manager=_Null(), decode_offload_manager=None, metrics_reporter=_Reporter(),
            disaggregation_mode=DisaggregationMode.NULL, tokenizer=None, lora_drainer=None,
        )
        s.init_schedule_policy()  # the real one: SchedulePolicy, prefill_bs_tracker, NewTokenRatioTracker
        s.batch_result_processor = SchedulerBatchResultProcessor(
            is_generation=True, disaggregation_mode=DisaggregationMode.NULL, enable_overlap=overlap,
            enable_overlap_mlx=False, model_config=model_config, token_to_kv_pool_allocator=self.alloc,
            tree_cache=self.tree, hisparse_coordinator=None, req_to_token_pool=self.r2t, decode_offload_manager=None,
            metrics_collector=_Null(), metrics_reporter=s.metrics_reporter, draft_worker=None, model_worker=_Null(),
            logprob_result_processor=_Null(), output_streamer=_Null(), beam_coordinator=_Beams(),
            abort_request=_Null(),
        )
        self.s = s
        self.overlap = overlap
        self._instrument()

    # ---- instrumentation (observes; changes nothing) ----------------------------------------------------------
    def _instrument(self):
        s, tree = self.s, self.tree
        self.retracted_now: list = []
        add = s._add_request_to_queue

        def add_request_to_queue(req, is_retracted=False):
            if is_retracted:
                self.retracted_now.append(req)
            return add(req, is_retracted=is_retracted)

        s._add_request_to_queue = add_request_to_queue  # instance attribute shadows the method for self.* calls

        self.evicted_now = 0
        depth = [0]

        def counting(fn):
            def wrapper(*args, **kwargs):
                depth[0] += 1
                try:
                    res = fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
                if depth[0] == 0 and res is not None:
                    self.evicted_now += int(res.num_tokens_evicted)
                return res

            return wrapper

        tree.evict_for_alloc = counting(tree.evict_for_alloc)
        tree.evict = counting(tree.evict)


class Oracle:
    def __init__(self, cfg: dict):
        import torch

        self.torch = torch
        self.cfg = cfg
        self.sh = EngineShell(cfg)
        self.specs = cfg["requests"]
        self.reqs: list = []  # Req objects, input order
        self.index = {}  # rid -> input index
        self.pending_out = {}  # rid -> tokens launched to the fake model but not yet processed
        self.info = []
        self.seq_tokens = []  # per request: the deterministic full sequence input + outputs (for the slot map)
        self.slot_tok = torch.full((cfg["max_total_tokens"] + 2 * cfg["page_size"] + 1,), -1, dtype=torch.int64)
        self.batches: list = []
        self.retractions_without_batch: list = []
        self.evicted_without_batch: list = []
        self.followers: dict[str, list[int]] = {}  # id -> input indices of the requests received when it finishes
        self.independent = [i for i, r in enumerate(self.specs) if r["after"] is None]  # the closed loop's list
        for i, r in enumerate(self.specs):
            if r["after"] is not None:
                self.followers.setdefault(r["after"], []).append(i)
        self.next_independent = 0
        self.received = 0
        self.to_receive: list = []
        self.iteration = 0

    # ---- requests ------------------------------------------------------------------------------------------------
    def make_requests(self):
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.managers.utils import validate_input_length
        from sglang.srt.runtime_context import get_serving
        from sglang.srt.sampling.sampling_params import SamplingParams

        s = self.sh.s
        for i, r in enumerate(self.specs):
            ids = ids_of(r["prompt"]).tolist()
            sp = SamplingParams(max_new_tokens=r["max_new_tokens"], ignore_eos=r["ignore_eos"])
            sp.normalize(None)  # the tokenizer manager does this
            # vocab_size stays None: the fake token ids exceed any vocabulary (the vocab-boundary finish check).
            req = Req(r["id"], "", array("q", ids), sp, eos_token_ids={EOS_TOKEN_ID})
            # _handle_generate_request's scheduling-relevant steps (scheduler.py:3241-3262)
            s.init_req_max_new_tokens(req)
            err = validate_input_length(req, s.max_req_input_len, get_serving().allow_auto_truncate)
            if err or req.finished():
                raise BadInput(f"requests[{i}] ({r['id']}): SGLang would abort it at intake: "
                               f"{err or req.finished_reason}")
            if req.sampling_params.max_new_tokens < 1:
                raise BadInput(f"requests[{i}] ({r['id']}): SGLang caps max_new_tokens to 0 for this pool")
            req.logprob_start_len = -1  # no return_logprob
            self.reqs.append(req)
            self.index[req.rid] = i
            max_new = req.sampling_params.max_new_tokens
            outs = [(OUTPUT_K + i) * SCALE + p for p in range(max_new + 1)]
            if not r["ignore_eos"] and r["eos_after"] is not None and r["eos_after"] <= max_new:
                outs[r["eos_after"]] = EOS_TOKEN_ID
            self.seq_tokens.append(self.torch.tensor(ids + outs, dtype=self.torch.int64))
            self.info.append({"id": r["id"], "cached_tokens": None, "admit_batch": None, "first_token_batch": None,
                              "finish_batch": None, "num_retractions": 0, "output_tokens": None,
                              "max_new_tokens": max_new, "finish_reason": None, "arrival_iteration": None})

    def sampled_token(self, i: int, pos: int) -> int:
        spec = self.specs[i]
        if not spec["ignore_eos"] and spec["eos_after"] is not None and pos == spec["eos_after"]:
            return EOS_TOKEN_ID
        return (OUTPUT_K + i) * SCALE + pos

    def receive_next(self):
        """The closed loop: the next request of the list that follows no other (`after` null), if any."""
        if self.next_independent < len(self.independent):
            self._receive(self.independent[self.next_independent])
            self.next_independent += 1

    def receive_after(self, rid: str):
        """`rid` finished: the requests that follow it (a session's next turn), else the closed loop's next one."""
        followers = self.followers.get(rid)
        if not followers:
            self.receive_next()
        for i in followers or ():
            self._receive(i)

    def _receive(self, i: int):
        """Received now, ingested at the top of the next iteration. A prompt that resends outputs (runs with k >=
        OUTPUT_K) must find them sampled already: the session's previous turn has finished."""
        for k, start, n in self.specs[i]["prompt"]:
            if k >= OUTPUT_K:
                sent = list(self.reqs[k - OUTPUT_K].output_ids[start:start + n])
                if sent != ids_of([[k, start, n]]).tolist():
                    raise BadInput(f"requests[{i}] ({self.specs[i]['id']}): received when request "
                                   f"{self.specs[k - OUTPUT_K]['id']} has not sampled the outputs {start}.."
                                   f"{start + n - 1} its prompt resends (unfinished, capped or stopped on EOS)")
        self.to_receive.append(self.reqs[i])
        self.received += 1

    # ---- fake model --------------------------------------------------------------------------------------------------
    def run_batch(self, batch):
        """Scheduler.run_batch (scheduler.py:4614) minus the model: counters, then one sampled token per request."""
        from sglang.srt.managers.utils import GenerationBatchResult

        s = self.sh.s
        s.forward_ct += 1
        batch.forward_iter = s.forward_ct
        if batch.extend_num_tokens:
            s.processed_tokens_counter += batch.extend_num_tokens
        toks, counted = [], []
        for r in batch.reqs:
            if batch.forward_mode.is_extend() and r is batch.chunked_req:
                toks.append(0)  # a middle chunk: its sample is discarded by result processing
                continue
            pos = len(r.output_ids) + self.pending_out.get(r.rid, 0)
            self.pending_out[r.rid] = self.pending_out.get(r.rid, 0) + 1
            counted.append(r.rid)
            toks.append(self.sampled_token(self.index[r.rid], pos))
        result = GenerationBatchResult(next_token_ids=self.torch.tensor(toks, dtype=self.torch.int64))
        return result, counted

    def process(self, item):
        """Scheduler.process_batch_result (scheduler.py:5074), generation batches only."""
        batch, result, counted, idx = item
        s = self.sh.s
        before = {id(r): r.finished() for r in batch.reqs}
        if batch.forward_mode.is_decode():
            s.batch_result_processor.process_batch_result_decode(batch, result)
        else:
            s.batch_result_processor.process_batch_result_prefill(batch, result)
        self.sh.tree.flush_pending_backups()
        for rid in counted:
            self.pending_out[rid] -= 1
        for r in batch.reqs:  # the processor walks batch.reqs in order and finishes them in that order
            inf = self.info[self.index[r.rid]]
            if inf["first_token_batch"] is None and len(r.output_ids) > 0:
                inf["first_token_batch"] = idx
            if r.finished() and not before[id(r)]:
                inf["finish_batch"] = idx
                inf["cached_tokens"] = int(r.cached_tokens)
                if self.sh.hicache:
                    inf["cached_tokens_host"] = int(r.cached_tokens_host)
                inf["output_tokens"] = len(r.output_ids)
                inf["num_retractions"] = int(r.retraction_count)
                inf["finish_reason"] = type(r.finished_reason).__name__
                self.receive_after(r.rid)  # one new request per finished one (or its followers), next iteration

    # ---- one scheduling pass --------------------------------------------------------------------------------------
    def schedule(self):
        sh, s = self.sh, self.sh.s
        if sh.evicted_now:  # never seen: result processing only frees and inserts
            self.evicted_without_batch.append({"after_batch": len(self.batches) - 1, "evicted": sh.evicted_now,
                                               "during": "result processing"})
        sh.retracted_now = []
        sh.evicted_now = 0
        plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch, batch = plan.running_batch, plan.batch_to_run
        retracted = [r.rid for r in sh.retracted_now]
        if batch is None:
            if retracted:
                self.retractions_without_batch.append({"after_batch": len(self.batches) - 1, "retracted": retracted})
            if sh.evicted_now:
                self.evicted_without_batch.append({"after_batch": len(self.batches) - 1, "evicted": sh.evicted_now,
                                                   "during": "scheduling"})
                sh.evicted_now = 0
            return None, None
        idx = len(self.batches)
        rec = {"mode": "extend" if batch.forward_mode.is_extend() else "decode", "iteration": self.iteration}
        if rec["mode"] == "extend":
            rec["reqs"] = [[r.rid, int(p), int(e)] for r, p, e in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)]
            for r in batch.reqs:
                inf = self.info[self.index[r.rid]]
                if inf["admit_batch"] is None:
                    inf["admit_batch"] = idx
        else:
            rec["reqs"] = [r.rid for r in batch.reqs]
        rec.update(
            retracted=retracted,
            available=int(sh.alloc.available_size()),
            evictable=int(sh.tree.evictable_size()),
            protected=int(sh.tree.protected_size()),
            new_token_ratio=float(s.new_token_ratio_tracker.current),
            waiting=len(s.waiting_queue),
            running=len(s.running_batch.reqs),
            evicted=sh.evicted_now,
        )
        sh.evicted_now = 0
        self.batches.append(rec)
        self._map_slots(batch, rec["mode"])
        return batch, idx

    def _map_slots(self, batch, mode):
        """Remember which token each newly allocated KV slot holds (only used to print the Rust tree's keys)."""
        torch = self.torch
        table = self.sh.r2t.req_to_token
        if mode == "extend":
            for r, p, e in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
                if e:
                    slots = table[r.kv.req_pool_idx, p:p + e].long()
                    self.slot_tok[slots] = self.seq_tokens[self.index[r.rid]][p:p + e]
        else:
            rows = torch.tensor([r.kv.req_pool_idx for r in batch.reqs], dtype=torch.int64)
            pos = torch.tensor([r.kv.kv_committed_len - 1 for r in batch.reqs], dtype=torch.int64)
            slots = table[rows, pos].long()
            toks = torch.stack([self.seq_tokens[self.index[r.rid]][q] for r, q in zip(batch.reqs, pos.tolist())])
            self.slot_tok[slots] = toks

    def fully_idle(self):  # Scheduler.is_fully_idle (scheduler.py:5337) for this configuration
        s = self.sh.s
        return (s.running_batch.is_empty() and s.chunked_req is None
                and (s.last_batch is None or s.last_batch.is_empty())
                and (not s.enable_overlap or len(s.result_queue) == 0) and len(s.waiting_queue) == 0)

    def on_idle(self):  # on_idle's only scheduling effect (scheduler.py:5318)
        if self.fully_idle():
            self.sh.s.new_token_ratio_tracker.reset()

    # ---- the loop -------------------------------------------------------------------------------------------------
    def run(self):
        s = self.sh.s
        self.make_requests()
        for _ in range(self.cfg["concurrency"]):
            self.receive_next()
        if self.sh.overlap:
            s.enable_skip_finishing_decode = True  # event_loop_overlap's first line
        idle_iters = 0
        while True:
            done = all(inf["finish_batch"] is not None for inf in self.info)
            if done and not s.result_queue and self.received == len(self.reqs):
                break
            # ingest_requests -> handle_generate_request -> _add_request_to_queue
            for req in self.to_receive:
                self.info[self.index[req.rid]]["arrival_iteration"] = self.iteration
                s._add_request_to_queue(req)
            self.to_receive = []
            batch, idx = self.schedule()
            if self.sh.overlap:  # event_loop_overlap (scheduler.py:2061-2134)
                disable = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)
                if disable:
                    self.process(s.result_queue.popleft())
                if batch:
                    result, counted = self.run_batch(batch)
                    s.result_queue.append((batch.copy(), result, counted, idx))
                if s.last_batch:
                    if not disable:
                        self.process(s.result_queue.popleft())
                elif batch is None:
                    self.on_idle()
            else:  # event_loop_normal (scheduler.py:2026-2059)
                if batch:
                    result, counted = self.run_batch(batch)
                    self.process((batch, result, counted, idx))
                else:
                    self.on_idle()
            s.last_batch = batch
            self.iteration += 1
            idle_iters = idle_iters + 1 if batch is None and not s.result_queue else 0
            if idle_iters > 3:
                waiting = [r.rid for r in s.waiting_queue]
                raise Stalled(f"no batch can be scheduled; waiting={waiting[:10]}, "
                              f"running={[r.rid for r in s.running_batch.reqs][:10]}, "
                              f"available={self.sh.alloc.available_size()}, evictable={self.sh.tree.evictable_size()}")

    # ---- final state ------------------------------------------------------------------------------------------
    def tree_nodes(self) -> list:
        """Every node as [path runs, lock_ref], sorted."""
        from array import array

        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        tree, out = self.sh.tree, []
        if self.sh.tree_kind == "radix":
            stack = [(tree.root_node, array("q"))]
            while stack:
                node, path = stack.pop()
                for child in node.children.values():
                    p = path + child.key.token_ids[: len(child.key)]
                    out.append([runs_of(p), int(child.lock_ref)])
                    stack.append((child, p))
        elif self.sh.tree_kind == "unified-python":
            stack = [(tree.root_node, array("q"))]
            while stack:
                node, path = stack.pop()
                for child in node.children.values():
                    p = path + child.key.token_ids[: len(child.key)]
                    out.append([runs_of(p), int(child.component_data[ComponentType.FULL].lock_ref)])
                    stack.append((child, p))
        else:
            out = self._rust_tree_nodes()
        out.sort()
        return out

    def _rust_tree_nodes(self) -> list:
        """The Rust tree core exposes no node walk; its pretty_print (to fd 1) lists every node's id, depth and
        lock count, get_component_device_value gives each node's KV slots, and the slot map gives the tokens."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        core = self.sh.tree.tree_core
        sys.stdout.flush()
        sys.__stdout__.flush()
        saved = os.dup(1)
        with tempfile.TemporaryFile(mode="w+b") as f:
            os.dup2(f.fileno(), 1)
            try:
                core.pretty_print()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            f.seek(0)
            text = f.read().decode()
        out, stack = [], []  # stack of (indent, tokens list) for the current path
        for line in text.splitlines():
            body = line.lstrip(" ")
            if not body.startswith("["):
                continue
            indent = len(line) - len(body)
            node_id = int(body[1:body.index("]")])
            fields = body.split()
            lock = next(int(f.split("=", 1)[1]) for f in fields if f.startswith("full_lock="))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if not stack:  # the root
                stack.append((indent, []))
                continue
            value = core.get_component_device_value(node_id, ComponentType.FULL)
            toks = self.slot_tok[value.long()].tolist() if value is not None else []
            if any(t < 0 for t in toks):
                raise RuntimeError(f"tree node {node_id} holds a KV slot the oracle never saw allocated")
            path = stack[-1][1] + toks
            out.append([runs_of(path), lock])
            stack.append((indent, path))
        return out

    def output(self) -> dict:
        import sglang

        sh = self.sh
        if sh.hicache:
            sh.tree.check_hicache_events()  # the idle loop's next pass: copies still unacknowledged are reaped
        for inf, req in zip(self.info, self.reqs):
            inf["num_retractions"] = int(req.retraction_count)
        return {
            "sglang_version": sglang.__version__,
            "eos_token_id": EOS_TOKEN_ID,
            "config": {k: self.cfg[k] for k in DEFAULTS} | {
                "effective_max_total_tokens": sh.N,
                "effective_max_running_requests": sh.s.max_running_requests,
                "effective_chunked_prefill_size": sh.s.chunked_prefill_size,
                "effective_max_prefill_tokens": sh.s.max_prefill_tokens,
                "effective_page_size": sh.s.page_size,
                "effective_schedule_policy": str(sh.s.schedule_policy),
                "max_req_len": sh.s.max_req_len,
                "overlap": sh.overlap,
                "tree_class": type(sh.tree).__name__,
                "tree_core": type(getattr(sh.tree, "tree_core", sh.tree)).__name__,
            },
            "batches": self.batches,
            "retractions_without_batch": self.retractions_without_batch,
            "evicted_without_batch": self.evicted_without_batch,
            "requests": self.info,
            "tree": self.tree_nodes(),
            "final": {"available": int(sh.alloc.available_size()), "evictable": int(sh.tree.evictable_size()),
                      "protected": int(sh.tree.protected_size())},
        }


def main(argv) -> int:
    import logging

    real_stdout = sys.stdout
    try:
        src = open(argv[1]) if len(argv) > 1 else sys.stdin
        spec = json.load(src)
        cfg = parse_spec(spec)
    except (OSError, ValueError, BadInput) as e:
        print(f"engine_oracle: bad input: {e}", file=sys.stderr)
        return 2
    sys.stdout = sys.stderr  # anything SGLang prints goes to stderr; stdout carries only the result
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="[sglang %(levelname)s %(name)s] %(message)s")
    t0 = time.perf_counter()
    try:
        load_sglang()
        import torch

        torch.set_num_threads(1)
        t1 = time.perf_counter()
        oracle = Oracle(cfg)
        oracle.run()
        result = oracle.output()
    except BadInput as e:
        print(f"engine_oracle: bad input: {e}", file=sys.stderr)
        return 2
    except Stalled as e:
        print(f"engine_oracle: stalled: {e}", file=sys.stderr)
        return 3
    except Exception:
        import traceback

        traceback.print_exc()
        return 4
    finally:
        sys.stdout = real_stdout
    print(f"engine_oracle: {len(cfg['requests'])} requests, {len(result['batches'])} batches; "
          f"import {t1 - t0:.1f} s, replay {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    json.dump(result, real_stdout, separators=(",", ":"))
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
