"""Reuse available and reuse captured by routing: what infinite caches would hit on the same stream."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import repeat
from operator import or_

from sim.routing.prefix_index import held_prefix
from sim.workloads.request import Request, computed_block_hashes


class _WorkerView:
    """Membership of one worker's bit in a `key -> worker bitmask` dict (what `held_prefix` asks with `in`)."""

    __slots__ = ("_get", "_bit")

    def __init__(self, masks: dict[Hashable, int], worker: int) -> None:
        self._get = masks.get
        self._bit = 1 << worker

    def __contains__(self, key: Hashable) -> bool:
        return bool(self._get(key, 0) & self._bit)


class _Run:
    """One run of the ledger's token trie: the tokens `(key, 0) .. (key, length - 1)` that follow its parent run's
    first `start` tokens (and the path to it) in some prompt sent so far (`key` is its name in the parent's
    `children`, or, when that name is taken by a run of another `start`, in the parent's `others` under (start,
    key)).

    Which workers were sent how much of it: the workers in `mask` were sent all `length` tokens; a worker sent fewer
    has its count in `partial` (None when there is none); any other worker none of it.
    """

    __slots__ = ("start", "length", "mask", "partial", "children", "others")

    def __init__(self, start: int) -> None:
        self.start = start
        self.length = 0
        self.mask = 0
        self.partial: dict[int, int] | None = None
        self.children: dict[Hashable, _Run] | None = None
        self.others: dict[tuple[int, Hashable], _Run] | None = None

    def child(self, start: int, key: Hashable) -> _Run:
        """The run `key` after this run's first `start` tokens, created (with nothing sent) if new."""
        children = self.children
        if children is None:
            children = self.children = {}
        run = children.get(key)
        if run is None:
            run = children[key] = _Run(start)
        elif run.start != start:
            others = self.others
            if others is None:
                others = self.others = {}
            run = others.get((start, key))
            if run is None:
                run = others[start, key] = _Run(start)
        return run

    def sent(self, worker: int) -> int:
        """Tokens of this run sent to `worker` (its longest)."""
        if self.mask >> worker & 1:
            return self.length
        partial = self.partial
        return partial.get(worker, 0) if partial else 0

    def record(self, worker: int, num_tokens: int) -> None:
        """`worker` was sent the first `num_tokens` tokens (> 0) of this run."""
        length, bit = self.length, 1 << worker
        if num_tokens == length:
            self.mask |= bit
        elif num_tokens > length:
            mask = self.mask & ~bit
            if mask:  # NOTE: workers sent the whole run so far now hold only its first `length` tokens
                partial = self.partial if self.partial is not None else {}
                w = 0
                while mask:
                    if mask & 1:
                        partial[w] = length
                    mask >>= 1
                    w += 1
                self.partial = partial
            self.length, self.mask = num_tokens, bit
        elif self.mask & bit:
            return
        else:
            partial = self.partial
            if partial is None:
                self.partial = {worker: num_tokens}
            elif partial.get(worker, 0) < num_tokens:
                partial[worker] = num_tokens
            return
        partial = self.partial
        if partial and worker in partial:
            del partial[worker]
            if not partial:
                self.partial = None


class ReuseLedger:
    """For each dispatched request, the prompt tokens that would be hits

    * `available`: in one infinite cache shared by the whole cluster (every earlier request's blocks), and
    * `captured`: in an infinite cache on the worker the router chose (the earlier requests sent there),

    in whole blocks of the stream and capped, as the engines cap a hit, at `prompt_tokens - 1`. Beside the hit the
    finite caches deliver, they tell routing apart from memory: available - captured is lost by routing, captured
    - delivered by memory (and by requests in flight together, whose blocks are not cached yet). Warm-ups count as
    history. A block counts from its request's dispatch, so in-flight duplicates count as reuse (an upper bound).

    Two bookkeepings of the same figures, chosen by the first request booked (`book`):
    * by token runs, when it has them (`Request.token_runs`): a trie of runs (`_Run`), each node one run of a
      prompt with, per worker, how much of it was sent there. Memory grows with the distinct runs sent (a
      synthetic request's own tail is one node), not with their blocks, and a request costs a lookup per run. The
      blocks two prompts share are the whole blocks of the tokens they share (the two descriptions of a `Request`
      agree), so the figures are the same as by hashes;
    * by block hashes (`dispatch`): one dict `block hash -> bitmask of the workers sent it`, whose keys are the
      shared cache: every distinct block hash ever sent is kept.
    """

    def __init__(self, num_workers: int, block_size: int) -> None:
        self.block_size = block_size
        self._masks: dict[Hashable, int] = {}
        self._views = [_WorkerView(self._masks, w) for w in range(num_workers)]
        self._root = _Run(0)
        self._by_runs: bool | None = None
        """True: booked by token runs; False: by block hashes; None: nothing booked yet."""

    def book(self, request: Request, worker: int) -> tuple[int, int]:
        """(available, captured) tokens of `request`, sent to `worker`; then records what it leaves cached: its
        prompt's blocks and, when its session resends its outputs, the output blocks it computes
        (`computed_block_hashes`)."""
        if self._by_runs is None:
            self._by_runs = bool(request.token_runs)
        if not self._by_runs:
            return self.dispatch(computed_block_hashes(request, self.block_size), request.prompt_tokens, worker)
        runs = request.token_runs
        if not runs:
            raise ValueError(f"reuse ledger: request {request.request_id} has no token runs, but the requests booked "
                             "before it had (one stream describes its prompts one way)")
        if request.output_block_hashes:
            if request.output_key is None:
                raise ValueError(f"reuse ledger: request {request.request_id} has output block hashes but no "
                                 "output_key (its outputs' tokens)")
            # NOTE: the tokens it computes: the prompt, then its outputs but the last (whose KV is never computed).
            runs = (*runs, (request.output_key, request.output_tokens - 1))
        return self._book_runs(runs, request.prompt_tokens, worker)

    def _book_runs(self, runs: Sequence[tuple[Hashable, int]], prompt_tokens: int, worker: int) -> tuple[int, int]:
        """`book` by token runs: walk the trie along `runs` (creating what is new), counting the tokens shared with
        every earlier prompt and with those sent to `worker`, and record `worker`'s share of each run."""
        B = self.block_size
        cap = (prompt_tokens - 1) // B
        run = self._root
        start = 0  # tokens of `run` before the next run starts
        shared = mine = 0  # tokens along the path in some earlier prompt / in one sent to `worker`
        matching = mine_matching = True
        bit = 1 << worker
        # NOTE: `_Run.child`, `sent` and `record` inlined for their common cases (a run seen at this start before;
        # one nobody was sent yet; a worker sent all of it): once per run of every request of the stream.
        for key, n in runs:
            if not n:
                continue  # NOTE: an empty run names no token: it must not split the path
            children = run.children
            nxt = children.get(key) if children is not None else None
            run = nxt if nxt is not None and nxt.start == start else run.child(start, key)
            length = run.length
            if matching:
                if n <= length:
                    shared += n
                else:
                    shared += length
                    matching = False
                if mine_matching:
                    held = length if run.mask & bit else run.sent(worker)
                    if n <= held:
                        mine += n
                    else:
                        mine += held
                        mine_matching = False
            if not length:
                run.length, run.mask = n, bit
            elif n == length and run.partial is None:
                run.mask |= bit
            else:
                run.record(worker, n)
            start = n
        return min(shared // B, cap) * B, min(mine // B, cap) * B

    def dispatch(self, hashes: Sequence[Hashable], prompt_tokens: int, worker: int) -> tuple[int, int]:
        """`book` by block hashes: (available, captured) tokens of a request with these block hashes, sent to
        `worker`; then records it. `hashes` may run past the prompt (`sim.workloads.request.computed_block_hashes`:
        a session's outputs, which later prompts resend); the hit is over the prompt's blocks only."""
        if self._by_runs:
            raise ValueError("reuse ledger: booking block hashes after token runs (one stream describes its prompts "
                             "one way)")
        self._by_runs = False
        cap = (prompt_tokens - 1) // self.block_size
        masks, bit = self._masks, 1 << worker
        in_shared = held_prefix(masks, hashes)
        in_mine = held_prefix(self._views[worker], hashes[:in_shared])
        # NOTE: C-level updates: this worker's bit onto the blocks others hold, then the blocks nobody held yet.
        seen = hashes[in_mine:in_shared]
        masks.update(zip(seen, map(or_, map(masks.__getitem__, seen), repeat(bit))))
        masks.update(zip(hashes[in_shared:], repeat(bit)))
        return min(in_shared, cap) * self.block_size, min(in_mine, cap) * self.block_size
