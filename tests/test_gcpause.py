"""placer.gcpause: the collector is held off inside the block and back as it was after it."""

import gc

import pytest

from placer.gcpause import gc_paused


def test_restored_after_an_error_and_left_to_the_outermost_block():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner block leaves it to the outer one
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_already_off_stays_off():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_simulator_runs_with_the_collector_off_and_restores_it(monkeypatch):
    from placer.cluster import load_cluster
    from placer.graph import OpGraph
    from placer.sim import simulator

    seen = []
    real = simulator._durations_on
    monkeypatch.setattr(simulator, "_durations_on", lambda *a: seen.append(gc.isenabled()) or real(*a))
    graph = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8])
    result = simulator.simulate(graph, load_cluster("2xV100-nvlink"), [0, 1])
    assert seen == [False] and gc.isenabled()
    assert result.makespan_s > 2.0  # the transfer between the devices counts
