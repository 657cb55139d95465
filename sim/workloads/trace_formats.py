"""Session-structured trace formats: one request (a turn) per JSON line, linked to the turn it continues.

Each format's line becomes a `TurnLine`; `sim.workloads.session_traces` links the turns into sessions and replays
them. The formats (docs/concepts/session-traces.md lists every field):

* `bailian`: the Qwen-Bailian traces (github.com/alibaba-edu/qwen-bailian-usagetraces-anon, Apache-2.0; USENIX
  ATC'25 "KVCache Cache in the Wild"). Per its README: `chat_id` (randomized chat id), `parent_chat_id` (-1 for a
  root request), `timestamp` (seconds since the trace began), `input_length`, `output_length`, `type`
  (text/search/image/file), `turn` (the conversation turn number) and `hash_ids` (salted SipHash ids of 16-token
  blocks). NVIDIA AIPerf reads the same fields (docs "Profile with Bailian Traces": `parent_chat_id` defaults to
  -1, `turn` to 1).
* `mooncake-delta`: Dynamo 1.6.1's mocker format of that name (aisimulate-core's Mooncake rows, read from the wheel
  and github.com/ai-dynamo/aisimulate `crates/core/src/replay/loadgen/{types,trace,driver}.rs`): Mooncake rows
  (`timestamp` ms, `input_length`, `output_length`, `hash_ids`) with `session_id` (rows of one id are a session's
  turns in file order) and `delay` (ms after the previous turn's completion), whose `hash_ids` and `input_length`
  are the turn's **new** input only: the prompt is the previous prompt, its output, then this delta.
* `mooncake-sessions`: Dynamo 1.6.1's mocker reading plain Mooncake rows (its default `mooncake` format) that
  carry `session_id`: rows of one id are a session's turns in file order, each row's `hash_ids` its **whole**
  prompt (nothing is implied), `delay` (ms after the previous turn's completion) or, without it, the timestamp
  difference (benchmarks/oracles/dynamo-mocker/session-formats.md). kvsim links a turn to its predecessor as it
  links a Bailian turn (its leading ids equal the predecessor's full prompt blocks).
* `mooncake` with inferred sessions (`sim.workloads.session_inference`): plain Mooncake rows (no session field);
  each row's parent is inferred from its hash ids.
* `agentic-mooncake`: Dynamo 1.6.1's Agentic Mooncake v2 (a header line, then requests with dependency edges):
  read by `sim.workloads.agentic_traces`, not by a line reader here.
* `kvsim`: kvsim's own session JSONL: `id`, `parent` (an earlier line's id, or null), `timestamp_s`, optional
  `delay_s` (the think time after the parent finished), `input_length`, `output_length`, `hash_ids` and optional
  `block_size` (tokens per hash id, 16 unless given, the same on every line).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from sim.workloads.traces import TraceError, check_hash_ids, field

AGENTIC_SCHEMA = "dynamo.agentic_mooncake"
"""The `schema` of an Agentic Mooncake v2 header (`sim.workloads.agentic_traces`)."""

BAILIAN_BLOCK_TOKENS = 16
"""Tokens per hash id in the Qwen-Bailian traces (their files are named `*_blksz_16.jsonl`)."""
KVSIM_BLOCK_TOKENS = 16
"""Tokens per hash id of a kvsim session JSONL line without `block_size`."""

SESSION_FORMATS = ("bailian", "kvsim", "mooncake-sessions", "mooncake-delta", "agentic-mooncake")
"""Formats of session-structured traces, as `--format` names them."""
TRACE_FORMATS = ("mooncake", *SESSION_FORMATS)
"""Every format `kvsim replay` reads (`mooncake`: one independent request per line, open loop)."""


@dataclass(frozen=True, slots=True)
class TurnLine:
    """One line of a session trace: a request and the earlier request it continues (its parent)."""

    key: Hashable
    """The line's own id in the file (Bailian `chat_id`, kvsim `id`)."""
    parent_key: Hashable | None
    """The id of the turn it continues; None for a session's first turn."""
    timestamp_s: float | None
    """When it was sent, in seconds from the trace's start (None: not recorded; then `delay_s` is)."""
    delay_s: float | None
    """Recorded time between the parent's finish and this turn's send (think time, tool latency); None: not
    recorded (the gap is derived from the timestamps: `sim.workloads.session_traces`)."""
    input_length: int
    output_length: int
    hash_ids: list[int]
    block_tokens: int
    """Tokens per hash id."""
    session_key: Hashable | None = None
    """For formats whose turns name their session instead of their parent (`mooncake-delta`): the session; its
    turns follow each other in file order."""


def _number(obj: dict, name: str, path: Path, line_no: int, *, optional: bool = False) -> float | None:
    if optional and obj.get(name) is None:
        return None
    value = float(field(obj, name, float, path, line_no))
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line_no}: field {name!r} must be a finite number of seconds >= 0, got {value}")
    return value


def _lengths(obj: dict, path: Path, line_no: int) -> tuple[int, int]:
    n_in = field(obj, "input_length", int, path, line_no)
    n_out = field(obj, "output_length", int, path, line_no)
    if n_in < 1:
        raise TraceError(f"{path}:{line_no}: field 'input_length' must be >= 1, got {n_in}")
    if n_out < 0:
        raise TraceError(f"{path}:{line_no}: field 'output_length' must be >= 0, got {n_out}")
    return n_in, max(n_out, 1)  # a request always samples at least one token


def bailian_line(obj: dict, path: Path, line_no: int, block_tokens: int | None = None) -> TurnLine:
    """A Qwen-Bailian line (see the module docstring), or TraceError naming the field."""
    key = field(obj, "chat_id", int, path, line_no)
    parent = field(obj, "parent_chat_id", int, path, line_no) if "parent_chat_id" in obj else -1
    if parent < -1:
        raise TraceError(f"{path}:{line_no}: field 'parent_chat_id' must be a chat_id or -1, got {parent}")
    if "type" in obj:
        field(obj, "type", str, path, line_no)
    if "turn" in obj and field(obj, "turn", int, path, line_no) < 1:
        raise TraceError(f"{path}:{line_no}: field 'turn' must be >= 1, got {obj['turn']}")
    ts = _number(obj, "timestamp", path, line_no)
    n_in, n_out = _lengths(obj, path, line_no)
    ids = field(obj, "hash_ids", list, path, line_no)
    tb = block_tokens or BAILIAN_BLOCK_TOKENS
    check_hash_ids(ids, n_in, tb, path, line_no)
    return TurnLine(key, None if parent == -1 else parent, ts, None, n_in, n_out, ids, tb)


def kvsim_line(obj: dict, path: Path, line_no: int, block_tokens: int | None = None) -> TurnLine:
    """A kvsim session JSONL line (see the module docstring), or TraceError naming the field."""
    key = field(obj, "id", int, path, line_no)
    parent = obj.get("parent")
    if "parent" not in obj:
        raise TraceError(f"{path}:{line_no}: missing field 'parent' (an earlier line's id, or null)")
    if parent is not None:
        parent = field(obj, "parent", int, path, line_no)
    ts = _number(obj, "timestamp_s", path, line_no, optional=parent is not None)
    delay = _number(obj, "delay_s", path, line_no, optional=True)
    if parent is None and delay is not None:
        raise TraceError(f"{path}:{line_no}: field 'delay_s' is for a turn with a parent; a first turn starts at "
                         "its timestamp_s")
    if parent is not None and ts is None and delay is None:
        raise TraceError(f"{path}:{line_no}: a turn with a parent needs 'timestamp_s' or 'delay_s'")
    n_in, n_out = _lengths(obj, path, line_no)
    tb = KVSIM_BLOCK_TOKENS
    if "block_size" in obj:
        tb = field(obj, "block_size", int, path, line_no)
        if tb < 1:
            raise TraceError(f"{path}:{line_no}: field 'block_size' must be >= 1, got {tb}")
    if block_tokens is not None and tb != block_tokens:
        raise TraceError(f"{path}:{line_no}: field 'block_size' is {tb}; earlier lines have {block_tokens} (one "
                         "block size per file)")
    ids = field(obj, "hash_ids", list, path, line_no)
    check_hash_ids(ids, n_in, tb, path, line_no)
    return TurnLine(key, parent, ts, delay, n_in, n_out, ids, tb)


def _mooncake_row(obj: dict, path: Path, line_no: int, block_tokens: int | None) -> TurnLine:
    """A Mooncake row as Dynamo's mocker reads it (aliases as the mocker's: `input_tokens`, `output_tokens`,
    `created_time`, `delay_ms`; `input_length` defaults to the hash ids × the trace block), or TraceError naming
    the field. Its key is its line number; its parent is found by session (`TurnLine.session_key`): a row without
    `session_id` is a session of its own."""
    for name, alias in (("input_length", "input_tokens"), ("output_length", "output_tokens"),
                        ("timestamp", "created_time"), ("delay", "delay_ms")):
        if name not in obj and alias in obj:
            obj[name] = obj[alias]
    tb = block_tokens or MOONCAKE_BLOCK_TOKENS
    ids = field(obj, "hash_ids", list, path, line_no)
    if "input_length" not in obj:
        obj["input_length"] = len(ids) * tb
    n_in, n_out = _lengths(obj, path, line_no)
    check_hash_ids(ids, n_in, tb, path, line_no)
    session = obj.get("session_id")
    if session is not None and (isinstance(session, bool) or not isinstance(session, (str, int))):
        raise TraceError(f"{path}:{line_no}: field 'session_id' must be a string, got {session!r}")
    ts = _number(obj, "timestamp", path, line_no, optional=True)
    delay = _number(obj, "delay", path, line_no, optional=True)
    return TurnLine(line_no, None, None if ts is None else ts / 1000.0, None if delay is None else delay / 1000.0,
                    n_in, n_out, ids, tb, session_key=("line", line_no) if session is None else session)


def mooncake_delta_line(obj: dict, path: Path, line_no: int, block_tokens: int | None = None) -> TurnLine:
    """A mooncake-delta line (see the module docstring): a Mooncake row whose ids and length are the turn's new
    input only."""
    return _mooncake_row(obj, path, line_no, block_tokens)


def mooncake_sessions_line(obj: dict, path: Path, line_no: int, block_tokens: int | None = None) -> TurnLine:
    """A Mooncake row with `session_id` (see the module docstring): its ids and length are the turn's whole
    prompt."""
    return _mooncake_row(obj, path, line_no, block_tokens)


def mooncake_line(obj: dict, path: Path, line_no: int, block_tokens: int | None = None) -> TurnLine:
    """A plain Mooncake row (`timestamp` ms, `input_length`, `output_length`, `hash_ids`) as a turn of no known
    session: its parent is inferred (`sim.workloads.session_inference`), so it needs a timestamp."""
    if "timestamp" not in obj:
        raise TraceError(f"{path}:{line_no}: missing field 'timestamp'")
    turn = _mooncake_row(obj, path, line_no, block_tokens)
    return TurnLine(turn.key, None, turn.timestamp_s, None, turn.input_length, turn.output_length, turn.hash_ids,
                    turn.block_tokens)


MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id of a Mooncake-row trace (mooncake, mooncake-sessions, mooncake-delta) unless
--trace-block-size says otherwise (the mocker's `trace_block_size` default is Mooncake's 512)."""

LINE_READERS = {"bailian": bailian_line, "kvsim": kvsim_line, "mooncake-sessions": mooncake_sessions_line,
                "mooncake-delta": mooncake_delta_line, "mooncake": mooncake_line}
"""Each session format's line reader: (object, path, line number, block tokens or None) -> TurnLine (`mooncake`:
rows whose sessions are inferred)."""


def detect_format(obj: dict) -> str:
    """The format of a trace whose first line is `obj`, by the fields it has: `chat_id` (Bailian), `id` and
    `parent` (kvsim), `session_id` (Mooncake rows with sessions, as Dynamo's mocker reads them by default; never
    mooncake-delta, whose rows look the same), the `schema` of an Agentic Mooncake v2 header
    (`sim.workloads.agentic_traces`), else Mooncake."""
    if obj.get("schema") == AGENTIC_SCHEMA:
        return "agentic-mooncake"
    if "chat_id" in obj:
        return "bailian"
    if "id" in obj and "parent" in obj:
        return "kvsim"
    if "session_id" in obj:
        return "mooncake-sessions"
    return "mooncake"
