"""Sessions inferred from the hash ids of a trace that records none (Mooncake's conversation trace).

A chat's next turn resends the whole history: its prompt is the previous prompt, the previous answer, then the new
message. With chained block ids (equal ids mean equal blocks *and* equal prefixes) that leaves a mark: the next
turn's leading ids are the previous turn's full prompt blocks. But so does a shared system prompt, which every
request of a service repeats (block 0 of every request in Mooncake's conversation trace). The rule:

* **Common blocks.** A block id that more than K requests carry (`common_requests`, default 100) is a common
  prefix (system prompt, shared template), not evidence of a session. Commonness runs along a prefix (a chained id
  is carried by no more requests than the one before it), so a request's common blocks are a leading run.
* **Parent.** A request's parent is the request whose full prompt blocks are the longest leading run of its ids,
  the most recent of equals, provided that run is longer than the request's common blocks (the two share at least
  one block that at most K requests carry) and the parent's prompt is not longer than the request's (a
  continuation resends the whole prompt). No candidate: a new session.
* **One child.** A parent is continued by at most one request, the first. A later request that would continue an
  already continued turn starts a new session (`InferenceCounts.siblings`): its prompt leaves the parent's prompt
  where the first child's does not (it holds another answer, or another question on the same context, or another
  user's request on a shared document), so it does not continue the conversation the first child continues, and a
  closed-loop replay needs one predecessor per turn to say when it is sent.

Only the deepest candidate is tried: a shorter one is the deepest's ancestor, whose continuation the deepest is.

Memory: a pre-pass counts the requests per block id (one dict entry per distinct id, dropped when it ends; the
conversation trace has 182,790) and keeps the common ids; the inference itself keeps one dict entry per request
with a full block (its last full block's id -> its index and prompt length).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sim.workloads.traces import TraceError, json_object, open_binary

DEFAULT_COMMON_REQUESTS = 100
"""Requests above which a block id is a common prefix. On Mooncake's conversation trace only block 0 is carried by
more than 43 requests (by all 12,031); any K from 43 to 12,030 gives the same sessions
(docs/concepts/session-traces.md)."""


def common_block_ids(path: Path, common_requests: int, limit: int | None = None) -> frozenset[int]:
    """The block ids that more than `common_requests` of the trace's first `limit` requests carry (a pre-pass over
    the file; a request's ids are distinct, so occurrences count requests)."""
    if common_requests < 1:
        raise TraceError(f"common_requests must be >= 1, got {common_requests}")
    counts: Counter = Counter()
    n = 0
    handle = open_binary(path)
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            if limit is not None and n >= limit:
                break
            if not raw.strip():
                continue
            ids = json_object(raw, path, line_no).get("hash_ids")
            if isinstance(ids, list):  # NOTE: the index pass checks the field and names the line
                counts.update(ids)
            n += 1
    return frozenset(h for h, c in counts.items() if c > common_requests)


@dataclass(slots=True)
class InferenceCounts:
    """What the inference did, counted as requests are indexed."""

    common_requests: int
    """K: block ids carried by more than K requests are common."""
    common_ids: int
    """Block ids found common."""
    linked: int = 0
    """Requests given a parent."""
    siblings: int = 0
    """Requests whose deepest candidate parent was already continued: new sessions."""
    longer_parent: int = 0
    """Requests whose deepest candidate had a longer prompt (a partial last block past theirs): new sessions."""


class ParentInference:
    """The parent rule of the module docstring, applied request by request in file order."""

    __slots__ = ("common", "block_tokens", "counts", "_last_full")

    def __init__(self, common: frozenset[int], common_requests: int, block_tokens: int) -> None:
        self.common = common
        self.block_tokens = block_tokens
        self.counts = InferenceCounts(common_requests, len(common))
        self._last_full: dict[int, tuple[int, int]] = {}
        """A full-block prefix, by its last id (chained: it names the whole prefix) -> the most recent request
        whose full prompt blocks are exactly that prefix, and its prompt tokens."""

    def parent(self, i: int, ids: list[int], input_length: int, continued) -> int:
        """Request `i`'s parent (-1: a new session), then `i` recorded as a candidate for later requests.
        `continued(p)` says whether request p has a child already."""
        common = self.common
        c = 0
        while c < len(ids) and ids[c] in common:
            c += 1
        parent = -1
        for j in range(min(len(ids), input_length // self.block_tokens) - 1, c - 1, -1):
            found = self._last_full.get(ids[j])
            if found is None:
                continue
            p, p_input = found
            if p_input > input_length:
                self.counts.longer_parent += 1
            elif continued(p):
                self.counts.siblings += 1
            else:
                parent = p
                self.counts.linked += 1
            break
        full = input_length // self.block_tokens
        if full:
            self._last_full[ids[full - 1]] = (i, input_length)
        return parent
