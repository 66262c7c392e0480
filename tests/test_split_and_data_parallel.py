"""Operation splitting, the data-parallel graph, data_parallel and OS-DPOS (FastT Sec. 5.2)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer import OpGraph, place, simulate
from placer.algorithms.data_parallel import (
    data_parallel_lower_bound,
    data_parallel_schedule,
    replica_devices,
    replica_hosts,
)
from placer.api import validate
from placer.cluster import PRESETS, Channel, Cluster, Device, load_cluster
from placer.errors import InfeasibleError, OptionError
from placer.generate import training_graph
from placer.transform.replicate import collective_cost, data_parallel_graph, gradients, replica_layout
from placer.transform.split import batch_dependent, original_ids, split_operation

GiB = 1 << 30


def mesh(n, bandwidth=1e9, latency=0.0, memory=64 * GiB):
    devices = [Device(f"d{j}", "V100", memory) for j in range(n)]
    names = [d.name for d in devices]
    return Cluster(
        "mesh", devices, [Channel(f"{a}->{b}", bandwidth, latency, ((a, b),)) for a in names for b in names if a != b]
    )


def conv_graph(compute=8.0, batch=8):
    """input -> conv (batch-splittable, reads a weight) -> relu; the weight is a parameter placeholder."""
    return OpGraph(
        ["x", "w", "conv", "relu"],
        [0.0, 0.0, compute, 0.5],
        [0, 1, 2],
        [2, 2, 3],
        [800, 40, 400],
        op=["placeholder", "placeholder", "aten.convolution", "aten.relu"],
        output_bytes=[800, 0, 400, 400],
        param_bytes=[0, 40, 0, 0],
        temp_bytes=[0, 0, 80, 0],
        compute_s_by_kind=[None, None, {"A100": compute / 2}, None],
        flops=[0, 0, 1e9, 1e6],
        splittable=[None, None, [{"dim": "batch", "size": batch}], None],
    )


def convlike(graph, batch=32):
    return graph.replace(
        splittable=[[{"dim": "batch", "size": batch}] if op == "aten.convolution" else None for op in graph.op]
    )


# ------------------------------------------------------------------ split
def test_split_slices_batch_inputs_and_broadcasts_weights():
    g = split_operation(conv_graph(), "conv", "batch", 3)
    assert g.ids == ["x", "w", "conv@split0", "conv@part0", "conv@part1", "conv@part2", "conv@concat0", "relu"]
    idx = g.index
    edges = {
        (g.ids[s], g.ids[d]): (b, t)
        for s, d, b, t in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist(), g.edge_tensor.tolist())
    }
    # 8 rows cut 3/3/2: slices of the 800-byte input, each its own tensor; the weight goes whole to every part.
    assert [edges[("conv@split0", f"conv@part{k}")] for k in range(3)] == [(300, 0), (300, 1), (200, 2)]
    assert [edges[("w", f"conv@part{k}")] for k in range(3)] == [(40, 0)] * 3
    assert edges[("x", "conv@split0")] == (800, 0) and edges[("conv@concat0", "relu")] == (400, 0)
    parts = [idx[f"conv@part{k}"] for k in range(3)]
    assert g.compute_s[parts].tolist() == [3.0, 3.0, 2.0]
    assert [g.compute_s_by_kind[p]["A100"] for p in parts] == [1.5, 1.5, 1.0]
    assert g.output_bytes[parts].tolist() == [150, 150, 100] and g.temp_bytes[parts].tolist() == [30, 30, 20]
    assert g.node_extra[parts[2]] == {"split_of": "conv", "part": 2, "parts": 3, "dim": "batch", "rows": [6, 8]}
    assert g.node_extra[idx["conv@concat0"]]["role"] == "concat" and g.compute_s[idx["conv@concat0"]] > 0
    assert g.compute_s[idx["conv@split0"]] == 0.0  # a batch slice is a view
    assert original_ids(g) == ["x", "w", "conv", "conv", "conv", "conv", "conv", "relu"]


def test_split_parts_run_in_parallel_in_the_reference_model():
    g = split_operation(conv_graph(), "conv", "batch", 2)
    device_of = [0, 0, 0, 0, 1, 0, 0]
    r = simulate(g, mesh(2), device_of)
    # Both halves (4 s each) overlap: the step takes about half the unsplit 8.5 s.
    assert 4.5 < r.makespan_s < 4.6


@pytest.mark.parametrize(
    "node, dim, parts, message",
    [
        ("nope", "batch", 2, "unknown node"),
        ("relu", "batch", 2, "cannot be split"),
        ("conv", "channel", 2, "cannot be split"),
        ("conv", "batch", 9, "between 2 and 8"),
    ],
)
def test_split_rejects_bad_requests(node, dim, parts, message):
    with pytest.raises(OptionError, match=message):
        split_operation(conv_graph(), node, dim, parts)


def channel_graph(compute=8.0, channels=5, batch=1, conv_params=10):
    """conv_graph at ``batch`` samples whose convolution may also be split along its ``channels`` output channels."""
    entries = [{"dim": "batch", "size": batch}, {"dim": "channel", "size": channels, "axis": 1, "args": [[1, 0]]}]
    return conv_graph(compute, batch).replace(
        param_bytes=[0, 40, conv_params, 0],
        splittable=[None, None, entries, None],
        node_extra=[{}, {}, {"bytes_accessed": 1240}, {}],
    )


def test_channel_split_slices_the_weight_and_sends_the_input_whole_to_every_part():
    g = split_operation(channel_graph(), "conv", "channel", 3)
    assert g.ids == ["x", "w", "conv@split1", "conv@part0", "conv@part1", "conv@part2", "conv@concat0", "relu"]
    idx = g.index
    edges = {
        (g.ids[s], g.ids[d]): (b, t)
        for s, d, b, t in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist(), g.edge_tensor.tolist())
    }
    # 5 channels cut 2/2/1: the 40-byte weight's slices 16/16/8, each its own tensor; the 800-byte input whole.
    assert [edges[("conv@split1", f"conv@part{k}")] for k in range(3)] == [(16, 0), (16, 1), (8, 2)]
    assert [edges[("x", f"conv@part{k}")] for k in range(3)] == [(800, 0)] * 3
    assert edges[("w", "conv@split1")] == (40, 0) and ("x", "conv@split0") not in edges
    # The 400-byte output's channel slices go to the concat, which hands the whole output on.
    assert [edges[(f"conv@part{k}", "conv@concat0")] for k in range(3)] == [(160, 0), (160, 0), (80, 0)]
    assert edges[("conv@concat0", "relu")] == (400, 0) and g.num_edges == 11
    parts = [idx[f"conv@part{k}"] for k in range(3)]
    assert g.compute_s[parts].tolist() == pytest.approx([3.2, 3.2, 1.6])
    assert [g.compute_s_by_kind[p]["A100"] for p in parts] == pytest.approx([1.6, 1.6, 0.8])
    assert g.flops[parts].tolist() == pytest.approx([4e8, 4e8, 2e8])
    assert g.output_bytes[parts].tolist() == [160, 160, 80] and g.temp_bytes[parts].tolist() == [32, 32, 16]
    assert g.param_bytes[parts].tolist() == [4, 4, 2]  # each part holds its own channels' weights
    # Every part reads the whole 800-byte input, and 2/5, 2/5, 1/5 of the weight and output (440 bytes).
    assert [g.node_extra[p]["bytes_accessed"] for p in parts] == [976, 976, 888]
    assert g.node_extra[parts[2]] == {
        "split_of": "conv",
        "part": 2,
        "parts": 3,
        "dim": "channel",
        "axis": 1,
        "rows": [4, 5],
        "bytes_accessed": 888,
    }
    assert g.node_extra[idx["conv@split1"]] == {
        "split_of": "conv",
        "role": "split",
        "parts": 3,
        "dim": "channel",
        "axis": 1,
        "source": "w",
        "tensor": 0,
        "args": [[1, 0]],
    }
    assert g.node_extra[idx["conv@concat0"]] == {
        "split_of": "conv",
        "role": "concat",
        "parts": 3,
        "dim": "channel",
        "axis": 1,
        "tensor": 0,
    }
    assert g.compute_s[idx["conv@split1"]] == 0.0 and g.compute_s[idx["conv@concat0"]] > 0
    assert g.output_bytes[idx["conv@concat0"]] == 400
    assert original_ids(g) == ["x", "w", "conv", "conv", "conv", "conv", "conv", "relu"]
    # Along the batch, every part keeps the op's whole parameters.
    batch = split_operation(channel_graph(batch=8), "conv", "batch", 2)
    assert batch.param_bytes[[batch.index["conv@part0"], batch.index["conv@part1"]]].tolist() == [10, 10]


def test_channel_split_parts_run_in_parallel_in_the_reference_model():
    g = split_operation(channel_graph(), "conv", "channel", 2)
    assert g.ids == ["x", "w", "conv@split1", "conv@part0", "conv@part1", "conv@concat0", "relu"]
    r = simulate(g, mesh(2), [0, 0, 0, 0, 1, 0, 0])
    # 3 and 2 channels of 5 (4.8 s and 3.2 s) overlap: the step takes about 4.8 + concat + relu of the unsplit 8.5 s.
    assert 5.3 < r.makespan_s < 5.4
    assert r.start[4] >= 800 / 1e9  # the second device waits for the whole input


@pytest.mark.parametrize(
    "node, dim, parts, message",
    [("conv", "channel", 6, "between 2 and 5"), ("conv", "batch", 2, "may be split along .'channel'.")],
)
def test_channel_split_rejects_bad_requests(node, dim, parts, message):
    with pytest.raises(OptionError, match=message):
        split_operation(channel_graph(), node, dim, parts)


def test_batch_dependence_follows_the_batch_input_not_the_weights():
    assert batch_dependent(conv_graph()).tolist() == [True, False, True, True]


# ------------------------------------------------------------------ data-parallel graph
def test_gradients_of_the_generated_training_graph_are_its_weight_gradients():
    g = training_graph(layers=3, branches=2)
    grads, optimizer = gradients(g)
    assert sorted(g.ids[u] for u, _ in grads) == sorted(i for i in g.ids if i.endswith("bwd_weight"))
    assert not optimizer.any()  # the update reads the gradient directly


def capture_small_cnn(optimizer):
    import torch
    from torch import nn

    from placer.capture import capture

    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.net(x), y)

    return capture(Model(), (torch.randn(8, 3, 8, 8), torch.randint(0, 5, (8,))), optimizer=optimizer).graph


#: Parameters of capture_small_cnn's model, in bytes: conv 3*4*9 + 4, batch norm 4 + 4, linear 144*5 + 5.
SMALL_CNN_PARAM_BYTES = 4 * (112 + 8 + 725)


@pytest.fixture(scope="module")
def captured():
    return capture_small_cnn("sgd")


def test_gradients_of_a_captured_step_are_one_per_parameter(captured):
    grads, _ = gradients(captured)
    # conv weight and bias, batch-norm weight and bias, linear weight and bias
    assert len(grads) == 6
    dp = data_parallel_graph(captured, 2)
    assert dp.graph.num_nodes > 2 * captured.num_nodes  # replicas and their all-reduce


def test_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_gradients_per_device():
    g = training_graph(layers=2, branches=1, seed=3)
    n = 4
    grads, _ = gradients(g)
    total = sum(int(g.edge_bytes[(g.src == u) & (g.edge_tensor == t)].max()) for u, t in grads)
    dp = data_parallel_graph(g, n, bucket_bytes=1 << 40, first_bucket_bytes=1 << 40)  # one bucket
    r = simulate(dp.graph, mesh(n), dp.replica)
    sent = np.bincount(r.transfers.src_device, weights=r.transfers.nbytes, minlength=n)
    chunk = -(-total // n)
    # The gradients are packed into one flat bucket; each of the 2 (n - 1) steps sends one chunk of it.
    assert sent.tolist() == [2 * (n - 1) * chunk] * n
    assert abs(2 * (n - 1) * chunk - 2 * (n - 1) / n * total) <= 2 * n


def test_a_sharded_optimizer_does_1_over_n_of_the_update_and_holds_1_over_n_of_adams_state():
    g, n = capture_small_cnn("adam"), 4
    plain, sharded = data_parallel_graph(g, n), data_parallel_graph(g, n, shard_optimizer=True)
    _, optimizer = gradients(g)
    update = [f"r0/{g.ids[i]}" for i in np.flatnonzero(optimizer)]
    assert len(update) >= 12  # Adam's arithmetic on the gradient of each of the six parameters
    for node_id in update:
        assert sharded.graph.compute_s[sharded.graph.index[node_id]] == pytest.approx(
            plain.graph.compute_s[plain.graph.index[node_id]] / n
        )
    replica0 = lambda dp: dp.replica[: dp.original.size] == 0  # noqa: E731
    held = lambda dp: int(dp.graph.param_bytes[replica0(dp)].sum())  # noqa: E731
    # Parameters, batch-norm buffers and step counters whole; Adam's two moments in quarters (each of the
    # six rounded up).
    saved = held(plain) - held(sharded)
    assert 3 * SMALL_CNN_PARAM_BYTES < held(plain) < 3 * SMALL_CNN_PARAM_BYTES + 100
    assert 0 <= 2 * SMALL_CNN_PARAM_BYTES * (n - 1) / n - saved <= 2 * 6


def test_a_sharded_optimizer_updates_between_its_reduce_scatter_and_all_gather_on_the_same_ring_traffic():
    g, n = capture_small_cnn("adam"), 4
    # one bucket
    dp = data_parallel_graph(g, n, shard_optimizer=True, bucket_bytes=1 << 40, first_bucket_bytes=1 << 40)
    grads, optimizer = gradients(g)
    result = simulate(dp.graph, mesh(n), dp.replica)
    start, finish = result.start, result.finish
    steps = [i for i, e in enumerate(dp.graph.node_extra) if e.get("replica") == 0 and "allreduce" in e]
    assert [dp.graph.op[i] for i in steps] == (
        ["bucket.pack"] + ["reduce_scatter.add"] * (n - 1) + ["shard.pack"] + ["all_gather.copy"] * (n - 1)
    )
    steps = [i for i in steps if dp.graph.op[i] in ("reduce_scatter.add", "all_gather.copy")]
    update = [dp.graph.index[f"r0/{g.ids[i]}"] for i in np.flatnonzero(optimizer)]
    assert finish[steps[n - 2]] <= start[update].min() and finish[update].max() <= start[steps[n - 1]]
    sent = np.bincount(result.transfers.src_device, weights=result.transfers.nbytes, minlength=n)
    plain_dp = data_parallel_graph(g, n, bucket_bytes=1 << 40, first_bucket_bytes=1 << 40)
    plain = simulate(plain_dp.graph, mesh(n), plain_dp.replica)
    plain_sent = np.bincount(plain.transfers.src_device, weights=plain.transfers.nbytes, minlength=n)
    # Reduce-scatter plus all-gather: 2 (n - 1) / n of the gradients, as the all-reduce, up to rounding.
    assert np.all(np.abs(sent - plain_sent) <= 2 * n * len(grads))


def one_bucket_traffic(g, cluster, collective):
    """Bytes each channel carries when the gradients of ``g`` are reduced in one bucket over ``cluster``."""
    devices = list(range(cluster.num_devices))
    dp = data_parallel_graph(
        g,
        len(devices),
        bucket_bytes=1 << 40,
        first_bucket_bytes=1 << 40,
        collective=collective,
        hosts=replica_hosts(cluster, devices),
    )
    result = simulate(dp.graph, cluster, dp.replica)
    return np.bincount(result.transfers.channel, weights=result.transfers.nbytes, minlength=len(cluster.channels))


def test_a_direct_collective_spreads_the_ring_traffic_over_every_link_of_a_mesh():
    g, n = training_graph(layers=2, branches=1, seed=3), 4
    grads, _ = gradients(g)
    sizes = [int(g.edge_bytes[(g.src == u) & (g.edge_tensor == t)].max()) for u, t in grads]
    ring, direct = (one_bucket_traffic(g, mesh(n), name) for name in ("ring", "direct"))
    assert np.count_nonzero(ring) == n and np.count_nonzero(direct) == n * (n - 1)
    # Each replica receives its quarter of the bucket from each other one, then sends its reduced quarter on.
    assert direct.tolist() == [2 * -(-sum(sizes) // n)] * (n * (n - 1))
    assert direct.sum() == ring.sum()  # the same bytes


def test_a_direct_collective_sends_the_bucket_between_hosts_once_each_way_where_the_ring_sends_it_1_75_times():
    g = training_graph(layers=2, branches=1, seed=3)
    cluster = load_cluster("2x4xV100")
    assert replica_hosts(cluster, list(range(8))) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    total = sum(int(g.edge_bytes[(g.src == u) & (g.edge_tensor == t)].max()) for u, t in gradients(g)[0])
    network = [c for c, ch in enumerate(cluster.channels) if ch.name.startswith("net:")]
    ring, direct = (one_bucket_traffic(g, cluster, name)[network] for name in ("ring", "direct"))
    assert np.allclose(ring / total, 2 * 7 / 8, rtol=1e-3) and np.allclose(direct / total, 1.0, rtol=1e-3)


@pytest.mark.parametrize(
    "collective, hosts",
    [("ring", None), ("direct", None), ("direct", [[0, 1], [2, 3]]), ("direct", [[0], [1], [2], [3]])],
)
@pytest.mark.parametrize("shard", [False, True])
def test_every_replica_updates_from_the_gradients_of_every_replica(collective, hosts, shard):
    import networkx as nx

    g, n = training_graph(layers=2, branches=2, seed=1), 4
    grads, _ = gradients(g)
    dp = data_parallel_graph(g, n, shard_optimizer=shard, collective=collective, hosts=hosts, bucket_bytes=1 << 20)
    assert len({e["allreduce"]["bucket"] for e in dp.graph.node_extra if "allreduce" in e}) > 1
    nxg = dp.graph.to_networkx()
    readers = [(u, int(w)) for u, t in grads for w in g.dst[(g.src == u) & (g.edge_tensor == t)]]
    assert len(readers) >= len(grads) == 4
    for k in range(n):
        for u, w in readers:  # what reads a gradient reads the sum of every replica's
            before = nx.ancestors(nxg, f"r{k}/{g.ids[w]}")
            assert all(f"r{j}/{g.ids[u]}" in before for j in range(n))


def test_an_unknown_collective_or_uneven_hosts_are_refused():
    g = training_graph(layers=2, branches=1)
    with pytest.raises(OptionError, match="collective"):
        place(g, load_cluster("4xV100-nvlink"), "data_parallel", collective="tree")
    with pytest.raises(OptionError, match="hosts"):
        data_parallel_graph(g, 4, collective="direct", hosts=[[0, 1, 2], [3]])


def test_the_best_collective_is_the_faster_of_the_ring_and_the_direct_one():
    g, cluster = training_graph(layers=3, branches=2, param_mib=64), load_cluster("8xV100-nvlink")
    spans = {
        name: place(g, cluster, "sharded_data_parallel", collective=name).predicted["makespan_s"]
        for name in ("ring", "direct", "best")
    }
    assert spans["direct"] < spans["ring"] and spans["best"] == spans["direct"]


def test_strong_scaling_halves_the_batch_work_of_each_replica_but_not_the_update():
    g = training_graph(layers=2, branches=2)
    dp = data_parallel_graph(g, 2)
    grads, _ = gradients(g)
    # Every replica updates whole parameters, though the update depends on the batch through the gradient.
    scaled = batch_dependent(g) & ~np.array([i.endswith(".update") for i in g.ids])
    for i in range(g.num_nodes):
        k = dp.graph.index[f"r1/{g.ids[i]}"]
        expected = g.compute_s[i] / 2 if scaled[i] else g.compute_s[i]
        assert dp.graph.compute_s[k] == pytest.approx(expected)
        assert dp.graph.param_bytes[k] == g.param_bytes[i]
    one = data_parallel_graph(g, 1)
    assert one.graph.num_nodes == g.num_nodes and np.allclose(one.graph.compute_s, g.compute_s)


# ------------------------------------------------------------------ data_parallel
def test_data_parallel_plan_carries_the_replicated_graph_and_predicts_the_simulation():
    g = training_graph(layers=3, branches=2)
    cluster = load_cluster("4xV100-nvlink")
    plan = place(g, cluster, "data_parallel")
    assert plan.extra["replicas"] == 4 and plan.rewritten_graph is not None
    result = validate(plan, g, cluster)
    assert result.makespan_s == plan.predicted["makespan_s"]
    assert {plan.placement[f"r{k}/loss"] for k in range(4)} == {"gpu0", "gpu1", "gpu2", "gpu3"}


@pytest.mark.parametrize("algorithm", ["data_parallel", "sharded_data_parallel"])
def test_data_parallel_names_the_link_its_collective_lacks(algorithm):
    # g0 - g1 - g2 in a line: neither collective can close. It named an internal node
    # ('r2/allreduce0.step0') of a graph the user never sees.
    names = ["g0", "g1", "g2"]
    channels = [
        Channel(f"{a}->{b}", 2.5e10, 1e-5, ((a, b),))
        for a, b in [("g0", "g1"), ("g1", "g0"), ("g1", "g2"), ("g2", "g1")]
    ]
    line = Cluster("line", [Device(n, "V100", 700 << 20) for n in names], channels)
    with pytest.raises(
        InfeasibleError,
        match=f"^{algorithm}: the ring all-reduce sends from 'g2' to 'g0', which no "
        f"channel connects; the direct all-reduce sends from 'g2' to 'g0'",
    ):
        place(training_graph(layers=4, branches=2), line, algorithm, collective="best")
    ring = Cluster("ring", line.devices, channels + [Channel("g2->g0", 2.5e10, 1e-5, (("g2", "g0"),))])
    assert place(training_graph(layers=4, branches=2), ring, algorithm, collective="ring").predicted["fits"]


def test_data_parallel_is_refused_when_a_replica_does_not_fit():
    g = training_graph(layers=6, branches=2, param_mib=1500, activation_mib=100, seed=5)
    with pytest.raises(InfeasibleError, match="does not fit one device"):
        place(g, load_cluster("4xV100-nvlink"), "data_parallel")


@pytest.mark.parametrize("algorithm", ["data_parallel", "sharded_data_parallel"])
def test_data_parallel_is_refused_when_the_batch_has_fewer_samples_than_devices(algorithm):
    # A batch of 2 (the rows of the first matrix operation) shared by 4 replicas made each run half a sample.
    g = training_graph(layers=2, branches=1)
    g = g.replace(splittable=[[{"dim": "batch", "size": 2}] if k == 3 else None for k in range(g.num_nodes)])
    with pytest.raises(InfeasibleError, match=f"{algorithm}: the batch has 2 samples, fewer than the 4 replicas"):
        place(g, load_cluster("4xV100-nvlink"), algorithm)
    assert place(g, load_cluster("2xV100-nvlink"), algorithm).predicted["fits"]


def test_data_parallel_counts_the_samples_a_capture_records_not_the_rows_of_attention():
    import torch

    from placer.capture import capture

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(x).view(-1, 4, 3, 4, 2).permute(2, 0, 3, 1, 4).reshape(3, -1, 4, 2).unbind(0)
            return torch.softmax(q @ k.transpose(1, 2), -1).bmm(v).pow(2).mean()

    # One sample, four heads: attention's bmm has 4 rows, which passed for 4 samples.
    graph = capture(Attention(), (torch.randn(1, 4, 8),), optimizer="sgd").graph
    assert graph.extra["batch_size"] == 1 and max(s[0]["size"] for s in graph.splittable if s) >= 4
    for algorithm in ("data_parallel", "sharded_data_parallel"):
        with pytest.raises(InfeasibleError, match="the batch has 1 sample, fewer than the 2 replicas"):
            place(graph, load_cluster("2xV100-nvlink"), algorithm)


def test_a_batch_that_does_not_divide_gives_the_first_replicas_a_sample_more():
    from placer.capture import capture_spec

    # 5 samples over 4 replicas: 2, 1, 1, 1 (each replica was costed at 5/4 samples).
    graph = capture_spec("zoo:lenet", 5, optimizer="sgd").graph
    dp = data_parallel_graph(graph, 4).graph
    conv = next(i for i, s in enumerate(graph.splittable) if s)
    for k, samples in enumerate([2, 1, 1, 1]):
        v = dp.index[f"r{k}/{graph.ids[conv]}"]
        assert dp.compute_s[v] == pytest.approx(graph.compute_s[conv] * samples / 5)
        assert dp.splittable[v][0]["size"] == graph.splittable[conv][0]["size"] // 5 * samples
    plan = place(graph, load_cluster("4xcpu"), "data_parallel")
    first = plan.rewritten_graph.index[f"r0/{graph.ids[conv]}"]
    assert plan.rewritten_graph.compute_s[first] == pytest.approx(graph.compute_s[conv] * 2 / 5)


def test_data_parallel_leaves_out_devices_of_a_forbidden_kind():
    g = training_graph(layers=2, branches=1)
    g = g.replace(device_kinds=[("V100",)] * g.num_nodes)
    devices = [Device("v0", "V100", 16 * GiB), Device("a0", "A100", 40 * GiB), Device("v1", "V100", 16 * GiB)]
    names = [d.name for d in devices]
    cluster = Cluster(
        "mixed", devices, [Channel(f"{a}->{b}", 1e10, 1e-5, ((a, b),)) for a in names for b in names if a != b]
    )
    dp, device_of, _ = data_parallel_schedule(g, cluster)
    assert sorted(set(device_of.tolist())) == [0, 2]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.integers(1, 5),
    branches=st.integers(1, 3),
    seed=st.integers(0, 50),
    param_mib=st.sampled_from([0.5, 16.0, 400.0]),
    cluster=st.sampled_from(sorted(PRESETS)),
    shard=st.booleans(),
    collective=st.sampled_from(["ring", "direct"]),
)
def test_data_parallel_lower_bound_is_the_busiest_device_or_channel_of_its_plan(
    layers, branches, seed, param_mib, cluster, shard, collective
):
    """The bound needs no replicated graph, yet equals what the plan's simulation keeps busiest."""
    g = training_graph(layers=layers, branches=branches, seed=seed, param_mib=param_mib)
    c = load_cluster(cluster)
    bound = data_parallel_lower_bound(g, c, shard_optimizer=shard, collective=collective)
    devices = replica_devices(g, c)  # memory aside: a replica of 400 MiB layers overflows the CPUs
    dp = data_parallel_graph(
        g, len(devices), shard_optimizer=shard, collective=collective, hosts=replica_hosts(c, devices)
    )
    device_of = np.asarray(devices)[dp.replica]
    result = simulate(dp.graph, c, device_of, check=False)
    busy = np.bincount(device_of, weights=result.finish - result.start, minlength=c.num_devices)
    xf = result.transfers
    channel_busy = np.bincount(xf.channel, weights=xf.end - xf.start, minlength=len(c.channels))
    assert bound <= result.makespan_s * (1 + 1e-12)
    assert bound >= max(busy.max(), channel_busy.max()) * (1 - 1e-12)


def test_data_parallel_lower_bound_is_infinite_where_no_device_may_hold_a_replica():
    g = training_graph(layers=2, branches=1)
    g = g.replace(device_kinds=[("V100",)] * (g.num_nodes - 1) + [("A100",)])
    assert data_parallel_lower_bound(g, load_cluster("2xV100-nvlink")) == float("inf")


# ------------------------------------------------------------------ os_dpos
@pytest.mark.parametrize("devices, parts", [(2, 2), (4, 4)])
def test_os_dpos_splits_a_heavy_operation_across_the_devices(devices, parts):
    g = conv_graph()
    cluster = mesh(devices)
    dpos = place(g, cluster, "dpos")
    plan = place(g, cluster, "os_dpos", data_parallel_start=False)
    assert plan.splits == [{"node": "conv", "dim": "batch", "parts": parts}]
    assert plan.predicted["makespan_s"] < dpos.predicted["makespan_s"] * 0.6
    target = plan.rewritten_graph
    assert {plan.placement[f"conv@part{k}"] for k in range(parts)} == {d.name for d in cluster.devices}
    assert validate(plan, g, cluster).makespan_s == plan.predicted["makespan_s"]
    assert target.node_extra[target.index["conv@part0"]]["split_of"] == "conv"


def test_os_dpos_keeps_nothing_that_does_not_help():
    # Transfers far slower than the op: no split pays off, the plan is DPOS's.
    g = conv_graph(compute=1e-3)
    cluster = mesh(2, bandwidth=1e3)
    plan = place(g, cluster, "os_dpos", data_parallel_start=False)
    assert plan.splits == [] and plan.rewritten_graph is None
    assert plan.predicted["makespan_s"] == place(g, cluster, "dpos").predicted["makespan_s"]


@pytest.mark.parametrize("cluster", ["2xV100-nvlink", "4xV100-nvlink"])
def test_os_dpos_is_never_slower_than_dpos_or_data_parallel(cluster):
    g = convlike(training_graph(layers=4, branches=2, seed=2))
    c = load_cluster(cluster)
    best = min(place(g, c, name).predicted["makespan_s"] for name in ("dpos", "data_parallel", "sharded_data_parallel"))
    assert place(g, c, "os_dpos", time_limit=20).predicted["makespan_s"] <= best


def test_os_dpos_starts_from_each_parameter_updated_once_where_that_beats_replicated_updates():
    # LeNet with Adam over 2 V100s: replicas that each update every parameter lose to updating each
    # parameter once (the sharded start), and OS-DPOS's split of a convolution goes further still.
    from placer.capture import capture_spec
    from placer.cost.analytic import annotate

    g = annotate(capture_spec("zoo:lenet", 256, optimizer="adam", fake=True).graph)
    c = load_cluster("2xV100-nvlink")
    replicated, sharded = (
        place(g, c, name).predicted["makespan_s"] for name in ("data_parallel", "sharded_data_parallel")
    )
    plan = place(g, c, "os_dpos", time_limit=20)
    assert plan.rewritten_graph.extra["data_parallel"]["sharded_optimizer"] and plan.splits
    assert plan.predicted["makespan_s"] < sharded < replicated


def test_os_dpos_starts_from_data_parallelism_when_dpos_on_the_replicas_runs_out_of_time(monkeypatch):
    # DPOS on the replicated graph never ends here: OS-DPOS stops it at its deadline and starts
    # from data parallelism's own plan instead of ending with no plan.
    import time

    from placer.algorithms import fastt

    g = convlike(training_graph(layers=4, branches=2, seed=2))
    c = load_cluster("2xV100-nvlink")
    plain_dpos = fastt._dpos_fitting

    def stuck_on_replicas(graph, cluster, fixed=None):
        while "data_parallel" in graph.extra:
            time.sleep(0.01)
        return plain_dpos(graph, cluster, fixed)

    monkeypatch.setattr(fastt, "_dpos_fitting", stuck_on_replicas)
    plan = place(g, c, "os_dpos", time_limit=2)
    best = min(place(g, c, name).predicted["makespan_s"] for name in ("dpos", "data_parallel"))
    assert plan.predicted["makespan_s"] <= best


def test_os_dpos_starts_from_data_parallelism_when_dpos_on_the_model_runs_out_of_time(monkeypatch):
    # DPOS on the model's own graph never ends here: with data parallelism's start in hand, OS-DPOS
    # stops it at its deadline (before placer's check) rather than run past its time limit.
    import time

    from placer.algorithms import fastt

    g = convlike(training_graph(layers=4, branches=2, seed=2))
    c = load_cluster("2xV100-nvlink")
    plain_dpos = fastt._dpos_fitting

    def stuck_on_the_model(graph, cluster, fixed=None):
        while "data_parallel" not in graph.extra:
            time.sleep(0.01)
        return plain_dpos(graph, cluster, fixed)

    monkeypatch.setattr(fastt, "_dpos_fitting", stuck_on_the_model)
    plan = place(g, c, "os_dpos", time_limit=2)
    assert plan.predicted["makespan_s"] <= place(g, c, "data_parallel").predicted["makespan_s"]


def test_os_dpos_keeps_its_plan_when_the_first_trial_split_runs_out_of_time(monkeypatch):
    import time

    from placer.algorithms import fastt

    g, cluster = conv_graph(), mesh(2)
    plain_dpos = fastt._dpos_fitting

    def stuck_on_splits(graph, cluster, fixed=None):
        while any("@split" in i for i in graph.ids):
            time.sleep(0.01)
        return plain_dpos(graph, cluster, fixed)

    monkeypatch.setattr(fastt, "_dpos_fitting", stuck_on_splits)
    plan = place(g, cluster, "os_dpos", data_parallel_start=False, time_limit=1)
    assert plan.splits == [] and plan.predicted["makespan_s"] == place(g, cluster, "dpos").predicted["makespan_s"]


def test_os_dpos_keeps_time_to_check_a_plan_of_its_data_parallel_start(monkeypatch):
    # A plan of the replicated graph takes placer a few simulations to check (0.33 s at 2 s on the
    # demo's graph): OS-DPOS times the simulation of its data-parallel start and keeps
    # CHECK_SIMULATIONS of those out of its search.
    import time

    from placer.algorithms import fastt

    g, cluster = conv_graph(), mesh(2)
    plain_simulate, plain_start = fastt.simulate, fastt._start

    def slow_simulate(*args, **kwargs):
        time.sleep(0.1)
        return plain_simulate(*args, **kwargs)

    monkeypatch.setattr(fastt, "simulate", slow_simulate)
    assert fastt._start(g, cluster, data_parallel_start=True)[2] >= fastt.CHECK_SIMULATIONS * 0.1
    assert fastt._start(g, cluster, data_parallel_start=False)[2] == 0.0
    monkeypatch.setattr(fastt, "simulate", plain_simulate)
    # The reserve comes out of the search: one longer than the limit leaves no time for a split.
    monkeypatch.setattr(fastt, "_start", lambda *args: (*plain_start(*args)[:2], 1e6))
    assert place(g, cluster, "os_dpos", data_parallel_start=False, time_limit=5).splits == []


@pytest.mark.parametrize("devices", [2, 4])
def test_os_dpos_splits_a_convolution_at_batch_1_along_its_channels(devices):
    g = channel_graph(channels=8).replace(extra={"batch_size": 1})
    cluster = mesh(devices)
    dpos = place(g, cluster, "dpos")
    for start in (False, True):  # at one sample, data parallelism has nothing to split either
        plan = place(g, cluster, "os_dpos", data_parallel_start=start)
        assert plan.splits == [{"node": "conv", "dim": "channel", "parts": devices}]
        assert plan.predicted["makespan_s"] < dpos.predicted["makespan_s"] * 0.6
        assert {plan.placement[f"conv@part{k}"] for k in range(devices)} == {d.name for d in cluster.devices}
        # The plan's makespan is the reference simulation's of its rewritten graph.
        assert validate(plan, g, cluster).makespan_s == plan.predicted["makespan_s"]
        bound = plan.bind(g, cluster)
        assert bound.graph is plan.rewritten_graph
        assert simulate(bound.graph, cluster, bound.device_of, bound.order).makespan_s == plan.predicted["makespan_s"]


def test_os_dpos_keeps_no_channel_split_that_does_not_help():
    g = channel_graph(compute=1e-3)
    cluster = mesh(2, bandwidth=1e3)
    plan = place(g, cluster, "os_dpos", data_parallel_start=False)
    assert plan.splits == [] and plan.rewritten_graph is None


def test_os_dpos_rejects_a_bad_max_parts():
    with pytest.raises(OptionError, match="max_parts"):
        place(conv_graph(), mesh(2), "os_dpos", max_parts=1)


def test_a_matmul_whose_inputs_have_a_weights_size_produces_the_gradient():
    # 16 rows of 16 features: the activations and the output gradient have the weight's size
    # (BERT-large at batch 16 x 64 tokens, hidden 1024, is this case). The walk from Adam's state
    # write stops at the matmul that made the gradient; before, it went on into the backward and
    # forward passes and the data-parallel graph had a cycle.
    import torch
    from torch import nn

    from placer.capture import capture

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x, y):
            return nn.functional.mse_loss(self.b(torch.relu(self.a(x))), y)

    g = capture(Model(), (torch.randn(16, 16), torch.randn(16, 16)), optimizer="adam").graph
    grads, optimizer = gradients(g)
    assert len(grads) == 4
    assert not any(g.op[i] in ("aten.mm", "aten.addmm") for i in np.flatnonzero(optimizer))
    dp = data_parallel_graph(g, 2)
    assert dp.graph.num_nodes > 2 * g.num_nodes


@pytest.mark.parametrize("algorithm", ["data_parallel", "sharded_data_parallel"])
def test_a_replicated_plan_reports_the_bound_that_holds_for_it(algorithm):
    # Light weights, a chain of layers: the replicas on a quarter of the batch each beat the graph's own
    # critical path, so only the work term bounds them (a bound above the makespan would be no bound).
    from placer.sim.bounds import lower_bound

    graph, cluster = training_graph(layers=6, branches=1, param_mib=0.01), load_cluster("4xV100-nvlink")
    plan = place(graph, cluster, algorithm)
    assert plan.predicted["makespan_s"] < lower_bound(graph, cluster)
    assert plan.predicted["lower_bound_s"] == lower_bound(graph, cluster, splits=True) <= plan.predicted["makespan_s"]
    assert place(graph, cluster, "expert").predicted["lower_bound_s"] == lower_bound(graph, cluster)


def chained_update_graph():
    """Two parameter groups whose first update (u1) feeds the second's gradient (g2), as in a step that
    applies one layer's new weights before computing the next layer's gradient."""
    MiB = 1 << 20
    ids = ["x", "f1", "g1", "u1", "f2", "g2", "u2"]
    ops = ["placeholder", "aten.mm", "aten.mm", "aten._foreach_add", "aten.mm", "aten.mm", "aten._foreach_add"]
    edges = [
        ("x", "f1", 16),
        ("x", "g1", 16),
        ("g1", "u1", 8),
        ("f1", "g1", 16),
        ("x", "g2", 16),
        ("u1", "g2", 8),
        ("f2", "g2", 16),
        ("x", "f2", 16),
        ("g2", "u2", 8),
    ]
    ix = {k: i for i, k in enumerate(ids)}
    return OpGraph(
        ids,
        [1e-3] * 7,
        [ix[a] for a, _, _ in edges],
        [ix[b] for _, b, _ in edges],
        [n * MiB for *_, n in edges],
        op=ops,
        colocation=[None, "A", None, "A", "B", None, "B"],
        param_bytes=[0, 8 * MiB, 0, 0, 8 * MiB, 0, 0],
        output_bytes=[m * MiB for m in (16, 16, 8, 8, 16, 8, 8)],
    )


@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.parametrize("collective", ["ring", "direct"])
def test_a_gradient_that_follows_another_groups_update_is_reduced_in_a_later_bucket(shard, collective):
    # g1 and g2 fit one 25 MiB bucket, but g2 is computed after u1, which reads the reduced g1: one
    # bucket would wait on its own reader (a cycle). g2 starts a bucket of its own.
    g = chained_update_graph()
    layout = replica_layout(g, 2, shard_optimizer=shard)
    assert [[g.ids[u] for u, _ in bucket] for bucket in layout.buckets] == [["g1"], ["g2"]]
    dp = data_parallel_graph(g, 2, shard_optimizer=shard, collective=collective)
    assert len(dp.graph.topological_order) == dp.graph.num_nodes  # acyclic
    idx = dp.graph.index
    # Every replica's u1 reads the reduced first bucket, and the second bucket packs g2 after it.
    for k in range(2):
        readers = {dp.graph.ids[int(s)] for s in dp.graph.src[dp.graph.dst == idx[f"r{k}/u1"]]}
        assert all(dp.graph.node_extra[idx[s]]["allreduce"]["bucket"] == 0 for s in readers)
        assert dp.graph.node_extra[idx[f"r{k}/allreduce1.step0"]]["allreduce"]["gradients"] == ["g2"]


@pytest.mark.parametrize("algorithm", ["data_parallel", "sharded_data_parallel", "os_dpos"])
def test_replicating_a_step_whose_update_feeds_another_gradient_places_it(algorithm):
    g, c = chained_update_graph(), load_cluster("2xV100-nvlink")
    plan = place(g, c, algorithm, **({"time_limit": 10} if algorithm == "os_dpos" else {}))
    assert plan.predicted["makespan_s"] > 0
    if algorithm != "os_dpos":
        assert plan.extra["replicas"] == 2 and plan.rewritten_graph.extra["data_parallel"]["buckets"] == 2


def test_the_all_reduce_steps_ids_never_collide_with_the_graphs_own():
    g = training_graph(layers=2, branches=2, seed=1)
    ids = list(g.ids)
    ids[ids.index("loss")] = "allreduce0.step0"
    g = g.replace(ids=ids)
    dp = data_parallel_graph(g, 2)
    assert len(set(dp.graph.ids)) == dp.graph.num_nodes
    idx = dp.graph.index
    # The graph's node keeps its replica's id; the generated step takes the next free one.
    assert dp.graph.node_extra[idx["r0/allreduce0.step0"]]["replica_of"] == "allreduce0.step0"
    assert dp.graph.node_extra[idx["r0/allreduce0.step0~1"]]["allreduce"]["step"] == 0
    for algorithm in ("data_parallel", "sharded_data_parallel"):
        plan = place(g, load_cluster("2xV100-nvlink"), algorithm)
        assert plan.extra["replicas"] == 2


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_split_parts_share_bytes_in_whole_bytes_that_add_up(parts):
    graph = OpGraph(
        ["x", "conv", "y"],
        [0.0, 4.0, 1.0],
        [0, 1],
        [1, 2],
        [5, 3],
        op=["placeholder", "aten.convolution", "aten.relu"],
        output_bytes=[5, 3, 3],
        temp_bytes=[0, 5, 0],
        splittable=[None, [{"dim": "batch", "size": 4}], None],
    )
    split = split_operation(graph, "conv", "batch", parts)
    part = [i for i, extra in enumerate(split.node_extra) if "part" in extra]
    assert split.output_bytes[part].sum() == 3 and split.temp_bytes[part].sum() == 5
    slices = [e for e in range(split.num_edges) if split.ids[split.src[e]] == "conv@split0"]
    pieces = [e for e in range(split.num_edges) if split.ids[split.dst[e]] == "conv@concat0"]
    assert split.edge_bytes[slices].sum() == 5 and split.edge_bytes[pieces].sum() == 3


def test_a_plan_with_splits_and_no_rewritten_graph_places_the_graph_its_splits_make():
    # FORMATS: the placement maps the rewritten graph's nodes when splits were applied. Without a
    # rewritten graph the splits were ignored (the original graph simulated); a rewritten graph that does
    # not hold the splits listed was accepted.
    from placer import Plan
    from placer.errors import InvalidPlanError

    g = OpGraph(
        ["x", "conv", "y"],
        [0.0, 4.0, 1.0],
        [0, 1],
        [1, 2],
        [64, 32],
        op=["placeholder", "aten.convolution", "aten.relu"],
        output_bytes=[64, 32, 32],
        splittable=[None, [{"dim": "batch", "size": 8}], None],
    )
    cluster = load_cluster("2xV100-nvlink")
    rewritten = split_operation(g, "conv", "batch", 2)
    device_of = [0, 0, 0, 1, 0, 0]  # x, conv@split0, conv@part0, conv@part1, conv@concat0, y
    carried = Plan.from_arrays(
        g, cluster, np.array(device_of), placed_graph=rewritten, splits=[{"node": "conv", "dim": "batch", "parts": 2}]
    )
    doc = carried.to_dict()
    doc["rewritten_graph"] = None
    made = validate(Plan.from_dict(doc), g, cluster)
    assert made.makespan_s == validate(carried, g, cluster).makespan_s < simulate(g, cluster, [0, 0, 0]).makespan_s
    doc["splits"] = [{"node": "y", "dim": "batch", "parts": 2}]
    with pytest.raises(InvalidPlanError, match=r"splits\[0\]: node 'y' cannot be split along 'batch'"):
        validate(Plan.from_dict(doc), g, cluster)
    doc["splits"] = [{"node": "conv", "dim": "batch", "parts": 2}] * 2
    with pytest.raises(InvalidPlanError, match=r"^splits\[1\] splits 'conv' again \(splits\[0\] did\)$"):
        validate(Plan.from_dict(doc), g, cluster)
    # A placement of the graph before its splits: the message says what to name instead.
    doc = {
        **carried.to_dict(),
        "rewritten_graph": None,
        "order": None,
        "placement": {"x": "gpu0", "conv": "gpu1", "y": "gpu0"},
    }
    with pytest.raises(
        InvalidPlanError,
        match=r"^the plan places unknown node 'conv': splits\[0\] rewrites 'conv' "
        r"into 'conv@split0', 'conv@part0', 'conv@part1', 'conv@concat0', "
        r"which the placement names instead$",
    ):
        validate(Plan.from_dict(doc), g, cluster)
    doc = carried.to_dict()
    doc["splits"][0]["parts"] = 3
    with pytest.raises(
        InvalidPlanError,
        match=r"splits\[0\] \('conv' along 'batch' into 3 parts\) is not what the "
        r"plan's rewritten graph holds \(2 parts of it along \['batch'\]\)",
    ):
        validate(Plan.from_dict(doc), g, cluster)


def test_a_source_that_declares_a_batch_split_carries_the_batch():
    # A hand-written graph whose only source holds parameters: nothing was batch-dependent, so every
    # replica ran the whole batch (data parallelism over 3 devices costed three whole steps).
    g = OpGraph(
        ["x", "y", "z"],
        [0.004, 0.008, 0.002],
        [0, 1],
        [1, 2],
        [4000, 4000],
        output_bytes=[4000, 4000, 400],
        param_bytes=[100, 200, 0],
        splittable=[[{"dim": "batch", "size": 8}], None, None],
    )
    assert batch_dependent(g).tolist() == [True, True, True]
    cluster = load_cluster("2xV100-nvlink")
    halves = place(g, cluster, "data_parallel").rewritten_graph
    assert np.isclose(halves.compute_s[halves.index["r0/x"]], 0.002)


def _calibrated_cpus(ranks: int, all_reduce_bw: float, all_gather_bw: float) -> Cluster:
    """``{ranks}xcpu`` with its gloo link and collectives as a calibration measured them."""
    from placer.harness.calibrate import Calibration, LinkFit, apply_calibration

    calibration = Calibration(
        {"gloo": LinkFit(2e-5, 4e9, 1.0)},
        {"backend": "gloo", "ranks": ranks},
        collectives={"all_reduce": LinkFit(1e-4, all_reduce_bw, 1.0), "all_gather": LinkFit(1e-4, all_gather_bw, 1.0)},
    )
    return apply_calibration(load_cluster(f"{ranks}xcpu"), calibration)


@pytest.mark.parametrize("shard", [False, True])
def test_a_calibrated_collective_takes_at_least_its_measured_time_in_the_plan(shard):
    # gloo's all-reduce of a bucket took far longer than its ring's messages over the link would: the plan's
    # steps of each bucket take what the measured call exceeds them by, so the bucket takes the measured time.
    g = training_graph(layers=3, branches=2)
    cluster = _calibrated_cpus(2, 0.5e9, 0.25e9)
    dp = data_parallel_graph(g, 2, shard_optimizer=shard, collective_cost=collective_cost(cluster, [0, 1]))
    plain = data_parallel_graph(g, 2, shard_optimizer=shard)
    layout = replica_layout(g, 2, shard_optimizer=shard)
    assert dp.graph.extra["data_parallel"]["collective_cost"]["link"] == {
        "latency_s": 2e-5,
        "bandwidth_bytes_per_s": 4e9,
    }
    for b in range(len(layout.buckets)):
        steps = [
            i
            for i, extra in enumerate(dp.graph.node_extra)
            if extra.get("replica") == 0 and (extra.get("allreduce") or {}).get("bucket") == b
        ]
        added = sum(dp.graph.compute_s[i] - plain.graph.compute_s[i] for i in steps)
        size = layout.bucket_bytes(b)
        measured = 1e-4 + size / 0.5e9 + (1e-4 + size / 0.25e9 if shard else 0.0)
        messages = 2 * (2e-5 + size / 2 / 4e9)  # one chunk each way, half the bucket each
        assert added == pytest.approx(measured - messages, rel=1e-6)
    plan = place(g, cluster, "sharded_data_parallel" if shard else "data_parallel")
    assert plan.rewritten_graph.digest() == dp.graph.digest()
    assert validate(plan, g, cluster).makespan_s == plan.predicted["makespan_s"]  # the check rebuilds it


def test_a_slow_calibrated_all_gather_makes_the_sharded_optimizer_lose():
    # Over gloo a sharded optimizer's all-gather is a second collective as slow as the all-reduce: once the
    # plans know it, sharding the optimizer's update looks slower than it does on the link's figures alone.
    g = training_graph(layers=3, branches=2)

    def sharding_costs(cluster: Cluster) -> float:
        step = {a: place(g, cluster, a).predicted["makespan_s"] for a in ("data_parallel", "sharded_data_parallel")}
        return step["sharded_data_parallel"] - step["data_parallel"]

    calibrated = _calibrated_cpus(2, 1.2e9, 0.8e9)
    assert sharding_costs(calibrated) > max(0.0, sharding_costs(load_cluster("2xcpu")))
    assert collective_cost(load_cluster("2xcpu"), [0, 1]) is None


def test_micro_batches_replicas_and_split_parts_pay_a_nodes_fixed_time_whole():
    # Every node 4 ms on a V100, 1 ms of it fixed: a part doing a share f of the work takes 1 + 3 f ms.
    from placer.transform.base import part_times
    from placer.transform.microbatch import microbatch_graph

    graph = training_graph(layers=2, branches=1, batch=8)
    graph = graph.replace(
        extra={"batch_size": 8},
        compute_s_by_kind=[{"V100": 4e-3} for _ in graph.ids],
        node_extra=[{**extra, "fixed_s": {"V100": 1e-3}} for extra in graph.node_extra],
        splittable=[[{"dim": "batch", "size": 8}] if x.endswith(".fwd") else None for x in graph.ids],
    )

    def seconds(g, node):
        return g.compute_s_by_kind[g.index[node]]["V100"]

    micro = microbatch_graph(graph, 4).graph
    for k in range(4):
        assert seconds(micro, f"mb{k}/block0.b0.fwd") == pytest.approx(1e-3 + 3e-3 / 4)

    replicated = data_parallel_graph(graph, 2).graph
    assert seconds(replicated, "r0/block1.b0.fwd") == seconds(replicated, "r1/block1.b0.fwd") == pytest.approx(2.5e-3)

    split = split_operation(graph, "block0.b0.fwd", "batch", 2)
    parts = [x for x in split.ids if x.startswith("block0.b0.fwd@part")]
    assert len(parts) == 2 and all(seconds(split, x) == pytest.approx(2.5e-3) for x in parts)
    # Without a fixed part, the parts share the time exactly.
    assert part_times({"V100": 4e-3}, None, 0.25) == {"V100": 1e-3}
