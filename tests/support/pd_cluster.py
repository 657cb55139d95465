"""Narrated P/D clusters for tests: the scenario the P/D tests share (4-token blocks, 1,000 KV bytes a token, the
linear time model step = 0.01 s + 0.001 s per prefill token + 0.002 s per decode, 400 kB of KV per worker, a
transfer link of 1 MB/s: a transfer of n tokens takes n ms plus the link's latency and overhead), their requests (a
shared prefix, then blocks of their own) and a driver that sends requests at given times and keeps the records."""

from __future__ import annotations

from typing import Any

import simpy

from sim.runner import build_cluster, build_pd_router
from sim.scenario import Scenario, validate_scenario
from sim.workloads.request import Request

BLOCK_TOKENS = 4
LINK_1MB_S = {"bandwidth_bytes_per_s": 1e6, "latency_s": 0.0}
"""1 MB/s with no latency: at 1,000 KV bytes a token, a transfer of n tokens takes n ms."""


def pd_scenario(router: dict[str, Any], *, name: str, prefill_workers: int = 2, decode_workers: int = 2,
                link: dict[str, float] | None = None, engine: str = "vllm", **cluster: Any) -> Scenario:
    """The narrated P/D scenario: `prefill_workers` then `decode_workers` (cluster workers in that order) of
    `engine`, joined by `link` (default `LINK_1MB_S`), routed by `router`; `cluster` sets (or replaces) cluster
    fields."""
    vllm_only = {"vllm_version": "0.33.0", "max_num_batched_tokens": 1000} if engine == "vllm" else {}
    data = {
        "name": name,
        "model": {"kv_bytes_per_token": 1000},
        "engine": {"kind": engine, "block_size": BLOCK_TOKENS, "kv_cache_bytes": 400_000, "max_model_len": 1000,
                   **vllm_only},
        "workload": {"prefixes": 1, "prefix_tokens": 32, "tail_tokens": 8, "output_tokens": 3},
        "router": router,
        "time_model": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.001, "decode_seq_s": 0.002},
        "cluster": {"workers": prefill_workers + decode_workers,
                    "disaggregation": {"prefill": {"workers": prefill_workers},
                                       "decode": {"workers": decode_workers},
                                       "link": link or LINK_1MB_S},
                    **cluster},
    }
    return validate_scenario(data, source="test")


def pd_request(rid: int, shared_blocks: int, own_blocks: int, *, prefix: Any = "shared",
               output_tokens: int = 3) -> Request:
    """A prompt of `shared_blocks` blocks of prefix `prefix`, then `own_blocks` of its own (4 tokens a block)."""
    blocks = tuple((prefix, i) for i in range(shared_blocks)) + tuple((rid, i) for i in range(own_blocks))
    return Request(rid, BLOCK_TOKENS * len(blocks), output_tokens, blocks)


class PdDriver:
    """`sc`'s cluster and P/D router on a fresh SimPy clock (`env`): `send(at_s, request)` schedules a request (in
    call order for equal times), `run(until)` advances the clock, `records` holds each finished request's record by
    request id."""

    def __init__(self, sc: Scenario) -> None:
        self.env = simpy.Environment()
        self.router = build_pd_router(sc)
        self.cluster = build_cluster(self.env, sc, self.router)
        self.records: dict[int, Any] = {}

    def send(self, at_s: float, request: Request) -> None:
        self.env.process(self._send(at_s, request))

    def _send(self, at_s: float, request: Request):
        yield self.env.timeout(at_s)
        self.records[request.request_id] = yield self.cluster.send(request)

    def run(self, until: float | None = None) -> None:
        self.env.run(until=until)


def run_pd(sc: Scenario, sends: list[tuple[float, Request]], *, until: float | None = None) -> PdDriver:
    """Send each (time, request) on `sc`'s cluster and run until `until` (None: until nothing is left)."""
    driver = PdDriver(sc)
    for at_s, request in sends:
        driver.send(at_s, request)
    driver.run(until)
    return driver
