"""The reuse ledger by token runs: a tiny stream narrated node by node, then the property that it books exactly what
the ledger by block hashes books, on random streams whose two descriptions of each prompt agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.reuse import ReuseLedger
from sim.workloads.request import Request, computed_block_hashes


def test_a_prompt_is_booked_run_by_run():
    # Blocks of 4 tokens. Request 0 (worker 0): prefix P (10 tokens) + own tail (5). Request 1 (worker 1): P + its
    # tail: it shares P's 10 tokens = 2 whole blocks (available 8), none on worker 1 (captured 0). Request 2 (worker
    # 1): the first 6 tokens of P then its own: 1 block shared, with worker 1 too. Request 3 (worker 0): request 0's
    # whole prompt again: 15 tokens shared, capped at 14 = 3 blocks, on worker 0 as well.
    ledger = ReuseLedger(2, 4)

    def book(rid, runs, worker):
        return ledger.book(Request(rid, sum(n for _, n in runs), 8, (), token_runs=runs), worker)

    assert book(0, (("P", 10), ("u0", 5)), 0) == (0, 0)
    assert book(1, (("P", 10), ("u1", 3)), 1) == (8, 0)
    assert book(2, (("P", 6), ("u2", 7)), 1) == (4, 4)
    assert book(3, (("P", 10), ("u0", 5)), 0) == (12, 12)
    # The trie: P (10 tokens; workers 0 and 1 were sent all of it) with the tails after its 10th token, and request
    # 2's tail after its 6th: under the same name P, a run of another start is kept apart.
    p = ledger._root.children["P"]
    assert (p.length, p.mask, p.partial) == (10, 0b11, None)
    assert sorted(p.children) == ["u0", "u1", "u2"] and p.children["u2"].start == 6
    # One stream, one description: a request without runs after requests with them is refused by name.
    with pytest.raises(ValueError, match="request 4 has no token runs"):
        ledger.book(Request(4, 8, 1, (("h", 0), ("h", 1))), 0)


def test_a_worker_sent_a_run_in_part_keeps_its_count_when_another_extends_it():
    ledger = ReuseLedger(3, 1)

    def book(runs, worker):
        return ledger.book(Request(0, sum(n for _, n in runs), 1, (), token_runs=runs), worker)

    book((("a", 3),), 0)
    book((("a", 5),), 1)  # worker 0 now holds 3 of a's 5 tokens
    a = ledger._root.children["a"]
    assert (a.length, a.mask, a.partial) == (5, 0b10, {0: 3})
    assert book((("a", 6),), 0) == (5, 3)
    assert (a.length, a.mask, a.partial) == (6, 0b01, {1: 5})
    assert book((("a", 6),), 1) == (5, 5)  # capped at prompt - 1
    assert (a.mask, a.partial) == (0b11, None)


# ------------------------------------------------------------------ the property
def prefix_of(runs, num_tokens):
    """The first `num_tokens` tokens of `runs`, as runs: the canonical name of a token prefix (two prefixes are the
    same tokens exactly when these are equal), so a block's chained hash."""
    out = []
    for key, n in runs:
        if num_tokens <= 0:
            break
        out.append((key, min(n, num_tokens)))
        num_tokens -= n
    return tuple(out)


@st.composite
def streams(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4]))
    sequences = []  # token sequences later prompts may continue: prompts, and prompts with their outputs
    requests = []
    for rid in range(draw(st.integers(1, 30))):
        runs = []
        if sequences and draw(st.integers(0, 3)):
            base = draw(st.sampled_from(sequences))
            runs = list(prefix_of(base, draw(st.integers(1, sum(n for _, n in base)))))
        for _ in range(draw(st.integers(0 if runs else 1, 3))):
            # NOTE: a few names reused at any place, so that one name follows several starts.
            runs.append((draw(st.sampled_from(["a", "b", ("own", rid, len(runs))])), draw(st.integers(1, 7))))
        prompt = sum(n for _, n in runs)
        outputs = draw(st.integers(1, 9))
        hashes = tuple(prefix_of(runs, (i + 1) * block_size) for i in range(prompt // block_size))
        fields = {}
        if draw(st.booleans()):  # its session resends its outputs
            key = ("out", rid)
            full = runs + [(key, outputs)]
            fields = dict(output_key=key, output_block_hashes=tuple(
                prefix_of(full, (i + 1) * block_size) for i in range(prompt // block_size, (prompt + outputs) // block_size)))
            sequences.append(full)
        sequences.append(runs)
        requests.append((Request(rid, prompt, outputs, hashes, token_runs=tuple(runs), **fields),
                         draw(st.integers(0, 2))))
    return block_size, requests


@settings(max_examples=300, deadline=None)
@given(streams())
def test_booking_by_runs_is_booking_by_block_hashes(stream):
    block_size, requests = stream
    by_runs, by_hashes = ReuseLedger(3, block_size), ReuseLedger(3, block_size)
    for request, worker in requests:
        assert by_runs.book(request, worker) == by_hashes.dispatch(
            computed_block_hashes(request, block_size), request.prompt_tokens, worker), request.request_id
    assert by_runs._by_runs and not by_runs._masks  # it kept no block hash
