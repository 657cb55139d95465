"""A device (a GPU, or a machine's CPU cores) whose time its workers share: the sharing model.

Each effect is a parameter fitted from measurement (docs/time/device-sharing.md):

- **cores**: steps the device runs side by side at full speed (a GPU: 1; a CPU: its cores).
- **host_load** h: host work each stepping worker brings onto the device's cores, in cores' worth (on a CPU device:
  the engine loop that drives the worker, the API server streaming tokens, the client).
- **idle_load** b: what a worker without a step in flight keeps taking, in cores' worth (a vLLM CPU worker spins on
  its queue; a GPU worker takes nothing). With k of its n workers stepping the device carries a load of
  L = k (1 + h) + (n - k) b.
- **step_occupancy** u: how much of the device one step keeps busy once the load exceeds its cores. Each step then
  gets `cores / (cores + u (L - cores))` of its alone speed: u = 1 is strict time slicing (k steps on one GPU each at
  1/k, what processes without MPS get), u < 1 concurrent kernels whose throughput saturates with the combined batch
  (MPS-like: a small model leaves a GPU underused, so k small steps cost less than k x one).
- **pause_s**, **pause_fraction**: while the load exceeds the cores, the device also stops now and then: it pauses a
  fraction f of the time, for random pauses (exponential, mean p) between random runs (exponential, mean
  p (1 - f) / f), during which no step progresses. Both grow with the device's oversubscription
  o = (n (1 + h) - cores) / cores, as a scheduler's period grows with the tasks it runs: f = pause_fraction x o (at
  most 0.95), p = pause_s x o. Two servers on 2 cores stall less often and for less long than three. 0 (the
  default): never. The steady share sets the median; the pauses are the tail a shared CPU shows, where a request now
  and then waits out a stall of hundreds of milliseconds while most requests never meet one. A request reaching the
  device meets the alternation afresh (`admit`): a new request wakes host processes that must be scheduled.

`sharing_efficiency` (< 1: switching costs part of the device) multiplies the share while the device is shared. With
the defaults (h = b = 0, u = 1, efficiency 1, no pauses) a step progresses at `speed * min(1, cores / k)`: processor
sharing by time slices, as before these parameters existed (to the last bit).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    from sim.scenario import DeviceSpec

_RUNNING, _PAUSED = True, False


class Device:
    """Runs steps of `work_s` seconds (at speed 1.0) for the workers it hosts, shared by the model above.

    A step alone on the device takes `work_s / speed`. A device whose load can never exceed its cores
    (`num_workers * max(1 + host_load, idle_load) <= cores`) is never shared and takes the short path. `seed` seeds
    the pauses (only drawn when `pause_fraction` > 0).
    """

    def __init__(self, env: simpy.Environment, name: str, *, speed: float = 1.0, sharing_efficiency: float = 1.0,
                 num_workers: int = 1, cores: int = 1, host_load: float = 0.0, idle_load: float = 0.0,
                 step_occupancy: float = 1.0, pause_s: float = 0.0, pause_fraction: float = 0.0,
                 seed: int = 0) -> None:
        if speed <= 0:
            raise ValueError(f"device {name}: speed must be > 0, got {speed}")
        if not 0 < sharing_efficiency <= 1:
            raise ValueError(f"device {name}: sharing_efficiency must be in (0, 1], got {sharing_efficiency}")
        if cores < 1:
            raise ValueError(f"device {name}: cores must be >= 1, got {cores}")
        for field, value in (("host_load", host_load), ("idle_load", idle_load), ("pause_s", pause_s)):
            if not value >= 0:
                raise ValueError(f"device {name}: {field} must be >= 0, got {value}")
        if not 0 < step_occupancy <= 1:
            raise ValueError(f"device {name}: step_occupancy must be in (0, 1], got {step_occupancy}")
        if not 0 <= pause_fraction < 1:
            raise ValueError(f"device {name}: pause_fraction must be in [0, 1), got {pause_fraction}")
        self.env = env
        self.name = name
        self.speed = speed
        self.sharing_efficiency = sharing_efficiency
        self.num_workers = num_workers
        self.cores = cores
        self.host_load = host_load
        self.idle_load = idle_load
        self.step_occupancy = step_occupancy
        oversubscription = max(0.0, num_workers * (1.0 + host_load) - cores) / cores
        self._paused_fraction = min(0.95, pause_fraction * oversubscription)
        self._pause_mean_s = pause_s * oversubscription
        self._random = random.Random(seed) if pause_s > 0 and self._paused_fraction > 0 else None
        self._phase: bool | None = None  # pausing: running or paused, until _phase_end_s; None: not pausing
        self._phase_end_s = 0.0
        self.busy_s = 0.0
        self._jobs: dict[simpy.Event, float] = {}
        self._last_update_s = 0.0
        self._generation = 0

    @classmethod
    def of_spec(cls, env: simpy.Environment, spec: DeviceSpec, *, seed: int) -> Device:
        """The device a scenario's `cluster.deployments` entry describes (`seed`: its pauses')."""
        return cls(env, spec.name, speed=spec.speed, sharing_efficiency=spec.sharing_efficiency,
                   num_workers=spec.workers, cores=spec.cores, host_load=spec.host_load, idle_load=spec.idle_load,
                   step_occupancy=spec.step_occupancy, pause_s=spec.pause_s, pause_fraction=spec.pause_fraction,
                   seed=seed)

    @property
    def exclusive(self) -> bool:
        """True when every worker on the device always gets full speed (its load never exceeds the cores)."""
        return self.num_workers * max(1.0 + self.host_load, self.idle_load) <= self.cores

    def run(self, work_s: float) -> simpy.Event:
        """An event that fires when `work_s` seconds of full-speed work are done on this device."""
        if self.exclusive:
            self.busy_s += work_s / self.speed
            return self.env.timeout(work_s / self.speed)
        done = self.env.event()
        self._advance()
        self._jobs[done] = work_s
        self._reschedule()
        return done

    def admit(self) -> None:
        """A request reaches one of this device's workers. A pausing device's alternation starts afresh from its
        stationary state (paused with probability f, for a remaining exponential pause): a new request
        wakes host processes that must themselves be scheduled, so the stalls fall on admissions, not only on the
        steps already running (two servers at one request in flight: server TTFT p90 41-57 ms, p99 178-251 ms, where
        one server's are 13-35 and 15-53)."""
        if self._random is None:
            return
        self._advance()
        self._phase = None
        self._reschedule()

    def load(self, steps: int) -> float:
        """The device's load with `steps` of its workers stepping (cores' worth)."""
        return steps * (1.0 + self.host_load) + (self.num_workers - steps) * self.idle_load

    def share(self, steps: int) -> float:
        """Progress per second of each of `steps` steps in flight while the device runs (between its pauses)."""
        return self._share(self.load(steps))

    def _share(self, load: float) -> float:
        if load <= self.cores:
            return self.speed
        # = speed * efficiency / (1 + u * (L / cores - 1)), written so that u = 1, h = b = 0 gives
        # speed * e * cores / k to the last bit (the time-slicing model before host load and occupancy existed)
        shared = self.cores + self.step_occupancy * (load - self.cores)
        return self.speed * self.sharing_efficiency * self.cores / shared

    def _rate(self) -> float:
        load = self.load(len(self._jobs))
        if self._phase is _PAUSED and load > self.cores:
            return 0.0
        return self._share(load)

    def _advance(self) -> None:
        now = self.env.now
        elapsed = now - self._last_update_s
        if elapsed > 0 and self._jobs:
            self.busy_s += elapsed
            progress = elapsed * self._rate()
            if progress:
                jobs = self._jobs
                for job in jobs:
                    jobs[job] -= progress
        self._last_update_s = now

    def _pause(self) -> None:
        """The pausing device's phase now. The alternation runs on in time whether or not steps are in flight
        (stationary at its first use, then phase after phase), so that the steps of one request meet the pauses of
        one timeline; a pause stops only steps of a shared device (`_rate`)."""
        if self._random is None:
            return
        now = self.env.now
        f = self._paused_fraction
        if self._phase is None:  # the stationary state at `now`, its remaining length drawn below
            self._phase = _PAUSED if self._random.random() < f else _RUNNING
            self._phase_end_s = now
        elif now < self._phase_end_s - 1e-12:
            return
        else:
            self._phase = not self._phase
        pause = self._pause_mean_s
        while True:  # phase after phase from the last one's end, up to the one under way at `now`
            mean = pause if self._phase is _PAUSED else pause * (1.0 - f) / f
            self._phase_end_s += self._random.expovariate(1.0 / mean)
            if self._phase_end_s > now:
                return
            self._phase = not self._phase

    def _reschedule(self) -> None:
        self._generation += 1
        self._pause()
        if not self._jobs:
            return
        generation = self._generation
        rate = self._rate()
        wait_s = max(min(self._jobs.values()), 0.0) / rate if rate else float("inf")
        if self._random is not None:
            wait_s = min(wait_s, max(self._phase_end_s - self.env.now, 0.0))
        self.env.timeout(wait_s).callbacks.append(lambda _event: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded by a later arrival or completion
        self._advance()
        # NOTE: float subtraction leaves crumbs; a job within a nanosecond of done is done.
        finished = [job for job, left in self._jobs.items() if left <= 1e-9]
        for job in finished:
            del self._jobs[job]
            job.succeed()
        self._reschedule()
