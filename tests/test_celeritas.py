"""Celeritas placements: Order-Place and Adjusting Placement over the fused graph."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.algorithms import celeritas as celeritas_module
from placer.algorithms import place
from placer.algorithms.celeritas import priority_orders, refine, schedule_coarse, upward_ranks
from placer.algorithms.common import MemoryBudget
from placer.cluster import Channel, Cluster, Device, load_cluster
from placer.errors import InfeasibleError, OptionError
from placer.generate import random_dag, training_graph
from placer.graph import OpGraph
from placer.sim.critical import critical_path
from placer.sim.simulator import simulate, simulate_plan
from placer.transform.fusion import fuse

from .clusters import line_cluster

GiB = 1 << 30
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mixed_speeds() -> Cluster:
    """Three devices of different speeds, one channel per ordered pair."""
    devices = [
        Device("fast", "V100", 16 * GiB, 2.0),
        Device("mid", "V100", 16 * GiB, 1.0),
        Device("slow", "V100", 16 * GiB, 0.5),
    ]
    names = [d.name for d in devices]
    return Cluster(
        "mixed-speeds", devices, [Channel(f"{a}->{b}", 1e10, 2e-5, ((a, b),)) for a in names for b in names if a != b]
    )


@st.composite
def fused_graphs(draw, colocation=True):
    """A random DAG or training graph fused with a small exploration range, and a cluster."""
    groups = draw(st.integers(0, 3)) if colocation else 0
    if draw(st.booleans()):
        graph = random_dag(
            draw(st.integers(1, 50)),
            edge_prob=draw(st.floats(0.05, 0.9)),
            max_compute_s=draw(st.sampled_from([1e-5, 1e-3])),
            colocation_groups=groups,
            seed=draw(st.integers(0, 10**6)),
        )
    else:
        graph = training_graph(
            layers=draw(st.integers(1, 5)), branches=draw(st.integers(1, 4)), seed=draw(st.integers(0, 10**6))
        )
        if not colocation:
            graph = graph.replace(colocation=None)
    cluster = draw(st.sampled_from([load_cluster("4xV100-nvlink"), load_cluster("2x4xV100"), mixed_speeds()]))
    return fuse(graph, cluster, exploration_range=draw(st.integers(1, 6))), cluster


def earliest_gap(busy, ready, duration):
    """Earliest t >= ready with [t, t + duration) clear of every busy interval, by trying every candidate."""
    for t in sorted({ready} | {f for _, f in busy if f >= ready}):
        if all(not (t < f and t + duration > s) for s, f in busy):
            return t
    raise AssertionError("no gap after the last interval")


@SETTINGS
@given(fused_graphs(colocation=False))
def test_each_adjustment_is_no_slower_than_order_place(case):
    """The lemma of Section 5.2, step by step.

    With the same clusters already placed, let Order-Place put the current
    cluster on the previous cluster's device d_k: its successors can have its
    data at t_order + w (its finish there). Where Adjusting Placement moves it
    to d_m instead, its data is back on d_k by t_adjust = finish on d_m +
    back_cost, and t_adjust < t_order + w. The schedule is replayed with an
    independent earliest-start search over every gap of every device.

    The lemma is about one step under one history, not the whole schedule:
    on random_dag(24, seed=99)-like cases on 4xGPU-pcie a move early on pins
    later clusters to the new device (d_k follows the previous cluster), and
    the coarse makespan ends several times Order-Place's.
    """
    fused, cluster = case
    coarse = fused.coarse
    unlimited = np.full(cluster.num_devices, np.inf)
    schedule = schedule_coarse(fused, cluster, "adjust", np.zeros(fused.graph.num_nodes), unlimited)
    duration = coarse.durations(cluster)
    busy = [[] for _ in range(cluster.num_devices)]
    for step, k in enumerate(schedule.sequence.tolist()):
        into = np.flatnonzero(coarse.dst == k)
        ready = [
            max(
                [
                    schedule.finish[coarse.src[e]]
                    + cluster.transfer_s(schedule.device[coarse.src[e]], d, coarse.edge_bytes[e])
                    for e in into
                ],
                default=0.0,
            )
            for d in range(cluster.num_devices)
        ]
        est = [earliest_gap(busy[d], ready[d], duration[k, d]) for d in range(cluster.num_devices)]
        chosen = int(schedule.device[k])
        assert schedule.start[k] == pytest.approx(est[chosen], rel=1e-12, abs=1e-15)
        assert schedule.finish[k] == pytest.approx(est[chosen] + duration[k, chosen], rel=1e-12, abs=1e-15)
        d_k = int(schedule.previous[step])
        if d_k >= 0:
            t_order_end = est[d_k] + duration[k, d_k]
            out = coarse.edge_bytes[coarse.src == k]
            back_cost = cluster.transfer_s(chosen, d_k, out.max()) if out.size else 0.0
            t_adjust = schedule.finish[k] + back_cost
            if chosen != d_k:
                assert t_adjust < t_order_end
            else:  # the same sum taken in another order: equal up to rounding
                assert t_adjust <= t_order_end * (1 + 1e-12)
        busy[chosen].append((schedule.start[k], schedule.finish[k]))


@SETTINGS
@given(fused_graphs(colocation=False), st.floats(0.05, 1.0))
def test_order_place_leaves_a_device_only_when_it_is_full(case, share):
    fused, cluster = case
    budget = MemoryBudget(fused.graph, cluster, 1.0)
    capacity = np.full(cluster.num_devices, share * budget.need.sum() / cluster.num_devices)
    schedule = schedule_coarse(fused, cluster, "order", budget.need, capacity)
    used = np.zeros(cluster.num_devices)
    for step, k in enumerate(schedule.sequence.tolist()):
        need = budget.need[fused.members[k]].sum()
        d, d_k = int(schedule.device[k]), int(schedule.previous[step])
        room = used + need <= capacity
        if d_k >= 0 and room[d_k]:
            assert d == d_k
        elif room.any():
            assert room[d]
            if d_k >= 0:  # the next device with room, counting on from the previous one
                later = [(d_k + s) % cluster.num_devices for s in range(1, cluster.num_devices)]
                assert d == next(j for j in later if room[j])
        else:  # best effort: the most room left
            assert capacity[d] - used[d] == (capacity - used).max()
        used[d] += need


@SETTINGS
@given(fused_graphs(), st.sampled_from(["order", "adjust"]))
def test_colocation_groups_share_a_device(case, policy):
    fused, cluster = case
    budget = MemoryBudget(fused.graph, cluster, 1.0)
    schedule = schedule_coarse(fused, cluster, policy, budget.need, budget.capacity)
    for members in fused.graph.colocation_groups.values():
        assert np.unique(schedule.node_device[members]).size == 1
    # nodes follow their cluster except where a group pinned elsewhere claims them
    follows = schedule.node_device == fused.map_back(schedule.device)
    in_group = np.array([c is not None for c in fused.graph.colocation], dtype=bool)
    assert np.all(follows | in_group)


@SETTINGS
@given(fused_graphs(), st.sampled_from(["order", "adjust"]))
def test_device_orders_respect_dependencies(case, policy):
    fused, cluster = case
    budget = MemoryBudget(fused.graph, cluster, 1.0)
    schedule = schedule_coarse(fused, cluster, policy, budget.need, budget.capacity)
    orders = schedule.device_orders(fused, cluster.num_devices)
    assert sorted(np.concatenate(orders).tolist()) == list(range(fused.graph.num_nodes))
    # one global order cut per device: every edge goes forward in it
    rank = np.empty(fused.graph.num_nodes)
    step = np.empty(schedule.sequence.size, dtype=np.int64)
    step[schedule.sequence] = np.arange(schedule.sequence.size)
    c = fused.cluster_of
    rank[np.lexsort((fused.position, step[c], schedule.start[c]))] = np.arange(fused.graph.num_nodes)
    assert np.all(rank[fused.graph.src] < rank[fused.graph.dst])


@pytest.mark.parametrize("algorithm", ["celeritas", "order_place"])
def test_plan_fits_when_one_device_cannot(algorithm):
    graph = training_graph(layers=24, branches=2, param_mib=600, activation_mib=64, seed=3)
    cluster = load_cluster("4xV100-nvlink")
    assert graph.param_bytes.sum() > cluster.devices[0].memory_bytes
    plan = place(graph, cluster, algorithm)
    result = simulate_plan(plan, graph, cluster)
    assert result.fits and plan.order is not None
    assert plan.predicted["makespan_s"] == pytest.approx(result.makespan_s, rel=1e-9)
    assert len({plan.placement[i] for i in graph.ids}) >= 2
    stats = plan.extra["celeritas"]
    assert stats["clusters"] < graph.num_nodes and stats["ccr_after"] <= stats["ccr_before"]
    assert stats["memory_fraction"] == 0.25  # fitting at the paper's cap: no smaller clusters tried


@pytest.mark.parametrize("algorithm", ["celeritas", "order_place"])
def test_smaller_clusters_where_none_of_the_first_fit(algorithm):
    # Three devices that hold the step with 30% to spare: clusters of up to a quarter of a device split
    # it too coarsely for any schedule to fit; a sixteenth of a device fits.
    graph = training_graph(layers=4, branches=3, param_mib=1, activation_mib=4, seed=1)
    names = ["d0", "d1", "d2"]
    memory = int(0.7 * (graph.param_bytes.sum() + graph.output_bytes.sum()) / len(names))
    cluster = Cluster(
        "tight",
        [Device(name, "cpu", memory) for name in names],
        [Channel(f"{a}->{b}", 2e9, 1e-5, ((a, b),)) for a in names for b in names if a != b],
    )
    plan = place(graph, cluster, algorithm)
    assert simulate_plan(plan, graph, cluster).fits
    assert plan.extra["celeritas"]["memory_fraction"] == 0.25 / 4


def test_adjusting_spreads_parallel_work_that_order_place_serialises():
    """Four heavy independent chains with light data: Order-Place keeps them on one device, Celeritas spreads them."""
    ids, src, dst = ["root"], [], []
    for chain in range(4):
        for j in range(3):
            ids.append(f"c{chain}.{j}")
            src.append(0 if j == 0 else len(ids) - 2)
            dst.append(len(ids) - 1)
    compute = [1e-4] + [1e-2] * 12
    graph = OpGraph(ids, compute, src, dst, [1 << 10] * len(src), output_bytes=[1 << 10] * len(ids))
    cluster = load_cluster("4xV100-nvlink")
    spread = place(graph, cluster, "celeritas", exploration_range=1)
    serial = place(graph, cluster, "order_place", exploration_range=1)
    assert len(set(serial.placement.values())) == 1
    assert len(set(spread.placement.values())) == 4
    assert spread.predicted["makespan_s"] < serial.predicted["makespan_s"] / 3


def test_beats_the_expert_split_on_a_model_too_big_for_one_device():
    graph = training_graph(layers=150, branches=3, param_mib=40, activation_mib=1, seed=0)
    cluster = load_cluster("4xV100-nvlink")
    ours = place(graph, cluster, "celeritas")
    expert = place(graph, cluster, "expert")
    assert ours.predicted["fits"]
    assert ours.predicted["makespan_s"] < expert.predicted["makespan_s"]


@pytest.mark.parametrize("algorithm", ["celeritas", "order_place"])
@pytest.mark.parametrize("options", [{"exploration_range": 0}, {"memory_fraction": -1.0}, {"memory_fraction": 2.5}])
def test_bad_options_are_refused(algorithm, options):
    with pytest.raises(OptionError, match=next(iter(options))):
        place(training_graph(layers=2), load_cluster("2xV100-nvlink"), algorithm, **options)


@SETTINGS
@given(
    st.integers(1, 40),
    st.floats(0.05, 0.9),
    st.integers(0, 10**6),
    st.sampled_from(["4xV100-nvlink", "4xGPU-pcie", "2x4xV100"]),
    st.integers(1, 6),
)
def test_celeritas_is_never_slower_than_order_place(nodes, edge_prob, seed, cluster_name, exploration_range):
    """Issue 6: Adjusting Placement on the same coarse graph is never slower than Order-Place.

    The greedy rule alone does not guarantee it for the whole schedule (see
    the lemma test above), so celeritas also runs Order-Place on its fused
    graph and keeps the faster plan; the plan records which policy won.
    """
    graph = random_dag(nodes, edge_prob=edge_prob, max_compute_s=1e-3, seed=seed)
    cluster = load_cluster(cluster_name)
    ours = place(graph, cluster, "celeritas", exploration_range=exploration_range)
    theirs = place(graph, cluster, "order_place", exploration_range=exploration_range)
    assert ours.predicted["makespan_s"] <= theirs.predicted["makespan_s"]
    assert ours.extra["celeritas"]["policy"] in ("adjust", "order")
    assert ours.predicted["makespan_s"] == pytest.approx(simulate_plan(ours, graph, cluster).makespan_s)


@pytest.mark.parametrize("algorithm", ["celeritas", "order_place"])
def test_devices_not_all_linked_get_a_valid_plan(algorithm):
    # A ring of 4 with little memory: where no device had room, the cluster went to the one with the most
    # room left whether or not its inputs could reach it ("no channel connects these devices").
    names = ["g0", "g1", "g2", "g3"]
    channels = [
        Channel(f"{a}->{b}", 2.5e10, 1e-5, ((a, b),))
        for i, a in enumerate(names)
        for b in (names[(i + 1) % 4], names[i - 1])
    ]
    ring = Cluster("ring4", [Device(x, "V100", 160 << 20) for x in names], channels)
    plan = place(training_graph(layers=4, branches=2), ring, algorithm)  # place() validates it
    assert plan.predicted["fits"]


@pytest.mark.parametrize("algorithm", ["celeritas", "order_place"])
@pytest.mark.parametrize("nodes, edge_prob, groups, seed, mib", [(48, 0.094, 3, 86, 108), (39, 0.278, 2, 91, 95)])
def test_a_pinned_member_stays_linked_to_its_cluster_on_a_line(algorithm, nodes, edge_prob, groups, seed, mib):
    # A cluster holding a member whose colocation group an earlier cluster pinned to d0 went to d2 (no room
    # left on d0): the member stayed on d0 and its producer in the cluster sent from d2 ("no channel connects").
    graph = random_dag(nodes, edge_prob=edge_prob, seed=seed, max_bytes=8 << 20, colocation_groups=groups)
    plan = place(graph, line_cluster(["d0", "d1", "d2"], mib << 20), algorithm, time_limit=10)  # place() validates
    assert plan.predicted["fits"]


def test_nodes_no_linked_device_can_take_are_refused_naming_the_link():
    # d0 -> d1 -> d2 one way only; 'a' may run only on d2's kind and 'b', fed by 'a', only on d0's.
    graph = OpGraph.from_dict(
        {
            "format": "placer.graph/1",
            "name": "back",
            "nodes": [
                {"id": "a", "compute_s": 1e-3, "device_kinds": ["T4"]},
                {"id": "b", "compute_s": 1e-3, "device_kinds": ["cpu"]},
            ],
            "edges": [{"src": "a", "dst": "b", "bytes": 10}],
        }
    )
    cluster = line_cluster(["d0", "d1", "d2"], GiB, kinds=["cpu", "V100", "T4"], both_ways=False)
    with pytest.raises(InfeasibleError, match="'a' would send from 'd2' to node 'b' on 'd0', but no channel connects"):
        place(graph, cluster, "celeritas")


def four_chains(length: int) -> OpGraph:
    """A root, four independent chains of ``length`` 1 ms operations with 64 KiB between them, and a join."""
    ids, src, dst = ["root"], [], []
    for chain in range(4):
        for j in range(length):
            ids.append(f"c{chain}.{j}")
            src.append(0 if j == 0 else len(ids) - 2)
            dst.append(len(ids) - 1)
    ids.append("join")
    for chain in range(4):
        src.append(1 + chain * length + length - 1)
        dst.append(len(ids) - 1)
    compute = [1e-4] + [1e-3] * (4 * length) + [1e-4]
    return OpGraph(ids, compute, src, dst, [1 << 16] * len(src), output_bytes=[1 << 16] * len(ids))


def test_spreads_parallel_chains_that_the_papers_range_fuses_into_one_cluster():
    """At R = 200 the 82 operations make one cluster, which one device runs in 80 ms; four devices
    can run the chains at once (about 20 ms plus a few transfers). Celeritas's finer fusions find that."""
    graph = four_chains(20)
    cluster = load_cluster("4xV100-nvlink")
    ours = place(graph, cluster, "celeritas")
    assert fuse(graph, cluster).num_clusters == 1
    assert len(set(ours.placement.values())) == 4
    assert len({ours.placement[f"c{chain}.{j}"] for chain in range(4) for j in range(20)}) == 4
    assert ours.predicted["makespan_s"] < 0.025
    assert ours.predicted["makespan_s"] < place(graph, cluster, "m_topo").predicted["makespan_s"]
    assert ours.predicted["makespan_s"] < place(graph, cluster, "single").predicted["makespan_s"] / 3
    assert simulate_plan(ours, graph, cluster).makespan_s == pytest.approx(ours.predicted["makespan_s"], rel=1e-9)


@SETTINGS
@given(fused_graphs(colocation=False), st.sampled_from(["order", "adjust"]), st.booleans())
def test_best_effort_where_no_device_has_room(case, policy, queued):
    """Algorithm 2, line 20: where every device is out of memory, the cluster goes to the one with the
    lowest usage (the most room left, on devices of equal memory), and that device is charged anyway."""
    fused, cluster = case
    need = np.full(fused.graph.num_nodes, 1e6)
    capacity = np.full(cluster.num_devices, 1.0)  # nothing fits anywhere
    schedule = schedule_coarse(fused, cluster, policy, need, capacity, queued=queued)
    used = np.zeros(cluster.num_devices)
    for k in schedule.sequence.tolist():
        expected = int(np.argmin(used))
        assert schedule.device[k] == expected
        used[expected] += need[fused.members[k]].sum()
    assert used.max() - used.min() <= max(need[m].sum() for m in fused.members)


def test_queued_inputs_wait_for_the_channel_as_in_the_reference_model():
    """a0 -> a1 on gpu0 (one colocation group, which fills it), each sending 1 GiB to b0 and b1 on gpu1. Over the one
    channel, a1's tensor waits for a0's: b1 starts two transfers after a0 ends, where Equation 7 says one
    transfer after a1 ends (gpu1 is then still busy with b0). The reference model, given the queued schedule's placement and order, agrees."""
    graph = OpGraph(
        ["a0", "a1", "b0", "b1"],
        [1e-3, 1e-3, 5e-3, 1e-3],
        [0, 0, 1],
        [1, 2, 3],
        [1 << 10, 1 << 30, 1 << 30],
        edge_tensor=[0, 1, 0],
        output_bytes=[1 << 30, 1 << 30, 0, 0],
        colocation=["a", "a", "b", "b"],
    )
    cluster = load_cluster("2xV100-nvlink")
    fused = fuse(graph, cluster, exploration_range=1)
    need, capacity = np.array([3.0, 3.0, 2.0, 2.0]), np.array([6.0, 4.0])
    k = fused.cluster_of
    transfer = cluster.transfer_s(0, 1, 1 << 30)
    queued = schedule_coarse(fused, cluster, "adjust", need, capacity, queued=True)
    paper = schedule_coarse(fused, cluster, "adjust", need, capacity)
    for schedule in (queued, paper):
        assert list(schedule.device[k]) == [0, 0, 1, 1]
    assert paper.start[k[3]] == pytest.approx(6e-3 + transfer)  # after b0, on gpu1 from 1 ms + transfer
    assert queued.start[k[3]] == pytest.approx(1e-3 + 2 * transfer)
    result = simulate(graph, cluster, queued.node_device, queued.device_orders(fused, cluster.num_devices))
    assert result.start == pytest.approx(queued.start[k])


def longest_to_end(graph, cluster, device_of):
    """Per node, its duration plus the longest path of durations and cross-device transfers after it: by
    recursion over successors (the oracle for upward_ranks)."""
    dur = graph.durations(cluster)[np.arange(graph.num_nodes), device_of]
    memo = {}

    def rank(v):
        if v not in memo:
            best = 0.0
            for e in np.flatnonzero(graph.src == v).tolist():
                w = int(graph.dst[e])
                same = device_of[v] == device_of[w]
                # The tensor crosses once, as its largest edge to that device.
                to_w = (
                    (graph.src == v)
                    & (graph.edge_tensor == graph.edge_tensor[e])
                    & (device_of[graph.dst] == device_of[w])
                )
                cost = (
                    0.0
                    if same
                    else cluster.transfer_s(int(device_of[v]), int(device_of[w]), int(graph.edge_bytes[to_w].max()))
                )
                best = max(best, rank(w) + cost)
            memo[v] = dur[v] + best
        return memo[v]

    return np.array([rank(v) for v in range(graph.num_nodes)])


@SETTINGS
@given(
    st.integers(1, 30), st.floats(0.05, 0.6), st.integers(0, 10**6), st.sampled_from(["4xV100-nvlink", "4xGPU-pcie"])
)
def test_upward_ranks_are_the_longest_way_to_the_end(nodes, edge_prob, seed, cluster_name):
    graph = random_dag(nodes, edge_prob=edge_prob, seed=seed)
    cluster = load_cluster(cluster_name)
    device_of = np.random.default_rng(seed).integers(0, cluster.num_devices, nodes)
    assert upward_ranks(graph, cluster, device_of) == pytest.approx(
        longest_to_end(graph, cluster, device_of), rel=1e-12
    )


@SETTINGS
@given(
    st.integers(1, 40), st.floats(0.05, 0.6), st.integers(0, 10**6), st.sampled_from(["4xV100-nvlink", "4xGPU-pcie"])
)
def test_priority_orders_start_the_highest_priority_ready_operation(nodes, edge_prob, seed, cluster_name):
    """Replayed by the reference model, each operation starts when its device frees up or its inputs arrive,
    and none of the same device's operations of higher priority was waiting, inputs there, at that instant."""
    graph = random_dag(nodes, edge_prob=edge_prob, seed=seed, max_compute_s=1e-3)
    cluster = load_cluster(cluster_name)
    rng = np.random.default_rng(seed)
    device_of = rng.integers(0, cluster.num_devices, nodes)
    priority = rng.permutation(nodes).astype(float)
    orders = priority_orders(graph, cluster, device_of, priority)
    assert sorted(np.concatenate(orders).tolist()) == list(range(nodes))
    result = simulate(graph, cluster, device_of, orders)
    arrived = np.zeros(nodes)  # when every input is on the node's device
    rows = result.transfers.rows()
    for e in range(graph.num_edges):
        u, v = int(graph.src[e]), int(graph.dst[e])
        at = (
            result.finish[u]
            if device_of[u] == device_of[v]
            else result.transfers.end[rows[(u, int(graph.edge_tensor[e]), int(device_of[v]))]]
        )
        arrived[v] = max(arrived[v], at)
    for d, order in enumerate(orders):
        for i, v in enumerate(order.tolist()):
            t = result.start[v]
            assert t == pytest.approx(max(arrived[v], result.finish[order[i - 1]] if i else 0.0), abs=1e-12)
            waiting = [w for w in order[i + 1 :].tolist() if arrived[w] <= t and priority[w] > priority[v]]
            # A zero-duration job of the instant goes first whatever its priority (rule 7 of the reference model).
            assert not waiting or result.finish[v] == t


@SETTINGS
@given(
    st.integers(1, 40), st.floats(0.05, 0.6), st.integers(0, 10**6), st.sampled_from(["4xV100-nvlink", "4xGPU-pcie"])
)
def test_the_critical_path_is_a_chain_of_waits_back_to_the_start(nodes, edge_prob, seed, cluster_name):
    """From the operation that ends the step, each link's operation starts the instant what it names ends
    (the operation before it on its device, a local input, or a transfer into its device), and the chain
    goes back to an operation that starts at time zero."""
    graph = random_dag(nodes, edge_prob=edge_prob, seed=seed, max_compute_s=1e-3, max_bytes=64 << 20)
    cluster = load_cluster(cluster_name)
    device_of = np.random.default_rng(seed).integers(0, cluster.num_devices, nodes)
    result = simulate(graph, cluster, device_of)
    path = critical_path(result)
    assert path[0].node == int(np.argmax(result.finish))
    assert result.finish[path[0].node] == result.makespan_s
    orders = result.device_orders()
    before = {int(b): int(a) for order in orders for a, b in zip(order[:-1], order[1:])}
    for link, after in zip(path, path[1:]):
        assert after.node == link.before
        v, u = link.node, link.before
        start = result.start[v]
        if link.kind == "device":
            assert before[v] == u and result.finish[u] == start
        elif link.kind == "local":
            assert device_of[u] == device_of[v] and np.flatnonzero((graph.src == u) & (graph.dst == v)).size
            assert result.finish[u] == start
        else:
            assert link.kind == "transfer" and device_of[u] != device_of[v]
            x = link.transfer
            assert result.transfers.producer[x] == u and result.transfers.dst_device[x] == device_of[v]
            assert result.transfers.end[x] == start
    assert path[-1].kind == "start" and result.start[path[-1].node] == 0.0


def test_refining_spreads_parallel_branches_that_one_device_runs():
    """Four parallel branches per block, all on one device: moving the clusters the critical path waits on
    ends the step earlier, on more devices, with every colocation group still on one device; the result
    replays under the reference model, and the same start gives the same placement."""
    graph = training_graph(layers=3, branches=4, seed=1)
    cluster = load_cluster("4xV100-nvlink")
    fused = fuse(graph, cluster, exploration_range=2)
    start = np.zeros(graph.num_nodes, dtype=np.int64)
    before = simulate(graph, cluster, start).makespan_s
    refined = refine(graph, cluster, fused, start)
    assert refined.moves > 0
    assert refined.result.makespan_s < 0.9 * before
    assert np.unique(refined.node_device).size >= 3
    for members in graph.colocation_groups.values():
        assert np.unique(refined.node_device[members]).size == 1
    again = simulate(graph, cluster, refined.node_device, refined.orders)
    assert again.fits and again.makespan_s == pytest.approx(refined.result.makespan_s, rel=1e-12)
    assert np.array_equal(refine(graph, cluster, fused, start).node_device, refined.node_device)


@SETTINGS
@given(fused_graphs())
def test_refining_never_slows_the_start_and_keeps_the_plan_valid(case):
    """Whatever the start (here, Adjusting Placement's schedule), the refined placement is valid (kinds,
    colocation, links: the reference model's checks), fits, and is no slower than the start."""
    fused, cluster = case
    graph = fused.graph
    need = celeritas_module.memory_need(graph, cluster)
    schedule = schedule_coarse(fused, cluster, "adjust", need, cluster.memory.astype(float), queued=True)
    orders = schedule.device_orders(fused, cluster.num_devices)
    start = simulate(graph, cluster, schedule.node_device, orders)
    refined = refine(graph, cluster, fused, schedule.node_device, orders, moves=12)
    result = simulate(graph, cluster, refined.node_device, refined.orders)  # checks the plan
    assert result.makespan_s == pytest.approx(refined.result.makespan_s, rel=1e-12)
    if start.fits:
        assert result.fits and result.makespan_s <= start.makespan_s


def test_celeritas_refines_its_plan_where_that_shortens_the_step(monkeypatch):
    """Without the critical-path moves, celeritas's plan of this four-branch step is slower and on one
    device; with them the plan records the moves it made and uses more devices."""
    graph = training_graph(layers=4, branches=4, seed=1)
    cluster = load_cluster("4xV100-nvlink")
    ours = place(graph, cluster, "celeritas")
    monkeypatch.setattr(celeritas_module, "REFINE_MOVES", 0)
    unrefined = place(graph, cluster, "celeritas")
    assert unrefined.extra["celeritas"]["moves"] == 0
    assert ours.extra["celeritas"]["moves"] > 0
    assert ours.predicted["makespan_s"] < unrefined.predicted["makespan_s"]
    assert len(set(ours.placement.values())) > len(set(unrefined.placement.values()))
