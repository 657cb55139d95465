"""Session-structured traces replayed as sessions: each turn linked to the turn it continues, sent closed loop
(after its parent finished, plus the recorded gap) or at its recorded time.

A closed-loop replay needs lookahead: a turn's parent must know its first child's block ids (they name the parent's
output blocks), and a turn is sent when its parent finishes, whenever that is in the file. So the file is read
twice. The first pass (`SessionTrace.__init__`) checks every line and keeps, per request, a compact index of
8 numbers (about 64 bytes a request, in `array`s; plus, while it runs, a dict of the chat ids): the line's byte
offset and number, its recorded timestamp and delay, its parent and its first child and next sibling. No hash id is
kept: a request is built from its line (read again by its offset) when it is due, with its first child's line for
its output blocks, so memory holds the index and the requests in flight, not the trace's hash ids.

Request ids are the lines' indices among the requests (0 for the first line), a session's id is its first turn's
request id, and a turn's `Request.turn` is its depth in the session (0 for the first turn).

Linking (B = engine block size, P and O the parent's input and output lengths):

    parent prompt:  | full blocks 0 .. P//B - 1 | partial |
    parent output:                             | output tokens ......... |
    child prompt:   | the same full blocks      | child ids P//B .. (P+O)//B - 1 | the child's own tokens ... |
                                                  ^ the parent's output_block_hashes

A child is linked to its parent when its prompt is at least the parent's and its leading ids equal the parent's full
prompt blocks (the ids of its full trace blocks); it then takes the parent's names for the parent's whole prompt. An
engine block is named by the first request of the first-child chain (the request, its first child, ...) whose full
trace blocks cover it (`_chain_names`), so the parent's `output_block_hashes` are its first child's ids over the
blocks the parent's output fills (as far as the child's prompt goes), or a later descendant's where the child's last
trace block is partial. A later child of the same parent shares those output blocks only if its
ids over them are the same. Unlinked children (a prompt that does not extend the parent's) are counted
(`SessionTrace.unlinked`) and replayed as new prompts.

Token identities (SGLang's radix tree) agree with the blocks: a root's prompt is a run per trace block (`(id, n)`,
tokens `(id, 0 .. n - 1)`, the last possibly partial); a linked child's prompt is its parent's runs, then
`(parent.output_key, m)` for the m parent outputs its prompt holds, then runs of its own trace blocks from there
(a block it starts inside is the run `((id, offset), n)`). So parent and child share exactly the tokens whose
blocks they share, plus the parent's partial last block.

Delta formats (`mooncake-delta`) give a turn's new tokens only, and every turn resends its parent's prompt and
output: `prompt_k = prompt_{k-1} + output_{k-1} + delta_k`. A token-granular cache matches from the first token, so
two prompts need to agree on a token exactly when they agree on every token up to it (`Request.token_runs`), and
the runs are few:

    first turn:  | runs of the first turns' trie (`_FirstTurnTrie`): a shared system prompt is one run |
    turn k:      | turn k-1's runs | (output_key of k-1, O) | ((-2, k), delta) |

A later turn's delta follows its parent's output, which no other prompt holds, so it is one run of its own (where a
run per 16-token hash id made a 64k-token context ~4,000 runs); first turns share what their ids share, through the
trie. The block hashes (vLLM's) are hashed from the hash ids' runs as before (`_DeltaHashTail`), so they are
unchanged.

Timing (`timing="closed-loop"`): a first turn is sent at its recorded timestamp; a later turn `gap` seconds after
its parent finished, where gap = `delay_s` when the line records it, else (its timestamp - its parent's timestamp).
The parent's service time is inside that interval, but no format read here records it (the Bailian traces do not),
and estimating it from the simulated cluster would make the think time depend on the cluster studied; so the gap is
the whole interval, an upper bound of the think time. Every gap and timestamp is divided by `speed`.
`timing="recorded"`: every turn is sent at its recorded timestamp (open loop), linked as above.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, replace
from collections.abc import Hashable, Iterator
from pathlib import Path

from sim.workloads.arrival_curve import RateCurve, warp_mean_rps
from sim.workloads.request import Request, computed_block_hashes, context_tokens
from sim.workloads.sessions import Due
from sim.workloads.session_inference import ParentInference, common_block_ids
from sim.workloads.trace_formats import LINE_READERS, MOONCAKE_BLOCK_TOKENS, SESSION_FORMATS, TurnLine, detect_format
from sim.workloads.traces import TraceError, TraceRequest, json_object, open_binary, sub_block_hashes

SESSION_TIMINGS = ("closed-loop", "recorded")
"""How a session trace's turns are timed (`--sessions`)."""


def trace_format(path: str | Path) -> str:
    """The format of the trace at `path`, from the fields of its first line (`detect_format`)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            for line_no, raw in enumerate(f, start=1):
                if raw.strip():
                    return detect_format(json_object(raw, path, line_no))
    except OSError as err:
        raise TraceError(f"{path}: cannot open ({err.strerror})") from None
    raise TraceError(f"{path}: no requests (an empty trace)")


DELTA_FORMATS = ("mooncake-delta",)
"""Formats whose lines hold a turn's new input only (the history is implied)."""


def content_block_hashes(runs: list[tuple[object, int]], block_size: int, num_blocks: int,
                          known: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Chained hashes of the first `num_blocks` full blocks of the tokens `runs`: block i's is the hash of (block
    i - 1's, the pieces of runs that fill it), so two sequences share block i exactly when their tokens agree up to
    its end (a 64-bit hash: a collision is as unlikely as vLLM's). `known`: the hashes of the leading full blocks,
    already computed (a parent's, whose tokens these runs begin with); hashing resumes after them."""
    out: list[int] = list(known[:num_blocks])
    prev: int | None = out[-1] if out else None
    pieces: list[tuple[object, int, int]] = []
    filled = 0
    skip = len(out) * block_size
    for key, n in runs:
        if skip >= n:
            skip -= n
            continue
        offset, skip = skip, 0
        while offset < n and len(out) < num_blocks:
            take = min(block_size - filled, n - offset)
            pieces.append((key, offset, take))
            filled += take
            offset += take
            if filled == block_size:
                prev = hash((prev, tuple(pieces)))
                out.append(prev)
                pieces, filled = [], 0
        if len(out) >= num_blocks:
            break
    return tuple(out)


def own_runs(ids: list[int], start: int, stop: int, tb: int) -> list[tuple[object, int]]:
    """Token runs of prompt tokens [start, stop) from the trace blocks `ids` of `tb` tokens: a run per block, keyed
    by its id, or by (id, offset) for a block entered at `offset` > 0."""
    runs = []
    j = start // tb
    while start < stop:
        hi = min(stop, (j + 1) * tb)
        offset = start - j * tb
        runs.append((ids[j] if offset == 0 else (ids[j], offset), hi - start))
        start, j = hi, j + 1
    return runs


def _tail_runs(runs: list[tuple[object, int]], num_tokens: int) -> list[tuple[object, int]]:
    """The shortest suffix of whole `runs` that holds at least `num_tokens` tokens (all of them if they hold fewer)."""
    total, k = 0, len(runs)
    while k and total < num_tokens:
        k -= 1
        total += runs[k][1]
    return runs[k:]


class _TrieEdge:
    """Prompt tokens [pos, pos + num_tokens) of a path of `_FirstTurnTrie`: tokens [start, start + num_tokens) of
    the run `key` of first turn `owner`. `ids`: the owner's hash ids over the edge's trace blocks, loaded when a
    later turn first reaches the edge (None before: memory holds the ids of shared content only)."""

    __slots__ = ("key", "start", "pos", "num_tokens", "owner", "ids", "children")

    def __init__(self, key: object, start: int, pos: int, num_tokens: int, owner: int) -> None:
        self.key, self.start, self.pos, self.num_tokens, self.owner = key, start, pos, num_tokens, owner
        self.ids: tuple[int, ...] | None = None
        self.children: dict[int, _TrieEdge] = {}
        """The edges from this one's end, by the hash id of the trace block their first token is in."""


class _FirstTurnTrie:
    """The first turns of a delta trace as a compressed trie of their tokens, which gives each the token runs that
    share exactly what its prompt shares with the first turns before it (`token_runs_of_ids` in
    `sim.workloads.shared_prefix` does this for prompts known in advance; here they come one at a time).

    A first turn's tokens are those of its hash ids (trace blocks of `trace_block_tokens`; the last may be
    partial), and two first turns agree on their first t tokens exactly when their ids agree on the blocks those
    tokens are in (every first turn starts at token 0, so their blocks are aligned). The tokens a turn does not
    share with an earlier one are a run of its own, `((-2, i), n)`, from where it departs. An edge is a piece of
    such a run; the nodes are where turns departed, so a turn that follows an earlier one's run joins it at its
    token 0, and a prompt is a run per turn whose path it follows:

        turn 0: ids s1 s2 a1       runs ((-2, 0), 48)                       trie:  -(s1 s2)-+-(a1)
        turn 1: ids s1 s2 b1 b2    runs ((-2, 0), 32) ((-2, 1), 32)                        +-(b1)-+-(b2)
        turn 2: ids s1 s2 b1 c1    runs ((-2, 0), 32) ((-2, 1), 16) ((-2, 2), 16)                 +-(c1)
    """

    def __init__(self, trace: SessionTrace, trace_block_tokens: int) -> None:
        self._trace = trace
        self._tb = trace_block_tokens
        self._root: dict[int, _TrieEdge] = {}

    def _edge_ids(self, handle, edge: _TrieEdge) -> tuple[int, ...]:
        """The owner's ids over the edge's trace blocks (read from its line the first time)."""
        if edge.ids is None:
            tb = self._tb
            ids = self._trace._line(handle, edge.owner).hash_ids
            edge.ids = tuple(ids[edge.pos // tb:(edge.pos + edge.num_tokens - 1) // tb + 1])
        return edge.ids

    def runs(self, handle, i: int, ids: list[int], num_tokens: int) -> list[tuple[object, int]]:
        """First turn `i`'s token runs (its hash ids `ids`, `num_tokens` tokens); the turn joins the trie."""
        tb = self._tb
        children, pos = self._root, 0
        runs: list[tuple[object, int]] = []
        while pos < num_tokens:
            edge = children.get(ids[pos // tb])
            if edge is None:
                break
            # NOTE: the blocks of tokens [pos, end) in both; the first is equal (the edge's key in `children`).
            first = pos // tb
            end = min(num_tokens, pos + edge.num_tokens)
            k = _common_prefix(ids, first, self._edge_ids(handle, edge), (end - 1) // tb + 1 - first)
            stop = min(end, (first + k) * tb)
            if runs and runs[-1][0] == edge.key:
                key, n = runs[-1]
                runs[-1] = (key, n + stop - pos)
            else:
                runs.append((edge.key, stop - pos))
            if runs[-1][1] != edge.start + stop - pos:
                raise RuntimeError(f"first turn {i} joins run {edge.key} at token {edge.start}, not at its start")
            if stop < pos + edge.num_tokens:  # ends or departs inside the edge
                if stop == num_tokens:
                    return runs
                children = self._split(edge, stop)
                pos = stop
                break
            children, pos = edge.children, stop
        if pos < num_tokens:
            children[ids[pos // tb]] = _TrieEdge((-2, i), 0, pos, num_tokens - pos, i)
            runs.append(((-2, i), num_tokens - pos))
        return runs

    def _split(self, edge: _TrieEdge, at: int) -> dict[int, _TrieEdge]:
        """`edge` ends at token `at` (a trace block boundary inside it) and the rest becomes its only child (its ids
        not loaded: no one shares them yet); returns the edge's children, for the departing turn's edge."""
        tb = self._tb
        rest = _TrieEdge(edge.key, edge.start + at - edge.pos, at, edge.pos + edge.num_tokens - at, edge.owner)
        rest.children = edge.children
        cut = at // tb - edge.pos // tb  # blocks of the edge before `at`
        rest_first_id = edge.ids[cut]
        edge.ids = edge.ids[:cut]
        edge.num_tokens = at - edge.pos
        edge.children = {rest_first_id: rest}
        return edge.children


def _common_prefix(a: list[int], start: int, b: tuple[int, ...], m: int) -> int:
    """How many of `a[start:start + m]` and `b[:m]` are equal from the first (>= 1: the first are), by bisection
    over slice comparisons, which run in C."""
    if tuple(a[start:start + m]) == b[:m]:
        return m
    lo, hi = 1, m  # a[start:start + lo] == b[:lo], a[start:start + hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(a[start + lo:start + mid]) == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SessionTrace:
    """A session trace file indexed for replay (see the module docstring). Build it once, then iterate
    `sessions()` (closed loop) or `recorded()` (open loop); each may be iterated once per replay."""

    def __init__(self, path: str | Path, *, block_size: int, fmt: str | None = None,
                 trace_block_tokens: int | None = None, speed: float = 1.0, limit: int | None = None,
                 infer_common_requests: int | None = None) -> None:
        self.path = Path(path)
        self.format = fmt or trace_format(self.path)
        self.inference: ParentInference | None = None
        """With `infer_common_requests` K, a Mooncake trace's parents are inferred from its hash ids
        (`sim.workloads.session_inference`); `inference.counts` says what it did."""
        if infer_common_requests is not None:
            if self.format != "mooncake":
                raise TraceError(f"{self.path}: sessions are inferred for Mooncake traces without session ids; this "
                                 f"trace is {self.format}, whose turns name their parent or session")
            self.inference = ParentInference(common_block_ids(self.path, infer_common_requests, limit),
                                             infer_common_requests, trace_block_tokens or MOONCAKE_BLOCK_TOKENS)
        elif self.format == "agentic-mooncake":
            raise TraceError(f"{self.path}: agentic-mooncake traces are read by sim.workloads.agentic_traces")
        elif self.format not in SESSION_FORMATS:
            raise TraceError(f"{self.path}: format {self.format!r} has no sessions; session formats: "
                             f"{', '.join(SESSION_FORMATS)} (or infer them from a Mooncake trace's hash ids)")
        if speed <= 0:
            raise TraceError(f"speed must be > 0, got {speed}")
        self.block_size = block_size
        self.speed = speed
        self.offsets = array("q")
        self.line_nos = array("q")
        self.timestamps_s = array("d")
        """Recorded send times (NaN: not recorded)."""
        self.delays_s = array("d")
        """Recorded gaps after the parent's finish (NaN: not recorded)."""
        self.parents = array("q")
        self.first_child = array("q")
        self.next_sibling = array("q")
        self.orphans = 0
        """Turns whose parent is not in the file (it came before the trace's window): replayed as first turns."""
        self.unlinked = 0
        """Children whose prompt does not extend their parent's (counted as they are built)."""
        self.trace_block_tokens = self._index(trace_block_tokens, limit)
        if self.trace_block_tokens % block_size:
            raise TraceError(f"engine block size {block_size} must divide the trace's block size "
                             f"{self.trace_block_tokens}")
        self._per_block = self.trace_block_tokens // block_size
        self._first_turns = _FirstTurnTrie(self, self.trace_block_tokens)
        """Delta formats: the first turns' prompts, for their token runs."""
        self._hash_tails: dict[int, list[tuple[object, int]]] = {}
        """Delta formats: per built request whose child is not built yet, the hash ids' runs of its prompt's last
        `block_size` tokens or more (whole runs), which the child's first unknown block may need."""
        self.warp_curve: RateCurve | None = None
        """With `warp`: the arrival curve the sent times are warped onto (`sim.workloads.arrival_curve`)."""
        self.warp_mean_rps = 0.0
        """With `warp`: the trace's own mean rate r̄ of the times warped (t -> Λ⁻¹(r̄·t))."""

    def warp(self, curve: RateCurve, *, timing: str) -> float:
        """Warp the sent times onto `curve` (t -> Λ⁻¹(r̄·t), `sim.workloads.arrival_curve.warp_trace`) and return r̄:
        closed loop, the sessions' starts (their first turns' times; later turns still follow their parents after
        the recorded gaps), r̄ = sessions / last start; recorded, every turn's time, r̄ = turns / last time."""
        roots = range(len(self)) if timing == "recorded" else [i for i in range(len(self)) if self.parents[i] < 0]
        times = [self.timestamps_s[i] / self.speed for i in roots]
        missing = next((i for i, t in zip(roots, times) if math.isnan(t)), None)
        if missing is not None:
            raise TraceError(f"{self.path}:{self.line_nos[missing]}: --arrival-curve warps recorded times; this "
                             f"{'turn' if timing == 'recorded' else 'first turn'} has none")
        try:
            self.warp_mean_rps = warp_mean_rps(curve, len(times), max(times),
                                               unit="turns" if timing == "recorded" else "sessions")
        except ValueError as err:
            raise TraceError(f"{self.path}: {err}") from None
        self.warp_curve = curve
        return self.warp_mean_rps

    def __len__(self) -> int:
        return len(self.offsets)

    def _index(self, block_tokens: int | None, limit: int | None) -> int:
        read_line = LINE_READERS[self.format]
        index: dict[object, int] = {}
        last_child: dict[int, int] = {}
        last_in_session: dict[object, int] = {}
        """For formats whose turns name their session (mooncake-sessions, mooncake-delta): each session's last turn
        so far."""
        last_ts_in_session: dict[object, float] = {}
        """... and the timestamp of its last turn that had one (the mocker derives a delay from it)."""
        last_root_ts = -math.inf
        path = self.path
        handle = open_binary(path)
        with handle:
            offset = 0
            for line_no, raw in enumerate(handle, start=1):
                start, offset = offset, offset + len(raw)
                if limit is not None and len(self.offsets) >= limit:
                    break
                if not raw.strip():
                    continue
                turn = read_line(json_object(raw, path, line_no), path, line_no, block_tokens)
                block_tokens = turn.block_tokens
                if turn.key in index:
                    raise TraceError(f"{path}:{line_no}: id {turn.key!r} repeats line "
                                     f"{self.line_nos[index[turn.key]]}'s")
                i = len(self.offsets)
                index[turn.key] = i
                parent = -1 if turn.parent_key is None else index.get(turn.parent_key, -1)
                if self.inference is not None:
                    parent = self.inference.parent(i, turn.hash_ids, turn.input_length,
                                                   lambda p: self.first_child[p] >= 0)
                elif turn.session_key is not None:
                    key = turn.session_key
                    parent = last_in_session.get(key, -1)
                    turn = self._session_turn(turn, parent, last_ts_in_session.get(key), path, line_no)
                    last_in_session[key] = i
                    if turn.timestamp_s is not None:
                        last_ts_in_session[key] = turn.timestamp_s
                if turn.parent_key is not None and parent < 0:
                    self.orphans += 1
                    if turn.timestamp_s is None:
                        raise TraceError(f"{path}:{line_no}: parent {turn.parent_key!r} is not an earlier line, "
                                         "and without it this turn needs a timestamp")
                ts = math.nan if turn.timestamp_s is None else turn.timestamp_s
                if parent < 0:
                    if ts < last_root_ts:
                        raise TraceError(f"{path}:{line_no}: first turns must be in timestamp order ({ts} after "
                                         f"{last_root_ts})")
                    last_root_ts = ts
                elif turn.delay_s is None and math.isnan(self.timestamps_s[parent]):
                    raise TraceError(f"{path}:{line_no}: its parent (line {self.line_nos[parent]}) has no timestamp, "
                                     "so this turn needs delay_s")
                elif not math.isnan(ts) and ts < self.timestamps_s[parent]:
                    raise TraceError(f"{path}:{line_no}: timestamp {ts} is before its parent's "
                                     f"({self.timestamps_s[parent]}, line {self.line_nos[parent]})")
                self.offsets.append(start)
                self.line_nos.append(line_no)
                self.timestamps_s.append(ts)
                self.delays_s.append(math.nan if turn.delay_s is None else turn.delay_s)
                self.parents.append(parent)
                self.first_child.append(-1)
                self.next_sibling.append(-1)
                if parent >= 0:
                    if parent in last_child:
                        self.next_sibling[last_child[parent]] = i
                    else:
                        self.first_child[parent] = i
                    last_child[parent] = i
        if not self.offsets:
            raise TraceError(f"{path}: no requests (an empty trace)")
        return block_tokens

    @staticmethod
    def _session_turn(turn: TurnLine, previous: int, last_ts: float | None, path: Path, line_no: int) -> TurnLine:
        """A turn of a format that names sessions (mooncake-sessions, mooncake-delta), with its times as Dynamo's
        mocker derives them: a first turn at its timestamp (0 without one; no delay); a later one `delay` after
        its predecessor's completion, or, without a delay, its timestamp minus `last_ts`, the timestamp of the
        session's last turn that had one (0 when either is missing)."""
        if previous < 0:
            if turn.delay_s:
                raise TraceError(f"{path}:{line_no}: field 'delay' must be 0 on a session's first turn, got "
                                 f"{turn.delay_s * 1000:g} ms")
            return replace(turn, timestamp_s=turn.timestamp_s or 0.0, delay_s=None)
        delay = turn.delay_s
        if delay is None:
            delay = 0.0 if turn.timestamp_s is None or last_ts is None else turn.timestamp_s - last_ts
            if delay < 0:
                raise TraceError(f"{path}:{line_no}: field 'timestamp' ({turn.timestamp_s * 1000:g} ms) is before its "
                                 f"session's previous one ({last_ts * 1000:g} ms)")
        return replace(turn, delay_s=delay)

    # -- the index's questions --------------------------------------------------------------------------------

    def children(self, i: int) -> Iterator[int]:
        """Request `i`'s children, in file order."""
        c = self.first_child[i]
        while c >= 0:
            yield c
            c = self.next_sibling[c]

    def start_s(self, i: int) -> float:
        """When request `i` is sent in a recorded replay, or session `i` starts (its timestamp / speed; warped onto
        the curve after `warp`)."""
        t = self.timestamps_s[i] / self.speed
        return t if self.warp_curve is None else self.warp_curve.inverse(self.warp_mean_rps * t)

    def gap_s(self, i: int) -> float:
        """The closed-loop delay of child `i` after its parent finished (module docstring), over speed."""
        delay = self.delays_s[i]
        if math.isnan(delay):
            delay = self.timestamps_s[i] - self.timestamps_s[self.parents[i]]
        return delay / self.speed

    def parent_of(self, i: int) -> int | None:
        """Request `i`'s parent's request id (None: a first turn)."""
        p = self.parents[i]
        return None if p < 0 else p

    def shape(self) -> SessionShape:
        """How many sessions, how many turns each, and the quantiles of the gaps (for a report; N numbers)."""
        root = array("q", range(len(self)))
        for i, p in enumerate(self.parents):
            if p >= 0:
                root[i] = root[p]
        sizes = Counter(Counter(root).values())
        gaps = sorted(self.gap_s(i) for i in range(len(self)) if self.parents[i] >= 0)
        quantiles = {q: gaps[min(len(gaps) - 1, len(gaps) * q // 100)] for q in (5, 50, 95)} if gaps else {}
        return SessionShape(sum(sizes.values()), dict(sorted(sizes.items())), quantiles)

    # -- building requests ------------------------------------------------------------------------------------

    def _line(self, handle, i: int) -> TurnLine:
        handle.seek(self.offsets[i])
        line_no = self.line_nos[i]
        return LINE_READERS[self.format](json_object(handle.readline(), self.path, line_no), self.path, line_no,
                                         self.trace_block_tokens)

    def _build(self, handle, i: int, parent: Request | None) -> Request:
        """Request `i` (see the module docstring for its hashes, output blocks and token runs)."""
        B, tb = self.block_size, self.trace_block_tokens
        turn = self._line(handle, i)
        if self.format in DELTA_FORMATS:
            return self._build_delta(handle, turn, i, parent)
        ids, n_in, n_out = turn.hash_ids, turn.input_length, turn.output_length
        hashes = sub_block_hashes(ids, self._per_block, n_in // B)
        output_hashes: tuple = ()
        output_key = None
        if self.first_child[i] >= 0:
            names, child_tokens = self._chain_names(handle, i, turn, (n_in + n_out) // B)
            # NOTE: an engine block inside this prompt's partial last trace block takes a descendant's id (the
            # partial block's own id names fewer tokens), so that the child's prefix matches this prompt's.
            hashes = tuple(names[: n_in // B]) + hashes[len(names):]
            if child_tokens:
                output_hashes = tuple(names[n_in // B: min(n_in + n_out, child_tokens) // B])
                output_key = ("out", i)
        runs: list = []
        context = 0
        session_id, depth = i, 0
        if parent is not None:
            session_id, depth = parent.session_id, parent.turn + 1
            P, O = parent.prompt_tokens, parent.output_tokens
            pb = len(parent.block_hashes)
            full = P // tb
            if n_in >= P and ids[:full] == self._line(handle, parent.request_id).hash_ids[:full]:
                # NOTE: linked on the ids of the parent's full trace blocks; the child then takes the parent's names
                # for the parent's whole prompt: the engine blocks inside the parent's partial last trace block are
                # named by a descendant's ids (`_chain_names`), not necessarily this child's (a second child), and
                # the child resends the parent's prompt all the same.
                hashes = parent.block_hashes + hashes[pb:]
                runs = list(parent.token_runs)
                m = min(O, n_in - P)
                end = (P + m) // B
                out = parent.output_block_hashes
                # NOTE: the output blocks a descendant names must agree; the rest of the output the child holds lies
                # inside its own partial last trace block (no later turn named it), which the ids cannot deny.
                named = min(len(out), end - pb)
                if parent.output_key is not None and (named or end == pb) and hashes[pb:pb + named] == out[:named]:
                    runs.append((parent.output_key, m))
                    own_from = P + m
                else:
                    own_from = P
                runs += own_runs(ids, own_from, n_in, tb)
                context = context_tokens(hashes, n_in, computed_block_hashes(parent, B), B)
            else:
                self.unlinked += 1
        if not runs:
            runs = own_runs(ids, 0, n_in, tb)
        return Request(
            request_id=i, prompt_tokens=n_in, output_tokens=n_out, block_hashes=hashes, num_shareable_tokens=0,
            prefix_id=ids[0] if ids else None, token_runs=tuple(runs), session_id=session_id, turn=depth,
            output_block_hashes=output_hashes, output_key=output_key, num_context_tokens=context,
        )

    def _chain_names(self, handle, i: int, turn: TurnLine, num_blocks: int) -> tuple[list[Hashable], int]:
        """The names of the first `num_blocks` engine blocks of request `i`'s prompt and output, and its first child's
        prompt tokens (0: no linked child). Block q is named by the first request of `i`'s first-child chain
        (`i`, its first child, that one's first child, ...) whose **full** trace blocks cover it, as the chain's
        ids agree on what they share: a partial trace block's id names fewer tokens than the full block a later
        turn has at the same place. The walk stops where the chain does, or at a child whose prompt does not extend
        its parent's full trace blocks; blocks past it stay unnamed here."""
        tb, k = self.trace_block_tokens, self._per_block
        names: list[Hashable] = []
        child_tokens = 0
        member, idx = turn, i
        while member is not None:
            covered = min(num_blocks, member.input_length // tb * k)
            ids = member.hash_ids
            # NOTE: the keys the prompt's own blocks take (`sub_block_hashes`, a repeated id included), from where
            # the names so far end
            names.extend(sub_block_hashes(ids, k, covered)[len(names):])
            c = self.first_child[idx]
            if c < 0 or (len(names) >= num_blocks and idx != i):
                break
            line = self._line(handle, c)
            full = member.input_length // tb
            if line.input_length < member.input_length or line.hash_ids[:full] != ids[:full]:
                break
            if idx == i:
                child_tokens = line.input_length
            member, idx = line, c
        return names, child_tokens

    def _build_delta(self, handle, turn: TurnLine, i: int, parent: Request | None) -> Request:
        """Request `i` of a delta format: its prompt is its parent's prompt, the parent's output, then its own new
        tokens, and its blocks are named by their content (`content_block_hashes` of the runs of its ids, at
        whatever offset the history ends), as Dynamo's mocker hashes the tokens it synthesises. Its token runs are
        few (module docstring)."""
        B, tb = self.block_size, self.trace_block_tokens
        ids, n_new, n_out = turn.hash_ids, turn.input_length, turn.output_length
        own = own_runs(ids, 0, n_new, tb)
        output_key = (-1, i)  # NOTE: no str in a hashed key: str hashes change from process to process
        if parent is None:
            session_id, depth, context, prefix_id = i, 0, 0, ids[0]
            n_in = n_new
            runs = self._first_turns.runs(handle, i, ids, n_new)
            hashed = own  # the hash ids' runs of the prompt (what its blocks hash), from the first token
            blocks = content_block_hashes([*own, (output_key, n_out)], B, (n_in + n_out) // B)
        else:
            session_id, depth, prefix_id = parent.session_id, parent.turn + 1, parent.prefix_id
            P, O = parent.prompt_tokens, parent.output_tokens
            n_in = P + O + n_new
            runs = [*parent.token_runs, (parent.output_key, O), ((-2, i), n_new)]
            # NOTE: this prompt begins with the tokens the parent hashed (its prompt and output): its blocks are
            # the parent's, so only the rest is hashed (a turn of a 64k-token session hashes its delta, not 4,000
            # blocks of history). The first block after them may begin in the parent's prompt: the hash ids' runs
            # of the prompt's last B tokens or more (`_hash_tails`) give it the pieces it always had, the runs
            # before them only their length (skipped).
            known = parent.block_hashes + parent.output_block_hashes
            tail = self._hash_tails.pop(parent.request_id)
            if len(known) != (P + O) // B:
                raise RuntimeError(f"request {parent.request_id}: {len(known)} prompt and output block hashes for "
                                   f"{P + O} tokens in blocks of {B}")
            hashed = [*tail, (parent.output_key, O), *own]
            before = P - sum(n for _, n in tail)
            blocks = content_block_hashes([(None, before), *hashed, (output_key, n_out)], B, (n_in + n_out) // B,
                                          known)
            context = min((P + O - 1) // B, (n_in - 1) // B) * B
        if self.first_child[i] >= 0:
            self._hash_tails[i] = _tail_runs(hashed, B)
        return Request(
            request_id=i, prompt_tokens=n_in, output_tokens=n_out, block_hashes=blocks[: n_in // B],
            num_shareable_tokens=0, prefix_id=prefix_id, token_runs=tuple(runs),
            session_id=session_id, turn=depth, output_block_hashes=blocks[n_in // B:] if self.first_child[i] >= 0
            else (), output_key=output_key, num_context_tokens=context,
        )

    # -- replays ----------------------------------------------------------------------------------------------

    def sessions(self) -> Iterator[_TraceSession]:
        """The sessions in start order, for `sim.cluster.arrivals.sessions` (closed loop)."""
        # NOTE: not closed when the last session is drawn (its turns are still being built from it): the sessions
        # hold the handle, and it closes when the last of them is dropped.
        handle = self.path.open("rb")
        for i in range(len(self)):
            if self.parents[i] < 0:
                yield _TraceSession(self, handle, i)

    def recorded(self) -> Iterator[TraceRequest]:
        """Every request at its recorded time, in file order (open loop), linked as in a closed-loop replay."""
        for i in range(len(self)):
            if math.isnan(self.timestamps_s[i]):
                raise TraceError(f"{self.path}:{self.line_nos[i]}: --sessions recorded needs every turn's "
                                 f"timestamp ({'timestamp_s' if self.format == 'kvsim' else 'timestamp'}; this one has none)")
        waiting: dict[int, list] = {}
        """Built requests whose children are not built yet: [request, children left]."""
        with self.path.open("rb") as handle:
            last_s = -math.inf
            for i in range(len(self)):
                p = self.parents[i]
                parent = None
                if p >= 0:
                    entry = waiting[p]
                    parent = entry[0]
                    entry[1] -= 1
                    if entry[1] == 0:
                        del waiting[p]
                request = self._build(handle, i, parent)
                n_children = sum(1 for _ in self.children(i))
                if n_children:
                    waiting[i] = [request, n_children]
                at_s = self.start_s(i)
                if at_s < last_s:
                    raise TraceError(f"{self.path}:{self.line_nos[i]}: --sessions recorded needs timestamps in file "
                                     f"order ({self.timestamps_s[i]} after {last_s * self.speed})")
                last_s = at_s
                yield TraceRequest(at_s, request)


@dataclass(frozen=True, slots=True)
class SessionShape:
    """A session trace's sessions, as linked (`SessionTrace.shape`)."""

    sessions: int
    sizes: dict[int, int]
    """Turns per session -> sessions of that many turns."""
    gap_quantiles_s: dict[int, float]
    """Percentile (5, 50, 95) -> the closed-loop gap of the later turns at it, in seconds (over speed)."""


class _TraceSession:
    """One session of a `SessionTrace` (the `Session` protocol): its first turn at its timestamp, then each turn
    its parent's completion makes due, after its gap."""

    __slots__ = ("trace", "handle", "root", "session_id", "start_s")

    def __init__(self, trace: SessionTrace, handle, root: int) -> None:
        self.trace, self.handle, self.root = trace, handle, root
        self.session_id = root
        self.start_s = trace.start_s(root)

    def first(self) -> list[Due]:
        return [(self.trace._build(self.handle, self.root, None), 0.0)]

    def after(self, done: Request, now_s: float) -> list[Due]:
        trace = self.trace
        return [(trace._build(self.handle, c, done), trace.gap_s(c)) for c in trace.children(done.request_id)]

