"""Differential testing against vLLM's own scheduler: the streams, kvsim's lockstep replay, and the comparison.

The streams are generated here, deterministically, as token ids; vLLM's side runs them through
`benchmarks/oracles/vllm/oracle.py` (its own Scheduler/KVCacheManager/BlockPool on CPU, no weights). kvsim's side
hashes the same token ids into chained block hashes and replays them through `sim.engines.vllm.scheduler.Scheduler` with the
oracle's loop: lockstep engine steps, a closed-loop client over the whole cluster, the next request added after
the step in which one finished. Compared: per request the hit tokens at first admission, the admission, first-token
and finish steps and the preemptions; per worker vLLM's prefix-cache counters and the final free queue, block for block,
and the KV cache events, exactly and in order.

Events: each worker's `KVCacheManager` is subscribed to (`subscribe`) and published once per step right after
`update_from_output` (`publish(step)`, as `VllmEngine.update_from_output` does and as vLLM's scheduler takes its events
there); both sides turn them into the oracle's rows `[step, kind, num_block_hashes, parent_is_none, request_id,
first_block]` (benchmarks/oracles/vllm/README.md): a `stored` row names the request and the block index its pass starts
at, a `removed` row names the hash by the request and block under which it was first stored on that worker. Recording
changes nothing else kvsim computes (the replay uses no decode stretches, which subscribing would switch off).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sim.engines.interface import CacheEvent
from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.request_state import RequestState
from sim.engines.vllm.scheduler import Scheduler, SchedulerLimits
from sim.workloads.request import Request
from tests.support.oracle_support import Oracle
from tests.support.paths import GOLDEN, REPO

ORACLE = Oracle(script=REPO / "benchmarks" / "oracles" / "vllm" / "oracle.py", env_var="KVSIM_VLLM_PYTHON",
                golden_dir=GOLDEN / "vllm_oracle", version_key="vllm_version",
                setup="benchmarks/oracles/vllm/README.md", timeout_s=900)
ORACLE_VLLM_VERSION = "0.33.0"
VOCAB = 151936


def token_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def chained_block_hashes(tokens: list[int], block_size: int) -> tuple[int, ...]:
    """vLLM-style chained hashes of the full blocks of `tokens` (values differ from vLLM's; identity is the same)."""
    out, parent = [], 0
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) * block_size])))
        out.append(parent)
    return tuple(out)


# ---------------------------------------------------------------------------------------------- streams
def _shared_prefix_stream(*, name_seed: int, workers: int, prefixes: int, prefix_tokens: int, tail_tokens: int,
                          output_tokens: int, requests: int, warmups: bool) -> list[dict]:
    rng = random.Random(name_seed)
    prefix_tokens_by_id = [token_ids(name_seed * 1000 + p, prefix_tokens) for p in range(prefixes)]
    out = []
    order = ([(p, True) for p in range(prefixes)] if warmups else []) + \
            [(rng.randrange(prefixes), False) for _ in range(requests)]
    for i, (p, _warm) in enumerate(order):
        out.append({
            "id": f"r{i}", "worker": rng.randrange(workers),
            "prompt_token_ids": prefix_tokens_by_id[p] + token_ids(name_seed * 100000 + i, tail_tokens),
            "max_tokens": output_tokens,
        })
    return out


def _edge_cases() -> list[dict]:
    a = token_ids(3000, 2048)
    p = token_ids(3100, 2032)
    reqs = [
        ("a", a, 1), ("a_repeat", a, 1),                       # block-aligned resend: last block recomputed
        ("a_ext2", a + token_ids(3001, 2), 1),                 # extends it: every block hits
        ("p_tail7", p + token_ids(3002, 7), 1), ("p_tail7_again", p + token_ids(3003, 7), 1),
        ("big", p + token_ids(3004, 339), 64),
        ("p_exact", p, 3),                                      # the prefix alone: hit capped at P-1
        ("short", token_ids(3005, 5), 40),                      # shorter than a block, decode fills blocks
        ("short_again", token_ids(3005, 5), 2),
    ]
    return [{"id": rid, "worker": 0, "prompt_token_ids": toks, "max_tokens": m} for rid, toks, m in reqs]


def _pressure_stream() -> list[dict]:
    """A tiny pool, many requests in flight, shared prefixes of several lengths: preemption and eviction."""
    rng = random.Random(77)
    prefixes = [token_ids(7700 + k, n) for k, n in enumerate((64, 96, 130))]
    out = []
    for i in range(60):
        pre = prefixes[rng.randrange(len(prefixes))]
        out.append({"id": f"q{i}", "worker": rng.randrange(2),
                    "prompt_token_ids": pre + token_ids(7800 + i, rng.randrange(1, 80)),
                    "max_tokens": rng.randrange(1, 60)})
    return out


STREAMS: dict[str, dict] = {
    "edge_cases": {"block_size": 16, "num_gpu_blocks": 585, "max_num_batched_tokens": 8192, "max_num_seqs": 256,
                   "num_workers": 1, "mode": "one_at_a_time", "concurrency": 1, "seed": 0},
    "reference_n7_c8": {"block_size": 16, "num_gpu_blocks": 585, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
                        "num_workers": 6, "mode": "closed_loop", "concurrency": 8, "seed": 1},
    "reference_n12_c16_3w": {"block_size": 16, "num_gpu_blocks": 585, "max_num_batched_tokens": 2048,
                             "max_num_seqs": 256, "num_workers": 3, "mode": "closed_loop", "concurrency": 16,
                             "seed": 2},
    "pressure": {"block_size": 16, "num_gpu_blocks": 30, "max_num_batched_tokens": 64, "max_num_seqs": 5,
                 "num_workers": 2, "mode": "closed_loop", "concurrency": 8, "seed": 3},
}


def build_stream(name: str) -> dict:
    spec = dict(STREAMS[name])
    if name == "edge_cases":
        spec["requests"] = _edge_cases()
    elif name == "reference_n7_c8":
        spec["requests"] = _shared_prefix_stream(name_seed=7, workers=6, prefixes=7, prefix_tokens=2032,
                                                 tail_tokens=339, output_tokens=64, requests=200, warmups=True)
    elif name == "reference_n12_c16_3w":
        spec["requests"] = _shared_prefix_stream(name_seed=12, workers=3, prefixes=12, prefix_tokens=2032,
                                                 tail_tokens=339, output_tokens=64, requests=240, warmups=True)
    else:
        spec["requests"] = _pressure_stream()
    return spec


# ---------------------------------------------------------------------------------------------- kvsim side
@dataclass
class _Tracked:
    state: RequestState
    record: dict


class _EventRecorder:
    """One worker's published KV events as the oracle's rows: [step, kind, num_block_hashes, parent_is_none,
    request_id, first_block] (see benchmarks/oracles/vllm/README.md).

    A `CacheEvent` names no request, so the cache manager's two entry points that cache blocks (`allocate_slots`,
    `cache_full_blocks`, both called with the request's state) are wrapped, on this instance only, to note which
    request each `stored` event was recorded for; the wrappers pass arguments and results through untouched. The
    first block is derived from the event itself (its parent hash's position in that request's chain) and the
    event's hashes are checked against the request's.
    """

    def __init__(self, kv: KVCacheManager, request_ids: list[str]) -> None:
        self.rows: list[list] = []
        self._kv = kv
        self._request_ids = request_ids
        self._owner: dict[int, tuple[CacheEvent, RequestState]] = {}
        self._first_stored: dict = {}
        for name in ("allocate_slots", "cache_full_blocks"):
            setattr(kv, name, self._attributing(getattr(kv, name)))
        kv.subscribe(self._listen)

    def _attributing(self, method):
        def call(state, *args, **kwargs):
            n0 = len(self._kv.pool.queued_events())
            result = method(state, *args, **kwargs)
            for ev in self._kv.pool.queued_events()[n0:]:
                if ev.kind == "stored":
                    self._owner.setdefault(id(ev), (ev, state))
            return result
        return call

    def _listen(self, events, now_s: float) -> None:
        step = int(now_s)
        for ev in events:
            if ev.kind == "stored":
                ev_, state = self._owner.pop(id(ev), (None, None))
                if ev_ is not ev:
                    raise AssertionError(f"step {step}: a stored event from outside allocate_slots/cache_full_blocks")
                rid = self._request_ids[state.request.request_id]
                first = 0 if ev.parent_hash is None else self._position(state, ev.parent_hash) + 1
                n = len(ev.block_hashes)
                if (ev.block_size != self._kv.block_size
                        or list(ev.block_hashes) != state.block_hashes(first, first + n)):
                    raise AssertionError(f"step {step}: stored event of {rid} is not blocks {first}..{first + n - 1}")
                for i, h in enumerate(ev.block_hashes):
                    self._first_stored.setdefault(h, (rid, first + i))
                self.rows.append([step, "stored", n, ev.parent_hash is None, rid, first])
            elif ev.kind == "removed":
                if len(ev.block_hashes) != 1:
                    raise AssertionError(f"step {step}: removed event with {len(ev.block_hashes)} hashes")
                rid, index = self._first_stored[ev.block_hashes[0]]
                self.rows.append([step, "removed", 1, None, rid, index])
            else:
                self.rows.append([step, ev.kind, len(ev.block_hashes), None, None, None])

    @staticmethod
    def _position(state: RequestState, block_hash) -> int:
        prompt = state.request.block_hashes
        if isinstance(block_hash, tuple) and block_hash[:1] == ("out",):
            return block_hash[2]
        return prompt.index(block_hash)

    def check_drained(self) -> None:
        if self._kv.pool.queued_events() or self._owner:
            raise AssertionError("KV events recorded but never published")


def replay_kvsim(stream: dict, vllm_version: str = ORACLE_VLLM_VERSION) -> dict:
    """kvsim's answer for `stream`, in the oracle's output format (minus `vllm_version`), KV events included."""
    B = stream["block_size"]
    behaviour = VllmBehaviour.for_version(vllm_version)
    max_model_len = stream.get("max_model_len", 40960)
    limits = SchedulerLimits(stream["max_num_batched_tokens"], stream["max_num_seqs"], max_model_len)
    scheds = [
        Scheduler(limits, KVCacheManager(num_blocks=stream["num_gpu_blocks"], block_size=B,
                                         max_model_len=max_model_len,
                                         unhashed_to_head=behaviour.unhashed_to_head), behaviour)
        for _ in range(stream["num_workers"])
    ]
    reqs = stream["requests"]
    recorders = [_EventRecorder(s.kv, [r["id"] for r in reqs]) for s in scheds]
    concurrency = 1 if stream["mode"] == "one_at_a_time" else stream["concurrency"]
    tracked: dict[int, _Tracked] = {}
    records = []

    def submit(idx: int) -> None:
        r = reqs[idx]
        req = Request(request_id=idx, prompt_tokens=len(r["prompt_token_ids"]), output_tokens=r["max_tokens"],
                      block_hashes=chained_block_hashes(r["prompt_token_ids"], B))
        state = RequestState(req, r["worker"], 0.0, block_size=B)
        rec = {"id": r["id"], "worker": r["worker"], "admit_step": None, "hit_tokens": None,
               "first_token_step": None, "finish_step": None, "num_preemptions": 0}
        tracked[idx] = _Tracked(state, rec)
        records.append(rec)
        scheds[r["worker"]].add_request(state)

    next_idx = 0
    while next_idx < min(concurrency, len(reqs)):
        submit(next_idx)
        next_idx += 1
    step = 0
    while any(s.has_work for s in scheds):
        finished_now = 0
        for s in scheds:
            if not s.has_work:
                continue
            plan = s.schedule(float(step))
            if plan.is_empty and not plan.preempted:
                raise RuntimeError(f"kvsim worker stalled at step {step}")
            for st in plan.admitted:
                rec = tracked[st.request.request_id].record
                if rec["admit_step"] is None:
                    rec["admit_step"], rec["hit_tokens"] = step, st.num_cached_tokens
            outcome = s.update_from_output(plan, float(step))
            s.kv.publish(float(step))  # as VllmEngine.update_from_output: the step's KV events, once
            for st in outcome.first_token:
                tracked[st.request.request_id].record["first_token_step"] = step
            for st in outcome.finished:
                rec = tracked[st.request.request_id].record
                rec["finish_step"], rec["num_preemptions"] = step, st.num_preemptions
                finished_now += 1
        for _ in range(finished_now):
            if next_idx < len(reqs):
                submit(next_idx)
                next_idx += 1
        step += 1
    for rec in recorders:
        rec.check_drained()
    workers = []
    for s in scheds:
        st = s.kv.stats
        workers.append({"requests": st.requests, "queries": st.queries, "hits": st.hits,
                        "preempted_requests": st.preempted_requests, "preempted_queries": st.preempted_queries,
                        "preempted_hits": st.preempted_hits, "num_free_blocks_end": s.kv.num_free_blocks})
    return {"num_steps": step, "requests": records, "workers": workers,
            "free_queue_end": [s.kv.pool.free_queue() for s in scheds],
            "events": [rec.rows for rec in recorders]}


# ---------------------------------------------------------------------------------------------- vLLM side
def differences(expected: dict, actual: dict, *, limit: int = 10) -> list[str]:
    """Human-readable differences between an oracle answer and kvsim's, most telling first."""
    out = []
    for e, a in zip(expected["requests"], actual["requests"]):
        for key in ("hit_tokens", "admit_step", "first_token_step", "finish_step", "num_preemptions"):
            if e[key] != a[key]:
                out.append(f"request {e['id']} (worker {e['worker']}): {key} vLLM={e[key]} kvsim={a[key]}")
    for w, (e, a) in enumerate(zip(expected["workers"], actual["workers"])):
        for key, value in e.items():
            if a.get(key) != value:
                out.append(f"worker {w}: {key} vLLM={value} kvsim={a.get(key)}")
    for w, (e, a) in enumerate(zip(expected["free_queue_end"], actual["free_queue_end"])):
        if e != a:
            first = next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), min(len(e), len(a)))
            out.append(f"worker {w}: free queue differs from position {first}: "
                       f"vLLM {e[first:first + 6]} kvsim {a[first:first + 6]}")
    if "events" not in expected:
        out.append("no events in vLLM's answer (a golden file from before the events: regenerate it)")
    else:
        for w, (e, a) in enumerate(zip(expected["events"], actual["events"])):
            if e != a:
                first = next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), min(len(e), len(a)))
                out.append(f"worker {w}: KV events differ from event {first} (vLLM {len(e)}, kvsim {len(a)} events): "
                           f"vLLM {e[first:first + 3]} kvsim {a[first:first + 3]}")
    if expected.get("num_steps") != actual.get("num_steps"):
        out.append(f"steps: vLLM={expected.get('num_steps')} kvsim={actual.get('num_steps')}")
    return out[:limit]


if __name__ == "__main__":
    # Regenerate the golden answers: KVSIM_VLLM_PYTHON=<oracle venv>/bin/python python -m tests.support.oracle_streams
    ORACLE.regenerate(STREAMS, build_stream)
