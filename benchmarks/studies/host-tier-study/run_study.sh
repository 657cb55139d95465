#!/usr/bin/env bash
# The host-tier study (docs/studies/host-tier-study.md): on the built-in workload (6 workers, N = 24, concurrency 8),
# the hit rate and TTFT against host (CPU) KV per worker (vLLM --kv-offloading-size: 0, 4, 16, 64 GiB) under random
# routing, beside KV-aware routing (Dynamo's kv-aware, and kvsim's policy) with and without it; the all-fit
# reference (GPU KV for every prefix on every worker); and `kvsim plan capacity` for the host KV that buys KV-aware's
# hit rate. Writes sweep/ (summary.csv, hit_rate.png, ttft_cdf.png), all-fit/, plan-*/ beside this script;
# tables.py prints the tables of docs/studies/host-tier-study.md from them and draws host_tier.png. About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
KVSIM=${KVSIM:-.venv/bin/kvsim}
OUT=benchmarks/studies/host-tier-study
SLO=ttft_ms=150,tpot_ms=20   # the router study's: a hit meets it under load, a miss only on an idle worker

$KVSIM sweep --prefixes 24 --workers 6 --concurrency 8 --router random,kv-aware,kvsim --cpu-kv-gib 0,4,16,64 \
    --repeats 5 --slo $SLO --out $OUT/sweep
# All-fit: 16 GiB of GPU KV per worker, one worker per device (the reference's shared GPU could not hold it).
.venv/bin/python - <<'PY'
from pathlib import Path
from sim.results.report import csv_bytes, write_atomic
from sim.results.report import SUMMARY_COLUMNS
from sim.results.records import Slo
from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import load_scenario

base, _ = load_scenario()
rows = []
for repeat in range(5):
    s = base.with_overrides(**{"workload.prefixes": 24, "cluster.workers": 6, "router.name": "random",
                               "engine.kv_cache_bytes": 16 << 30, "seed": base.seed + repeat,
                               "slo": {"ttft_ms": 150, "tpot_ms": 20}})
    rows.append({"workers": 6, "prefixes": 24, "concurrency": 8, "router": "random (all-fit GPU KV)",
                 "engine": "vllm", "repeat": repeat, "seed": s.seed, **summarize(run(s)).row()})
write_atomic(Path("benchmarks/studies/host-tier-study/all-fit/summary.csv"), csv_bytes(rows, SUMMARY_COLUMNS))
PY
# How much host KV buys KV-aware routing's hit rate (its mean over the sweep's 5 repeats, read from sweep/):
TARGET=$(.venv/bin/python $OUT/tables.py --kv-aware-hit-rate)
$KVSIM plan capacity --vary cpu-kv-gib --target-hit-rate "$TARGET" --prefixes 24 --workers 6 --router random \
    --max 16 --step 0.25 --repeats 3 --out $OUT/plan-hit-rate
# ... and how much keeps random routing's TTFT p99 within KV-aware's (no host tier), if any does.
TTFT=$(.venv/bin/python $OUT/tables.py --kv-aware-ttft-p99)
$KVSIM plan capacity --vary cpu-kv-gib --target-ttft-p99-ms "$TTFT" --prefixes 24 --workers 6 --router random \
    --max 64 --step 1 --repeats 3 --out $OUT/plan-ttft || true
rm -f $OUT/*/manifest.json $OUT/*/runs.jsonl $OUT/sweep/*.png   # one N: tables.py draws the study's figure instead
.venv/bin/python $OUT/tables.py --figure $OUT/host_tier.png
