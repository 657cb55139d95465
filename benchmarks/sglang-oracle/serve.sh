#!/usr/bin/env bash
# Start / stop / inspect real SGLang 0.5.23 servers (CPU) for the tiny random-weight model (see cpu-serving.md).
#
#   serve.sh start N MAX_TOTAL_TOKENS   # N servers on ports 30001..30000+N, each with a KV pool of that many tokens
#   serve.sh stop                       # stop every server started by this script (SIGTERM to its group, then SIGKILL)
#   serve.sh status                     # pid, port, /health and memory of each
#
# Every server: --device cpu --attention-backend torch_native --enable-cache-report --enable-metrics
# --sleep-on-idle --page-size ${PAGE_SIZE:-1} --max-total-tokens MAX_TOTAL_TOKENS, SGLANG_USE_CPU_ENGINE=1,
# OMP_NUM_THREADS=1 (one torch thread per server: two servers and the client share 2 cores).
#
# Environment overrides:
#   VENV            default <repo>/.venv-sglang-serve (cpu-serving.md, section 3)
#   PAGE_SIZE       default 1
#   HEALTH_TIMEOUT  default 240 (seconds, for all servers together)
#   EXTRA_ARGS      appended to `sglang.launch_server` (e.g. --disable-overlap-schedule)
# Logs and pid files: benchmarks/sglang-oracle/logs/server-<port>.{log,pid}; the pid is the server's process
# group (each server runs in its own session: API server, scheduler, detokenizer).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv-sglang-serve}"
LOGDIR="$HERE/logs"
BASE_PORT=30000
PAGE_SIZE="${PAGE_SIZE:-1}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-240}"

die() { echo "serve.sh: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# shellcheck source=../server_group.sh
source "$HERE/../server_group.sh"

cmd_start() {
  [[ $# -eq 2 ]] || usage
  local n="$1" max_total="$2"
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, got '$n'"
  [[ "$max_total" =~ ^[1-9][0-9]*$ ]] || die "MAX_TOTAL_TOKENS must be a positive integer, got '$max_total'"
  [[ -x "$VENV/bin/python" ]] || die "$VENV/bin/python not found: see cpu-serving.md, section 3"
  [[ -f "$HERE/tiny-model/model.safetensors" && -f "$HERE/tiny-model/tokenizer.json" ]] \
    || die "tiny model or its tokenizer missing: see cpu-serving.md, section 3"
  mkdir -p "$LOGDIR"
  local f i port t0
  for f in $(pidfiles); do
    group_alive "$(cat "$f")" && die "servers already running (see 'serve.sh status'); run 'serve.sh stop' first"
    rm -f "$f"
  done
  for ((i = 1; i <= n; i++)); do
    port=$((BASE_PORT + i))
    [[ "$(health_code "$port")" == 000 ]] || die "port $port is already in use"
  done
  t0=$(date +%s.%N)
  for ((i = 1; i <= n; i++)); do
    port=$((BASE_PORT + i))
    # setsid (exec'd, so its pid is the new session's and group's id); the model is served as "./tiny-model".
    (
      cd "$HERE"
      exec env SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 setsid "$VENV/bin/python" -m sglang.launch_server \
        --model-path ./tiny-model --device cpu --host 127.0.0.1 --port "$port" \
        --attention-backend torch_native --enable-cache-report --enable-metrics --sleep-on-idle \
        --page-size "$PAGE_SIZE" --max-total-tokens "$max_total" ${EXTRA_ARGS:-}
    ) > "$LOGDIR/server-$port.log" 2>&1 < /dev/null &
    echo $! > "$LOGDIR/server-$port.pid"
    local what="page size $PAGE_SIZE, max-total-tokens $max_total${EXTRA_ARGS:+, $EXTRA_ARGS}"
    echo "started port $port (group $!, $what), log $LOGDIR/server-$port.log"
    # Start them one after the other: two SGLang startups at once on 2 cores take longer than in turn.
    local deadline=$(( $(date +%s) + HEALTH_TIMEOUT ))
    until [[ "$(health_code "$port")" == 200 ]]; do
      if ! group_alive "$(cat "$LOGDIR/server-$port.pid")"; then
        echo "serve.sh: server on port $port exited during startup; last log lines:" >&2
        tail -n 30 "$LOGDIR/server-$port.log" >&2
        cmd_stop >&2
        exit 1
      fi
      if (( $(date +%s) >= deadline )); then
        echo "serve.sh: port $port not healthy after $HEALTH_TIMEOUT s; stopping all" >&2
        cmd_stop >&2
        exit 1
      fi
      sleep 1
    done
    printf 'port %s healthy after %.1f s\n' "$port" "$(echo "$(date +%s.%N) - $t0" | bc)"
  done
  for ((i = 1; i <= n; i++)); do
    port=$((BASE_PORT + i))
    curl -s -m 10 "http://127.0.0.1:$port/server_info" | "$VENV/bin/python" -c '
import json, sys
d = json.load(sys.stdin)
st = (d.get("internal_states") or [{}])[0]
print("port %s: sglang %s, max_total_num_tokens=%s page_size=%s chunked_prefill_size=%s max_running_requests=%s "
      "(effective %s) schedule_policy=%s disable_overlap_schedule=%s" % (sys.argv[1], d["version"],
      d["max_total_num_tokens"], d["page_size"], d["chunked_prefill_size"], d["max_running_requests"],
      st.get("effective_max_running_requests_per_dp"), d["schedule_policy"], d["disable_overlap_schedule"]))' "$port" \
      || echo "port $port: /server_info unavailable"
  done
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
