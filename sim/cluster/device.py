"""A GPU (device) whose time its workers share: processor sharing between the steps in flight on it."""

from __future__ import annotations

import simpy


class Device:
    """Runs steps of `work_s` seconds (at speed 1.0) for the workers it hosts.

    With k steps in flight on a device of `cores` parallel units, each progresses at
    `speed * min(1, cores / k) * efficiency` (time slicing between processes once they outnumber the units; with
    `sharing_efficiency` < 1 switching costs part of the device while it is time-sliced). A step alone on the device
    takes `work_s / speed`. A device that hosts one worker never shares and takes the short path.
    """

    def __init__(self, env: simpy.Environment, name: str, *, speed: float = 1.0, sharing_efficiency: float = 1.0,
                 num_workers: int = 1, cores: int = 1) -> None:
        if speed <= 0:
            raise ValueError(f"device {name}: speed must be > 0, got {speed}")
        if not 0 < sharing_efficiency <= 1:
            raise ValueError(f"device {name}: sharing_efficiency must be in (0, 1], got {sharing_efficiency}")
        self.env = env
        self.name = name
        self.speed = speed
        self.sharing_efficiency = sharing_efficiency
        self.num_workers = num_workers
        if cores < 1:
            raise ValueError(f"device {name}: cores must be >= 1, got {cores}")
        self.cores = cores
        self.busy_s = 0.0
        self._jobs: dict[simpy.Event, float] = {}
        self._last_update_s = 0.0
        self._generation = 0

    @property
    def exclusive(self) -> bool:
        """True when every worker on the device always gets full speed (no more workers than cores)."""
        return self.num_workers <= self.cores

    def run(self, work_s: float) -> simpy.Event:
        """An event that fires when `work_s` seconds of full-speed work are done on this device."""
        if self.num_workers <= self.cores:
            self.busy_s += work_s / self.speed
            return self.env.timeout(work_s / self.speed)
        done = self.env.event()
        self._advance()
        self._jobs[done] = work_s
        self._reschedule()
        return done

    def _rate(self) -> float:
        k = len(self._jobs)
        return self.speed if k <= self.cores else self.speed * self.sharing_efficiency * self.cores / k

    def _advance(self) -> None:
        now = self.env.now
        elapsed = now - self._last_update_s
        if elapsed > 0 and self._jobs:
            self.busy_s += elapsed
            progress = elapsed * self._rate()
            jobs = self._jobs
            for job in jobs:
                jobs[job] -= progress
        self._last_update_s = now

    def _reschedule(self) -> None:
        self._generation += 1
        if not self._jobs:
            return
        generation = self._generation
        wait_s = max(min(self._jobs.values()), 0.0) / self._rate()
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
