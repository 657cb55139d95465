"""Agentic Mooncake v2 traces (Dynamo 1.6.1's mocker format `agentic_mooncake`, also `agentic-mooncake`) replayed
as sessions: one session per play (an agent run with its subagents), each request sent when its dependencies allow.

The format, as the 1.6.1 wheel reads it (aisimulate-core 0.13.0, `crates/core/src/replay/loadgen/{types,trace,
driver}.rs`; benchmarks/oracles/dynamo-mocker/session-formats.md gives the sources and the probes):

* a header line `{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": B, "hash_id_scope": "local",
  "source": {"format": ..., "digest": ...}}`; `block_size` is the tokens per hash id (it overrides the trace block
  size given otherwise);
* then one request per line: `request_id` (unique), `play_id`, `session_id` and `model` (labels), `input_length`
  (the **full** prompt), `hash_ids` (exactly ceil(input_length / B)), `output_length`, `not_before_ms` (earliest
  dispatch, ms) and optional `dependencies`: incoming edges `{"request_id", "trigger": "completion" | "dispatch",
  "delay_ms", "relation": "sequence" | "spawn" | "join" | "replay_barrier"}` (all but spawn need `completion`).

Timing: a request is ready at max(not_before, over its edges: the predecessor's completion (or dispatch) +
delay_ms) (`release_edges`, driver.rs); it waits for all its edges (a join). Plays start at their roots'
not_before; times are normalised so the earliest root is sent at 0, and divided by `speed`.

Reuse, as the mocker's: each row's hash ids spell its whole prompt, the engine hashes the synthesised tokens in its
own blocks, chained (`content_block_hashes`: block i of two prompts match exactly when their trace blocks agree up
to its end), and outputs are the request's own: a child never hits its parent's output, nor the engine block that
holds the parent's prompt/output boundary (the mocker's outputs are planned token ids no prompt contains;
`output_token_ids` is not read). So a request shares with an earlier one exactly the full engine blocks of the
prompt prefix their hash ids share.

The file is read twice, as `sim.workloads.session_traces` does: the first pass checks every line and keeps per
request its byte offset, line number, play, not-before time and edges; a request is built from its line when it is
due.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sim.workloads.request import Request, computed_block_hashes, context_tokens
from sim.workloads.session_traces import content_block_hashes, own_runs
from sim.workloads.sessions import Due
from sim.workloads.trace_formats import AGENTIC_SCHEMA
from sim.workloads.traces import TraceError, check_hash_ids, field, json_object, open_binary

TRIGGERS = ("completion", "dispatch")
RELATIONS = ("sequence", "spawn", "join", "replay_barrier")


def agentic_header(obj: dict, path: Path, line_no: int) -> int:
    """The header's block size (tokens per hash id), or TraceError naming the field."""
    if obj.get("schema") != AGENTIC_SCHEMA:
        raise TraceError(f"{path}:{line_no}: field 'schema' must be {AGENTIC_SCHEMA!r} (the agentic Mooncake v2 "
                         f"header, the first line), got {obj.get('schema')!r}")
    if field(obj, "version", int, path, line_no) != 2:
        raise TraceError(f"{path}:{line_no}: field 'version' must be 2, got {obj['version']}")
    tb = field(obj, "block_size", int, path, line_no)
    if tb < 1:
        raise TraceError(f"{path}:{line_no}: field 'block_size' must be >= 1, got {tb}")
    if field(obj, "hash_id_scope", str, path, line_no) != "local":
        raise TraceError(f"{path}:{line_no}: field 'hash_id_scope' must be 'local', got {obj['hash_id_scope']!r}")
    source = obj.get("source")
    if not isinstance(source, dict) or not all(isinstance(source.get(k), str) and source[k] for k in ("format", "digest")):
        raise TraceError(f"{path}:{line_no}: field 'source' must be an object with non-empty strings 'format' and "
                         f"'digest', got {source!r}")
    return tb


@dataclass(frozen=True, slots=True)
class AgenticRow:
    """One request line."""

    request_id: str
    play_id: str
    input_length: int
    output_length: int
    hash_ids: list[int]
    not_before_s: float
    dependencies: tuple[tuple[str, bool, float], ...]
    """Incoming edges: (predecessor's request_id, triggered by its dispatch (else its completion), delay in s)."""


def _label(obj: dict, name: str, path: Path, line_no: int) -> str:
    value = field(obj, name, str, path, line_no)
    if not value:
        raise TraceError(f"{path}:{line_no}: field {name!r} must be a non-empty string")
    return value


def _ms(value: object, name: str, where: str) -> float:
    """A time field in ms >= 0, in seconds, or TraceError naming it (`where`: FILE:LINE and the edge)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: field {name!r} must be a finite number of milliseconds >= 0, got {value!r}")
    return value / 1000.0


def agentic_row(obj: dict, path: Path, line_no: int, block_tokens: int) -> AgenticRow:
    """A request line (see the module docstring), or TraceError naming the field."""
    rid = _label(obj, "request_id", path, line_no)
    play = _label(obj, "play_id", path, line_no)
    for name in ("session_id", "model"):
        _label(obj, name, path, line_no)
    n_in = field(obj, "input_length", int, path, line_no)
    if n_in < 1:
        raise TraceError(f"{path}:{line_no}: field 'input_length' must be >= 1, got {n_in}")
    n_out = field(obj, "output_length", int, path, line_no)
    if n_out < 0:
        raise TraceError(f"{path}:{line_no}: field 'output_length' must be >= 0, got {n_out}")
    ids = field(obj, "hash_ids", list, path, line_no)
    check_hash_ids(ids, n_in, block_tokens, path, line_no)
    if "not_before_ms" not in obj:
        raise TraceError(f"{path}:{line_no}: missing field 'not_before_ms'")
    not_before = _ms(obj["not_before_ms"], "not_before_ms", f"{path}:{line_no}")
    deps = []
    raw = obj.get("dependencies") or []
    if not isinstance(raw, list):
        raise TraceError(f"{path}:{line_no}: field 'dependencies' must be a list, got {type(raw).__name__}")
    for k, edge in enumerate(raw):
        where = f"{path}:{line_no}: dependencies[{k}]"
        if not isinstance(edge, dict):
            raise TraceError(f"{where} must be an object, got {edge!r}")
        pred = edge.get("request_id")
        if not isinstance(pred, str) or not pred:
            raise TraceError(f"{where}: field 'request_id' must be a non-empty string, got {pred!r}")
        trigger = edge.get("trigger", "completion")
        if trigger not in TRIGGERS:
            raise TraceError(f"{where}: field 'trigger' must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        relation = edge.get("relation", "sequence")
        if relation not in RELATIONS:
            raise TraceError(f"{where}: field 'relation' must be one of {', '.join(RELATIONS)}, got {relation!r}")
        if trigger == "dispatch" and relation != "spawn":
            raise TraceError(f"{where}: relation {relation!r} needs trigger 'completion' (only spawn may take "
                             "'dispatch')")
        delay = _ms(edge.get("delay_ms", 0), "delay_ms", where)
        deps.append((pred, trigger == "dispatch", delay))
    return AgenticRow(rid, play, n_in, max(n_out, 1), ids, not_before, tuple(deps))


class AgenticTrace:
    """An Agentic Mooncake v2 file indexed for a closed-loop replay (module docstring); iterate `sessions()` once
    per replay. Also answers what `kvsim replay` asks of a `SessionTrace` (`parent_of`, `gap_s`, counts)."""

    orphans = 0
    """Requests whose predecessor is not in the file: none (an unknown predecessor is an error)."""
    unlinked = 0
    inference = None

    def __init__(self, path: str | Path, *, block_size: int, trace_block_tokens: int | None = None,
                 speed: float = 1.0, limit: int | None = None) -> None:
        if speed <= 0:
            raise TraceError(f"speed must be > 0, got {speed}")
        self.path = Path(path)
        self.block_size = block_size
        self.speed = speed
        self.offsets = array("q")
        self.line_nos = array("q")
        self.not_before_s = array("d")
        self.plays = array("q")
        """Each request's play, as an index into `play_starts_s` (plays in order of first appearance)."""
        self.deps: list[tuple[tuple[int, bool, float], ...]] = []
        """Each request's incoming edges: (predecessor, dispatch-triggered, delay s)."""
        self.succs: list[list[tuple[int, bool, float]]] = []
        """Each request's outgoing edges: (successor, dispatch-triggered, delay s)."""
        self.play_nodes: list[list[int]] = []
        self.trace_block_tokens = self._index(trace_block_tokens, limit)
        self._check_acyclic()
        roots = [i for i in range(len(self)) if not self.deps[i]]
        self.origin_s = min(self.not_before_s[i] for i in roots)
        self.play_starts_s = [min(self.not_before_s[i] for i in nodes if not self.deps[i]) - self.origin_s
                              for nodes in self.play_nodes]

    def __len__(self) -> int:
        return len(self.offsets)

    def _index(self, block_tokens: int | None, limit: int | None) -> int:
        path = self.path
        handle = open_binary(path)
        index: dict[str, int] = {}
        play_index: dict[str, int] = {}
        pending: list[tuple[tuple[str, bool, float], ...]] = []
        tb = None
        with handle:
            offset = 0
            for line_no, raw in enumerate(handle, start=1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                obj = json_object(raw, path, line_no)
                if tb is None:
                    tb = agentic_header(obj, path, line_no)
                    if block_tokens is not None and block_tokens != tb:
                        raise TraceError(f"{path}:{line_no}: field 'block_size' is {tb}, but the trace block size "
                                         f"given is {block_tokens} (the header's is the file's)")
                    continue
                if limit is not None and len(self.offsets) >= limit:
                    break
                row = agentic_row(obj, path, line_no, tb)
                if row.request_id in index:
                    raise TraceError(f"{path}:{line_no}: request_id {row.request_id!r} repeats line "
                                     f"{self.line_nos[index[row.request_id]]}'s")
                i = index[row.request_id] = len(self.offsets)
                play = play_index.setdefault(row.play_id, len(play_index))
                if play == len(self.play_nodes):
                    self.play_nodes.append([])
                self.play_nodes[play].append(i)
                self.offsets.append(start)
                self.line_nos.append(line_no)
                self.not_before_s.append(row.not_before_s)
                self.plays.append(play)
                pending.append(row.dependencies)
        if tb is None:
            raise TraceError(f"{path}: no requests (an empty trace)")
        if not self.offsets:
            raise TraceError(f"{path}: no requests after the header")
        self.succs = [[] for _ in range(len(self))]
        for i, edges in enumerate(pending):
            resolved = []
            for pred_id, dispatch, delay in edges:
                p = index.get(pred_id)
                where = f"{path}:{self.line_nos[i]}"
                if p is None:
                    raise TraceError(f"{where}: dependency {pred_id!r} is not a request of the file"
                                     + (" (or past --limit)" if limit is not None else ""))
                if p == i:
                    raise TraceError(f"{where}: request depends on itself")
                if self.plays[p] != self.plays[i]:
                    raise TraceError(f"{where}: dependency {pred_id!r} is in another play (line "
                                     f"{self.line_nos[p]}); dependencies may not cross plays")
                resolved.append((p, dispatch, delay))
                self.succs[p].append((i, dispatch, delay))
            self.deps.append(tuple(resolved))
        return tb

    def _check_acyclic(self) -> None:
        """TraceError naming a line on a dependency cycle (Kahn's algorithm)."""
        waiting = [len(d) for d in self.deps]
        ready = [i for i, n in enumerate(waiting) if n == 0]
        seen = 0
        while ready:
            i = ready.pop()
            seen += 1
            for s, _, _ in self.succs[i]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    ready.append(s)
        if seen < len(self):
            stuck = next(i for i, n in enumerate(waiting) if n)
            raise TraceError(f"{self.path}:{self.line_nos[stuck]}: dependencies form a cycle (or wait on one)")

    # -- what kvsim replay asks ---------------------------------------------------------------------------------

    def parent_of(self, i: int) -> int | None:
        """Request `i`'s first dependency's request id (None: a root)."""
        return self.deps[i][0][0] if self.deps[i] else None

    def gap_s(self, i: int) -> float:
        """The delay of request `i`'s first dependency, over speed."""
        return self.deps[i][0][2] / self.speed if self.deps[i] else 0.0

    # -- building requests ------------------------------------------------------------------------------------

    def _build(self, handle, i: int, turn: int, predecessors: list[Request]) -> Request:
        handle.seek(self.offsets[i])
        line_no = self.line_nos[i]
        row = agentic_row(json_object(handle.readline(), self.path, line_no), self.path, line_no,
                          self.trace_block_tokens)
        B, n_in, n_out = self.block_size, row.input_length, row.output_length
        runs = own_runs(row.hash_ids, 0, n_in, self.trace_block_tokens)
        blocks = content_block_hashes(runs, B, n_in // B)
        context = 0
        for p in predecessors:
            context = max(context, context_tokens(blocks, n_in, computed_block_hashes(p, B), B))
        return Request(
            request_id=i, prompt_tokens=n_in, output_tokens=n_out, block_hashes=blocks, num_shareable_tokens=0,
            prefix_id=row.hash_ids[0], token_runs=tuple(runs), session_id=self.play_nodes[self.plays[i]][0],
            turn=turn, num_context_tokens=context,
        )

    def sessions(self) -> Iterator[_Play]:
        """The plays in start order, for `sim.cluster.arrivals.sessions` (closed loop)."""
        handle = self.path.open("rb")
        order = sorted(range(len(self.play_nodes)), key=lambda p: self.play_starts_s[p])
        for p in order:
            yield _Play(self, handle, p)


class _Play:
    """One play of an `AgenticTrace` (the `Session` protocol): its roots at their not-before times, then each
    request once all its edges have fired, at the latest of its not-before time and each edge's event + delay.

    Times are absolute (seconds from the replay's start): the play is assumed to start at its `start_s` (true in an
    open-loop replay; with a fixed number of concurrent sessions a late play keeps its recorded floors)."""

    __slots__ = ("trace", "handle", "session_id", "start_s", "waiting", "ready_s", "built")

    def __init__(self, trace: AgenticTrace, handle, play: int) -> None:
        self.trace, self.handle = trace, handle
        nodes = trace.play_nodes[play]
        self.session_id = nodes[0]
        self.start_s = trace.play_starts_s[play] / trace.speed
        self.waiting = {i: len(trace.deps[i]) for i in nodes if trace.deps[i]}
        """Edges not yet fired, per request that has any."""
        self.ready_s: dict[int, float] = {}
        """The latest edge event + delay so far, per request."""
        self.built: dict[int, Request] = {}

    def _floor_s(self, i: int) -> float:
        return (self.trace.not_before_s[i] - self.trace.origin_s) / self.trace.speed

    def _release(self, due: list[int], now_s: float) -> list[Due]:
        """Build `due` (all edges fired) and what their dispatch releases in turn."""
        out: list[Due] = []
        trace = self.trace
        while due:
            i = due.pop()
            at_s = max(now_s, self._floor_s(i), self.ready_s.pop(i, -math.inf))
            preds = [self.built[p] for p, _, _ in trace.deps[i]]
            turn = 1 + max((r.turn for r in preds), default=-1)
            request = self.built[i] = trace._build(self.handle, i, turn, preds)
            out.append((request, at_s - now_s))
            for s, dispatch, delay in trace.succs[i]:
                if dispatch:
                    due += self._fire(s, at_s + delay / trace.speed)
        return out

    def _fire(self, s: int, event_s: float) -> list[int]:
        """Edge into `s` fired, allowing `s` from `event_s`: [s] when it was its last edge."""
        self.ready_s[s] = max(self.ready_s.get(s, -math.inf), event_s)
        self.waiting[s] -= 1
        if self.waiting[s]:
            return []
        del self.waiting[s]
        return [s]

    def first(self) -> list[Due]:
        roots = [i for i in self.trace.play_nodes[self.trace.plays[self.session_id]] if not self.trace.deps[i]]
        return self._release(roots[::-1], self.start_s)

    def after(self, done: Request, now_s: float) -> list[Due]:
        due: list[int] = []
        for s, dispatch, delay in self.trace.succs[done.request_id]:
            if not dispatch:
                due += self._fire(s, now_s + delay / self.trace.speed)
        return self._release(due, now_s)
