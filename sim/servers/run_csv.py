"""The run CSV: one row per request of a measured (or simulated) run, plus a JSON sidecar describing the setup.

Written by `kvsim measure`, read by `kvsim validate` and `kvsim calibrate --runs`; other tools may write it too.
Required columns (extra columns are kept and ignored):

    request_id, warmup, prefix_id, worker, prompt_tokens, cached_tokens, ttft_ms, e2e_ms, start_s, end_s

The sidecar has the same stem and the suffix `.json` (`run.csv` -> `run.json`), see `RunSetup`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.csv_fields import finite_float, read_text, whole_number
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

REQUIRED_COLUMNS = ("request_id", "warmup", "prefix_id", "worker", "prompt_tokens", "cached_tokens", "ttft_ms",
                    "e2e_ms", "start_s", "end_s")
OPTIONAL_COLUMNS = ("output_tokens", "server_ttft_ms", "server_queue_ms", "server_generation_ms", "attempts", "error")


class RunFileError(ValueError):
    """A run CSV or sidecar that cannot be read; the message names the file, line and field."""


class EngineInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field("vllm", description="Engine name.")
    version: str = Field(description="Engine version, e.g. 0.32.0.")


class TokenIds(BaseModel):
    """How `kvsim measure` drew the prompts' token ids (`prompt_token_ids` with the run's seed): uniformly in
    [min, max]."""

    model_config = ConfigDict(extra="forbid")
    min: int = Field(ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _range(self) -> TokenIds:
        if self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}")
        return self


class RunSetup(BaseModel):
    """The sidecar: what was run, so that kvsim can simulate the same thing.

    Capacity per worker: vLLM's `num_gpu_blocks`, SGLang's `max_total_tokens`, or (either engine)
    `kv_cache_bytes` with `kv_bytes_per_token`. `block_size` is vLLM's KV block size; SGLang has no blocks (its
    pages are `page_size` tokens), and there it is the block size of the prompt hashes the client-side router read
    (`kvsim measure` takes the scenario's `engine.block_size`, 16 by default). The SGLang fields are SGLang's
    server arguments as its /server_info reports them; null or absent means "not known" (kvsim keeps the
    scenario's value).
    """

    model_config = ConfigDict(extra="allow")
    workers: int = Field(ge=1)
    prefixes: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    requests: int = Field(ge=1, description="Measured requests (warm-ups excluded).")
    block_size: int = Field(ge=1, description="vLLM: its KV block size; SGLang: the router's prompt-hash block size.")
    num_gpu_blocks: int | None = Field(None, ge=2, description="Blocks per worker as vLLM reports them, null block included.")
    kv_cache_bytes: int | None = Field(None, gt=0)
    kv_bytes_per_token: int | None = Field(None, gt=0)
    prefix_tokens: int = Field(ge=0)
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    router: str
    warmup_per_prefix: int = Field(ge=0)
    seed: int
    engine: EngineInfo
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=2, description="vLLM: longest sequence; SGLang: context length.")
    page_size: int | None = Field(None, ge=1, description="SGLang --page-size (tokens per KV page).")
    max_total_tokens: int | None = Field(None, ge=2, description="SGLang: KV slots per worker (max_total_num_tokens).")
    chunked_prefill_size: int | None = Field(None, description="SGLang --chunked-prefill-size; -1 or 0: disabled.")
    max_prefill_tokens: int | None = Field(None, ge=1, description="SGLang --max-prefill-tokens.")
    max_running_requests: int | None = Field(None, ge=1, description="SGLang: the scheduler's running-request limit.")
    schedule_policy: str | None = Field(None, description="SGLang --schedule-policy.")
    radix_eviction_policy: str | None = Field(None, description="SGLang --radix-eviction-policy.")
    disable_overlap_schedule: bool | None = Field(None, description="SGLang --disable-overlap-schedule.")
    token_ids: TokenIds | None = Field(None, description="kvsim measure's token id range (ids follow from the seed).")

    @model_validator(mode="after")
    def _capacity(self) -> RunSetup:
        by_bytes = self.kv_cache_bytes is not None and self.kv_bytes_per_token is not None
        if self.engine.name == "sglang":
            if self.max_total_tokens is None and not by_bytes:
                raise ValueError("give max_total_tokens, or kv_cache_bytes with kv_bytes_per_token")
        elif self.num_gpu_blocks is None and not by_bytes:
            raise ValueError("give num_gpu_blocks, or kv_cache_bytes with kv_bytes_per_token")
        if self.prompt_tokens < self.prefix_tokens:
            raise ValueError(f"prompt_tokens {self.prompt_tokens} < prefix_tokens {self.prefix_tokens}")
        return self

    @property
    def blocks_per_worker(self) -> int:
        """vLLM's block count per worker (null block included)."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        if self.kv_cache_bytes is None or self.kv_bytes_per_token is None:
            raise ValueError("this run gives no num_gpu_blocks, nor kv_cache_bytes with kv_bytes_per_token")
        return self.kv_cache_bytes // (self.block_size * self.kv_bytes_per_token)

    @property
    def kv_tokens_per_worker(self) -> int:
        """SGLang's KV slots per worker: `max_total_tokens`, else bytes / bytes per token."""
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        if self.kv_cache_bytes is None or self.kv_bytes_per_token is None:
            raise ValueError("this run gives no max_total_tokens, nor kv_cache_bytes with kv_bytes_per_token")
        return self.kv_cache_bytes // self.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class RunRow:
    request_id: int
    warmup: bool
    prefix_id: int
    worker: int
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float
    e2e_ms: float
    start_s: float
    end_s: float
    error: str = ""
    server_ttft_ms: float | None = None
    server_queue_ms: float | None = None
    server_generation_ms: float | None = None
    """vLLM's last output token less its first on the server (written by `kvsim measure` since 2026-12-03)."""

    @property
    def is_hit(self) -> bool:
        return self.cached_tokens > 0

    def tpot_ms(self, output_tokens: int, source: str = "client") -> float | None:
        """Time per output token after the first; None for one output. "client": client-timed, (e2e - TTFT) /
        (outputs - 1); "server": vLLM's `generation_time_ms` / (outputs - 1) where the run recorded it, else the
        client's. NOTE: a client starved of CPU receives streamed chunks in bursts, which shrinks the client's
        figure (not e2e)."""
        if output_tokens < 2:
            return None
        if source == "server" and self.server_generation_ms is not None:
            return self.server_generation_ms / (output_tokens - 1)
        return (self.e2e_ms - self.ttft_ms) / (output_tokens - 1)

    def ttft(self, source: str) -> float:
        """TTFT in ms as the client timed it ("client"), or as the server reports it ("server": queue time +
        time to first token, i.e. without HTTP, tokenisation and the client's own scheduling delays)."""
        if source == "client":
            return self.ttft_ms
        if self.server_ttft_ms is None or self.server_queue_ms is None:
            raise RunFileError(f"request {self.request_id}: no server_ttft_ms/server_queue_ms for server-side TTFT")
        return self.server_ttft_ms + self.server_queue_ms


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    csv_path: Path
    setup: RunSetup
    rows: tuple[RunRow, ...]

    @property
    def measured(self) -> tuple[RunRow, ...]:
        """Measured requests that completed (warm-ups and failed requests excluded)."""
        return tuple(r for r in self.rows if not r.warmup and not r.error)


def sidecar_path(csv_path: Path) -> Path:
    return csv_path.with_suffix(".json")


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes"):
        return True
    if v in ("0", "false", "no", ""):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false/1/0)")


def _at_least(parse, least):
    return lambda text: parse(text, least=least)


# NOTE: times are finite and non-negative (start_s from the run's start); the cross-column rules are in _check_row.
_PARSERS = {"request_id": _at_least(whole_number, 0), "warmup": _bool, "prefix_id": _at_least(whole_number, 0),
            "worker": _at_least(whole_number, 0), "prompt_tokens": _at_least(whole_number, 1),
            "cached_tokens": _at_least(whole_number, 0), "ttft_ms": _at_least(finite_float, 0),
            "e2e_ms": _at_least(finite_float, 0), "start_s": _at_least(finite_float, 0),
            "end_s": _at_least(finite_float, 0)}


_FAILED_MAY_LACK = ("ttft_ms", "e2e_ms", "end_s")


def _check_row(row: RunRow, setup: RunSetup) -> str | None:
    """What makes a row impossible for its run (None if nothing): the message names the column(s)."""
    if row.cached_tokens > row.prompt_tokens:
        return f"column cached_tokens: {row.cached_tokens} > prompt_tokens {row.prompt_tokens}"
    if row.prefix_id >= setup.prefixes:
        return f"column prefix_id: {row.prefix_id} is not one of the run's {setup.prefixes} prefixes (0..{setup.prefixes - 1})"
    if row.worker >= setup.workers:
        return f"column worker: {row.worker} is not one of the run's {setup.workers} workers (0..{setup.workers - 1})"
    if row.end_s < row.start_s:
        return f"column end_s: {row.end_s} is before start_s {row.start_s}"
    if setup.max_model_len is not None and row.prompt_tokens + setup.output_tokens > setup.max_model_len:
        return (f"column prompt_tokens: {row.prompt_tokens} + {setup.output_tokens} output tokens exceeds the "
                f"sidecar's max_model_len {setup.max_model_len}")
    return None


def read_run(csv_path: str | Path) -> Run:
    """Read a run CSV and its sidecar; raises RunFileError naming the file, line and column on bad input."""
    path = Path(csv_path)
    if not path.is_file():
        raise RunFileError(f"{path}: no such file")
    side = sidecar_path(path)
    if not side.is_file():
        raise RunFileError(f"{path}: missing sidecar {side.name} (the run's setup, JSON)")
    try:
        setup = RunSetup.model_validate(json.loads(read_text(side)))
    except json.JSONDecodeError as err:
        raise RunFileError(f"{side}: not valid JSON ({err})") from None
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise RunFileError(f"{side}: {field}: {first['msg'].removeprefix('Value error, ')}") from None
    except ValueError as err:  # not UTF-8
        raise RunFileError(str(err)) from None
    try:
        text = read_text(path)
    except ValueError as err:
        raise RunFileError(str(err)) from None
    seen: dict[int, int] = {}
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise RunFileError(f"{path}: missing required column {missing[0]!r} "
                           f"(required: {', '.join(REQUIRED_COLUMNS)})")
    rows = []
    for line, raw in enumerate(reader, start=2):
        values: dict[str, Any] = {}
        failed = bool((raw.get("error") or "").strip())
        for col, parse in _PARSERS.items():
            text = raw.get(col)
            try:
                if text is None:
                    raise ValueError("missing value")
                # NOTE: a failed request (an error given) has no TTFT or end: `kvsim measure` writes nan there.
                values[col] = float(text) if failed and col in _FAILED_MAY_LACK else parse(text)
            except ValueError as err:
                raise RunFileError(f"{path}:{line}: column {col}: {err}") from None
        values["error"] = (raw.get("error") or "").strip()
        for col in ("server_ttft_ms", "server_queue_ms", "server_generation_ms"):
            text = (raw.get(col) or "").strip()
            try:
                values[col] = finite_float(text, least=0) if text else None
            except ValueError as err:
                raise RunFileError(f"{path}:{line}: column {col}: {err}") from None
        row = RunRow(**values)
        problem = _check_row(row, setup)
        if problem:
            raise RunFileError(f"{path}:{line}: {problem}")
        if row.request_id in seen:
            raise RunFileError(f"{path}:{line}: column request_id: {row.request_id} is already on line "
                               f"{seen[row.request_id]}")
        seen[row.request_id] = line
        rows.append(row)
    if not rows:
        raise RunFileError(f"{path}: no rows")
    return Run(path.stem, path, setup, tuple(rows))


def write_run_bytes(rows: list[dict[str, Any]], setup: dict[str, Any]) -> tuple[bytes, bytes]:
    """The CSV and sidecar contents for a run (the caller writes them atomically)."""
    columns = list(REQUIRED_COLUMNS) + [c for c in OPTIONAL_COLUMNS if any(c in r for r in rows)]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    RunSetup.model_validate(setup)  # never write a sidecar kvsim itself cannot read
    return buf.getvalue().encode(), (json.dumps(setup, indent=2, sort_keys=True) + "\n").encode()
