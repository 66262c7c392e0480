"""The simulator against hand-computed schedules and an independent naive implementation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer import OpGraph, Plan, place, simulate
from placer.cluster import PRESETS, Channel, Cluster, Device
from placer.errors import InvalidPlanError
from placer.feasibility import live_memory_bound
from placer.generate import random_dag, training_graph
from placer.sim import lower_bound, simulate_plan

from .reference_model import close, random_valid_order, reference_simulate


def line_cluster(n=3, bandwidth=1.0, latency=0.0, shared=False, memory=10**12):
    """Devices d0..d{n-1}; per-pair channels, or one channel shared by every pair out of each device."""
    devices = [Device(f"d{i}", "X", memory) for i in range(n)]
    names = [d.name for d in devices]
    if shared:
        channels = [Channel(f"{a}->*", bandwidth, latency, tuple((a, b) for b in names if b != a)) for a in names]
    else:
        channels = [Channel(f"{a}->{b}", bandwidth, latency, ((a, b),)) for a in names for b in names if a != b]
    return Cluster("test", devices, channels)


def graph(nodes, edges, **kw):
    """nodes: {id: compute_s}; edges: [(src, dst, bytes, tensor)]."""
    ids = list(nodes)
    idx = {k: i for i, k in enumerate(ids)}
    return OpGraph(
        ids,
        [nodes[k] for k in ids],
        [idx[e[0]] for e in edges],
        [idx[e[1]] for e in edges],
        [e[2] for e in edges],
        [e[3] if len(e) > 3 else 0 for e in edges],
        **kw,
    )


def test_congested_shared_channel_serves_one_transfer_at_a_time():
    # a on d0 sends two different tensors, to d1 and to d2, over d0's one shared channel.
    g = graph({"a": 1.0, "b": 1.0, "c": 1.0}, [("a", "b", 2, 0), ("a", "c", 3, 1)])
    r = simulate(g, line_cluster(shared=True), [0, 1, 2])
    # Both queue at t=1; tie goes to the destination device named first (d1): [1,3] then [3,6].
    assert r.transfers.start.tolist() == [1.0, 3.0]
    assert r.transfers.end.tolist() == [3.0, 6.0]
    assert r.start.tolist() == [0.0, 3.0, 6.0]
    assert r.makespan_s == 7.0
    # With one channel per pair both transfers run at once.
    r = simulate(g, line_cluster(shared=False), [0, 1, 2])
    assert r.makespan_s == 5.0


def test_tensor_is_sent_once_per_destination_device():
    g = graph({"a": 1.0, "b": 1.0, "c": 1.0}, [("a", "b", 4, 0), ("a", "c", 6, 0)])
    r = simulate(g, line_cluster(n=2), [0, 1, 1])
    assert len(r.transfers) == 1 and r.transfers.nbytes.tolist() == [6]  # the largest bytes among the edges
    assert r.start.tolist() == [0.0, 7.0, 8.0]
    # Two different tensors of the same producer travel separately.
    g = graph({"a": 1.0, "b": 1.0, "c": 1.0}, [("a", "b", 4, 0), ("a", "c", 6, 1)])
    r = simulate(g, line_cluster(n=2), [0, 1, 1])
    assert r.transfers.nbytes.tolist() == [4, 6]
    assert r.start.tolist() == [0.0, 5.0, 11.0]


def test_latency_and_bandwidth():
    g = graph({"a": 1.0, "b": 1.0}, [("a", "b", 100, 0)])
    r = simulate(g, line_cluster(n=2, bandwidth=50.0, latency=0.5), [0, 1])
    assert r.start[1] == 1.0 + 0.5 + 2.0


def test_memory_lifetimes_on_one_device():
    g = graph(
        {"a": 1.0, "b": 2.0, "c": 1.0},
        [("a", "b", 10, 0), ("b", "c", 20, 0)],
        output_bytes=[10, 20, 30],
        temp_bytes=[5, 7, 0],
        param_bytes=[100, 0, 0],
    )
    r = simulate(g, line_cluster(n=1), [0, 0, 0])
    # [1,3): a's output (until b finishes) + b's temp + b's output = 37; [3,4): b out + c out = 50.
    assert r.peak_memory_bytes.tolist() == [150]
    times, levels = r.memory_timeline(0)
    assert levels.max() == 150 and levels[-1] == 100


def test_received_copy_lives_from_transfer_start_to_last_consumer():
    g = graph(
        {"a": 1.0, "b": 1.0, "c": 3.0},
        [("a", "b", 8, 0), ("a", "c", 8, 0)],
        output_bytes=[8, 0, 0],
        temp_bytes=[0, 0, 0],
    )
    r = simulate(g, line_cluster(n=2, bandwidth=4.0), [0, 1, 1])
    # a's output lives on d0 until its transfer ends at 3; the copy on d1 from 1 until c ends at 7.
    assert r.peak_memory_bytes.tolist() == [8, 8]
    assert r.finish.tolist() == [1.0, 4.0, 7.0]


def test_release_counts_before_allocation_at_one_instant():
    g = graph({"a": 1.0, "b": 1.0}, [("a", "b", 0, 0)], temp_bytes=[10, 10])
    assert simulate(g, line_cluster(n=1), [0, 0]).peak_memory_bytes.tolist() == [10]


def test_earliest_ready_first_then_graph_order():
    # z becomes ready at 0, y at 1 (after x): without an order d0 runs z before y.
    g = graph({"x": 1.0, "y": 1.0, "z": 1.0}, [("x", "y", 0, 0)])
    r = simulate(g, line_cluster(n=2), [1, 0, 0])
    assert r.start.tolist() == [0.0, 1.0, 0.0]
    # Ties in readiness go to the node listed first.
    g = graph({"p": 1.0, "q": 1.0}, [])
    assert simulate(g, line_cluster(n=1), [0, 0]).start.tolist() == [0.0, 1.0]


def test_order_is_followed_even_when_it_idles_the_device():
    g = graph({"x": 1.0, "y": 1.0, "z": 1.0}, [("x", "y", 0, 0)])
    r = simulate(g, line_cluster(n=2), [1, 0, 0], order=[[1, 2], [0]])
    assert r.start.tolist() == [0.0, 1.0, 2.0]


def test_order_that_deadlocks_across_devices_is_invalid():
    g = graph({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, [("a", "b", 0, 0), ("c", "d", 0, 0)])
    with pytest.raises(InvalidPlanError, match="deadlock") as caught:
        simulate(g, line_cluster(n=2), [0, 1, 1, 0], order=[[3, 0], [1, 2]])
    # The message walks the cycle, wherever it starts it.
    told = str(caught.value).split(": ", 1)[1].split("; ")
    assert sorted(told) == [
        "'a' feeds 'b'",
        "'b' comes before 'c' in the order of 'd1'",
        "'c' feeds 'd'",
        "'d' comes before 'a' in the order of 'd0'",
    ]


def test_order_against_a_local_dependency_is_invalid():
    # Named: the pair in conflict, not the nodes stuck behind it ('x' and 'y' wait on d0 after them).
    g = graph({"a": 1.0, "b": 1.0, "x": 1.0, "y": 1.0}, [("a", "b", 0, 0), ("b", "x", 0, 0), ("x", "y", 0, 0)])
    with pytest.raises(
        InvalidPlanError,
        match=r"contradicts the dependencies \(it would deadlock\): "
        r"('a' feeds 'b'; 'b' comes before 'a' in the order of 'd0'|"
        r"'b' comes before 'a' in the order of 'd0'; 'a' feeds 'b')$",
    ):
        simulate(g, line_cluster(n=1), [0, 0, 0, 0], order=[[1, 0, 2, 3]])


def test_transfer_without_channel_is_invalid():
    cluster = Cluster("split", [Device("d0", "X", 100), Device("d1", "X", 100)], [])
    g = graph({"a": 1.0, "b": 1.0}, [("a", "b", 1, 0)])
    with pytest.raises(InvalidPlanError, match="no channel"):
        simulate(g, cluster, [0, 1])


def test_compute_s_by_kind_wins_over_speed():
    cluster = Cluster("k", [Device("d0", "A", 100, speed=2.0), Device("d1", "B", 100, speed=2.0)], [])
    g = graph({"a": 4.0, "b": 4.0}, [], compute_s_by_kind=[{"B": 1.0}, {"B": 1.0}])
    r = simulate(g, cluster, [0, 1])
    assert r.finish.tolist() == [2.0, 1.0]


def test_zero_duration_chain_on_one_instant():
    g = graph({"a": 0.0, "b": 0.0, "c": 1.0}, [("a", "b", 1, 0), ("b", "c", 1, 0)])
    r = simulate(g, line_cluster(n=2, latency=0.0, bandwidth=1e30), [0, 1, 0])
    assert r.makespan_s == pytest.approx(1.0)
    assert list(r.device_orders()[0]) == [0, 2]


def test_jobs_of_no_duration_end_before_a_channel_picks():
    # At t=1, p's transfer (d1->d3) joins channel X's queue, and so does z's (d0->d2), once z, an operation
    # of no duration that a's finish makes ready, ends at that instant. Rule 7 applies z's end before X
    # picks, so the tie goes to z, listed first: 1-2, then p's 2-3 (not p's first, which gave 8).
    devices = [Device(f"d{i}", "K", 1000) for i in range(4)]
    cluster = Cluster("c", devices, [Channel("X", 100.0, 0.0, (("d0", "d2"), ("d1", "d3")))])
    g = graph({"z": 0.0, "a": 1.0, "p": 1.0, "zc": 5.0, "pc": 1.0}, [("a", "z", 0), ("z", "zc", 100), ("p", "pc", 100)])
    r = simulate(g, cluster, [0, 0, 1, 2, 3])
    assert r.transfers.producer.tolist() == [0, 2] and r.transfers.start.tolist() == [1.0, 2.0]
    assert r.makespan_s == 7.0
    _compare_with_reference(g, cluster, np.array([0, 0, 1, 2, 3]))


def test_jobs_of_no_duration_end_before_a_device_picks():
    # At t=1 'late' is ready on d1; 'early', listed first, becomes ready there at the same instant through
    # z (no duration, on d0) and a transfer of no duration: d1 starts 'early' first.
    cluster = Cluster(
        "c", [Device("d0", "K", 1000), Device("d1", "K", 1000)], [Channel("X", 100.0, 0.0, (("d0", "d1"),))]
    )
    g = graph(
        {"early": 5.0, "z": 0.0, "a": 1.0, "m": 1.0, "late": 1.0}, [("a", "z", 0), ("z", "early", 0), ("m", "late", 0)]
    )
    r = simulate(g, cluster, [1, 0, 0, 1, 1])
    assert r.start.tolist() == [1.0, 1.0, 0.0, 0.0, 6.0]
    _compare_with_reference(g, cluster, np.array([1, 0, 0, 1, 1]))


# ---------------------------------------------------------------- properties

cluster_names = st.sampled_from(["2xV100-nvlink", "4xGPU-pcie", "2x4xV100", "8xH100-nvswitch"])


@st.composite
def placed_graphs(draw, max_nodes=14):
    n = draw(st.integers(1, max_nodes))
    g = random_dag(
        n,
        edge_prob=draw(st.floats(0.1, 0.9)),
        seed=draw(st.integers(0, 10**6)),
        max_compute_s=draw(st.sampled_from([1e-6, 1e-3, 1.0])),
        max_bytes=draw(st.sampled_from([1, 1 << 20, 1 << 30])),
    )
    instant = draw(st.sets(st.integers(0, n - 1), max_size=n // 2))
    if instant:  # operations of no duration, as a captured graph's views: rule 7's cascades within one instant
        doc = g.to_dict()
        for i in instant:
            doc["nodes"][i]["compute_s"] = 0.0
        g = OpGraph.from_dict(doc)
    cluster = PRESETS[draw(cluster_names)]()
    device_of = draw(st.lists(st.integers(0, cluster.num_devices - 1), min_size=n, max_size=n))
    return g, cluster, np.array(device_of)


def _compare_with_reference(g, cluster, device_of, order=None):
    names = [d.name for d in cluster.devices]
    placement = {g.ids[i]: names[j] for i, j in enumerate(device_of)}
    order_doc = None if order is None else {names[j]: [g.ids[i] for i in seq] for j, seq in enumerate(order)}
    ours = simulate(g, cluster, device_of, order)
    ref = reference_simulate(g.to_dict(), cluster.to_dict(), placement, order_doc)
    assert close(ours.makespan_s, ref["makespan_s"])
    for i, node in enumerate(g.ids):
        assert close(ours.start[i], ref["start"][node]), node
    assert {n: int(p) for n, p in zip(names, ours.peak_memory_bytes)} == ref["peak_memory_bytes"]
    assert ours.fits == ref["fits"]
    return ours


@settings(max_examples=120, deadline=None)
@given(placed_graphs())
def test_matches_independent_reference_without_order(case):
    _compare_with_reference(*case)


@settings(max_examples=80, deadline=None)
@given(placed_graphs(), st.randoms(use_true_random=False))
def test_matches_independent_reference_with_random_valid_order(case, rnd):
    g, cluster, device_of = case
    _compare_with_reference(g, cluster, device_of, random_valid_order(g, cluster.num_devices, device_of, rnd))


@settings(max_examples=60, deadline=None)
@given(placed_graphs(max_nodes=40))
def test_makespan_at_least_lower_bound(case):
    g, cluster, device_of = case
    assert simulate(g, cluster, device_of).makespan_s >= lower_bound(g, cluster) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(placed_graphs(max_nodes=40))
def test_one_device_gives_sum_of_compute(case):
    g, cluster, _ = case
    r = simulate(g, cluster, np.zeros(g.num_nodes, dtype=int))
    assert r.makespan_s == pytest.approx(g.compute_s.sum() / cluster.devices[0].speed, rel=1e-9)
    assert len(r.transfers) == 0


@settings(max_examples=40, deadline=None)
@given(placed_graphs(max_nodes=30))
def test_device_orders_reproduce_the_schedule(case):
    g, cluster, device_of = case
    free = simulate(g, cluster, device_of)
    fixed = simulate(g, cluster, device_of, free.device_orders())
    assert np.array_equal(free.start, fixed.start)
    assert np.array_equal(free.peak_memory_bytes, fixed.peak_memory_bytes)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(["single", "round_robin", "expert", "metis"]), cluster_names)
def test_plan_predictions_equal_a_fresh_independent_simulation(seed, algorithm, cluster_name):
    g = training_graph(layers=3, branches=2, seed=seed, param_mib=64, activation_mib=32)
    cluster = PRESETS[cluster_name]()
    plan = Plan.from_dict(place(g, cluster, algorithm).to_dict())
    ref = reference_simulate(g.to_dict(), cluster.to_dict(), plan.placement, plan.order)
    assert close(plan.predicted["makespan_s"], ref["makespan_s"], rel=1e-6)
    assert plan.predicted["peak_memory_bytes"] == ref["peak_memory_bytes"]
    assert close(simulate_plan(plan, g, cluster).makespan_s, ref["makespan_s"], rel=1e-6)


@settings(max_examples=80, deadline=None)
@given(placed_graphs(max_nodes=30), st.randoms(use_true_random=False))
def test_live_memory_bound_holds_while_its_node_runs_under_any_placement_and_order(case, rnd):
    g, cluster, device_of = case
    bound, node = live_memory_bound(g, cluster)
    assert bound >= g.param_bytes.sum()
    if node < 0:
        return
    r = simulate(g, cluster, device_of, random_valid_order(g, cluster.num_devices, device_of, rnd))
    middle = (r.start[node] + r.finish[node]) / 2
    held = 0
    for j in range(cluster.num_devices):
        times, levels = r.memory_timeline(j)
        held += int(levels[np.searchsorted(times, middle, side="right") - 1])
    assert held >= bound


def test_live_memory_bound_counts_what_crosses_the_loss():
    # x feeds the loss and, past it, the gradient: x's 100 bytes are held while the loss runs.
    g = OpGraph(
        ["x", "loss", "grad"],
        [1.0, 1.0, 1.0],
        [0, 0, 1],
        [1, 2, 2],
        [100, 100, 4],
        output_bytes=[100, 4, 100],
        param_bytes=[0, 0, 10],
        temp_bytes=[0, 7, 0],
    )
    assert live_memory_bound(g, PRESETS["2xV100-nvlink"]()) == (10 + 100 + 4 + 7, 1)
    # A tensor read only by the loss is not held past it: the largest is x's own output while x runs.
    g = OpGraph(
        ["x", "loss", "grad"],
        [1.0, 1.0, 1.0],
        [0, 1],
        [1, 2],
        [100, 4],
        output_bytes=[100, 4, 50],
        param_bytes=[0, 0, 10],
    )
    assert live_memory_bound(g, PRESETS["2xV100-nvlink"]()) == (10 + 100, 0)
