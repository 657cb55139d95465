"""Smoke test for SGLang served on CPU (cpu-serving.md): streamed /v1/completions, prints cached_tokens.

    python3 benchmarks/sglang-oracle/cpu_smoke.py [PORT]      # standard library only; default port 30001

Sends a 100-token prompt twice, then the same 64-token prefix with a different tail, as text ("t10 t11 ...",
one token per word with make_tiny_tokenizer.py) and once as a list of token ids; checks usage.prompt_tokens and
usage.prompt_tokens_details.cached_tokens in the final streamed chunk.
"""
import http.client
import json
import sys
import time

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 30001


def stream_completion(prompt, max_tokens=4):
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read()[:500])
    usage, text, ttft = None, "", None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for c in chunk.get("choices") or []:
            if c.get("text") and ttft is None:
                ttft = time.perf_counter() - t0
            text += c.get("text") or ""
        if chunk.get("usage"):
            usage = chunk["usage"]
    conn.close()
    return usage, text, ttft, time.perf_counter() - t0


def main():
    a = " ".join(f"t{i}" for i in range(10, 110))                       # 100 tokens
    b = " ".join(f"t{i}" for i in range(10, 74)) + " " + " ".join(f"t{i}" for i in range(500, 536))  # shares 64
    ids = list(range(10, 110))
    for name, p in [("A (cold)", a), ("A (repeat)", a), ("B (64-token shared prefix)", b), ("A as token ids", ids)]:
        usage, text, ttft, total = stream_completion(p)
        details = usage.get("prompt_tokens_details") or {}
        print(f"{name:28s} prompt_tokens={usage['prompt_tokens']} cached_tokens={details.get('cached_tokens')} "
              f"completion_tokens={usage['completion_tokens']} ttft={ttft * 1000:.0f} ms total={total * 1000:.0f} ms "
              f"text={text!r}")


if __name__ == "__main__":
    main()
