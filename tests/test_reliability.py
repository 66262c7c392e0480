"""Bad input and impossible problems fail loudly and cleanly; interruptions keep the best plan."""

import json

import numpy as np
import pytest

from placer import load_cluster, place
from placer.algorithms import auto as auto_module
from placer.algorithms import available_algorithms
from placer.api import validate
from placer.cli import main
from placer.errors import InfeasibleError
from placer.generate import training_graph

from .clusters import line_cluster

GIB = 1 << 30


def _graph_doc(**node_changes):
    doc = training_graph(layers=2, branches=2, seed=0).to_dict()
    doc["nodes"][1].update(node_changes)
    return doc


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


CLUSTER = load_cluster("2xV100-nvlink").to_dict()
BAD_GRAPHS = {
    "invalid JSON": ("{nodes: [", "invalid JSON at line 1"),
    "empty file": ("", "the file is empty"),
    "wrong format tag": ({"format": "placer.cluster/1", "nodes": []}, "'format' is 'placer.cluster/1'"),
    "missing format tag": ({"nodes": []}, "missing field 'format'"),
    "wrongly typed field": (_graph_doc(compute_s="1.0"), "field 'compute_s' must be a number"),
    "NaN cost": (
        json.dumps(_graph_doc()).replace('"compute_s": 0.', '"compute_s": NaN, "x": 0.', 1),
        "NaN is not a valid number",
    ),
    "infinite cost": (
        json.dumps(_graph_doc()).replace('"compute_s": 0.', '"compute_s": Infinity, "x": 0.', 1),
        "Infinity is not a valid number",
    ),
    "negative size": (_graph_doc(output_bytes=-1), "field 'output_bytes' must be >= 0"),
    "duplicate ids": (
        {**_graph_doc(), "nodes": _graph_doc()["nodes"] + [_graph_doc()["nodes"][0]]},
        "duplicate node id 'input'",
    ),
    "edge to unknown node": (
        {**_graph_doc(), "edges": [{"src": "input", "dst": "ghost", "bytes": 1}]},
        "unknown node 'ghost'",
    ),
    "cycle": (
        {**_graph_doc(), "edges": _graph_doc()["edges"] + [{"src": "loss", "dst": "input", "bytes": 1}]},
        "contain a cycle",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_bad_graph_files(tmp_path, capsys, case):
    content, message = BAD_GRAPHS[case]
    graph = _write(tmp_path, "g.json", content)
    out = tmp_path / "plan.json"
    assert main(["plan", str(graph), "--cluster", "2xV100-nvlink", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placer: error: graph file") or err.startswith("placer: error: graph "), err
    assert str(graph) in err and message in err and err.count("\n") == 1
    assert not out.exists()


def _cluster(mutate):
    doc = json.loads(json.dumps(CLUSTER))
    mutate(doc)
    return doc


BAD_CLUSTERS = {
    "device with no memory": (
        _cluster(lambda d: d["devices"][0].update(memory_bytes=0)),
        "device 'gpu0': field 'memory_bytes' must be >= 1",
    ),
    "channel with no bandwidth": (
        _cluster(lambda d: d["channels"][0].update(bandwidth_bytes_per_s=0)),
        "field 'bandwidth_bytes_per_s' must be > 0",
    ),
    "channel naming unknown device": (
        _cluster(lambda d: d["channels"][0].update(pairs=[["gpu0", "tpu"]])),
        "unknown device 'tpu'",
    ),
    "missing devices": (_cluster(lambda d: d.pop("devices")), "missing required field 'devices'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CLUSTERS))
def test_bad_cluster_files(tmp_path, capsys, case):
    content, message = BAD_CLUSTERS[case]
    graph = _write(tmp_path, "g.json", _graph_doc())
    cluster = _write(tmp_path, "c.json", content)
    out = tmp_path / "plan.json"
    assert main(["plan", str(graph), "--cluster", str(cluster), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(cluster) in err and message in err and err.count("\n") == 1
    assert not out.exists()


IMPOSSIBLE = {
    "node larger than every device": (
        dict(param_bytes=20 * GIB),
        "node 'block0.b0.fwd' needs 20.008 GiB, more than any device",
    ),
    "device kind nobody has": (dict(device_kinds=["TPUv4"]), "may run only on kinds ['TPUv4']"),
    "colocation group larger than every device": (None, "colocation group 'big' needs at least"),
    "graph larger than the cluster": (None, "the parameters alone need"),
    "activations larger than the cluster": (None, "while node 'block1.join' runs, any plan holds at least 36.1"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
@pytest.mark.parametrize("algorithm", ["single", "round_robin", "expert", "metis", "auto"])
def test_impossible_problems_are_diagnosed_before_any_search(tmp_path, capsys, case, algorithm):
    changes, message = IMPOSSIBLE[case]
    doc = _graph_doc(**(changes or {}))
    if case == "colocation group larger than every device":
        for node in doc["nodes"][:4]:
            node.update(colocation="big", param_bytes=5 * GIB)
    if case == "graph larger than the cluster":
        for node in doc["nodes"][:5]:
            node.update(param_bytes=7 * GIB)
    if case == "activations larger than the cluster":
        # Four 9 GiB activations, each read by the backward pass: all held while the loss runs.
        forward = {"block0.b0.fwd", "block0.b1.fwd", "block1.b0.fwd", "block1.b1.fwd"}
        for node in doc["nodes"]:
            if node["id"] in forward:
                node.update(output_bytes=9 * GIB)
        for edge in doc["edges"]:
            if edge["src"] in forward:
                edge.update(bytes=9 * GIB)
    graph = _write(tmp_path, "g.json", doc)
    out = tmp_path / "plan.json"
    assert main(["plan", str(graph), "--cluster", "2xV100-nvlink", "--algorithm", algorithm, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()


@pytest.mark.parametrize("algorithm", ["single", "round_robin", "expert", "metis", "auto"])
def test_devices_that_cannot_reach_each_other_are_diagnosed(tmp_path, capsys, algorithm):
    cluster = load_cluster("2xV100-nvlink").to_dict()
    cluster["channels"] = []  # two islands: nothing may cross between them
    doc = _graph_doc()
    for node in doc["nodes"][:5]:
        node.update(param_bytes=5 * GIB)  # 25 GiB: needs both devices, which cannot talk
    graph, cluster_file = _write(tmp_path, "g.json", doc), _write(tmp_path, "c.json", cluster)
    out = tmp_path / "plan.json"
    assert main(["plan", str(graph), "--cluster", str(cluster_file), "--algorithm", algorithm, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "devices 'gpu0' and 'gpu1' (and maybe others) have no channel between them" in err, err
    assert "more than any set of devices that channels connect (16.000 GiB)" in err
    assert not out.exists()


def test_plan_for_another_graph_is_refused_by_simulate(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    training_graph(layers=2, branches=2, seed=0).save(first)
    training_graph(layers=3, branches=2, seed=0).save(second)
    plan = tmp_path / "p.json"
    assert main(["plan", str(first), "--cluster", "2xV100-nvlink", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(second), str(plan), "--json"]) == 2
    assert "another graph" in capsys.readouterr().err


def test_interrupted_local_search_returns_its_best_valid_plan(monkeypatch):
    graph = training_graph(layers=4, branches=2, seed=1)
    cluster = load_cluster("4xV100-nvlink")
    real = auto_module.simulate
    calls = {"n": 0}

    def interrupt_after_a_few(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(auto_module, "simulate", interrupt_after_a_few)
    # Placements only: local search does not run on a data-parallel plan's replicated graph.
    plan = place(graph, cluster, "auto", max_evaluations=1000, portfolio="heft,m_topo")
    assert plan.extra["auto"]["interrupted"] is True
    validate(plan, graph, cluster)


def test_interrupt_writes_no_plan(tmp_path, capsys, monkeypatch):
    graph = tmp_path / "g.json"
    training_graph(layers=2, branches=2).save(graph)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("placer.algorithms.place", interrupted)
    monkeypatch.setattr("placer.cli.core.place", interrupted)
    out = tmp_path / "p.json"
    assert main(["plan", str(graph), "--cluster", "2xV100-nvlink", "-o", str(out)]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not out.exists()


def test_failed_plan_leaves_an_existing_output_untouched(tmp_path, capsys):
    graph = tmp_path / "g.json"
    training_graph(layers=2, branches=2, param_mib=20000).save(graph)
    out = tmp_path / "p.json"
    out.write_text("previous plan")
    assert main(["plan", str(graph), "--cluster", "2xV100-nvlink", "--algorithm", "single", "-o", str(out)]) == 2
    assert out.read_text() == "previous plan"


@pytest.mark.parametrize("algorithm", ["single", "round_robin", "expert", "metis", "auto"])
def test_plans_are_byte_identical_apart_from_timing(tmp_path, capsys, algorithm):
    graph = tmp_path / "g.json"
    training_graph(layers=3, branches=2, seed=4).save(graph)
    docs = []
    for k in range(2):
        out = tmp_path / f"p{k}.json"
        assert (
            main(
                ["plan", str(graph), "--cluster", "4xGPU-pcie", "--algorithm", algorithm, "--seed", "3", "-o", str(out)]
            )
            == 0
        )
        doc = json.loads(out.read_text())
        doc.pop("search_time_s")
        docs.append(json.dumps(doc, sort_keys=True))
    assert docs[0] == docs[1]


def test_infeasible_error_is_specific():
    graph = training_graph(layers=2, branches=2, param_mib=20000)
    with pytest.raises(InfeasibleError):
        place(graph, load_cluster("2xV100-nvlink"), "single")
    assert np.isfinite(graph.compute_s).all()


def test_a_pipeline_over_devices_linked_only_to_their_neighbours_is_not_refused():
    from placer.graph import OpGraph

    names = ["d0", "d1", "d2", "d3"]
    # Each stage's parameters fill most of one device: the stages must sit on d0..d3 in turn.
    graph = OpGraph(
        ["s0", "s1", "s2", "s3"],
        [1e-3] * 4,
        [0, 1, 2],
        [1, 2, 3],
        [1 << 20] * 3,
        output_bytes=[1 << 20] * 4,
        param_bytes=[10 * GIB] * 4,
        name="pipe",
    )
    for cluster in (line_cluster(names), line_cluster(names, both_ways=False)):
        plan = place(graph, cluster, "expert")
        assert [plan.placement[s] for s in graph.ids] == names and plan.predicted["fits"]


@pytest.mark.parametrize("algorithm", ["dpos", "os_dpos"])
def test_dpos_keeps_a_critical_path_node_off_a_device_its_inputs_cannot_reach(algorithm):
    from placer.cluster import Cluster
    from placer.graph import OpGraph

    # The critical path a -> b -> c -> d runs fastest on the A100, which b (V100 only) may not use; of the
    # V100s only g1 has a channel from the A100. DPOS sent b to g0, then found no channel to it.
    graph = OpGraph.from_dict(
        {
            "format": "placer.graph/1",
            "name": "pin",
            "nodes": [
                {"id": "a", "compute_s": 1e-3, "device_kinds": ["A100"], "output_bytes": 1000},
                {"id": "b", "compute_s": 1e-3, "device_kinds": ["V100"]},
                {"id": "c", "compute_s": 1e-3, "colocation": "K", "device_kinds": ["A100", "V100"]},
                {"id": "d", "compute_s": 1e-3, "colocation": "K", "device_kinds": ["A100"]},
            ],
            "edges": [
                {"src": "a", "dst": "b", "bytes": 1000},
                {"src": "b", "dst": "c", "bytes": 10},
                {"src": "c", "dst": "d", "bytes": 10},
            ],
        }
    )
    link = {"bandwidth_bytes_per_s": 5e9, "latency_s": 2e-5}
    cluster = Cluster.from_dict(
        {
            "format": "placer.cluster/1",
            "name": "het",
            "devices": [
                {"name": "g0", "kind": "V100", "memory_bytes": GIB},
                {"name": "g1", "kind": "V100", "memory_bytes": GIB},
                {"name": "a0", "kind": "A100", "memory_bytes": 2 * GIB, "speed": 2.5},
            ],
            "channels": [
                {"name": "g0g1", **link, "pairs": [["g0", "g1"], ["g1", "g0"]]},
                {"name": "g1a0", **link, "pairs": [["g1", "a0"]]},
                {"name": "a0g1", **link, "pairs": [["a0", "g1"]]},
            ],
        }
    )
    plan = place(graph, cluster, algorithm)
    assert plan.placement == {"a": "a0", "b": "g1", "c": "a0", "d": "a0"}
    assert validate(plan, graph, cluster).fits


@pytest.mark.parametrize("algorithm", ["dpos", "os_dpos", "heft", "m_etf", "expert"])
def test_a_pipeline_too_big_for_the_devices_is_refused_for_memory_not_for_channels(algorithm):
    from placer.graph import OpGraph

    # Three stages of 10 GiB of parameters over two 16 GiB devices: the third fits neither (HEFT and
    # DPOS said no channel reached a device for it; OS-DPOS blamed memory whatever the cause).
    graph = OpGraph(
        ["s0", "s1", "s2"],
        [1e-3] * 3,
        [0, 1],
        [1, 2],
        [1 << 20] * 2,
        output_bytes=[1 << 20] * 3,
        param_bytes=[10 * GIB] * 3,
        name="pipe",
    )
    with pytest.raises(InfeasibleError, match="memory") as caught:
        place(graph, load_cluster("2xV100-nvlink"), algorithm)
    assert "channel" not in str(caught.value)


def test_expert_says_when_device_kinds_rule_out_a_contiguous_split():
    from placer.cluster import Cluster
    from placer.graph import OpGraph

    # The cluster lists the V100 first, but the first layer may run only on the A100.
    graph = OpGraph.from_dict(
        {
            "format": "placer.graph/1",
            "name": "kinds",
            "nodes": [
                {"id": "a", "compute_s": 1e-3, "device_kinds": ["A100"]},
                {"id": "b", "compute_s": 1e-3, "device_kinds": ["V100"]},
            ],
            "edges": [{"src": "a", "dst": "b", "bytes": 10}],
        }
    )
    link = {"bandwidth_bytes_per_s": 5e9, "latency_s": 2e-5}
    cluster = Cluster.from_dict(
        {
            "format": "placer.cluster/1",
            "name": "het",
            "devices": [
                {"name": "g0", "kind": "V100", "memory_bytes": GIB},
                {"name": "a0", "kind": "A100", "memory_bytes": GIB},
            ],
            "channels": [{"name": "both", **link, "pairs": [["g0", "a0"], ["a0", "g0"]]}],
        }
    )
    with pytest.raises(InfeasibleError, match="device of its kinds"):
        place(graph, cluster, "expert")


@pytest.mark.parametrize("algorithm", ["m_topo", "m_etf", "m_sct", "heft", "dpos", "os_dpos", "auto"])
def test_a_colocation_group_goes_where_its_inputs_reach_over_one_way_channels(algorithm):
    from placer.generate import random_dag

    # Channels one way only (d0 -> d1 -> d2): m-TOPO put a group on d0, then a member's input was on d1.
    # Every list scheduler refused so (auto planned it with another member); now each keeps a unit off a
    # device that a neighbour could not then reach or be reached from.
    cluster = line_cluster(["d0", "d1", "d2"], both_ways=False)
    graph = random_dag(20, edge_prob=0.3, seed=2, max_bytes=8 << 20, colocation_groups=3)
    options = {"data_parallel_start": False} if algorithm == "os_dpos" else {}
    assert validate(place(graph, cluster, algorithm, time_limit=5, **options), graph, cluster).fits


@pytest.mark.parametrize("algorithm", sorted(set(available_algorithms())))
def test_every_algorithm_plans_or_refuses_clearly_where_some_devices_have_no_channel(algorithm):
    cluster = line_cluster(["g0", "g1", "g2"])
    graph = training_graph(layers=3, branches=2, seed=2)
    try:
        plan = place(graph, cluster, algorithm, time_limit=5)
    except InfeasibleError as exc:
        # Baselines with a fixed rule (a replica per device and a ring) cannot avoid the missing pair; the
        # searches, the list schedulers, round-robin (which skips unlinked devices) and one device can.
        assert algorithm in {"m_topo", "data_parallel", "sharded_data_parallel"}
        assert "no channel connects" in str(exc), exc
    else:
        assert validate(plan, graph, cluster).fits


@pytest.mark.parametrize("algorithm", ["single", "heft", "m_etf"])
def test_a_device_one_byte_short_reads_in_bytes_not_as_equal_sizes(algorithm):
    from placer.cluster import Cluster, Device
    from placer.sim import simulate

    graph = training_graph(layers=2, seed=1)
    roomy = Cluster("solo", [Device("solo", "V100", 16 * GIB)], [])
    peak = int(simulate(graph, roomy, np.zeros(graph.num_nodes, dtype=np.int64)).peak_memory_bytes[0])
    short = Cluster("solo", [Device("solo", "V100", peak - 1)], [])
    with pytest.raises(InfeasibleError, match=f"{peak:,} bytes of {peak - 1:,} bytes"):
        place(graph, short, algorithm, time_limit=10)
