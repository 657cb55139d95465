"""Differential testing of kvsim's radix tree against SGLang 0.5.23's own `RadixCache`, operation by operation.

A stream is a list of tree operations (match, insert, lock, unlock, evict) on keys given as token runs
`[k, start, n]`. SGLang's side (`benchmarks/oracles/sglang/tree_oracle.py`, run under the SGLang venv) turns a run
into distinct token ids; kvsim's side reads the same runs as token identities (`sim.engines.sglang.tokens`).
Compared after every operation: matched lengths, lock deltas, tokens evicted and the evicted nodes (in order), the
evictable and protected sizes; at the end the whole tree (every node's path and lock count).

The lifecycle streams are written by driving kvsim's own tree the way SGLang's scheduler drives its cache for one
request (match the prompt without its last token, lock, evict the shortfall, insert the prompt at prefill end and
re-lock on the new node, insert prompt + outputs at finish, unlock): the stream records the operations, and SGLang
must give the same answers to the same operations.
"""

from __future__ import annotations

import json
import random

from sim.engines.sglang.radix_cache import RadixCache
from sim.engines.sglang.tokens import Tokens
from tests.support.oracle_support import StreamSuite
from tests.support.sglang_oracle import SGLANG_VERSION, sglang_oracle

ORACLE = sglang_oracle("tree_oracle.py", "sglang_tree")


def _key(runs) -> list[list[int]]:
    return [list(r) for r in runs]


class _Recorder:
    """Applies operations to a kvsim tree and records them (with kvsim's answers) as a stream."""

    def __init__(self, page_size: int, policy: str) -> None:
        self.cache = RadixCache(page_size=page_size, eviction_policy=policy)
        self.ops: list[dict] = []
        self.nodes: dict[int, object] = {}

    def match(self, runs) -> tuple[int, int]:
        self.ops.append({"op": "match", "key": _key(runs)})
        n, node = self.cache.match_prefix(Tokens(runs))
        self.nodes[len(self.ops) - 1] = node
        return n, len(self.ops) - 1

    def insert(self, runs, *, priority: int = 0, inserted_len: int = 0) -> tuple[int, int]:
        self.ops.append({"op": "insert", "key": _key(runs), "priority": priority, "inserted_len": inserted_len})
        n, node = self.cache.insert(Tokens(runs), priority=priority, inserted_len=inserted_len)
        self.nodes[len(self.ops) - 1] = node
        return n, len(self.ops) - 1

    def lock(self, handle: int) -> None:
        self.ops.append({"op": "lock", "node": handle})
        self.cache.inc_lock_ref(self.nodes[handle])

    def unlock(self, handle: int) -> None:
        self.ops.append({"op": "unlock", "node": handle})
        self.cache.dec_lock_ref(self.nodes[handle])

    def evict(self, num_tokens: int) -> int:
        self.ops.append({"op": "evict", "num_tokens": num_tokens})
        return self.cache.evict(num_tokens)


def _edge_cases() -> dict:
    """Narrated: splits inside runs, a match that ends mid-node, locks that protect, eviction of leaves first."""
    r = _Recorder(1, "lru")
    a = [(1, 0, 2032), (2, 0, 339)]           # prefix 1 + tail 2
    b = [(1, 0, 2032), (3, 0, 100)]           # same prefix, another tail
    c = [(1, 0, 1000), (4, 0, 50)]            # diverges inside the prefix
    d = [(1, 0, 2032), (2, 0, 5), (5, 0, 9)]  # shares 5 tokens of a's tail
    _, ia = r.insert(a)
    r.match(b[:1] + [(3, 0, 99)])              # 2,032: splits a's node at the prefix's end
    _, ib = r.insert(b)
    r.lock(ib)
    r.match(c)                                  # 1,000: splits the prefix node
    r.insert(c)
    r.match(d)                                  # 2,037: runs into a's tail
    r.insert(d)
    r.evict(10)                                 # the oldest unlocked leaf goes first
    r.evict(5000)                               # everything unlocked; b's path stays
    r.unlock(ib)
    r.match(a)
    r.evict(1)
    r.insert(a)
    r.insert(a)                                 # a duplicate insert adds nothing
    return {"page_size": 1, "eviction_policy": "lru", "ops": r.ops}


def _lifecycle(*, seed: int, page_size: int, policy: str, capacity: int, requests: int, prefixes: int,
               prefix_tokens: int, concurrency: int, share_tail_lead: bool = False, priorities: int = 1) -> dict:
    """Requests through the tree as SGLang's scheduler drives it, `concurrency` at a time, in a token pool of
    `capacity` (private KV of running requests + the tree)."""
    rng = random.Random(seed)
    r = _Recorder(page_size, policy)
    P = page_size
    private = 0
    running: list[dict] = []
    next_key = 1000

    def available() -> int:
        return capacity - r.cache.total_size() - private

    def finish(req: dict) -> None:
        nonlocal private
        # prompt + outputs but the last (never fed back) go into the tree; duplicates and a partial page are freed
        r.insert(req["prompt"] + [(req["out_key"], 0, req["out"] - 1)], priority=req["priority"],
                 inserted_len=req["inserted"])
        private -= req["private"]
        r.unlock(req["lock"])

    for i in range(requests):
        p = rng.randrange(prefixes)
        tail = [(next_key, 0, rng.randrange(1, 200))]
        next_key += 1
        if share_tail_lead and rng.random() < 0.3:
            tail = [(999, 0, rng.randrange(1, 8))] + tail  # a few leading tail tokens shared by chance
        prompt = [(p + 1, 0, prefix_tokens)] + tail
        length = sum(n for _, _, n in prompt)
        out = rng.randrange(1, 40)
        prio = rng.randrange(priorities)
        while len(running) >= concurrency:
            finish(running.pop(rng.randrange(len(running))))
        # admission: match the prompt without its last token, lock the match, allocate the rest
        cap = [*prompt[:-1], (prompt[-1][0], 0, prompt[-1][2] - 1)]
        prefix_len, h = r.match(cap)
        r.lock(h)
        need = length - prefix_len + out
        if available() < need:
            r.evict(need - available())
        if available() < need:
            r.unlock(h)  # it does not fit now: dropped from this stream
            continue
        private += need
        # prefill end: insert the prompt, the duplicate part is freed, lock moves to the new node
        inserted, _ = r.insert(prompt, priority=prio, inserted_len=0)
        prompt_aligned = length // P * P
        dup = max(0, inserted - prefix_len)
        private -= dup + (prompt_aligned - inserted)
        _, h2 = r.match(prompt)
        r.lock(h2)
        r.unlock(h)
        running.append({"prompt": prompt, "out_key": next_key, "out": out, "lock": h2,
                        "private": need - dup - (prompt_aligned - inserted), "inserted": prompt_aligned,
                        "priority": prio})
        next_key += 1
    for req in running:
        finish(req)
    return {"page_size": page_size, "eviction_policy": policy, "ops": r.ops}


STREAMS = {
    "edge_cases": _edge_cases,
    "reference_pressure_lru": lambda: _lifecycle(seed=1, page_size=1, policy="lru", capacity=9362, requests=160,
                                                 prefixes=12, prefix_tokens=2032, concurrency=4),
    "reference_pressure_page16": lambda: _lifecycle(seed=2, page_size=16, policy="lru", capacity=9360, requests=160,
                                                    prefixes=7, prefix_tokens=2032, concurrency=4),
    "shared_leads_lfu": lambda: _lifecycle(seed=3, page_size=1, policy="lfu", capacity=4000, requests=200,
                                           prefixes=5, prefix_tokens=500, concurrency=6, share_tail_lead=True),
    "small_fifo_page4": lambda: _lifecycle(seed=4, page_size=4, policy="fifo", capacity=1500, requests=200,
                                           prefixes=6, prefix_tokens=130, concurrency=5, share_tail_lead=True),
    "mru": lambda: _lifecycle(seed=5, page_size=1, policy="mru", capacity=3000, requests=120, prefixes=4,
                              prefix_tokens=400, concurrency=3),
    "slru": lambda: _lifecycle(seed=6, page_size=1, policy="slru", capacity=2500, requests=150, prefixes=6,
                               prefix_tokens=300, concurrency=4, share_tail_lead=True),
    "filo_page16": lambda: _lifecycle(seed=7, page_size=16, policy="filo", capacity=3000, requests=150,
                                      prefixes=5, prefix_tokens=333, concurrency=4, share_tail_lead=True),
    "priority": lambda: _lifecycle(seed=8, page_size=1, policy="priority", capacity=3000, requests=150,
                                   prefixes=6, prefix_tokens=300, concurrency=4, priorities=3),
}


def build_stream(name: str) -> dict:
    return STREAMS[name]()


def _removed_runs(event, page_size: int) -> list[list]:
    """The runs of the node a `removed` event reports, from its pages (a token each for page size 1, else the
    page's runs)."""
    pages = event.block_hashes
    runs = [(key, offset, 1) for key, offset in pages] if page_size == 1 else [run for page in pages for run in page]
    return [list(run) for run in Tokens(runs).runs]


def replay_kvsim(stream: dict) -> dict:
    """kvsim's answers to `stream`, in the oracle's output format (minus `sglang_version`); the evicted nodes are
    read from the tree's `removed` events, one per node in eviction order."""
    P = stream["page_size"]
    cache = RadixCache(page_size=P, eviction_policy=stream["eviction_policy"])
    cache.enable_events()
    nodes, results = {}, []
    for i, op in enumerate(stream["ops"]):
        kind = op["op"]
        if kind == "match":
            n, nodes[i] = cache.match_prefix(Tokens(map(tuple, op["key"])))
            out = {"prefix_len": n}
        elif kind == "insert":
            n, nodes[i] = cache.insert(Tokens(map(tuple, op["key"])), priority=op.get("priority", 0),
                                       inserted_len=op.get("inserted_len", 0))
            out = {"prefix_len": n}
        elif kind == "lock":
            out = {"delta": cache.inc_lock_ref(nodes[op["node"]])}
        elif kind == "unlock":
            out = {"delta": cache.dec_lock_ref(nodes[op["node"]])}
        else:
            cache.take_events()  # the stores of the ops before
            out = {"evicted": cache.evict(op["num_tokens"]),
                   "removed": [_removed_runs(e, P) for e in cache.take_events() if e.kind == "removed"]}
        cache.check_invariants()
        out.update(evictable=cache.evictable_size(), protected=cache.protected_size())
        results.append(out)
    tree = []
    stack = [cache.root_node]
    while stack:
        node = stack.pop()
        for child in node.children.values():
            tree.append([[list(run) for run in cache.path_tokens(child).runs], child.lock_ref])
            stack.append(child)
    tree.sort()
    return {"results": results, "tree": tree}


def differences(expected: dict, actual: dict, *, limit: int = 10) -> list[str]:
    out = []
    for i, (e, a) in enumerate(zip(expected["results"], actual["results"])):
        if e != a:
            out.append(f"op {i}: SGLang {json.dumps(e)[:300]} kvsim {json.dumps(a)[:300]}")
    if len(expected["results"]) != len(actual["results"]):
        out.append(f"{len(expected['results'])} results from SGLang, {len(actual['results'])} from kvsim")
    if expected["tree"] != actual["tree"]:
        out.append(f"final trees differ: SGLang {len(expected['tree'])} nodes, kvsim {len(actual['tree'])}")
    return out[:limit]


SUITE = StreamSuite(ORACLE, SGLANG_VERSION, STREAMS, build_stream, replay_kvsim, differences)
"""What tests/engines/sglang/test_sglang_tree_oracle.py checks, golden and live."""


if __name__ == "__main__":
    # Regenerate: KVSIM_SGLANG_PYTHON=<sglang venv>/bin/python python -m tests.support.sglang_tree_streams
    ORACLE.regenerate(STREAMS, build_stream)
