"""Session plans written as Dynamo's `mooncake-delta` rows and built as kvsim requests from the same plan.

Shared by benchmarks/studies/mocker-cross-check/sessions.py (the chat workload of the mocker cross-check) and
benchmarks/speed/session_speed.py (the long-context agent trace). Scripts import it with `benchmarks/` on sys.path.

A plan is what both simulators are given: per session a start time, a group (whose system prompt every session of
the group shares) and turns (new input tokens, output tokens, the delay after the previous turn completed). In
`mooncake-delta` (../oracles/dynamo-mocker/session-formats.md) a row holds a turn's new input only and the mocker
sends, for turn k,

    prompt_k = prompt_{k-1} + generated output_{k-1} + delta_k          (prompt_0 = system prompt + delta_0)

and kvsim builds the same prompt with `TokenSequence`: append the delta, send, the output is appended. Hash ids are
handed out in file order (group g's system prompt is ids g * S .. g * S + S - 1, every other block a fresh id), so
that the mocker's interning keeps them distinct and the system prompt the only content two sessions share.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session: `new_tokens` appended to the prompt (synthetic: the whole message after the system
    prompt), `output_tokens` generated, sent `delay_s` after the previous turn completed (0 for the first)."""

    new_tokens: int
    output_tokens: int
    delay_s: float


@dataclass(frozen=True, slots=True)
class Plan:
    session: int
    start_s: float
    group: int
    turns: tuple[Turn, ...] = field(default_factory=tuple)


class HashIds:
    """Trace hash ids of `trace_block` tokens each: group g's system prompt is ids g * S .. g * S + S - 1 (S = its
    blocks), every other block a fresh id, handed out in call order."""

    def __init__(self, *, groups: int, system_tokens: int, trace_block: int) -> None:
        if system_tokens % trace_block:
            raise ValueError(f"system_tokens {system_tokens} must be whole trace blocks of {trace_block}")
        self.trace_block = trace_block
        self.system_blocks = system_tokens // trace_block
        self.next_id = groups * self.system_blocks

    def system(self, group: int) -> list[int]:
        return list(range(group * self.system_blocks, (group + 1) * self.system_blocks))

    def fresh(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.trace_block)


def delta_rows(plans: Iterable[Plan], *, groups: int, system_tokens: int, trace_block: int) -> Iterator[dict]:
    """The `mooncake-delta` rows of `plans`, in order: the first turn of a session carries its start (`timestamp`,
    ms) and the system prompt's ids before its delta; every later turn its `delay` (ms) and its delta's ids."""
    ids = HashIds(groups=groups, system_tokens=system_tokens, trace_block=trace_block)
    for plan in plans:
        for k, turn in enumerate(plan.turns):
            timing = {"timestamp": round(plan.start_s * 1000, 3)} if k == 0 else {"delay": round(turn.delay_s * 1000, 3)}
            new = ids.fresh(ids.blocks(turn.new_tokens))
            yield {"session_id": f"s{plan.session}", **timing,
                   "input_length": (system_tokens if k == 0 else 0) + turn.new_tokens,
                   "output_length": turn.output_tokens,
                   "hash_ids": (ids.system(plan.group) if k == 0 else []) + new}


def write_jsonl(rows: Iterable[dict], path: Path) -> int:
    """Writes `rows` one JSON object a line, atomically (a temporary file renamed); returns the rows written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    n = 0
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    tmp.replace(path)
    return n


def delta_requests(plan: Plan, *, block_size: int, system_tokens: int):
    """kvsim's requests for the plan's turns, built one at a time as they are asked for: each turn appends its delta
    (segment `("user", s, k)`) to the session's `TokenSequence`, sends the sequence, and its output `("out", s, k)`
    is appended for the next turn. Request ids are `session * 1000 + turn`."""
    from sim.workloads.sequence import TokenSequence
    s = plan.session
    seq = TokenSequence(("session", s), block_size=block_size, system_key=("sys", plan.group),
                        system_tokens=system_tokens)
    for k, turn in enumerate(plan.turns):
        seq.append(("user", s, k), turn.new_tokens)
        yield seq.request(s * 1000 + k, output_tokens=turn.output_tokens, output_key=("out", s, k), session_id=s,
                          turn=k, prefix_id=plan.group)


class PlannedSession:
    """A `Session` (sim.workloads.sessions) over a plan's requests: the first at `start_s`, each next one its delay
    after the previous one completed. `requests` yields the turns' requests in order; each is drawn when it falls
    due, so only the running sessions' sequences are held."""

    def __init__(self, plan: Plan, requests: Iterable) -> None:
        self.session_id, self.start_s, self._plan = plan.session, plan.start_s, plan
        self._requests = iter(requests)

    def first(self):
        return [(next(self._requests), 0.0)]

    def after(self, done, now_s):
        k = done.turn + 1
        return [(next(self._requests), self._plan.turns[k].delay_s)] if k < len(self._plan.turns) else []
