"""The collector's pace during a simulation: raised for the block, restored after it, never lowered."""

import gc

import pytest

from sim.cluster import collector
from sim.cluster.collector import COMMAND_THRESHOLDS, SIMULATION_THRESHOLDS, command_collections, fewer_collections


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_raised_inside_and_restored_after(thresholds):
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == SIMULATION_THRESHOLDS
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_when_the_simulation_raises(thresholds):
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError, match="boom"):
        with fewer_collections():
            raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_is_kept_and_nesting_restores_each_level(thresholds):
    gc.set_threshold(100_000, 5, 1_000)
    with fewer_collections():
        assert gc.get_threshold() == (100_000, 20, 1_000)
        with fewer_collections():
            assert gc.get_threshold() == (100_000, 20, 1_000)
        assert gc.get_threshold() == (100_000, 20, 1_000)
    assert gc.get_threshold() == (100_000, 5, 1_000)


def test_a_disabled_collector_stays_disabled(thresholds):
    # NOTE: gc.disable() is a switch apart from the thresholds: a caller that turned collection off keeps it off.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with fewer_collections():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        if was_enabled:
            gc.enable()


def test_a_command_raises_the_pace_restores_it_and_freezes_at_exit(thresholds, monkeypatch):
    registered = []
    monkeypatch.setattr(collector.atexit, "register", registered.append)
    monkeypatch.setattr(collector, "_freeze_at_exit", False)
    gc.set_threshold(700, 10, 10)
    with command_collections():
        assert gc.get_threshold() == COMMAND_THRESHOLDS
        with fewer_collections():  # the simulation inside keeps the command's higher pace
            assert gc.get_threshold() == COMMAND_THRESHOLDS
    assert gc.get_threshold() == (700, 10, 10)
    with command_collections():
        pass
    assert registered == [gc.freeze]  # once per process
