"""kvsim's LMCache CPU backend against LMCache 0.5.6's own (`benchmarks/oracles/vllm/lmcache_backend_oracle.py`: the
real `LMCacheEngine` and `LocalCPUBackend` with LMCache's `MockGPUConnector`, on CPU): the same operations give the
same hits and the same resident chunks in the same LRU order after every operation.

* Always: against the golden file the oracle wrote (tests/golden/lmcache_backend/random_ops.json).
* Opt-in (`-m lmcache_oracle`, KVSIM_LMCACHE_PYTHON naming the side venv's python): against LMCache live; regenerate
  the golden file with `KVSIM_LMCACHE_PYTHON=... python -m tests.engines.vllm.test_lmcache_oracle`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sim.engines.vllm.offload.lmcache import LmcacheCpuBackend

ROOT = Path(__file__).resolve().parents[3]
ORACLE = ROOT / "benchmarks" / "oracles" / "vllm" / "lmcache_backend_oracle.py"
GOLDEN = ROOT / "tests" / "golden" / "lmcache_backend" / "random_ops.json"
CHUNK, CAPACITY = 32, 6


def random_ops(seed: int = 25, n: int = 80) -> list[dict]:
    """Stores, pinned lookups and unpins of prompts from 4 prefix families (1-4 shared chunks, 0-3 own chunks, a
    partial tail of 0-31 tokens): hits, misses, duplicates, evictions and pinned chunks that block them."""
    rng = random.Random(seed)
    families = [list(range(10_000 * f, 10_000 * f + 4 * CHUNK)) for f in range(4)]
    ops: list[dict] = []
    pinned: list[str] = []
    for i in range(n):
        family = rng.choice(families)
        own = list(range(100_000 + 1000 * i, 100_000 + 1000 * i + rng.randint(0, 3) * CHUNK + rng.randint(0, 31)))
        tokens = family[:rng.randint(1, 4) * CHUNK] + own
        r = rng.random()
        if r < 0.55:
            ops.append({"op": "store", "tokens": tokens})
        elif r < 0.85 or not pinned:
            lookup_id = f"r{i}"
            pinned.append(lookup_id)
            ops.append({"op": "lookup", "tokens": tokens, "lookup_id": lookup_id})
        else:
            ops.append({"op": "unpin", "tokens": [], "lookup_id": pinned.pop(rng.randrange(len(pinned)))})
    return ops


def kvsim_results(ops: list[dict]) -> list[dict]:
    """The same operations on kvsim's backend; a chunk's key is its token prefix, named as the oracle names it."""
    backend = LmcacheCpuBackend(CAPACITY)
    names: dict[tuple, str] = {}
    pins: dict[str, list[tuple]] = {}
    out = []
    for i, op in enumerate(ops):
        tokens = op["tokens"]
        keys = [tuple(tokens[:end]) for end in range(CHUNK, len(tokens) // CHUNK * CHUNK + 1, CHUNK)]
        for key in keys:
            names.setdefault(key, f"{i}:{len(key)}")
        hit = None
        if op["op"] == "store":
            backend.store(keys)
        elif op["op"] == "lookup":
            n = backend.lookup(keys)
            pins[op["lookup_id"]] = keys[:n]
            hit = n * CHUNK
        else:
            backend.unpin(pins.pop(op["lookup_id"]))
        out.append({"hit": hit, "order": [names[k] for k in backend.chunks]})
    return out


def run_oracle(python: str, ops: list[dict]) -> dict:
    res = subprocess.run([python, str(ORACLE), str(CHUNK), str(CAPACITY)], input=json.dumps(ops), text=True,
                         capture_output=True, check=True, timeout=600)
    return json.loads(res.stdout)


def test_kvsim_backend_matches_lmcache_golden():
    golden = json.loads(GOLDEN.read_text())
    ops = random_ops()
    assert golden["ops"] == ops, "the golden file was written for other operations: regenerate it"
    ours = kvsim_results(ops)
    for i, (mine, theirs) in enumerate(zip(ours, golden["results"], strict=True)):
        assert mine == theirs, f"operation {i} {ops[i]['op']}: kvsim {mine} != LMCache {theirs}"
    # the operations exercise what matters: evictions, pinned chunks, hits
    assert sum(1 for r in golden["results"] if r["hit"]) >= 5  # 8 with this seed
    assert max(len(r["order"]) for r in golden["results"]) == CAPACITY


@pytest.mark.lmcache_oracle
def test_kvsim_backend_matches_lmcache_live():
    python = os.environ.get("KVSIM_LMCACHE_PYTHON")
    if not python:
        pytest.skip("KVSIM_LMCACHE_PYTHON not set (the LMCache 0.5.6 side venv's python)")
    ops = random_ops()
    assert run_oracle(python, ops)["results"] == kvsim_results(ops)


if __name__ == "__main__":
    python = os.environ.get("KVSIM_LMCACHE_PYTHON") or sys.exit("set KVSIM_LMCACHE_PYTHON")
    ops = random_ops()
    result = run_oracle(python, ops)
    GOLDEN.write_text(json.dumps({"ops": ops, **result}) + "\n")
    print(f"wrote {GOLDEN}")
