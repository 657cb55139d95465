"""A worker: one serving engine (scheduler + KV cache, `sim.engines`) running its step loop on a device, as a
SimPy process."""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from sim.cluster.device import Device
from sim.engines.interface import DecodeStretch, Engine, EngineLoad, RemoteKvSource, ServedRequest, StepTimeModel
from sim.workloads.request import Request


class Worker:
    """The engine loop: schedule -> run the step on the device -> process outputs -> repeat.

    Requests that arrive while a step runs wait for the next `schedule()` (the engine pulls its input queue
    between steps). An idle worker sleeps until a request arrives. `on_first_token` and `on_finished` are called
    at the end of the step that produced the token. With `fast_forward`, runs of decode-only steps on a device of
    its own are advanced as one event (the engine's decode stretches), with the same outcome as step by step.
    The worker knows engines only through `sim.engines.interface.Engine`.
    """

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        engine: Engine,
        device: Device,
        time_model: StepTimeModel,
        *,
        on_first_token: Callable[[ServedRequest], None],
        on_finished: Callable[[ServedRequest], None],
        fast_forward: bool = True,
    ) -> None:
        self.env = env
        self.index = index
        self.engine = engine
        self.device = device
        self.time_model = time_model
        self._on_first_token = on_first_token
        self._on_finished = on_finished
        self._wakeup: simpy.Event | None = None
        self._stretch: DecodeStretch | None = None
        self._stretch_cut = False
        self._unseen: list[ServedRequest] = []
        """Requests submitted since the loop last came round: it stamps their `queued_s` when it does."""
        self.fast_forward = fast_forward and device.exclusive
        self.num_steps = 0
        self.num_changes = 0
        """Bumped whenever the engine's load may change outside a stretch (an arrival, a step's start and end, a
        stretch's end): `load()` re-reads the engine only when this moved or a stretch runs."""
        self._load: EngineLoad | None = None
        self._load_at_change = -1
        self.process = env.process(self._loop())

    def sync(self) -> None:
        """Apply the decode steps of a running stretch that have started by now (before anyone reads the cache)."""
        if self._stretch is not None:
            self._stretch.apply(self._stretch.steps_started_by(self.env.now))

    def load(self) -> EngineLoad:
        """The engine's metrics now. Inside a decode stretch the usage comes from the stretch (`usage_after`) so that
        a scrape does not apply, and so cut, the stretch; running and waiting counts are the engine's."""
        if self._load_at_change != self.num_changes:
            self._load, self._load_at_change = self.engine.load(), self.num_changes
        load, stretch = self._load, self._stretch
        if stretch is None:
            return load
        usage = stretch.usage_after(stretch.steps_started_by(self.env.now))
        return EngineLoad(num_running=load.num_running, num_waiting=load.num_waiting, kv_usage=usage)

    def submit(self, request: Request, arrival_s: float) -> ServedRequest:
        """The request reaches the engine's queue (at `arrival_s`, which is now)."""
        return self._queued(self.engine.add_request(request, worker=self.index, arrival_s=arrival_s))

    def submit_remote_decode(self, request: Request, arrival_s: float) -> ServedRequest:
        """A request this worker prefills for another (P/D): it keeps its KV after its finish until released."""
        return self._queued(self.engine.add_remote_decode(request, worker=self.index, arrival_s=arrival_s))

    def release_remote_decode(self, state: ServedRequest) -> None:
        """The decode side has read `state`'s KV: the engine frees it."""
        self.sync()
        self.num_changes += 1
        self.engine.release_remote_decode(state)
        self._arrived()  # blocks freed: a stalled admission may go on

    def submit_remote(self, request: Request, arrival_s: float, source: RemoteKvSource) -> ServedRequest:
        """A request another worker prefilled reaches the engine's queue (P/D: its prompt KV comes from `source`)."""
        return self._queued(self.engine.add_remote_prefilled(request, worker=self.index, arrival_s=arrival_s,
                                                             source=source))

    def _queued(self, state: ServedRequest) -> ServedRequest:
        """`state` is in the engine's queue: the engine's load changed, the loop stamps `state` when it next comes
        round, the device counts the worker's demand, and an idle or decoding loop is woken."""
        self.num_changes += 1
        self._unseen.append(state)
        self.device.admit(self.index)
        self._arrived()
        return state

    def _arrived(self) -> None:
        """Wake the loop for the request just added: at once if idle, at the end of the step in progress if a decode
        stretch runs."""
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
            self.env.timeout(delay_s).callbacks.append(lambda _event: self._timer_due(wakeup, steps))
        else:
            wakeup.succeed(steps)

    def _timer_due(self, wakeup: simpy.Event, steps: int) -> None:
        """A timer of `wakeup` fires: trigger it with `steps`, unless something triggered it first (then nothing).

        Triggered, `wakeup` would be scheduled now behind every event already due now and processed when they are
        done. When none is due (the next event is later: the common case), it would be the very next event
        processed, so the loop is resumed here, in this timer's processing, with the same value, at the same time
        and in the same order: the wake-up costs no event of its own."""
        if wakeup.triggered:
            return  # a cut stretch's own end, or a cut in its last step whose end came first
        env = self.env
        if env.peek() > env.now:
            # NOTE: what `Environment.step` does with a processed event (SimPy 4: `_ok`, `_value`, `callbacks` set to
            # None so that a late trigger sees it processed), without its pass through the event queue.
            wakeup._ok, wakeup._value = True, steps
            callbacks, wakeup.callbacks = wakeup.callbacks, None
            for callback in callbacks:
                callback(wakeup)
        else:
            wakeup.succeed(steps)

    def _loop(self):
        env, engine = self.env, self.engine
        schedule, update_from_output, step_seconds = engine.schedule, engine.update_from_output, self.time_model.step_seconds
        unseen = self._unseen
        while True:
            if not engine.has_work:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            if unseen:  # the loop comes round: what arrived meanwhile is seen now (vLLM's queued_ts)
                for state in unseen:
                    state.queued_s = env.now
                unseen.clear()
            if self.fast_forward:
                stretch = engine.plan_decode_stretch(self.time_model, speed=self.device.speed, now_s=env.now)
                if stretch is not None:
                    yield from self._run_stretch(stretch)
                    continue
            plan = schedule(env.now)
            self.num_changes += 1  # admission and allocation happen at the step's start
            if plan.is_empty:
                if plan.stall_s:
                    yield env.timeout(plan.stall_s)  # it computed nothing but waited for flushed KV copies
                if plan.preempted:
                    continue  # a step that only preempted: the next one admits (vLLM skips admission after one)
                if engine.has_work:
                    wake_s = engine.next_background_s()
                    if wake_s is None:
                        raise RuntimeError(f"worker {self.index}: {engine.describe_stall()}")
                    # NOTE: only KV copies are in flight: sleep until the next completes or a request arrives.
                    self._wakeup = env.event()
                    if wake_s != math.inf:  # inf: until a request arrives or held KV is released
                        self._wake_after(self._wakeup, wake_s - env.now, 0)
                    yield self._wakeup
                    self._wakeup = None
                continue  # the engine found nothing left to do (its loop went idle)
            if plan.stall_s:
                yield env.timeout(plan.stall_s)  # the forward pass waits for flushed KV copies
            yield self.device.run(step_seconds(plan), self.index)
            self.num_steps += 1
            outcome = update_from_output(plan, env.now)
            self.num_changes += 1  # finishes and frees, before anyone hears of them
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
        self._stretch = None
        self.num_steps += steps
        self.device.busy_s += stretch.elapsed_s(steps)
        finished = self.engine.finish_stretch(stretch, steps, env.now)
        self.num_changes += 1
        for state in finished:
            self._on_finished(state)
