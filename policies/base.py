"""What every router shares: option parsing at the edge, router-side load counts, the prefix state it reads, and
the hooks' bookkeeping (subclasses add theirs in `after_dispatch`, `after_first_token`, `after_complete`)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.config import ProblemsError, validation_problems
from sim.routing.interface import ClusterView, PrefixState, PrefixStateSpec, StateMode
from sim.routing.knobs import Knob
from sim.workloads.request import Request


def session_key(request: Request) -> Hashable | None:
    """What a router that follows a session header (its value) keys on: `("session", session_id)`, or, for a request
    of a workload without sessions, its `prefix_id` (kvsim's stand-in from before requests had sessions: each
    shared-prefix group taken as one client's session, so that such workloads route as they always did; tagging
    sessions keeps a session and a prefix group of the same number apart). None: no session header."""
    return request.prefix_id if request.session_id is None else ("session", request.session_id)


class RouterOptions(BaseModel):
    """Options every router has."""

    # NOTE: defer_build, as sim.config.ConfigModel: only the options of the routers a command uses are built.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    replicas: int = Field(1, ge=1, description="Router replicas; each request goes to a random one, each keeps its own state (index, load counts).")
    processing_s: float = Field(0.0, ge=0, description="The router's own time per request (parse, tokenise, match, score), added to the hop.")


class PrefixStateOptions(RouterOptions):
    """Options of routers that read prefix-cache state (see `sim.routing.interface.PrefixStateSpec`)."""

    state: StateMode = Field("exact", description="How the router learns what the caches hold: exact (peeks), events (KV events, lagged), approximate (its own routing history).")
    event_lag_s: float | list[float] = Field(0.0, description="state=events: delay (s) from an engine publishing KV events to the router applying them; one value, or a list with one per worker.")
    event_loss: float = Field(0.0, ge=0, lt=1, description="state=events: probability that each KV event is lost.")


class LoadOptions(RouterOptions):
    """Options of routers that read engine metrics."""

    scrape_interval_s: float = Field(0.05, ge=0, description="Engine metrics are scraped every this many seconds (0: read live).")


class RouterBase:
    """Base for routers: parses `options` into `Options` (unknown keys are an error) and keeps, per router (replica):

    * `in_flight[w]` / `in_flight_tokens[w]`: requests (prompt tokens) this router dispatched to worker w and not
      yet completed (router-side load; other replicas' requests are not counted);
    * `prefix`: the prefix state of `prefix_state_spec()` (None: the router reads none), bound at `bind`. Read it
      with `prefix_tokens(request)`; each decision is recorded into it at dispatch, and what the router believed of
      the chosen worker is kept for the view-error counters;
    * `workers`: the routable workers (slots), ascending, and `instances`: the instance id of each (`set_workers`).

    Membership. Per-worker lists (`in_flight`, a prefix state's matches, a subclass's costs) stay indexed by slot,
    0..num_workers-1, whatever is routable; a router's choice ranges over `workers` only. A fixed fleet never changes
    them (`workers` = all slots, instance id = slot), so every choice is the one it was before routers knew of
    membership: the same candidates in the same order, the same random draws. `set_workers` drops what the router
    believed of a worker that left (its prefix-state entries) and tells the subclass (`after_set_workers`); a slot
    that gets a new instance starts empty there.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[RouterOptions]] = RouterOptions
    search_space: ClassVar[tuple[Knob, ...]] = ()
    """The options `kvsim tune` searches by default (knobs of `sim.routing.knobs`): the numeric knobs that trade
    cache affinity against load, with ranges a user would try. Empty: nothing worth tuning (defaults only)."""
    own_policy: ClassVar[bool] = False
    """True for a policy that exists only in kvsim (a design it proposes), not a router product one can deploy:
    `kvsim routers`, compare and plan mark it."""
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
        self.options = self.parse_options(options)
        self.processing_s = self.options.processing_s
        if isinstance(self.options, PrefixStateOptions):
            self.event_lags()  # a per-worker list must match the cluster: say so now, not at the first request
        self.in_flight = [0] * num_workers
        self.in_flight_tokens = [0] * num_workers
        self.view: ClusterView | None = None
        self.prefix: PrefixState | None = None
        self._matched: tuple[int, list[int]] | None = None
        self._belief: dict[int, int] = {}
        self.workers: tuple[int, ...] = tuple(range(num_workers))
        """Routable workers (slots), ascending; never empty."""
        self.instances: tuple[int, ...] = self.workers
        """`instances[i]`: the instance id of the worker in slot `workers[i]`."""
        self._slot_instance: dict[int, int] = dict(zip(self.workers, self.instances))
        """Per slot, the instance last routable there (kept after it left: a later one is a new instance)."""

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> RouterOptions:
        """`options` as this router's `Options`, or a ProblemsError (a ValueError, on one line) with every problem,
        each naming its option; an unknown one with the nearest option of the router, or its options (what the CLI
        checks a `NAME:key=value` spec with, before any run)."""
        try:
            return cls.Options.model_validate(options)
        except ValidationError as err:
            raise ProblemsError(validation_problems(err, cls.Options, noun=f"option of {cls.name}")) from None

    # ------------------------------------------------------------------ what the router sees
    def prefix_state_spec(self) -> PrefixStateSpec | None:
        """The prefix state this router reads (None: none). Routers with `PrefixStateOptions` get theirs from the
        options; a router with product-specific forgetting rules overrides this."""
        opts = self.options
        if not isinstance(opts, PrefixStateOptions):
            return None
        return PrefixStateSpec(mode=opts.state, event_lag_s=self.event_lags(), event_loss=opts.event_loss)

    def event_lags(self) -> float | tuple[float, ...]:
        """`event_lag_s` as the prefix state takes it (a list must have one lag per worker, each >= 0)."""
        lag = self.options.event_lag_s
        if isinstance(lag, list):
            if len(lag) != self.num_workers or min(lag) < 0:
                raise ValueError(f"event_lag_s: give one lag >= 0 per worker ({self.num_workers}), got {lag}")
            return tuple(lag)
        if lag < 0:
            raise ValueError(f"event_lag_s: must be >= 0, got {lag}")
        return lag

    def bind(self, view: ClusterView) -> None:
        self.view = view
        spec = self.prefix_state_spec()
        self.prefix = None if spec is None else view.prefix_state(spec)

    def prefix_tokens(self, request: Request) -> list[int]:
        """Per worker, the leading prompt tokens this router believes cached there (its prefix state)."""
        matched = self.prefix.match_tokens(request)
        if self.prefix.mode != "exact":
            self._matched = (request.request_id, matched)
        return matched

    # ------------------------------------------------------------------ decision and hooks
    def pick_one(self, candidates: Sequence[int]) -> int:
        """One of `candidates`, uniformly by this router's random stream; no draw when there is only one, so a
        decision without a tie leaves the stream as it was."""
        return candidates[0] if len(candidates) == 1 else self.rng.choice(candidates)

    def random_argmin(self, values: Sequence[float], candidates: Sequence[int] | None = None) -> int:
        """The candidate (default: every routable worker) with the lowest value, ties broken by `pick_one`."""
        candidates = self.workers if candidates is None else candidates
        lowest = min(values[w] for w in candidates)
        return self.pick_one([w for w in candidates if values[w] == lowest])

    def route(self, request: Request, view: ClusterView) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------ membership
    def set_workers(self, workers: tuple[int, ...], instances: tuple[int, ...]) -> None:
        """The routable workers changed (`sim.routing.interface.Router.set_workers`).

        `left`: the slots whose instance stopped being routable (it drains, or a new instance replaced it); `joined`:
        the slots whose instance became routable (a new one, or one that was draining and is routable again);
        `renewed`: the joined slots whose instance differs from the last one routable there (its per-instance state
        starts empty). The prefix state forgets the left and renewed slots (Dynamo's indexer `remove_worker` when an
        instance leaves discovery; a new instance's cache is empty): what a draining instance still publishes is
        dropped again when its slot is renewed."""
        workers, instances = tuple(workers), tuple(instances)
        if (not workers or len(workers) != len(instances) or any(a >= b for a, b in zip(workers, workers[1:]))
                or workers[0] < 0 or workers[-1] >= self.num_workers):
            raise ValueError(f"set_workers: workers must be ascending slots in 0..{self.num_workers - 1}, never empty, "
                             f"one instance id each; got workers={workers}, instances={instances}")
        before = dict(zip(self.workers, self.instances))
        now = dict(zip(workers, instances))
        left = tuple(w for w, i in before.items() if now.get(w) != i)
        joined = tuple(w for w, i in now.items() if before.get(w) != i)
        renewed = tuple(w for w in joined if self._slot_instance.get(w, now[w]) != now[w])
        self.workers, self.instances = workers, instances
        self._slot_instance.update(now)
        forget = sorted(set(left) | set(renewed))
        if self.prefix is not None:
            for w in forget:
                self.prefix.remove_worker(w)
        self.after_set_workers(left, joined, renewed)

    def instance_of(self, worker: int) -> int:
        """The instance id of the worker in slot `worker` (the last one routable there)."""
        return self._slot_instance[worker]

    def after_set_workers(self, left: tuple[int, ...], joined: tuple[int, ...], renewed: tuple[int, ...]) -> None:
        """A subclass's own rule on a membership change (`set_workers` names the slots)."""

    def on_dispatch(self, request: Request, worker: int) -> None:
        self.in_flight[worker] += 1
        self.in_flight_tokens[worker] += request.prompt_tokens
        if self.prefix is not None:
            self.prefix.record(request, worker)
            matched = self._matched
            if matched is not None and matched[0] == request.request_id:
                self._belief[request.request_id] = matched[1][worker]
            self._matched = None
        self.after_dispatch(request, worker)

    def believed_prefix_tokens(self, request: Request) -> int | None:
        return self._belief.pop(request.request_id, None)

    def on_first_token(self, request: Request, worker: int) -> None:
        self.after_first_token(request, worker)

    def on_complete(self, request: Request, worker: int) -> None:
        self.in_flight[worker] -= 1
        self.in_flight_tokens[worker] -= request.prompt_tokens
        self.after_complete(request, worker)

    def after_dispatch(self, request: Request, worker: int) -> None:
        pass

    def after_first_token(self, request: Request, worker: int) -> None:
        pass

    def after_complete(self, request: Request, worker: int) -> None:
        pass
