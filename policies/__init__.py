"""Routing policies and autoscalers. `ROUTERS` is the one registry of routers (adding a router is one class plus one
line here); `AUTOSCALERS` (`policies.autoscalers`) is the one registry of autoscalers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.autoscalers import AUTOSCALERS
from sim.config import LazyRegistry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from policies.base import RouterBase
    from policies.disaggregated import PdRouterBase

# NOTE: lazy (issue 27, whole commands): a command that runs one router imports that router's module only, where
# importing all of them cost every replay ~40 ms; `kvsim routers` and `items()` still load every one, and a class
# whose `name` differs from its line here is refused when loaded (tests/routers/test_routers.py loads them all).
ROUTERS: Mapping[str, type[RouterBase]] = LazyRegistry("router", (
    ("random", "policies.random_router:RandomRouter"),
    ("round-robin", "policies.round_robin:RoundRobinRouter"),
    ("prefix-hash", "policies.prefix_hash:PrefixHashRouter"),
    ("kv-aware", "policies.kv_aware:KvAwareRouter"),
    ("recorded", "policies.recorded:RecordedRouter"),
    ("aibrix-prefix-cache", "policies.aibrix:AibrixPrefixCacheRouter"),
    ("aibrix-least-kv-cache", "policies.aibrix:AibrixLeastKvCacheRouter"),
    ("vllm-router-session", "policies.vllm_router:VllmRouterSession"),
    ("vllm-router-prefix-aware", "policies.vllm_router:VllmRouterPrefixAware"),
    ("vllm-router-loadaware", "policies.vllm_router:VllmRouterLoadAware"),
    ("least-loaded", "policies.least_loaded:LeastLoadedRouter"),
    ("p2c", "policies.power_of_two:PowerOfTwoRouter"),
    ("sticky", "policies.sticky:StickyRouter"),
    ("llm-d", "policies.llm_d:LlmdRouter"),
    ("sglang-cache-aware", "policies.sglang_gateway:SglangCacheAwareRouter"),
    ("preble", "policies.preble:PrebleRouter"),
    ("kvsim", "policies.kvsim_router:KvsimRouter")))
"""Router name -> its class, imported on first lookup: one line here per router."""

PD_ROUTERS: Mapping[str, type[PdRouterBase]] = LazyRegistry("disaggregated router", (
    ("pd-stages", "policies.disaggregated:PdStagesRouter"),
    ("dynamo-disagg", "policies.dynamo_disagg:DynamoDisaggRouter"),
    ("llm-d-pd", "policies.llm_d_pd:LlmdPdRouter"),
    ("sglang-pd", "policies.sglang_pd:SglangPdRouter")), taken=ROUTERS)
"""Routers of disaggregated clusters (`sim.routing.interface.DisaggregatedRouter`): one line here per router."""

__all__ = ["AUTOSCALERS", "PD_ROUTERS", "ROUTERS"]
