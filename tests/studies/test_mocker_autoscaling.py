"""The autoscaling cross-check's translation of Dynamo's mocker into kvsim's terms
(benchmarks/studies/mocker-cross-check/autoscaling.py; the mocker's callback: benchmarks/oracles/dynamo-mocker/
scaling.md). The mocker itself is not needed: the snapshots and lifecycle operations below have the shape the 1.6.1
wheel gives (recorded by the script's --probe), with numbers chosen for the story."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "studies" / "mocker-cross-check" / "autoscaling.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("mocker_autoscaling_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def fpm(worker, *, prefill=0, decode=0, queued=0, prefill_kv=0, decode_kv=0):
    """One forward-pass record of `decode_fpm_snapshots` (the fields the adapter reads, the rest zero)."""
    return {"worker_id": worker, "dp_rank": 0, "wall_time": 0.02, "num_prefill_requests": prefill,
            "sum_prefill_tokens": 0, "var_prefill_length": 0.0, "sum_prefill_kv_tokens": prefill_kv,
            "num_decode_requests": decode, "sum_decode_kv_tokens": decode_kv, "var_decode_kv_tokens": 0.0,
            "num_queued_prefill": queued, "sum_queued_prefill_tokens": 0, "var_queued_prefill_length": 0.0,
            "num_queued_decode": 0, "sum_queued_decode_kv_tokens": 0, "var_queued_decode_kv_tokens": 0.0}


def snapshot(now_ms, active, starting=(), draining=(), fpms=(), arrived=0, completed=0):
    return {"tick_ordinal": int(now_ms // 15000) - 1, "now_ms": now_ms, "prefill_fpm_snapshots": [],
            "decode_fpm_snapshots": list(fpms), "active_decode_ids": list(active),
            "starting_decode_ids": list(starting), "draining_decode_ids": list(draining),
            "traffic": {"duration_s": 15.0, "num_req": arrived, "avg_isl": 2387.0 if completed else 0.0,
                        "avg_osl": 64.0 if completed else 0.0, "avg_ttft_ms": 0.0, "avg_itl_ms": 0.0,
                        "shape_count": completed, "ttft_count": completed, "itl_count": completed,
                        "avg_accept_length": 1.0, "avg_kv_hit_rate": 0.0, "hit_rate_count": 0,
                        "accept_length_forward_count": 0}}


def test_a_tick_becomes_a_fleet_snapshot(study):
    """Two ready workers and one starting at 105 s: worker 0's last pass ran 3 requests (one prefilling) with 2
    waiting and 4,000 KV tokens of 9,344; worker 1's was an idle record; worker 2 has none (starting)."""
    adapter = study.MockerSnapshotAdapter(146 * 64)
    fleet = adapter.fleet_snapshot(snapshot(105000.0, active=[0, 1], starting=[2],
                                            fpms=[fpm(0, prefill=1, decode=2, queued=2, prefill_kv=1500,
                                                      decode_kv=2500), fpm(1)],
                                            arrived=40, completed=30))
    assert fleet.now_s == 105.0 and fleet.window_s == 15.0
    assert [(w.worker, w.instance, w.phase, w.phase_since_s) for w in fleet.workers] == [
        (0, 0, "ready", 105.0), (1, 1, "ready", 105.0), (2, 2, "starting", 105.0)]
    w0, w1, w2 = fleet.workers
    assert (w0.num_running, w0.num_waiting, w0.in_flight) == (3, 2, 5)
    assert w0.kv_usage == pytest.approx(4000 / 9344)
    assert (w1.in_flight, w1.kv_usage) == (0, 0.0)
    assert (w2.in_flight, w2.kv_usage) == (0, 0.0)
    assert (fleet.arrivals, fleet.completed, fleet.completed_output_tokens) == (40, 30, 30 * 64)
    assert fleet.ttft_ms == () and fleet.arrival_prompt_tokens == 0
    assert (fleet.ready, fleet.starting) == (2, 1)


def test_a_worker_keeps_the_time_it_entered_its_phase(study):
    """Worker 2 is starting at 105 s and 120 s, ready at 165 s, draining at 495 s: phase_since_s is the first tick
    at which the adapter saw each phase."""
    adapter = study.MockerSnapshotAdapter(146 * 64)
    since = []
    for now_ms, active, starting, draining in [(105000.0, [0], [2], []), (120000.0, [0], [2], []),
                                               (165000.0, [0, 2], [], []), (180000.0, [0, 2], [], []),
                                               (495000.0, [0], [], [2])]:
        fleet = adapter.fleet_snapshot(snapshot(now_ms, active, starting, draining))
        since.append(next((w.phase, w.phase_since_s) for w in fleet.workers if w.worker == 2))
    assert since == [("starting", 105.0), ("starting", 105.0), ("ready", 165.0), ("ready", 165.0),
                     ("draining", 495.0)]


def test_counts_spread_the_fleets_exact_in_flight_over_the_ready_workers(study):
    """`counts`: 40 arrived and 30 completed in the first window, 20 and 23 in the second: 10, then 7 in flight,
    spread over 3 ready workers (4, 3, 3, then 3, 2, 2); a starting worker gets none; the gauges are ignored."""
    adapter = study.MockerSnapshotAdapter(146 * 64, in_flight="counts")
    first = adapter.fleet_snapshot(snapshot(15000.0, active=[0, 1, 3], starting=[4], fpms=[fpm(0, decode=9)],
                                            arrived=40, completed=30))
    second = adapter.fleet_snapshot(snapshot(30000.0, active=[0, 1, 3], starting=[4], arrived=20, completed=23))
    assert [w.in_flight for w in first.workers] == [4, 3, 3, 0]
    assert [w.in_flight for w in second.workers] == [3, 2, 2, 0]


def test_lifecycle_operations_become_instance_spans(study):
    """The probe's story (scaling.md, scale 1 -> 3 -> 1 -> 3 without start-up time, ticks every 500 ms): workers 1
    and 2 ready at 0.5 s, drained at 1.0 s and removed when their last requests finish (1.52 s, 1.664 s); workers 3
    and 4 (new ids) ready at 1.5 s. Worker 0 served the two requests listed, one with 64 cached tokens."""
    lifecycle = [
        {"at_ms": 500.0, "cause": "planner_scale", "transitions": [
            {"worker_id": 1, "transition": "worker_ready"}, {"worker_id": 2, "transition": "worker_ready"}]},
        {"at_ms": 1000.0, "cause": "planner_scale", "transitions": [
            {"worker_id": 2, "transition": "worker_draining"}, {"worker_id": 1, "transition": "worker_draining"}]},
        {"at_ms": 1500.0, "cause": "planner_scale", "transitions": [
            {"worker_id": 3, "transition": "worker_ready"}, {"worker_id": 4, "transition": "worker_ready"}]},
        {"at_ms": 1520.0, "cause": "drain_settlement", "transitions": [
            {"worker_id": 2, "transition": "worker_removed"}]},
        {"at_ms": 1664.0, "cause": "drain_settlement", "transitions": [
            {"worker_id": 1, "transition": "worker_removed"}]},
    ]
    requests = [[0.0, 20.0, 500.0, 0, 0, 256, 64], [50.0, 20.0, 500.0, 0, 64, 256, 64]]
    spans = study.mocker_instances(lifecycle, requests, initial_workers=1)
    assert [(s["instance"], s["started_s"], s["ready_s"], s["drained_s"], s["stopped_s"]) for s in spans] == [
        (0, 0.0, 0.0, None, None), (1, 0.5, 0.5, 1.0, 1.664), (2, 0.5, 0.5, 1.0, 1.52),
        (3, 1.5, 1.5, None, None), (4, 1.5, 1.5, None, None)]
    assert (spans[0]["requests"], spans[0]["hit_requests"], spans[0]["cached_tokens"]) == (2, 1, 64)
    assert study.fleet_at(spans, 1.0) == {"ready": 1, "starting": 0, "draining": 2}
    assert study.fleet_at(spans, 1.55) == {"ready": 3, "starting": 0, "draining": 1}
    assert study.fleet_at(spans, 1.7) == {"ready": 3, "starting": 0, "draining": 0}


def test_a_cancelled_start_never_becomes_ready(study):
    """Start-up 1 s: workers 1 and 2 start at 0.5 s, the 1.0 s tick cancels 2 (highest id first), 1 is ready at
    1.5 s."""
    lifecycle = [
        {"at_ms": 500.0, "cause": "planner_scale", "transitions": [
            {"worker_id": 1, "transition": "worker_starting"}, {"worker_id": 2, "transition": "worker_starting"}]},
        {"at_ms": 1000.0, "cause": "planner_scale", "transitions": [
            {"worker_id": 2, "transition": "worker_removed", "reason": "startup_cancelled"}]},
        {"at_ms": 1500.0, "cause": "worker_ready_event", "transitions": [
            {"worker_id": 1, "transition": "worker_ready"}]},
    ]
    spans = study.mocker_instances(lifecycle, [], initial_workers=1)
    assert [(s["instance"], s["started_s"], s["ready_s"], s["stopped_s"]) for s in spans] == [
        (0, 0.0, 0.0, None), (1, 0.5, 1.5, None), (2, 0.5, None, 1.0)]
    assert study.fleet_at(spans, 0.75) == {"ready": 1, "starting": 2, "draining": 0}
    assert study.fleet_at(spans, 1.0) == {"ready": 1, "starting": 1, "draining": 0}


def test_the_ramp_and_its_schedule(study):
    """The ramp: 1 req/s at 0, 10 at 600-900 s, 1 from 1,500 s. The schedule asks, every 60 s, for the workers the
    rate 60 s later needs at 1 req/s each (at least 2), listing only changes."""
    assert [study.ramp_rate_per_s(t) for t in (0, 300, 600, 750, 900, 1200, 1500, 2000)] == [
        1.0, 5.5, 10.0, 10.0, 10.0, 5.5, 1.0, 1.0]
    spec = study.ramp_schedule(lead_s=60.0)
    assert spec.startswith("schedule:at=0/2,60/3,120/4,")
    assert "480/10" in spec and spec.endswith("1380/2")
