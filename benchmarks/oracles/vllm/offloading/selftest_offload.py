#!/usr/bin/env python3
"""Self-test of offload_oracle.py (in benchmarks/oracles/vllm/) against behaviours written down in
docs/engines/vllm-0.33-offloading-rules.md.

Any Python 3 (no vLLM import here); the oracle runs as a subprocess under $KVSIM_VLLM_PYTHON, else
<repo>/.venv-vllm-oracle/bin/python.

    python3 benchmarks/oracles/vllm/offloading/selftest_offload.py            # run and check
    python3 benchmarks/oracles/vllm/offloading/selftest_offload.py --write DIR # also save streams + outputs

All streams: block_size 16, one worker, one_at_a_time, one 1-layer bf16 KV block = 65,536 B, so a CPU chunk
(one GPU block) is 65,536 B and cpu_bytes = n * 65536 gives exactly n chunks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORACLE = HERE.parent / "offload_oracle.py"
REPO = HERE.parents[3]
CHUNK = 65536


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def base(num_gpu_blocks: int, chunks: int, transfer_steps: int = 1, **kw) -> dict:
    return dict({"block_size": 16, "num_gpu_blocks": num_gpu_blocks, "num_workers": 1,
                 "mode": "one_at_a_time", "seed": 0,
                 "offload": {"cpu_bytes": chunks * CHUNK, "eviction_policy": "lru",
                             "transfer_steps": transfer_steps}}, **kw)


def R(rid: str, toks: list[int], max_tokens: int = 2) -> dict:
    return {"id": rid, "worker": 0, "prompt_token_ids": toks, "max_tokens": max_tokens}


A = seq(1000, 70)   # 4 full blocks + 6 tokens
STREAMS = {
    # (1) rules §0.5 / §2.3, probe S1: A is stored to CPU (4 full chunks), two 150-token floods push it off an
    # 11-usable-block GPU, A again is a CPU hit: load in its admitting step (0 tokens, WAITING_FOR_REMOTE_KVS),
    # prefill of the 6 remaining tokens in the next step, which also gives the first token.
    "cpu_hit_after_gpu_eviction": base(12, 32, requests=[
        R("A", A), R("F0", seq(5000, 150)), R("F1", seq(5200, 150)), R("A2", A)]),
    # (2) rules §0.7 / §3.1: offload_prompt_only: a 40-token prompt (2 full blocks) with 40 generated tokens
    # stores chunks 0 and 1 only, in the prefill step; decode never stores (80 tokens would be 5 blocks).
    "prompt_chunks_only": base(64, 32, requests=[R("D", seq(3000, 40), max_tokens=40)]),
    # (3) rules §0.9 / §4.4: 6-chunk tier. A (3 chunks) then B (3 chunks) fill it; C offers 4 new chunks.
    # Eviction is tail-first within a request, but B's chunks go FIRST: in step 2's build_connector_meta, B's
    # prepare_store (which draws B's provisional request rank) runs before A's on_request_finished (OS
    # 2175-2182, which gives A's keys fresh, higher ranks), and B's own finish is committed only in step 4's
    # build_connector_meta, after C's prepare_store evicted. So: B2, B1, B0, then A's tail A2. Left, LRU
    # first: A1, A0, then C tail-first.
    "lru_eviction_order": base(64, 6, requests=[
        R("A", seq(10000, 53)), R("B", seq(11000, 53)), R("C", seq(12000, 69))]),
    # (4) rules §0.4 / §6.1, probe S2: 64-token prompt repeated while still on GPU: GPU hit capped at 48 (63
    # rounded down), the last block loaded from CPU (16 tokens), admitted one step later with 63 computed.
    "block_aligned_last_block_from_cpu": base(64, 16, requests=[R("B", seq(2000, 64)), R("B2", seq(2000, 64))]),
    # (4b) the same with transfer_steps 3: B's store (created step 0) is handed in step 1 and reported in step 3;
    # B2 (added before step 2) is deferred at steps 2 and 3 (HIT_PENDING), its load is created and handed in
    # step 4, reported in step 6, so it waits in WAITING_FOR_REMOTE_KVS at steps 4-6 and is admitted at step 7.
    "block_aligned_slow_transfers": base(64, 16, transfer_steps=3,
                                         requests=[R("B", seq(2000, 64)), R("B2", seq(2000, 64))]),
}


def run_oracle(py: str, stream: dict) -> dict:
    p = subprocess.run([py, str(ORACLE)], input=json.dumps(stream), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"offload_oracle.py failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout)


def check(name: str, out: dict) -> list[str]:
    errs = []

    def expect(cond, msg):
        if not cond:
            errs.append(f"{name}: {msg}")

    rq = {r["id"]: r for r in out["requests"]}
    steps = out["offload_steps"][0]
    stores = [(row["step"], j["request"], j["chunks"]) for row in steps for j in row["store_jobs"]]
    loads = [(row["step"], j["request"], j["chunks"]) for row in steps for j in row["load_jobs"]]
    evicted = [c for row in steps for e in row["evicted"] for c in e["chunks"]]
    w = out["workers"][0]
    lru = w["cpu_resident_end"]["lru_order"]
    expect(w["jobs_in_flight_end"] == 0 and not w["cpu_not_ready_or_pinned_end"], "jobs left at the end")

    if name == "cpu_hit_after_gpu_eviction":
        a, a2 = rq["A"], rq["A2"]
        expect(stores[0] == (a["admit_step"], "A", [0, 1, 2, 3]), f"A's store job {stores[:1]}")
        expect((a2["gpu_hit_tokens"], a2["cpu_hit_tokens"]) == (0, 64), f"A2 hits {a2}")
        L = a2["load_step"]
        expect(loads == [(L, "A2", [0, 1, 2, 3])], f"loads {loads}")
        expect(a2["waiting_for_remote_kvs_steps"] == [L], f"A2 waits {a2['waiting_for_remote_kvs_steps']}")
        expect(a2["admit_step"] == a2["first_token_step"] == L + 1 and a2["hit_tokens"] == 64,
               f"A2 admission {a2}")
        cs = w["connector_prefix_cache_stats"]
        expect(cs["hits"] == 64 and cs["hits_by_source"] == {"host": 64}, f"connector stats {cs}")
    elif name == "prompt_chunks_only":
        d = rq["D"]
        expect(stores == [(d["admit_step"], "D", [0, 1])], f"stores {stores}")
        expect(lru == [["D", 1], ["D", 0]], f"resident {lru}")
        expect(w["kv_connector_stats"].get("vllm:kv_offload_cpu_allocation_size_sum") == 2,
               f"allocation size {w['kv_connector_stats']}")
    elif name == "lru_eviction_order":
        expect([s[1:] for s in stores] == [("A", [0, 1, 2]), ("B", [0, 1, 2]), ("C", [0, 1, 2, 3])],
               f"stores {stores}")
        expect(evicted == [["B", 2], ["B", 1], ["B", 0], ["A", 2]], f"evicted {evicted}")
        expect(lru == [["A", 1], ["A", 0], ["C", 3], ["C", 2], ["C", 1], ["C", 0]], f"resident {lru}")
    elif name == "block_aligned_last_block_from_cpu":
        b2 = rq["B2"]
        L = b2["load_step"]
        expect((b2["gpu_hit_tokens"], b2["cpu_hit_tokens"]) == (48, 16), f"B2 hits {b2}")
        expect(loads == [(L, "B2", [3])], f"loads {loads}")
        expect(b2["waiting_for_remote_kvs_steps"] == [L] and b2["admit_step"] == L + 1
               and b2["hit_tokens"] == 63 and b2["first_token_step"] == L + 1, f"B2 timeline {b2}")
        expect(not b2["deferred_steps"], f"B2 deferred {b2['deferred_steps']}")
    elif name == "block_aligned_slow_transfers":
        b2 = rq["B2"]
        expect(stores == [(0, "B", [0, 1, 2, 3])], f"stores {stores}")
        st_rows = {row["step"]: row for row in steps}
        expect(st_rows[1]["handed_to_worker"] == [0] and st_rows[3]["completed"] == [0],
               f"store timing {[(r['step'], r['handed_to_worker'], r['completed']) for r in steps]}")
        expect(b2["deferred_steps"] == [2, 3], f"B2 deferred {b2['deferred_steps']}")
        expect(loads == [(4, "B2", [3])] and b2["load_step"] == 4, f"loads {loads}")
        expect(b2["waiting_for_remote_kvs_steps"] == [4, 5, 6] and b2["admit_step"] == 7
               and b2["hit_tokens"] == 63, f"B2 timeline {b2}")
    return errs


def main() -> int:
    py = os.environ.get("KVSIM_VLLM_PYTHON")
    if not py and (REPO / ".venv-vllm-oracle/bin/python").exists():
        py = str(REPO / ".venv-vllm-oracle/bin/python")
    if not py:
        sys.exit("no oracle venv: set KVSIM_VLLM_PYTHON")
    write = None
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write = Path(sys.argv[2])
        write.mkdir(parents=True, exist_ok=True)
    errs = []
    for name, stream in STREAMS.items():
        out = run_oracle(py, stream)
        if write:
            (write / f"{name}.in.json").write_text(json.dumps(stream))
            (write / f"{name}.out.json").write_text(json.dumps(out, indent=1))
        errs += check(name, out)
        print(f"{name}: vllm {out['vllm_version']}, {out['num_steps']} steps")
        for r in out["requests"]:
            print("  ", r)
        for row in out["offload_steps"][0]:
            print("   step", row)
        print("   cpu resident (LRU first):", out["workers"][0]["cpu_resident_end"])
    for e in errs:
        print("FAIL", e)
    print("selftest_offload:", "FAILED" if errs else "ok")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
