"""What a run leaves behind: one record per request and counters per worker (rates are derived later)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import reduce
from typing import Protocol

from sim.engines.interface import EngineCounters, PrefixCacheStats, ServedRequest
from sim.results.cost import DeviceTime
from sim.results.stats import NAN, ratio
from sim.workloads.request import is_full_hit


def booked_add(a: int, b: int) -> int:
    """The sum of two reuse counts, where -1 means "not booked" (`cluster.reuse_breakdown: false`): unknown in
    either makes the sum unknown (-1), never a smaller number."""
    return -1 if a < 0 or b < 0 else a + b


def booked_fraction(part: int, whole: int) -> float:
    """`part / whole`, NaN when nothing was counted or `part` was not booked (-1)."""
    return ratio(part, whole) if part >= 0 else NAN


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One served request. Times are simulated seconds as the client sees them (sent, first token, last token);
    `admitted_s` is engine time. `cached_tokens` is the hit at first admission."""

    request_id: int
    prefix_id: int | None
    warmup: bool
    worker: int
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    shareable_tokens: int
    sent_s: float
    arrival_s: float
    """When the request reached the engine's queue (after the router hop and the per-request overhead)."""
    admitted_s: float
    engine_first_token_s: float
    """When the engine emitted the first token (the client sees it `response_overhead_s` later)."""
    first_token_s: float
    finished_s: float
    num_preemptions: int
    available_tokens: int = 0
    """Prompt tokens one infinite cache shared by the cluster would hit (the reuse available; `ReuseLedger`);
    -1 when the run does not book it (`cluster.reuse_breakdown: false`)."""
    captured_tokens: int = 0
    """Prompt tokens an infinite cache on the chosen worker would hit (the reuse captured by routing); -1 likewise."""
    believed_tokens: int = -1
    """Prompt tokens the router believed cached on the chosen worker when it chose (-1: exact state or none)."""
    held_tokens: int = -1
    """Prompt tokens the chosen worker's cache held at that moment (-1 when `believed_tokens` is -1)."""
    cpu_cached_tokens: int = 0
    """Of `cached_tokens`, those loaded from the host (CPU) KV tier; the rest were on the GPU."""
    session_id: int | None = None
    """The session the request belongs to (`Request.session_id`; a subagent is a session of its own); None: none."""
    turn: int = 0
    """The request's index in its session (`Request.turn`, 0: the first)."""
    context_tokens: int = 0
    """Leading prompt tokens that earlier requests of its session left cacheable (`Request.num_context_tokens`):
    whole blocks (pages) of what the engine computed of them, so what a cache that had kept the session's context
    would hit (a turn adds tokens after it, so it ends before the prompt's last token, which is never a hit)."""
    # --- P/D disaggregation (requests.csv shows these columns only for a disaggregated run: `PD_RECORD_COLUMNS`)
    pd_prefill_worker: int = -1
    """The worker that prefilled the request: a prefill worker, or `worker` itself for a local prefill; -1: an
    aggregated cluster."""
    transfer_tokens: int = 0
    """Prompt tokens whose KV moved from the prefill worker to the decode worker (prompt - the decode worker's hit)."""
    ttft_queue_s: float = 0.0
    """Of the TTFT, time in engine queues: the prefill worker's (arrival to admission), then the decode worker's
    (arrival to the transfer's start)."""
    ttft_prefill_s: float = 0.0
    """Of the TTFT, the prefill: admission to the first token on the worker that prefilled."""
    ttft_transfer_s: float = 0.0
    """Of the TTFT, the KV transfer: its start to its end (on the decode worker's inbound link)."""
    shared_cached_tokens: int = 0
    """Of `cached_tokens`, those loaded from a cluster-shared KV store (a request loads from one tier only, so
    never with `cpu_cached_tokens`)."""
    tier_load_s: float = 0.0
    """The load-from-tier part of the TTFT: from the step that admitted the request with a tier hit (host or shared)
    to the step that promoted its loaded blocks (0 without a tier hit)."""
    queued_s: float | None = None
    """When the engine's loop first saw the request (`ServedRequest.queued_s`: its arrival, or the end of the step
    then in progress); None: not recorded (then `arrival_s` stands in)."""

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def engine_ttft_s(self) -> float:
        """Queue time + engine time to the first token: what vLLM reports as queue_time + time_to_first_token, from
        when its loop first saw the request (`queued_s`) to the first token."""
        return self.engine_first_token_s - (self.arrival_s if self.queued_s is None else self.queued_s)

    @property
    def e2e_s(self) -> float:
        return self.finished_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (inter-token latency): (finished - first token) / (outputs - 1);
        None for a request of one output token, which has no gap between tokens."""
        if self.output_tokens <= 1:
            return None
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def is_hit(self) -> bool:
        return self.cached_tokens > 0

    @property
    def is_cpu_hit(self) -> bool:
        """Part of the hit came from the host tier (a load-back): its TTFT includes the copy."""
        return self.cpu_cached_tokens > 0

    @property
    def is_shared_hit(self) -> bool:
        """Part of the hit came from the cluster-shared store: its TTFT includes the copy over the network."""
        return self.shared_cached_tokens > 0

    @property
    def tier_cached_tokens(self) -> int:
        """Of `cached_tokens`, those loaded from a tier beyond the GPU (host or shared store)."""
        return self.cpu_cached_tokens + self.shared_cached_tokens

    # --- the session's context at this request's arrival -----------------------------------------------------------
    #
    #     prompt:  | context_tokens (earlier turns' prompt + output blocks) | this turn's new tokens |
    #     cached:  | GPU part (cached - tier_cached) | host or shared part (tier_cached) |
    #
    # The hit is a prefix of the prompt and its GPU part a prefix of the hit (the host tier loads the continuation),
    # so the context found is min(hit, context) and the context the GPU alone held is min(GPU part, context).

    @property
    def context_hit_tokens(self) -> int:
        """Of `context_tokens`, those cached at first admission (from either tier)."""
        return min(self.cached_tokens, self.context_tokens)

    @property
    def gpu_context_hit_tokens(self) -> int:
        """Of `context_tokens`, those found on the GPU (without the host tier's load-back)."""
        return min(self.cached_tokens - self.tier_cached_tokens, self.context_tokens)

    @property
    def reprefill_tokens(self) -> int:
        """Context tokens prefilled again because the session's KV was gone: max(0, context - cached)."""
        return self.context_tokens - self.context_hit_tokens

    @property
    def context_survived(self) -> bool:
        """The request has a context and found all of it cached (cached >= context: a longer hit still counts)."""
        return self.context_tokens > 0 and self.cached_tokens >= self.context_tokens

    @property
    def gpu_context_survived(self) -> bool:
        """The request has a context and found all of it on the GPU, without the host tier's help."""
        return self.context_tokens > 0 and self.cached_tokens - self.tier_cached_tokens >= self.context_tokens

    @property
    def is_full_hit(self) -> bool:
        """The whole shareable prefix was cached at first admission (`sim.workloads.request.is_full_hit`)."""
        return is_full_hit(self.cached_tokens, self.shareable_tokens)

    @classmethod
    def from_state(cls, state: ServedRequest, sent_s: float, *, response_delay_s: float = 0.0,
                   routing: tuple[int, int, int, int] = (0, 0, -1, -1)) -> RequestRecord:
        """`routing`: (available, captured, believed, held) tokens, as the cluster booked them at dispatch."""
        req = state.request
        assert state.num_cached_tokens is not None and state.admitted_s is not None
        assert state.first_token_s is not None and state.finished_s is not None
        return cls(
            request_id=req.request_id,
            prefix_id=req.prefix_id,
            warmup=req.warmup,
            worker=state.worker,
            prompt_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens,
            cached_tokens=state.num_cached_tokens,
            shareable_tokens=req.num_shareable_tokens,
            sent_s=sent_s,
            arrival_s=state.arrival_s,
            admitted_s=state.admitted_s,
            engine_first_token_s=state.first_token_s,
            first_token_s=state.first_token_s + response_delay_s,
            finished_s=state.finished_s + response_delay_s,
            num_preemptions=state.num_preemptions,
            available_tokens=routing[0],
            captured_tokens=routing[1],
            believed_tokens=routing[2],
            held_tokens=routing[3],
            cpu_cached_tokens=state.num_cpu_hit_tokens,
            session_id=req.session_id,
            turn=req.turn,
            context_tokens=req.num_context_tokens,
            shared_cached_tokens=state.num_shared_hit_tokens,
            tier_load_s=state.tier_load_s,
            queued_s=state.queued_s,
        )


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives (ms) a request must meet to count as goodput; None leaves that latency unconstrained.

    A request meets the SLO iff it meets every objective that is set, each at or below its threshold: TTFT and E2E
    from send, TPOT = `RequestRecord.tpot_s` (a one-token request has none and always meets a TPOT objective). With
    no objective set every request meets it. The one owner of "met" for runs and replays alike.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def is_set(self) -> bool:
        """Whether any objective is set (else every request meets the SLO)."""
        return (self.ttft_ms, self.tpot_ms, self.e2e_ms) != (None, None, None)

    def ttft_met(self, r: RequestRecord) -> bool:
        return self.ttft_ms is None or r.ttft_s * 1000 <= self.ttft_ms

    def tpot_met(self, r: RequestRecord) -> bool:
        tpot_s = r.tpot_s
        return self.tpot_ms is None or tpot_s is None or tpot_s * 1000 <= self.tpot_ms

    def e2e_met(self, r: RequestRecord) -> bool:
        return self.e2e_ms is None or r.e2e_s * 1000 <= self.e2e_ms

    def met_by(self, r: RequestRecord) -> bool:
        return self.ttft_met(r) and self.tpot_met(r) and self.e2e_met(r)


@dataclass(frozen=True, slots=True)
class TtftSamples:
    """TTFT (ms) of a run's measured requests, split into hits and misses (for percentiles and CDFs)."""

    hit_ms: tuple[float, ...]
    miss_ms: tuple[float, ...]

    def ttft_ms(self, split: str = "all") -> tuple[float, ...]:
        """`split`: "hit", "miss" or "all"."""
        if split == "hit":
            return self.hit_ms
        if split == "miss":
            return self.miss_ms
        return self.hit_ms + self.miss_ms

    @classmethod
    def of(cls, records: Iterable[RequestRecord], *, engine: bool = False) -> TtftSamples:
        """Client TTFT of `records`, or with `engine` the engine's queue + time to first token."""
        hit, miss = [], []
        for r in records:
            (hit if r.is_hit else miss).append((r.engine_ttft_s if engine else r.ttft_s) * 1000)
        return cls(tuple(hit), tuple(miss))


def prefix_cache_hit_rate(stats: PrefixCacheStats) -> float:
    """vLLM's token hit rate, `prefix_cache_hits / prefix_cache_queries` (NaN without a lookup); with a host (CPU)
    tier the GPU's alone, as vLLM counts it."""
    return ratio(stats.hits, stats.queries)


_NO_COUNTS = EngineCounters(prefix_cache=PrefixCacheStats(), evicted_blocks=0, evicted_tokens=0, preemptions=0)


def _combine(a: EngineCounters, b: EngineCounters, sign: int) -> EngineCounters:
    """`a + sign * b`, counter by counter (the prefix-cache stats by their own `plus` / `minus`), so that a counter
    added to `EngineCounters` is carried without a line here."""
    values = {}
    for f in fields(EngineCounters):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, PrefixCacheStats):
            values[f.name] = x.plus(y) if sign > 0 else x.minus(y)
        else:
            values[f.name] = x + sign * y
    return EngineCounters(**values)


def total_counters(workers: Iterable[WorkerCounters]) -> EngineCounters:
    """The engine counters of `workers` summed (all zero without a worker): a run's or a replay's totals."""
    return reduce(lambda total, w: _combine(total, w.engine, 1), workers, _NO_COUNTS)


@dataclass(frozen=True, slots=True)
class WorkerCounters:
    """One worker's counters over the measured phase (deltas from the end of the warm-ups to the end): its engine's
    counters and the steps it ran."""

    worker: int
    """The worker's index in the cluster."""
    device: str
    """The name of the device it runs on."""
    engine: EngineCounters
    """Its engine's counters: prefix-cache lookups, evictions, preemptions, host-tier blocks."""
    steps: int
    """Engine steps (forward passes) run."""

    @classmethod
    def of(cls, worker: int, device: str, counters: EngineCounters, *, steps: int) -> WorkerCounters:
        return cls(worker=worker, device=device, engine=counters, steps=steps)

    @property
    def token_hit_rate(self) -> float:
        """The worker's `prefix_cache_hit_rate`."""
        return prefix_cache_hit_rate(self.engine.prefix_cache)

    def minus(self, earlier: WorkerCounters) -> WorkerCounters:
        return WorkerCounters(worker=self.worker, device=self.device, engine=_combine(self.engine, earlier.engine, -1),
                              steps=self.steps - earlier.steps)

    def plus(self, other: WorkerCounters) -> WorkerCounters:
        """These counters and `other`'s summed (an autoscaled slot: its stopped engines' and its live one's)."""
        return WorkerCounters(worker=self.worker, device=self.device, engine=_combine(self.engine, other.engine, 1),
                              steps=self.steps + other.steps)


class FleetFigures(Protocol):
    """What a result holds of an autoscaled fleet (`sim.results.timeline.FleetRecord`, which sits above records)."""

    def row(self, start_s: float = 0.0, end_s: float | None = None) -> dict[str, float | int]:
        """The summary's fleet columns over [start_s, end_s]."""
        ...


@dataclass(frozen=True, slots=True)
class RunResult:
    """Everything `run(scenario)` produces; nothing is written anywhere."""

    scenario_name: str
    num_workers: int
    records: tuple[RequestRecord, ...]
    workers: tuple[WorkerCounters, ...]
    measured_start_s: float
    measured_end_s: float
    slo: Slo = Slo()
    """The scenario's latency objectives, which the summary counts goodput against (default: none set)."""
    pools: tuple[int, int] | None = None
    """A disaggregated run's (prefill workers, decode workers): workers 0..P-1 prefill; None: aggregated."""
    pool_utilisation: tuple[float, float] = (0.0, 0.0)
    """A disaggregated run's device busy time per pool over (its devices x the measured phase): (prefill, decode)."""
    shared_tier: bool = False
    """The run had a cluster-shared KV store (its summary then has the shared tier's columns)."""
    peer_fetch: bool = False
    """The run had G2 peer fetch between host tiers (its summary then has `PEER_FETCH_COLUMNS`)."""
    device_time: tuple[DeviceTime, ...] = ()
    """The time each device was provisioned over the measured phase, with its price (`sim.results.cost`): what the
    summary's GPU-hours and cost are derived from (empty: not filled)."""
    fleet: FleetFigures | None = None
    """An autoscaled run's fleet (a `sim.results.timeline.FleetRecord`: its instances, decisions and timeline);
    None: a fixed fleet."""

    @property
    def measured(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if not r.warmup)
