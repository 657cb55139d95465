"""What every router shares: option parsing at the edge and no-op hooks."""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from sim.workloads.request import Request
from sim.cluster.router import ClusterView


class RouterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RouterBase:
    """Base for routers: parses `options` into `Options` (unknown keys are an error) and ignores hooks."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[RouterOptions]] = RouterOptions
    needs_cache_state: ClassVar[bool] = False
    """True if `route` peeks into the workers' caches (so it cannot drive real servers without KV events)."""
    ignores_cluster_state: bool = False
    """True if `route` depends only on the requests routed before (and the router's own random stream), never on
    the cluster view or on the hooks: routing is then the same whatever the workers do, so a replay can be split
    by worker over processes (`sim.replay`). A class default; a router may set it per instance from its options."""

    def __init__(self, *, num_workers: int, block_size: int, rng: random.Random, options: dict[str, Any]) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.block_size = block_size
        self.rng = rng
        try:
            self.options = self.Options.model_validate(options)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            allowed = ", ".join(self.Options.model_fields) or "none"
            raise ValueError(f"{field}: {first['msg']} (options of {self.name}: {allowed})") from None

    def route(self, request: Request, view: ClusterView) -> int:
        raise NotImplementedError

    def on_dispatch(self, request: Request, worker: int) -> None:
        pass

    def on_first_token(self, request: Request, worker: int) -> None:
        pass

    def on_complete(self, request: Request, worker: int) -> None:
        pass
