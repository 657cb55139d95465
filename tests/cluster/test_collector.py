"""The collector's pace during a simulation: raised for the block, restored after it, never lowered."""

import gc

import pytest

from sim.cluster.collector import SIMULATION_THRESHOLDS, fewer_collections


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
