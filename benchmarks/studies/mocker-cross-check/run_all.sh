#!/usr/bin/env bash
# Runs the four reference configurations twice each through the mocker runner (benchmarks/oracles/dynamo-mocker/);
# appends JSON lines to benchmarks/studies/mocker-cross-check/results.jsonl and prints a summary table. The Mooncake
# traces are read from $TRACES (default traces, relative to the repository root, where `kvsim traces fetch` puts them,
# so that the results and commands.txt record relative paths).
# Before each run, waits (up to 5 min) until no other process uses >30% CPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=.venv-dynamo/bin/python
RUN=benchmarks/oracles/dynamo-mocker/run_mocker.py
T=${TRACES:-traces}
for f in conversation_trace.jsonl synthetic_trace.jsonl; do
  [ -f "$T/$f" ] || { echo "$T/$f not found: run \`.venv/bin/kvsim traces fetch --out $T\` or set TRACES=DIR" >&2; exit 1; }
done
OUT=benchmarks/studies/mocker-cross-check/results.jsonl
CMDS=benchmarks/studies/mocker-cross-check/commands.txt
: > "$CMDS"
BUSY=$(mktemp)   # other busy processes seen during a run
trap 'rm -f "$BUSY"' EXIT

quiet() {
  for i in $(seq 1 10); do
    busy=$(top -bn2 -d1 | awk '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $9+0 > 30 {print $1":"$12":"$9}')
    [ -z "$busy" ] && return 0
    echo "busy: $busy; waiting 30 s" >&2; sleep 30
  done
  echo "WARNING: still busy: $busy" >&2
}

run() {
  local cmd="$PY $RUN $*"
  echo "$cmd" >> "$CMDS"
  for rep in 1 2; do
    quiet
    echo "[$(date -u +%FT%TZ)] rep=$rep $cmd" >&2
    # sample other busy processes during the run (top every 1 s)
    ( while :; do top -bn1 | awk -v me=$$ '$1 ~ /^[0-9]+$/ && $9+0 > 30 && $12 !~ /top/ {print $1":"$12":"$9}'; sleep 1; done ) > "$BUSY" 2>/dev/null &
    local sampler=$!
    local line; line=$($cmd)
    kill $sampler 2>/dev/null || true; wait $sampler 2>/dev/null || true
    # our own run shows up as one busy python; more than one busy pid = contention
    local others; others=$(cut -d: -f1 "$BUSY" | sort -u | wc -l)
    echo "$line" | "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); d['rep']=$rep; d['busy_pids_seen']=$others; print(json.dumps(d))" >> "$OUT"
  done
}

run "$T/conversation_trace.jsonl --workers 8 --num-gpu-blocks 46875 --block-size 64 --router round_robin --trace-block-size 512"
run "$T/conversation_trace.jsonl --workers 8 --num-gpu-blocks 46875 --block-size 64 --router kv_router --trace-block-size 512"
run "$T/conversation_trace.jsonl --workers 8 --num-gpu-blocks 15625 --block-size 64 --router round_robin --trace-block-size 512"
run "$T/synthetic_trace.jsonl --workers 8 --num-gpu-blocks 46875 --block-size 64 --router round_robin --trace-block-size 512"

"$PY" - "$OUT" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print(f"{d['trace'].split('/')[-1]:28s} {d['workers']}x{d['num_gpu_blocks']:>6} {d['router']:11s} rep{d['rep']} "
          f"reuse={d['prefix_cache_reused_ratio']:.4f} ttft={d['ttft_mean_ms']:.0f}/{d['ttft_p99_ms']:.0f} ms "
          f"wall={d['wall_s']:.2f}s cpu={d['cpu_s']:.2f}s ({d['requests_per_s']:.0f} req/s) busy_pids={d['busy_pids_seen']}")
PY
