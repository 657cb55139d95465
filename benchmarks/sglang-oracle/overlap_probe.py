"""Can SGLang's overlap scheduling be seen from a client? Two requests of one new prefix, the second sent a few ms
after the first, on a real server (run with kvsim's venv: `.venv/bin/python benchmarks/sglang-oracle/overlap_probe.py
[URL] [TRIALS]`; the server must be idle, e.g. one of `serve.sh`'s).

Under overlap scheduling (SGLang's default), batch k+1 is formed before batch k's result is processed, and a prompt
enters the radix tree when its prefill batch is processed: a request that arrives while the first one's prefill
batch runs is admitted into the next batch without the prefix (0 cached tokens). With --disable-overlap-schedule
each batch is processed before the next is formed, so the same request hits the prefix (512 tokens) unless it
arrived before the first one's batch was formed. The probe prints, per delay, how many second requests hit.
Each trial uses a fresh prefix (no /flush_cache needed, nothing else must run on the server).
"""

from __future__ import annotations

import random
import sys
import threading
import time

from sim.servers.openai_client import Endpoint, model_name, sglang_server_info, stream_completion

PREFIX_TOKENS, TAIL_TOKENS, OUTPUT_TOKENS = 512, 100, 8
DELAYS_MS = (0, 2, 5, 10, 20, 40, 80)


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(3, 8191) for _ in range(n)]


def trial(ep: Endpoint, model: str, rng: random.Random, delay_s: float) -> tuple[int, int, float]:
    """(first's cached tokens, second's cached tokens, first's TTFT in ms) for two requests sharing a new prefix."""
    prefix = ids(rng, PREFIX_TOKENS)
    prompts = [prefix + ids(rng, TAIL_TOKENS), prefix + ids(rng, TAIL_TOKENS)]
    out: list = [None, None]

    def send(i: int) -> None:
        out[i] = stream_completion(ep, model=model, prompt_ids=prompts[i], max_tokens=OUTPUT_TOKENS)

    first = threading.Thread(target=send, args=(0,))
    first.start()
    time.sleep(delay_s)
    send(1)
    first.join()
    return out[0].cached_tokens, out[1].cached_tokens, out[0].ttft_s * 1000


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:30001"
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    ep = Endpoint.parse(url)
    info = sglang_server_info(ep)
    if info is None:
        sys.exit(f"{url}: not an SGLang server")
    model = model_name(ep)
    rng = random.Random(f"overlap-probe:{url}")
    print(f"{url}: SGLang {info['version']}, disable_overlap_schedule={info['disable_overlap_schedule']}, "
          f"{trials} trials per delay")
    for delay_ms in DELAYS_MS:
        results = [trial(ep, model, rng, delay_ms / 1000) for _ in range(trials)]
        hits = sum(1 for _, second, _ in results if second >= PREFIX_TOKENS)
        ttft = sorted(t for *_, t in results)[len(results) // 2]
        print(f"  second sent {delay_ms:3d} ms after the first: {hits:2d}/{trials} hit the prefix "
              f"(first's TTFT p50 {ttft:.0f} ms; second's cached tokens {sorted(s for _, s, _ in results)})")


if __name__ == "__main__":
    main()
