"""From a run's records and counters to the figures users read. Rates are derived here, from counts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from functools import reduce

from sim.engines.interface import EngineCounters
from sim.results.cost import DeviceTime, cost_columns
from sim.results.pd_figures import PdFigures
from sim.results.records import RequestRecord, RunResult, Slo, booked_add, booked_fraction, total_counters
from sim.results.stats import NAN, per_second, percentile, ratio


def _percentile_ms(values_s: list[float], q: float) -> float:
    return percentile(values_s, q) * 1000.0


def imbalance_max_mean(requests_per_worker: tuple[int, ...] | list[int]) -> float:
    """The busiest worker's requests / the mean per worker (1 = perfectly even, n = all on one of n); NaN when none."""
    return ratio(max(requests_per_worker) * len(requests_per_worker), sum(requests_per_worker))


def jain_index(requests_per_worker: tuple[int, ...] | list[int]) -> float:
    """Jain's fairness index of the requests per worker, (sum x)^2 / (n sum x^2): 1 when even, 1/n when all on one
    worker (idle workers count in n); NaN when none."""
    total = sum(requests_per_worker)
    squares = sum(x * x for x in requests_per_worker)
    return ratio(total * total, len(requests_per_worker) * squares)


def slo_columns(slo: Slo) -> dict[str, float]:
    """The SLO itself as columns (`slo_ttft_ms`, `slo_tpot_ms`, `slo_e2e_ms`; NaN where unset), so that a row says
    what its goodput was counted against."""
    return {f"slo_{name}_ms": NAN if value is None else float(value)
            for name, value in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms))}


class HitRates:
    """The hit rates and throughput of a set of requests, derived in this one place from the counters every summary
    keeps (a run's `Summary`, a replay's `StreamingStats`, validation's `RequestCounts`): `requests`,
    `hit_requests`, `full_hit_requests`, `cpu_hit_requests`, `prompt_tokens`, `cached_tokens`, `cpu_cached_tokens`,
    over `rate_span_s` seconds (each class says which span)."""

    __slots__ = ()

    @property
    def request_hit_rate(self) -> float:
        """Requests with any cached prompt token at first admission / requests (what the reference counts)."""
        return ratio(self.hit_requests, self.requests)

    @property
    def full_hit_rate(self) -> float:
        """Requests whose whole shareable prefix was cached / requests (`sim.workloads.request.is_full_hit`)."""
        return ratio(self.full_hit_requests, self.requests)

    @property
    def gpu_hit_rate(self) -> float:
        """Requests whose whole hit was on the GPU / requests (with `cpu_hit_rate` and `shared_hit_rate`:
        `request_hit_rate`)."""
        return ratio(self.hit_requests - self.cpu_hit_requests - self.shared_hit_requests, self.requests)

    @property
    def cpu_hit_rate(self) -> float:
        """Requests that loaded part of their hit from the host (CPU) KV tier / requests."""
        return ratio(self.cpu_hit_requests, self.requests)

    @property
    def shared_hit_rate(self) -> float:
        """Requests that loaded part of their hit from the cluster-shared KV store / requests."""
        return ratio(self.shared_hit_requests, self.requests)

    @property
    def shared_prefix_reuse(self) -> float:
        """Prompt tokens loaded from the shared store / prompt tokens (part of `prefix_reuse`)."""
        return ratio(self.shared_cached_tokens, self.prompt_tokens)

    @property
    def prefix_reuse(self) -> float:
        """Cached prompt tokens / prompt tokens, each request counted at its first admission (Dynamo's
        `prefix_cache_reused_ratio`; a run's `token_hit_rate`)."""
        return ratio(self.cached_tokens, self.prompt_tokens)

    @property
    def cpu_prefix_reuse(self) -> float:
        """Prompt tokens loaded from the host tier / prompt tokens (part of `prefix_reuse`)."""
        return ratio(self.cpu_cached_tokens, self.prompt_tokens)

    @property
    def throughput_rps(self) -> float:
        return per_second(self.requests, self.rate_span_s)


class RequestRates(HitRates):
    """Beside the hit rates, the rates a run's `Summary` and a replay's `StreamingStats` both report, from the
    counters both keep: `slo_met_requests`, `requests_per_worker`, `view_checked`, `view_false_hits`,
    `available_tokens` and `captured_tokens` (-1: not booked)."""

    __slots__ = ()

    @property
    def reuse_available(self) -> float:
        return booked_fraction(self.available_tokens, self.prompt_tokens)

    @property
    def reuse_captured(self) -> float:
        return booked_fraction(self.captured_tokens, self.prompt_tokens)

    @property
    def view_false_hit_rate(self) -> float:
        return ratio(self.view_false_hits, self.view_checked)

    @property
    def goodput_rps(self) -> float:
        """Requests meeting the SLO per second (= throughput when no objective is set)."""
        return per_second(self.slo_met_requests, self.rate_span_s)

    @property
    def goodput_fraction(self) -> float:
        return ratio(self.slo_met_requests, self.requests)

    @property
    def max_worker_share(self) -> float:
        """The busiest worker's share of the requests."""
        return ratio(max(self.requests_per_worker), self.requests)

    @property
    def imbalance_max_mean(self) -> float:
        return imbalance_max_mean(self.requests_per_worker)

    @property
    def jain_index(self) -> float:
        return jain_index(self.requests_per_worker)


class ContextRates:
    """The session figures, derived in this one place from the counters every session summary keeps
    (`SessionCounts`, for a run's and a replay's requests alike): `context_requests`, `context_tokens`,
    `context_hit_tokens`, `gpu_context_hit_tokens`, `survived_requests`, `gpu_survived_requests`.

    "gpu_" is the same figure without the host (CPU) KV tier: what the GPU alone held when the request arrived (the
    host tier's load-back not counted). It is read off the same run, not a run without the tier."""

    __slots__ = ()

    @property
    def gap_survival(self) -> float:
        """Requests that found their whole context cached / requests with a context (turns after the first)."""
        return ratio(self.survived_requests, self.context_requests)

    @property
    def gpu_gap_survival(self) -> float:
        """Requests that found their whole context on the GPU / requests with a context."""
        return ratio(self.gpu_survived_requests, self.context_requests)

    @property
    def context_hit_rate(self) -> float:
        """Context tokens found cached / context tokens: the gap survival weighted by tokens."""
        return ratio(self.context_hit_tokens, self.context_tokens)

    @property
    def reprefill_tokens(self) -> int:
        """Context tokens prefilled again because the session's KV was gone (from both tiers)."""
        return self.context_tokens - self.context_hit_tokens

    @property
    def gpu_reprefill_tokens(self) -> int:
        """Context tokens the GPU no longer held (prefilled again, or loaded back from the host tier)."""
        return self.context_tokens - self.gpu_context_hit_tokens


@dataclass(slots=True, kw_only=True)
class HitCounts(HitRates):
    """The counters `HitRates` derives its rates from, accumulated request by request (`add`) and summed (`merge`):
    a replay's (`StreamingStats`) and a set of session requests' (`SessionCounts`)."""

    requests: int = 0
    """Requests counted."""
    hit_requests: int = 0
    """Of those, requests with any cached prompt token at first admission."""
    full_hit_requests: int = 0
    """Of those, requests whose whole shareable prefix was cached (none in a trace, which declares no prefix)."""
    cpu_hit_requests: int = 0
    """Of those, requests whose hit came partly from the host (CPU) KV tier."""
    prompt_tokens: int = 0
    """Prompt tokens of the requests."""
    cached_tokens: int = 0
    """Of those, tokens cached at each request's first admission."""
    cpu_cached_tokens: int = 0
    """Of `cached_tokens`, those loaded from the host tier."""
    shared_hit_requests: int = 0
    """Requests whose hit came partly from the cluster-shared KV store."""
    shared_cached_tokens: int = 0
    """Of `cached_tokens`, those loaded from the shared store."""

    def add(self, r: RequestRecord) -> None:
        self.requests += 1
        self.shared_hit_requests += r.is_shared_hit
        self.shared_cached_tokens += r.shared_cached_tokens
        self.hit_requests += r.is_hit
        self.full_hit_requests += r.is_full_hit
        self.cpu_hit_requests += r.is_cpu_hit
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.cpu_cached_tokens += r.cpu_cached_tokens

    def merge(self, other: HitCounts) -> None:
        """Add `other`'s hit counters to these."""
        for f in fields(HitCounts):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(slots=True, kw_only=True)
class SessionCounts(HitCounts, ContextRates):
    """Counters of a set of session requests (a run's or a replay's, or one turn's of them): the hit counters and
    the context counters, every one a count that sums; the rates are `HitRates`' and `ContextRates`'."""

    context_requests: int = 0
    """Requests with a context (`RequestRecord.context_tokens` > 0): a session's turns after its first."""
    context_tokens: int = 0
    """Their context tokens, summed."""
    context_hit_tokens: int = 0
    """Of those, tokens cached at first admission, from either tier (`RequestRecord.context_hit_tokens`)."""
    gpu_context_hit_tokens: int = 0
    """Of those, tokens found on the GPU (`RequestRecord.gpu_context_hit_tokens`)."""
    survived_requests: int = 0
    """Requests that found their whole context cached (`RequestRecord.context_survived`)."""
    gpu_survived_requests: int = 0
    """Requests that found their whole context on the GPU (`RequestRecord.gpu_context_survived`)."""

    @property
    def rate_span_s(self) -> float:
        """A set of session requests has no span of its own: no throughput (NaN)."""
        return 0.0

    def add(self, r: RequestRecord) -> None:
        HitCounts.add(self, r)  # NOTE: not super(): slotted dataclasses are rebuilt, which breaks its zero-arg form
        self.context_requests += r.context_tokens > 0
        self.context_tokens += r.context_tokens
        self.context_hit_tokens += r.context_hit_tokens
        self.gpu_context_hit_tokens += r.gpu_context_hit_tokens
        self.survived_requests += r.context_survived
        self.gpu_survived_requests += r.gpu_context_survived

    def merge(self, other: SessionCounts) -> None:
        """Add `other`'s counters (hit and context) to these."""
        for f in fields(SessionCounts):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> SessionCounts:
        counts = cls()
        for r in records:
            counts.add(r)
        return counts

    @classmethod
    def total(cls, parts: Iterable[SessionCounts]) -> SessionCounts:
        """The counters of `parts` summed (the per-turn counters into a run's)."""
        counts = cls()
        for part in parts:
            counts.merge(part)
        return counts


MAX_TURN = 64
"""Turns of this index and above share one row of the per-turn figures (`turn_bucket`): a replay of sessions of any
length keeps a bounded number of per-turn counters."""


def turn_bucket(turn: int) -> int:
    """The row of the per-turn figures a request of turn index `turn` (0: a session's first) counts in."""
    return min(turn, MAX_TURN)


@dataclass(frozen=True, slots=True)
class SessionFigures:
    """What a run or a replay reports of its sessions: counters over its session requests and per turn, TTFT
    percentiles per turn, the number of sessions and their completion times. Only for runs with sessions.

    A session's completion time runs from the send of its first request to the finish of its last (over the requests
    counted). A subagent is a session of its own: its time is not added to its parent's, though a parent that waits
    for a subagent's result finishes after it."""

    counts: SessionCounts
    """Over every session request."""
    turns: dict[int, SessionCounts]
    """Per turn row (`turn_bucket`), in turn order."""
    turn_ttft_ms: dict[int, tuple[float, float]]
    """Per turn row, TTFT p50 and p99 in ms."""
    num_sessions: int
    """Sessions with a request counted; -1 when unknown (a split replay: `StreamingStats.merge`)."""
    session_time_s: tuple[float, float]
    """Session completion time p50 and p99, in seconds (NaN when unknown)."""

    def row(self) -> dict[str, float | int]:
        """The session columns of `summary.csv` (`SESSION_COLUMNS`)."""
        c = self.counts
        return {
            "sessions": self.num_sessions,
            "session_requests": c.requests,
            "session_time_p50_s": self.session_time_s[0],
            "session_time_p99_s": self.session_time_s[1],
            "context_requests": c.context_requests,
            "context_tokens": c.context_tokens,
            "context_hit_rate": c.context_hit_rate,
            "reprefill_tokens": c.reprefill_tokens,
            "gpu_reprefill_tokens": c.gpu_reprefill_tokens,
            "survived_requests": c.survived_requests,
            "gpu_survived_requests": c.gpu_survived_requests,
            "gap_survival": c.gap_survival,
            "gpu_gap_survival": c.gpu_gap_survival,
        }

    def turn_rows(self) -> list[dict[str, float | int]]:
        """A row per turn (`turns.csv`, `TURN_COLUMNS`); the last, turn `MAX_TURN`, pools the turns from there on."""
        return [{
            "turn": turn,
            "requests": c.requests,
            "hit_requests": c.hit_requests,
            "request_hit_rate": c.request_hit_rate,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "token_hit_rate": c.prefix_reuse,
            "ttft_p50_ms": self.turn_ttft_ms[turn][0],
            "ttft_p99_ms": self.turn_ttft_ms[turn][1],
            "context_requests": c.context_requests,
            "context_tokens": c.context_tokens,
            "reprefill_tokens": c.reprefill_tokens,
            "gpu_reprefill_tokens": c.gpu_reprefill_tokens,
            "gap_survival": c.gap_survival,
            "gpu_gap_survival": c.gpu_gap_survival,
        } for turn, c in self.turns.items()]

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> SessionFigures | None:
        """The figures of `records`' session requests (exact percentiles); None when none belongs to a session."""
        spans: dict[int, list[float]] = {}
        turns: dict[int, list[RequestRecord]] = {}
        for r in records:
            if r.session_id is None:
                continue
            span = spans.get(r.session_id)
            if span is None:
                spans[r.session_id] = [r.sent_s, r.finished_s]
            else:
                span[0], span[1] = min(span[0], r.sent_s), max(span[1], r.finished_s)
            turns.setdefault(turn_bucket(r.turn), []).append(r)
        if not spans:
            return None
        times_s = [last - first for first, last in spans.values()]
        per_turn = {t: SessionCounts.of(turns[t]) for t in sorted(turns)}
        return cls(
            counts=SessionCounts.total(per_turn.values()),
            turns=per_turn,
            turn_ttft_ms={t: (_percentile_ms(ttft_s, 50), _percentile_ms(ttft_s, 99))
                          for t, ttft_s in ((t, [r.ttft_s for r in turns[t]]) for t in per_turn)},
            num_sessions=len(spans),
            session_time_s=(percentile(times_s, 50), percentile(times_s, 99)),
        )


@dataclass(frozen=True, slots=True)
class RequestCounts(HitRates):
    """The counters of a set of requests that hit rates and throughput need, for figures that have only those (a
    measured run and its simulation, `sim.studies.validate`)."""

    requests: int
    hit_requests: int
    """Requests with any cached prompt token."""
    full_hit_requests: int
    """Requests whose whole shareable prefix was cached."""
    prompt_tokens: int
    cached_tokens: int
    """Cached prompt tokens, summed over the requests."""
    span_s: float
    """From the first request sent to the last finished."""
    cpu_hit_requests: int = 0
    """Requests whose hit came partly from the host (CPU) KV tier."""
    cpu_cached_tokens: int = 0
    """Of `cached_tokens`, those loaded from the host tier."""
    shared_hit_requests: int = 0
    """Requests whose hit came partly from a cluster-shared KV store."""
    shared_cached_tokens: int = 0
    """Of `cached_tokens`, those loaded from the shared store."""

    @property
    def rate_span_s(self) -> float:
        return self.span_s


@dataclass(frozen=True, slots=True)
class Summary(RequestRates):
    """Counts over the measured requests of one run, and the rates derived from them.

    * `request_hit_rate`, `full_hit_rate`, `gpu_hit_rate`, `cpu_hit_rate`: see `HitRates`;
    * `token_hit_rate`: cached prompt tokens / prompt tokens over the measured requests, each counted at its first
      admission (`prefix_reuse`): vLLM's `prefix_cache_hits / prefix_cache_queries` as vLLM >= 0.27 counts them
      (older releases also count failed lookups; the raw counters of the measured phase are in
      `engine.prefix_cache`).
    * `reuse_available` / `reuse_captured` / `reuse_delivered`: prompt tokens that one infinite shared cache, an
      infinite cache per worker under the router's choices, and the real finite caches hit, over prompt tokens
      (`sim.cluster.reuse.ReuseLedger`; delivered is `token_hit_rate`). available - captured is what routing
      loses, captured - delivered what memory loses.
    * `view_false_hit_rate`: of the requests a router with non-exact state routed (`view_checked`), the fraction
      whose chosen worker held fewer tokens of the prompt than the router believed.
    * `goodput_rps` / `goodput_fraction`: measured requests meeting every objective of `slo` per second / over
      requests. With no objective set every request meets it: goodput = throughput, fraction 1.
    * `tpot_ms` / `e2e_ms`: p50 and p99 of time per output token (requests of one output token have none) and of
      send-to-last-token latency.
    * `imbalance_max_mean` and `jain_index` of `requests_per_worker` (idle workers included).
    * By tier, with a host (CPU) KV tier: `gpu_hit_rate` + `cpu_hit_rate` = `request_hit_rate`;
      `cpu_token_hit_rate`: the loaded tokens over prompt tokens (in `token_hit_rate` too); TTFT percentiles of GPU
      hits and CPU hits apart (`ttft_ms` keys `gpu_hit_p50`, `cpu_hit_p50`, ...); blocks stored to, loaded from and
      evicted from the tier (`engine`).
    * With sessions, `session_figures`: per turn and per session (`SessionFigures`); its columns are appended to
      `row()` only then.
    """

    requests: int
    """Measured requests."""
    hit_requests: int
    """Of those, requests with any cached prompt token at first admission."""
    full_hit_requests: int
    """Of those, requests whose whole shareable prefix was cached."""
    prompt_tokens: int
    """Prompt tokens of the measured requests."""
    cached_tokens: int
    """Of those, tokens cached at each request's first admission."""
    engine: EngineCounters
    """The workers' engine counters over the measured phase, summed (`total_counters`)."""
    duration_s: float
    """The measured phase's length: the span of the rates."""
    ttft_ms: dict[str, float]
    """TTFT percentiles: keys p50, p90, p99 (all), hit_p50 ... miss_p99, gpu_hit_p50 ... cpu_hit_p99."""
    requests_per_worker: tuple[int, ...]
    """Measured requests per worker, idle workers included."""
    slo: Slo
    """The objectives the SLO counters were counted against."""
    slo_met_requests: int
    """Measured requests meeting every objective of `slo` (all of them when none is set)."""
    ttft_slo_met: int
    """Measured requests within `slo.ttft_ms` (all of them when it is unset)."""
    tpot_slo_met: int
    """Measured requests within `slo.tpot_ms`, one-output-token requests included (all when it is unset)."""
    e2e_slo_met: int
    """Measured requests within `slo.e2e_ms` (all of them when it is unset)."""
    tpot_ms: dict[str, float]
    """TPOT percentiles (keys p50, p99) over the measured requests with more than one output token."""
    e2e_ms: dict[str, float]
    """End-to-end latency percentiles (keys p50, p99) over the measured requests."""
    available_tokens: int = 0
    """Prompt tokens one infinite cache shared by the cluster would hit (-1: not booked)."""
    captured_tokens: int = 0
    """Prompt tokens an infinite cache on each chosen worker would hit (-1: not booked)."""
    view_checked: int = 0
    """Measured requests routed on non-exact state (their belief was compared with the cache)."""
    view_false_hits: int = 0
    """Of those, requests whose chosen worker held less than the router believed."""
    view_false_tokens: int = 0
    """Believed-but-absent prompt tokens, summed over those requests."""
    cpu_hit_requests: int = 0
    """Measured requests whose hit came partly from the host tier."""
    cpu_cached_tokens: int = 0
    """Prompt tokens loaded from the host tier (part of `cached_tokens`)."""
    shared_hit_requests: int = 0
    """Measured requests whose hit came partly from the cluster-shared KV store."""
    shared_cached_tokens: int = 0
    """Prompt tokens loaded from the shared store (part of `cached_tokens`)."""
    shared_tier: bool = False
    """The run had a cluster-shared KV store: `row()` then appends `SHARED_TIER_COLUMNS`."""
    peer_fetch: bool = False
    """The run had G2 peer fetch: `row()` then appends `PEER_FETCH_COLUMNS`."""
    tier_load_ms: dict[str, float] = field(default_factory=dict)
    """The load-from-tier part of the TTFT (`RequestRecord.tier_load_s`) over the measured requests that loaded
    from a tier (host or shared): keys p50, p99; NaN without one."""
    session_figures: SessionFigures | None = None
    """Of the measured requests that belong to sessions (None: none does): per-session and per-turn figures."""
    pd_figures: PdFigures | None = None
    """A disaggregated run's transfers, TTFT split and pool utilisation (None: an aggregated run)."""
    output_tokens: int = 0
    """Output tokens of the measured requests."""
    device_time: tuple[DeviceTime, ...] = ()
    """The devices' provisioned time over the measured phase, with their prices (`RunResult.device_time`): the
    cost columns' counters (`sim.results.cost.cost_columns`; NaN when empty)."""
    fleet_row: dict[str, float | int] | None = None
    """An autoscaled run's `FLEET_COLUMNS` over the measured phase (None: a fixed fleet)."""

    @property
    def token_hit_rate(self) -> float:
        """`prefix_reuse`, under vLLM's name."""
        return self.prefix_reuse

    @property
    def cpu_token_hit_rate(self) -> float:
        """`cpu_prefix_reuse`, under the name of `token_hit_rate`."""
        return self.cpu_prefix_reuse

    @property
    def rate_span_s(self) -> float:
        return self.duration_s

    def row(self) -> dict[str, float | int]:
        """The summary as flat columns (`summary.csv`)."""
        engine = self.engine
        return {
            "requests": self.requests,
            "request_hit_rate": self.request_hit_rate,
            "full_hit_rate": self.full_hit_rate,
            "token_hit_rate": self.token_hit_rate,
            "ttft_p50_ms": self.ttft_ms["p50"],
            "ttft_p90_ms": self.ttft_ms["p90"],
            "ttft_p99_ms": self.ttft_ms["p99"],
            **{f"ttft_{split}_p{q}_ms": self.ttft_ms[f"{split}_p{q}"] for split in ("hit", "miss") for q in (50, 90, 99)},
            "throughput_rps": self.throughput_rps,
            "hit_requests": self.hit_requests,
            "full_hit_requests": self.full_hit_requests,
            "prefix_cache_queries": engine.prefix_cache.queries,
            "prefix_cache_hits": engine.prefix_cache.hits,
            "evicted_blocks": engine.evicted_blocks,
            "evicted_tokens": engine.evicted_tokens,
            "preemptions": engine.preemptions,
            "max_worker_share": self.max_worker_share,
            "reuse_available": self.reuse_available,
            "reuse_captured": self.reuse_captured,
            "reuse_delivered": self.token_hit_rate,
            "view_checked": self.view_checked,
            "view_false_hit_rate": self.view_false_hit_rate,
            "view_false_tokens": self.view_false_tokens,
            **slo_columns(self.slo),
            "slo_met_requests": self.slo_met_requests,
            "goodput_rps": self.goodput_rps,
            "goodput_fraction": self.goodput_fraction,
            "tpot_p50_ms": self.tpot_ms["p50"],
            "tpot_p99_ms": self.tpot_ms["p99"],
            "e2e_p50_ms": self.e2e_ms["p50"],
            "e2e_p99_ms": self.e2e_ms["p99"],
            "imbalance_max_mean": self.imbalance_max_mean,
            "jain_index": self.jain_index,
            "ttft_slo_met": self.ttft_slo_met,
            "tpot_slo_met": self.tpot_slo_met,
            "e2e_slo_met": self.e2e_slo_met,
            "gpu_hit_rate": self.gpu_hit_rate,
            "cpu_hit_rate": self.cpu_hit_rate,
            "cpu_token_hit_rate": self.cpu_token_hit_rate,
            **{f"ttft_{tier}_hit_p{q}_ms": self.ttft_ms[f"{tier}_hit_p{q}"] for tier in ("gpu", "cpu") for q in (50, 99)},
            "cpu_stored_blocks": engine.cpu_stored_blocks,
            "cpu_loaded_blocks": engine.cpu_loaded_blocks,
            "cpu_evicted_blocks": engine.cpu_evicted_blocks,
            **self.cost_row(),
            # NOTE: only with sessions, so that the summary of a run without them keeps its columns.
            **(self.session_figures.row() if self.session_figures is not None else {}),
            # NOTE: only for a disaggregated run, likewise.
            **(self.pd_figures.row() if self.pd_figures is not None else {}),
            # NOTE: only with a shared store, likewise (`shared_kv_gib` itself comes from the caller's row).
            **(self.shared_tier_row() if self.shared_tier else {}),
            # NOTE: only with G2 peer fetch, likewise.
            **(peer_fetch_row(engine) if self.peer_fetch else {}),
            # NOTE: only for an autoscaled fleet, likewise.
            **(self.fleet_row or {}),
        }

    def cost_row(self) -> dict[str, float]:
        """The cost columns (`COST_COLUMNS`), over the measured phase."""
        return cost_columns(self.device_time, span_s=self.duration_s, input_tokens=self.prompt_tokens,
                            output_tokens=self.output_tokens, slo_met_requests=self.slo_met_requests,
                            slo_set=self.slo.is_set)

    def shared_tier_row(self) -> dict[str, float | int]:
        """The cluster-shared store's columns (`SHARED_TIER_COLUMNS` but `shared_kv_gib`): its hits, TTFT of its
        hits, the load-from-tier part of TTFT, blocks stored, loaded and evicted, bytes over each link."""
        engine = self.engine
        return {
            "shared_hit_rate": self.shared_hit_rate,
            "shared_token_hit_rate": self.shared_prefix_reuse,
            **{f"ttft_shared_hit_p{q}_ms": self.ttft_ms[f"shared_hit_p{q}"] for q in (50, 99)},
            **{f"tier_load_p{q}_ms": self.tier_load_ms[f"p{q}"] for q in (50, 99)},
            "shared_stored_blocks": engine.shared_stored_blocks,
            "shared_loaded_blocks": engine.shared_loaded_blocks,
            "shared_evicted_blocks": engine.shared_evicted_blocks,
            "shared_link_bytes": engine.shared_link_bytes,
            "host_link_bytes": engine.host_link_bytes,
        }


def peer_fetch_row(engine: EngineCounters) -> dict[str, float | int]:
    """G2 peer fetch's columns (`PEER_FETCH_COLUMNS`): blocks pulled from peers' host tiers, and their share of
    what entered the host tiers (pulled / (pulled + stored from the GPU); NaN if nothing entered)."""
    pulled, stored = engine.peer_fetched_blocks, engine.cpu_stored_blocks
    return {"peer_fetched_blocks": pulled,
            "peer_share": pulled / (pulled + stored) if pulled + stored else float("nan")}


def summarize(result: RunResult) -> Summary:
    """The summary of `result`'s measured requests; goodput counts against `result.slo` (the scenario's)."""
    measured = result.measured
    slo = result.slo
    tpot = [t for r in measured if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s for r in measured]
    ttft_all = [r.ttft_s for r in measured]
    ttft_hit = [r.ttft_s for r in measured if r.is_hit]
    ttft_miss = [r.ttft_s for r in measured if not r.is_hit]
    ttft_gpu_hit = [r.ttft_s for r in measured if r.is_hit and not r.is_cpu_hit and not r.is_shared_hit]
    ttft_cpu_hit = [r.ttft_s for r in measured if r.is_cpu_hit]
    ttft_shared_hit = [r.ttft_s for r in measured if r.is_shared_hit]
    tier_load = [r.tier_load_s for r in measured if r.tier_cached_tokens]
    per_worker = [0] * result.num_workers
    for r in measured:
        per_worker[r.worker] += 1
    return Summary(
        requests=len(measured),
        hit_requests=sum(1 for r in measured if r.is_hit),
        full_hit_requests=sum(1 for r in measured if r.is_full_hit),
        prompt_tokens=sum(r.prompt_tokens for r in measured),
        cached_tokens=sum(r.cached_tokens for r in measured),
        engine=total_counters(result.workers),
        duration_s=result.measured_end_s - result.measured_start_s,
        ttft_ms={
            f"{prefix}p{q}": _percentile_ms(values, q)
            for prefix, values in (("", ttft_all), ("hit_", ttft_hit), ("miss_", ttft_miss))
            for q in (50, 90, 99)
        } | {f"{tier}_hit_p{q}": _percentile_ms(values, q)
             for tier, values in (("gpu", ttft_gpu_hit), ("cpu", ttft_cpu_hit), ("shared", ttft_shared_hit))
             for q in (50, 99)},
        requests_per_worker=tuple(per_worker),
        slo=slo,
        slo_met_requests=sum(1 for r in measured if slo.met_by(r)),
        ttft_slo_met=sum(1 for r in measured if slo.ttft_met(r)),
        tpot_slo_met=sum(1 for r in measured if slo.tpot_met(r)),
        e2e_slo_met=sum(1 for r in measured if slo.e2e_met(r)),
        tpot_ms={f"p{q}": _percentile_ms(tpot, q) for q in (50, 99)},
        e2e_ms={f"p{q}": _percentile_ms(e2e, q) for q in (50, 99)},
        available_tokens=reduce(booked_add, (r.available_tokens for r in measured), 0),
        captured_tokens=reduce(booked_add, (r.captured_tokens for r in measured), 0),
        view_checked=sum(1 for r in measured if r.believed_tokens >= 0),
        view_false_hits=sum(1 for r in measured if r.believed_tokens > r.held_tokens),
        view_false_tokens=sum(max(0, r.believed_tokens - r.held_tokens) for r in measured),
        cpu_hit_requests=sum(1 for r in measured if r.is_cpu_hit),
        cpu_cached_tokens=sum(r.cpu_cached_tokens for r in measured),
        shared_hit_requests=sum(1 for r in measured if r.is_shared_hit),
        shared_cached_tokens=sum(r.shared_cached_tokens for r in measured),
        shared_tier=result.shared_tier,
        peer_fetch=result.peer_fetch,
        tier_load_ms={f"p{q}": _percentile_ms(tier_load, q) for q in (50, 99)},
        session_figures=SessionFigures.of(measured),
        pd_figures=None if result.pools is None else PdFigures.of(
            measured, prefill_workers=result.pools[0], decode_workers=result.pools[1],
            utilisation=result.pool_utilisation),
        output_tokens=sum(r.output_tokens for r in measured),
        device_time=result.device_time,
        fleet_row=None if result.fleet is None else result.fleet.row(result.measured_start_s, result.measured_end_s),
    )
