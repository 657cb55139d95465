#!/usr/bin/env bash
# Fresh Dynamo deployment per run (workers + frontend restarted, so the router's index starts empty), then
# measure_dynamo.py. NATS + etcd must be up (serve.sh infra).
#   benchmarks/studies/real-dynamo/run_all.sh MODE REPEATS [TAG]     e.g. run_all.sh kv 3     run_all.sh random 2
#   SCENARIO=benchmarks/studies/real-dynamo/tiny-cpu-dynamo-n7.yaml POINT=n7-c4 run_all.sh kv 2
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; ROOT="$(cd "$HERE/../../.." && pwd)"
MODE=${1:-kv}; REPEATS=${2:-1}; TAG=${3:-fresh}
SCENARIO=${SCENARIO:-$HERE/tiny-cpu-dynamo.yaml}; POINT=${POINT:-n4-c2}
KV_BYTES=${KV_BYTES:-2555904}   # 78 blocks of 32 tokens, as scenarios/tiny-cpu.yaml
case $MODE in kv) LABEL=kv-aware ;; random) LABEL=random ;; round-robin) LABEL=round-robin ;; *) LABEL=$MODE ;; esac
for r in $(seq "$REPEATS"); do
  "$HERE/serve.sh" stop worker0 worker1 frontend >/dev/null
  t0=$(date +%s)
  "$HERE/serve.sh" worker 0 "$KV_BYTES"; "$HERE/serve.sh" worker 1 "$KV_BYTES"; "$HERE/serve.sh" frontend "$MODE"
  "$HERE/serve.sh" wait 2
  echo "deployment up in $(( $(date +%s) - t0 )) s"
  "$ROOT/.venv/bin/python" "$HERE/measure_dynamo.py" --scenario "$SCENARIO" \
    --worker-metrics http://127.0.0.1:8181 --worker-metrics http://127.0.0.1:8182 --router-label "$LABEL" \
    --out "$HERE/runs/$MODE-$POINT-$TAG$r.csv"
done
"$HERE/serve.sh" stop worker0 worker1 frontend
