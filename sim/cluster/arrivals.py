"""How requests are sent: one at a time (warm-ups), a closed loop with C requests in flight, Poisson arrivals, given
arrival times (a rate curve's, `sim.workloads.arrival_curve`), and sessions (each turn sent when the turn before it
completed, plus a think time or tool latency)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator

import simpy

from sim.cluster.cluster import Cluster
from sim.results.records import RequestRecord
from sim.workloads.request import Request
from sim.workloads.sessions import Due, Session


def one_at_a_time(env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], out: list[RequestRecord]):
    """SimPy process: send each request after the previous one completed."""
    for request in requests:
        record = yield cluster.send(request)
        out.append(record)


def closed_loop(
    env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], concurrency: int, out: list[RequestRecord]
):
    """SimPy process: C clients share one ordered stream; each sends its next request when its last one completes.

    Every request is routed independently when sent (a new connection per request).
    """
    stream: Iterator[Request] = iter(requests)

    def client():
        for request in stream:
            record = yield cluster.send(request)
            out.append(record)

    clients = [env.process(client()) for _ in range(concurrency)]
    yield env.all_of(clients)


def poisson(env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], rate_rps: float,
            rng: random.Random, out: list[RequestRecord]):
    """SimPy process: an open loop sending requests at exponential gaps (mean 1 / rate_rps), without waiting for
    responses; ends when every request has completed."""
    pending = []
    for request in requests:
        yield env.timeout(rng.expovariate(rate_rps))
        pending.append(cluster.send(request))
    results = yield env.all_of(pending)
    out.extend(results[e] for e in pending)


def timed(env: simpy.Environment, cluster: Cluster, requests: Iterable[Request], arrival_times_s: Iterable[float],
          out: list[RequestRecord]):
    """SimPy process: an open loop sending each request at its arrival time (s after the process starts; increasing),
    without waiting for responses; as many requests as there are times (the shorter of the two ends the sending);
    ends when every request sent has completed."""
    start_s = env.now
    pending = []
    for request, at_s in zip(requests, arrival_times_s):
        if start_s + at_s > env.now:
            yield env.timeout(start_s + at_s - env.now)
        pending.append(cluster.send(request))
    results = yield env.all_of(pending)
    out.extend(results[e] for e in pending)


def sessions(env: simpy.Environment, cluster: Cluster, source: Iterable[Session],
             on_record: Callable[[RequestRecord], object], *, concurrency: int | None = None,
             on_session_end: Callable[[int], object] | None = None,
             admit: Callable[[Request], bool] | None = None):
    """SimPy process: the session driver. Starts each session of `source` at its `start_s` (open loop over
    sessions) or, with `concurrency`, keeps that many sessions running (closed loop: C seats each start the next
    session when theirs ends, at its `start_s` at the earliest); sends what `Session.first()` and, on each
    completion, `Session.after()` return, each after its delay; ends when every session has ended. The source is
    drawn lazily: only running sessions are held.

    `on_record` gets each completed request's record; `on_session_end` the id of each session that ended (nothing
    in flight and nothing more due). `admit` may refuse a request (one the engines cannot serve): it is not sent,
    and what would have followed it is never due (a client that got an error stops)."""
    in_flight: dict[int, int] = {}
    ended: dict[int, simpy.Event] = {}

    def send(session: Session, dues: list[Due]) -> None:
        sid = session.session_id
        for request, delay_s in dues:
            if admit is not None and not admit(request):
                continue
            in_flight[sid] += 1
            if delay_s > 0:
                env.timeout(delay_s).callbacks.append(
                    lambda _e, r=request: cluster.send(r, completed(session, r)))
            else:
                cluster.send(request, completed(session, request))
        if in_flight[sid] == 0:
            del in_flight[sid]
            if on_session_end is not None:
                on_session_end(sid)
            ended.pop(sid).succeed()

    def completed(session: Session, request: Request) -> Callable[[RequestRecord], None]:
        def on_done(record: RequestRecord) -> None:
            on_record(record)
            in_flight[session.session_id] -= 1
            send(session, session.after(request, env.now))
        return on_done

    def start(session: Session) -> simpy.Event:
        sid = session.session_id
        if sid in ended or sid in in_flight:
            raise ValueError(f"session {sid} is started twice (session ids must be unique)")
        event = ended[sid] = env.event()
        in_flight[sid] = 0
        send(session, session.first())
        return event

    if concurrency:
        stream = iter(source)

        def seat():
            for session in stream:
                if session.start_s > env.now:
                    yield env.timeout(session.start_s - env.now)
                yield start(session)

        yield env.all_of([env.process(seat()) for _ in range(concurrency)])
        return
    for session in source:
        if session.start_s > env.now:
            yield env.timeout(session.start_s - env.now)
        start(session)
    while ended:
        yield env.all_of(list(ended.values()))
