"""Sessions: chats whose every turn resends the history, agents whose loop appends a tool result and calls the model
again, subagents forked from a parent's context. What decides their hit rate is whether the next turn finds the
previous turn's prompt and output still cached where it is sent, so a session's requests are not a flat stream: each
is due only when the ones before it have completed, plus a think time or tool latency.

A `SessionSource` yields `Session`s in start order; the session driver (`sim.cluster.arrivals.sessions`) starts
each one (at `start_s`, or as a slot frees when a fixed number of sessions run at once), sends what
`Session.first()` returns, and on every completion of one of its requests sends what `Session.after()` returns, each
after its delay. Requests are built when they are due, so a source of thousands of long sessions holds only the
state of the sessions running.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from sim.workloads.request import Request

Due = tuple[Request, float]
"""A request and its delay (seconds) from now before it is sent (a think time, a tool's latency, a recorded gap)."""


class Session(Protocol):
    """One session's plan. Its requests are `Request`s with `session_id` set and `turn` counting from 0; a request
    that continues an earlier one's sequence shares its prompt and output blocks (`Request.output_block_hashes`,
    `output_key`).

    Contract: `first()` is called once, when the session starts; `after(done, now_s)` once per completed request of
    the session, in completion order. The session has ended when it has nothing in flight and `after` returned
    nothing."""

    session_id: int
    start_s: float
    """When the session starts (its first requests are sent), in seconds from the start of the run or replay."""

    def first(self) -> list[Due]:
        """The requests sent when the session starts (usually one: its first turn)."""
        ...

    def after(self, done: Request, now_s: float) -> list[Due]:
        """The requests that `done`'s completion (at `now_s`) makes due: the next turn, subagents forked from it,
        the parent's turn a finished subagent returns into; none while others of the session are still awaited."""
        ...


class SessionSource(Protocol):
    """Sessions in start order (non-decreasing `start_s`), lazily."""

    def __iter__(self) -> Iterator[Session]: ...
