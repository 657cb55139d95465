"""Routers for disaggregated clusters (a prefill pool and a decode pool): the two-stage base every such router
shares, and the generic `pd-stages` router that lets any aggregated router route each pool.

The contract is `sim.routing.interface.DisaggregatedRouter`: `route_pd` at arrival answers a `PdChoice` (a prefill
worker or None for a local prefill, a decode worker or None to choose it once the prefill is done), then
`route_decode` when needed; the hooks carry the stage. Each pool is seen through its own `ClusterView` (workers
0..n-1 of the pool), so a stage router is an ordinary `Router` bound to that pool's view.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.config import ProblemsError, validation_problems
from sim.routing.interface import ClusterView, PdChoice, PdStage, Router, RouterFactory
from sim.workloads.request import Request


class PdRouterOptions(BaseModel):
    """Options every disaggregated router has."""

    # NOTE: defer_build, as sim.config.ConfigModel: only the options of the routers a command uses are built.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    processing_s: float = Field(0.0, ge=0, description="The router's own time per routing decision (each stage it routes), added to the hop.")


class PdRouterBase:
    """Base of the disaggregated routers: parses `options` into `Options` (unknown keys are an error), builds the
    stage routers with `stage_router`, binds them to their pools' views, and forwards each hook to the stage's
    router (a request prefilled locally on its decode worker only has decode-stage hooks).

    Subclasses implement `route_pd` (and `route_decode` if they leave the decode worker to after the prefill).
    Each stage router draws from a random stream of its own, derived from the router's stream in build order.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[PdRouterOptions]] = PdRouterOptions
    disaggregated: ClassVar[bool] = True
    own_policy: ClassVar[bool] = False
    search_space: ClassVar[tuple] = ()
    needs_cache_state: ClassVar[bool] = True
    ignores_cluster_state: bool = False

    def __init__(self, *, num_prefill_workers: int, num_decode_workers: int, block_size: int, rng: random.Random,
                 options: dict[str, Any], stage_routers: dict[str, RouterFactory]) -> None:
        if num_prefill_workers < 1 or num_decode_workers < 1:
            raise ValueError(f"a disaggregated router needs >= 1 prefill and >= 1 decode worker, got "
                             f"{num_prefill_workers} and {num_decode_workers}")
        self.num_prefill_workers = num_prefill_workers
        self.num_decode_workers = num_decode_workers
        self.block_size = block_size
        self.rng = rng
        self.options = self.parse_options(options)
        self.processing_s = self.options.processing_s
        self._stage_routers = stage_routers
        self.prefill_view: ClusterView | None = None
        self.decode_view: ClusterView | None = None
        self.prefill: Router | None = None
        """The prefill pool's router (None: the subclass routes that pool itself)."""
        self.decode: Router | None = None
        """The decode pool's router (None: the subclass routes that pool itself)."""

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> PdRouterOptions:
        """`options` as this router's `Options`, or a one-line ProblemsError naming each bad option."""
        try:
            return cls.Options.model_validate(options)
        except ValidationError as err:
            raise ProblemsError(validation_problems(err, cls.Options, noun=f"option of {cls.name}")) from None

    def stage_router(self, stage: PdStage, name: str, options: dict[str, Any]) -> Router:
        """An aggregated router `name` with `options` for `stage`'s pool (a ValueError names an unknown one)."""
        factory = self._stage_routers.get(name)
        if factory is None:
            raise ValueError(f"{stage}_router: unknown router {name!r}; allowed: {', '.join(sorted(self._stage_routers))}")
        size = self.num_prefill_workers if stage == "prefill" else self.num_decode_workers
        router = factory(num_workers=size, block_size=self.block_size,
                         rng=random.Random(self.rng.getrandbits(64)), options=dict(options))
        if getattr(router.options, "replicas", 1) != 1:
            raise ValueError(f"{stage}_options: replicas is not supported for a stage router")
        return router

    # ------------------------------------------------------------------ the interface
    def bind(self, prefill: ClusterView, decode: ClusterView) -> None:
        self.prefill_view, self.decode_view = prefill, decode
        if self.prefill is not None:
            self.prefill.bind(prefill)
        if self.decode is not None:
            self.decode.bind(decode)

    def route_pd(self, request: Request, prefill: ClusterView, decode: ClusterView) -> PdChoice:
        raise NotImplementedError

    def route_decode(self, request: Request, decode: ClusterView, *, prefill_worker: int) -> int:
        return self.decode.route(request, decode)

    def _stage(self, stage: PdStage) -> Router | None:
        return self.prefill if stage == "prefill" else self.decode

    def on_dispatch(self, request: Request, worker: int, stage: PdStage) -> None:
        router = self._stage(stage)
        if router is not None:
            router.on_dispatch(request, worker)

    def believed_prefix_tokens(self, request: Request, stage: PdStage) -> int | None:
        router = self._stage(stage)
        return None if router is None else router.believed_prefix_tokens(request)

    def on_first_token(self, request: Request, worker: int, stage: PdStage) -> None:
        router = self._stage(stage)
        if router is not None:
            router.on_first_token(request, worker)

    def on_complete(self, request: Request, worker: int, stage: PdStage) -> None:
        router = self._stage(stage)
        if router is not None:
            router.on_complete(request, worker)


class PdStagesOptions(PdRouterOptions):
    prefill_router: str = Field("kv-aware", description="The aggregated router (see `kvsim routers`) that picks the prefill worker, over the prefill pool.")
    prefill_options: dict[str, Any] = Field(default_factory=dict, description="Options of prefill_router.")
    decode_router: str = Field("least-loaded", description="The aggregated router that picks the decode worker, over the decode pool.")
    decode_options: dict[str, Any] = Field(default_factory=dict, description="Options of decode_router.")
    decode_after_prefill: bool = Field(True, description="Pick the decode worker when the prefill's response is back (Dynamo's order); false: at arrival, with the prefill worker (SGLang's PD router, llm-d).")


class PdStagesRouter(PdRouterBase):
    """Any aggregated router on each pool: every request is prefilled remotely on `prefill_router`'s choice over
    the prefill pool and decoded on `decode_router`'s choice over the decode pool. This is also what a
    disaggregated cluster runs with an aggregated `router:` (that router on both pools)."""

    name = "pd-stages"
    summary = "any router per pool: prefill_router over the prefill pool, decode_router over the decode pool"
    Options = PdStagesOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        opts = self.options
        self.prefill = self.stage_router("prefill", opts.prefill_router, opts.prefill_options)
        self.decode = self.stage_router("decode", opts.decode_router, opts.decode_options)

    def route_pd(self, request: Request, prefill: ClusterView, decode: ClusterView) -> PdChoice:
        p = self.prefill.route(request, prefill)
        d = None if self.options.decode_after_prefill else self.decode.route(request, decode)
        return PdChoice(prefill_worker=p, decode_worker=d)
