#!/usr/bin/env bash
# Measure the real-vLLM fixtures of tests/fixtures/real-vllm/ with `kvsim measure` (minutes; never in CI).
#   benchmarks/real-vllm/measure_fixtures.sh            # all 12 runs: workers {2,3} x N {2,7,12} x C {1,4}
#   RUNS="2:7:4 3:12:1" benchmarks/real-vllm/measure_fixtures.sh   # chosen runs (workers:prefixes:concurrency)
#   SCENARIO=scenarios/tiny-cpu-long.yaml KV_BYTES=10387456 SERVERS=2 RUNS="2:7:1 2:7:4" \
#     OUT=tests/fixtures/real-vllm-long benchmarks/real-vllm/measure_fixtures.sh      # the long-prompt workload
# Needs the venv and model of setup.sh. Starts SERVERS servers (default 3; KV_BYTES each, default 78 blocks of 32
# tokens as scenarios/tiny-cpu.yaml says), resets their prefix caches before every run (kvsim measure does), stops
# them at the end. KV_BYTES must match the scenario's engine.kv_cache_bytes.
# ENGINECORE_NICE (default 10) renices each server's EngineCore, which busy-polls its worker's queue, and CLIENT_NICE
# (default -10; root only, else 0) runs the client above it: otherwise the client and the API servers, which share
# cores with the EngineCores, stall now and then for 0.5-1.3 s (tests/fixtures/real-vllm-timing/README.md). The hit
# fixtures of tests/fixtures/real-vllm/ and the -starved timing sets predate this: ENGINECORE_NICE=0 CLIENT_NICE=0.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${OUT:-$repo/tests/fixtures/real-vllm}"
kvsim="${KVSIM:-$repo/.venv/bin/kvsim}"
scenario="${SCENARIO:-$repo/scenarios/tiny-cpu.yaml}"
kv_bytes="${KV_BYTES:-2555904}"   # 78 blocks x 32 tokens x 1 KiB per token: about 4 prompts of 612 tokens per server
servers="${SERVERS:-3}"
runs="${RUNS:-2:2:1 2:2:4 2:7:1 2:7:4 2:12:1 2:12:4 3:2:1 3:2:4 3:7:1 3:7:4 3:12:1 3:12:4}"
mkdir -p "$out"
"$here/serve.sh" start "$servers" "$kv_bytes" 8
trap '"$here/serve.sh" stop' EXIT
for pid in $(pgrep -f "VLLM::EngineCore"); do renice -n "${ENGINECORE_NICE:-10}" -p "$pid" > /dev/null; done
client_nice="${CLIENT_NICE:-$([[ $(id -u) == 0 ]] && echo -10 || echo 0)}"
for run in $runs; do
  IFS=: read -r workers prefixes conc <<<"$run"
  endpoints=()
  for ((i = 1; i <= workers; i++)); do endpoints+=(--endpoint "http://127.0.0.1:$((8100 + i))"); done
  name="w${workers}-n${prefixes}-c${conc}"
  echo "== $name $(date -u +%H:%M:%S)"
  nice -n "$client_nice" "$kvsim" measure --scenario "$scenario" "${endpoints[@]}" --prefixes "$prefixes" \
    --concurrency "$conc" --out "$out/$name.csv"
done
