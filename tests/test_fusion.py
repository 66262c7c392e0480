"""Celeritas operation fusion: CPD-TOPO, DFS-TOPO, the optimal breakpoints and the coarse graph."""

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.cluster import Cluster, Device, load_cluster
from placer.errors import OptionError
from placer.feasibility import static_footprint
from placer.generate import random_dag, training_graph
from placer.graph import OpGraph
from placer.transform.fusion import (
    ccr,
    cpath,
    cpd_topo_order,
    dfs_topo_order,
    fuse,
    group_allowed,
    link_costs,
    optimal_breakpoints,
)

CLUSTER = load_cluster("4xV100-nvlink")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def graphs(draw):
    """Random DAGs (with colocation groups) and small training graphs."""
    if draw(st.booleans()):
        return random_dag(
            draw(st.integers(1, 60)),
            edge_prob=draw(st.floats(0.05, 0.9)),
            colocation_groups=draw(st.integers(0, 4)),
            seed=draw(st.integers(0, 10**6)),
        )
    return training_graph(
        layers=draw(st.integers(1, 6)), branches=draw(st.integers(1, 3)), seed=draw(st.integers(0, 10**6))
    )


def assert_topological(graph: OpGraph, order: np.ndarray) -> None:
    assert sorted(order.tolist()) == list(range(graph.num_nodes))
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[order] = np.arange(graph.num_nodes)
    assert np.all(position[graph.src] < position[graph.dst])


@SETTINGS
@given(graphs())
def test_orders_are_topological(graph):
    w, c = link_costs(graph, CLUSTER)
    assert_topological(graph, cpd_topo_order(graph, w, c))
    assert_topological(graph, dfs_topo_order(graph))


@SETTINGS
@given(graphs())
def test_cpd_topo_outputs_the_best_newly_ready_child_next(graph):
    """Children that become ready go to the head of the queue, the one with the largest cpath on top."""
    w, c = link_costs(graph, CLUSTER)
    order = cpd_topo_order(graph, w, c).tolist()
    level = cpath(graph, w, c)
    position = {u: p for p, u in enumerate(order)}
    sources = [u for u in range(graph.num_nodes) if graph.predecessors(u).size == 0]
    assert order[0] == max(sources, key=lambda u: (level[u], -u))
    for p in range(len(order) - 1):
        u = order[p]
        ready = {int(v) for v in graph.successors(u) if max(position[int(x)] for x in graph.predecessors(v)) == p}
        if ready:
            assert order[p + 1] == max(ready, key=lambda v: (level[v], -v))


def test_dfs_topo_keeps_chains_together():
    """Figure 3: two chains behind two sources; DFS-TOPO finishes one chain before the other, M-TOPO interleaves."""
    # a0 -> a1 -> a2 and b0 -> b1 -> b2
    graph = OpGraph(["a0", "b0", "a1", "b1", "a2", "b2"], [1.0] * 6, [0, 2, 1, 3], [2, 4, 3, 5], [8] * 4)
    assert [graph.ids[i] for i in dfs_topo_order(graph)] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert [graph.ids[i] for i in graph.topological_order] == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_cpd_topo_follows_the_critical_path():
    """After a fork, the child on the longest path comes first, then its subtree, then the other child."""
    graph = OpGraph(["root", "light", "heavy", "tail"], [1.0, 1.0, 5.0, 1.0], [0, 0, 2], [1, 2, 3], [0, 0, 0])
    w, c = link_costs(graph, CLUSTER)
    assert [graph.ids[i] for i in cpd_topo_order(graph, w, c)] == ["root", "heavy", "tail", "light"]


def brute_force_cut(n, src_pos, dst_pos, edge_c, mem, window, cap):
    """The cheapest partition of 0..n-1 into contiguous clusters by enumeration."""
    best = np.inf
    for bits in itertools.product([False, True], repeat=n - 1):
        cuts = [0] + [i + 1 for i, b in enumerate(bits) if b] + [n]
        sizes_ok = all(b - a <= window for a, b in zip(cuts, cuts[1:]))
        mem_ok = all(b - a == 1 or mem[a:b].sum() <= cap for a, b in zip(cuts, cuts[1:]))
        if sizes_ok and mem_ok:
            label = np.repeat(np.arange(len(cuts) - 1), np.diff(cuts))
            best = min(best, float(edge_c[label[src_pos] != label[dst_pos]].sum()))
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.floats(0.1, 3.0), st.integers(0, 10**6))
def test_breakpoints_are_optimal(n, window, cap, seed):
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.4]
    src_pos = np.array([a for a, _ in pairs], dtype=np.int64)
    dst_pos = np.array([b for _, b in pairs], dtype=np.int64)
    edge_c = rng.uniform(0, 1, len(pairs))
    mem = rng.uniform(0, 1, n)
    cuts = optimal_breakpoints(n, src_pos, dst_pos, edge_c, mem, exploration_range=window, memory_cap=cap)
    assert cuts[0] == 0 and cuts[-1] == n and np.all(np.diff(cuts) >= 1)
    assert np.all(np.diff(cuts) <= window)
    label = np.repeat(np.arange(cuts.size - 1), np.diff(cuts))
    found = float(edge_c[label[src_pos] != label[dst_pos]].sum())
    assert found == pytest.approx(brute_force_cut(n, src_pos, dst_pos, edge_c, mem, window, cap), abs=1e-9)


@SETTINGS
@given(graphs(), st.integers(1, 40), st.floats(1e-4, 1.0))
def test_fusion_partitions_into_an_acyclic_coarse_graph(graph, window, fraction):
    fused = fuse(graph, CLUSTER, exploration_range=window, memory_fraction=fraction)
    n = graph.num_nodes
    # every original node in exactly one cluster, clusters contiguous in the CPD-TOPO order
    assert_topological(graph, fused.order)
    together = np.concatenate(fused.members) if fused.members else np.zeros(0, dtype=np.int64)
    assert np.array_equal(together, fused.order)
    assert np.array_equal(
        fused.cluster_of[together], np.repeat(np.arange(fused.num_clusters), [m.size for m in fused.members])
    )
    # the coarse graph is a DAG whose edges are exactly the cut edges' cluster pairs
    coarse = nx.DiGraph(list(zip(fused.coarse.src.tolist(), fused.coarse.dst.tolist())))
    assert nx.is_directed_acyclic_graph(coarse)
    cut = fused.cluster_of[graph.src] != fused.cluster_of[graph.dst]
    expected = set(zip(fused.cluster_of[graph.src[cut]].tolist(), fused.cluster_of[graph.dst[cut]].tolist()))
    assert set(coarse.edges) == expected
    # clusters respect R and M (a node bigger than M stands alone)
    footprint = static_footprint(graph)
    for members in fused.members:
        assert 1 <= members.size <= window
        assert members.size == 1 or footprint[members].sum() <= fused.memory_cap
    # compute is preserved per device; fusion never raises the CCR
    assert np.allclose(fused.coarse.durations(CLUSTER).sum(axis=0), graph.durations(CLUSTER).sum(axis=0))
    assert fused.ccr_after <= fused.ccr_before + 1e-9
    assert fused.ccr_before == pytest.approx(ccr(*link_costs(graph, CLUSTER)))
    assert fused.map_back(np.arange(fused.num_clusters)).shape == (n,)


@SETTINGS
@given(graphs(), st.integers(1, 40))
def test_every_cluster_has_a_device_for_all_its_kinds(graph, window):
    kinds = [("A100",) if i % 3 == 0 else ("V100",) if i % 3 == 1 else None for i in range(graph.num_nodes)]
    graph = graph.replace(device_kinds=kinds)
    hosts = load_cluster("2x4xV100")
    mixed = Cluster(
        "mixed-kinds",
        [Device(d.name, "A100" if j % 2 == 0 else "V100", d.memory_bytes) for j, d in enumerate(hosts.devices)],
        hosts.channels,
    )
    allowed = group_allowed(graph, mixed)
    if not allowed.any(axis=1).all():
        return  # a colocation group mixing kinds: no valid plan exists at all
    fused = fuse(graph, mixed, exploration_range=window)
    assert fused.allowed.any(axis=1).all()
    for k, members in enumerate(fused.members):
        assert np.array_equal(fused.allowed[k], allowed[members].all(axis=0))


def test_fusion_reduces_a_large_graph():
    graph = training_graph(layers=200, branches=3, seed=0)
    fused = fuse(graph, CLUSTER)
    assert fused.num_clusters <= graph.num_nodes // 20
    assert fused.ccr_after < fused.ccr_before / 2


@pytest.mark.parametrize(
    "options",
    [
        {"exploration_range": 0},
        {"exploration_range": 2.5},
        {"exploration_range": True},
        {"memory_fraction": 0},
        {"memory_fraction": float("nan")},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(OptionError, match=next(iter(options))):
        fuse(training_graph(layers=2), CLUSTER, **options)


def test_fused_times_are_the_members_sums_on_devices_of_one_kind_at_other_speeds():
    from placer.cluster import Channel, Cluster, Device

    cluster = Cluster(
        "c",
        [Device("slow", "A", 10**12, 1.0), Device("fast", "A", 10**12, 2.0)],
        [Channel("s>f", 1e9, 0.0, (("slow", "fast"),)), Channel("f>s", 1e9, 0.0, (("fast", "slow"),))],
    )
    # A measured time for a kind the cluster lacks must not pin the kind A devices to one speed.
    graph = OpGraph(["a", "b"], [2.0, 2.0], [0], [1], [8], compute_s_by_kind=[None, {"B": 1.0}])
    fused = fuse(graph, cluster)
    summed = np.zeros((fused.num_clusters, 2))
    np.add.at(summed, fused.cluster_of, graph.durations(cluster))
    np.testing.assert_allclose(fused.coarse.durations(cluster), summed)
