"""Speed work must not change a single decision: every router's replay of the conversation trace's first 400
requests is pinned, request by request, to what it gave before the routers' indexes were made faster.

Four workers of 300,000 KV tokens (blocks of 64) hold about thirty of these 6-12k-token prompts each (a quarter
of what each is sent), so blocks are evicted and the routers' approximate states drift from the caches: the paths that
evict and expire are run too.
Each case is pinned by a digest of its records' decision and timing fields (fields only: a column added to
RequestRecord later leaves the digest as it was) and by its prefix reuse.

Regenerate (only when a change of results is intended, and say so in the commit):
    python -m tests.routers.test_router_results_pinned
"""

from __future__ import annotations

import hashlib
import json

import pytest

from sim.replay import replay
from sim.scenario import load_scenario
from sim.workloads.traces import read_mooncake
from tests.support.paths import FIXTURES, SCENARIOS, TRACES

PINNED = FIXTURES / "pinned" / "router_results.json"
CONVERSATION = TRACES / "conversation_head400.jsonl"
FIELDS = ("request_id", "worker", "cached_tokens", "num_preemptions", "sent_s", "admitted_s", "first_token_s",
          "finished_s", "available_tokens", "captured_tokens", "believed_tokens", "held_tokens")
CASES = [("vllm", r) for r in (
    "round-robin", "kv-aware", "kv-aware:state=approximate", "kv-aware:state=events", "preble", "llm-d",
    "llm-d:prefix_cache=precise", "aibrix-prefix-cache", "sglang-cache-aware", "kvsim", "vllm-router-loadaware")]
CASES += [("sglang", r) for r in ("round-robin", "kv-aware", "sglang-cache-aware")]


def _options(text: str) -> dict:
    options = dict(kv.split("=", 1) for kv in text.split(",")) if text else {}
    return {k: (float(v) if v.replace(".", "", 1).isdigit() else v) for k, v in options.items()}


def replay_digest(engine: str, router: str) -> dict:
    scenario, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    scenario = scenario.with_engine(engine)
    name, _, text = router.partition(":")
    scenario = scenario.with_overrides(**{"cluster.workers": 4, **scenario.engine.capacity_overrides(tokens=300_000),
                                          "router.name": name, "router.options": _options(text)})
    result = replay(scenario, read_mooncake(CONVERSATION, block_size=64), keep_records=True)
    rows = [tuple(getattr(r, f) for f in FIELDS) for r in sorted(result.records, key=lambda r: r.request_id)]
    return {"requests": len(rows), "prefix_reuse": repr(result.stats.prefix_reuse),
            "records_sha256": hashlib.sha256(repr(rows).encode()).hexdigest()}


@pytest.mark.parametrize("engine,router", CASES, ids=[f"{e}-{r}" for e, r in CASES])
def test_replay_is_what_it_was(engine, router):
    pinned = json.loads(PINNED.read_text())[f"{engine} {router}"]
    assert replay_digest(engine, router) == pinned


if __name__ == "__main__":
    PINNED.write_text(json.dumps({f"{e} {r}": replay_digest(e, r) for e, r in CASES}, indent=1) + "\n")
    print(f"wrote {PINNED}")
