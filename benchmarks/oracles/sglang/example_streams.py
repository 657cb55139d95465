#!/usr/bin/env python3
"""Example request streams for engine_oracle.py, and a checker that runs the oracle on them.

    python3 benchmarks/oracles/sglang/example_streams.py [--out DIR]      # write the streams (default: see below)
    python3 benchmarks/oracles/sglang/example_streams.py --run [--only NAME ...] [--cross] [--twice]

Streams are written to DIR (default sglang-engine-oracle-examples in the temporary directory, $TMPDIR), never into
the repository. --run also
runs the oracle on every stream (interpreter: $KVSIM_SGLANG_PYTHON, else .venv-sglang/bin/python), prints a short
summary per stream and checks the behaviours docs/engines/sglang-0.5.23-semantics.md documents (exit 1 if a check fails).
--cross reruns every stream with tree_cache "radix" and "unified-python" and requires the same decisions and the
same final tree; --twice reruns it unchanged and requires byte-identical output (determinism).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from token_runs import ids_of

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
ORACLE = os.path.join(HERE, "engine_oracle.py")
DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "sglang-engine-oracle-examples")


# ---------------------------------------------------------------------------------------------------------------
# Stream builders. Token runs: prefixes use k = 1..99, unique tails k = 1000 + request number.
# ---------------------------------------------------------------------------------------------------------------
def req(i, prompt, max_new, **kw):
    return {"id": f"r{i}", "prompt": prompt, "max_new_tokens": max_new, **kw}


def shared_prefix(overlap: bool) -> dict:
    """4 requests: a 2032-token shared prefix + a 339-token unique tail, 64 outputs, concurrency 4."""
    reqs = [req(i, [[1, 0, 2032], [1000 + i, 0, 339]], 64) for i in range(4)]
    return {"concurrency": 4, "disable_overlap_schedule": not overlap, "requests": reqs}


def prefix_groups(rng, n, n_prefixes, prefix_len, total_len, max_new, k0=1) -> list:
    """n requests, each a cut of one of n_prefixes shared prefixes plus a unique tail."""
    plens = [rng.randint(*prefix_len) for _ in range(n_prefixes)]
    out = []
    for i in range(n):
        p = rng.randrange(n_prefixes)
        total = rng.randint(*total_len)
        cut = min(plens[p], rng.randint(total // 3, total))
        runs = [[k0 + p, 0, cut]] if cut else []
        if total - cut > 0:
            runs.append([1000 + i, 0, total - cut])
        out.append(req(i, runs, rng.randint(*max_new)))
    return out


def memory_pressure(ignore_eos: bool = False) -> dict:
    """ignore_eos false (no EOS is ever sampled, so every request still runs to max_new_tokens): running requests
    then reserve only new_token_ratio x their remaining outputs, so decode can run out of KV and retract. With
    ignore_eos true the reservation is 1.0 x remaining and SGLang never needs to retract."""
    rng = random.Random(35)  # retractions are rare at this size: seeds 8, 13, 18, 29, 35 of 0-39 retract (once)
    reqs = prefix_groups(rng, 40, 5, (150, 500), (200, 800), (20, 100))
    for r in reqs:
        r["ignore_eos"] = ignore_eos
    return {"max_total_tokens": 3000, "concurrency": 8, "requests": reqs}


def chunked() -> dict:
    """1000-token prompts (two share a 600-token prefix), chunked_prefill_size 256."""
    reqs = []
    for i in range(6):
        runs = [[1, 0, 600], [1000 + i, 0, 400]] if i % 2 == 0 else [[1000 + i, 0, 1000]]
        reqs.append(req(i, runs, 30))
    return {"chunked_prefill_size": 256, "concurrency": 3, "requests": reqs}


def paged() -> dict:
    rng = random.Random(4)
    reqs = prefix_groups(rng, 40, 4, (100, 400), (150, 600), (10, 80))
    return {"page_size": 16, "max_total_tokens": 4096, "concurrency": 8, "requests": reqs}


def lpm(concurrency: int, policy: str = "lpm") -> dict:
    rng = random.Random(5)
    reqs = prefix_groups(rng, 300, 12, (40, 200), (60, 300), (4, 24))
    return {"schedule_policy": policy, "concurrency": concurrency, "requests": reqs}


def eos() -> dict:
    """ignore_eos false: even requests stop on EOS after eos_after + 1 tokens, odd ones at max_new_tokens."""
    reqs = []
    for i in range(8):
        r = req(i, [[1, 0, 100], [1000 + i, 0, 20 + i]], 16)
        if i % 2 == 0:
            r.update(ignore_eos=False, eos_after=3 + i)
        reqs.append(r)
    return {"concurrency": 4, "requests": reqs}


def big() -> dict:
    """A few hundred requests for timing: 400 requests, 8 prefixes, 300-1500-token prompts, 16-128 outputs."""
    rng = random.Random(7)
    reqs = prefix_groups(rng, 400, 8, (200, 1000), (300, 1500), (16, 128))
    return {"concurrency": 32, "max_total_tokens": 30000, "requests": reqs}


STREAMS = {
    "shared_prefix_overlap": lambda: shared_prefix(True),
    "shared_prefix_normal": lambda: shared_prefix(False),
    "memory_pressure": memory_pressure,
    "memory_pressure_normal": lambda: {**memory_pressure(), "disable_overlap_schedule": True},
    "memory_ignore_eos": lambda: memory_pressure(True),
    "chunked": chunked,
    "paged16": paged,
    "fcfs_c200": lambda: lpm(200, "fcfs"),
    "lpm_c200": lambda: lpm(200),
    "fcfs_c20": lambda: lpm(20, "fcfs"),
    "lpm_c20": lambda: lpm(20),
    "eos_overlap": eos,
    "eos_normal": lambda: {**eos(), "disable_overlap_schedule": True},
    "big400": big,
}


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------
def summary(name, spec, out, secs) -> str:
    b = out["batches"]
    ext = [x for x in b if x["mode"] == "extend"]
    rq = out["requests"]
    hits = [r["cached_tokens"] for r in rq]
    retr = sum(r["num_retractions"] for r in rq)
    ev = sum(x["evicted"] for x in b) + sum(x["evicted"] for x in out["evicted_without_batch"])
    ev_batches = sum(1 for x in b if x["evicted"])
    return (f"{name:24s} {len(rq):4d} reqs  {len(b):5d} batches ({len(ext)} extend, {len(b) - len(ext)} decode)  "
            f"hits {sum(1 for h in hits if h)}/{len(rq)} reqs, {sum(hits)} tok  retractions {retr}  "
            f"evicted {ev} tok in {ev_batches} batches  {secs:.1f} s")


class Checker:
    def __init__(self):
        self.failures = []
        self.keys_checked = 0

    def check(self, name, cond, msg):
        if not cond:
            self.failures.append(f"{name}: {msg}")
            print(f"   FAIL {msg}")
        return cond

    def generic(self, name, spec, out):
        c = self.check
        n_tot = out["config"]["effective_max_total_tokens"]
        P = spec.get("page_size", 1)
        overlap = not spec.get("disable_overlap_schedule", False)
        b = out["batches"]
        fin = out["final"]
        c(name, fin["protected"] == 0, f"final protected {fin['protected']} != 0")
        c(name, fin["available"] + fin["evictable"] == n_tot, f"final available+evictable != {n_tot}: {fin}")
        for x in b:
            if x["available"] + x["evictable"] + x["protected"] > n_tot:
                c(name, False, f"batch accounting exceeds the pool: {x}")
                break
        # every request finished with the documented number of outputs
        by_id = {r["id"]: r for r in spec["requests"]}
        for i, r in enumerate(out["requests"]):
            s = by_id[r["id"]]
            want = r["max_new_tokens"]
            if not s.get("ignore_eos", True) and s.get("eos_after") is not None and s["eos_after"] < want:
                want = s["eos_after"] + 1
            c(name, r["output_tokens"] == want, f"{r['id']}: {r['output_tokens']} outputs, expected {want}")
            c(name, r["admit_batch"] is not None and r["admit_batch"] <= r["first_token_batch"] <= r["finish_batch"],
              f"{r['id']}: batch indices out of order {r}")
            # cached_tokens = prefix_len of the admitting batch (counted once, at the first admission)
            first = next(e for e in b[r["admit_batch"]]["reqs"] if e[0] == r["id"])
            c(name, r["cached_tokens"] == first[1],
              f"{r['id']}: cached_tokens {r['cached_tokens']} != prefix {first[1]}")
            # prefix lengths are page-aligned
            c(name, first[1] % P == 0, f"{r['id']}: prefix {first[1]} not page-aligned")
        # the tree's root-to-leaf keys: input + outputs[:-1] (+1 under overlap for EOS stops), page-floored
        tree_paths = {tuple(ids_of(p)) for p, _ in out["tree"]}
        for i, r in enumerate(out["requests"]):
            s = by_id[r["id"]]
            outs = [(900000 + i) * 1_000_000 + p for p in range(r["output_tokens"])]
            eos_stop = r["finish_reason"] == "FINISH_MATCHED_TOKEN"
            if eos_stop:
                outs[-1] = out["eos_token_id"]
            key = ids_of(s["prompt"]).tolist() + (outs if (eos_stop and overlap) else outs[:-1])
            key = key[: len(key) // P * P]
            # only where nothing was evicted after the request finished
            if not any(x["evicted"] for x in b[r["finish_batch"]:]) and not out["evicted_without_batch"]:
                c(name, tuple(key) in tree_paths, f"{r['id']}: finish key ({len(key)} tokens) not a tree node")
                self.keys_checked += 1
        # retracted requests re-enter with prefix 0 or a hit, and retractions are recorded on decode batches
        for x in b:
            if x["retracted"]:
                c(name, x["mode"] == "decode", f"retraction on a non-decode batch {x}")

    def shared_prefix(self, name, spec, out):
        overlap = "overlap" in name
        b0 = out["batches"][0]
        first = {e[0] for e in b0["reqs"]}
        print(f"   first batch {b0['reqs']}")
        for r in out["requests"]:
            if r["id"] in first:
                self.check(name, r["cached_tokens"] == 0, f"{r['id']} admitted in the first batch but hit")
            else:
                self.check(name, r["cached_tokens"] == 2032, f"{r['id']} admitted later but hit {r['cached_tokens']}")
        print(f"   cached_tokens {[r['cached_tokens'] for r in out['requests']]}, admit batches "
              f"{[r['admit_batch'] for r in out['requests']]} (overlap={overlap})")

    def memory_pressure(self, name, spec, out):
        retr = sum(r["num_retractions"] for r in out["requests"])
        ev = sum(x["evicted"] for x in out["batches"])
        self.check(name, retr > 0, "no retraction")
        self.check(name, ev > 0, "no eviction")
        for x in out["batches"]:
            if x["retracted"]:
                print(f"   retraction: batch {out['batches'].index(x)} retracted {x['retracted']} "
                      f"-> ratio {x['new_token_ratio']:.4f}, available {x['available']}")
                break
        # retracted requests go to the end of the waiting queue and come back with a fresh prefill
        re = [r for r in out["requests"] if r["num_retractions"]]
        print(f"   {len(re)} requests retracted; cached_tokens of those (first admission only): "
              f"{[r['cached_tokens'] for r in re][:8]}")

    def chunked(self, name, spec, out):
        chunk = spec["chunked_prefill_size"]
        for x in out["batches"]:
            if x["mode"] == "extend":
                tot = sum(e[2] for e in x["reqs"])
                self.check(name, tot <= chunk, f"extend batch of {tot} tokens > chunk {chunk}")
        r0 = [x["reqs"] for x in out["batches"] if x["mode"] == "extend"][:6]
        print(f"   first extend batches {r0}")
        # a chunk publishes at the next pass: the sharer admitted later hits the 600-token prefix (or its chunk part)
        print(f"   cached_tokens {[r['cached_tokens'] for r in out['requests']]}")

    def paged(self, name, spec, out):
        P = spec["page_size"]
        for x in out["batches"]:
            self.check(name, x["available"] % P == 0, f"available {x['available']} not page-aligned")
        for p, _ in out["tree"]:
            self.check(name, len(ids_of(p)) % P == 0, f"tree path of {len(ids_of(p))} tokens not page-aligned")
            break

    def eos(self, name, spec, out):
        overlap = "overlap" in name
        b = out["batches"]
        for i, r in enumerate(out["requests"]):
            s = spec["requests"][i]
            in_decodes = [j for j, x in enumerate(b) if x["mode"] == "decode" and r["id"] in x["reqs"]]
            last = in_decodes[-1] if in_decodes else None
            if not s.get("ignore_eos", True):
                # overlap: the request is in one more decode (scheduled before its EOS was seen), the finish key
                # includes all outputs; normal: no overshoot
                extra = (last > r["finish_batch"]) if last is not None else False
                self.check(name, extra == overlap, f"{r['id']}: overshoot decode {extra}, expected {overlap}")
            else:
                self.check(name, last is None or last <= r["finish_batch"], f"{r['id']}: decoded after finishing")
        print(f"   outputs {[r['output_tokens'] for r in out['requests']]}, reasons "
              f"{[r['finish_reason'][7:] for r in out['requests']]}")

    def lpm_pair(self, name, outs):
        a, f = outs.get(name), outs.get(name.replace("lpm", "fcfs"))
        if a is None or f is None:
            return
        ea = [x["reqs"] for x in a["batches"] if x["mode"] == "extend"]
        ef = [x["reqs"] for x in f["batches"] if x["mode"] == "extend"]
        same_first = ea[0] == ef[0]
        n_same = next((i for i, (x, y) in enumerate(zip(ea, ef)) if x != y), min(len(ea), len(ef)))
        hits_a = sum(r["cached_tokens"] for r in a["requests"])
        hits_f = sum(r["cached_tokens"] for r in f["requests"])
        print(f"   vs fcfs: first extend batch identical={same_first}, first {n_same} extend batches identical; "
              f"hit tokens lpm {hits_a} vs fcfs {hits_f}")
        if "c200" in name:
            self.check(name, same_first, "lpm with > 128 waiting should fall back to FCFS order")
        else:
            self.check(name, not same_first, "lpm with <= 128 waiting should reorder the first batch")


def python_for_oracle() -> str:
    return os.environ.get("KVSIM_SGLANG_PYTHON") or os.path.join(ROOT, ".venv-sglang", "bin", "python")


def run_oracle(path, extra=None):
    spec_path = path
    if extra:
        spec = json.load(open(path)) | extra
        spec_path = path.replace(".json", "." + "-".join(f"{k}={v}" for k, v in extra.items()) + ".json")
        json.dump(spec, open(spec_path, "w"))
    t = time.perf_counter()
    p = subprocess.run([python_for_oracle(), ORACLE, spec_path], capture_output=True, text=True)
    secs = time.perf_counter() - t
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"oracle failed on {spec_path} (exit {p.returncode})")
    return p.stdout, secs, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--cross", action="store_true")
    ap.add_argument("--twice", action="store_true")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = args.only or list(STREAMS)
    paths = {}
    for name in names:
        spec = STREAMS[name]()
        paths[name] = os.path.join(args.out, f"{name}.json")
        with open(paths[name], "w") as f:
            json.dump(spec, f)
    print(f"wrote {len(paths)} streams to {args.out}")
    if not args.run:
        return 0
    ck = Checker()
    outs = {}
    for name in names:
        spec = json.load(open(paths[name]))
        text, secs, err = run_oracle(paths[name])
        out = json.loads(text)
        outs[name] = out
        replay = err.strip().splitlines()[-1] if err.strip() else ""
        print(summary(name, spec, out, secs) + f"   [{replay.split(';')[-1].strip()}]")
        ck.generic(name, spec, out)
        for key, fn in (("shared_prefix", ck.shared_prefix), ("memory_pressure", ck.memory_pressure),
                        ("chunked", ck.chunked), ("paged", ck.paged), ("eos", ck.eos)):
            if name.startswith(key):
                fn(name, spec, out)
        if name.startswith("lpm"):
            ck.lpm_pair(name, outs)
        if args.twice:
            text2, _, _ = run_oracle(paths[name])
            ck.check(name, text2 == text, "second run differs (non-deterministic)")
        if args.cross:
            for kind in ("radix", "unified-python"):
                t2, s2, _ = run_oracle(paths[name], {"tree_cache": kind})
                o2 = json.loads(t2)
                for key in ("batches", "requests", "tree", "final", "retractions_without_batch"):
                    ck.check(name, o2[key] == out[key], f"tree_cache={kind}: {key} differs from unified (rust)")
                print(f"   tree_cache={kind}: same decisions and tree ({s2:.1f} s)")
    print(f"\n{ck.keys_checked} finish keys found in final trees")
    print(f"{len(ck.failures)} check(s) failed" if ck.failures else "all checks passed")
    for f in ck.failures:
        print("  " + f)
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
