# Sourced by real-vllm/serve.sh and sglang-oracle/serve.sh: status and stop of the servers they start.
#
# Each server runs in its own session (setsid), so the pid in LOGDIR/server-<port>.pid is also the id of its
# process group (API server plus the engine's processes), and stopping a server signals the whole group.
# The sourcing script sets LOGDIR.

pidfiles() { compgen -G "$LOGDIR/server-*.pid" | sort || true; }
group_alive() { pgrep -g "$1" >/dev/null 2>&1; }
health_code() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/health" || true; }
port_of() { local p; p="$(basename "$1" .pid)"; echo "${p#server-}"; }

cmd_status() {
  local f pgid port any=0 p pss
  for f in $(pidfiles); do
    any=1
    pgid="$(cat "$f")"; port="$(port_of "$f")"
    if group_alive "$pgid"; then
      pss=0  # proportional set size of the server's process group
      for p in $(pgrep -g "$pgid"); do
        pss=$(( pss + $(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0) ))
      done
      echo "port $port: group $pgid running, /health $(health_code "$port"), PSS $(( pss / 1024 )) MiB"
    else
      echo "port $port: group $pgid not running (stale pid file)"
    fi
  done
  [[ $any == 1 ]] || echo "no servers"
}

cmd_stop() {
  local f pgid port deadline stopped=0
  for f in $(pidfiles); do
    pgid="$(cat "$f")"
    if group_alive "$pgid"; then kill -TERM -- "-$pgid" 2>/dev/null || kill -TERM "$pgid" 2>/dev/null || true; fi
  done
  deadline=$(( $(date +%s) + 30 ))
  for f in $(pidfiles); do
    pgid="$(cat "$f")"; port="$(port_of "$f")"
    while group_alive "$pgid" && (( $(date +%s) < deadline )); do sleep 0.5; done
    if group_alive "$pgid"; then
      echo "serve.sh: port $port: still running after 30 s, sending SIGKILL to group $pgid" >&2
      kill -KILL -- "-$pgid" 2>/dev/null || true
      sleep 1
    fi
    rm -f "$f"
    echo "stopped port $port (group $pgid)"
    stopped=$((stopped + 1))
  done
  [[ $stopped -gt 0 ]] || echo "no servers to stop"
}
