"""Session streams for the SGLang engine oracle: turns that resend the previous turn's prompt and outputs.

Each session is a `TokenSequence` (the one mechanism that builds session requests): a system prompt shared by its
group, then per turn a new message; each turn's request sends the sequence as it stands and appends its outputs, so
turn t + 1's prompt is turn t's prompt + all of turn t's outputs + a new message. The oracle's token ids follow from
the runs (`benchmarks/oracles/sglang/token_runs.py`: a run `[k, start, n]` is the ids `k * 10^6 + start ..`), with
integer segment keys:

    system prompt of group g:   k = 1 + g
    message m (any session):    k = 1000 + m
    outputs of request i:       k = OUT_KEY_BASE + i   (the ids SGLang's fake model samples for request number i)

so the outputs a next turn resends are exactly the ids the oracle's model sampled, and kvsim's request carries the
same identity as `Request.output_key`. A session's turns run back to back on one client: turn t + 1 (and any gap
requests between them, each a one-turn sequence of its own) names the request it follows (`after`), and is received
when that one finishes; the closed loop starts the next session when a session's last request finishes.

    list:  s0t0 | [g0 after s0t0] | s0t1 after g0 (or s0t0) | s0t2 ... | s1t0 | ...
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sim.workloads.request import Request
from sim.workloads.sequence import TokenSequence

OUT_KEY_BASE = 900_000
"""SGLang's fake model samples token (900000 + i) * 10^6 + p at output position p of request i ..."""
MESSAGE_KEY_BASE = 1_000
GAP_KEY_BASE = 500_000


@dataclass(frozen=True)
class SessionShape:
    """How a stream's sessions are drawn; every range is inclusive."""

    seed: int
    sessions: int
    turns: tuple[int, int]
    groups: int
    system_tokens: tuple[int, int]
    message_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    gap_requests: tuple[int, int] = (0, 0)
    """Requests (one-turn sequences of their own) run on the session's client between two turns: while they run,
    the session's context lies unlocked in the tree, exposed to eviction."""
    gap_tokens: tuple[int, int] = (1, 1)
    gap_output_tokens: tuple[int, int] = (1, 1)
    ignore_eos: bool = True


def session_requests(shape: SessionShape, page_size: int) -> list[tuple[dict, Request]]:
    """The stream's requests in list order: the oracle's request (JSON) and kvsim's `Request` it was built from
    (with `session_id`, `turn` and `num_context_tokens` at `page_size`-token blocks)."""
    rng = random.Random(shape.seed)
    system = [rng.randint(*shape.system_tokens) for _ in range(shape.groups)]
    out: list[tuple[dict, Request]] = []
    messages = gaps = 0

    def send(seq: TokenSequence, rid: str, output_tokens: int, session_id: int, turn: int,
             after: str | None) -> str:
        i = len(out)
        req = seq.request(i, output_tokens=output_tokens, output_key=OUT_KEY_BASE + i, session_id=session_id,
                          turn=turn)
        out.append(({"id": rid, "prompt": [[k, 0, n] for k, n in req.token_runs], "max_new_tokens": output_tokens,
                     "ignore_eos": shape.ignore_eos, "eos_after": None, "after": after}, req))
        return rid

    for s in range(shape.sessions):
        g = rng.randrange(shape.groups)
        seq = TokenSequence(("session", s), block_size=page_size, system_key=1 + g, system_tokens=system[g])
        last = None
        for t in range(rng.randint(*shape.turns)):
            if t:
                for j in range(rng.randint(*shape.gap_requests)):
                    gap = TokenSequence(("gap", gaps), block_size=page_size)
                    gap.append(GAP_KEY_BASE + gaps, rng.randint(*shape.gap_tokens))
                    last = send(gap, f"s{s}t{t}g{j}", rng.randint(*shape.gap_output_tokens),
                                shape.sessions + gaps, 0, last)
                    gaps += 1
            seq.append(MESSAGE_KEY_BASE + messages, rng.randint(*shape.message_tokens))
            messages += 1
            last = send(seq, f"s{s}t{t}", rng.randint(*shape.output_tokens), s, t, last)
    return out
