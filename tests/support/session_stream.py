"""Hand-made session streams for router tests (issue 24's session workloads are built elsewhere): sessions of a few
turns whose prompts extend each other, and a closed-loop driver that sends a session's next turn once the previous one
has finished plus a think time.

Session `s` of system-prompt group `g`, block size B (all lengths multiples of B). Turn t's prompt is

    | system prompt (group g) | user 0 | output 0 | user 1 | output 1 | ... | user t |
      system_tokens            user     output

block i's hash is `("sys", g, i)` inside the system prompt and `("session", s, i)` after it, the same in every turn
(a chained hash names the whole prefix up to it). Turn t's output blocks are the hashes turn t + 1 gives them
(`output_block_hashes`), and `num_context_tokens` is what turn t - 1 left cacheable: its prompt and output less the
last token, in whole blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import random

import simpy

from sim.cluster.cluster import Cluster
from sim.results.records import RequestRecord
from sim.runner import build_router
from sim.scenario import Scenario
from sim.workloads.request import Request, shareable_tokens


@dataclass(frozen=True, slots=True)
class SessionShape:
    """The lengths (tokens) and timing of a hand-made session stream."""

    sessions: int = 8
    turns: int = 4
    groups: int = 2
    system_tokens: int = 512
    user_tokens: int = 128
    output_tokens: int = 64
    think_s: float = 2.0
    """Pause between a turn's response and the next turn."""
    stagger_s: float = 0.25
    """Session s starts at s x stagger_s."""
    think_seed: int | None = None
    """None: every think time is `think_s`; else each is drawn exponential with mean `think_s` from this seed."""


def session_turns(shape: SessionShape, session: int, *, block_size: int, first_request_id: int) -> list[Request]:
    """Session `session`'s turns (requests `first_request_id` ...), its group `session % groups`."""
    B = block_size
    for name in ("system_tokens", "user_tokens", "output_tokens"):
        if getattr(shape, name) % B:
            raise ValueError(f"{name} must be a multiple of the block size {B}, got {getattr(shape, name)}")
    group = session % shape.groups
    sys_blocks = shape.system_tokens // B

    def block(i: int) -> tuple:
        return ("sys", group, i) if i < sys_blocks else ("session", session, i)

    turns = []
    context_tokens = 0
    for t in range(shape.turns):
        prompt_tokens = shape.system_tokens + t * (shape.user_tokens + shape.output_tokens) + shape.user_tokens
        n = prompt_tokens // B
        turns.append(Request(
            first_request_id + t, prompt_tokens, shape.output_tokens, tuple(block(i) for i in range(n)),
            num_shareable_tokens=shareable_tokens(prefix_tokens=max(context_tokens, shape.system_tokens),
                                                  prompt_tokens=prompt_tokens, block_size=B),
            prefix_id=group, prefix_tokens=shape.system_tokens, session_id=session, turn=t,
            output_block_hashes=tuple(block(i) for i in range(n, (prompt_tokens + shape.output_tokens) // B)),
            num_context_tokens=context_tokens))
        context_tokens = (prompt_tokens + shape.output_tokens - 1) // B * B
    return turns


def session_stream(shape: SessionShape, *, block_size: int) -> list[list[Request]]:
    """Every session's turns, request ids numbered session by session."""
    return [session_turns(shape, s, block_size=block_size, first_request_id=s * shape.turns)
            for s in range(shape.sessions)]


def think_times(shape: SessionShape) -> list[list[float]]:
    """`[session][turn]`: the pause before each turn (turn 0's is not used)."""
    rng = None if shape.think_seed is None else random.Random(shape.think_seed)
    return [[shape.think_s if rng is None else rng.expovariate(1 / shape.think_s) for _ in range(shape.turns)]
            for _ in range(shape.sessions)]


def drive_sessions(scenario: Scenario, shape: SessionShape) -> list[RequestRecord]:
    """Run the stream closed loop on the scenario's cluster and router: session s starts at s x stagger_s, each turn
    is sent a think time after the previous one's response. The records, in completion order."""
    env = simpy.Environment()
    cluster = Cluster(env, scenario, build_router(scenario))
    records: list[RequestRecord] = []
    think_s = think_times(shape)

    def client(index: int, turns: list[Request]):
        yield env.timeout(index * shape.stagger_s)
        for t, request in enumerate(turns):
            if t:
                yield env.timeout(think_s[index][t])
            records.append((yield cluster.send(request)))

    for index, turns in enumerate(session_stream(shape, block_size=scenario.engine.block_size)):
        env.process(client(index, turns))
    env.run()
    return records
