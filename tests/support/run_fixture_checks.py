"""Checks every measured run fixture shares: the per-request figures agree with the server's own counters."""

from __future__ import annotations

import json
from pathlib import Path

from sim.servers.run_csv import read_run


def assert_counters_agree(path: Path) -> list[dict]:
    """vLLM's per-request cached_tokens and its prefix-cache counters tell the same story, per server: hits are the
    cached tokens, queries the prompt tokens of the measured requests. Returns the servers' counters."""
    run = read_run(path)
    side = json.loads(path.with_suffix(".json").read_text())
    for worker, counters in enumerate(side["counters_measured"]):
        rows = [r for r in run.measured if r.worker == worker]
        assert counters["hits"] == sum(r.cached_tokens for r in rows), (path.name, worker)
        assert counters["queries"] == sum(r.prompt_tokens for r in rows), (path.name, worker)
    return side["counters_measured"]
