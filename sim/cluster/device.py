"""A device (a GPU, or a machine's CPU cores) whose time its workers share: the sharing model.

Three effects, each a parameter fitted from measurement (docs/time/device-sharing.md):

- **cores**: steps the device runs side by side at full speed (a GPU: 1; a CPU: its cores).
- **host_load** h: the host work that comes with a stepping worker and competes with steps for the same cores (on a
  CPU device: the engine loop that polls the worker, the API server streaming tokens, the client), in cores' worth
  per stepping worker. With k steps in flight the device carries a load of L = k * (1 + h).
- **step_occupancy** u: how much of the device one step keeps busy once steps outnumber its cores. Each step then
  progresses at `1 / (1 + u * (L / cores - 1))` of its alone speed: u = 1 is strict time slicing (k steps on one GPU
  each at 1/k: what processes without MPS get), u < 1 concurrent kernels whose throughput saturates with the combined
  batch (MPS-like: a small model leaves a GPU underused, so k small steps cost less than k x one).

- **switch_s**: what each step waits, beyond its work, on a device whose workers (with their host work) outnumber its
  cores, `num_workers * (1 + h) > cores`: the engine loop, the worker and the API server hand every step over through
  processes that must each be scheduled, and an idle worker's busy wait keeps the cores taken (vLLM's CPU workers
  spin on their queue), so every hand-over can wait for a time slice. A latency, not work: it takes no capacity.

`sharing_efficiency` (< 1: switching costs part of the device) multiplies the rate while the device is shared. With the
defaults (h = 0, u = 1, efficiency 1, no switch) a step progresses at `speed * min(1, cores / k)`: processor sharing
by time slices.
"""

from __future__ import annotations

import simpy


class Device:
    """Runs steps of `work_s` seconds (at speed 1.0) for the workers it hosts, shared by the model above.

    A step alone on the device takes `work_s / speed`. A device whose workers can never outnumber its cores, host work
    counted (`num_workers * (1 + host_load) <= cores`), never shares and takes the short path.
    """

    def __init__(self, env: simpy.Environment, name: str, *, speed: float = 1.0, sharing_efficiency: float = 1.0,
                 num_workers: int = 1, cores: int = 1, host_load: float = 0.0, step_occupancy: float = 1.0,
                 switch_s: float = 0.0) -> None:
        if speed <= 0:
            raise ValueError(f"device {name}: speed must be > 0, got {speed}")
        if not 0 < sharing_efficiency <= 1:
            raise ValueError(f"device {name}: sharing_efficiency must be in (0, 1], got {sharing_efficiency}")
        if cores < 1:
            raise ValueError(f"device {name}: cores must be >= 1, got {cores}")
        if not host_load >= 0:
            raise ValueError(f"device {name}: host_load must be >= 0, got {host_load}")
        if not 0 < step_occupancy <= 1:
            raise ValueError(f"device {name}: step_occupancy must be in (0, 1], got {step_occupancy}")
        if not switch_s >= 0:
            raise ValueError(f"device {name}: switch_s must be >= 0, got {switch_s}")
        self.env = env
        self.name = name
        self.speed = speed
        self.sharing_efficiency = sharing_efficiency
        self.num_workers = num_workers
        self.cores = cores
        self.host_load = host_load
        self.step_occupancy = step_occupancy
        self.switch_s = switch_s if not self.exclusive else 0.0
        self.busy_s = 0.0
        self._jobs: dict[simpy.Event, float] = {}
        self._last_update_s = 0.0
        self._generation = 0

    @property
    def exclusive(self) -> bool:
        """True when every worker on the device always gets full speed (its load never exceeds the cores)."""
        return self.num_workers * (1.0 + self.host_load) <= self.cores

    def run(self, work_s: float) -> simpy.Event:
        """An event that fires when `work_s` seconds of full-speed work are done on this device."""
        if self.exclusive:
            self.busy_s += work_s / self.speed
            return self.env.timeout(work_s / self.speed)
        done = self.env.event()
        self._advance()
        self._jobs[done] = work_s
        self._reschedule()
        if not self.switch_s:
            return done
        handed_over = self.env.event()
        done.callbacks.append(lambda _event: self.env.timeout(self.switch_s).callbacks.append(
            lambda _e: handed_over.succeed()))
        return handed_over

    def rate(self, steps: int) -> float:
        """Progress per second of each of `steps` steps in flight on the device."""
        load = steps * (1.0 + self.host_load)
        if load <= self.cores:
            return self.speed
        # = speed * efficiency / (1 + u * (L / cores - 1)), written so that u = 1, h = 0 gives speed * e * cores / k
        # to the last bit (the time-slicing model before host load and occupancy existed)
        shared = self.cores + self.step_occupancy * (load - self.cores)
        return self.speed * self.sharing_efficiency * self.cores / shared

    def _advance(self) -> None:
        now = self.env.now
        elapsed = now - self._last_update_s
        if elapsed > 0 and self._jobs:
            self.busy_s += elapsed
            progress = elapsed * self.rate(len(self._jobs))
            jobs = self._jobs
            for job in jobs:
                jobs[job] -= progress
        self._last_update_s = now

    def _reschedule(self) -> None:
        self._generation += 1
        if not self._jobs:
            return
        generation = self._generation
        wait_s = max(min(self._jobs.values()), 0.0) / self.rate(len(self._jobs))
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
