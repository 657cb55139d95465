"""The elastic fleet narrated (tests/support/fleet_cluster.py): a scale-out mid-run, a drain, cancelling starting
workers first, Kubernetes' deletion order, the timeline's rows, and the scenario form's bad inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.fleet import _Instance, fleet_deletion_order
from sim.results.timeline import instance_rows, timeline_rows
from sim.routing.interface import PrefixStateSpec
from sim.runner import elastic_device_time
from sim.scenario import ScenarioError
from tests.support.fleet_cluster import FleetDriver, ScriptedAutoscaler, fleet_scenario, prefixed


def test_scale_out_mid_run_new_worker_starts_cold_and_warms():
    # One worker; the autoscaler ticks every 10 s and asks for 2 at t=10; provisioning takes 5 s, so worker 1 is
    # ready at exactly 15 s. The router sends to the highest routable worker. Four requests of one shared 32-token
    # prefix (8 blocks) and 8 tokens of their own: at 1 s and 2 s on worker 0 (a miss, then the prefix hits), at
    # 16 s and 17 s on the new worker 1: its first request misses (an empty cache), its second hits.
    sc = fleet_scenario(max_workers=2, delay_s=5.0, timeline_bin_s=10.0)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0: 2}))
    for at_s, rid in ((1, 1), (2, 2), (16, 3), (17, 4)):
        driver.send(at_s, prefixed(rid))
    driver.run(until=30)

    served = {rid: (r.worker, r.cached_tokens) for rid, r in driver.records.items()}
    assert served == {1: (0, 0), 2: (0, 32), 3: (1, 0), 4: (1, 32)}
    # The router heard worker 0 alone at build time, then workers 0 and 1 (instances 0 and 1) at 15 s.
    assert driver.router.memberships == [((0,), (0,)), ((0, 1), (0, 1))]
    spans = driver.fleet.result(30.0).instances
    assert [(s.slot, s.instance, s.started_s, s.ready_s, s.drained_s, s.stopped_s) for s in spans] == [
        (0, 0, 0.0, 0.0, None, None), (1, 1, 10.0, 15.0, None, None)]
    assert [(s.requests, s.hit_requests, s.cached_tokens) for s in spans] == [(2, 1, 32), (2, 1, 32)]
    # The snapshot at 10 s saw the first window's traffic: two arrivals of 40 prompt tokens, 32 of them cached.
    first = driver.fleet.autoscaler.snapshots[0]
    assert (first.now_s, first.ready, first.starting, first.arrivals, first.arrival_prompt_tokens,
            first.completed, first.cached_prompt_tokens, first.admitted_prompt_tokens) == (10.0, 1, 0, 2, 80, 2, 32, 80)
    second = driver.fleet.autoscaler.snapshots[1]
    assert [(w.worker, w.instance, w.phase, w.phase_since_s) for w in second.workers] == [
        (0, 0, "ready", 0.0), (1, 1, "ready", 15.0)]
    # Device-seconds: worker 0 for 30 s, worker 1 from its launch at 10 s (starting is paid for) to 30 s.
    assert driver.fleet.result(30.0).device_seconds() == 50.0


def test_timeline_rows_show_the_new_worker_cold():
    # The scale-out above with a cold window of 10 s, 10 s rows, and a fifth request at 26 s. Cold: requests sent
    # within 10 s of their worker's ready time: 1 and 2 (worker 0, ready at 0 s: the initial fleet starts cold
    # too), 3 and 4 (worker 1, ready at 15 s); not 5 (worker 1, ready for 11 s), which hits.
    sc = fleet_scenario(max_workers=2, delay_s=5.0, timeline_bin_s=10.0, cold_window_s=10.0)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0: 2}))
    for at_s, rid in ((1, 1), (2, 2), (16, 3), (17, 4), (26, 5)):
        driver.send(at_s, prefixed(rid))
    driver.run(until=30)
    rows = timeline_rows(driver.fleet.timeline, driver.fleet.result(30.0).instances, driver.fleet.decisions, 30.0)
    columns = ("start_s", "workers_ready", "workers_starting", "workers_launched", "desired_workers", "arrivals_rps",
               "request_hit_rate", "cold_requests", "cold_request_hit_rate")
    assert [tuple(str(r[c]) for c in columns) for r in rows] == [
        ("0.0", "1", "0", "0", "2", "0.2", "0.5", "2", "0.5"),  # the tick at 10 s answered 2
        ("10.0", "2", "0", "1", "2", "0.2", "0.5", "2", "0.5"),  # launched at 10 s, ready at 15 s; its first miss
        ("20.0", "2", "0", "0", "", "0.1", "1.0", "0", "nan"),  # no tick inside (20, 30) before the run stopped
    ]
    assert [(r["slot"], r["instance"], r["ready_s"], r["requests"], r["request_hit_rate"])
            for r in instance_rows(driver.fleet.result(30.0).instances)] == [
        (0, 0, 0.0, 2, 0.5), (1, 1, 15.0, 3, 2 / 3)]


def test_drain_finishes_running_requests_then_drops_the_cache():
    # Two workers; at 10 s the autoscaler asks for 1. Both became ready at 0 s, so the higher instance (worker 1)
    # drains. A long request (200 output tokens) sent to worker 1 at 9 s is still decoding at 10 s: worker 1 takes
    # no new request (the one at 11 s goes to worker 0), finishes it, and stops at the moment it completes; its
    # cache is then gone (a peek finds nothing), its KV event subscriber got `cleared`, and an index fed by those
    # events (a router's `events` prefix state) no longer believes it holds the prefix.
    sc = fleet_scenario(min_workers=1, max_workers=2, initial_workers=2)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0: 1}))
    events = []
    driver.cluster.subscribe_cache(1, lambda batch, at_s: events.extend((e.kind, at_s) for e in batch))
    index = driver.cluster.prefix_state(PrefixStateSpec(mode="events"))
    driver.send(9.0, prefixed(1, output_tokens=200))
    driver.send(11.0, prefixed(2))
    driver.run(until=9.5)
    assert index.match_tokens(prefixed(3)) == [0, 32]  # worker 1 holds the 8 shared blocks (32 tokens)
    driver.run(until=20)
    assert index.match_tokens(prefixed(3)) == [32, 0]  # worker 0 got them with request 2; worker 1's are gone

    long, later = driver.records[1], driver.records[2]
    assert long.worker == 1 and long.finished_s > 10.0
    assert later.worker == 0 and later.cached_tokens == 0  # worker 0 never saw the prefix
    assert driver.router.memberships[-1] == ((0,), (0,))
    (span,) = [s for s in driver.fleet.result(20.0).instances if s.slot == 1]
    assert (span.ready_s, span.drained_s, span.stopped_s, span.requests) == (0.0, 10.0, long.finished_s, 1)
    assert driver.cluster.cached_prefix_tokens(1, prefixed(3)) == 0
    assert events[-1] == ("cleared", long.finished_s)
    assert ("stored", 9.05) in [(k, round(t, 3)) for k, t in events]  # it held the prefix before
    # The slot's counters keep the stopped engine's lookups (one request of 40 tokens).
    assert driver.cluster.counters()[1].engine.prefix_cache.queries == 40


def test_scale_in_cancels_starting_workers_first():
    # Two ready workers, a 100 s provisioning delay. At 10 s the autoscaler asks for 4: workers 2 and 3 start. At
    # 20 s it asks for 3: the newest starting one (instance 3; both started together, the higher id goes first) is
    # cancelled, not a ready one. At 30 s, 2: instance 2 is cancelled. Neither ever served; the ready ones stay.
    sc = fleet_scenario(min_workers=1, max_workers=4, initial_workers=2, delay_s=100.0)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0: 4, 20.0: 3, 30.0: 2}))
    driver.run(until=40)
    spans = {s.instance: s for s in driver.fleet.result(40.0).instances}
    assert [(i, s.slot, s.started_s, s.ready_s, s.drained_s, s.stopped_s) for i, s in sorted(spans.items())] == [
        (0, 0, 0.0, 0.0, None, None), (1, 1, 0.0, 0.0, None, None),
        (2, 2, 10.0, None, None, 30.0), (3, 3, 10.0, None, None, 20.0)]
    assert driver.router.memberships == [((0, 1), (0, 1))]  # never told of a change
    assert [(d.now_s, d.desired_workers, d.target_workers, d.ready, d.starting) for d in driver.fleet.decisions] == [
        (10.0, 4, 4, 2, 0), (20.0, 3, 3, 2, 2), (30.0, 2, 2, 2, 1)]
    # Paid for: 2 x 40 s ready, 20 s and 10 s starting; one DeviceTime per instance on its slot's device (a linear
    # time model names no hardware: one GPU, no price).
    assert driver.fleet.result(40.0).device_seconds() == 110.0
    times = elastic_device_time(sc, driver.fleet.result(40.0), 0.0, 40.0)
    assert [(t.device, t.hardware, t.gpus, t.seconds) for t in times] == [
        ("gpu-0", None, 1, 40.0), ("gpu-1", None, 1, 40.0), ("gpu-2", None, 1, 20.0), ("gpu-3", None, 1, 10.0)]
    assert all(math.isnan(t.price_per_hour_usd) for t in times)
    # Over a measured phase [15, 25]: each instance's overlap with it.
    in_phase = elastic_device_time(sc, driver.fleet.result(40.0), 15.0, 25.0)
    assert [t.seconds for t in in_phase] == [10.0, 10.0, 10.0, 5.0]


def test_answers_are_clamped_to_the_bounds_and_the_slots():
    # min 1, max 3: an answer of 9 starts 2 (to 3), an answer of 0 keeps 1 (the newest-ready two drain).
    sc = fleet_scenario(min_workers=1, max_workers=3, delay_s=1.0)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0: 9, 20.0: 0}))
    driver.run(until=25)
    assert [(d.desired_workers, d.target_workers) for d in driver.fleet.decisions] == [(9, 3), (0, 1)]
    assert driver.router.memberships == [((0,), (0,)), ((0, 1), (0, 1)), ((0, 1, 2), (0, 1, 2)), ((0,), (0,))]


def test_a_stopped_slot_is_reused_by_a_new_instance_with_a_new_id():
    sc = fleet_scenario(min_workers=1, max_workers=2, initial_workers=2, delay_s=1.0)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0: 1, 20.0: 2}))
    driver.run(until=25)
    assert driver.router.memberships == [((0, 1), (0, 1)), ((0,), (0,)), ((0, 1), (0, 2))]


def _inst(instance: int, started_s: float, ready_s: float | None) -> _Instance:
    return _Instance(slot=instance, instance=instance, started_s=started_s, ready_s=ready_s)


def test_deletion_order_is_kubernetes_replicaset_order():
    # now = 1,000 s. Not ready before ready; among ready, ready for the shortest time first in log2(ns) buckets:
    # ready 10 s (2^33.2 ns), 500 s (2^38.9), 1,000 s and 999 s (both 2^39.9: the same bucket, the higher id
    # first). Among starting ones the newest first.
    pods = [_inst(0, 0.0, 0.0), _inst(1, 0.0, 1.0), _inst(2, 400.0, 500.0), _inst(3, 980.0, 990.0),
            _inst(4, 995.0, None), _inst(5, 900.0, None)]
    assert [p.instance for p in fleet_deletion_order(pods, 1000.0)] == [4, 5, 3, 2, 1, 0]


@settings(max_examples=60, deadline=None)
@given(answers=st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=8),
       delay_s=st.sampled_from([0.0, 3.0, 15.0]))
def test_every_tick_reconciles_to_the_clamped_answer(answers, delay_s):
    # Whatever the answers, after each tick ready + starting = the answer clamped to [1, 5] (no request runs, so a
    # drained worker stops at once and frees its slot), the routable set is never empty, and device-seconds are the
    # sum of the instances' spans.
    sc = fleet_scenario(min_workers=1, max_workers=5, delay_s=delay_s)
    script = {10.0 * (i + 1): n for i, n in enumerate(answers)}
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, script))
    end_s = 10.0 * len(answers) + 5
    driver.run(until=end_s)
    for d, n in zip(driver.fleet.decisions, answers):
        assert d.target_workers == min(max(n, 1), 5)
    live = driver.fleet.live.values()
    assert sum(1 for i in live if i.phase != "draining") == min(max(answers[-1], 1), 5)
    assert all(len(workers) >= 1 for workers, _ in driver.router.memberships)
    spans = driver.fleet.result(end_s).instances
    assert driver.fleet.result(end_s).device_seconds() == pytest.approx(
        sum((s.stopped_s if s.stopped_s is not None else end_s) - s.started_s for s in spans))


@pytest.mark.parametrize("cluster, message", [
    ({"workers": 3}, "cluster.workers (3) must equal cluster.autoscaling.max_workers (2)"),
    ({"disaggregation": {"prefill": {"workers": 1}, "decode": {"workers": 1}}},
     "cluster.autoscaling: not modelled with P/D pools"),
    ({"deployments": [{"workers": 2, "devices": [{"name": "big", "workers": 2}]}]},
     "every worker needs a device of its own"),
])
def test_bad_autoscaling_forms_are_one_line_errors(cluster, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fleet_scenario(max_workers=2, **cluster)


def test_bounds_are_checked():
    with pytest.raises(ScenarioError, match=r"min_workers \(3\) must be <= max_workers \(2\)"):
        fleet_scenario(min_workers=3, max_workers=2)
    with pytest.raises(ScenarioError, match=r"initial_workers \(4\) must be in \[min_workers, max_workers\]"):
        fleet_scenario(max_workers=2, initial_workers=4)


@settings(max_examples=30, deadline=None)
@given(answers=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=6),
       sends=st.lists(st.tuples(st.floats(min_value=0.0, max_value=60.0), st.integers(min_value=1, max_value=100)),
                      min_size=1, max_size=20),
       delay_s=st.sampled_from([0.0, 4.0, 12.0]))
def test_requests_go_only_to_ready_workers_and_all_complete(answers, sends, delay_s):
    # Random answers every 10 s and random requests (send time, output tokens): every request completes; each was
    # sent to an instance ready at its send time and not yet drained; a slot's instances never overlap; a drained
    # instance stops when its last request completes (or at once), and only then.
    sc = fleet_scenario(min_workers=1, max_workers=4, delay_s=delay_s)
    driver = FleetDriver(sc, ScriptedAutoscaler(10.0, {10.0 * (i + 1): n for i, n in enumerate(answers)}))
    for rid, (at_s, output_tokens) in enumerate(sends):
        driver.send(at_s, prefixed(rid, output_tokens=output_tokens))
    driver.run(until=400)
    assert len(driver.records) == len(sends)
    spans = driver.fleet.result(400.0).instances
    for r in driver.records.values():
        (span,) = [s for s in spans if s.slot == r.worker and s.started_s <= r.sent_s
                   and (s.stopped_s is None or r.finished_s <= s.stopped_s)]
        assert span.ready_s is not None and span.ready_s <= r.sent_s
        assert span.drained_s is None or r.sent_s <= span.drained_s  # a send and a tick at one instant: send first
    for slot in range(4):
        mine = sorted((s for s in spans if s.slot == slot), key=lambda s: s.started_s)
        assert all(a.stopped_s is not None and a.stopped_s <= b.started_s for a, b in zip(mine, mine[1:]))
    for s in spans:
        if s.drained_s is not None:
            last = max((r.finished_s for r in driver.records.values() if r.worker == s.slot
                        and s.started_s <= r.sent_s and (r.finished_s <= s.stopped_s)), default=s.drained_s)
            assert s.stopped_s == max(last, s.drained_s)
