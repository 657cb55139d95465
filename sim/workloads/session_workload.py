"""A sessions workload (`SessionsSpec`) as a `SessionSource`: chats and agent loops, seed-determined and lazy.

Each session is a `TokenSequence` under its own lineage, started from its group's system prompt, and every request is
built by `TokenSequence.request` when it is due (so a source of thousands of sessions holds only the running ones'
state):

    turn t prompt:  | system (group g) | msg 0 | out 0 | msg 1 | out 1 | ... | msg t |      then out t is appended
    after a subagent forked at turn t:  msg t + 1 = | tool result | subagent's result |

Segment keys are `("s", session_id, turn, role)`, role one of `user` (a chat's message), `task` (an agent's or a
subagent's first message), `tool` (a tool's result), `result` (a subagent's result, returned into its agent), `out`
(the model's output) and `summary` (a compaction's); the system prompt's key is `("system", group)` and a lineage is
`("s", session_id, rewrites)`, so a truncation or compaction (a rewrite) breaks the prefix after the system prompt.

A subagent is a session of its own (its requests carry its own `session_id`, numbered from `num_sessions` on in the
order subagents start; turns from 0), forked (`TokenSequence.fork`) from its agent's sequence right after the turn
that starts it: its first prompt is the agent's context plus its task. The agent's next turn is due when both its
tool's latency has passed and the subagent has finished; it appends the tool's result and the subagent's result (its
last turn's output, `subagent_result_tokens` long). Subagents start no subagents.

Randomness: a session's start time (Poisson at `session_rate_per_s`, or at the `arrival_curve`'s rate by
time-rescaling, `sim.workloads.arrival_curve`), group and number of turns come from the streams `session-starts`,
`session-groups` and `session-turns`, drawn in session order; every per-turn draw comes from the session's own
stream per distribution (`user-tokens:K`, `output-tokens:K`, `gaps:K`, `subagents:K`, `summaries:K`; a subagent
forked at turn t of session K has path `K/t` and draws its turns from `subagent-turns:K/t` and its result length from
`subagent-results:K/t`). So changing one distribution leaves every other draw alone, and what a session sends does not
depend on when its turns complete (only request ids and subagents' session ids follow the simulation's order).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate

from sim.workloads.arrival_curve import arrival_times_s
from sim.workloads.request import Request
from sim.workloads.session_spec import SessionsSpec, sample_seconds
from sim.workloads.sessions import Due
from sim.workloads.sequence import TokenSequence
from sim.workloads.shared_prefix import rng_for
from sim.workloads.spec import sample_length

Segment = tuple[tuple, int]


class _Ids:
    """Request ids and subagents' session ids of one pass over a source, in the order they are needed."""

    __slots__ = ("next_request", "next_session")

    def __init__(self, first_subagent_session: int) -> None:
        self.next_request = 0
        self.next_session = first_subagent_session

    def request(self) -> int:
        self.next_request += 1
        return self.next_request - 1

    def session(self) -> int:
        self.next_session += 1
        return self.next_session - 1


class _Thread:
    """One lineage's conversation: its sequence, its turns so far as chunks of segments (after the system prompt),
    and its own random streams (`path`: the session's index, or `K/t` for a subagent)."""

    __slots__ = ("seq", "session_id", "path", "turns", "turn", "chunks", "rewrites", "user", "output", "gap",
                 "subagent", "summary", "result_tokens")

    def __init__(self, seq: TokenSequence, session_id: int, path: str, turns: int, seed: int,
                 chunks: list[list[Segment]] | None = None) -> None:
        self.seq = seq
        self.session_id = session_id
        self.path = path
        self.turns = turns
        self.turn = 0
        self.chunks: list[list[Segment]] = chunks if chunks is not None else []
        self.rewrites = 0
        self.user = rng_for(seed, f"user-tokens:{path}")
        self.output = rng_for(seed, f"output-tokens:{path}")
        self.gap = rng_for(seed, f"gaps:{path}")
        self.subagent: random.Random | None = None
        self.summary: random.Random | None = None
        self.result_tokens = 0
        """A subagent's result length (its last turn's output); 0 for a session."""


class SessionWorkload:
    """The sessions of `spec` in start order (a `SessionSource`), for engines at `block_size`, drawn from `seed`.

    Every pass (`iter`) gives the same sessions; request ids count from 0 in each pass, in the order requests are
    built."""

    def __init__(self, spec: SessionsSpec, *, block_size: int, seed: int) -> None:
        self.spec = spec
        self.block_size = block_size
        self.seed = seed
        lengths = rng_for(seed, "system-lengths")
        self.system_tokens = [sample_length(spec.system_tokens, lengths) for _ in range(spec.groups)]
        """Each group's system prompt length (tokens), drawn once per group."""
        self._curve_starts_s: list[float] | None = None
        if spec.arrival_curve is not None and spec.duration_s is not None:
            self._curve_starts_s = list(self._curve_starts(until_s=spec.duration_s))
        self.num_sessions = spec.sessions if spec.sessions is not None else len(self._curve_starts_s)
        """Sessions in a pass (subagents not counted): `sessions`, or the curve's starts in [0, duration_s)."""

    def _curve_starts(self, *, until_s: float | None = None, limit: int | None = None) -> Iterator[float]:
        """The start times of an `arrival_curve` workload (stream `session-starts`)."""
        return arrival_times_s(self.spec.arrival_curve.curve(), rng_for(self.seed, "session-starts"),
                               until_s=until_s, limit=limit)

    def __iter__(self) -> Iterator[_Session]:
        spec = self.spec
        ids = _Ids(self.num_sessions)
        starts, groups, turns = (rng_for(self.seed, name) for name in
                                 ("session-starts", "session-groups", "session-turns"))
        cum_weights = list(accumulate(spec.popularity_weights()))
        start_s = 0.0
        curve_starts: Iterator[float] | None = None
        if self._curve_starts_s is not None:
            curve_starts = iter(self._curve_starts_s)
        elif spec.arrival_curve is not None:
            curve_starts = self._curve_starts(limit=self.num_sessions)
        for k in range(self.num_sessions):
            if curve_starts is not None:
                start_s = next(curve_starts, None)
                if start_s is None:
                    return  # NOTE: a curve that ends at rate 0 may bring fewer starts than `sessions`
            elif spec.session_rate_per_s is not None:
                start_s += starts.expovariate(spec.session_rate_per_s)
            group = bisect_right(cum_weights, groups.random() * cum_weights[-1], 0, spec.groups - 1)
            yield _Session(self, ids, k, start_s, group, sample_length(spec.turns, turns))


class _Session:
    """One session's plan (a `Session`): its main thread and, while one runs, the subagent it waits for."""

    __slots__ = ("source", "ids", "session_id", "start_s", "group", "turns", "main", "child", "ready_s", "__weakref__")

    def __init__(self, source: SessionWorkload, ids: _Ids, index: int, start_s: float, group: int,
                 turns: int) -> None:
        self.source = source
        self.ids = ids
        self.session_id = index
        self.start_s = start_s
        self.group = group
        self.turns = turns
        self.main: _Thread | None = None
        self.child: _Thread | None = None
        self.ready_s = 0.0
        """When the main thread's tool finishes, while a subagent runs (its next turn waits for both)."""

    def first(self) -> list[Due]:
        source = self.source
        system = source.system_tokens[self.group]
        seq = TokenSequence(("s", self.session_id, 0), block_size=source.block_size,
                            system_key=("system", self.group) if system else None, system_tokens=system)
        main = self.main = _Thread(seq, self.session_id, str(self.session_id), self.turns, source.seed)
        first = "task" if source.spec.style == "agent" else "user"
        return [(self._turn(main, [(first, sample_length(source.spec.user_tokens, main.user))]), 0.0)]

    def after(self, done: Request, now_s: float) -> list[Due]:
        spec = self.source.spec
        main = self.main
        child = self.child
        if child is not None and done.session_id == child.session_id:
            if child.turn < child.turns:
                gap = sample_seconds(spec.tool_latency_s, child.gap)
                return [(self._turn(child, [("tool", sample_length(spec.user_tokens, child.user))]), gap)]
            self.child = None
            messages = [("tool", sample_length(spec.user_tokens, main.user)), ("result", child.result_tokens)]
            return [(self._turn(main, messages), max(0.0, self.ready_s - now_s))]
        if main.turn >= main.turns:
            return []
        gap = sample_seconds(spec.think_time_s if spec.style == "chat" else spec.tool_latency_s, main.gap)
        if spec.has_subagents:
            if main.subagent is None:
                main.subagent = rng_for(self.source.seed, f"subagents:{main.path}")
            if main.subagent.random() < spec.subagent_probability:
                self.ready_s = now_s + gap
                child = self.child = self._fork(main)
                return [(self._turn(child, [("task", sample_length(spec.user_tokens, child.user))]), 0.0)]
        role = "user" if spec.style == "chat" else "tool"
        return [(self._turn(main, [(role, sample_length(spec.user_tokens, main.user))]), gap)]

    def _fork(self, parent: _Thread) -> _Thread:
        """A subagent forked from `parent` as it stands (right after the turn that starts it)."""
        source, spec = self.source, self.source.spec
        sid = self.ids.session()
        path = f"{parent.path}/{parent.turn - 1}"
        turns = sample_length(spec.subagent_turns, rng_for(source.seed, f"subagent-turns:{path}"))
        child = _Thread(parent.seq.fork(("s", sid, 0)), sid, path, turns, source.seed, chunks=list(parent.chunks))
        child.result_tokens = sample_length(spec.subagent_result_tokens, rng_for(source.seed,
                                                                                 f"subagent-results:{path}"))
        return child

    def _turn(self, thread: _Thread, messages: list[tuple[str, int]]) -> Request:
        """The thread's next request: its messages appended (the history rewritten first if prompt + output would
        pass the context limit), then sent; its output is appended to the sequence."""
        spec = self.source.spec
        sid, t, seq = thread.session_id, thread.turn, thread.seq
        last = t == thread.turns - 1
        output_tokens = (thread.result_tokens if thread.result_tokens and last
                         else sample_length(spec.output_tokens, thread.output))
        chunk = [(("s", sid, t, role), n) for role, n in messages if n > 0]
        for key, n in chunk:
            seq.append(key, n)
        limit = spec.context_limit_tokens
        if limit is not None and seq.length + output_tokens > limit:
            self._fit(thread, chunk, output_tokens, limit)
        output_key = ("s", sid, t, "out")
        request = seq.request(self.ids.request(), output_tokens=output_tokens, output_key=output_key,
                              session_id=sid, turn=t, prefix_id=self.group)
        chunk.append((output_key, output_tokens))
        thread.chunks.append(chunk)
        thread.turn += 1
        return request

    def _fit(self, thread: _Thread, chunk: list[Segment], output_tokens: int, limit: int) -> None:
        """Rewrite the thread's history so that prompt + output fit `limit`: truncate drops the oldest turns (the
        system prompt stays) until it fits; compact replaces them all by a summary. Either way under a new lineage,
        so the prompt shares only the system prompt with what was cached."""
        spec = self.source.spec
        seq = thread.seq
        thread.rewrites += 1
        lineage = ("s", thread.session_id, thread.rewrites)
        fixed = seq.system_tokens + sum(n for _, n in chunk) + output_tokens
        if spec.on_context_limit == "truncate":
            kept = thread.chunks
            total = sum(n for c in kept for _, n in c)
            while kept and fixed + total > limit:
                total -= sum(n for _, n in kept[0])
                kept = kept[1:]
            thread.chunks = kept
        else:
            if thread.summary is None:
                thread.summary = rng_for(self.source.seed, f"summaries:{thread.path}")
            summary = sample_length(spec.compact_summary_tokens, thread.summary)
            thread.chunks = [[(("s", thread.session_id, thread.turn, "summary"), summary)]]
        # NOTE: the spec's context_limit_tokens holds a system prompt, a summary, a message and an output, so the
        # rewritten prompt fits; an impossible state here is a bug of that check.
        keep = [segment for c in thread.chunks for segment in c] + chunk
        seq.rewrite(lineage, keep)
        if seq.length + output_tokens > limit:
            raise RuntimeError(f"session {thread.session_id} turn {thread.turn}: {seq.length} + {output_tokens} "
                               f"tokens after a rewrite still exceed context_limit_tokens {limit}")
