"""Differential testing of kvsim's SGLang engine against SGLang 0.5.23's own scheduler, batch by batch.

SGLang's side (`benchmarks/oracles/sglang/engine_oracle.py`, under the SGLang venv) runs SGLang's real
`get_next_batch_to_run` (admission through `SchedulePolicy` and `PrefillAdder`, `update_running_batch` with
`check_decode_mem` / `retract_decode`), its batch-result processing (checkpoint and release into the tree), its
allocator, request pool and default tree cache, in a line-for-line mirror of `event_loop_overlap` /
`event_loop_normal` with a fake model. kvsim's side drives `sim.engines.sglang.scheduler.Scheduler` with a device
that runs one batch per tick. Both serve the same closed loop: the first `concurrency` requests at the start, then
one new request per finished one, received at the top of the next loop iteration; a request that names another
(`after`: a session's next turn, see `sglang_session_streams`) is received when that one finishes, in its place.

Compared, for every batch in scheduling order: its kind, its requests with (prefix_len, extend_len), the requests
retracted to form it, free KV slots, evictable and protected tree tokens, `new_token_ratio` and the waiting queue's
length right after it was formed; per request its `cached_tokens`, the batches that admitted, first-answered and
finished it, its retractions and outputs; at the end the whole tree (every node's path and lock count).
"""

from __future__ import annotations

import json
import random

from sim.engines.sglang.hiradix_cache import HiRadixCache
from sim.engines.sglang.radix_cache import RadixCache
from sim.engines.sglang.request_state import SglangRequest
from sim.engines.sglang.scheduler import Scheduler, SchedulerLimits
from sim.engines.sglang.tokens import Tokens
from sim.workloads.request import Request
from tests.support.oracle_support import StreamSuite
from tests.support.sglang_oracle import SGLANG_VERSION, sglang_oracle
from tests.support.sglang_session_streams import OUT_KEY_BASE, SessionShape, session_requests

ORACLE = sglang_oracle("engine_oracle.py", "sglang_engine", answer_keys=("batches", "requests", "tree", "final"))
EOS_RUN = [0, 999_999, 1]
"""... or the EOS token, id 999999, at the request's `eos_after` position."""

DEFAULTS = {"page_size": 1, "max_total_tokens": 9362, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
            "max_running_requests": 256, "context_length": 40960, "schedule_policy": "fcfs",
            "radix_eviction_policy": "lru", "disable_overlap_schedule": False, "concurrency": 8}


# ---------------------------------------------------------------------------------------------- streams
def _shared_prefix(*, seed: int, requests: int, prefixes: int, prefix_tokens: int | tuple[int, int],
                   tail_tokens: tuple[int, int], max_new: tuple[int, int], eos: float = 0.0,
                   shared_lead: float = 0.0, ignore_eos: bool = True) -> list[dict]:
    """Prompts of a shared prefix (run key p + 1) and a unique tail (run key 100 + i); `shared_lead` of them start
    their tail with a few tokens another request's tail also starts with; `eos` of them stop on EOS early (so do
    not ignore it); without `ignore_eos` none does, and admission reserves their outputs at new_token_ratio."""
    rng = random.Random(seed)
    lengths = [prefix_tokens if isinstance(prefix_tokens, int) else rng.randint(*prefix_tokens)
               for _ in range(prefixes)]
    out = []
    for i in range(requests):
        p = rng.randrange(prefixes)
        prompt = [[p + 1, 0, lengths[p]]]
        if shared_lead and rng.random() < shared_lead:
            prompt.append([99, 0, rng.randint(1, 6)])
        prompt.append([100 + i, 0, rng.randint(*tail_tokens)])
        m = rng.randint(*max_new)
        req = {"id": f"r{i}", "prompt": prompt, "max_new_tokens": m, "ignore_eos": ignore_eos, "eos_after": None}
        if eos and rng.random() < eos:
            req.update(ignore_eos=False, eos_after=rng.randrange(m))
        out.append(req)
    return out


STREAMS: dict[str, dict] = {
    "same_prefix_overlap": {"concurrency": 4, "requests": lambda: _shared_prefix(
        seed=1, requests=12, prefixes=1, prefix_tokens=2032, tail_tokens=(339, 339), max_new=(64, 64))},
    "same_prefix_normal": {"concurrency": 4, "disable_overlap_schedule": True, "requests": lambda: _shared_prefix(
        seed=1, requests=12, prefixes=1, prefix_tokens=2032, tail_tokens=(339, 339), max_new=(64, 64))},
    "one_pass_apart_overlap": {"concurrency": 4, "chunked_prefill_size": None, "max_prefill_tokens": 2400,
                               "requests": lambda: _shared_prefix(seed=2, requests=8, prefixes=1, prefix_tokens=2032,
                                                                  tail_tokens=(339, 339), max_new=(16, 16))},
    "one_pass_apart_normal": {"concurrency": 4, "chunked_prefill_size": None, "max_prefill_tokens": 2400,
                              "disable_overlap_schedule": True,
                              "requests": lambda: _shared_prefix(seed=2, requests=8, prefixes=1, prefix_tokens=2032,
                                                                 tail_tokens=(339, 339), max_new=(16, 16))},
    "reference_n7_c8": {"concurrency": 8, "max_total_tokens": 9362, "chunked_prefill_size": 2048,
                        "requests": lambda: _shared_prefix(seed=7, requests=120, prefixes=7, prefix_tokens=2032,
                                                           tail_tokens=(339, 339), max_new=(64, 64))},
    "pressure_retract": {"concurrency": 30, "max_total_tokens": 4000, "requests": lambda: _shared_prefix(
        seed=3, requests=80, prefixes=5, prefix_tokens=(50, 200), tail_tokens=(10, 150), max_new=(100, 600),
        shared_lead=0.3, ignore_eos=False)},
    "pressure_retract_page16": {"concurrency": 20, "max_total_tokens": 3200, "page_size": 16,
                                "disable_overlap_schedule": True, "requests": lambda: _shared_prefix(
                                    seed=12, requests=80, prefixes=4, prefix_tokens=(50, 200),
                                    tail_tokens=(10, 150), max_new=(200, 500), eos=0.3, ignore_eos=False)},
    "chunked": {"concurrency": 6, "chunked_prefill_size": 256, "max_total_tokens": 6000,
                "requests": lambda: _shared_prefix(seed=4, requests=40, prefixes=3, prefix_tokens=(600, 900),
                                                   tail_tokens=(50, 400), max_new=(5, 40))},
    "page16": {"concurrency": 8, "page_size": 16, "max_total_tokens": 4000, "requests": lambda: _shared_prefix(
        seed=5, requests=60, prefixes=4, prefix_tokens=(200, 400), tail_tokens=(1, 200), max_new=(1, 60),
        shared_lead=0.3)},
    "lpm": {"concurrency": 20, "schedule_policy": "lpm", "max_total_tokens": 5000,
            "requests": lambda: _shared_prefix(seed=6, requests=80, prefixes=6, prefix_tokens=(100, 600),
                                               tail_tokens=(10, 200), max_new=(5, 50), shared_lead=0.3)},
    "lpm_fcfs_fallback": {"concurrency": 150, "schedule_policy": "lpm", "max_total_tokens": 20000,
                          "requests": lambda: _shared_prefix(seed=8, requests=200, prefixes=8,
                                                             prefix_tokens=(50, 300), tail_tokens=(5, 100),
                                                             max_new=(2, 30))},
    "dfs_weight": {"concurrency": 30, "schedule_policy": "dfs-weight", "max_total_tokens": 6000,
                   "requests": lambda: _shared_prefix(seed=9, requests=90, prefixes=5, prefix_tokens=(100, 500),
                                                      tail_tokens=(10, 200), max_new=(5, 40))},
    "eos_overlap": {"concurrency": 8, "max_total_tokens": 5000, "requests": lambda: _shared_prefix(
        seed=10, requests=60, prefixes=4, prefix_tokens=(100, 400), tail_tokens=(10, 150), max_new=(10, 80),
        eos=0.6)},
    "eos_normal_lfu": {"concurrency": 8, "max_total_tokens": 4000, "disable_overlap_schedule": True,
                       "radix_eviction_policy": "lfu", "requests": lambda: _shared_prefix(
                           seed=11, requests=60, prefixes=4, prefix_tokens=(100, 400), tail_tokens=(10, 150),
                           max_new=(10, 80), eos=0.6)},
}


SESSIONS: dict[str, SessionShape] = {
    # 9 chat sessions of 2-4 turns back to back, 2 system prompts, outputs resent by the next turn
    "chat": SessionShape(seed=21, sessions=9, turns=(2, 4), groups=2, system_tokens=(300, 700),
                         message_tokens=(20, 250), output_tokens=(8, 60)),
    # 8 sessions with 1-2 unrelated requests of 500-1300 tokens between turns (a tool call's gap)
    "gaps": SessionShape(seed=22, sessions=8, turns=(2, 4), groups=2, system_tokens=(200, 500),
                         message_tokens=(20, 200), output_tokens=(10, 60), gap_requests=(1, 2),
                         gap_tokens=(500, 1300), gap_output_tokens=(4, 20)),
    # 30 sessions of 2-3 turns with long outputs that do not ignore EOS (admission reserves them at
    # new_token_ratio, so decode can run out of KV and retract a turn)
    "long_outputs": SessionShape(seed=24, sessions=30, turns=(2, 3), groups=3, system_tokens=(50, 200),
                                 message_tokens=(10, 100), output_tokens=(100, 400), ignore_eos=False),
}
"""The session streams' shapes (see `sglang_session_streams`)."""
SESSION_STREAMS: dict[str, tuple[str, dict]] = {
    # 4 clients; the pool holds every session's context: each later turn hits all of it
    "sessions_overlap": ("chat", {"concurrency": 4, "max_total_tokens": 20000}),
    "sessions_normal_chunked": ("chat", {"concurrency": 4, "max_total_tokens": 20000, "chunked_prefill_size": 512,
                                         "disable_overlap_schedule": True}),
    # 3 clients in a 3,200-token pool: while a session waits out its gap, its context is evicted in part or whole
    "sessions_gaps_page16": ("gaps", {"concurrency": 3, "page_size": 16, "max_total_tokens": 3200,
                                      "disable_overlap_schedule": True}),
    "sessions_gaps_page16_overlap": ("gaps", {"concurrency": 3, "page_size": 16, "max_total_tokens": 3200}),
    # 20 clients in a 6,000-token pool: later turns are retracted and re-prefilled with their own outputs
    "sessions_retract_normal": ("long_outputs", {"concurrency": 20, "max_total_tokens": 6000,
                                                 "disable_overlap_schedule": True}),
    "sessions_retract_page16_overlap": ("long_outputs", {"concurrency": 20, "page_size": 16,
                                                         "max_total_tokens": 6000}),
}
"""Session streams: (shape, configuration)."""


def _sessions(shape: str, page_size: int):
    return lambda: [js for js, _ in session_requests(SESSIONS[shape], page_size)]


STREAMS.update({name: {**config, "requests": _sessions(shape, config.get("page_size", 1))}
                for name, (shape, config) in SESSION_STREAMS.items()})


def session_stream_requests(name: str) -> list[Request]:
    """kvsim's requests of the session stream `name` (what `TokenSequence` built), in list order."""
    shape, config = SESSION_STREAMS[name]
    return [req for _, req in session_requests(SESSIONS[shape], config.get("page_size", 1))]


def build_stream(name: str) -> dict:
    spec = {k: v for k, v in STREAMS[name].items() if k != "requests"}
    return {**DEFAULTS, **spec, "requests": STREAMS[name]["requests"]()}


# ---------------------------------------------------------------------------------------------- kvsim side
def _runs_out(runs, index_of_out, eos_at) -> list[list[int]]:
    """kvsim's runs as the oracle writes them: output tokens of request i (key `("out", id)`, or `OUT_KEY_BASE + i`
    when a later prompt resends them) as key 900000 + i, its EOS as `EOS_RUN` (SGLang's EOS is one token id)."""
    out: list[list[int]] = []

    def add(k, start, n) -> None:
        if out and out[-1][0] == k and out[-1][1] + out[-1][2] == start and k != EOS_RUN[0]:
            out[-1][2] += n
        else:
            out.append([k, start, n])

    for key, start, n in runs:
        if isinstance(key, tuple) and key[0] == "out":
            i = index_of_out[key[1]]
        elif isinstance(key, int) and key >= OUT_KEY_BASE:
            i = key - OUT_KEY_BASE
        else:
            add(key, start, n)
            continue
        k, eos = OUT_KEY_BASE + i, eos_at.get(i)
        if eos is not None and start <= eos < start + n:
            add(k, start, eos - start)
            add(*EOS_RUN)
            if start + n > eos + 1:
                add(k, eos + 1, start + n - eos - 1)
        else:
            add(k, start, n)
    return [r for r in out if r[2] > 0]


def replay_kvsim(stream: dict) -> dict:
    """kvsim's answer to `stream`, in the oracle's output format (minus `sglang_version`). With `hicache` the tree
    has SGLang's host tier and every copy completes at once, as SGLang's CPU events report (acknowledged at the
    next scheduling pass)."""
    hicache = stream.get("hicache")
    n = stream["max_total_tokens"]
    if hicache is None:
        tree = RadixCache(page_size=stream["page_size"], eviction_policy=stream["radix_eviction_policy"])
    else:
        P = stream["page_size"]
        tree = HiRadixCache(page_size=P, eviction_policy=stream["radix_eviction_policy"],
                            host_capacity=(int(n // P * P * hicache.get("host_ratio", 2.0)) // P + 1) * P,
                            write_policy=hicache.get("write_policy", "write_through"))
    limits = SchedulerLimits(
        max_total_tokens=n, max_running_requests=max(1, min(stream["max_running_requests"], n // 2)),
        chunked_prefill_size=stream["chunked_prefill_size"], max_prefill_tokens=stream["max_prefill_tokens"],
        overlap=not stream["disable_overlap_schedule"],
    )
    sched = Scheduler(limits, tree, schedule_policy=stream["schedule_policy"])
    reqs = stream["requests"]
    # outputs a later prompt resends carry the identity that prompt gives them (as a session's TokenSequence does)
    resent = {k - OUT_KEY_BASE for r in reqs for k, _, _ in r["prompt"] if k >= OUT_KEY_BASE}
    followers: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        if r.get("after") is not None:
            followers.setdefault(r["after"], []).append(i)
    independent = iter([i for i, r in enumerate(reqs) if r.get("after") is None])
    states: list[SglangRequest] = []
    index = {}
    batches: list[dict] = []
    records = [{"id": r["id"], "cached_tokens": None, "admit_batch": None, "first_token_batch": None,
                "finish_batch": None, "num_retractions": 0, "output_tokens": 0} for r in reqs]

    def copies_done(now_s: float, step=None) -> None:
        if hicache is not None:
            for copy in tree.take_new_writes() + tree.take_new_loads() + (step.host_loads if step else []):
                copy.done_s = now_s

    def on_launch(step) -> None:
        copies_done(now[0], step)
        b = len(batches)
        entry = {"mode": step.mode, "retracted": [s.request.request_id for s in step.preempted]}
        if step.mode == "extend":
            entry["reqs"] = [[s.request.request_id, s.prefix_len, s.extend_len] for s in step.reqs]
            for s in step.admitted:
                rec = records[index[s.request.request_id]]
                if rec["admit_batch"] is None:
                    rec["admit_batch"] = b
        else:
            entry["reqs"] = [s.request.request_id for s in step.reqs]
        entry.update(available=sched.pool.available_size(), evictable=tree.evictable_size(),
                     protected=tree.protected_size(), new_token_ratio=round(sched.ratio.current, 9),
                     waiting=len(sched.waiting))
        step_index[id(step)] = b
        batches.append(entry)

    step_index: dict[int, int] = {}
    sched.on_launch = on_launch

    def submit(i: int) -> None:
        r = reqs[i]
        length = sum(k[2] for k in r["prompt"])
        request = Request(request_id=r["id"], prompt_tokens=length, output_tokens=r["max_new_tokens"],
                          block_hashes=(), output_key=OUT_KEY_BASE + i if i in resent else None)
        state = SglangRequest(request, 0, 0.0, origin=Tokens(tuple(run) for run in r["prompt"]),
                              max_new_tokens=r["max_new_tokens"], ignore_eos=r["ignore_eos"],
                              eos_at=r.get("eos_after"))
        index[r["id"]] = i
        states.append(state)
        sched.add_request(state)

    def submit_next() -> None:
        """The closed loop's next request (one that follows no other), if any."""
        i = next(independent, None)
        if i is not None:
            submit(i)

    for _ in range(stream["concurrency"]):
        submit_next()
    tick = 0
    now = [0.0]
    while sched.has_work:
        now[0] = float(tick)
        step = sched.schedule(float(tick))
        copies_done(float(tick))
        if step is None:
            if sched.has_work:
                raise RuntimeError(f"kvsim stalled at tick {tick}")
            break
        tick += 1
        outcome = sched.update_from_output(step, float(tick))
        copies_done(float(tick))
        b = step_index[id(step)]
        for s in outcome.first_token:
            records[index[s.request.request_id]]["first_token_batch"] = b
        for s in outcome.finished:
            records[index[s.request.request_id]]["finish_batch"] = b
            for i in followers.get(s.request.request_id) or ():
                submit(i)
            if s.request.request_id not in followers:
                submit_next()
    if len(states) != len(reqs):
        raise RuntimeError(f"kvsim received {len(states)} of {len(reqs)} requests")
    if hicache is not None:
        copies_done(float(tick))
        tree.check_events(float(tick))  # as the oracle's final state: every copy acknowledged
    out_index = {rid: i for rid, i in index.items()}
    eos_at = {i: r["eos_after"] for i, r in enumerate(reqs) if not r["ignore_eos"] and r.get("eos_after") is not None}
    for s in states:
        rec = records[index[s.request.request_id]]
        rec.update(cached_tokens=s.num_cached_tokens, num_retractions=s.num_preemptions,
                   output_tokens=s.num_output_tokens)
        if hicache is not None:
            rec["cached_tokens_host"] = s.num_cpu_hit_tokens
    tree_nodes = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        for child in node.children.values():
            tree_nodes.append([_runs_out(tree.path_tokens(child).runs, out_index, eos_at), child.lock_ref])
            stack.append(child)
    tree_nodes.sort()
    return {"batches": batches, "requests": records, "tree": tree_nodes,
            "final": {"available": sched.pool.available_size(), "evictable": tree.evictable_size(),
                      "protected": tree.protected_size()}}


# ---------------------------------------------------------------------------------------------- SGLang side
BATCH_KEYS = ("mode", "reqs", "retracted", "available", "evictable", "protected", "new_token_ratio", "waiting")
REQUEST_KEYS = ("cached_tokens", "admit_batch", "first_token_batch", "finish_batch", "num_retractions",
                "output_tokens", "cached_tokens_host")


def differences(expected: dict, actual: dict, *, limit: int = 12) -> list[str]:
    """Human-readable differences between SGLang's answer and kvsim's, the first diverging batch first."""
    out = []
    for i, (e, a) in enumerate(zip(expected["batches"], actual["batches"])):
        for key in BATCH_KEYS:
            ev, av = e.get(key), a.get(key)
            if key == "new_token_ratio" and ev is not None and av is not None and abs(ev - av) < 1e-6:
                continue
            if ev != av:
                out.append(f"batch {i} {key}: SGLang {json.dumps(ev)[:200]} kvsim {json.dumps(av)[:200]}")
        if out:
            break
    if len(expected["batches"]) != len(actual["batches"]):
        out.append(f"{len(expected['batches'])} batches from SGLang, {len(actual['batches'])} from kvsim")
    for e, a in zip(expected["requests"], actual["requests"]):
        for key in REQUEST_KEYS:
            if e.get(key) != a.get(key):
                out.append(f"request {e['id']}: {key} SGLang={e.get(key)} kvsim={a.get(key)}")
    if expected["tree"] != actual["tree"]:
        out.append(f"final trees differ: SGLang {len(expected['tree'])} nodes, kvsim {len(actual['tree'])}")
    if expected.get("final") != actual.get("final"):
        out.append(f"final pool: SGLang {expected.get('final')} kvsim {actual.get('final')}")
    return out[:limit]


SUITE = StreamSuite(ORACLE, SGLANG_VERSION, STREAMS, build_stream, replay_kvsim, differences)
"""What tests/engines/sglang/test_sglang_engine_oracle.py checks, golden and live."""


if __name__ == "__main__":
    # Regenerate: KVSIM_SGLANG_PYTHON=<sglang venv>/bin/python python -m tests.support.sglang_engine_streams [NAME ..]
    import sys

    unknown = sorted(set(sys.argv[1:]) - set(STREAMS))
    if unknown:
        raise SystemExit(f"unknown stream(s) {unknown}; streams: {sorted(STREAMS)}")
    ORACLE.regenerate(sys.argv[1:] or STREAMS, build_stream)
