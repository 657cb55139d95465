"""A replay's streaming statistics count a record exactly as the counters they are made of would, one by one.

`StreamingStats.add` spells out, for speed, what `HitCounts.add`, `Slo`, `LogHistogram` and the record's properties
compute; here a deliberately naive `add` built from those owners is run beside it on random records, and every
counter, histogram bin and time bin must agree exactly (not approximately: the summaries are compared byte for byte).
"""

from __future__ import annotations

from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.results.records import RequestRecord, Slo, booked_add
from sim.results.streaming_stats import LogHistogram, StreamingStats, TimeBin
from sim.results.summary import HitCounts


def naive_add(stats: StreamingStats, r: RequestRecord) -> None:
    """`StreamingStats.add` as the owners of each rule spell it (the code before it was inlined)."""
    HitCounts.add(stats, r)
    stats.available_tokens = booked_add(stats.available_tokens, r.available_tokens)
    stats.captured_tokens = booked_add(stats.captured_tokens, r.captured_tokens)
    if r.believed_tokens >= 0:
        stats.view_checked += 1
        stats.view_false_hits += r.believed_tokens > r.held_tokens
    stats.preemptions += r.num_preemptions
    stats.output_tokens += r.output_tokens
    stats.slo_met_requests += stats.slo.met_by(r)
    stats.ttft_slo_met += stats.slo.ttft_met(r)
    stats.tpot_slo_met += stats.slo.tpot_met(r)
    stats.e2e_slo_met += stats.slo.e2e_met(r)
    stats.first_sent_s = min(stats.first_sent_s, r.sent_s)
    stats.last_finished_s = max(stats.last_finished_s, r.finished_s)
    stats.ttft_ms.add(r.ttft_s * 1000)
    stats.e2e_ms.add(r.e2e_s * 1000)
    if (tpot_s := r.tpot_s) is not None:
        stats.tpot_ms.add(tpot_s * 1000)
    stats.requests_per_worker[r.worker] += 1
    stats.prompt_tokens_per_worker[r.worker] += r.prompt_tokens
    b = stats.bins.setdefault(int(r.sent_s // stats.bin_s), TimeBin())
    b.requests += 1
    b.prompt_tokens += r.prompt_tokens
    b.cached_tokens += r.cached_tokens
    b.ttft_ms.add(r.ttft_s * 1000)


def state(stats: StreamingStats) -> dict:
    def plain(value):
        if isinstance(value, LogHistogram):
            return (dict(value.counts), value.total)
        if isinstance(value, TimeBin):
            return (value.requests, value.prompt_tokens, value.cached_tokens, plain(value.ttft_ms))
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return {f.name: plain(getattr(stats, f.name)) for f in fields(stats) if f.name != "sessions"}


times = st.floats(min_value=0.0, max_value=500.0, allow_nan=False)


@st.composite
def records(draw, request_id: int):
    sent = draw(times)
    first = sent + draw(st.floats(min_value=0.0, max_value=30.0))
    finished = first + draw(st.floats(min_value=0.0, max_value=30.0))
    prompt = draw(st.integers(1, 5000))
    cached = draw(st.integers(0, prompt - 1))
    cpu = draw(st.integers(0, cached))
    believed = draw(st.integers(-1, prompt))
    return RequestRecord(
        request_id=request_id, prefix_id=None, warmup=False, worker=draw(st.integers(0, 2)), prompt_tokens=prompt,
        output_tokens=draw(st.integers(1, 4)), cached_tokens=cached, shareable_tokens=draw(st.integers(0, prompt)),
        sent_s=sent, arrival_s=sent, admitted_s=sent, engine_first_token_s=first, first_token_s=first,
        finished_s=finished, num_preemptions=draw(st.integers(0, 2)), available_tokens=draw(st.integers(-1, prompt)),
        captured_tokens=draw(st.integers(-1, prompt)), believed_tokens=believed,
        held_tokens=draw(st.integers(0, prompt)) if believed >= 0 else -1, cpu_cached_tokens=cpu,
        shared_cached_tokens=draw(st.integers(0, cached - cpu)))


slos = st.sampled_from([Slo(), Slo(ttft_ms=50.0), Slo(tpot_ms=2.0, e2e_ms=8000.0), Slo(ttft_ms=1.0, tpot_ms=1.0, e2e_ms=1.0)])


@settings(max_examples=200, deadline=None)
@given(st.data(), slos, st.sampled_from([1.0, 60.0]))
def test_add_counts_every_record_as_the_counters_owners_do(data, slo, bin_s):
    fast, naive = StreamingStats(num_workers=3, bin_s=bin_s, slo=slo), StreamingStats(num_workers=3, bin_s=bin_s, slo=slo)
    for i in range(data.draw(st.integers(1, 12))):
        r = data.draw(records(i))
        fast.add(r)
        naive_add(naive, r)
    assert state(fast) == state(naive)


def test_a_ttft_at_or_below_the_first_bin_counts_in_bin_0():
    # 0.01 ms is bin 0's floor: a TTFT of 0 (a response that had no delay at all) and one of exactly 0.01 ms land there.
    stats = StreamingStats(num_workers=1)
    for ttft_s in (0.0, 0.00001):
        stats.add(RequestRecord(request_id=0, prefix_id=None, warmup=False, worker=0, prompt_tokens=10, output_tokens=1,
                                cached_tokens=0, shareable_tokens=0, sent_s=1.0, arrival_s=1.0, admitted_s=1.0,
                                engine_first_token_s=1.0 + ttft_s, first_token_s=1.0 + ttft_s,
                                finished_s=1.0 + ttft_s, num_preemptions=0))
    assert stats.ttft_ms.counts == {0: 2} and stats.tpot_ms.total == 0
