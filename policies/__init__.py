"""Routing policies and autoscalers. `ROUTERS` is the one registry of routers (adding a router is one class plus one
line here); `AUTOSCALERS` (`policies.autoscalers`) is the one registry of autoscalers."""

from __future__ import annotations

from policies.autoscalers import AUTOSCALERS
from policies.aibrix import AibrixLeastKvCacheRouter, AibrixPrefixCacheRouter
from policies.base import RouterBase
from policies.disaggregated import PdRouterBase, PdStagesRouter
from policies.dynamo_disagg import DynamoDisaggRouter
from policies.kv_aware import KvAwareRouter
from policies.kvsim_router import KvsimRouter
from policies.least_loaded import LeastLoadedRouter
from policies.llm_d import LlmdRouter
from policies.llm_d_pd import LlmdPdRouter
from policies.power_of_two import PowerOfTwoRouter
from policies.preble import PrebleRouter
from policies.prefix_hash import PrefixHashRouter
from policies.random_router import RandomRouter
from policies.recorded import RecordedRouter
from policies.round_robin import RoundRobinRouter
from policies.sglang_gateway import SglangCacheAwareRouter
from policies.sglang_pd import SglangPdRouter
from policies.sticky import StickyRouter
from policies.vllm_router import VllmRouterLoadAware, VllmRouterPrefixAware, VllmRouterSession
from sim.config import named_registry


ROUTERS: dict[str, type[RouterBase]] = named_registry("router", (
    RandomRouter, RoundRobinRouter, PrefixHashRouter, KvAwareRouter, RecordedRouter,
    AibrixPrefixCacheRouter, AibrixLeastKvCacheRouter,
    VllmRouterSession, VllmRouterPrefixAware, VllmRouterLoadAware,
    LeastLoadedRouter, PowerOfTwoRouter, StickyRouter, LlmdRouter,
    SglangCacheAwareRouter, PrebleRouter, KvsimRouter))

PD_ROUTERS: dict[str, type[PdRouterBase]] = named_registry(
    "disaggregated router", (PdStagesRouter, DynamoDisaggRouter, LlmdPdRouter, SglangPdRouter), taken=ROUTERS)
"""Routers of disaggregated clusters (`sim.routing.interface.DisaggregatedRouter`): one class plus one line here."""

__all__ = ["AUTOSCALERS", "PD_ROUTERS", "ROUTERS"]
