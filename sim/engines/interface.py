"""The engine seam: what the worker, the cluster and the records may ask of a serving engine and its prefix cache.

An engine is one worker's scheduler and KV cache, with no clock of its own (time is passed in). The worker
(`sim.cluster.worker`) drives it; nothing outside `sim/engines/<kind>/` names an engine's own classes. The contract,
as vLLM's `SchedulerInterface` and SGLang's `BasePrefixCache` state theirs:

    add_request(request, worker=, arrival_s=)            the request reaches the engine's queue now
    schedule(now_s) -> StepPlan                          plan one forward pass (may admit, preempt, touch the cache)
        ... the device runs the step for time_model.step_seconds(plan) ...
    update_from_output(plan, now_s) -> StepOutcome       the pass is done: sample tokens, finish requests,
                                                         free or cache their KV, publish cache events

Ordering and invariants every engine keeps:
* `schedule` is only called when `has_work`; a plan that schedules nothing while requests wait is a stall (the
  worker raises with `describe_stall()`): a prompt that can never fit must be rejected before it is added.
* Steps are strictly sequential: `update_from_output(plan)` comes before the next `schedule`.
* A request's first token and its finish are reported in the `StepOutcome` of the step that sampled them; a
  finished request holds no KV afterwards.
* Decode stretches (`plan_decode_stretch`): when the next steps are decode-only and nothing can change them but an
  arrival, the engine may return a stretch of k such steps. `stretch.apply(j)` brings the engine to the state after j
  of them (idempotent, incremental; the worker calls it before anyone reads the cache, and at the stretch's end),
  then `finish_stretch(stretch, j, now_s)` ends what the last applied step finished, exactly as `update_from_output`
  would have. Results are identical to stepping (tested per engine).

The prefix cache (`Engine.cache`) answers routers with peeks (no recency change, no lock: "peek is not touch") and
publishes cache events (blocks or pages stored and removed) to subscribers, in the order the engine emits them, in
batches stamped with the time the engine publishes them (vLLM: after each step, like its `KVEventBatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field
from typing import ClassVar, Literal, NamedTuple, Protocol

from sim.workloads.request import BlockHash, Request


# ---------------------------------------------------------------------------------------------- requests
@dataclass(slots=True, eq=False)
class ServedRequest:
    """A request inside one engine: what every engine tracks and the records are built from.

    Engines subclass it with their own progress (block table, tree node, ...). Identity, not value, is equality:
    an engine may key dicts by its requests.
    """

    request: Request
    worker: int
    arrival_s: float
    num_output_tokens: int = 0
    """Output tokens sampled so far."""
    num_preemptions: int = 0
    """Times the engine took the request's KV away while it ran (vLLM preemption, SGLang retraction)."""
    num_cached_tokens: int | None = None
    """Prefix-cache hit at first admission (vLLM's and SGLang's per-request `cached_tokens`); None until admitted.
    With a CPU tier it includes the tokens loaded from it."""
    num_cpu_hit_tokens: int = 0
    """Of the first admission's hit, the tokens loaded from the CPU (host) tier (vLLM's `host` source)."""
    num_shared_hit_tokens: int = 0
    """Of the first admission's hit, the tokens loaded from a cluster-shared KV store (never in the same request as
    `num_cpu_hit_tokens`: a request loads from one tier, vLLM's MultiConnector rule)."""
    tier_load_s: float = 0.0
    """Of the first admission, the seconds from the step that admitted it with a tier hit to the step that promoted
    its loaded blocks (the load's share of its TTFT; 0 without a tier hit)."""
    queued_s: float | None = None
    """When the engine's loop first saw the request: its arrival if the loop was idle, else the end of the step then
    in progress (vLLM's EngineCore reads its input queue between steps and stamps `queued_ts` there); set by the
    worker."""
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_remote_kv_tokens: int = 0
    """Prompt tokens whose KV came from another worker (P/D disaggregation: the prefill worker), not computed or
    found here; 0 for a request prefilled on this worker."""
    remote_kv_start_s: float | None = None
    """When this worker started receiving that KV (None: no transfer)."""
    remote_kv_done_s: float | None = None
    """When all of it had arrived."""

    @property
    def num_tokens(self) -> int:
        """Prompt + sampled output tokens."""
        return self.request.prompt_tokens + self.num_output_tokens


# ---------------------------------------------------------------------------------------------- one step
@dataclass(slots=True)
class StepPlan:
    """What one `schedule()` call decided: tokens computed per request (in schedule order) and the step's shape,
    which is all the time model reads."""

    num_scheduled_tokens: dict[ServedRequest, int] = field(default_factory=dict)
    admitted: list[ServedRequest] = field(default_factory=list)
    """Requests admitted from the waiting queue in this step (re-admissions after preemption included)."""
    preempted: list[ServedRequest] = field(default_factory=list)
    """Requests whose KV was taken away in this step (vLLM preemption, SGLang retraction)."""
    num_prefill_tokens: int = 0
    """Tokens computed for prompts (first prefill, chunks, and recomputation after preemption)."""
    num_decode_seqs: int = 0
    num_decode_context_tokens: int = 0
    """KV tokens the step's decodes attend to (each decode's computed tokens, summed)."""
    num_prefill_attention_pairs: int = 0
    """Query-key pairs of the prefill tokens: n x (p + (n + 1) / 2) for n new tokens after p computed ones."""
    num_prefill_context_tokens: int = 0
    """KV tokens the prefill chunks attend to before their own (p of each chunk: cached prefix, earlier chunks)."""
    stall_s: float = 0.0
    """Seconds the step's forward pass waits for KV copies before it starts (vLLM: a store from blocks this step
    reuses is flushed first); not device compute."""

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass(frozen=True, slots=True)
class StepOutcome:
    first_token: list[ServedRequest]
    finished: list[ServedRequest]


class StepTimeModel(Protocol):
    """How long a step takes at device speed 1.0 (implementations: `sim.timing.linear`)."""

    def step_seconds(self, plan: StepPlan) -> float:
        """Seconds of device time the step needs at speed 1.0."""
        ...

    def decode_steps(self, num_decodes: int, context_tokens: int) -> tuple[float, float] | None:
        """For consecutive decode-only steps of `num_decodes` requests whose contexts sum to `context_tokens` at
        the first: (first step's seconds, growth per step), or None if the steps are not an arithmetic series."""
        ...


class HostLink(Protocol):
    """The copy engine between a device's memory and host memory (PCIe), one FIFO queue per direction; a KV tier
    in host memory times its loads and stores on it (implementation: `sim.cluster.host_link`)."""

    def copy_done_s(self, *, to_device: bool, start_s: float, num_bytes: int) -> float:
        """When a copy of `num_bytes` submitted at `start_s` completes (after the copies queued before it)."""
        ...


class RemoteKvSource(Protocol):
    """Where a request's prompt KV comes from when another worker computed it (P/D disaggregation: the prefill
    worker, over the cluster's transfer link; implementation `sim.cluster.transfer_link`). The engine asks for the
    tokens it does not hold itself when it admits the request (vLLM's NixlConnector: prompt - local hit)."""

    def load_done_s(self, *, start_s: float, num_tokens: int) -> float:
        """When `num_tokens` tokens of the prompt's KV, requested at `start_s`, have all arrived. Called once per
        request; an engine that holds the whole prompt itself calls it with 0 (nothing moves: the prefill worker
        may free its copy)."""
        ...


@dataclass(frozen=True, slots=True)
class SharedTier:
    """What a worker's engine needs of a cluster-shared KV store: the store itself, built once for the cluster by
    its engine class (`EngineClass.shared_store`) and opaque outside the engine, and this worker's link to it."""

    store: object
    link: HostLink


class DecodeStretch(Protocol):
    """`num_steps` decode-only steps advanced as one event (see the module docstring); timing in
    `sim.engines.stretch.StretchTiming`."""

    start_s: float
    num_steps: int

    @property
    def duration_s(self) -> float: ...

    def elapsed_s(self, k: int) -> float:
        """Time from the start to the end of the first k steps."""
        ...

    def steps_started_by(self, now_s: float) -> int:
        """Steps whose start time is <= now (the step in progress included), at most `num_steps`."""
        ...

    def apply(self, k: int) -> None:
        """Bring requests and cache to the state after the first k steps (idempotent, incremental)."""
        ...

    def usage_after(self, k: int) -> float:
        """`PrefixCache.usage()` as it will be after the first k steps, without applying them (for metric scrapes,
        which must not cut a stretch into pieces). Running and waiting counts do not change inside a stretch."""
        ...


# ---------------------------------------------------------------------------------------------- counters
@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups as the engines count them (vLLM's `PrefixCacheStats`), summed across steps and workers.

    `queries` counts every prompt token looked up (last token included), `hits` the tokens found cached. Lookups of
    re-admitted preempted (retracted) requests go to the `preempted_*` counters, which vLLM does not export.
    """

    requests: int = 0
    """Requests counted (first admissions)."""
    queries: int = 0
    """Prompt tokens of those requests (vLLM's `prefix_cache_queries`)."""
    hits: int = 0
    """Of which found in the cache (vLLM's `prefix_cache_hits`)."""
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hit_tokens: int, *, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hit_tokens

    def copy(self) -> PrefixCacheStats:
        return PrefixCacheStats(*astuple(self))

    def _combine(self, other: PrefixCacheStats, sign: int) -> PrefixCacheStats:
        return PrefixCacheStats(*(a + sign * b for a, b in zip(astuple(self), astuple(other))))

    def plus(self, other: PrefixCacheStats) -> PrefixCacheStats:
        return self._combine(other, 1)

    def minus(self, other: PrefixCacheStats) -> PrefixCacheStats:
        return self._combine(other, -1)


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """An engine's cumulative counters (the worker takes deltas around the measured phase)."""

    prefix_cache: PrefixCacheStats
    evicted_blocks: int
    """Cached blocks (vLLM) or pages (SGLang, `page_size` tokens each) evicted to make room."""
    evicted_tokens: int
    """The same in tokens."""
    preemptions: int
    """vLLM preemptions by recompute, SGLang decode retractions."""
    cpu_stored_blocks: int = 0
    """Blocks copied to the host (CPU) KV tier (vLLM `kv_offload_store_bytes` / block bytes)."""
    cpu_loaded_blocks: int = 0
    """Blocks loaded back from the host tier (vLLM `kv_offload_load_bytes` / block bytes)."""
    cpu_evicted_blocks: int = 0
    """Blocks evicted from the host tier to make room."""
    shared_stored_blocks: int = 0
    """Blocks this worker copied to a cluster-shared KV store (0 without one)."""
    shared_loaded_blocks: int = 0
    """Blocks this worker loaded from the shared store."""
    shared_evicted_blocks: int = 0
    """Blocks evicted from the shared store to make room for this worker's stores."""
    shared_link_bytes: int = 0
    """Bytes this worker moved over its network link to the shared store, both directions."""
    host_link_bytes: int = 0
    """Bytes this worker moved over its host link for the host tier, both directions."""
    peer_fetched_blocks: int = 0
    """Blocks this worker pulled from peers' host tiers into its own (G2 peer fetch; 0 without it)."""


# ---------------------------------------------------------------------------------------------- cache events
@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine's metrics endpoint reports of its load at one moment (vLLM `num_requests_running`,
    `num_requests_waiting`, `kv_cache_usage_perc`; SGLang `num_running_reqs`, `num_queue_reqs`, `token_usage`)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    """`PrefixCache.usage()`: the fraction of KV capacity held by running requests."""


class CacheEvent(NamedTuple):
    """One change to a worker's prefix cache, as the engine's KV events report it (vLLM `BlockStored` /
    `BlockRemoved` / `AllBlocksCleared`, `vllm/distributed/kv_events.py`; SGLang the same names,
    `mem_cache/events.py`). NOTE: an immutable NamedTuple rather than a frozen dataclass: vLLM emits one per evicted
    block, and this builds in half the time.

    `block_hashes` are the cache's own identities of whole blocks (vLLM) or pages (SGLang), in position order; a
    `stored` event's first block follows `parent_hash` (None: it starts at the root). Match a request against an
    index fed by these with `PrefixCache.block_keys(request)`.
    """

    kind: Literal["stored", "removed", "cleared"]
    block_hashes: tuple[BlockHash, ...] = ()
    parent_hash: BlockHash | None = None
    block_size: int = 0
    """Tokens per block (page) of `block_hashes`."""
    medium: str | None = None
    """Where the blocks live: None for the engine's own (GPU) cache; a KV tier's events name theirs, as vLLM's
    `BlockStored.medium` does ("CPU" for the host tier; kvsim's cluster-shared store is "SHARED"). Tier events go
    only to tier subscribers (`sim.engines.vllm.engine.VllmEngine.subscribe_tiers`), never to `PrefixCache`
    subscribers."""


CacheListener = Callable[[Sequence[CacheEvent], float], None]
"""Receives each published batch of events with the simulated time it was published."""


class PrefixCache(Protocol):
    """One worker's prefix cache as routers and the records see it."""

    @property
    def block_size(self) -> int:
        """Tokens per block (vLLM) or page (SGLang) of this cache's events and `block_keys`."""
        ...

    def peek_prefix_tokens(self, request: Request) -> int:
        """The longest cached prefix of `request`'s prompt, in tokens, as this cache matches (whole blocks or
        pages), with no hit cap and no side effect: no recency change, no lock, no node split."""
        ...

    def block_keys(self, request: Request) -> Sequence[BlockHash]:
        """`request`'s full prompt blocks (pages) as this cache's event identities (`CacheEvent.block_hashes`)."""
        ...

    def usage(self) -> float:
        """Fraction of KV capacity held by running requests (cached, unreferenced KV counts as free), as the
        engine exports it (vLLM `kv_cache_usage_perc`, SGLang token usage)."""
        ...

    def subscribe(self, listener: CacheListener) -> None:
        """Publish this cache's events to `listener` from now on (events cost nothing until someone subscribes)."""
        ...


# ---------------------------------------------------------------------------------------------- the engine
class Engine(Protocol):
    """One worker's serving engine (see the module docstring for the call order)."""

    kind: ClassVar[str]
    cache: PrefixCache

    def add_request(self, request: Request, *, worker: int, arrival_s: float) -> ServedRequest: ...

    def add_remote_prefilled(self, request: Request, *, worker: int, arrival_s: float,
                             source: RemoteKvSource) -> ServedRequest:
        """A request whose prompt another worker prefilled (P/D disaggregation) reaches this engine's queue now: the
        engine admits it by its own rule, receives the prompt KV it lacks from `source` (the request waits for it,
        holding its KV slots), then decodes; what it keeps of the received KV afterwards is its own rule too (vLLM:
        cached prefix blocks; SGLang: nothing, its decode radix cache being off by default). Its
        `num_remote_kv_tokens` and `remote_kv_*_s` say what came and when."""
        ...

    def add_remote_decode(self, request: Request, *, worker: int, arrival_s: float) -> ServedRequest:
        """A request this engine prefills for another worker (P/D: vLLM's `do_remote_decode`) reaches its queue now:
        it is served like any request (the cluster sends it with one output token) but, once finished, keeps its KV
        until `release_remote_decode` (the decode side has read it: vLLM's `delay_free_blocks`)."""
        ...

    def release_remote_decode(self, state: ServedRequest) -> None:
        """The decode side has read `state`'s KV: free it (its blocks stay cached, evictable)."""
        ...

    @property
    def has_work(self) -> bool: ...

    @property
    def num_requests(self) -> int:
        """Requests waiting or running."""
        ...

    def load(self) -> EngineLoad:
        """Running and waiting requests and KV usage now, as the engine's metrics report them (what a router
        that scrapes metrics reads)."""
        ...

    def schedule(self, now_s: float) -> StepPlan: ...

    def update_from_output(self, plan: StepPlan, now_s: float) -> StepOutcome: ...

    def plan_decode_stretch(self, time_model: StepTimeModel, *, speed: float, now_s: float) -> DecodeStretch | None:
        """A stretch of decode-only steps from now, or None when the next step is not one (see the docstring)."""
        ...

    def finish_stretch(self, stretch: DecodeStretch, num_steps: int, now_s: float) -> list[ServedRequest]:
        """Apply `num_steps` of `stretch` and end the requests its last step finished; returns them."""
        ...

    def counters(self) -> EngineCounters: ...

    def next_background_s(self) -> float | None:
        """When work the engine runs beside its steps (KV copies to or from a host tier) next completes, for an
        engine with nothing to schedule until then (a time at or before now: step again at once); None when there
        is none. `math.inf`: it waits for something outside it (P/D: a decode worker to read KV it holds); the worker
        then sleeps until a request arrives or that KV is released."""
        ...

    def describe_stall(self) -> str:
        """Why nothing could be scheduled (for the error the worker raises)."""
        ...


class EngineSpec(Protocol):
    """What the rest of kvsim reads of any engine's scenario section (`engine:`); each engine's pydantic model
    (`sim/engines/<kind>/spec.py`) adds its own options."""

    kind: str
    block_size: int
    """Block size (tokens) of the requests' prompt hashes that routers read (vLLM: also its KV block size)."""
    kv_cache_bytes: int
    max_model_len: int

    @property
    def version(self) -> str:
        """The engine release whose rules apply."""
        ...

    def num_blocks(self, kv_bytes_per_token: int) -> int:
        """KV blocks (pages) per worker as the engine counts them."""
        ...

    def capacity_tokens(self, kv_bytes_per_token: int) -> int:
        """Token slots of one worker's KV cache that requests can use."""
        ...

    def max_request_tokens(self, kv_bytes_per_token: int) -> int:
        """The longest request (prompt + output) the engine accepts; longer ones are rejected (HTTP 400)."""
        ...

    def check_fits(self, longest_request_tokens: int, kv_bytes_per_token: int) -> None:
        """Raise ValueError, naming the field, if the cache cannot exist or such a request could never run."""
        ...

    def capacity_overrides(self, *, tokens: int | None = None, blocks: int | None = None,
                           kv_bytes: int | None = None) -> dict[str, object]:
        """Scenario overrides (dotted paths) that give a worker `tokens` usable KV slots, `blocks` as the engine
        counts them, or `kv_bytes`."""
        ...

    def overrides_for_run(self, setup) -> dict[str, object]:
        """Scenario overrides (dotted paths) that give a worker the engine setup of a measured run (`setup`: a
        `sim.servers.run_csv.RunSetup`, read by duck typing: the servers package sits above the engines)."""
        ...


class EngineClass(Protocol):
    """An engine class as the registry (`sim.engines.registry.ENGINES`) builds it: the engine class, its scenario model and how to build it."""

    kind: ClassVar[str]
    Spec: ClassVar[type]

    def __call__(self, spec: EngineSpec, *, kv_bytes_per_token: int, host_link: HostLink | None = None) -> Engine: ...

    # NOTE: an engine with a cluster-shared KV tier (vLLM) also takes `shared_tier: SharedTier` and has
    # `shared_store(spec, kv_bytes_per_token) -> object`; the registry calls them only when a scenario has one.
    # One with G2 peer fetch (vLLM, `engine.peer_fetch`) has `peer_store() -> object` and
    # `bind_peers(peers, link)`: the registry's `bind_peer_fetch` wires the cluster's workers to one another.

