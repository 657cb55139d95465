#!/usr/bin/env python3
"""vLLM prefix-cache oracle: replay a request stream through vLLM v1's own
Scheduler / KVCacheManager / BlockPool on CPU, without weights.

Run it with the oracle venv's interpreter (see README.md in this folder):

    .venv-vllm-oracle/bin/python benchmarks/oracles/vllm/oracle.py stream.json > out.json
    .venv-vllm-oracle/bin/python benchmarks/oracles/vllm/oracle.py < stream.json > out.json

Input: one JSON object (stdin, or the file named by the first argument):

    {"block_size": 16, "num_gpu_blocks": 585, "max_num_batched_tokens": 8192,
     "max_num_seqs": 256, "num_workers": 2, "mode": "closed_loop",
     "concurrency": 4, "seed": 0,
     "requests": [{"id": "r0", "worker": 0, "prompt_token_ids": [...],
                   "max_tokens": 64}, ...]}

Semantics: lockstep engine steps with synchronous scheduling. One vLLM
Scheduler per worker, all sharing one sha256 block hasher. A client keeps
`concurrency` requests in flight over the whole cluster ("one_at_a_time" means
concurrency 1): the first `concurrency` requests of the list are added before
step 0; at global step k every worker with unfinished requests runs
schedule() + fake forward + update_from_output(); then, for every request that
finished in step k (worker index order, then finish order), the next request of
the list is added to its own worker before step k+1.

Output (stdout, one JSON object, per-worker KV cache events included): see
README.md. Everything vLLM logs goes to
stderr; stdout carries only the result. Exit status 2 on bad input, 3 when a
worker stalls (a prompt can never fit).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Must be set before vllm is first imported.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

DEFAULT_MODEL_DIR = (
    Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "qwen3-0.6b"
)
VOCAB_SIZE = 151936
DEFAULTS = {
    "block_size": 16,
    "num_gpu_blocks": 585,
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 256,
    "num_workers": 1,
    "mode": "closed_loop",
    "concurrency": 1,
    "seed": 0,
    "max_model_len": 40960,
}


class OracleError(Exception):
    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


def _validate(spec: dict) -> dict:
    if not isinstance(spec, dict):
        raise OracleError("input must be one JSON object")
    unknown = set(spec) - set(DEFAULTS) - {"requests", "model_dir"}
    if unknown:
        raise OracleError(f"unknown input keys: {sorted(unknown)}")
    cfg = {k: spec.get(k, v) for k, v in DEFAULTS.items()}
    for k in DEFAULTS:
        if k != "mode" and (not isinstance(cfg[k], int) or isinstance(cfg[k], bool)):
            raise OracleError(f"{k} must be an integer, got {cfg[k]!r}")
    if cfg["mode"] == "one_at_a_time":
        cfg["concurrency"] = 1
    elif cfg["mode"] != "closed_loop":
        raise OracleError(f"mode must be closed_loop or one_at_a_time, got {cfg['mode']!r}")
    if cfg["concurrency"] < 1 or cfg["num_workers"] < 1 or cfg["num_gpu_blocks"] < 2:
        raise OracleError("concurrency and num_workers must be >= 1, num_gpu_blocks >= 2")
    reqs = spec.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise OracleError("requests must be a non-empty list")
    seen = set()
    for i, r in enumerate(reqs):
        rid = r.get("id")
        if not isinstance(rid, str) or rid in seen:
            raise OracleError(f"requests[{i}]: id must be a unique string, got {rid!r}")
        seen.add(rid)
        w = r.get("worker")
        if not isinstance(w, int) or not 0 <= w < cfg["num_workers"]:
            raise OracleError(f"request {rid}: worker must be in [0, {cfg['num_workers']}), got {w!r}")
        toks = r.get("prompt_token_ids")
        if not isinstance(toks, list) or not toks:
            raise OracleError(f"request {rid}: prompt_token_ids must be a non-empty list")
        if not all(isinstance(t, int) and 0 <= t < VOCAB_SIZE for t in toks):
            raise OracleError(f"request {rid}: token ids must be ints in [0, {VOCAB_SIZE})")
        mt = r.get("max_tokens")
        if not isinstance(mt, int) or mt < 1:
            raise OracleError(f"request {rid}: max_tokens must be an int >= 1")
        if len(toks) + mt > cfg["max_model_len"]:
            raise OracleError(f"request {rid}: prompt + max_tokens exceeds max_model_len {cfg['max_model_len']}")
    cfg["requests"] = reqs
    cfg["model_dir"] = str(spec.get("model_dir") or DEFAULT_MODEL_DIR)
    if not (Path(cfg["model_dir"]) / "config.json").is_file():
        raise OracleError(f"no config.json in model_dir {cfg['model_dir']}")
    return cfg


def _free_queue_ids(block_pool) -> list[int]:
    q = block_pool.free_block_queue
    ids = []
    node = q.fake_free_list_head.next_free_block
    while node is not None and node is not q.fake_free_list_tail:
        ids.append(node.block_id)
        node = node.next_free_block
    if len(ids) != q.num_free_blocks:
        raise OracleError(
            f"free queue walk found {len(ids)} blocks, num_free_blocks={q.num_free_blocks}", 4
        )
    return ids



def record_gpu_events(scheds, step_now: list[int]) -> tuple[list[list[tuple[int, object]]], dict]:
    """Wrap each scheduler's KV cache manager to keep its GPU KV events with the step that took them
    (`step_now[0]`), and the block pool's event builder to remember each BlockStored's request and start token
    (a BlockStored names neither): (events per worker, id(event) -> (event, request id, start token))."""
    raw_events: list[list[tuple[int, object]]] = [[] for _ in scheds]
    stored_origin: dict[int, tuple[object, str, int]] = {}
    for w, s in enumerate(scheds):
        kvm = s.kv_cache_manager
        pool = kvm.block_pool
        orig_build = pool._build_block_stored_event

        def build(request, block_hashes, parent_block_hash, start_token_idx, *args, _orig=orig_build, **kw):
            ev = _orig(request, block_hashes, parent_block_hash, start_token_idx, *args, **kw)
            stored_origin[id(ev)] = (ev, request.request_id, start_token_idx)
            return ev

        pool._build_block_stored_event = build
        orig_take = kvm.take_events

        def take(_orig=orig_take, _w=w):
            evs = _orig()
            raw_events[_w].extend((step_now[0], ev) for ev in evs)
            return evs

        kvm.take_events = take
    return raw_events, stored_origin

def run(cfg: dict) -> dict:
    import random

    import torch
    import vllm
    from vllm.config import CacheConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.metrics.stats import PrefixCacheStats
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    bs = cfg["block_size"]
    nw = cfg["num_workers"]

    def make_scheduler():
        model_config = ModelConfig(
            model=cfg["model_dir"],
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=cfg["max_model_len"],
            seed=0,
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_model_len=cfg["max_model_len"],
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        cache_config = CacheConfig(
            block_size=bs,
            enable_prefix_caching=True,
            prefix_caching_hash_algo="sha256",
        )
        vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            # KV events on, published nowhere ("null"): the oracle reads them from take_events.
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
        )
        vllm_config.cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
        kv_cache_config = KVCacheConfig(
            num_blocks=cfg["num_gpu_blocks"],
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["model.layers.0.self_attn.attn"],
                    FullAttentionSpec(
                        block_size=bs,
                        num_kv_heads=8,
                        head_size=128,
                        dtype=torch.bfloat16,
                    ),
                )
            ],
        )
        return Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=bs,
            hash_block_size=bs,
            log_stats=True,
        )

    scheds = [make_scheduler() for _ in range(nw)]
    for s in scheds:
        if s.vllm_config.scheduler_config.async_scheduling:
            raise OracleError("async scheduling is on; the oracle needs the sync loop", 4)

    # One block hasher for all workers.
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(bs, hash_fn)

    # Cross-check: hits recorded by record_prefix_cache_stats at admission.
    recorded_hits: dict[str, int] = {}
    for s in scheds:
        kvm = s.kv_cache_manager
        orig = kvm.record_prefix_cache_stats

        def wrapped(request, num_hits, _orig=orig):
            if request.num_preemptions == 0:
                recorded_hits.setdefault(request.request_id, num_hits)
            return _orig(request, num_hits)

        kvm.record_prefix_cache_stats = wrapped

    # KV events: the batch each step's update_from_output takes (KVCacheManager.take_events, once per step), per
    # worker. A BlockStored names neither its request nor its position, so the block pool's event builder
    # (shared by cache_full_blocks and emit_cached_block_events) is wrapped to remember both per event.
    step_now = [0]
    for s in scheds:
        if not s.kv_cache_manager.enable_kv_cache_events:
            raise OracleError("KV cache events did not switch on", 4)
    raw_events, stored_origin = record_gpu_events(scheds, step_now)

    rng = random.Random(cfg["seed"])
    stats = [PrefixCacheStats() for _ in range(nw)]

    def add_stats(acc, st):
        if st is None:
            return
        for f in ("requests", "queries", "hits", "preempted_requests",
                  "preempted_queries", "preempted_hits"):
            setattr(acc, f, getattr(acc, f) + getattr(st, f))

    reqs = cfg["requests"]
    objs: dict[str, Request] = {}
    rec: dict[str, dict] = {}

    def submit(idx: int) -> None:
        r = reqs[idx]
        req = Request(
            request_id=r["id"],
            prompt_token_ids=list(r["prompt_token_ids"]),
            sampling_params=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
            pooling_params=None,
            block_hasher=hasher,
        )
        objs[r["id"]] = req
        rec[r["id"]] = {
            "id": r["id"], "worker": r["worker"], "admit_step": None,
            "hit_tokens": None, "first_token_step": None, "finish_step": None,
            "num_preemptions": 0,
        }
        scheds[r["worker"]].add_request(req)

    concurrency = cfg["concurrency"]
    next_idx = 0
    while next_idx < min(concurrency, len(reqs)):
        submit(next_idx)
        next_idx += 1

    zero_streak = [0] * nw
    k = 0
    while True:
        active = [w for w in range(nw) if scheds[w].has_unfinished_requests()]
        if not active:
            break
        finished_this_step: list[str] = []
        step_now[0] = k
        for w in active:
            s = scheds[w]
            out = s.schedule()
            for nr in out.scheduled_new_reqs:
                r = rec[nr.req_id]
                if r["admit_step"] is None:
                    r["admit_step"] = k
                    r["hit_tokens"] = nr.num_computed_tokens
            ids = list(out.num_scheduled_tokens)
            toks = [[] if s.requests[r].is_prefill_chunk else [rng.randrange(VOCAB_SIZE)]
                    for r in ids]
            mro = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=toks,
            )
            res = s.update_from_output(out, mro)
            for eco in res.values():
                if eco.scheduler_stats is not None:
                    add_stats(stats[w], eco.scheduler_stats.prefix_cache_stats)
                for o in eco.outputs:
                    r = rec[o.request_id]
                    if o.new_token_ids and r["first_token_step"] is None:
                        r["first_token_step"] = k
                    if o.finish_reason is not None:
                        r["finish_step"] = k
                        r["num_preemptions"] = objs[o.request_id].num_preemptions
                        finished_this_step.append(o.request_id)
            if out.total_num_scheduled_tokens == 0:
                zero_streak[w] += 1
                n_run, n_wait = s.get_request_counts()
                preempted = bool(out.preempted_req_ids)
                if (n_wait and not n_run and not preempted) or zero_streak[w] > 1:
                    head = s.waiting.peek_request() if n_wait else None
                    raise OracleError(
                        f"worker {w} stalled at step {k}: scheduled nothing with "
                        f"{n_wait} waiting and {n_run} running; head request "
                        f"{getattr(head, 'request_id', '?')} with "
                        f"{getattr(head, 'num_tokens', '?')} tokens cannot fit "
                        f"({s.kv_cache_manager.block_pool.get_num_free_blocks()} free blocks "
                        f"of {cfg['num_gpu_blocks']})",
                        3,
                    )
            else:
                zero_streak[w] = 0
        for _ in finished_this_step:
            if next_idx < len(reqs):
                submit(next_idx)
                next_idx += 1
        k += 1

    if next_idx != len(reqs) or any(r["finish_step"] is None for r in rec.values()):
        raise OracleError("internal error: loop ended with unfinished requests", 4)

    for rid, r in rec.items():
        if objs[rid].num_preemptions == 0 or rid in recorded_hits:
            if recorded_hits.get(rid) != r["hit_tokens"]:
                raise OracleError(
                    f"internal check failed for {rid}: scheduled_new_reqs says "
                    f"{r['hit_tokens']} hit tokens, record_prefix_cache_stats "
                    f"{recorded_hits.get(rid)}", 4)

    events = []
    for w, s in enumerate(scheds):
        if s.kv_cache_manager.block_pool.kv_event_queue:
            raise OracleError(f"worker {w}: KV events left untaken after the run", 4)
        events.append(_event_rows(raw_events[w], stored_origin, bs, BlockStored, BlockRemoved, AllBlocksCleared))
    if stored_origin:
        raise OracleError(f"{len(stored_origin)} BlockStored events built but never taken", 4)

    workers = []
    for w, s in enumerate(scheds):
        kvm = s.kv_cache_manager
        add_stats(stats[w], kvm.make_prefix_cache_stats())
        st = stats[w]
        workers.append({
            "requests": st.requests, "queries": st.queries, "hits": st.hits,
            "preempted_requests": st.preempted_requests,
            "preempted_queries": st.preempted_queries,
            "preempted_hits": st.preempted_hits,
            "num_free_blocks_end": kvm.block_pool.get_num_free_blocks(),
        })

    return {
        "vllm_version": vllm.__version__,
        "num_steps": k,
        "requests": [rec[r["id"]] for r in reqs],
        "workers": workers,
        "free_queue_end": [_free_queue_ids(s.kv_cache_manager.block_pool) for s in scheds],
        "events": events,
    }


def _event_rows(raw, stored_origin, block_size, BlockStored, BlockRemoved, AllBlocksCleared) -> list[list]:
    """One worker's events as rows [step, kind, num_block_hashes, parent_is_none, request_id, first_block].

    stored: request_id and first_block (start_token_idx // block_size) of the caching pass.
    removed: the request id and block index under which the removed hash was first stored on this worker (its
    name: hash values are vLLM's own), parent_is_none null. cleared: [step, "cleared", 0, null, null, null].
    """
    rows = []
    first_stored: dict = {}
    for step, ev in raw:
        if isinstance(ev, BlockStored):
            origin = stored_origin.pop(id(ev), None)
            if origin is None or origin[0] is not ev:
                raise OracleError("a BlockStored event of unknown origin", 4)
            _, rid, start_tok = origin
            n = len(ev.block_hashes)
            if start_tok % block_size or len(ev.token_ids) != n * block_size or ev.block_size != block_size:
                raise OracleError(f"BlockStored of {rid} not whole blocks: start {start_tok}, "
                                  f"{len(ev.token_ids)} tokens for {n} hashes", 4)
            first = start_tok // block_size
            if (ev.parent_block_hash is None) != (first == 0):
                raise OracleError(f"BlockStored of {rid} at block {first}: parent {ev.parent_block_hash!r}", 4)
            for i, h in enumerate(ev.block_hashes):
                first_stored.setdefault(h, (rid, first + i))
            rows.append([step, "stored", n, ev.parent_block_hash is None, rid, first])
        elif isinstance(ev, BlockRemoved):
            if len(ev.block_hashes) != 1:
                raise OracleError(f"BlockRemoved with {len(ev.block_hashes)} hashes", 4)
            name = first_stored.get(ev.block_hashes[0])
            if name is None:
                raise OracleError("BlockRemoved of a hash never stored", 4)
            rows.append([step, "removed", 1, None, name[0], name[1]])
        elif isinstance(ev, AllBlocksCleared):
            rows.append([step, "cleared", 0, None, None, None])
        else:
            raise OracleError(f"unexpected KV event {type(ev).__name__}", 4)
    return rows


def main(argv: list[str], answer=None, *, name: str = "oracle.py", usage: str = __doc__) -> int:
    """Read the stream (file argument or stdin), write `answer(stream)` as JSON to stdout (default: this oracle's
    `run` of the validated stream); errors go to stderr with the OracleError's exit code."""
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(usage, file=sys.stderr)
        return 2
    # Keep stdout clean: anything vLLM, torch or C code prints goes to stderr.
    real_stdout = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        try:
            if len(argv) == 2 and argv[1] != "-":
                with open(argv[1]) as f:
                    spec = json.load(f)
            else:
                spec = json.load(sys.stdin)
        except (OSError, json.JSONDecodeError) as e:
            raise OracleError(f"cannot read input: {e}")
        result = answer(spec) if answer is not None else run(_validate(spec))
    except OracleError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return e.code
    json.dump(result, real_stdout)
    real_stdout.write("\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
