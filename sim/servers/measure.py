"""Measuring real servers with exactly the stream kvsim simulates (the composition root of `kvsim measure`).

The request stream is `sim.workloads.shared_prefix.shared_prefix_stream` with token ids from `prompt_token_ids`; warm-ups are
sent one at a time first; then a closed loop keeps C requests in flight. Every request opens a new connection and
is routed on the client by the same router implementation the simulator uses. Per request it records the client
TTFT (first streamed chunk), `cached_tokens` and the server's own timing; per server it takes `/metrics` before the
warm-ups, after them and at the end (counter deltas go to the sidecar).
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from policies import ROUTERS
from sim.servers.openai_client import (
    Endpoint, EndpointError, get, model_name, reset_prefix_cache, scrape_metrics, server_config, stream_completion,
)
from sim.workloads.request import Request
from sim.scenario import WorkloadSpec
from sim.workloads.shared_prefix import prompt_token_ids, rng_for, shared_prefix_stream

COUNTERS = {
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
}


@dataclass
class MeasureConfig:
    endpoints: list[Endpoint]
    workload: WorkloadSpec
    router: str = "random"
    router_options: dict = field(default_factory=dict)
    seed: int = 0
    min_token_id: int = 3
    max_token_id: int = 8191
    model: str | None = None
    timeout_s: float = 120.0
    retries: int = 2
    reset_cache: bool = True


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


def _counters(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics.get(name, 0.0) for k, name in COUNTERS.items()}


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def probe(cfg: MeasureConfig) -> dict:
    """Ask every endpoint what it is: model, block size, block count, engine version, scheduler limits."""
    blocks, sizes, versions, limits = [], [], [], []
    for ep in cfg.endpoints:
        _, info = scrape_metrics(ep)
        cache = info.get("vllm:cache_config_info", {})
        if "block_size" not in cache or "num_gpu_blocks" not in cache:
            raise EndpointError(f"{ep.url}/metrics: no vllm:cache_config_info with block_size and num_gpu_blocks")
        sizes.append(int(cache["block_size"]))
        blocks.append(int(cache["num_gpu_blocks"]))
        status, text = get(ep, "/version")
        versions.append(text.split('"version":')[-1].strip(' "}\n') if status == 200 else "unknown")
        conf = server_config(ep)
        if conf and "vllm_config" in conf:
            sched, model_conf = conf["vllm_config"]["scheduler_config"], conf["vllm_config"]["model_config"]
            limits.append((sched["max_num_batched_tokens"], sched["max_num_seqs"], model_conf["max_model_len"]))
    for what, values in (("block size", sizes), ("block count", blocks), ("version", versions), ("limits", limits)):
        if len(set(values)) > 1:
            raise EndpointError(f"the endpoints differ in {what}: {values}; kvsim models one worker kind per run")
    out = {"block_size": sizes[0], "num_gpu_blocks": blocks[0], "engine": {"name": "vllm", "version": versions[0]},
           "model": cfg.model or model_name(cfg.endpoints[0])}
    if limits:
        out["max_num_batched_tokens"], out["max_num_seqs"], out["max_model_len"] = limits[0]
    return out


def measure(cfg: MeasureConfig, progress: Callable[[], None] | None = None) -> tuple[list[dict], dict]:
    """Run the stream against the endpoints; returns the run CSV rows and the sidecar (nothing is written)."""
    if cfg.workload.arrival_rate_rps is not None:
        raise ValueError("kvsim measure drives a closed loop; unset workload.arrival_rate_rps")
    factory = ROUTERS[cfg.router]
    if factory.needs_cache_state:
        raise ValueError(f"router {cfg.router!r} needs the servers' cache state (KV events), which measure cannot "
                         f"see; use one of: {', '.join(n for n, c in sorted(ROUTERS.items()) if not c.needs_cache_state)}")
    info = probe(cfg)
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
            if not reset_prefix_cache(ep):
                raise EndpointError(f"{ep.url}/reset_prefix_cache refused (start vLLM with VLLM_SERVER_DEV_MODE=1, "
                                    f"wait until it is idle, or pass --no-reset)")
    before = [_counters(scrape_metrics(ep)[0]) for ep in cfg.endpoints]

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
    warm = [_counters(scrape_metrics(ep)[0]) for ep in cfg.endpoints]
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
    after = [_counters(scrape_metrics(ep)[0]) for ep in cfg.endpoints]

    try:
        version = metadata.version("kvsim")
    except metadata.PackageNotFoundError:
        version = "unknown"
    setup = {
        "workers": n, "prefixes": cfg.workload.prefixes, "concurrency": cfg.workload.concurrency,
        "requests": len(stream.requests), "block_size": block_size, "num_gpu_blocks": info["num_gpu_blocks"],
        "prefix_tokens": cfg.workload.prefix_tokens, "prompt_tokens": cfg.workload.prompt_tokens,
        "output_tokens": cfg.workload.output_tokens, "router": cfg.router, "router_options": cfg.router_options,
        "warmup_per_prefix": cfg.workload.warmup_per_prefix, "seed": cfg.seed, "engine": info["engine"],
        "model": info["model"], "endpoints": [ep.url for ep in cfg.endpoints],
        "max_num_batched_tokens": info.get("max_num_batched_tokens"), "max_num_seqs": info.get("max_num_seqs"),
        "max_model_len": info.get("max_model_len"),
        "token_ids": {"min": cfg.min_token_id, "max": cfg.max_token_id},
        "counters_measured": [_delta(a, w) for a, w in zip(after, warm)],
        "counters_total": [_delta(a, b) for a, b in zip(after, before)],
        "measured_duration_s": duration, "failed_requests": len(failures),
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "client": f"kvsim {version}",
    }
    rows.sort(key=lambda r: r["request_id"])
    return rows, setup
