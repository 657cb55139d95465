"""A small OpenAI-compatible server for testing `kvsim measure` over real HTTP (127.0.0.1, a free port).

It streams `max_tokens` chunks as server-sent events, answers `cached_tokens` from a naive prefix cache of
everything it has seen (no eviction), and serves /v1/models and /metrics. As vLLM (`engine="vllm"`, the default):
whole-block hits, /version, vLLM's metric names with `vllm:cache_config_info`, /reset_prefix_cache and its dev-mode
/server_info. As SGLang (`engine="sglang"`): token-level hits of at most prompt length - 1, SGLang's /server_info
(and /get_server_info), POST /flush_cache (HTTP 400 when `flush_refuses`), SGLang's metric names, or no /metrics
at all with `metrics=False`. Faults can be injected: the first `fail_first` completions answer HTTP 500,
`always_fail` answers 500 forever, `delay_first_s` sleeps before the first token of the first completion.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SGLANG_SERVER_INFO = {
    "version": "0.5.23", "page_size": 1, "max_total_num_tokens": 2496, "max_total_tokens": 2496,
    "context_length": None, "chunked_prefill_size": 4096, "max_prefill_tokens": 16384, "max_running_requests": None,
    "schedule_policy": "fcfs", "radix_eviction_policy": "lru", "disable_overlap_schedule": False,
    "enable_cache_report": True, "internal_states": [{"effective_max_running_requests_per_dp": 1248}],
}
"""What SGLang 0.5.23's /server_info answers for `--max-total-tokens 2496` on the tiny model (the fields kvsim reads)."""


class StubState:
    def __init__(self, *, block_size: int = 32, num_gpu_blocks: int = 81, fail_first: int = 0,
                 always_fail: bool = False, delay_first_s: float = 0.0, engine: str = "vllm",
                 metrics: bool = True, flush_refuses: bool = False, server_info: dict | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.flush_refuses = flush_refuses
        self.server_info = {**SGLANG_SERVER_INFO, **(server_info or {})}
        self.prompts: list[tuple[int, ...]] = []
        self.flushes = 0
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.fail_first = fail_first
        self.always_fail = always_fail
        self.delay_first_s = delay_first_s
        self.lock = threading.Lock()
        self.blocks: set[tuple[int, ...]] = set()
        self.queries = self.hits = 0
        self.completions = 0
        self.attempts = 0


class StubServer:
    def __init__(self, **kwargs) -> None:
        self.state = StubState(**kwargs)
        state = self.state

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if state.engine == "sglang":
                    self._get_sglang()
                    return
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "stub-model"}]}))
                elif self.path == "/version":
                    self._send(200, json.dumps({"version": "0.0.0-stub"}))
                elif self.path.startswith("/server_info"):
                    self._send(200, json.dumps({"vllm_config": {
                        "scheduler_config": {"max_num_batched_tokens": 2048, "max_num_seqs": 8},
                        "model_config": {"max_model_len": 2560}}}))
                elif self.path == "/metrics":
                    with state.lock:
                        text = (
                            "# HELP vllm:prefix_cache_queries_total x\n"
                            f'vllm:prefix_cache_queries_total{{engine="0"}} {float(state.queries)}\n'
                            f'vllm:prefix_cache_hits_total{{engine="0"}} {float(state.hits)}\n'
                            f'vllm:num_preemptions_total{{engine="0"}} 0.0\n'
                            f'vllm:prompt_tokens_total{{engine="0"}} {float(state.queries)}\n'
                            f'vllm:cache_config_info{{block_size="{state.block_size}",engine="0",'
                            f'num_gpu_blocks="{state.num_gpu_blocks}"}} 1.0\n'
                        )
                    self._send(200, text, "text/plain")
                else:
                    self._send(404, '{"error": "not found"}')

            def _get_sglang(self):
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "stub-model", "max_model_len": 8192}]}))
                elif self.path in ("/server_info", "/get_server_info"):
                    self._send(200, json.dumps(state.server_info))
                elif self.path == "/metrics" and state.metrics:
                    with state.lock:
                        text = (
                            "# HELP sglang:prompt_tokens_total x\n"
                            f'sglang:prompt_tokens_total{{is_streaming="true",model_name="m"}} {float(state.queries)}\n'
                            f'sglang:num_requests_total{{is_streaming="true",model_name="m"}} {float(state.completions)}\n'
                            f'sglang:num_retracted_requests_total{{model_name="m"}} 0.0\n'
                        )
                        if state.hits:  # a labelled counter has no sample before its first increment
                            text += f'sglang:cached_tokens_total{{cache_source="device",model_name="m"}} {float(state.hits)}\n'
                    self._send(200, text, "text/plain")
                else:
                    self._send(404, '{"detail": "Not Found"}')

            def _cached_tokens(self, ids: list[int]) -> int:
                """Hit tokens of `ids`, remembering it (caller holds the lock)."""
                B = state.block_size
                cached = 0
                if state.engine == "sglang":
                    for seen in state.prompts:
                        n = 0
                        while n < min(len(seen), len(ids) - 1) and seen[n] == ids[n]:
                            n += 1
                        cached = max(cached, n)
                    state.prompts.append(tuple(ids))
                    return cached
                for i in range((len(ids) - 1) // B):
                    if tuple(ids[: (i + 1) * B]) not in state.blocks:
                        break
                    cached = (i + 1) * B
                for i in range(len(ids) // B):
                    state.blocks.add(tuple(ids[: (i + 1) * B]))
                return cached

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if state.engine == "sglang" and self.path == "/flush_cache":
                    if state.flush_refuses:
                        self._send(400, "Flush cache failed.\n", "text/plain")
                        return
                    with state.lock:
                        state.prompts.clear()
                        state.flushes += 1
                    self._send(200, "Cache flushed.\n", "text/plain")
                    return
                if self.path == "/reset_prefix_cache" and state.engine == "vllm":
                    with state.lock:
                        state.blocks.clear()
                    self._send(200, '{"success":true}')
                    return
                if self.path != "/v1/completions":
                    self._send(404, '{"error": "not found"}')
                    return
                with state.lock:
                    state.attempts += 1
                    fail = state.always_fail or state.attempts <= state.fail_first
                    first = state.completions == 0
                if fail:
                    self._send(500, '{"error": "injected failure"}')
                    return
                req = json.loads(body)
                ids, n = req["prompt"], req["max_tokens"]
                with state.lock:
                    cached = self._cached_tokens(ids)
                    state.queries += len(ids)
                    state.hits += cached
                    state.completions += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                if first and state.delay_first_s:
                    time.sleep(state.delay_first_s)
                for _ in range(n):
                    chunk = {"choices": [{"index": 0, "text": "", "token_ids": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                usage = {"choices": [], "usage": {"prompt_tokens": len(ids), "completion_tokens": n,
                                                  "prompt_tokens_details": {"cached_tokens": cached}}}
                if state.engine == "vllm":  # vLLM's --enable-per-request-metrics; SGLang sends no timing
                    usage["metrics"] = {"time_to_first_token_ms": 1.0, "queue_time_ms": 0.1, "generation_time_ms": 2.5}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
