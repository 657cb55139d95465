"""Engine metrics as a router that polls them sees them: a snapshot every `interval_s`, stale in between."""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from sim.engines.interface import EngineLoad


class MetricsScraper:
    """Snapshots every worker's `EngineLoad` at times 0, interval, 2 x interval, ... (Prometheus-style polling;
    AIBrix's gateway 50 ms, llm-d's EPP 50 ms by default).

    A SimPy process that parks once a snapshot found the cluster idle (nothing in flight, so every engine reports
    zero load and later ticks would read the same) until a dispatch wakes it, then resumes on the next tick; so it
    never keeps a finished simulation alive. `loads` is the last snapshot.
    """

    def __init__(self, env: simpy.Environment, interval_s: float, read: Callable[[], list[EngineLoad]],
                 busy: Callable[[], bool]) -> None:
        if interval_s <= 0:
            raise ValueError(f"scrape_interval_s must be > 0, got {interval_s}")
        self.env = env
        self.interval_s = interval_s
        self._read = read
        self._busy = busy
        self.loads = read()
        self.num_scrapes = 1
        self._snapshot_idle = not busy()
        self._parked: simpy.Event | None = None
        env.process(self._loop())

    def wake(self) -> None:
        """Called at every dispatch: resumes a parked scraper."""
        parked = self._parked
        if parked is not None and not parked.triggered:
            parked.succeed()

    def _loop(self):
        env, interval = self.env, self.interval_s
        while True:
            if self._snapshot_idle and not self._busy():
                self._parked = env.event()
                yield self._parked
                self._parked = None
            next_tick = (math.floor(env.now / interval + 1e-9) + 1) * interval
            yield env.timeout(next_tick - env.now)
            self.loads = self._read()
            self.num_scrapes += 1
            self._snapshot_idle = not self._busy()
