"""Measuring real servers with exactly the stream kvsim simulates (the composition root of `kvsim measure`).

The request stream is `sim.workloads.shared_prefix.shared_prefix_stream` with token ids from `prompt_token_ids`; warm-ups are
sent one at a time first; then a closed loop keeps C requests in flight. Every request opens a new connection and
is routed on the client by the same router implementation the simulator uses. Per request it records the client
TTFT (first streamed chunk), `cached_tokens` and the server's own timing; per server it takes `/metrics` before the
warm-ups, after them and at the end (counter deltas go to the sidecar).

Each endpoint's engine is recognised by what it serves (`probe_endpoint`); one run must not mix engines:

* **vLLM**: `vllm:cache_config_info` in /metrics (block size and count) and, in dev mode, its scheduler limits in
  /server_info. The prefix cache is reset by POST /reset_prefix_cache; its prefix-cache counters are required.
* **SGLang**: /server_info (its resolved server arguments, `max_total_num_tokens` and the scheduler's effective
  `max_running_requests`). The radix cache is emptied by POST /flush_cache. /metrics exists only with
  `--enable-metrics`; without it the sidecar's counters are null. SGLang has no blocks: the run's `block_size` is
  the one the client-side router hashes prompts in (`MeasureConfig.hash_block_size`).
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from policies import ROUTERS
from sim.servers.openai_client import (
    Endpoint, EndpointError, fetch_metrics, flush_cache, get, model_name, reset_prefix_cache, scrape_metrics,
    served_model, server_config, sglang_server_info, stream_completion,
)
from sim.workloads.request import Request
from sim.workloads.spec import SharedPrefixSpec
from sim.workloads.shared_prefix import prompt_token_ids, rng_for, shared_prefix_stream

COUNTERS = {
    "vllm": {
        "queries": "vllm:prefix_cache_queries_total",
        "hits": "vllm:prefix_cache_hits_total",
        "preemptions": "vllm:num_preemptions_total",
        "prompt_tokens": "vllm:prompt_tokens_total",
    },
    # SGLang counts these in its tokenizer process as each request finishes (cached tokens summed over
    # cache_source = device/host/storage); a labelled counter has no sample before its first increment, so a
    # missing one on a server that serves /metrics is a count of 0.
    "sglang": {
        "requests": "sglang:num_requests_total",
        "prompt_tokens": "sglang:prompt_tokens_total",
        "cached_tokens": "sglang:cached_tokens_total",
        "retractions": "sglang:num_retracted_requests_total",
    },
}
"""Per engine: the sidecar's counter name -> the Prometheus metric (samples summed over their labels)."""

SGLANG_SETUP = ("page_size", "max_total_tokens", "max_model_len", "chunked_prefill_size", "max_prefill_tokens",
                "max_running_requests", "schedule_policy", "radix_eviction_policy", "disable_overlap_schedule")
"""What the sidecar of an SGLang run records of the servers' setup (see `_probe_sglang`)."""


@dataclass
class MeasureConfig:
    endpoints: list[Endpoint]
    workload: SharedPrefixSpec
    router: str = "random"
    router_options: dict = field(default_factory=dict)
    seed: int = 0
    min_token_id: int = 3
    max_token_id: int = 8191
    model: str | None = None
    timeout_s: float = 120.0
    retries: int = 2
    reset_cache: bool = True
    hash_block_size: int = 16
    """Block size of the prompt hashes the client-side router reads, for engines without blocks (SGLang); vLLM's
    own block size is used on vLLM."""


class _ClientView:
    """What a router may see from the client side: worker count, block size and its own in-flight counts."""

    def __init__(self, num_workers: int, block_size: int) -> None:
        self.num_workers = num_workers
        self.block_size = block_size
        self.loads = [0] * num_workers

    def in_flight(self, worker: int) -> int:
        return self.loads[worker]

    def cached_prefix_tokens(self, worker, request) -> int:
        raise RuntimeError("this router needs the servers' cache state, which a client cannot see")


def _counters(ep: Endpoint, engine: str) -> dict[str, float] | None:
    """The engine's counters now, or None where an SGLang server serves no /metrics (vLLM's are required)."""
    if engine == "vllm":
        metrics = scrape_metrics(ep)[0]
    else:
        found = fetch_metrics(ep)
        if found is None:
            return None
        metrics = found[0]
    return {k: metrics.get(name, 0.0) for k, name in COUNTERS[engine].items()}


def _delta(after: dict[str, float] | None, before: dict[str, float] | None) -> dict[str, float] | None:
    if after is None or before is None:
        return None
    return {k: after[k] - before[k] for k in after}


def _reset(ep: Endpoint, engine: str) -> None:
    """Empty the server's prefix cache; EndpointError naming the cause if it refuses."""
    if engine == "vllm":
        if not reset_prefix_cache(ep):
            raise EndpointError(f"{ep.url}/reset_prefix_cache refused (start vLLM with VLLM_SERVER_DEV_MODE=1, "
                                f"wait until it is idle, or pass --no-reset)")
    elif not flush_cache(ep):
        raise EndpointError(f"{ep.url}/flush_cache refused (SGLang flushes only when no request is running or "
                            f"waiting: wait until it is idle, or pass --no-reset)")


def _probe_vllm(ep: Endpoint, cache: dict[str, str]) -> dict:
    """A vLLM endpoint: block size and count from `vllm:cache_config_info`, version, limits (dev mode only)."""
    if "block_size" not in cache or "num_gpu_blocks" not in cache:
        raise EndpointError(f"{ep.url}/metrics: no vllm:cache_config_info with block_size and num_gpu_blocks")
    status, text = get(ep, "/version")
    version = text.split('"version":')[-1].strip(' "}\n') if status == 200 else "unknown"
    out = {"engine": {"name": "vllm", "version": version}, "block_size": int(cache["block_size"]),
           "num_gpu_blocks": int(cache["num_gpu_blocks"])}
    conf = server_config(ep)
    if conf and "vllm_config" in conf:
        sched, model_conf = conf["vllm_config"]["scheduler_config"], conf["vllm_config"]["model_config"]
        out.update(max_num_batched_tokens=sched["max_num_batched_tokens"], max_num_seqs=sched["max_num_seqs"],
                   max_model_len=model_conf["max_model_len"])
    return out


def _probe_sglang(ep: Endpoint, info: dict, *, hash_block_size: int) -> dict:
    """An SGLang endpoint, from its /server_info.

    * `max_total_tokens` is the KV pool the scheduler got (`max_total_num_tokens`), not the --max-total-tokens
      asked for;
    * `max_running_requests` is the scheduler's effective limit (`effective_max_running_requests_per_dp` of its
      internal state) where reported, else the argument (null = SGLang derives it, as kvsim does);
    * `max_model_len` is the context length: the argument, else the model's (GET /v1/models `max_model_len`);
    * `chunked_prefill_size` is SGLang's own value (-1 or 0: chunking disabled).
    """
    if not info.get("enable_cache_report", True):
        raise EndpointError(f"{ep.url}: SGLang was started without --enable-cache-report, so its answers carry no "
                            f"cached_tokens")

    def number(key: str, value) -> int | None:
        try:
            return None if value is None else int(value)
        except (TypeError, ValueError):
            raise EndpointError(f"{ep.url}/server_info: {key} is {value!r}, expected an integer") from None

    slots = number("max_total_num_tokens", info["max_total_num_tokens"])
    if slots is None:
        raise EndpointError(f"{ep.url}/server_info: max_total_num_tokens is null (the scheduler is not ready)")
    states = info.get("internal_states") or [{}]
    running = states[0].get("effective_max_running_requests_per_dp", info.get("max_running_requests"))
    return {
        "engine": {"name": "sglang", "version": str(info.get("version", "unknown"))},
        "block_size": hash_block_size,
        "page_size": number("page_size", info.get("page_size", 1)),
        "max_total_tokens": slots,
        "max_model_len": number("context_length", info.get("context_length") or served_model(ep).get("max_model_len")),
        "chunked_prefill_size": number("chunked_prefill_size", info.get("chunked_prefill_size")),
        "max_prefill_tokens": number("max_prefill_tokens", info.get("max_prefill_tokens")),
        "max_running_requests": number("max_running_requests", running),
        "schedule_policy": info.get("schedule_policy"),
        "radix_eviction_policy": info.get("radix_eviction_policy"),
        "disable_overlap_schedule": info.get("disable_overlap_schedule"),
    }


def probe_endpoint(ep: Endpoint, *, hash_block_size: int = 16) -> dict:
    """What one endpoint is: {"engine": {name, version}, "block_size", ...the engine's setup fields}."""
    metrics = fetch_metrics(ep)
    if metrics is not None and "vllm:cache_config_info" in metrics[1]:
        return _probe_vllm(ep, metrics[1]["vllm:cache_config_info"])
    info = sglang_server_info(ep)
    if info is not None:
        return _probe_sglang(ep, info, hash_block_size=hash_block_size)
    raise EndpointError(f"{ep.url}: neither vLLM (no vllm:cache_config_info with block_size and num_gpu_blocks in "
                        f"/metrics) nor SGLang (no max_total_num_tokens in /server_info)")


def probe(cfg: MeasureConfig) -> dict:
    """Ask every endpoint what it is; they must run one engine with one setup. A field some endpoints do not
    report is taken from those that do (None when none does)."""
    found = [probe_endpoint(ep, hash_block_size=cfg.hash_block_size) for ep in cfg.endpoints]
    engines = [f["engine"]["name"] for f in found]
    if len(set(engines)) > 1:
        named = ", ".join(f"{ep.url} {name}" for ep, name in zip(cfg.endpoints, engines))
        raise EndpointError(f"the endpoints run different engines ({named}); kvsim models one worker kind per run")
    out: dict = {}
    for key in dict.fromkeys(k for f in found for k in f):
        known = [f[key] for f in found if f.get(key) is not None]
        if len({json.dumps(v, sort_keys=True) for v in known}) > 1:
            raise EndpointError(f"the endpoints differ in {key}: {[f.get(key) for f in found]}; kvsim models one "
                                f"worker kind per run")
        out[key] = known[0] if known else None
    out["model"] = cfg.model or model_name(cfg.endpoints[0])
    return out


def measure(cfg: MeasureConfig, progress: Callable[[], None] | None = None) -> tuple[list[dict], dict]:
    """Run the stream against the endpoints; returns the run CSV rows and the sidecar (nothing is written)."""
    if cfg.workload.open_loop:
        given = "arrival_rate_rps" if cfg.workload.arrival_rate_rps is not None else "arrival_curve"
        raise ValueError(f"kvsim measure drives a closed loop; unset workload.{given}")
    factory = ROUTERS[cfg.router]
    if factory.needs_cache_state:
        raise ValueError(f"router {cfg.router!r} needs the servers' cache state (KV events), which measure cannot "
                         f"see; use one of: {', '.join(n for n, c in sorted(ROUTERS.items()) if not c.needs_cache_state)}")
    info = probe(cfg)
    engine = info["engine"]["name"]
    block_size = info["block_size"]
    n = len(cfg.endpoints)
    router = factory(num_workers=n, block_size=block_size, rng=rng_for(cfg.seed, "router"),
                     options=dict(cfg.router_options))
    view = _ClientView(n, block_size)
    stream = shared_prefix_stream(cfg.workload, block_size=block_size, seed=cfg.seed)
    lock = threading.Lock()
    rows: list[dict] = []
    failures: list[str] = []
    t_start = time.perf_counter()

    if cfg.reset_cache:
        for ep in cfg.endpoints:
            _reset(ep, engine)
    before = [_counters(ep, engine) for ep in cfg.endpoints]

    def send(request: Request) -> None:
        with lock:
            worker = router.route(request, view)
            router.on_dispatch(request, worker)
            view.loads[worker] += 1
        ids = prompt_token_ids(request, seed=cfg.seed, min_token_id=cfg.min_token_id,
                               max_token_id=cfg.max_token_id)
        start = time.perf_counter() - t_start
        row = {"request_id": request.request_id, "warmup": request.warmup, "prefix_id": request.prefix_id,
               "worker": worker, "prompt_tokens": len(ids), "start_s": start}
        try:
            c = stream_completion(cfg.endpoints[worker], model=info["model"], prompt_ids=ids,
                                  max_tokens=request.output_tokens, timeout_s=cfg.timeout_s, retries=cfg.retries)
            end = time.perf_counter() - t_start
            row.update(prompt_tokens=c.prompt_tokens, cached_tokens=c.cached_tokens, ttft_ms=c.ttft_s * 1000,
                       e2e_ms=c.e2e_s * 1000, end_s=end, output_tokens=c.output_tokens,
                       server_ttft_ms=c.server_ttft_ms if c.server_ttft_ms is not None else "",
                       server_queue_ms=c.server_queue_ms if c.server_queue_ms is not None else "",
                       server_generation_ms=c.server_generation_ms if c.server_generation_ms is not None else "",
                       attempts=c.attempts, error="")
        except EndpointError as err:
            end = time.perf_counter() - t_start
            row.update(cached_tokens=0, ttft_ms=float("nan"), e2e_ms=float("nan"), end_s=end, attempts=cfg.retries + 1,
                       error=str(err).replace("\n", " ")[:300])
            failures.append(row["error"])
        with lock:
            router.on_first_token(request, worker)
            router.on_complete(request, worker)
            view.loads[worker] -= 1
            rows.append(row)
        if progress:
            progress()

    for request in stream.warmups:
        send(request)
    warm = [_counters(ep, engine) for ep in cfg.endpoints]
    measured_start = time.perf_counter() - t_start
    queue = iter(stream.requests)

    def client() -> None:
        while True:
            with lock:
                request = next(queue, None)
            if request is None:
                return
            send(request)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(cfg.workload.concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    duration = time.perf_counter() - t_start - measured_start
    after = [_counters(ep, engine) for ep in cfg.endpoints]

    try:
        version = metadata.version("kvsim")
    except metadata.PackageNotFoundError:
        version = "unknown"
    setup = {
        "workers": n, "prefixes": cfg.workload.prefixes, "concurrency": cfg.workload.concurrency,
        "requests": len(stream.requests), "block_size": block_size,
        "prefix_tokens": cfg.workload.prefix_tokens, "prompt_tokens": cfg.workload.prompt_tokens,
        "output_tokens": cfg.workload.output_tokens, "router": cfg.router, "router_options": cfg.router_options,
        "warmup_per_prefix": cfg.workload.warmup_per_prefix, "seed": cfg.seed, "engine": info["engine"],
        "model": info["model"], "endpoints": [ep.url for ep in cfg.endpoints],
        **_engine_setup(info),
        "token_ids": {"min": cfg.min_token_id, "max": cfg.max_token_id},
        "counters_measured": [_delta(a, w) for a, w in zip(after, warm)],
        "counters_total": [_delta(a, b) for a, b in zip(after, before)],
        "measured_duration_s": duration, "failed_requests": len(failures),
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "client": f"kvsim {version}",
    }
    rows.sort(key=lambda r: r["request_id"])
    return rows, setup


def _engine_setup(info: dict) -> dict:
    """The sidecar's engine-specific fields: vLLM's block count and limits, or SGLang's `SGLANG_SETUP`."""
    if info["engine"]["name"] == "vllm":
        return {"num_gpu_blocks": info["num_gpu_blocks"], "max_num_batched_tokens": info.get("max_num_batched_tokens"),
                "max_num_seqs": info.get("max_num_seqs"), "max_model_len": info.get("max_model_len")}
    return {key: info.get(key) for key in SGLANG_SETUP}
