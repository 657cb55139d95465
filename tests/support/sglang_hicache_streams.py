"""Differential testing of kvsim's HiCache tree (`HiRadixCache`) against SGLang 0.5.23's own `UnifiedRadixCache`
with its host tier, operation by operation.

A stream is a list of operations (insert, match, lock, unlock, evict, load, ack) on keys given as token runs; SGLang's
side is `benchmarks/oracles/sglang/hicache_oracle.py` (under the SGLang venv, on CPU with three in-memory patches),
which acknowledges every copy at the first `ack` (CPU events complete at once), as kvsim's side does here. Compared
after every operation: inserted and matched lengths (device and host), lock deltas, device tokens evicted, tokens
loaded back, the evictable / protected device sizes and the free host slots; at the end the whole tree (every node's
path, tiers and lock count).

The streams are written by driving kvsim's own tree the way SGLang's scheduler drives its cache for one request at a
time or a few (match the prompt without its last token, load the host part back, lock, make room, insert the prompt,
re-lock on the new node, insert prompt + outputs at finish, unlock; an ack after every step): the stream records the
operations, and SGLang must give the same answers to the same operations.
"""

from __future__ import annotations

import random

from sim.engines.sglang.hiradix_cache import HiRadixCache
from sim.engines.sglang.tokens import Tokens
from tests.support.oracle_support import StreamSuite
from tests.support.sglang_oracle import SGLANG_VERSION, sglang_oracle
from tests.support.sglang_tree_streams import differences as tree_differences

ORACLE = sglang_oracle("hicache_oracle.py", "sglang_hicache")


def host_capacity(stream: dict) -> int:
    """SGLang's host slots for `--hicache-ratio` (pool_host/base.py:211-229)."""
    P = stream["page_size"]
    return (int(stream["device_tokens"] * stream["host_ratio"]) // P + 1) * P


class _Tree:
    """kvsim's side: the tree, the device pool's size, and the ops' handles."""

    def __init__(self, stream: dict) -> None:
        self.N = stream["device_tokens"]
        self.cache = HiRadixCache(page_size=stream["page_size"], eviction_policy=stream.get("eviction_policy", "lru"),
                                  host_capacity=host_capacity(stream), write_policy=stream["write_policy"])
        self.handles: dict[int, tuple] = {}

    def available(self) -> int:
        return self.N - self.cache.total_size()

    def make_room(self, num_tokens: int) -> bool:
        shortfall = num_tokens - self.available()
        if shortfall > 0:
            self.cache.evict(shortfall)
        return self.available() >= num_tokens

    def apply(self, i: int, op: dict, results: list) -> dict:
        cache, kind = self.cache, op["op"]
        if kind == "insert":
            n, _ = cache.insert(Tokens(map(tuple, op["key"])), inserted_len=op.get("inserted_len", 0))
            return {"prefix_len": n}
        if kind == "match":
            d, dn, h, best = cache.match_prefix_tiers(Tokens(map(tuple, op["key"])))
            self.handles[i] = (dn, best)
            return {"device": d, "host": h}
        if kind == "lock":
            return {"delta": cache.inc_lock_ref(self.handles[op["node"]][0])}
        if kind == "unlock":
            return {"delta": cache.dec_lock_ref(self.handles[op["node"]][0])}
        if kind == "evict":
            return {"evicted": cache.evict(op["num_tokens"])}
        if kind == "load":
            return {"loaded": cache.load_back(self.handles[op["node"]][1], self.make_room)}
        if kind == "ack":
            for copy in cache.take_new_writes() + cache.take_new_loads():
                copy.done_s = 0.0
            cache.check_events(0.0)
            return {}
        raise ValueError(f"op {i}: unknown op {kind!r}")


class _Recorder(_Tree):
    """Applies operations to kvsim's tree and records them (with kvsim's answers) as a stream."""

    def __init__(self, stream: dict) -> None:
        super().__init__(stream)
        self.stream = stream
        self.ops: list[dict] = stream["ops"]
        self.results: list[dict] = []

    def op(self, **op) -> tuple[dict, int]:
        self.ops.append(op)
        i = len(self.ops) - 1
        out = self.apply(i, op, self.results)
        self.results.append(out)
        self.cache.check_invariants()
        return out, i


def _key(runs) -> list[list[int]]:
    return [list(r) for r in runs]


def _narrated(policy: str) -> dict:
    """A prefix written, evicted to the host, matched there and loaded back; a short host tail declined."""
    s = {"page_size": 1, "device_tokens": 64, "host_ratio": 2.0, "write_policy": policy, "ops": []}
    r = _Recorder(s)
    a = [(1, 0, 20)]
    r.op(op="insert", key=_key(a))
    r.op(op="ack")
    r.op(op="evict", num_tokens=20)
    _, m = r.op(op="match", key=_key(a))
    r.op(op="load", node=m)
    r.op(op="ack")
    r.op(op="match", key=_key(a))
    r.op(op="insert", key=_key(a))                    # a second insert: selective backs it up now
    r.op(op="ack")
    b = [(1, 0, 20), (2, 0, 5)]
    r.op(op="insert", key=_key(b))
    r.op(op="ack")
    r.op(op="evict", num_tokens=64)
    _, m = r.op(op="match", key=_key(b))
    r.op(op="load", node=m)                          # 25 host tokens (or 5 behind a device prefix): threshold 10
    r.op(op="ack")
    return s


def _lifecycle(*, seed: int, policy: str, page_size: int = 1, device_tokens: int = 256, host_ratio: float = 2.0,
               requests: int = 60, prefixes: int = 6, prefix_tokens: int = 40, concurrency: int = 2,
               eviction_policy: str = "lru") -> dict:
    """Requests through the tree as SGLang's scheduler drives it, `concurrency` at a time."""
    rng = random.Random(seed)
    s = {"page_size": page_size, "device_tokens": device_tokens, "host_ratio": host_ratio, "write_policy": policy,
         "eviction_policy": eviction_policy, "ops": []}
    r = _Recorder(s)
    P = page_size
    running: list[dict] = []
    next_key = 1000

    def finish(req: dict) -> None:
        key = req["prompt"] + [(req["out_key"], 0, req["out"])]
        n = sum(x for _, _, x in key) // P * P
        if r.available() < n:
            r.op(op="evict", num_tokens=n - r.available())
        if r.available() >= n:
            r.op(op="insert", key=_key(key), inserted_len=req["inserted"])
        r.op(op="unlock", node=req["lock"])
        r.op(op="ack")

    for _ in range(requests):
        p = rng.randrange(prefixes)
        prompt = [(p + 1, 0, prefix_tokens), (next_key, 0, rng.randrange(1, 30))]
        next_key += 1
        length = sum(n for _, _, n in prompt)
        while len(running) >= concurrency:
            finish(running.pop(rng.randrange(len(running))))
        cap = [prompt[0], (prompt[1][0], 0, prompt[1][2] - 1)]
        m, h = r.op(op="match", key=_key(cap))
        if m["host"]:
            r.op(op="load", node=h)
        r.op(op="lock", node=h)
        need = length // P * P
        if r.available() < need:
            r.op(op="evict", num_tokens=need - r.available())
        if r.available() < need:
            r.op(op="unlock", node=h)
            continue
        r.op(op="insert", key=_key(prompt))
        r.op(op="ack")
        _, h2 = r.op(op="match", key=_key(prompt))
        r.op(op="lock", node=h2)
        r.op(op="unlock", node=h)
        running.append({"prompt": prompt, "out_key": next_key, "out": rng.randrange(1, 12), "lock": h2,
                        "inserted": need})
        next_key += 1
    for req in running:
        finish(req)
    return s


STREAMS = {
    "narrated_write_through": lambda: _narrated("write_through"),
    "narrated_selective": lambda: _narrated("write_through_selective"),
    "narrated_write_back": lambda: _narrated("write_back"),
    "lifecycle_write_through": lambda: _lifecycle(seed=1, policy="write_through"),
    "lifecycle_selective": lambda: _lifecycle(seed=2, policy="write_through_selective"),
    "lifecycle_write_back": lambda: _lifecycle(seed=3, policy="write_back"),
    "host_pressure_write_through": lambda: _lifecycle(seed=4, policy="write_through", host_ratio=1.0, prefixes=9),
    "host_pressure_write_back": lambda: _lifecycle(seed=5, policy="write_back", host_ratio=0.7, prefixes=9),
    "page4_write_through": lambda: _lifecycle(seed=6, policy="write_through", page_size=4, host_ratio=1.2, prefixes=8),
}


def build_stream(name: str) -> dict:
    return STREAMS[name]()


def replay_kvsim(stream: dict) -> dict:
    """kvsim's answers to `stream`, in the oracle's output format (minus `sglang_version`)."""
    tree = _Tree(stream)
    cache = tree.cache
    results: list[dict] = []
    for i, op in enumerate(stream["ops"]):
        out = tree.apply(i, op, results)
        cache.check_invariants()
        out.update(evictable=cache.evictable_size(), protected=cache.protected_size(),
                   host_available=cache.host_available())
        results.append(out)
    nodes = sorted([[list(run) for run in path.runs], tiers, lock] for path, tiers, lock in cache.tiers())
    return {"host_capacity": cache.host_capacity, "results": results, "tree": nodes}


def differences(expected: dict, actual: dict, *, limit: int = 10) -> list[str]:
    """The host capacity, then what the plain tree's streams compare (every op's result, the final tree)."""
    out = []
    if expected["host_capacity"] != actual["host_capacity"]:
        out.append(f"host capacity: SGLang {expected['host_capacity']}, kvsim {actual['host_capacity']}")
    out += tree_differences(expected, actual, limit=limit)
    return out[:limit]


SUITE = StreamSuite(ORACLE, SGLANG_VERSION, STREAMS, build_stream, replay_kvsim, differences)
"""What tests/engines/sglang/test_sglang_hicache_oracle.py checks, golden and live."""


if __name__ == "__main__":
    # Regenerate: KVSIM_SGLANG_PYTHON=<sglang venv>/bin/python python -m tests.support.sglang_hicache_streams
    ORACLE.regenerate(STREAMS, build_stream)
