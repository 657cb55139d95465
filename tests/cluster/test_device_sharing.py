"""The device-sharing model (sim/cluster/device.py): narrated timings, and a property test against a naive model.

Each step on a device of `cores`, with k steps in flight and host load h per stepping worker (load L = k(1 + h)),
progresses at speed when L <= cores, else at speed * efficiency / (1 + u (L / cores - 1)). A pausing device stalls
by the oversubscription of its load of the moment, o = max(0, L - cores) / cores: a fraction pause_fraction x o of the
time, in pauses of mean pause_s x o.
"""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.device import Device


def _job(env, dev, work_s, done, name, start=0.0):
    if start:
        yield env.timeout(start)
    yield dev.run(work_s)
    done.append((name, env.now))


def _finish_times(jobs, *, draws=None, admit=False, **device) -> dict[str, float]:
    """When each job (name -> (start s, work s)) finishes on one device. `draws`: a stand-in for the device's pause
    stream (`_Draws`); `admit`: a request reaches the device at time 0, before any job starts."""
    env = simpy.Environment()
    dev = Device(env, "d", **device)
    if draws is not None:
        dev._random = draws
    if admit:
        dev.admit()
    done: list[tuple[str, float]] = []
    for name, (start, work) in jobs.items():
        env.process(_job(env, dev, work, done, name, start))
    env.run()
    return dict(done)


def test_defaults_are_strict_time_slicing():
    # Two 1 s steps on one core: each at 1/2, both done at 2 s.
    t = _finish_times({"a": (0.0, 1.0), "b": (0.0, 1.0)}, num_workers=2)
    assert t == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}


def test_occupancy_below_one_overlaps_steps():
    # u = 0.5: two steps each run at 1 / (1 + 0.5 (2 - 1)) = 2/3, so two 1 s steps finish at 1.5 s, not 2.
    t = _finish_times({"a": (0.0, 1.0), "b": (0.0, 1.0)}, num_workers=2, step_occupancy=0.5)
    assert t == {"a": pytest.approx(1.5), "b": pytest.approx(1.5)}


def test_occupancy_with_a_late_arrival():
    # u = 0.5, one core. A (1 s of work) alone until B arrives at 0.5 s (A has 0.5 left); both then at 2/3:
    # A finishes 0.75 s later (1.25), when B has done 0.5 of its 1 s; B alone for the rest: 1.75.
    t = _finish_times({"a": (0.0, 1.0), "b": (0.5, 1.0)}, num_workers=2, step_occupancy=0.5)
    assert t == {"a": pytest.approx(1.25), "b": pytest.approx(1.75)}


def test_host_load_slows_steps_only_when_the_cores_run_out():
    # Two cores, host load 0.5 per stepping worker. One step: load 1.5 <= 2, full speed (1 s).
    # Two steps: load 3 on 2 cores, each at 2/3: 1.5 s.
    alone = _finish_times({"a": (0.0, 1.0)}, num_workers=2, cores=2, host_load=0.5)
    both = _finish_times({"a": (0.0, 1.0), "b": (0.0, 1.0)}, num_workers=2, cores=2, host_load=0.5)
    assert alone == {"a": pytest.approx(1.0)}
    assert both == {"a": pytest.approx(1.5), "b": pytest.approx(1.5)}


def test_exclusive_counts_the_host_load():
    env = simpy.Environment()
    assert Device(env, "d", num_workers=1, cores=2, host_load=1.0).exclusive        # 1 x 2 <= 2
    assert not Device(env, "d", num_workers=2, cores=2, host_load=0.1).exclusive    # 2 x 1.1 > 2
    assert Device(env, "d", num_workers=2, cores=2).exclusive


def test_efficiency_applies_only_while_shared():
    # Efficiency 0.8 with u = 0.5: two steps each at 0.8 x 2/3 = 0.5333: 1 s steps done at 1.875 s.
    t = _finish_times({"a": (0.0, 1.0), "b": (0.0, 1.0)}, num_workers=2, step_occupancy=0.5,
                      sharing_efficiency=0.8)
    assert t["a"] == pytest.approx(1.875)
    assert _finish_times({"a": (0.0, 1.0)}, num_workers=2, sharing_efficiency=0.8) == {"a": pytest.approx(1.0)}


@pytest.mark.parametrize("field,value", [("host_load", -0.1), ("idle_load", -1.0), ("pause_s", -0.1), ("pause_fraction", 1.0),
                                         ("step_occupancy", 0.0), ("step_occupancy", 1.5)])
def test_bad_parameters_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        Device(simpy.Environment(), "d", **{field: value})


def _naive(jobs, *, speed, cores, host_load, occupancy, efficiency, dt=1e-4):
    """Fixed small time steps: every step in flight advances by dt times the model's rate."""
    left = {n: w for n, (s, w) in jobs.items()}
    done, now = {}, 0.0
    while len(done) < len(jobs):
        active = [n for n, (s, _) in jobs.items() if s <= now + 1e-12 and n not in done]
        load = len(active) * (1 + host_load)
        rate = speed if load <= cores else speed * efficiency / (1 + occupancy * (load / cores - 1))
        for n in active:
            left[n] -= dt * rate
            if left[n] <= 1e-12:
                done[n] = now + dt
        now += dt
    return done


@settings(max_examples=30, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.05, 0.5)), min_size=1, max_size=4),
    cores=st.integers(1, 3),
    host_load=st.sampled_from([0.0, 0.3, 1.0]),
    occupancy=st.sampled_from([1.0, 0.6, 0.1]),
    efficiency=st.sampled_from([1.0, 0.9]),
    speed=st.sampled_from([1.0, 2.0]),
)
def test_matches_a_naive_fixed_step_model(jobs, cores, host_load, occupancy, efficiency, speed):
    named = {f"j{i}": job for i, job in enumerate(jobs)}
    device = dict(speed=speed, cores=cores, host_load=host_load, step_occupancy=occupancy,
                  sharing_efficiency=efficiency, num_workers=4)
    exact = _finish_times(named, **device)
    naive = _naive(named, speed=speed, cores=cores, host_load=host_load, occupancy=occupancy, efficiency=efficiency)
    for name in named:
        assert exact[name] == pytest.approx(naive[name], abs=2e-3)


def test_idle_workers_load_the_device():
    # Two workers on 2 cores whose idle worker spins a whole core (b = 1) and host load 0.5: a step alone carries
    # L = 1.5 + 1 = 2.5 > 2, so it runs at 2/2.5 = 0.8 of its speed: 1 s of work in 1.25 s. Without host load the
    # load is 1 + 1 = 2: full speed.
    assert _finish_times({"a": (0.0, 1.0)}, num_workers=2, cores=2, host_load=0.5,
                         idle_load=1.0) == {"a": pytest.approx(1.25)}
    assert _finish_times({"a": (0.0, 1.0)}, num_workers=2, cores=2, idle_load=1.0) == {"a": pytest.approx(1.0)}
    env = simpy.Environment()
    assert Device(env, "d", num_workers=2, cores=2, idle_load=1.0).exclusive
    assert not Device(env, "d", num_workers=2, cores=2, idle_load=1.5).exclusive


def test_short_frequent_pauses_cost_their_fraction():
    # One core, two workers, the idle one spinning (b = 1): one 10 s step has share 1/2, 20 s without pauses; pausing
    # half the time in 10 ms pauses it finishes near 40 s, and the same seed gives the same time.
    steady = _finish_times({"a": (0.0, 10.0)}, num_workers=2, idle_load=1.0)
    kwargs = dict(num_workers=2, idle_load=1.0, pause_s=0.01, pause_fraction=0.5, seed=3)
    paused = _finish_times({"a": (0.0, 10.0)}, **kwargs)
    assert steady == {"a": pytest.approx(20.0)}
    assert paused["a"] == pytest.approx(40.0, rel=0.05)
    assert paused == _finish_times({"a": (0.0, 10.0)}, **kwargs)


def test_long_rare_pauses_make_a_tail_around_their_expectation():
    # Share 1/2, pauses of mean 0.5 s half the time (runs of mean 0.5 s), a 1 s step: 2 s of running at its share,
    # plus the pauses it meets: a Poisson(2 / 0.5) number while it runs (mean 0.5 s each), plus, half the time, a
    # pause already under way when it starts (mean 0.5 s): expected 2 + 4 x 0.5 + 0.5 x 0.5 = 4.25 s.
    times = [_finish_times({"a": (0.0, 1.0)}, num_workers=2, idle_load=1.0, pause_s=0.5, pause_fraction=0.5,
                           seed=s)["a"] for s in range(2000)]
    assert sum(times) / len(times) == pytest.approx(4.25, rel=0.05)
    assert min(times) == pytest.approx(2.0)            # some never pause
    assert sorted(times)[int(0.99 * len(times))] > 7.0  # and the tail waits out long pauses


def test_no_pauses_on_a_device_that_is_not_shared():
    # Two cores, one step, nothing idle: load 1 <= 2, the device never pauses.
    assert _finish_times({"a": (0.0, 1.0)}, num_workers=2, cores=2, host_load=0.5, pause_s=1.0,
                         pause_fraction=0.5) == {"a": pytest.approx(1.0)}


class _Draws:
    """A stand-in for a pausing device's random stream: every stationary draw 0.0 (paused if f > 0), every phase's
    hazard budget 1.0, so that the phases are the rule's arithmetic."""

    def random(self) -> float:
        return 0.0

    def expovariate(self, _rate: float) -> float:
        return 1.0


PAUSING = dict(num_workers=3, cores=1, pause_s=0.1, pause_fraction=0.25)


def test_a_device_at_low_load_stalls_less_than_at_high_load():
    # One core, three workers, no host or idle load: k steps carry L = k, oversubscription o = k - 1, so a pause
    # lasts p = 0.1 o and takes f = 0.25 o of the time; a run ends at rate f / (p (1 - f)), a pause at 1 / p, and each
    # phase spends a budget of 1 (_Draws). One step: o = 0, runs never end.
    # Two steps of 0.5 (share 1/2), o = 1: runs end at 0.25 / 0.075 = 3.33/s (0.3 s), pauses at 10/s (0.1 s): run
    # 0-0.3, pause, 0.4-0.7, pause, 0.8-1.1 (0.45 done), pause, then 0.1 s more: 1.3 s, 25 % of it paused.
    # Three steps of 0.5 (share 1/3), o = 2: runs and pauses both end at 5/s (0.2 s): 7 cycles of 0.4 s do
    # 7 x 0.0667 = 0.467, then 0.1 s more: 2.9 s, half of it paused. The old rule took o = 2 from the three workers
    # whatever the load, so the two steps paused as the three did: 1 s of running in five runs of 0.2 s behind five
    # pauses (the first drawn paused), 2 s.
    assert _finish_times({"a": (0.0, 1.0)}, **PAUSING, draws=_Draws()) == {"a": pytest.approx(1.0)}
    assert _finish_times({"a": (0.0, 0.5), "b": (0.0, 0.5)}, **PAUSING, draws=_Draws()) == {
        "a": pytest.approx(1.3), "b": pytest.approx(1.3)}
    assert _finish_times({"a": (0.0, 0.5), "b": (0.0, 0.5), "c": (0.0, 0.5)}, **PAUSING, draws=_Draws()) == {
        "a": pytest.approx(2.9), "b": pytest.approx(2.9), "c": pytest.approx(2.9)}


def test_a_load_change_mid_phase_spends_the_rest_of_the_budget_at_the_new_rate():
    # As above: a and b (0.5 each) from 0, their run ending at 3.33/s; c arrives at 0.15 s, when the run has spent
    # half its budget (0.15 x 3.33): the rest, 0.5, at three steps' 5/s: the run ends at 0.25 s, not 0.3. By then a
    # and b have done 0.075 + 0.1 / 3 = 0.1083; pauses and runs of 0.2 s follow (each run 0.0667 per step): a and b
    # finish after 5 more runs plus 0.0583 x 3 = 0.175 s: 0.25 + 5 x 0.4 + 0.2 + 0.175 = 2.625 s. Then c alone
    # (o = 0, no pauses) has 0.5 - 0.1 / 3 - 0.3917 = 0.075 left: 2.7 s.
    t = _finish_times({"a": (0.0, 0.5), "b": (0.0, 0.5), "c": (0.15, 0.5)}, **PAUSING, draws=_Draws())
    assert t == {"a": pytest.approx(2.625), "b": pytest.approx(2.625), "c": pytest.approx(2.7)}


def test_the_time_paused_follows_the_load():
    # Long steps with the real stream: the share of the time paused is f of the load they run at, 25 % with two
    # steps (two 30 s steps at share 1/2: 60 / 0.75 = 80 s), 50 % with three (90 / 0.5 = 180 s); the old rule's 50 %
    # for both would give 120 s for the two.
    two = [_finish_times({"a": (0.0, 30.0), "b": (0.0, 30.0)}, **PAUSING, seed=s)["a"] for s in range(40)]
    three = [_finish_times({n: (0.0, 30.0) for n in "abc"}, **PAUSING, seed=s)["a"] for s in range(40)]
    assert sum(two) / len(two) == pytest.approx(80.0, rel=0.03)
    assert sum(three) / len(three) == pytest.approx(180.0, rel=0.03)


def test_an_admission_draws_its_phase_with_the_admitted_worker_stepping():
    # One core, two workers, the idle one at b = 0.5: nothing stepping, L = 1 (o = 0, no pauses); one step, L = 1.5,
    # o = 0.5: f = 0.125, p = 0.05 s, a run ends at 0.125 / (0.05 x 0.875) = 2.857/s (0.35 s of budget 1). A request
    # admitted at 0 meets the chain afresh at the load of one step (_Draws: paused), so its step, starting at 0.02 at a
    # share of 1 / 1.5, waits out the pause to 0.05, runs to 0.40 (0.233 done), pauses to 0.45, runs to 0.80 (0.467)
    # and after the next pause needs 0.05 s: done at 0.90. Drawn at the load of the moment (nothing stepping: o = 0,
    # running) it would have run from 0.02 and been done at 0.87.
    t = _finish_times({"a": (0.02, 0.5)}, draws=_Draws(), admit=True, num_workers=2, cores=1, idle_load=0.5,
                      pause_s=0.1, pause_fraction=0.25)
    assert t == {"a": pytest.approx(0.90)}


def _worker_steps(env, dev, worker, steps, done):
    # one worker's steps back to back (`steps`: their work), as its engine loop runs them
    for i, work_s in enumerate(steps):
        yield dev.run(work_s, worker)
        done.append((f"{worker}.{i}", env.now))


def _step_times(plan, **device) -> dict[str, float]:
    """When each step of each worker (worker -> its steps' work) finishes on one device."""
    env = simpy.Environment()
    dev = Device(env, "d", **device)
    done: list[tuple[str, float]] = []
    for worker, steps in plan.items():
        env.process(_worker_steps(env, dev, worker, steps, done))
    env.run()
    return dict(done)


def test_a_step_on_an_oversubscribed_device_first_waits_its_handoff():
    # One core, two workers, the idle one spinning (b = 1): one step carries L = 2, o = 1, so it waits
    # handoff_s x 1 = 0.1 s, then runs its 1 s of work at 1/2: done at 2.1 s. Both stepping: each waits 0.1 s
    # (counted idle meanwhile: L = 2 for each's wait), then both run at 1/2 (L = 2): done at 2.1 s too.
    device = dict(num_workers=2, cores=1, idle_load=1.0, handoff_s=0.1)
    assert _step_times({0: [1.0]}, **device) == {"0.0": pytest.approx(2.1)}
    assert _step_times({0: [1.0], 1: [1.0]}, **device) == {"0.0": pytest.approx(2.1), "1.0": pytest.approx(2.1)}


def test_the_handoff_is_per_step_so_small_steps_pay_it_most():
    # As above: ten steps of 0.1 s (a decode) cost ten waits, 10 x (0.1 + 0.2) = 3.0 s, where one step of the
    # same 1 s of work (a prefill) costs one: 2.1 s. Without the handoff both take 2.0 s.
    device = dict(num_workers=2, cores=1, idle_load=1.0, handoff_s=0.1)
    assert _step_times({0: [0.1] * 10}, **device)["0.9"] == pytest.approx(3.0)
    assert _step_times({0: [0.1] * 10}, **{**device, "handoff_s": 0.0})["0.9"] == pytest.approx(2.0)


def test_no_handoff_while_the_load_is_within_the_cores():
    # Two cores, two workers with host load 0.5 (shared once both step: 3 > 2). One step alone: L = 1.5 <= 2, no
    # wait, done at 1.0 s. Two: the first to start (worker 0) meets L = 1.5, no wait; the second meets L = 3 (o = 0.5),
    # waits 0.05 s; from 0.05 s both run at 2/3: worker 0's 0.95 s left take 1.425 s (done 1.475), by when worker 1 has
    # done 0.95 of its 1 s; alone at full speed for the rest: done 1.525 s.
    device = dict(num_workers=2, cores=2, host_load=0.5, handoff_s=0.1)
    assert _step_times({0: [1.0]}, **device) == {"0.0": pytest.approx(1.0)}
    assert _step_times({0: [1.0], 1: [1.0]}, **device) == {"0.0": pytest.approx(1.475), "1.0": pytest.approx(1.525)}


def test_a_stepping_workers_own_next_step_is_not_counted_twice():
    # One core, two workers, b = 0. Worker 0 runs two 1 s steps; when its first ends (L = 0 for a moment: nothing
    # stepping) its second meets L = 1, o = 0: no wait; alone it runs at full speed: 1.0 and 2.0 s. Named, the worker's
    # step is counted once; a step of no worker in particular counts one more (min(k + 1, workers)).
    device = dict(num_workers=2, cores=1, handoff_s=0.1)
    assert _step_times({0: [1.0, 1.0]}, **device) == {"0.0": pytest.approx(1.0), "0.1": pytest.approx(2.0)}
    env = simpy.Environment()
    dev = Device(env, "d", num_workers=2, cores=1, handoff_s=0.1)
    dev.run(5.0, 0)
    assert dev._load_with(0) == 1.0 and dev._load_with(1) == 2.0 and dev._load_with(None) == 2.0
