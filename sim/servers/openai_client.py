"""A small client for OpenAI-compatible servers (vLLM, SGLang): streaming completions with token-id prompts,
Prometheus metrics, prefix-cache reset, the servers' own description of their setup. Standard library only; one new
connection per request, as a client behind a Kubernetes Service opens one (so every request is routed
independently).

Both engines take `prompt` as a list of token ids on /v1/completions and put the prefix-cache hit in the final
usage chunk (`usage.prompt_tokens_details.cached_tokens`): vLLM with --enable-prompt-tokens-details, SGLang with
--enable-cache-report. SGLang also honours `min_tokens` and `ignore_eos`, so both generate exactly `max_tokens`.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


class EndpointError(RuntimeError):
    """A request that failed for good (after retries); the message names the endpoint and the cause."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {url!r}: expected http://HOST:PORT")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"endpoint {url!r}: bad port") from None
        return cls(url, parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout_s)


@dataclass(frozen=True, slots=True)
class Completion:
    """One streamed completion, timed on the client from the start of the attempt that succeeded."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float
    e2e_s: float
    server_ttft_ms: float | None
    server_queue_ms: float | None
    server_generation_ms: float | None
    """vLLM's per-request metrics: its last output token's time less its first's, as its front end (the API server)
    processed them; with the client's e2e it tells decode on the server from delivery to the client."""
    attempts: int


class _Retryable(Exception):
    pass


def _attempt(endpoint: Endpoint, body: bytes, timeout_s: float) -> Completion:
    t0 = time.perf_counter()
    conn = endpoint.connect(timeout_s)
    try:
        try:
            conn.request("POST", f"{endpoint.base_path}/v1/completions", body=body,
                         headers={"Content-Type": "application/json", "Connection": "close"})
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            raise _Retryable(f"{type(err).__name__}: {err}") from None
        if resp.status != 200:
            detail = resp.read(300).decode(errors="replace").strip()
            msg = f"HTTP {resp.status}: {detail}"
            if resp.status >= 500 or resp.status == 429:
                raise _Retryable(msg)
            raise EndpointError(f"{endpoint.url}: {msg}")
        ttft_s = None
        usage = metrics = None
        n_out = 0
        try:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if event.get("choices"):
                    n_out += 1
                    if ttft_s is None:
                        ttft_s = time.perf_counter() - t0
                if event.get("usage"):
                    usage = event["usage"]
                    metrics = event.get("metrics")
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise _Retryable(f"stream broke after {n_out} chunks: {type(err).__name__}: {err}") from None
        e2e_s = time.perf_counter() - t0
    finally:
        conn.close()
    if ttft_s is None or usage is None:
        raise _Retryable(f"stream ended without {'tokens' if ttft_s is None else 'a usage chunk'}")
    details = usage.get("prompt_tokens_details") or {}
    metrics = metrics or {}
    return Completion(
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens", n_out)),
        ttft_s=ttft_s, e2e_s=e2e_s,
        server_ttft_ms=metrics.get("time_to_first_token_ms"), server_queue_ms=metrics.get("queue_time_ms"),
        server_generation_ms=metrics.get("generation_time_ms"), attempts=1,
    )


def stream_completion(endpoint: Endpoint, *, model: str, prompt_ids: list[int], max_tokens: int,
                      timeout_s: float = 120.0, retries: int = 2, backoff_s: float = 0.5) -> Completion:
    """POST /v1/completions (stream, exactly `max_tokens` tokens, EOS ignored, usage with cached tokens).

    Retries connection failures, timeouts, broken streams, HTTP 5xx and 429 up to `retries` times with exponential
    backoff; other HTTP errors fail at once. Raises EndpointError with the last cause.
    """
    body = json.dumps({
        "model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
        "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }).encode()
    last = ""
    for attempt in range(retries + 1):
        try:
            result = _attempt(endpoint, body, timeout_s)
            return Completion(**{**{f: getattr(result, f) for f in result.__slots__}, "attempts": attempt + 1})
        except (_Retryable, socket.timeout) as err:
            last = str(err) or type(err).__name__
            if attempt < retries:
                time.sleep(backoff_s * 2 ** attempt)
    raise EndpointError(f"{endpoint.url}: failed after {retries + 1} attempts: {last}")


def get(endpoint: Endpoint, path: str, *, method: str = "GET", timeout_s: float = 10.0) -> tuple[int, str]:
    conn = endpoint.connect(timeout_s)
    try:
        conn.request(method, f"{endpoint.base_path}{path}", headers={"Connection": "close"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as err:
        raise EndpointError(f"{endpoint.url}{path}: {type(err).__name__}: {err}") from None
    finally:
        conn.close()


def served_model(endpoint: Endpoint) -> dict:
    """The first entry of GET /v1/models (`id`, and on vLLM and SGLang `max_model_len`)."""
    status, text = get(endpoint, "/v1/models")
    if status != 200:
        raise EndpointError(f"{endpoint.url}/v1/models: HTTP {status}")
    try:
        entry = json.loads(text)["data"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        entry = None
    if not isinstance(entry, dict) or "id" not in entry:
        raise EndpointError(f"{endpoint.url}/v1/models: no model in the answer")
    return entry


def model_name(endpoint: Endpoint) -> str:
    return served_model(endpoint)["id"]


def parse_prometheus(text: str) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """Sum each metric's samples over their labels; also return the labels of `*_info` metrics."""
    totals: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue
        if name.endswith("_info") and labels:
            pairs = {}
            for item in labels.rstrip("}").split('",'):
                k, _, v = item.partition("=")
                pairs[k.strip()] = v.strip().strip('"')
            info[name] = pairs
    return totals, info


def scrape_metrics(endpoint: Endpoint) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """GET /metrics, parsed; EndpointError if the server does not serve it."""
    status, text = get(endpoint, "/metrics")
    if status != 200:
        raise EndpointError(f"{endpoint.url}/metrics: HTTP {status}")
    return parse_prometheus(text)


def fetch_metrics(endpoint: Endpoint) -> tuple[dict[str, float], dict[str, dict[str, str]]] | None:
    """GET /metrics, parsed, or None when the server answers it with an HTTP error (SGLang serves it only with
    --enable-metrics); EndpointError when the server cannot be reached."""
    status, text = get(endpoint, "/metrics")
    return parse_prometheus(text) if status == 200 else None


def reset_prefix_cache(endpoint: Endpoint) -> bool:
    """POST /reset_prefix_cache (vLLM with VLLM_SERVER_DEV_MODE=1); False if the server refused or lacks it."""
    status, text = get(endpoint, "/reset_prefix_cache", method="POST")
    return status == 200 and '"success":false' not in text.replace(" ", "")


def flush_cache(endpoint: Endpoint) -> bool:
    """POST /flush_cache (SGLang): empties the radix cache; False if refused. SGLang refuses (HTTP 400, "Flush cache
    failed.") while any request is running or waiting, and does not wait for them."""
    status, _ = get(endpoint, "/flush_cache", method="POST")
    return status == 200


def sglang_server_info(endpoint: Endpoint) -> dict | None:
    """SGLang's resolved server arguments plus its scheduler's figures (GET /server_info, or the deprecated
    /get_server_info of older releases), or None where the server is not SGLang. The answer is recognised by
    `max_total_num_tokens`, the KV pool size in tokens, which only SGLang's carries."""
    for path in ("/server_info", "/get_server_info"):
        try:
            status, text = get(endpoint, path)
            info = json.loads(text) if status == 200 else None
        except ValueError:
            info = None
        if isinstance(info, dict) and "max_total_num_tokens" in info:
            return info
    return None


def server_config(endpoint: Endpoint) -> dict | None:
    """vLLM's effective config (GET /server_info, dev mode), or None where the server does not offer it."""
    try:
        status, text = get(endpoint, "/server_info?config_format=json")
        return json.loads(text) if status == 200 else None
    except (EndpointError, ValueError):
        return None
