"""A session's token sequence as it grows turn by turn, and the requests that send it.

A chat resends its whole history each turn; an agent appends a tool result and calls the model again. Both are one
growing sequence of segments (a system prompt shared by a group of sessions, user messages, tool results, the
model's own outputs), and each request sends the sequence as it stands, then its output is appended to it:

    turn 0 prompt:  | system (group g) | user 0 |
    turn 1 prompt:  | system (group g) | user 0 | output 0 | user 1 |
                                                 ^ turn 0's output_key / output_block_hashes name these tokens

Both identities of `Request` follow from the segments, so vLLM's block cache and SGLang's radix tree agree on what a
later turn shares:
* tokens: segment k of n tokens is the run `(k, n)`, tokens `(k, 0) .. (k, n - 1)`; a segment key is never
  appended twice to one sequence;
* blocks: a chained hash names a block's whole prefix, so a full block inside the group's system prompt is
  `(system key, i)` (shared by every session of the group) and any other full block is `(lineage, i)`, where the
  lineage names the sequence's history: it changes when the history is rewritten (context truncated or compacted:
  the prefix breaks after the system prompt, which is the point) and when a subagent forks (its blocks after the
  fork point are its own, those before it are its parent's).

A request's `num_context_tokens` is how much of its prompt the earlier requests of its lineage left cacheable: the
leading blocks it shares with what the last request computed (`input + output - 1` tokens: the last sampled token's
KV is never computed), in whole blocks, capped like a hit at `prompt_tokens - 1`.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import repeat

from sim.workloads.request import BlockHash, Request, computed_block_hashes, context_tokens


class TokenSequence:
    """One lineage's tokens (runs) and full-block hashes at `block_size`, appended segment by segment."""

    __slots__ = ("block_size", "lineage", "hashes", "runs", "length", "system_tokens", "_computed")

    def __init__(self, lineage: Hashable, *, block_size: int, system_key: Hashable | None = None,
                 system_tokens: int = 0) -> None:
        """An empty sequence, or one that starts with `system_tokens` tokens of the shared segment `system_key`."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.lineage = lineage
        self.hashes: list[BlockHash] = []
        self.runs: list[tuple[Hashable, int]] = []
        self.length = 0
        self.system_tokens = system_tokens
        """Tokens of the shared system prompt the sequence starts with (its first run; 0: none)."""
        self._computed: tuple[BlockHash, ...] = ()
        """Full blocks the last request of this lineage computed (what a next turn may find cached)."""
        if system_tokens:
            if system_key is None:
                raise ValueError("system_tokens without a system_key")
            self.runs.append((system_key, system_tokens))
            self.hashes.extend((system_key, i) for i in range(self._system_blocks))
            self.length = system_tokens

    def append(self, key: Hashable, num_tokens: int) -> None:
        """Append the segment `key` of `num_tokens` tokens (a user message, a tool result, an output)."""
        if num_tokens <= 0:
            return
        self.runs.append((key, num_tokens))
        start = len(self.hashes)
        self.length += num_tokens
        lineage = self.lineage
        # NOTE: zip(repeat, range) builds the same (lineage, i) keys as a generator would, in C: a long tool result
        # adds thousands of blocks.
        self.hashes.extend(zip(repeat(lineage), range(start, self.length // self.block_size)))

    def fork(self, lineage: Hashable) -> TokenSequence:
        """A child lineage (a subagent) that starts from this sequence as it stands: it shares every full block so
        far, and its own tokens follow (the parent's partial last block becomes a block of the child's)."""
        child = TokenSequence(lineage, block_size=self.block_size)
        child.hashes = list(self.hashes)
        child.runs = list(self.runs)
        child.length = self.length
        child.system_tokens = self.system_tokens
        child._computed = self._computed
        return child

    def rewrite(self, lineage: Hashable, keep: list[tuple[Hashable, int]]) -> None:
        """Replace the history after the system prompt by the segments `keep` (the turns a truncation keeps, or a
        compaction's summary), under a new lineage: blocks after the system prompt no longer match any earlier
        prompt. The system prompt (the first run) stays when the sequence has one."""
        system = self.runs[:1] if self.system_tokens else []
        self.lineage = lineage
        self.runs = list(system)
        self.length = self.system_tokens
        self.hashes = self.hashes[: self._system_blocks]
        for key, n in keep:
            self.append(key, n)

    @property
    def _system_blocks(self) -> int:
        """Full blocks inside the system prompt (hashed by the group's key, shared across sessions)."""
        return self.system_tokens // self.block_size

    def request(self, request_id: int, *, output_tokens: int, output_key: Hashable, session_id: int,
                turn: int, prefix_id: int | None = None, warmup: bool = False) -> Request:
        """The request that sends the sequence as it stands, then appends its `output_tokens` outputs (segment
        `output_key`) to it: its output blocks carry the hashes the next prompt gives them."""
        if self.length < 1:
            raise ValueError(f"request {request_id}: the session's sequence is empty")
        B = self.block_size
        prompt_tokens = self.length
        prompt_blocks = prompt_tokens // B
        block_hashes = tuple(self.hashes[:prompt_blocks])
        runs = tuple(self.runs)
        context = context_tokens(block_hashes, prompt_tokens, self._computed, B)
        self.append(output_key, output_tokens)
        request = Request(
            request_id=request_id, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            block_hashes=block_hashes, num_shareable_tokens=min(self._system_blocks, (prompt_tokens - 1) // B) * B,
            prefix_id=prefix_id, prefix_tokens=self.system_tokens, warmup=warmup, token_runs=runs,
            session_id=session_id, turn=turn,
            output_block_hashes=tuple(self.hashes[prompt_blocks:(prompt_tokens + output_tokens) // B]),
            output_key=output_key, num_context_tokens=context,
        )
        self._computed = computed_block_hashes(request, B)
        return request
