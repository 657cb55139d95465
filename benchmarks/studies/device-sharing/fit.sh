#!/usr/bin/env bash
# The device-sharing fit (README.md beside), in two stages: the time model on one server, then the sharing on three
# servers, each at concurrency 1 and 4 (short prompts, reniced, every repeat, of the quiet machine's set); then compare
# every run with `kvsim validate` (repeats grouped): the two-server runs, concurrency 2, 8 and 16 and the long prompts
# are held out, and the sets measured on a busy machine are compared for the record. Both stages fit figures of the
# server's own clock (TTFT from vLLM's queued stamp, TPOT from its generation time): a request's time outside the
# engine (docs/time/device-sharing.md) is not in kvsim's model and would otherwise be charged to the engine.
#   benchmarks/studies/device-sharing/fit.sh [OUT_DIR]        # default: benchmarks/studies/device-sharing/results
#   SET=short benchmarks/studies/device-sharing/fit.sh busy/  # fit on another set (short: the busy machine's)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
out="${1:-$here/results}"
# KVSIM may be a command with arguments (e.g. `env PYTHONPATH=DIR .venv/bin/kvsim`): split on spaces.
read -r -a kvsim <<< "${KVSIM:-$repo/.venv/bin/kvsim}"
fx="$repo/tests/fixtures/real-vllm-sharing"
set_="${SET:-short-quiet}"
mkdir -p "$out"
runs() { local f; for f in "$@"; do printf -- '--runs\n%s\n' "$f"; done; }
# Stage 1, the time model: one server (its device is never shared: 1 x (1 + host_load) <= 2 cores).
mapfile -t one < <(runs "$fx/$set_"/w1-n7-c1-r*.csv "$fx/$set_"/w1-n7-c4-r*.csv)
"${kvsim[@]}" calibrate --scenario "$here/start.yaml" "${one[@]}" --ttft server \
  --fit time_model.step_overhead_s,time_model.seq_overhead_s,time_model.compute_efficiency \
  --metrics ttft_p50,tpot_p50,tpot_p90 \
  --jobs "${JOBS:-2}" --out "$out/stage1.yaml" --report "$out/stage1-residuals.csv"
# Stage 2, the sharing: three servers, the time model of stage 1 kept; host_load is measured (start.yaml).
mapfile -t three < <(runs "$fx/$set_"/w3-n7-c1-r*.csv "$fx/$set_"/w3-n7-c4-r*.csv)
"${kvsim[@]}" calibrate --scenario "$out/stage1.yaml" "${three[@]}" --ttft server \
  --fit device.cpu.idle_load,device.cpu.sharing_efficiency,device.cpu.pause_s,device.cpu.pause_fraction,device.cpu.handoff_s \
  --metrics ttft_p50,ttft_p90,ttft_p99,tpot_p50,tpot_p90 \
  --jobs "${JOBS:-2}" --out "$out/fitted.yaml" --report "$out/fit-residuals.csv"
for set in short-quiet long-quiet short short-starved long; do
  [[ -d "$fx/$set" ]] || continue
  "${kvsim[@]}" validate --scenario "$out/fitted.yaml" --ttft server "$fx/$set"/*.csv --out "$out/validate-$set.csv" \
    | grep -v '^wrote ' > "$out/validate-$set.txt" || true
done
echo "wrote $out"
