"""Narrated autoscaled clusters for tests: a scripted autoscaler (answers given by tick time), a router that sends
every request to the highest routable worker and records the membership it was told, and a driver that sends
requests at given times on an autoscaled `Cluster`.

The scenario: 4-token blocks, 1,000 KV bytes a token, 400 kB of KV per worker, the linear time model step = 0.01 s
+ 0.001 s per prefill token + 0.002 s per decode sequence; `delay_s` of provisioning."""

from __future__ import annotations

from typing import Any, ClassVar

import simpy

from sim.cluster.cluster import Cluster
from sim.scaling import FleetSnapshot
from sim.scenario import Scenario, validate_scenario
from sim.workloads.request import Request

BLOCK_TOKENS = 4


class ScriptedAutoscaler:
    """Answers `answers[tick time]` (else the fleet's ready + starting: no change); keeps every snapshot."""

    name: ClassVar[str] = "scripted"

    def __init__(self, interval_s: float, answers: dict[float, int]) -> None:
        self.interval_s = interval_s
        self.answers = answers
        self.snapshots: list[FleetSnapshot] = []

    def desired_workers(self, snapshot: FleetSnapshot) -> int:
        self.snapshots.append(snapshot)
        return self.answers.get(snapshot.now_s, snapshot.ready + snapshot.starting)


class HighestWorkerRouter:
    """Routes to the highest routable worker; `memberships` keeps each `set_workers` call (workers, instances)."""

    name: ClassVar[str] = "highest"
    processing_s = 0.0

    def __init__(self, num_workers: int) -> None:
        self.workers = tuple(range(num_workers))
        self.memberships: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def bind(self, view) -> None:
        pass

    def route(self, request, view) -> int:
        return self.workers[-1]

    def on_dispatch(self, request, worker) -> None:
        pass

    def believed_prefix_tokens(self, request) -> None:
        return None

    def on_first_token(self, request, worker) -> None:
        pass

    def on_complete(self, request, worker) -> None:
        pass

    def set_workers(self, workers, instances) -> None:
        self.workers = workers
        self.memberships.append((workers, instances))


def fleet_scenario(*, min_workers: int = 1, max_workers: int = 2, initial_workers: int | None = None,
                   delay_s: float = 5.0, timeline_bin_s: float | None = None, cold_window_s: float = 300.0,
                   **cluster: Any) -> Scenario:
    scaling: dict[str, Any] = {"autoscaler": {"name": "scripted"}, "min_workers": min_workers,
                               "max_workers": max_workers, "provisioning": {"delay_s": delay_s},
                               "cold_window_s": cold_window_s}
    if initial_workers is not None:
        scaling["initial_workers"] = initial_workers
    if timeline_bin_s is not None:
        scaling["timeline_bin_s"] = timeline_bin_s
    data = {
        "name": "fleet",
        "model": {"kv_bytes_per_token": 1000},
        "engine": {"kind": "vllm", "vllm_version": "0.33.0", "block_size": BLOCK_TOKENS, "kv_cache_bytes": 400_000,
                   "max_model_len": 1000, "max_num_batched_tokens": 1000},
        "workload": {"prefixes": 1, "prefix_tokens": 32, "tail_tokens": 8, "output_tokens": 3},
        "time_model": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.001, "decode_seq_s": 0.002},
        "cluster": {"autoscaling": scaling, **cluster},
    }
    return validate_scenario(data, source="test")


def prefixed(rid: int, shared_blocks: int = 8, own_blocks: int = 2, *, output_tokens: int = 3) -> Request:
    """`shared_blocks` blocks of one shared prefix, then `own_blocks` of its own (4 tokens a block)."""
    blocks = tuple(("shared", i) for i in range(shared_blocks)) + tuple((rid, i) for i in range(own_blocks))
    return Request(rid, BLOCK_TOKENS * len(blocks), output_tokens, blocks)


class FleetDriver:
    """`sc`'s autoscaled cluster with `autoscaler` and a `HighestWorkerRouter` on a fresh clock; `send(at_s,
    request)` schedules a request, `run(until)` advances the clock, `records` by request id."""

    def __init__(self, sc: Scenario, autoscaler: ScriptedAutoscaler) -> None:
        self.env = simpy.Environment()
        self.router = HighestWorkerRouter(sc.cluster.workers)
        self.cluster = Cluster(self.env, sc, self.router, autoscaler=autoscaler)
        self.fleet = self.cluster.fleet
        self.records: dict[int, Any] = {}

    def send(self, at_s: float, request: Request) -> None:
        self.env.process(self._send(at_s, request))

    def _send(self, at_s: float, request: Request):
        yield self.env.timeout(at_s)
        self.records[request.request_id] = yield self.cluster.send(request)

    def run(self, until: float) -> None:
        self.env.run(until=until)
