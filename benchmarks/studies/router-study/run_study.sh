#!/usr/bin/env bash
# The router study (docs/studies/router-study.md): every router on the built-in workload and on the two Mooncake
# traces, each on the same request streams, then where each router fails. Writes one folder per part beside this
# script (compare.csv, summary.csv, compare.png, compare_hit_rate.png), tune-kv-aware/ and failure_modes.{csv,md};
# benchmarks/studies/router-study/tables.py prints the tables of docs/studies/router-study.md from them.
# About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
KVSIM=${KVSIM:-.venv/bin/kvsim}
OUT=benchmarks/studies/router-study
TRACES=${TRACES:-traces}   # the Mooncake traces; `kvsim traces fetch` puts them in traces/ at the repository root
for trace in conversation synthetic; do
  [ -f "$TRACES/${trace}_trace.jsonl" ] || { echo "$TRACES/${trace}_trace.jsonl not found: run \`$KVSIM traces fetch --out $TRACES\` or set TRACES=DIR" >&2; exit 1; }
done

# The goal point: 6 workers, N = 24, concurrency 8, 5 repeats.
$KVSIM compare --prefixes 24 --workers 6 --concurrency 8 --repeats 5 --slo ttft_ms=150,tpot_ms=20 --out $OUT/goal
# The grid: N = 2, 7, 12, 24; W = 3, 6; concurrency 8, 16; 3 repeats.
$KVSIM compare --prefixes 2,7,12,24 --workers 3,6 --concurrency 8,16 --repeats 3 --slo ttft_ms=150,tpot_ms=20 \
    --out $OUT/builtin
rm -f $OUT/builtin/*.png   # 16 panels each, ~1 MB: the notebook draws the grid from compare.csv instead
# kvsim tune on its own against Dynamo's hand-picked overlap_score_weight=4.
$KVSIM tune --prefixes 24 --workers 6 --concurrency 8 --router kv-aware --objective maximize:request_hit_rate \
    --constraint 'ttft_p99_ms<=215' --budget 200 --repeats 5 --seed 0 --out $OUT/tune-kv-aware
# The Mooncake traces, 8 workers, 3.0M and 1.0M KV tokens per worker (Dynamo mocker's configuration).
for trace in conversation synthetic; do
  for kv in 3000000 1000000; do
    $KVSIM compare --trace $TRACES/${trace}_trace.jsonl --workers 8 --kv-tokens $kv --repeats 3 \
        --slo ttft_ms=1000,tpot_ms=20 --out $OUT/$trace-$((kv / 1000000)).0M
  done
done
.venv/bin/python $OUT/failure_modes.py --repeats 3 > $OUT/failure_modes.md
rm -f $OUT/*/manifest.json $OUT/*/runs.jsonl   # run journals and manifests: for --resume, not part of the study
