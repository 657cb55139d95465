"""Turning run rows into what people read: the summary columns, the aggregated rows and the files.

Only the CLI calls the writers; every file is written atomically (a temporary file renamed into place). The figures
are in `sim.results.figures` (sweeps, plans, replays) and `sim.results.study_figures` (compare, tune).
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from sim.results.cost import COST_COLUMNS
from sim.results.records import RequestRecord
from sim.results.stats import over_runs
from sim.results.timeline import FLEET_COLUMNS

TIER_COLUMNS = (
    "cpu_kv_gib", "gpu_hit_rate", "cpu_hit_rate", "cpu_token_hit_rate", "ttft_gpu_hit_p50_ms", "ttft_gpu_hit_p99_ms",
    "ttft_cpu_hit_p50_ms", "ttft_cpu_hit_p99_ms", "cpu_stored_blocks", "cpu_loaded_blocks", "cpu_evicted_blocks",
)
"""The host (CPU) KV tier's columns: its GiB per worker, hits and TTFT by tier, blocks stored, loaded, evicted."""

SUMMARY_COLUMNS = (
    "workers", "prefixes", "concurrency", "router", "engine", "repeat", "seed", "requests",
    "request_hit_rate", "full_hit_rate", "token_hit_rate",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_rps",
    "ttft_hit_p50_ms", "ttft_hit_p90_ms", "ttft_hit_p99_ms", "ttft_miss_p50_ms", "ttft_miss_p90_ms", "ttft_miss_p99_ms",
    "hit_requests", "full_hit_requests", "prefix_cache_queries", "prefix_cache_hits",
    "evicted_blocks", "evicted_tokens", "preemptions", "max_worker_share",
    "reuse_available", "reuse_captured", "reuse_delivered", "view_checked", "view_false_hit_rate", "view_false_tokens",
    "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms", "slo_met_requests", "goodput_rps", "goodput_fraction",
    "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "imbalance_max_mean", "jain_index",
    "ttft_slo_met", "tpot_slo_met", "e2e_slo_met",
    *TIER_COLUMNS,
    *COST_COLUMNS,
)
"""A run's summary columns; columns added later are appended, so old positions never move (last: `COST_COLUMNS`)."""

SESSION_COLUMNS = (
    "sessions", "session_requests", "session_time_p50_s", "session_time_p99_s", "context_requests", "context_tokens",
    "context_hit_rate", "reprefill_tokens", "gpu_reprefill_tokens", "survived_requests", "gpu_survived_requests",
    "gap_survival", "gpu_gap_survival",
)
"""The session columns (`SessionFigures.row`), appended to the summary's only when the run has sessions
(`summary_columns`), so that a summary without sessions keeps its columns."""

PD_COLUMNS = (
    "prefill_workers", "decode_workers", "remote_prefill_requests", "transfer_tokens", "transfer_p50_ms",
    "transfer_p99_ms", "ttft_queue_mean_ms", "ttft_prefill_mean_ms", "ttft_transfer_mean_ms", "ttft_other_mean_ms",
    "prefill_utilisation", "decode_utilisation",
)
"""A disaggregated run's columns (`sim.results.pd_figures.PdFigures.row`), appended to the summary's only for such a
run (`summary_columns`), so that an aggregated summary keeps its columns."""

TURN_COLUMNS = (
    "turn", "requests", "hit_requests", "request_hit_rate", "prompt_tokens", "cached_tokens", "token_hit_rate",
    "ttft_p50_ms", "ttft_p99_ms", "context_requests", "context_tokens", "reprefill_tokens", "gpu_reprefill_tokens",
    "gap_survival", "gpu_gap_survival",
)
"""The columns of `turns.csv`, a row per turn (`SessionFigures.turn_rows`)."""

REQUEST_SESSION_COLUMNS = ("session_id", "turn", "context_tokens")
"""The record's session fields, appended to `requests.csv` only when a request belongs to a session."""

PD_RECORD_COLUMNS = ("pd_prefill_worker", "transfer_tokens", "ttft_queue_s", "ttft_prefill_s", "ttft_transfer_s")
"""requests.csv's P/D columns, written only for a disaggregated run (an aggregated run's file is as before)."""

SHARED_TIER_COLUMNS = (
    "shared_kv_gib", "shared_hit_rate", "shared_token_hit_rate", "ttft_shared_hit_p50_ms", "ttft_shared_hit_p99_ms",
    "tier_load_p50_ms", "tier_load_p99_ms", "shared_stored_blocks", "shared_loaded_blocks", "shared_evicted_blocks",
    "shared_link_bytes", "host_link_bytes",
)
"""The cluster-shared KV store's columns (`Summary.shared_tier_row` and the store's GiB), appended to the summary's
only when a row has a shared store (`summary_columns`), so that a summary without one keeps its columns."""

PEER_FETCH_COLUMNS = ("peer_fetched_blocks", "peer_share")
"""G2 peer fetch's columns (`peer_fetch_row`), appended only when a row has peer fetch, so that a summary without
it keeps its columns."""

REQUEST_TIER_COLUMNS = ("shared_cached_tokens", "tier_load_s")
"""The record's shared-store fields, appended to `requests.csv` only for a run with a shared store."""


def summary_columns(rows: Sequence[dict[str, object]]) -> tuple[str, ...]:
    """The columns of a summary of `rows`: `SUMMARY_COLUMNS`, then `SESSION_COLUMNS` when a row has sessions, then
    `PD_COLUMNS` when a row is of a disaggregated run, then `SHARED_TIER_COLUMNS` when a row has a shared store, then
    `PEER_FETCH_COLUMNS` when a row has G2 peer fetch, then `FLEET_COLUMNS` when a row is of an autoscaled fleet."""
    return (SUMMARY_COLUMNS + (SESSION_COLUMNS if any("sessions" in row for row in rows) else ())
            + (PD_COLUMNS if any("transfer_p50_ms" in row for row in rows) else ())
            + (SHARED_TIER_COLUMNS if any("shared_kv_gib" in row for row in rows) else ())
            + (PEER_FETCH_COLUMNS if any("peer_fetched_blocks" in row for row in rows) else ())
            + (FLEET_COLUMNS if any("fleet_device_s" in row for row in rows) else ()))


def request_rows(records: Sequence[RequestRecord], *, shared_tier: bool = False
                 ) -> tuple[list[dict[str, object]], list[str]]:
    """The rows and columns of `requests.csv`: a record's fields, its TTFT, E2E and TPOT in ms, then its session
    fields when any request belongs to a session, then its shared-store fields with `shared_tier`."""
    rows = [asdict(r) | {"ttft_ms": r.ttft_s * 1000, "e2e_ms": r.e2e_s * 1000,
                         "tpot_ms": float("nan") if r.tpot_s is None else r.tpot_s * 1000}
            for r in records]
    late = REQUEST_SESSION_COLUMNS + PD_RECORD_COLUMNS + REQUEST_TIER_COLUMNS
    columns = [c for c in rows[0] if c not in late] if rows else []
    if any(r.session_id is not None for r in records):
        columns += REQUEST_SESSION_COLUMNS
    if any(r.pd_prefill_worker >= 0 for r in records):
        columns += PD_RECORD_COLUMNS
    if shared_tier:
        columns += REQUEST_TIER_COLUMNS
    return rows, columns

AGGREGATED_COLUMNS = (
    "request_hit_rate", "full_hit_rate", "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "throughput_rps",
    "preemptions", "max_worker_share", "reuse_available", "reuse_captured", "reuse_delivered", "view_false_hit_rate",
    "goodput_rps", "goodput_fraction", "tpot_p50_ms", "tpot_p99_ms", "e2e_p99_ms", "imbalance_max_mean", "jain_index",
    "gpu_hit_rate", "cpu_hit_rate", "ttft_hit_p50_ms", "ttft_miss_p50_ms", "ttft_gpu_hit_p50_ms", "ttft_cpu_hit_p50_ms",
)
"""The summary columns `aggregate` averages over repeats (each with `_sd` and `_ci95`)."""

GROUP_KEYS = ("workers", "prefixes", "concurrency", "router", "engine", "cpu_kv_gib")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file renamed into place, with the mode a plain `open` would give it
    (0666 less the umask; `mkstemp` alone would leave 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def csv_bytes(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue().encode()


def aggregate(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Mean, standard deviation (`_sd`) and 95 % t-interval half-width (`_ci95`) over repeats (`over_runs`: both NaN
    for one run) for each (workers, prefixes, concurrency, router, engine, host KV GiB: 0 in rows without one)."""
    groups: dict[tuple, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row.get(k, 0.0) for k in GROUP_KEYS)].append(row)
    out = []
    for key, members in sorted(groups.items()):
        agg: dict[str, object] = dict(zip(GROUP_KEYS, key))
        agg["repeats"] = len(members)
        for col, interval in over_runs(members, AGGREGATED_COLUMNS).items():
            agg.update(interval.columns(col))
        out.append(agg)
    return out
