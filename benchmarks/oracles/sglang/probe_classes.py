#!/usr/bin/env python
"""Probe: drive SGLang 0.5.23's own scheduler-side classes on CPU, without a GPU or a model.

Run with the side venv (nothing is installed into it):

    .venv-sglang/bin/python benchmarks/oracles/sglang/probe_classes.py      # from the repository root

What it shows (see docs/engines/sglang-0.5.23-semantics.md §11; its output is probe_output.txt beside it):
  1. a ServerArgs published through runtime_context is all the global state needed;
  2. ReqToTokenPool, TokenToKVPoolAllocator / PagedTokenToKVPoolAllocator (kvcache=None),
     UnifiedRadixCache (the server's default tree; Rust and Python tree cores),
     plain RadixCache, Req, SchedulePolicy, PrefillAdder and ScheduleBatch
     (init_new / prepare_for_extend / prepare_for_decode / check_decode_mem /
     retract_decode) all run on CPU;
  3. one admission (match -> add_one_req -> lock), a prefill checkpoint, decode steps,
     a second request hitting the prefix, a finish + release, chunked prefill,
     a retraction, page_size 16;
  4. a differential run of the three tree implementations on one request stream.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import random
import sys
import types
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


# ---------------------------------------------------------------------------------------------
# 0. The side venv lacks `openai` and `partial_json_parser`, which sglang.srt.managers.
#    schedule_batch imports transitively (constrained -> parser.reasoning_parser ->
#    entrypoints.openai.protocol, function_call). Nothing here uses them: stub them in memory.
# ---------------------------------------------------------------------------------------------
_STUB_ROOTS = {"openai", "partial_json_parser"}


class _Magic(Exception):
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Magic()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Magic()

    def __iter__(self):
        return iter(())


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self.__name__.split(".")[0] == "openai":
            from pydantic import BaseModel, ConfigDict

            if name.endswith("Param"):  # TypedDicts in openai.types
                from typing_extensions import TypedDict

                cls = TypedDict(name, {}, total=False)
            else:  # pydantic models used as field types in protocol.py
                cls = type(name, (BaseModel,), {"model_config": ConfigDict(extra="allow"), "__module__": self.__name__})
        else:  # other missing packages: exception-compatible, decorator-transparent stand-ins
            cls = type(name, (_Magic,), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the roots in _STUB_ROOTS from memory, unless the real package is importable."""

    _real: dict = {}

    def find_spec(self, fullname, path, target=None):
        root = fullname.split(".")[0]
        if root not in _STUB_ROOTS:
            return None
        if root not in self._real:
            sys.meta_path.remove(self)
            try:
                self._real[root] = importlib.util.find_spec(root) is not None
            finally:
                sys.meta_path.insert(0, self)
        if self._real[root]:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


import importlib.util  # noqa: E402

sys.meta_path.insert(0, _StubFinder())

import torch  # noqa: E402
from array import array  # noqa: E402
from types import SimpleNamespace  # noqa: E402

# ---------------------------------------------------------------------------------------------
# 1. Global config: 0.5.23 reads every server arg through runtime_context.get_schedule() /
#    get_memory() / get_serving() / get_spec() / get_disagg() ... which are "config bags"
#    built from a ServerArgs by RuntimeContext.set_server_args(). No resolve_once() needed
#    (resolution would try to read the model config and the GPU).
# ---------------------------------------------------------------------------------------------
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.runtime_context import get_context, get_schedule, get_memory  # noqa: E402


def publish(page_size: int, chunked_prefill_size: int = 8192, policy: str = "fcfs"):
    sa = ServerArgs(
        model_path="dummy",
        device="cpu",
        page_size=page_size,
        chunked_prefill_size=chunked_prefill_size,
        schedule_policy=policy,
    )
    get_context().set_server_args(sa)


publish(page_size=1)

from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

MODEL_CONFIG = SimpleNamespace(  # every ModelConfig field ScheduleBatch / the result processor read
    vocab_size=32000, is_encoder_decoder=False, self_opened_think_start_ids=None, think_end_ids=None
)


def build(pool_tokens: int, page_size: int = 1, kind: str = "unified", max_reqs: int = 16, ctx_len: int = 4096):
    """kind: 'unified' (server default, Rust core), 'unified-python', or 'radix' (plain RadixCache)."""
    r2t = ReqToTokenPool(size=max_reqs, max_context_len=ctx_len, device="cpu", enable_memory_saver=False)
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(pool_tokens, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(
            pool_tokens, page_size=page_size, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False
        )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        eviction_policy="lru",
        tree_components=(ComponentType.FULL,) if kind != "radix" else None,
        tree_core_backend="python" if kind == "unified-python" else None,
    )
    tree = RadixCache(params) if kind == "radix" else UnifiedRadixCache(params)
    return r2t, alloc, tree


def mk_req(rid: str, ids, max_new_tokens: int = 16, ignore_eos: bool = False) -> Req:
    sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
    sp.normalize(None)  # the tokenizer manager normally does this
    return Req(rid, "", array("q", ids), sp)


def state(alloc, tree) -> str:
    return f"available={alloc.available_size()} evictable={tree.evictable_size()} protected={tree.protected_size()}"


def admit(waiting, running, tree, alloc, r2t, page_size, ratio, chunk=8192, max_prefill=16384, policy=None, verbose=True):
    """One pass of Scheduler._get_new_batch_prefill_raw's admission loop (no chunked_req, no LoRA)."""
    policy = policy or SchedulePolicy(get_schedule().schedule_policy, tree, False, False, False)
    policy.calc_priority(waiting, running)
    adder = PrefillAdder(page_size, tree, alloc, running, ratio, max_prefill, chunk, 0)
    for req in waiting:
        if adder.budget_state() == AddReqResult.OTHER:
            break
        if len(adder.can_run_list) >= r2t.available_size() + sum(r.kv.holds_kv for r in adder.can_run_list):
            break
        req.init_next_round_input(tree)
        res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if verbose:
            print(
                f"   add_one_req({req.rid}): {res.name:8s} prefix_len={req.prefix_len} extend_end={req.extend_end} "
                f"rem_total={adder.rem_total_tokens:.1f} cur_rem={adder.cur_rem_tokens:.1f} "
                f"rem_input={adder.rem_input_tokens} rem_chunk={adder.rem_chunk_tokens} | {state(alloc, tree)}"
            )
        if res != AddReqResult.CONTINUE:
            break
    admitted = adder.can_run_list
    for r in admitted:
        waiting.remove(r)
    if not admitted:
        return None, adder
    batch = ScheduleBatch.init_new(admitted, r2t, alloc, tree, MODEL_CONFIG, True, SpeculativeAlgorithm.NONE)
    batch.prepare_for_extend()  # alloc_for_extend: evict shortfall, allocate rows + KV slots
    return batch, adder


def process_prefill(batch, tree, next_token=7):
    """process_batch_result_prefill for plain (non-mixed) batches."""
    for req in batch.reqs:
        if req.inflight_middle_chunks > 0:  # middle chunk: nothing published here
            req.inflight_middle_chunks -= 1
            continue
        req.output_ids.append(next_token)
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, tree, checkpoint=True)
        else:
            checkpoint_kv_cache(req, tree)


def decode_step(running, tree, tok):
    running.prepare_for_decode()  # alloc_for_decode: evict shortfall, one slot per request
    for req in running.reqs:
        req.output_ids.append(tok)
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, tree, checkpoint=True)
    running.filter_batch()


def section(title):
    print("\n" + "=" * 100 + f"\n{title}\n" + "=" * 100)


# ---------------------------------------------------------------------------------------------
# Scenario 1: admission with a real tree, checkpoint, decode, prefix hit, finish + release
# ---------------------------------------------------------------------------------------------
def scenario_basic(kind="unified"):
    section(f"1. admission -> prefill checkpoint -> decode -> prefix hit -> release   [tree={kind}, page_size=1]")
    publish(page_size=1)
    r2t, alloc, tree = build(1000, kind=kind)
    print(f"tree={type(tree).__name__}, core={type(getattr(tree, 'tree_core', tree)).__name__}, {state(alloc, tree)}")
    tracker = NewTokenRatioTracker.from_config()
    print(f"new_token_ratio init={tracker.init} min={tracker.min:.4f} decay/step={tracker.decay:.6f}")
    running = ScheduleBatch(reqs=[], batch_is_full=False)
    a = mk_req("A", list(range(100, 150)), max_new_tokens=16)
    waiting = [a]
    print(" admit A (50-token prompt, max_new_tokens=16) into an empty cache:")
    batch, _ = admit(waiting, running, tree, alloc, r2t, 1, tracker.current)
    print(f"   after prepare_for_extend: {state(alloc, tree)}  (A's prefill took 50 slots)")
    process_prefill(batch, tree)
    print(f"   after checkpoint (result processed): {state(alloc, tree)}  A.cache_protected_len={a.kv.cache_protected_len}")
    running = batch
    for step in range(3):
        ok = running.check_decode_mem()
        decode_step(running, tree, 8 + step)
        tracker.decay_step()
        print(f"   decode step {step}: check_decode_mem={ok} A.kv_committed_len={a.kv.kv_committed_len} {state(alloc, tree)}")
    b = mk_req("B", list(range(100, 140)) + [1, 2, 3, 4, 5], max_new_tokens=16)
    waiting = [b]
    print(" admit B (45 tokens, first 40 shared with A) while A decodes:")
    print(f"   expected rem_total = available 947 + evictable 0 - A reserve (16-4)*{tracker.current:.4f} - B (5 + page 1 + 16)")
    batch_b, _ = admit(waiting, running, tree, alloc, r2t, 1, tracker.current)
    print(f"   B.prefix_len={b.prefix_len}: cached_tokens after prepare_for_extend={b.cached_tokens}")
    a.to_finish = FINISH_LENGTH(len(a.output_ids))
    a.update_finish_state(0)
    print(f" finish A: outputs={len(a.output_ids)} kv_committed_len={a.kv.kv_committed_len} owned_kv_len={a.owned_kv_len()}")
    release_kv_cache(a, tree, checkpoint=True)
    print(f"   after release_kv_cache(checkpoint=True): {state(alloc, tree)}")
    tree.pretty_print()
    return tree


# ---------------------------------------------------------------------------------------------
# Scenario 2: chunked prefill (chunk 32) — a chunk is published when the next pass stashes it
# ---------------------------------------------------------------------------------------------
def scenario_chunked():
    section("2. chunked prefill: chunked_prefill_size=32, prompt 80 tokens")
    publish(page_size=1, chunked_prefill_size=32)
    r2t, alloc, tree = build(1000)
    running = ScheduleBatch(reqs=[], batch_is_full=False)
    c = mk_req("C", list(range(1000, 1080)), max_new_tokens=8)
    waiting = [c]
    batch, adder = admit(waiting, running, tree, alloc, r2t, 1, 0.7, chunk=32)
    chunked = adder.new_chunked_req
    chunked.inflight_middle_chunks += 1
    print(f"   first chunk: extend [{c.prefix_len},{c.extend_end}) is_chunked={chunked is c} {state(alloc, tree)}")
    process_prefill(batch, tree)  # middle chunk: only the counter moves
    n = 1
    while chunked is not None:
        # get_next_batch_to_run: stash_chunked_request -> checkpoint_kv_cache(req) BEFORE the next chunk
        checkpoint_kv_cache(chunked, tree)
        print(f"   pass {n}: stashed chunk -> tree total={tree.total_size() if not isinstance(tree, UnifiedRadixCache) else tree.total_size()[0]} "
              f"C.prefix_len={chunked.prefix_len} {state(alloc, tree)}")
        chunked.init_next_round_input()  # no tree: refresh fill ids only
        adder = PrefillAdder(1, tree, alloc, running, 0.7, 16384, 32, 0)
        nxt = adder.add_chunked_req(chunked)
        print(f"     add_chunked_req: extend [{chunked.prefix_len},{chunked.extend_end}) still_chunked={nxt is not None} "
              f"rem_chunk={adder.rem_chunk_tokens} rem_total={adder.rem_total_tokens:.1f}")
        batch = ScheduleBatch.init_new(adder.can_run_list, r2t, alloc, tree, MODEL_CONFIG, True, SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        if nxt is not None:
            nxt.inflight_middle_chunks += 1
        process_prefill(batch, tree)
        chunked = nxt
        n += 1
    print(f"   last chunk processed -> checkpoint of the whole prompt: C.cache_protected_len={c.kv.cache_protected_len} "
          f"C.cached_tokens={c.cached_tokens} outputs={list(c.output_ids)}")


# ---------------------------------------------------------------------------------------------
# Scenario 3: retraction
# ---------------------------------------------------------------------------------------------
def scenario_retract():
    section("3. retraction: pool of 200 tokens, 4 requests x 30-token prompts, max_new_tokens=60")
    publish(page_size=1)
    r2t, alloc, tree = build(200)
    tracker = NewTokenRatioTracker.from_config()
    tracker.current = 0.1  # as if the ratio had decayed for ~600 steps
    running = ScheduleBatch(reqs=[], batch_is_full=False)
    waiting = [mk_req(f"R{i}", [5000 + 100 * i + j for j in range(30)], max_new_tokens=60) for i in range(4)]
    for step in range(200):
        batch = None
        if waiting:
            batch, _ = admit(waiting, running, tree, alloc, r2t, 1, tracker.current, verbose=False)
        if batch is not None:
            print(f"   step {step}: prefill {[r.rid for r in batch.reqs]} (running reserve ratio {tracker.current:.3f}) {state(alloc, tree)}")
            process_prefill(batch, tree)
            if running.is_empty():
                running = batch
            else:
                running.merge_batch(batch)
            continue
        if running.is_empty():
            break
        if not running.check_decode_mem():
            before = alloc.available_size()
            retracted, new_ratio, aborted = running.retract_decode()
            print(f"   step {step}: KV full -> retracted {[r.rid for r in retracted]} (outputs "
                  f"{[len(r.output_ids) for r in retracted]}), available {before}->{alloc.available_size()}, "
                  f"new_token_ratio {tracker.current:.4f} -> {new_ratio:.4f}; {state(alloc, tree)}; "
                  f"prefix_len reset to {[r.prefix_len for r in retracted]}")
            waiting.extend(retracted)  # Scheduler._add_request_to_queue(req, is_retracted=True): appended at the END
            tracker.current = new_ratio
            r = retracted[0]
            break
        tracker.decay_step()
        decode_step(running, tree, 9)
    r.init_next_round_input(tree)
    print(f"   re-match of retracted {r.rid}: fill={len(r.full_untruncated_fill_ids)} (prompt+outputs), "
          f"prefix_len={r.prefix_len}: its decode KV was freed unpublished; its published prompt became "
          f"evictable and release_req's evict-to-(remaining*20 tokens) reclaimed it; "
          f"retracted_stain={r.retracted_stain}, cached_tokens={r.cached_tokens} (never counted again)")


# ---------------------------------------------------------------------------------------------
# Scenario 4: page_size 16
# ---------------------------------------------------------------------------------------------
def scenario_paged():
    section("4. page_size=16 (PagedTokenToKVPoolAllocator), prompt 50 then 45 tokens sharing 40")
    publish(page_size=16)
    r2t, alloc, tree = build(1024, page_size=16)
    running = ScheduleBatch(reqs=[], batch_is_full=False)
    a = mk_req("A", list(range(100, 150)), max_new_tokens=16)
    batch, _ = admit([a], running, tree, alloc, r2t, 16, 0.7)
    print(f"   after prepare_for_extend: {state(alloc, tree)} (ceil(50/16)=4 pages = 64 slots)")
    process_prefill(batch, tree)
    print(f"   after checkpoint: {state(alloc, tree)} A.cache_protected_len={a.kv.cache_protected_len} (48 = page-aligned)")
    running = batch
    b = mk_req("B", list(range(100, 140)) + [1, 2, 3, 4, 5], max_new_tokens=16)
    admit([b], running, tree, alloc, r2t, 16, 0.7)
    print(f"   B.prefix_len={b.prefix_len} (40 shared -> floor(min(40, 45-1)/16)*16 = 32)")
    publish(page_size=1)


# ---------------------------------------------------------------------------------------------
# 5. Differential: the same request stream through RadixCache, UnifiedRadixCache(python),
#    UnifiedRadixCache(rust). Non-overlap, FCFS, one prefill batch then decode until finish.
# ---------------------------------------------------------------------------------------------
def run_stream(kind, seed=0, n_reqs=80, pool=700, page_size=1, policy="fcfs", init_ratio=None, max_new=24):
    publish(page_size=page_size, policy=policy)
    rng = random.Random(seed)
    r2t, alloc, tree = build(pool, page_size=page_size, kind=kind, max_reqs=8)
    evictions = [0, 0]
    orig_evict = alloc.evict_to_free_tokens

    def counting_evict(tc, num_tokens):
        before = alloc.available_size()
        out = orig_evict(tc, num_tokens)
        if alloc.available_size() > before:
            evictions[0] += 1
            evictions[1] += alloc.available_size() - before
        return out

    alloc.evict_to_free_tokens = counting_evict
    prefixes = [[rng.randrange(1, 30000) for _ in range(rng.randrange(40, 200))] for _ in range(5)]
    stream = []
    for i in range(n_reqs):
        p = prefixes[rng.randrange(5)]
        cut = rng.randrange(len(p) // 2, len(p) + 1)
        tail = [rng.randrange(1, 30000) for _ in range(rng.randrange(1, 60))]
        stream.append(mk_req(f"q{i}", p[:cut] + tail, max_new_tokens=rng.randrange(1, max_new)))
    tracker = NewTokenRatioTracker.from_config()
    if init_ratio is not None:
        tracker.current = init_ratio
    running = ScheduleBatch(reqs=[], batch_is_full=False)
    waiting, log = [], []
    arrivals = list(stream)
    tick = 0
    while arrivals or waiting or not running.is_empty():
        for _ in range(2):
            if arrivals:
                waiting.append(arrivals.pop(0))
        batch = None
        if waiting:
            batch, adder = admit(waiting, running, tree, alloc, r2t, page_size, tracker.current, verbose=False)
        if batch is not None:
            log.append(("P", tick, tuple((r.rid, r.prefix_len, r.extend_len) for r in batch.reqs),
                        alloc.available_size(), tree.evictable_size()))
            process_prefill(batch, tree)
            batch.filter_batch()
            if running.is_empty():
                running = batch
            elif not batch.is_empty():
                running.merge_batch(batch)
        elif not running.is_empty():
            if not running.check_decode_mem():
                retracted, ratio, _ = running.retract_decode()
                tracker.current = ratio
                waiting.extend(retracted)
                log.append(("R", tick, tuple(r.rid for r in retracted)))
            else:
                tracker.decay_step()
            decode_step(running, tree, 11 + tick % 7)
            log.append(("D", tick, len(running.reqs), alloc.available_size(), tree.evictable_size()))
        tick += 1
        if tick > 5000:
            raise RuntimeError("stuck")
    log.append(("E", tuple(evictions)))
    return log


def scenario_differential():
    section("5. differential: RadixCache vs UnifiedRadixCache(python core) vs UnifiedRadixCache(rust core)")
    cases = ((1, "fcfs", 700, None, 24), (16, "fcfs", 700, None, 24), (1, "lpm", 700, None, 24),
             (1, "fcfs", 600, 0.15, 120), (16, "lpm", 640, 0.15, 120))
    for page_size, policy, pool, ratio, max_new in cases:
        logs = {k: run_stream(k, seed=1, page_size=page_size, policy=policy, pool=pool, init_ratio=ratio, max_new=max_new)
                for k in ("radix", "unified-python", "unified")}
        n_prefill = sum(1 for e in logs["unified"] if e[0] == "P")
        hits = sum(p for e in logs["unified"] if e[0] == "P" for (_, p, _) in e[2])
        ev = logs["unified"][-1][1]
        n_retr = sum(1 for e in logs["unified"] if e[0] == "R")
        print(f"   page_size={page_size} policy={policy} pool={pool}: {len(logs['unified'])} events, {n_prefill} prefill batches, {hits} hit tokens, "
              f"{ev[0]} evictions ({ev[1]} tokens), {n_retr} retractions")
        for k in ("radix", "unified-python"):
            same = logs[k] == logs["unified"]
            first = next((i for i, (x, y) in enumerate(zip(logs[k], logs["unified"])) if x != y), None)
            print(f"     {k:15s} == unified(rust): {same}" + ("" if same else f" (first difference at event {first}: {logs[k][first]} vs {logs['unified'][first]})"))


# ---------------------------------------------------------------------------------------------
# 6. The real Scheduler scheduling code on a model-less shell.
#    Scheduler.__new__ + the attributes get_next_batch_to_run / _get_new_batch_prefill_raw /
#    update_running_batch / _add_request_to_queue read; the real SchedulerBatchResultProcessor
#    (process_batch_result_prefill / _decode); a mirror of event_loop_overlap (scheduler.py:2061)
#    / event_loop_normal (:2026) whose run_batch is a fake model emitting token 7.
# ---------------------------------------------------------------------------------------------
_STUB_ROOTS.update({"setproctitle", "einops", "uvicorn", "fastapi"})  # imported by managers/scheduler.py


class _Null:
    """Inert collaborator: attributes are _Null, calls return their first argument (identity)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Null()

    def __call__(self, *args, **kwargs):
        return args[0] if args else None

    def __bool__(self):
        return False


class _Reporter(_Null):  # SchedulerMetricsReporter: counters the result processor adds to
    def __init__(self):
        self.num_generated_tokens = 0
        self.forward_ct_decode = 0
        self.num_retracted_reqs = 0
        self.enable_metrics = False


class _Beams:  # BeamCoordinator with no beam groups
    def pending_member_rows(self, batch):
        return 0

    def retire_group(self, req):
        return None

    def commit_decode(self, batch):
        return set()


class SchedulerShell:
    def __init__(self, pool_tokens, page_size=1, overlap=True, policy="fcfs", chunk=8192, max_reqs=16,
                 max_prefill_tokens=16384):
        from collections import deque

        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

        publish(page_size=page_size, chunked_prefill_size=chunk, policy=policy)
        get_context().override("probe", pp_max_micro_batch_size=max_reqs)  # set from max_running_requests at init
        self.r2t, self.alloc, self.tree = build(pool_tokens, page_size=page_size, max_reqs=max_reqs)
        s = Scheduler.__new__(Scheduler)
        s.__dict__.update(
            scheduler_stage_metrics=None, dllm_config=None, chunked_req=None, _pending_chunked_abort_req=None,
            enable_hisparse=False, require_mlp_sync=False, spec_algorithm=SpeculativeAlgorithm.NONE,
            _prefill_decode_interval_remaining=0, prefill_decode_interval=0, prefill_delayer=None,
            grammar_manager=_Null(), enable_priority_preemption=False, is_hybrid_swa=False, waiting_queue=[],
            min_free_slots_delayer=None, beam_coordinator=_Beams(), req_to_token_pool=self.r2t,
            token_to_kv_pool_allocator=self.alloc, tree_cache=self.tree, page_size=page_size,
            policy=SchedulePolicy(policy, self.tree, False, False, False), processed_tokens_counter=0,
            chunked_prefill_size=chunk, dynamic_chunk_sizer=None, tp_worker=_Null(),
            new_token_ratio_tracker=NewTokenRatioTracker.from_config(), max_prefill_tokens=max_prefill_tokens,
            is_mixed_chunk=False, priority_scheduling_preemption_threshold=10, max_prefill_bs=0,
            max_running_requests=max_reqs, max_queued_requests=None, enable_lora=False,
            enable_hicache_storage=False, enable_lmcache=False, truncation_align_size=None,
            model_config=MODEL_CONFIG, enable_overlap=overlap, enable_hierarchical_cache=False,
            enable_unified_cache_external_linker=False, hisparse_coordinator=None, load_inquirer=_Null(),
            enable_priority_scheduling=False, dp_attn_adapter=_Null(), ngram_embedding_manager=_Null(),
            enable_skip_finishing_decode=overlap, result_queue=deque(), decode_offload_manager=None,
            metrics_reporter=_Reporter(), forward_ct=0, disaggregation_mode=DisaggregationMode.NULL,
            running_batch=ScheduleBatch(reqs=[], batch_is_full=False), last_batch=None,
        )
        s.batch_result_processor = SchedulerBatchResultProcessor(
            is_generation=True, disaggregation_mode=DisaggregationMode.NULL, enable_overlap=overlap,
            enable_overlap_mlx=False, model_config=MODEL_CONFIG, token_to_kv_pool_allocator=self.alloc,
            tree_cache=self.tree, hisparse_coordinator=None, req_to_token_pool=self.r2t, decode_offload_manager=None,
            metrics_collector=_Null(), metrics_reporter=s.metrics_reporter, draft_worker=None, model_worker=_Null(),
            logprob_result_processor=_Null(), output_streamer=_Null(), beam_coordinator=_Beams(),
            abort_request=_Null(),
        )
        self.s, self.overlap, self.trace, self.produced = s, overlap, [], {}

    eos_at: dict = {}  # rid -> n: the model emits EOS (token 2) as the request's n-th sampled token

    def _run_batch(self, batch):  # Scheduler.run_batch minus the model
        from sglang.srt.managers.utils import GenerationBatchResult

        self.s.forward_ct += 1
        batch.forward_iter = self.s.forward_ct
        toks = []
        for r in batch.reqs:
            self.produced[r.rid] = self.produced.get(r.rid, 0) + 1
            toks.append(2 if self.produced[r.rid] == self.eos_at.get(r.rid) else 7)
        return GenerationBatchResult(next_token_ids=torch.tensor(toks))

    def _process(self, batch, result):  # Scheduler.process_batch_result (scheduler.py:5074), generation only
        brp = self.s.batch_result_processor
        if batch.forward_mode.is_decode():
            brp.process_batch_result_decode(batch, result)
        else:
            brp.process_batch_result_prefill(batch, result)

    def step(self, arrivals=()):
        s = self.s
        for req in arrivals:  # ingest_requests -> handle_generate_request -> _add_request_to_queue
            s._add_request_to_queue(req)
        plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch, batch = plan.running_batch, plan.batch_to_run
        if batch is not None:
            kind = "prefill" if batch.forward_mode.is_extend() else "decode"
            self.trace.append((s.forward_ct + 1, kind, [(r.rid, r.prefix_len, r.extend_len) if kind == "prefill"
                                                         else r.rid for r in batch.reqs]))
        if self.overlap:
            disable = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)
            if disable:
                self._process(*s.result_queue.popleft())
            if batch is not None:
                s.result_queue.append((batch.copy(), self._run_batch(batch)))
            if s.last_batch is not None:
                if not disable:
                    self._process(*s.result_queue.popleft())
            elif batch is None:
                self._on_idle()
        else:
            if batch is not None:
                self._process(batch, self._run_batch(batch))
            else:
                self._on_idle()
        s.last_batch = batch
        return batch

    def _on_idle(self):  # on_idle's only scheduling effect: reset new_token_ratio when fully idle
        s = self.s
        if (s.running_batch.is_empty() and s.chunked_req is None and not s.waiting_queue
                and (s.last_batch is None or s.last_batch.is_empty()) and not s.result_queue):
            s.new_token_ratio_tracker.reset()


def scenario_scheduler_shell():
    section("6. real Scheduler.get_next_batch_to_run + SchedulerBatchResultProcessor on a model-less shell")
    prompt = list(range(300, 364))
    for overlap in (True, False):
        sh = SchedulerShell(pool_tokens=2000, overlap=overlap)
        a = mk_req("A", prompt + [1], max_new_tokens=3)
        b = mk_req("B", prompt + [2], max_new_tokens=3)
        c = mk_req("C", prompt + [3], max_new_tokens=3)
        arrivals = {0: [a], 1: [b], 2: [c]}
        for it in range(12):
            sh.step(arrivals.get(it, ()))
        print(f"   overlap={overlap}: (forward_ct, kind, [(rid, prefix_len, extend_len)] / [rid]):")
        for t in sh.trace:
            print(f"      {t}")
        print(f"      cached_tokens A/B/C = {a.cached_tokens}/{b.cached_tokens}/{c.cached_tokens}; "
              f"{state(sh.alloc, sh.tree)}; ratio={sh.s.new_token_ratio_tracker.current:.4f}")
    print("   EOS finish (40-token prompt, EOS sampled as the 4th token, max_new_tokens=50):")
    for overlap in (True, False):
        sh = SchedulerShell(pool_tokens=2000, overlap=overlap)
        sh.eos_at = {"E": 4}
        e = mk_req("E", list(range(300, 340)), max_new_tokens=50)
        e.eos_token_ids = {2}
        for it in range(10):
            sh.step([e] if it == 0 else ())
        n_dec = sum(1 for t in sh.trace if t[1] == "decode")
        print(f"      overlap={overlap}: outputs={list(e.output_ids)} decode forwards={n_dec} "
              f"tree tokens after release={sh.tree.total_size()[0]} (input 40 + {sh.tree.total_size()[0] - 40} outputs)")
    print("   retraction under overlap (pool 260, 4 x 40-token prompts, max_new_tokens=80):")
    sh = SchedulerShell(pool_tokens=260, overlap=True)
    sh.s.new_token_ratio_tracker.current = 0.1
    reqs = [mk_req(f"R{i}", [9000 + 100 * i + j for j in range(40)], max_new_tokens=80) for i in range(4)]
    arrivals = {i: [r] for i, r in enumerate(reqs)}
    for it in range(400):
        n_before = len(sh.s.waiting_queue)
        sh.step(arrivals.get(it, ()))
        if not sh.s.result_queue and not sh.s.waiting_queue and sh.s.running_batch.is_empty() and it > 4:
            break
    kinds = [t[1] for t in sh.trace]
    print(f"      {kinds.count('prefill')} prefill / {kinds.count('decode')} decode forwards; prefills: "
          f"{[t[2] for t in sh.trace if t[1] == 'prefill']}")
    print(f"      outputs per request={[len(r.output_ids) for r in reqs]}, retraction_count={[r.retraction_count for r in reqs]}, "
          f"cached_tokens={[r.cached_tokens for r in reqs]}")


if __name__ == "__main__":
    scenario_basic("unified")
    scenario_basic("radix")
    scenario_chunked()
    scenario_retract()
    scenario_paged()
    scenario_differential()
    scenario_scheduler_shell()
