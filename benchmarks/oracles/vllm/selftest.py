#!/usr/bin/env python3
"""Self-test of oracle.py against behaviours documented in README.md beside it ("What vLLM does") and in
docs/engines/vllm-rules.md.

Runs with any Python 3 (no vLLM import here); oracle.py is run as a subprocess
under the oracle venv's interpreter: $KVSIM_VLLM_PYTHON, else
<repo>/.venv-vllm-oracle/bin/python.

    python3 benchmarks/oracles/vllm/selftest.py            # run and check
    python3 benchmarks/oracles/vllm/selftest.py --write DIR # also save streams + outputs
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
VOCAB = 151936


def toks(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(VOCAB) for _ in range(n)]


def streams() -> dict[str, dict]:
    prefix = toks(1000, 2032)
    base = {"block_size": 16, "num_gpu_blocks": 585, "max_num_batched_tokens": 8192,
            "max_num_seqs": 256, "num_workers": 2, "seed": 0}
    # 2 workers, 6 requests = shared 2,032-token prefix + distinct 339-token tail.
    closed = dict(base, mode="closed_loop", concurrency=2, requests=[
        {"id": f"r{i}", "worker": w, "prompt_token_ids": prefix + toks(2000 + i, 339),
         "max_tokens": 64}
        for i, w in enumerate([0, 0, 1, 1, 0, 1])])
    a = toks(3000, 2048)
    one = dict(base, mode="one_at_a_time", requests=[
        {"id": "a", "worker": 0, "prompt_token_ids": a, "max_tokens": 1},
        {"id": "a_repeat", "worker": 0, "prompt_token_ids": a, "max_tokens": 1},
        {"id": "a_ext2", "worker": 0, "prompt_token_ids": a + toks(3001, 2), "max_tokens": 1},
        {"id": "p_tail7", "worker": 0, "prompt_token_ids": prefix + toks(3002, 7), "max_tokens": 1},
        {"id": "p_tail7_again", "worker": 0, "prompt_token_ids": prefix + toks(3003, 7), "max_tokens": 1},
        {"id": "big", "worker": 0, "prompt_token_ids": prefix + toks(3004, 339), "max_tokens": 64},
    ])
    return {"closed_loop": closed, "one_at_a_time": one}


def run_oracle(py: str, stream: dict) -> dict:
    p = subprocess.run([py, str(HERE / "oracle.py")], input=json.dumps(stream),
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"oracle.py failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout)


def check(name: str, out: dict) -> list[str]:
    errs = []

    def expect(cond, msg):
        if not cond:
            errs.append(f"{name}: {msg}")

    hits = {r["id"]: r["hit_tokens"] for r in out["requests"]}
    steps = {r["id"]: r["admit_step"] for r in out["requests"]}
    for w in out["workers"]:
        expect(w["num_free_blocks_end"] == 584, f"free blocks at end {w['num_free_blocks_end']} != 584")
    if name == "closed_loop":
        # Same-step hits: r0/r1 admitted together on worker 0, r2/r3 on worker 1.
        expect(steps["r0"] == steps["r1"] == 0, f"r0/r1 admit steps {steps}")
        expect((hits["r0"], hits["r1"]) == (0, 2032), f"same-step hits r0/r1 {hits}")
        expect((hits["r2"], hits["r3"]) == (0, 2032), f"same-step hits r2/r3 {hits}")
        expect(hits["r4"] == hits["r5"] == 2032, f"warm hits r4/r5 {hits}")
        for w in out["workers"]:
            expect((w["requests"], w["queries"], w["hits"]) == (3, 3 * 2371, 2 * 2032),
                   f"worker stats {w}")
    else:
        expect(hits["a_repeat"] == 2032, "repeated 2,048-token prompt should hit 2,032")
        expect(hits["a_ext2"] == 2048, "2,050-token extension should hit 2,048")
        expect(hits["p_tail7_again"] == 2032, "2,032 prefix + 7-token tail should hit 2,032")
        # An untouched worker: fresh pool, 584 free, queue in block-id order 1..584.
        expect(out["free_queue_end"][1] == list(range(1, 585)), "fresh pool queue != 1..584")
        expect(out["workers"][1]["requests"] == 0, "worker 1 should have no requests")
    return errs


def main() -> int:
    py = os.environ.get("KVSIM_VLLM_PYTHON") or str(REPO / ".venv-vllm-oracle" / "bin" / "python")
    write = None
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write = Path(sys.argv[2])
        write.mkdir(parents=True, exist_ok=True)
    errs = []
    for name, stream in streams().items():
        out = run_oracle(py, stream)
        if write:
            (write / f"{name}.in.json").write_text(json.dumps(stream))
            (write / f"{name}.out.json").write_text(json.dumps(out, indent=1))
        errs += check(name, out)
        print(f"{name}: vllm {out['vllm_version']}, {out['num_steps']} steps")
        for r in out["requests"]:
            print("  ", r)
        for i, w in enumerate(out["workers"]):
            print(f"   worker {i}:", w)
    for e in errs:
        print("FAIL", e)
    print("selftest:", "FAILED" if errs else "ok")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
