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
  p (1 - f) / f), during which no step progresses. Both grow with the device's oversubscription *now*,
  o(L) = max(0, L - cores) / cores at its current load L, as a scheduler's period grows with the tasks it runs:
  f = pause_fraction x o (at most 0.95), p = pause_s x o. Two servers with one request in flight (one worker
  stepping, the other spinning idle) stall less often and for less long than with both stepping. 0 (the default):
  never. The steady share sets the median; the pauses are the tail a shared CPU shows, where a request now and then
  waits out a stall of hundreds of milliseconds while most requests never meet one. A request reaching the device
  meets the alternation afresh (`admit`): a new request wakes host processes that must be scheduled.

  The alternation is a two-state Markov chain whose switching rates follow the load (a run ends at rate
  f / (p (1 - f)), a pause at 1 / p, both of the load of the moment; at o = 0 runs never end and a pause ends at
  once, harmlessly, since an unshared device is never held by one). It is followed exactly with one draw per phase:
  each phase starts with an Exp(1) budget of hazard and ends when the hazard accumulated at the rates of the loads it
  meets has spent it. At a constant load that is the exponential phase of mean p or p (1 - f) / f; a change of load
  mid-phase changes how fast the rest is spent (memorylessness: the same as redrawing the rest at the new rates).

- **handoff_s**: while the load exceeds the cores, each step starts with a wait of `handoff_s` x o (at the load with
  its worker stepping) in which it makes no progress: a step hands work between processes (the engine loop to its
  worker and back, vLLM's shared-memory queues), and on oversubscribed cores each hand-over waits for a time slice.
  The wait is per step, so it costs a decode step (small work) as much as a prefill (large): shared servers decode
  slower, relative to their prefill, than a share of the cores alone gives. While it waits the worker counts as idle.

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
                 handoff_s: float = 0.0, seed: int = 0) -> None:
        if speed <= 0:
            raise ValueError(f"device {name}: speed must be > 0, got {speed}")
        if not 0 < sharing_efficiency <= 1:
            raise ValueError(f"device {name}: sharing_efficiency must be in (0, 1], got {sharing_efficiency}")
        if cores < 1:
            raise ValueError(f"device {name}: cores must be >= 1, got {cores}")
        for field, value in (("host_load", host_load), ("idle_load", idle_load), ("pause_s", pause_s),
                             ("handoff_s", handoff_s)):
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
        self.pause_s = pause_s
        self.pause_fraction = pause_fraction
        self.handoff_s = handoff_s
        self._random = random.Random(seed) if pause_s > 0 and pause_fraction > 0 and not self.exclusive else None
        # A pausing device's phase: running or paused (None: none drawn yet, or drawn afresh at the next reschedule).
        # Since _phase_mark_s it spends its hazard budget _hazard_left at _hazard_rate per second (the rate of the
        # load since then); it ends at _phase_end_s = mark + left / rate (inf at rate 0).
        self._phase: bool | None = None
        self._phase_mark_s = 0.0
        self._hazard_left = 0.0
        self._hazard_rate = 0.0
        self._phase_end_s = 0.0
        self.busy_s = 0.0
        self._jobs: dict[simpy.Event, float] = {}
        self._job_workers: dict[simpy.Event, int | None] = {}  # each step's worker (None: not named)
        self._last_update_s = 0.0
        self._generation = 0

    @classmethod
    def of_spec(cls, env: simpy.Environment, spec: DeviceSpec, *, seed: int) -> Device:
        """The device a scenario's `cluster.deployments` entry describes (`seed`: its pauses')."""
        return cls(env, spec.name, speed=spec.speed, sharing_efficiency=spec.sharing_efficiency,
                   num_workers=spec.workers, cores=spec.cores, host_load=spec.host_load, idle_load=spec.idle_load,
                   step_occupancy=spec.step_occupancy, pause_s=spec.pause_s, pause_fraction=spec.pause_fraction,
                   handoff_s=spec.handoff_s, seed=seed)

    @property
    def exclusive(self) -> bool:
        """True when every worker on the device always gets full speed (its load never exceeds the cores)."""
        return self.num_workers * max(1.0 + self.host_load, self.idle_load) <= self.cores

    def run(self, work_s: float, worker: int | None = None) -> simpy.Event:
        """An event that fires when `work_s` seconds of full-speed work are done on this device for `worker` (its
        index: `admit` and the hand-over count it as stepping; None: a step of no worker in particular)."""
        if self.exclusive:
            self.busy_s += work_s / self.speed
            return self.env.timeout(work_s / self.speed)
        done = self.env.event()
        self._advance()
        wait_s = self.handoff_s * self._oversubscription(self._load_with(worker)) if self.handoff_s else 0.0
        if wait_s > 0:  # waiting for its turn, the worker counts as idle
            self.env.timeout(wait_s).callbacks.append(lambda _event: self._start(done, work_s, worker))
        else:
            self._start(done, work_s, worker, advanced=True)
        return done

    def _start(self, done: simpy.Event, work_s: float, worker: int | None, advanced: bool = False) -> None:
        if not advanced:
            self._advance()
        self._jobs[done] = work_s
        self._job_workers[done] = worker
        self._reschedule()

    def _load_with(self, worker: int | None) -> float:
        """The device's load now with `worker` counted as stepping (it is about to)."""
        steps = len(self._jobs)
        if worker is None:  # not named: one more step, unless all are stepping
            return self.load(min(steps + 1, self.num_workers))
        return self.load(steps if worker in self._job_workers.values() else steps + 1)

    def admit(self, worker: int | None = None) -> None:
        """A request reaches one of this device's workers. A pausing device's alternation starts afresh from its
        stationary state (paused with probability f, for a remaining exponential pause): a new request
        wakes host processes that must themselves be scheduled, so the stalls fall on admissions, not only on the
        steps already running (two servers at one request in flight: server TTFT p90 41-57 ms, p99 178-251 ms, where
        one server's are 13-35 and 15-53). The fresh phase is drawn at the load with the admitted request's worker
        stepping."""
        if self._random is None:
            return
        self._advance()
        self._phase = None
        # the admitted request's worker is counted as stepping (it is about to)
        self._reschedule(self._load_with(worker))

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
        self._follow_phases()

    def _oversubscription(self, load: float) -> float:
        return max(0.0, load - self.cores) / self.cores

    def _pause_phases(self, load: float) -> tuple[float, float]:
        """(f, p) at `load`: the fraction of the time paused and the mean pause (s), 0 and 0 when not oversubscribed."""
        oversubscription = self._oversubscription(load)
        return min(0.95, self.pause_fraction * oversubscription), self.pause_s * oversubscription

    def _switch_rate(self, load: float) -> float:
        """How fast the phase under way ends at `load` (per second): a run's f / (p (1 - f)), a pause's 1 / p."""
        f, p = self._pause_phases(load)
        if self._phase is _PAUSED:
            return 1.0 / p if p else float("inf")
        return f / (p * (1.0 - f)) if f else 0.0

    def _follow_phases(self) -> None:
        """Bring the pausing device's phases up to now at the load they ran under (before a change of load): the
        phases that ended by now, each drawn at this load, then the hazard the one under way has spent since its mark.
        The alternation runs on in time whether or not steps are in flight, so that the steps of one request meet the
        pauses of one timeline; a pause stops only steps of a shared device (`_rate`)."""
        if self._random is None or self._phase is None:
            return
        now = self.env.now
        while self._phase_end_s <= now + 1e-12:  # phase after phase from the last one's end
            self._phase_mark_s = self._phase_end_s
            self._phase = not self._phase
            self._start_phase(self.load(len(self._jobs)))
        if self._hazard_rate:
            self._hazard_left -= (now - self._phase_mark_s) * self._hazard_rate
        self._phase_mark_s = now

    def _start_phase(self, load: float) -> None:
        self._hazard_left = self._random.expovariate(1.0)
        self._time_phase(load)

    def _time_phase(self, load: float) -> None:
        """The phase under way spends the rest of its budget from its mark at `load`'s rate."""
        rate = self._switch_rate(load)
        if rate == float("inf"):  # a pause at no oversubscription: over at once, a run starts
            self._phase = _RUNNING
            self._start_phase(load)
            return
        self._hazard_rate = rate
        self._phase_end_s = self._phase_mark_s + self._hazard_left / rate if rate else float("inf")

    def _pause(self, load: float) -> None:
        """The pausing device's phase from now on at `load` (after a change of load, or afresh after `admit`)."""
        if self._random is None:
            return
        self._phase_mark_s = self.env.now
        if self._phase is None:  # afresh: the stationary state at `load`, with a budget of its own
            f, _ = self._pause_phases(load)
            self._phase = _PAUSED if self._random.random() < f else _RUNNING
            self._start_phase(load)
        else:
            self._time_phase(load)

    def _reschedule(self, pause_load: float | None = None) -> None:
        """Wake at the next completion or phase end. `pause_load`: the load the phase is timed at (default: the
        current one; `admit` counts its worker as stepping)."""
        self._generation += 1
        self._pause(self.load(len(self._jobs)) if pause_load is None else pause_load)
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
            del self._jobs[job], self._job_workers[job]
            job.succeed()
        self._reschedule()
