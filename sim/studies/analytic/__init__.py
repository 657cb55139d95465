"""Closed-form and numeric models of the per-worker prefix-cache hit rate, for screening before simulating.

Every function is pure (no I/O, no randomness) and states its assumptions. From coarse to fine:

* `formula_hit_rate`: the rule of thumb min(1, C/N) with C = `capacity_requests(...)` prompts per worker.
* `first_visit_misses`: the misses that remain when every prefix fits and only first visits miss.
* `che_hit_rate`: the classic Che approximation for an LRU cache of equal-size objects.
* `block_lru_hit_rates`: one vLLM worker as an LRU over *blocks*, in which a finished request pushes its own
  blocks and then its prefix's blocks (root last) to the most recently used end of the free queue. `method="che"`
  is a Che-style mean-field (fast, any size); `method="exact"` is exact under the independent reference model
  (IRM) and is the one to trust when only a handful of prefixes fit (where mean fields are crude).
* `finite_run_hit_rates`: the same block model for a *finite* run that starts from one-at-a-time warm-ups, as the
  reference experiment does (its 200 requests leave a cold-start transient of several points).
* Routing: `random_routing_hit_rates` (random routing thins an IRM stream into IRM streams with the same
  popularity, so the per-worker model applies unchanged and the hit rate does not depend on the worker count),
  `prefix_routing_bound` and `prefix_routing_hit_rates` (each prefix on one worker).

Units: time is counted in requests *at one worker* (not seconds); capacities in blocks unless the name says so.
"""

from sim.studies.analytic.block_lru import (
    BlockLruHitRates, Method, block_lru_hit_rates, finite_run_hit_rates, in_flight_blocks_estimate,
    shared_prefix_blocks,
)
from sim.studies.analytic.che import che_characteristic_time, che_hit_rate, zipf_popularity
from sim.studies.analytic.routing import (
    RoutedHitRates, prefix_routing_bound, prefix_routing_hit_rates, random_routing_hit_rates,
)
from sim.studies.analytic.rules import capacity_requests, first_visit_misses, formula_hit_rate

__all__ = [
    "BlockLruHitRates", "Method", "RoutedHitRates", "block_lru_hit_rates", "capacity_requests",
    "che_characteristic_time", "che_hit_rate", "finite_run_hit_rates", "first_visit_misses", "formula_hit_rate",
    "in_flight_blocks_estimate", "prefix_routing_bound", "prefix_routing_hit_rates", "random_routing_hit_rates",
    "shared_prefix_blocks", "zipf_popularity",
]
