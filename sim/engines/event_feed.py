"""Delivery of one prefix cache's events to its subscribers (`PrefixCache.subscribe`), shared by the engines."""

from __future__ import annotations

from typing import Protocol

from sim.engines.interface import CacheEvent, CacheListener


class EventRecorder(Protocol):
    """The part of an engine's cache that records events as it changes (vLLM's block pool, SGLang's radix tree). It
    owns its queue of events: recording is off (and costs nothing) until `enable_events`; `take_events` hands out
    what was queued since the last call, in emission order, and starts a new queue."""

    records_events: bool
    """Whether events are queued (read-only: `enable_events` turns it on)."""

    def enable_events(self) -> None: ...

    def take_events(self) -> list[CacheEvent]: ...


class EventFeed:
    """The subscribers of `recorder`'s events: `publish` takes what it recorded since the last call and hands it to
    each of them, stamped with the time."""

    __slots__ = ("_recorder", "_listeners")

    def __init__(self, recorder: EventRecorder) -> None:
        self._recorder = recorder
        self._listeners: list[CacheListener] = []

    def subscribe(self, listener: CacheListener) -> None:
        self._recorder.enable_events()
        self._listeners.append(listener)

    def publish(self, now_s: float) -> None:
        if not self._recorder.records_events:
            return  # the common case: nobody listens, so nothing was queued
        events = self._recorder.take_events()
        if events:
            for listener in self._listeners:
                listener(events, now_s)
