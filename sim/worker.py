"""A worker: one vLLM engine (scheduler + KV cache) running its step loop on a device, as a SimPy process."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.device import Device
from sim.request import RequestState
from sim.scheduler import Scheduler
from sim.time_model import StepTimeModel


class Worker:
    """Synchronous vLLM engine loop: schedule -> run the step on the device -> process outputs -> repeat.

    Requests that arrive while a step runs wait for the next `schedule()` (the engine pulls its input queue
    between steps). An idle worker sleeps until a request arrives. `on_first_token` and `on_finished` are called
    at the end of the step that produced the token.
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
    ) -> None:
        self.env = env
        self.index = index
        self.scheduler = scheduler
        self.device = device
        self.time_model = time_model
        self._on_first_token = on_first_token
        self._on_finished = on_finished
        self._wakeup: simpy.Event | None = None
        self.num_steps = 0
        self.process = env.process(self._loop())

    @property
    def kv(self):
        return self.scheduler.kv

    def submit(self, state: RequestState) -> None:
        self.scheduler.add_request(state)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _loop(self):
        env, scheduler = self.env, self.scheduler
        while True:
            if not scheduler.has_work:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
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
