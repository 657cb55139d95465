"""Send kvsim's shared-prefix stream through a real Dynamo frontend (one endpoint; Dynamo's router picks the worker).

    .venv/bin/python benchmarks/studies/real-dynamo/measure_dynamo.py --scenario benchmarks/studies/real-dynamo/tiny-cpu-dynamo.yaml \
        --frontend http://127.0.0.1:8000 --worker-metrics http://127.0.0.1:8181 --worker-metrics http://127.0.0.1:8182 \
        --router-label kv-aware --out benchmarks/studies/real-dynamo/runs/kv-n4-c2.csv

Same stream as `kvsim measure` (sim.workloads.shared_prefix: same prefixes, order, token ids; one warm-up per prefix
sent one at a time, then C in flight, a new connection per request), but every request goes to the frontend, with
`nvext.extra_fields = ["worker_id"]` so the answer names the worker Dynamo chose (decode_worker_id). Worker ids are
mapped to indices 0..W-1 by the `worker_id` label (hex) of each worker's /metrics on its system port (DYN_SYSTEM_PORT).
Before the run each worker's prefix cache is emptied (POST <system port>/engine/flush_cache) and its
vllm:prefix_cache_{queries,hits}_total counters are read before/after warm-ups and at the end.
Writes the kvsim run CSV + JSON sidecar (sim.servers.run_csv), so `kvsim validate` can simulate it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from sim.scenario import load_scenario  # noqa: E402
from sim.servers.openai_client import Endpoint, get, scrape_metrics  # noqa: E402
from sim.servers.run_csv import write_run_bytes  # noqa: E402
from sim.workloads.shared_prefix import prompt_token_ids, shared_prefix_stream  # noqa: E402


def complete(ep: Endpoint, model: str, ids: list[int], max_tokens: int, timeout_s: float = 120.0) -> dict:
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True},
                       "nvext": {"extra_fields": ["worker_id", "timing"]}}).encode()
    t0 = time.perf_counter()
    conn = ep.connect(timeout_s)
    ttft = usage = worker = timing = None
    n_out = 0
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json",
                                                                     "Connection": "close"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(300)!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            ev = json.loads(line[5:])
            if ev.get("choices"):
                n_out += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            nv = ev.get("nvext") or {}
            worker = (nv.get("worker_id") or {}).get("decode_worker_id", worker)
            timing = nv.get("timing") or timing
            usage = ev.get("usage") or usage
    finally:
        conn.close()
    e2e = time.perf_counter() - t0
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {"prompt_tokens": usage["prompt_tokens"], "cached_tokens": int(details.get("cached_tokens") or 0),
            "output_tokens": usage.get("completion_tokens", n_out), "ttft_ms": ttft * 1000, "e2e_ms": e2e * 1000,
            "worker_id": worker, "timing": timing or {}}


def counters(ep: Endpoint) -> dict:
    m = scrape_metrics(ep)[0]
    return {"queries": m.get("vllm:prefix_cache_queries_total", 0.0), "hits": m.get("vllm:prefix_cache_hits_total", 0.0),
            "preemptions": m.get("vllm:num_preemptions_total", 0.0), "prompt_tokens": m.get("vllm:prompt_tokens_total", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--frontend", default="http://127.0.0.1:8000")
    ap.add_argument("--worker-metrics", action="append", required=True, help="each worker's system port URL")
    ap.add_argument("--router-label", default="kv-aware", help="the sidecar's router (kvsim name for simulated routing)")
    ap.add_argument("--model", default="./tiny-model")
    ap.add_argument("--no-flush", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    scen, _ = load_scenario(a.scenario)
    wl, eng = scen.workload, scen.engine
    fe = Endpoint.parse(a.frontend)
    workers = [Endpoint.parse(u) for u in a.worker_metrics]
    index = {}
    for i, ep in enumerate(workers):
        labels = scrape_metrics(ep)[1]["vllm:cache_config_info"]
        index[int(labels["worker_id"], 16)] = i
        num_gpu_blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    if not a.no_flush:
        for ep in workers:
            status, text = get(ep, "/engine/flush_cache", method="POST")
            assert status == 200 and '"ok"' in text, (ep.url, status, text)
    stream = shared_prefix_stream(wl, block_size=block_size, seed=scen.seed)
    before = [counters(ep) for ep in workers]
    rows: list[dict] = []
    lock = threading.Lock()
    t_start = time.perf_counter()

    def send(req) -> None:
        ids = prompt_token_ids(req, seed=scen.seed)
        start = time.perf_counter() - t_start
        c = complete(fe, a.model, ids, req.output_tokens)
        row = {"request_id": req.request_id, "warmup": req.warmup, "prefix_id": req.prefix_id,
               "worker": index.get(c["worker_id"], -1), "prompt_tokens": c["prompt_tokens"],
               "cached_tokens": c["cached_tokens"], "ttft_ms": c["ttft_ms"], "e2e_ms": c["e2e_ms"], "start_s": start,
               "end_s": time.perf_counter() - t_start, "output_tokens": c["output_tokens"],
               "server_ttft_ms": c["timing"].get("ttft_ms", ""), "dynamo_kv_hit_rate": c["timing"].get("kv_hit_rate", ""),
               "dynamo_worker_id": c["worker_id"], "attempts": 1, "error": ""}
        with lock:
            rows.append(row)

    for r in stream.warmups:
        send(r)
    warm = [counters(ep) for ep in workers]
    t_meas = time.perf_counter()
    q = iter(stream.requests)

    def client() -> None:
        while True:
            with lock:
                r = next(q, None)
            if r is None:
                return
            send(r)

    th = [threading.Thread(target=client) for _ in range(wl.concurrency)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    duration = time.perf_counter() - t_meas
    after = [counters(ep) for ep in workers]
    rows.sort(key=lambda r: r["request_id"])
    delta = lambda x, y: {k: x[k] - y[k] for k in x}  # noqa: E731
    setup = {"workers": len(workers), "prefixes": wl.prefixes, "concurrency": wl.concurrency,
             "requests": len(stream.requests), "block_size": block_size, "num_gpu_blocks": num_gpu_blocks,
             "prefix_tokens": wl.prefix_tokens, "prompt_tokens": wl.prompt_tokens, "output_tokens": wl.output_tokens,
             "router": a.router_label,
             "router_options": dict(scen.router.options) if scen.router.name == a.router_label else {}, "warmup_per_prefix": wl.warmup_per_prefix,
             "seed": scen.seed, "engine": {"name": "vllm", "version": "0.31.0"}, "model": a.model,
             "endpoints": [a.frontend], "max_num_batched_tokens": eng.max_num_batched_tokens,
             "max_num_seqs": eng.max_num_seqs, "max_model_len": eng.max_model_len,
             "token_ids": {"min": 3, "max": 8191},
             "counters_measured": [delta(x, y) for x, y in zip(after, warm)],
             "counters_total": [delta(x, y) for x, y in zip(after, before)],
             "measured_duration_s": duration, "failed_requests": 0,
             "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "client": "benchmarks/studies/real-dynamo/measure_dynamo.py via Dynamo frontend (ai-dynamo 1.6.1)"}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_b, js_b = write_run_bytes(rows, setup)
    out.write_bytes(csv_b)
    out.with_suffix(".json").write_bytes(js_b)
    # What the run CSV format has no column for: Dynamo's worker id and its router's own overlap estimate
    # (nvext.timing.kv_hit_rate = matched blocks / prompt blocks on the chosen worker, from the KV events).
    with open(out.with_suffix(".dynamo.csv"), "w") as f:
        f.write("request_id,warmup,prefix_id,worker,dynamo_worker_id,cached_tokens,dynamo_kv_hit_rate,server_ttft_ms\n")
        for r in rows:
            f.write(f"{r['request_id']},{r['warmup']},{r['prefix_id']},{r['worker']},{r['dynamo_worker_id']},"
                    f"{r['cached_tokens']},{r['dynamo_kv_hit_rate']},{r['server_ttft_ms']}\n")
    m = [r for r in rows if not r["warmup"]]
    full = (wl.prefix_tokens // block_size) * block_size
    hits = sum(r["cached_tokens"] >= full for r in m)
    print(f"{out}: {len(m)} measured requests, request hit rate {hits / len(m):.3f} (cached >= {full}), "
          f"token hit rate {sum(r['cached_tokens'] for r in m) / sum(r['prompt_tokens'] for r in m):.3f}, "
          f"per worker {[sum(r['worker'] == i for r in m) for i in range(len(workers))]}, duration {duration:.1f} s")
    print("counters_measured", setup["counters_measured"])


if __name__ == "__main__":
    main()
