"""LMCache 0.5.6's own CPU backend as an oracle for kvsim's `LmcacheCpuBackend` (sim/engines/vllm/offload/lmcache.py).

Runs the real `LMCacheEngine` (store, lookup with pins, lookup_unpin) over its `LocalCPUBackend` with LMCache's own
`MockGPUConnector` (moves no data: the cache logic runs, the copies do not), on CPU torch. Reads a JSON list of
operations on stdin and prints, after each, the hit (lookups) and the resident chunks least recent first, each chunk
named "I:END": the first operation I whose tokens had its prefix, and the prefix's length END (chunk keys are chained
prefix hashes, so a prefix names its chunk).

    [{"op": "store" | "lookup" | "unpin", "tokens": [int, ...], "lookup_id": "r1"}, ...]

Run with the side venv's python (benchmarks/oracles/vllm/README.md, "LMCache 0.5.6"):
    .venv-lmcache/bin/python benchmarks/oracles/vllm/lmcache_backend_oracle.py < ops.json > result.json
Options (argv): CHUNK_TOKENS CAPACITY_CHUNKS (default 32 4).
"""

import json
import logging
import os
import sys

import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector
from lmcache.v1.metadata import LMCacheMetadata


def main() -> None:
    logging.disable(logging.WARNING)
    chunk, capacity = (int(a) for a in sys.argv[1:3]) if len(sys.argv) >= 3 else (32, 4)
    shape = (1, 2, chunk, 1, 32)  # layers, K/V, tokens, heads, head size: a chunk is 4 * chunk * 32 bytes in fp16
    chunk_bytes = 2 * chunk * 32 * 2
    config = LMCacheEngineConfig.from_defaults(chunk_size=chunk, local_cpu=True, save_unfull_chunk=False,
                                               max_local_cpu_size=capacity * chunk_bytes / 2**30)
    metadata = LMCacheMetadata(model_name="oracle", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                               kv_dtype=torch.float16, kv_shape=shape, chunk_size=chunk)
    engine = LMCacheEngineBuilder.get_or_create("oracle", config, metadata, MockGPUConnector(shape), None, None)
    engine.post_init()
    backend = engine.storage_manager.storage_backends["LocalCPUBackend"]
    names = {}
    out = []
    for i, op in enumerate(json.load(sys.stdin)):
        tokens = op["tokens"]
        for _start, end, key in engine.token_database.process_tokens(tokens=tokens):
            names.setdefault(key, f"{i}:{end}")
        hit = None
        if op["op"] == "store":
            engine.store(tokens)
        elif op["op"] == "lookup":
            hit = engine.lookup(tokens, lookup_id=op["lookup_id"], pin=True)
        else:
            engine.lookup_unpin(op["lookup_id"])
        out.append({"hit": hit, "order": [names[k] for k in backend.hot_cache]})
    json.dump({"lmcache": "0.5.6", "chunk_tokens": chunk, "capacity_chunks": capacity, "results": out}, sys.stdout)
    sys.stdout.flush()
    # NOTE: LMCache's engine leaves non-daemon threads (its stats logger, event loop) that keep the process alive.
    os._exit(0)


if __name__ == "__main__":
    main()
