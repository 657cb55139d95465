"""Token sequences for the radix tree, by identity rather than by id: runs of tokens that share a key.

SGLang's radix tree compares token ids one by one. kvsim describes a prompt by the identity of its tokens instead
(`Request.token_runs`): a run `(key, start, n)` is the n tokens `(key, start) .. (key, start + n - 1)`, and two
sequences share a token position exactly when those pairs are equal there. A shared prefix is one run, a unique
tail another, so a 2,371-token prompt is two runs and the tree's work is per run, not per token, while matches
stay token-exact (a match may end inside a run: the tree splits the node there, as SGLang's does).

    tokens:  | ("p",7) 0 .. 2031 | ("u",42) 0 .. 338 |       a prompt: the 2,032-token prefix 7, then its own tail
    runs:    ((("p",7), 0, 2032), (("u",42), 0, 339))

A page (SGLang `page_size` > 1) is identified by the canonical runs of its tokens (adjacent runs of one key with
consecutive offsets merged), so two pages are equal exactly when all their tokens are.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable
from itertools import accumulate, repeat
from operator import itemgetter

from sim.workloads.request import Request

Run = tuple[Hashable, int, int]
"""(key, first offset, number of tokens)."""

_run_length = itemgetter(2)


def _canonical(runs: Iterable[Run]) -> tuple[Run, ...]:
    out: list[Run] = []
    for key, start, n in runs:
        if n <= 0:
            continue
        if out:
            k, s, m = out[-1]
            if k == key and s + m == start:
                out[-1] = (k, s, m + n)
                continue
        out.append((key, start, n))
    return tuple(out)


class Tokens:
    """An immutable token sequence as canonical runs. `len()` is its length in tokens."""

    __slots__ = ("runs", "length", "_ends_list")

    def __init__(self, runs: Iterable[Run] = ()) -> None:
        runs = _canonical(runs)
        self.runs = runs
        self._ends_list = None
        self.length = sum([n for _, _, n in runs])

    @classmethod
    def _canonical_runs(cls, runs: tuple[Run, ...], length: int) -> Tokens:
        """Tokens from runs already canonical (a piece of a canonical sequence is) of `length` tokens."""
        out = cls.__new__(cls)
        out.runs = runs
        out._ends_list = None
        out.length = length
        return out

    @property
    def _ends(self) -> list[int]:
        """Token offset just past each run (for finding the run an offset falls in); computed when first needed
        (most pieces of a prompt are never located into)."""
        ends = self._ends_list
        if ends is None:
            ends = self._ends_list = list(accumulate(map(_run_length, self.runs)))
        return ends

    def _locate(self, offset: int) -> tuple[int, int]:
        """(index of the run holding token `offset`, tokens of that run before it)."""
        ends = self._ends_list  # NOTE: `_ends` inlined: the tree's walks locate several times per node
        if ends is None:
            ends = self._ends_list = list(accumulate(map(_run_length, self.runs)))
        i = bisect_right(ends, offset)
        return i, offset - (ends[i - 1] if i else 0)

    def __len__(self) -> int:
        return self.length

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokens) and self.runs == other.runs

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return f"Tokens({self.runs!r})"

    def __add__(self, other: Tokens) -> Tokens:
        # NOTE: both are canonical, so only the runs where they meet may merge.
        a, b = self.runs, other.runs
        if not b:
            return self
        if not a:
            return other
        key, s, m = a[-1]
        k, t, n = b[0]
        merge = key == k and s + m == t
        runs = a[:-1] + ((key, s, m + n),) + b[1:] if merge else a + b
        out = Tokens._canonical_runs(runs, self.length + other.length)
        ends = self._ends_list
        if ends is not None and len(b) == 1:
            # NOTE: a prompt and its outputs (one run): the prompt's run ends, located into once, carry over
            out._ends_list = ends[:-1] + [out.length] if merge else ends + [out.length]
        return out

    def slice(self, start: int, stop: int | None = None) -> Tokens:
        """Tokens [start, stop) (stop defaults to the end, and is clipped to it)."""
        stop = self.length if stop is None else min(stop, self.length)
        if start <= 0 and stop >= self.length:
            return self
        if start >= stop:
            return Tokens()
        # NOTE: the runs wholly inside [start, stop) are taken as one tuple slice; only the first and the last run
        # may be cut.
        #   runs:   | i .......... | i+1 | ... | j-1 | j .......... |
        #   slice:       ^start: (key, s + inner, n - inner)    ^stop: (key, s, stop - ends[j - 1])
        i, inner = self._locate(start) if start > 0 else (0, 0)  # NOTE: a prefix (most slices) needs no search
        j, inner_stop = self._locate(stop - 1)  # the run holding the last token taken
        runs = self.runs
        key, s, n = runs[i]
        if i == j:
            return Tokens._canonical_runs(((key, s + inner, inner_stop + 1 - inner),), stop - start)
        first = (key, s + inner, n - inner) if inner else runs[i]
        key, s, n = runs[j]
        last = runs[j] if inner_stop + 1 == n else (key, s, inner_stop + 1)
        out = Tokens._canonical_runs((first,) + runs[i + 1:j] + (last,), stop - start)
        if start <= 0:  # NOTE: a prefix's run ends are the sequence's, up to its own end (the last run may be cut)
            out._ends_list = self._ends_list[:j] + [stop]
        return out

    def token(self, index: int) -> tuple[Hashable, int]:
        """The identity of token `index`."""
        if not 0 <= index < self.length:
            raise IndexError(f"token {index} of a {self.length}-token sequence")
        i, inner = self._locate(index)
        key, s, _ = self.runs[i]
        return key, s + inner

    def page_key(self, offset: int, page_size: int) -> Hashable:
        """Identity of the page of `page_size` tokens at `offset` (SGLang's `RadixKey.child_key_at`): the token
        itself for page size 1, else the page's canonical runs."""
        if page_size == 1:
            if offset == 0 and self.length:  # a node's own key (a child's place, a leaf's removal): no search
                key, s, _ = self.runs[0]
                return key, s
            return self.token(offset)
        return self.page_key_at(offset, page_size, self._locate(offset) if offset else (0, 0))

    def page_key_at(self, offset: int, page_size: int, located: tuple[int, int]) -> Hashable:
        """`page_key(offset, page_size)` where `located` is `_locate(offset)` (a walk locates each node's offset
        once, for the child's page and for the match: `match(..., located)`)."""
        i, inner = located
        key, s, n = self.runs[i]
        if page_size == 1:
            return key, s + inner
        if inner + page_size <= n:
            return ((key, s + inner, page_size),)  # the page lies inside one run
        return self.slice(offset, offset + page_size).runs

    def match(self, other: Tokens, offset: int = 0, located: tuple[int, int] | None = None) -> int:
        """How many leading tokens of `self` equal `other`'s from `offset` on (SGLang `RadixKey.match_at`, before
        page rounding); `located`, if given, is `other._locate(offset)`."""
        if offset >= other.length:
            return 0
        if located is None:
            located = other._locate(offset) if offset else (0, 0)
        return self.match_located(other, located)[0]

    def match_located(self, other: Tokens, located: tuple[int, int]) -> tuple[int, tuple[int, int]]:
        """`match(other, offset, located)` for an offset inside `other`, with where the match ends in `other` (as
        `other._locate(offset + matched)` would say, the run index past the end if it ends there): a walk down a
        tree goes on from there without searching the run ends again."""
        a, b = self.runs, other.runs
        ib, ob = located
        n = ia = oa = 0
        len_a, len_b = len(a), len(b)
        while ia < len_a and ib < len_b:
            if not oa and not ob and a[ia] == b[ib]:
                # NOTE: both at a run's start and equal runs: skip every equal run at once (a prompt of chained
                # block hashes is a run per block), then go on run by run as below.
                k = _common_runs(a, ia, b, ib, min(len_a - ia, len_b - ib))
                ends = self._ends
                n += ends[ia + k - 1] - (ends[ia - 1] if ia else 0)
                ia += k
                ib += k
                continue
            ka, sa, na = a[ia]
            kb, sb, nb = b[ib]
            if ka != kb or sa + oa != sb + ob:
                return n, (ib, ob)
            step = min(na - oa, nb - ob)
            n += step
            oa += step
            ob += step
            if oa == na:
                ia, oa = ia + 1, 0
            if ob == nb:
                ib, ob = ib + 1, 0
        return n, (ib, ob)


def _common_runs(a: tuple[Run, ...], ia: int, b: tuple[Run, ...], ib: int, m: int) -> int:
    """How many runs `a[ia:]` and `b[ib:]` share from their first (>= 1: the first are equal; at most `m`), by
    bisection over tuple-slice comparisons, which run in C."""
    if a[ia:ia + m] == b[ib:ib + m]:
        return m
    lo, hi = 1, m  # a[ia:ia + lo] == b[ib:ib + lo], a[ia:ia + hi] != b[ib:ib + hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[ia + lo:ia + mid] == b[ib + lo:ib + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def prompt_tokens(request: Request, block_size: int) -> Tokens:
    """`request`'s prompt as tokens: its `token_runs`, or, without them, one run per full block of its chained
    block hashes (a block hash names its whole prefix, so `(hash, offset)` names a token) and a run of its own
    for the partial last block."""
    memo = _last_prompt
    if memo[0] is request and memo[1] == block_size:
        return memo[2]
    if request.token_runs:
        keys, counts = zip(*request.token_runs)
        # NOTE: runs that all start at offset 0 are canonical once the empty ones are dropped (two runs of one key
        # merge only when the second starts where the first ends).
        runs = tuple(zip(keys, repeat(0), counts))
        tokens = Tokens._canonical_runs(runs, request.prompt_tokens) if min(counts) > 0 else Tokens(runs)
    else:
        hashes = request.block_hashes
        tail = request.prompt_tokens - len(hashes) * block_size
        tokens = Tokens([(h, 0, block_size) for h in hashes] + [(("tail", request.request_id), 0, tail)])
    memo[:] = request, block_size, tokens
    return tokens


_last_prompt: list = [None, 0, None]
"""The last (request, block size, prompt tokens) built: every worker's cache builds a request's tokens when a router
peeks, then the worker it goes to once more (a request is immutable, and held here, so `is` identifies it)."""


def page_aligned_prompt(request: Request, block_size: int, page_size: int) -> Tokens:
    """`prompt_tokens(request, block_size)` cut to whole pages of `page_size` (`RadixCache.page_aligned`), built once
    for a router's peeks at every worker (the same object each time, so its run ends are located once too)."""
    memo = _last_aligned
    if memo[0] is request and memo[1] == block_size and memo[2] == page_size:
        return memo[3]
    tokens = prompt_tokens(request, block_size)
    length = tokens.length // page_size * page_size
    if length != tokens.length:
        tokens = tokens.slice(0, length)
    memo[:] = request, block_size, page_size, tokens
    return tokens


_last_aligned: list = [None, 0, 0, None]
"""The last (request, block size, page size, page-aligned prompt tokens) built (as `_last_prompt`)."""


def output_tokens(request: Request, num_tokens: int) -> Tokens:
    """The first `num_tokens` sampled output tokens of `request`: unique to it (sampling is random), unless a later
    turn of its session resends them (`Request.output_key` names them then)."""
    if num_tokens <= 0:
        return Tokens()
    key = request.output_key
    return Tokens._canonical_runs(((("out", request.request_id) if key is None else key, 0, num_tokens),), num_tokens)
