#!/usr/bin/env bash
# Measure the real-SGLang fixtures of tests/fixtures/real-sglang/ with `kvsim measure` (about 15 min; never in CI).
#   benchmarks/sglang-oracle/measure_fixtures.sh              # the 6 runs: 2 servers x N {2,7,12} x C {1,4}, then
#                                                             # w2-n2-c4-nooverlap on servers restarted with
#                                                             # --disable-overlap-schedule
#   RUNS="7:4 12:1" NOOVERLAP=0 benchmarks/sglang-oracle/measure_fixtures.sh   # chosen runs (prefixes:concurrency)
# Needs .venv-sglang-serve and tiny-model/ with its tokenizer (cpu-serving.md). Starts 2 servers with a KV pool of
# 2,496 tokens each (about 4 prompts of 612 + 64 tokens, scenarios/tiny-cpu.yaml's workload), page size 1; every
# run flushes their radix caches first (kvsim measure does); stops them at the end. The servers' logs of each
# phase are kept as benchmarks/sglang-oracle/logs/{overlap,nooverlap}-server-<port>.log (git-ignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/tests/fixtures/real-sglang}"
kvsim="${KVSIM:-$repo/.venv/bin/kvsim}"
scenario="$repo/scenarios/tiny-cpu.yaml"
max_total_tokens=2496
runs="${RUNS:-2:1 2:4 7:1 7:4 12:1 12:4}"
endpoints=(--endpoint http://127.0.0.1:30001 --endpoint http://127.0.0.1:30002)
mkdir -p "$out"
trap '"$here/serve.sh" stop' EXIT

warm_up() {
  # SGLang's first requests after startup are slow (torch warm-up); one throwaway run makes the fixtures' timing
  # that of warm servers. Its files are discarded.
  "$kvsim" measure --scenario "$scenario" "${endpoints[@]}" --prefixes 2 --concurrency 4 --requests 24 \
    --out "$(mktemp -d)/warm-up.csv" > /dev/null
}

keep_logs() {  # phase
  local port
  for port in 30001 30002; do cp "$here/logs/server-$port.log" "$here/logs/$1-server-$port.log"; done
}

measure() {  # name prefixes concurrency
  echo "== $1 $(date -u +%H:%M:%S)"
  "$kvsim" measure --scenario "$scenario" "${endpoints[@]}" --prefixes "$2" --concurrency "$3" --out "$out/$1.csv"
}

"$here/serve.sh" start 2 "$max_total_tokens"
warm_up
for run in $runs; do
  IFS=: read -r prefixes conc <<<"$run"
  measure "w2-n${prefixes}-c${conc}" "$prefixes" "$conc"
done
keep_logs overlap
if [[ "${NOOVERLAP:-1}" == 1 ]]; then
  "$here/serve.sh" stop
  EXTRA_ARGS=--disable-overlap-schedule "$here/serve.sh" start 2 "$max_total_tokens"
  warm_up
  measure w2-n2-c4-nooverlap 2 4
  keep_logs nooverlap
fi
echo "== done $(date -u +%H:%M:%S)"
