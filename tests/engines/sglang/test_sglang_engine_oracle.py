"""kvsim's SGLang engine vs SGLang 0.5.23's own scheduler code, batch by batch.

* In CI: kvsim replays each stream of `sglang_engine_streams.STREAMS` and must reproduce the answer recorded from
  SGLang (tests/golden/sglang_engine/*.json) exactly: every batch (kind, requests with prefix and extend lengths,
  retractions, free slots, evictable/protected tree tokens, new_token_ratio, waiting queue), every request's
  cached_tokens, admission/first-token/finish batches, retractions and outputs, and the final tree.
* Opt-in (`-m sglang_oracle`, with KVSIM_SGLANG_PYTHON naming the SGLang venv's python, see
  benchmarks/oracles/sglang/README.md): the same against SGLang live; regenerate the golden files with
  `KVSIM_SGLANG_PYTHON=... python -m tests.support.sglang_engine_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.sglang_engine_streams import SUITE, session_stream_requests


@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_sglang_engine_reproduces_recorded_sglang_answer(name):
    SUITE.check_golden(name)


def test_the_recorded_engine_streams_exercise_what_they_claim():
    answers = {n: SUITE.oracle.golden(n)["answer"] for n in SUITE.streams}

    def cached(name):
        return [r["cached_tokens"] for r in answers[name]["requests"]]

    # one prompt per prefill batch: under overlap the second batch is formed before the first's result is in the
    # tree, so the second request misses too; without overlap only the first misses
    assert cached("one_pass_apart_overlap")[:3] == [0, 0, 2032]
    assert cached("one_pass_apart_normal")[:2] == [0, 2032]
    # requests admitted in one prefill batch do not hit each other (the tree learns a prompt after its pass)
    assert [r[1] for r in answers["same_prefix_overlap"]["batches"][0]["reqs"]] == [0, 0, 0]
    for name in ("pressure_retract", "pressure_retract_page16"):
        assert sum(len(b["retracted"]) for b in answers[name]["batches"]) >= 5, name
    assert any(len(r) == 3 and r[2] < 1000 for b in answers["chunked"]["batches"] if b["mode"] == "extend"
               for r in b["reqs"])
    assert all(c % 16 == 0 for c in cached("page16"))
    first = answers["lpm_fcfs_fallback"]["batches"][0]
    assert first["waiting"] + len(first["reqs"]) > 128  # lpm ordered more than 128 waiting requests: fcfs


def _later_turns(name):
    """(SGLang's record, the turn's Request, its previous turn's Request) for every turn >= 1 of a session stream."""
    reqs = session_stream_requests(name)
    previous = {}
    out = []
    for rec, req in zip(SUITE.oracle.golden(name)["answer"]["requests"], reqs):
        if req.turn:
            out.append((rec, req, previous[req.session_id]))
        previous[req.session_id] = req
    return out


def test_the_recorded_session_streams_exercise_what_they_claim():
    answers = {n: SUITE.oracle.golden(n)["answer"] for n in SUITE.streams if n.startswith("sessions_")}

    def kinds(name, page_size):
        """How much of its context each later turn found: all, its system prompt only, part of its own tokens
        beyond that, or nothing."""
        out = []
        for rec, req, prev in _later_turns(name):
            computed = (prev.prompt_tokens + prev.output_tokens - 1) // page_size * page_size  # the last output's
            assert req.num_context_tokens == computed  # KV is never computed; the new message keeps the cap away
            cached, system = rec["cached_tokens"], req.prefix_tokens // page_size * page_size
            assert cached % page_size == 0 and cached <= computed
            out.append("all" if cached == computed else "none" if cached == 0 else "system" if cached == system
                       else "own part" if cached > system else "system part")
        return out

    # nothing evicted: every later turn hits its previous turn's prompt + outputs - 1, whether it was prefilled
    # while other sessions decode (running > 0) or beside another prompt in one extend batch; chunked or not
    for name in ("sessions_overlap", "sessions_normal_chunked"):
        assert all(b["evicted"] == 0 for b in answers[name]["batches"]), name
        assert set(kinds(name, 1)) == {"all"}, name
        turns = {req.request_id for _, req, _ in _later_turns(name)}
        ids = [r["id"] for r in answers[name]["requests"]]
        extends = [b for b in answers[name]["batches"] if b["mode"] == "extend"]
        assert any(b["running"] > 0 and any(ids.index(r[0]) in turns for r in b["reqs"]) for b in extends), name
        assert any(len(b["reqs"]) > 1 and any(ids.index(r[0]) in turns for r in b["reqs"]) for b in extends), name
    chunks = [r[0] for b in answers["sessions_normal_chunked"]["batches"] if b["mode"] == "extend" for r in b["reqs"]]
    assert max(chunks.count(i) for i in set(chunks)) > 1
    # gaps between turns in a small pool: later turns lose their context in part (keeping the shared system
    # prompt, or some of their own tokens too) or whole, and a few still find all of it
    for name in ("sessions_gaps_page16", "sessions_gaps_page16_overlap"):
        assert sum(b["evicted"] for b in answers[name]["batches"]) > 0
        assert set(kinds(name, 16)) == {"all", "none", "system", "own part"}, name
    # long outputs in a busy pool: later turns are retracted and prefilled again with their own outputs
    for name, page_size in (("sessions_retract_normal", 1), ("sessions_retract_page16_overlap", 16)):
        assert {"all", "system", "own part"} <= set(kinds(name, page_size)), name
        assert any(rec["num_retractions"] > 0 for rec, _, _ in _later_turns(name)), name


@pytest.mark.sglang_oracle
@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_sglang_engine_matches_live_sglang(name):
    SUITE.check_live(name)
