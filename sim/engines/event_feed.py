"""Delivery of one prefix cache's events to its subscribers (`PrefixCache.subscribe`), shared by the engines."""

from __future__ import annotations

from typing import Protocol

from sim.engines.interface import CacheEvent, CacheListener


class EventRecorder(Protocol):
    """The part of an engine's cache that records events as it changes (vLLM's block pool, SGLang's radix tree):
    `events` is None while nobody listens (recording costs nothing then), a list in emission order once it does."""

    events: list[CacheEvent] | None


class EventFeed:
    """The subscribers of `recorder`'s events: `publish` hands what it recorded since the last call to each of them,
    stamped with the time, and starts a new list."""

    __slots__ = ("_recorder", "_listeners")

    def __init__(self, recorder: EventRecorder) -> None:
        self._recorder = recorder
        self._listeners: list[CacheListener] = []

    def subscribe(self, listener: CacheListener) -> None:
        if self._recorder.events is None:
            self._recorder.events = []
        self._listeners.append(listener)

    def publish(self, now_s: float) -> None:
        recorder = self._recorder
        events = recorder.events
        if events:
            recorder.events = []
            for listener in self._listeners:
                listener(events, now_s)
