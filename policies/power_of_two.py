"""Power of two choices, as SGLang's model gateway implements `--policy power_of_two`.

Upstream (`sgl-project/sglang` `sgl-model-gateway/src/policies/power_of_two.rs` @065f331; the same rule in
`smg-project/smg` `model_gateway/src/policies/power_of_two.rs` up to 0e2f9254f, 2026-08-17):

    i1 ~ U{0..n-1};  i2 = (i1 + 1 + U{0..n-2}) mod n          # two distinct workers, uniform over pairs, ordered
    if both have a polled load:  load_i = polled load          # gateway LoadMonitor, every 10 s
    else:                        load_i = router in-flight     # both degrade together ("fairness")
    w = i1 if load_i1 <= load_i2 else i2                       # ties go to the first sample

Load signals here:
* `load=in_flight` (default): the router's own in-flight counts (`RouterBase.in_flight`), the gateway's fallback,
  and what Dynamo's `--router-mode power-of-two-choices` (`p2c_select_from` in `push_router.rs`) always uses.
* `load=engine`: the engines' metrics as a poller sees them (`view.scraped_load`, every `scrape_interval_s`, default
  the gateway's `--load-monitor-interval` 10 s), compared by `kv_usage` (the KV fraction held by running requests).
  NOTE: sgl-model-gateway compared absolute token loads from `/get_load` and smg (before #2187) the `token_usage`
  ratio; on identical workers both order like `kv_usage`. SGLang's `/get_load` also adds the waiting queue's prompt
  tokens, which the simulator's `EngineLoad` does not carry, so a queue-only imbalance is not seen here.

Doc/code notes: docs/routers/rules.md (p2c) calls the polled load a "cached-token load"; the code's is tokens in use
(sglang) or the KV usage ratio (smg). The gateway polls by default whenever the policy is power_of_two, so a real
deployment with a reachable `/get_load` compares polled loads (`load=engine`); the default here is the in-flight
form (the gateway's fallback, and Dynamo's p2c), which needs no poller. smg #2187 (2026-08-18) replaced the comparison with a least-load expected-wait
score; that newer form is not modelled.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from policies.base import LoadOptions, RouterBase
from sim.routing.interface import ClusterView
from sim.workloads.request import Request


class PowerOfTwoOptions(LoadOptions):
    load: Literal["in_flight", "engine"] = Field(
        "in_flight", description="Load compared between the two samples: the router's in-flight requests, or the "
                                 "engines' polled KV usage (SGLang gateway LoadMonitor).")
    scrape_interval_s: float = Field(10.0, ge=0, description="load=engine: engine loads are polled every this many "
                                                             "seconds (SGLang --load-monitor-interval, 10).")


class PowerOfTwoRouter(RouterBase):
    """Two distinct uniform samples; the first wins unless the second is strictly less loaded.

    Each decision draws two numbers from `self.rng` (none with a single worker)."""

    name = "p2c"
    summary = "power of two choices (SGLang gateway power_of_two): 2 random workers, lower in-flight wins"
    Options = PowerOfTwoOptions

    def sample_pair(self) -> tuple[int, int]:
        """Two distinct routable workers, the gateway's O(1) way: an offset of 1..n-1 from the first, over the
        routable list (the gateway samples the indices of its healthy workers, `get_healthy_worker_indices`, so a
        removed or draining worker is never sampled)."""
        workers = self.workers
        n = len(workers)
        first = self.rng.randrange(n)
        second = (first + 1 + self.rng.randrange(n - 1)) % n
        return workers[first], workers[second]

    def route(self, request: Request, view: ClusterView) -> int:
        if len(self.workers) == 1:
            return self.workers[0]
        first, second = self.sample_pair()
        if self.options.load == "in_flight":
            load1, load2 = self.in_flight[first], self.in_flight[second]
        else:
            interval = self.options.scrape_interval_s
            load1 = view.scraped_load(first, interval).kv_usage
            load2 = view.scraped_load(second, interval).kv_usage
        return first if load1 <= load2 else second
