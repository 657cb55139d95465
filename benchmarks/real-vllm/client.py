"""Minimal standard-library client for the real vLLM servers started by serve.sh (any Python 3.9+).

Library use:
    from client import complete, scrape_metrics, reset_prefix_cache
    r = complete(8101, ids, max_tokens=16)   # dict: cached_tokens, prompt_tokens, ttft_s, e2e_s, server_ttft_ms, ...

Command line (the checks behind README.md):
    python3 benchmarks/real-vllm/client.py verify [PORT ...]     # default ports 8101 8102
"""
from __future__ import annotations

import http.client
import json
import random
import statistics
import sys
import threading
import time

MODEL = "./tiny-model"  # must equal the model argument given to `vllm serve` (serve.sh serves ./tiny-model)
HOST = "127.0.0.1"


def _request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 600.0):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=data, headers=headers)
    return conn, conn.getresponse()


def complete(port: int, ids: list[int], max_tokens: int = 16, model: str = MODEL, keep_chunks: bool = False,
             return_token_ids: bool = False) -> dict:
    """Streaming POST /v1/completions with a token-id prompt; exactly max_tokens output tokens.

    Without return_token_ids the streamed choices carry "text": "" and "token_ids": null (no tokenizer); with it,
    each chunk carries its delta token ids and the first one also the prompt ids.
    """
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if return_token_ids:
        body["return_token_ids"] = True
    t0 = time.perf_counter()
    conn, resp = _request(port, "POST", "/v1/completions", body)
    headers_s = time.perf_counter() - t0
    try:
        if resp.status != 200:
            raise RuntimeError(f"POST /v1/completions on port {port}: HTTP {resp.status}: {resp.read()[:500]!r}")
        ttft = None
        usage = metrics = None
        chunks: list[str] = []
        n_token_ids = 0
        for raw in resp:  # server-sent events: "data: {...}\n", blank lines, finally "data: [DONE]"
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            if keep_chunks:
                chunks.append(payload.decode())
            obj = json.loads(payload)
            if obj.get("choices"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                for c in obj["choices"]:
                    n_token_ids += len(c.get("token_ids") or [])
            usage = obj.get("usage") or usage
            metrics = obj.get("metrics") or metrics
        e2e = time.perf_counter() - t0
    finally:
        conn.close()
    usage = usage or {}
    metrics = metrics or {}
    out = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        "ttft_s": ttft,
        "headers_s": headers_s,
        "e2e_s": e2e,
        "server_ttft_ms": metrics.get("time_to_first_token_ms"),
        "server_queue_ms": metrics.get("queue_time_ms"),
        "streamed_token_ids": n_token_ids,
        "metrics": metrics,
    }
    if keep_chunks:
        out["chunks"] = chunks
    return out


def get_text(port: int, path: str) -> tuple[int, str]:
    conn, resp = _request(port, "GET", path, timeout=30)
    try:
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def scrape_metrics(port: int) -> dict[str, float]:
    """GET /metrics; returns {'name{labels}': value}, skipping comments and *_created series."""
    status, text = get_text(port, "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics on port {port}: HTTP {status}")
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{")[0].endswith("_created"):
            continue
        out[key] = float(value)
    return out


def metric(snapshot: dict[str, float], name: str) -> float:
    """Sum of all series of one metric name (e.g. 'vllm:prefix_cache_hits_total')."""
    return sum(v for k, v in snapshot.items() if k.split("{")[0] == name)


def reset_prefix_cache(port: int) -> tuple[int, str]:
    conn, resp = _request(port, "POST", "/reset_prefix_cache", timeout=30)
    try:
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(3, 8191) for _ in range(n)]  # 0-2 are pad/bos/eos


# ---------------------------------------------------------------------------------------------------------------
def verify(ports: list[int]) -> None:
    port = ports[0]
    rng = random.Random(0)
    names = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
             "vllm:prompt_tokens_total", "vllm:request_success_total"]

    rt = complete(port, random_ids(rng, 40), max_tokens=2, keep_chunks=True, return_token_ids=True)
    print("== with return_token_ids (40-token prompt, 2 outputs), chunks:\n" + "\n".join(rt["chunks"]))
    print(f"== POST /reset_prefix_cache (port {port}):", reset_prefix_cache(port))
    m0 = scrape_metrics(port)
    a = random_ids(rng, 600)
    b = a[:320] + random_ids(rng, 280)
    r1 = complete(port, a, keep_chunks=True)
    print("== first streamed chunk of request 1:\n" + r1["chunks"][0])
    print("== final usage chunk of request 1:\n" + r1["chunks"][-1])
    print(f"== number of data chunks (excluding [DONE]): {len(r1['chunks'])}, streamed token ids: {r1['streamed_token_ids']}")
    r2 = complete(port, a)
    r3 = complete(port, b)
    m1 = scrape_metrics(port)
    for label, r in (("600 tokens, cold", r1), ("same 600 tokens", r2), ("320-token shared prefix + 280 new", r3)):
        print(f"{label:36s} prompt={r['prompt_tokens']} cached={r['cached_tokens']} "
              f"ttft={r['ttft_s'] * 1e3:.1f} ms server_ttft={r['server_ttft_ms']} ms queue={r['server_queue_ms']} ms "
              f"e2e={r['e2e_s'] * 1e3:.1f} ms")
    print("== counter deltas over these 3 requests:")
    for n in names:
        print(f"  {n}: {metric(m1, n) - metric(m0, n):g}")
    print("== expected: queries 1800 (3 x 600), hits", r1["cached_tokens"] + r2["cached_tokens"] + r3["cached_tokens"])

    print("== reset, then the same 600 tokens again:", reset_prefix_cache(port))
    r4 = complete(port, a)
    print(f"  cached after reset = {r4['cached_tokens']}")

    # TTFT: alternate misses (fresh prompt) and hits (the prompt just sent), 600 prompt tokens, 16 output tokens.
    res: dict[str, list[dict]] = {"miss": [], "hit (576 cached)": []}
    for _ in range(8):
        p = random_ids(rng, 600)
        m = complete(port, p)
        h = complete(port, p)
        assert m["cached_tokens"] == 0 and h["cached_tokens"] == 576, (m["cached_tokens"], h["cached_tokens"])
        res["miss"].append(m)
        res["hit (576 cached)"].append(h)
    med = statistics.median
    print("== TTFT, 8 miss/hit pairs of 600-token prompts, median [min-max] ms:")
    for label, rs in res.items():
        c = [r["ttft_s"] * 1e3 for r in rs]
        hd = [r["headers_s"] * 1e3 for r in rs]
        sv = [r["server_ttft_ms"] for r in rs]
        print(f"  {label:17s} client TTFT {med(c):6.1f} [{min(c):.1f}-{max(c):.1f}]   server time_to_first_token_ms "
              f"{med(sv):6.1f} [{min(sv):.1f}-{max(sv):.1f}]   response headers {med(hd):6.1f}")

    # Reset while a request holds blocks.
    holder = threading.Thread(target=complete, args=(port, random_ids(rng, 600), 400))
    holder.start()
    time.sleep(0.5)
    print("== reset while a request is running:", reset_prefix_cache(port))
    holder.join()
    print("== reset after it finished:", reset_prefix_cache(port))

    # Capacity: 4 concurrent 600-token requests with 16 outputs need 4 x cdiv(600 + 15, 32) = 80 blocks.
    for p in ports:
        print(f"== port {p}: 4 then 5 concurrent distinct 600-token requests")
        for k in (4, 5):
            reset_prefix_cache(p)
            before = scrape_metrics(p)
            res: list[dict] = []
            ths = [threading.Thread(target=lambda ids=random_ids(rng, 600): res.append(complete(p, ids, 16)))
                   for _ in range(k)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            after = scrape_metrics(p)
            print(f"  {k} concurrent: preemptions {metric(after, 'vllm:num_preemptions_total') - metric(before, 'vllm:num_preemptions_total'):g},"
                  f" cached {[r['cached_tokens'] for r in res]}, queue_ms {[round(r['server_queue_ms'] or 0, 1) for r in res]}")

    status, text = get_text(port, "/metrics")
    keep = ("prefix_cache", "preemption", "kv_cache_usage", "cache_config_info", "num_requests_running",
            "num_requests_waiting", "prompt_tokens_total", "request_success_total", "prompt_tokens_cached",
            "external_prefix", "time_to_first_token_seconds_count")
    print("== /metrics lines of interest:")
    for line in text.splitlines():
        if any(k in line for k in keep) and "_created" not in line:
            print("  " + line)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "verify":
        verify([int(p) for p in sys.argv[2:]] or [8101, 8102])
    else:
        print(__doc__)
        sys.exit(2)
