"""A worker: one vLLM engine (scheduler + KV cache) running its step loop on a device, as a SimPy process."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.decode_stretch import DecodeStretch
from sim.device import Device
from sim.request import RequestState
from sim.scheduler import Scheduler
from sim.time_model import StepTimeModel


class Worker:
    """Synchronous vLLM engine loop: schedule -> run the step on the device -> process outputs -> repeat.

    Requests that arrive while a step runs wait for the next `schedule()` (the engine pulls its input queue
    between steps). An idle worker sleeps until a request arrives. `on_first_token` and `on_finished` are called
    at the end of the step that produced the token. With `fast_forward`, runs of decode-only steps on a device of
    its own are advanced as one event (`sim.decode_stretch`), with the same outcome as step by step.
    """

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        scheduler: Scheduler,
        device: Device,
        time_model: StepTimeModel,
        *,
        on_first_token: Callable[[RequestState], None],
        on_finished: Callable[[RequestState], None],
        max_model_len: int = 1 << 30,
        fast_forward: bool = True,
    ) -> None:
        self.env = env
        self.index = index
        self.scheduler = scheduler
        self.device = device
        self.time_model = time_model
        self._on_first_token = on_first_token
        self._on_finished = on_finished
        self._wakeup: simpy.Event | None = None
        self._stretch: DecodeStretch | None = None
        self._stretch_cut = False
        self.max_model_len = max_model_len
        self.fast_forward = fast_forward and device.exclusive
        self.num_steps = 0
        self.process = env.process(self._loop())

    @property
    def kv(self):
        return self.scheduler.kv

    def sync(self) -> None:
        """Apply the decode steps of a running stretch that have started by now (before anyone reads the cache)."""
        if self._stretch is not None:
            self._stretch.apply(self._stretch.steps_started_by(self.env.now))

    def submit(self, state: RequestState) -> None:
        self.scheduler.add_request(state)
        wakeup = self._wakeup
        if wakeup is None or wakeup.triggered:
            return
        stretch = self._stretch
        if stretch is None:
            wakeup.succeed()  # idle
        elif not self._stretch_cut:
            # NOTE: the engine sees the request when the step in progress ends: the stretch is cut there.
            self._stretch_cut = True
            steps = stretch.steps_started_by(self.env.now)
            self._wake_after(wakeup, stretch.start_s + stretch.elapsed_s(steps) - self.env.now, steps)

    def _wake_after(self, wakeup: simpy.Event, delay_s: float, steps: int) -> None:
        """Trigger `wakeup` with `steps` in `delay_s`, unless something triggered it first (then nothing)."""
        if delay_s > 0:
            self.env.timeout(delay_s).callbacks.append(lambda _event: wakeup.triggered or wakeup.succeed(steps))
        else:
            wakeup.succeed(steps)

    def _loop(self):
        env, scheduler = self.env, self.scheduler
        while True:
            if not scheduler.has_work:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            if self.fast_forward:
                stretch = DecodeStretch.plan(scheduler, self.time_model, speed=self.device.speed, now_s=env.now,
                                             max_model_len=self.max_model_len)
                if stretch is not None:
                    yield from self._run_stretch(stretch)
                    continue
            plan = scheduler.schedule(env.now)
            if plan.is_empty:
                head = scheduler.waiting[0]
                raise RuntimeError(
                    f"worker {self.index}: nothing schedulable with {len(scheduler.waiting)} waiting and "
                    f"{len(scheduler.running)} running; head request {head.request.request_id} needs "
                    f"{head.num_tokens} tokens, {scheduler.kv.num_free_blocks} blocks free"
                )
            yield self.device.run(self.time_model.step_seconds(plan))
            self.num_steps += 1
            outcome = scheduler.update_from_output(plan, env.now)
            for state in outcome.first_token:
                self._on_first_token(state)
            for state in outcome.finished:
                self._on_finished(state)

    def _run_stretch(self, stretch: DecodeStretch):
        env = self.env
        self._stretch = stretch
        self._stretch_cut = False
        wakeup = self._wakeup = env.event()
        # NOTE: the worker wakes with the number of steps done: all of them at the stretch's end, or fewer when an
        # arrival cut it (`submit`); whichever comes first wins, a later trigger of the spent event is ignored.
        # Cheaper than a SimPy condition on two events.
        self._wake_after(wakeup, stretch.duration_s, stretch.num_steps)
        steps = yield wakeup
        self._wakeup = None
        stretch.apply(steps)
        self._stretch = None
        self.num_steps += steps
        self.device.busy_s += stretch.elapsed_s(steps)
        finished = stretch.finished()
        if finished:
            self.scheduler.finish(finished, env.now)
            for state in finished:
                self._on_finished(state)
