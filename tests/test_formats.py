"""Reading and writing placer.graph/1, placer.cluster/1 and placer.plan/1, and their errors."""

import copy
import functools
import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer import Cluster, OpGraph, Plan, load_cluster, place
from placer.api import validate
from placer.cluster import PRESETS, Device
from placer.errors import ClusterMismatchWarning, FormatError, GraphCycleError, InvalidPlanError
from placer.generate import random_dag, training_graph
from placer.sim.bounds import lower_bound
from placer.transform.bind import bind_plan

EXAMPLE = {
    "format": "placer.graph/1",
    "name": "tiny",
    "producer": "hand-written",
    "nodes": [
        {
            "id": "conv1",
            "op": "aten.convolution",
            "compute_s": 1.8e-3,
            "output_bytes": 3211264,
            "param_bytes": 3456,
            "temp_bytes": 0,
            "layer": "stem.conv1",
            "colocation": None,
            "device_kinds": None,
            "compute_s_by_kind": {"A100": 0.7e-3},
            "flops": 2.1e9,
            "splittable": [{"dim": "batch", "size": 64}],
            "note": "kept",
        },
        {"id": "relu1", "compute_s": 1e-4},
    ],
    "edges": [{"src": "conv1", "dst": "relu1", "bytes": 3211264, "tensor": 0, "why": "kept too"}],
}


def test_graph_round_trip_keeps_every_field_and_unknown_ones(tmp_path):
    g = OpGraph.from_dict(copy.deepcopy(EXAMPLE))
    path = tmp_path / "g.json"
    g.save(path)
    doc = json.loads(path.read_text())
    assert doc["producer"] == "hand-written"
    assert doc["nodes"][0]["note"] == "kept" and doc["edges"][0]["why"] == "kept too"
    assert doc["nodes"][0]["compute_s_by_kind"] == {"A100": 0.7e-3}
    assert doc["nodes"][0]["splittable"] == [{"dim": "batch", "size": 64}]
    again = OpGraph.load(path)
    assert again.to_dict() == g.to_dict()
    assert again.digest() == g.digest()


def test_a_binary_file_is_not_json(tmp_path):
    path = tmp_path / "policy.pt"
    path.write_bytes(b"\x80\x02binary")
    with pytest.raises(FormatError, match="policy.pt: not a JSON text file"):
        OpGraph.load(path)


def test_a_file_with_a_byte_order_mark_reads(tmp_path):
    graph = training_graph(layers=1, branches=1, seed=0)
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(graph.to_dict()).encode())
    assert OpGraph.load(path).digest() == graph.digest()


def test_generated_graphs_round_trip():
    for g in (training_graph(layers=3, branches=2), random_dag(50, colocation_groups=4)):
        assert OpGraph.from_dict(json.loads(json.dumps(g.to_dict()))).to_dict() == g.to_dict()


def bad(mutate):
    doc = copy.deepcopy(EXAMPLE)
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("format"), "missing field 'format'"),
        (lambda d: d.update(format="placer.graph/2"), "'format' is 'placer.graph/2'"),
        (lambda d: d.pop("nodes"), "missing required field 'nodes'"),
        (lambda d: d["nodes"][1].pop("compute_s"), "node 'relu1': missing required field 'compute_s'"),
        (lambda d: d["nodes"][1].update(compute_s=-1), "node 'relu1': field 'compute_s' must be >= 0"),
        (lambda d: d["nodes"][1].update(compute_s="fast"), "node 'relu1': field 'compute_s' must be a number"),
        (lambda d: d["nodes"][0].update(output_bytes=1.5), "node 'conv1': field 'output_bytes' must be an integer"),
        (lambda d: d["nodes"][1].update(id="conv1"), "duplicate node id 'conv1'"),
        (lambda d: d["edges"][0].update(dst="nowhere"), "field 'dst' names unknown node 'nowhere'"),
        (lambda d: d["edges"][0].update(bytes=-4), "field 'bytes' must be >= 0"),
        (lambda d: d["nodes"][0].update(device_kinds="V100"), "field 'device_kinds' must be a list"),
        (lambda d: d["nodes"][0].update(splittable=[{"dim": "batch"}]), "splittable[0]: missing required field 'size'"),
        # Figures whose sums overflow (to inf, or past int64) are refused at the door.
        (lambda d: d["nodes"][1].update(compute_s=1e308), "node 'relu1': field 'compute_s' is too large"),
        (lambda d: d["nodes"][1].update(compute_s=10**400), "node 'relu1': field 'compute_s' must be finite"),
        (
            lambda d: d["nodes"][0]["compute_s_by_kind"].update(A100=1e300),
            "node 'conv1': field 'compute_s_by_kind.A100' is too large",
        ),
        (lambda d: [n.update(param_bytes=2**62) for n in d["nodes"]], "add up to 9.223e+18, more than 2**62"),
    ],
)
def test_graph_errors_name_the_node_and_field(mutate, message):
    with pytest.raises(FormatError) as info:
        OpGraph.from_dict(bad(mutate), source="g.json")
    assert message in str(info.value)
    assert "g.json" in str(info.value)


def test_cycle_error_names_nodes_on_the_cycle():
    doc = bad(lambda d: d["edges"].append({"src": "relu1", "dst": "conv1", "bytes": 1}))
    with pytest.raises(
        GraphCycleError, match="cycle: 'conv1' -> 'relu1' -> 'conv1'|cycle: 'relu1' -> 'conv1' -> 'relu1'"
    ):
        OpGraph.from_dict(doc)


def test_file_errors(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(FormatError, match="empty.json: the file is empty"):
        OpGraph.load(empty)
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    with pytest.raises(FormatError, match="broken.json: invalid JSON at line 1"):
        OpGraph.load(broken)
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(EXAMPLE).replace("0.0001", "NaN"))
    with pytest.raises(FormatError, match="NaN is not a valid number"):
        OpGraph.load(nan)
    # Read as inf, a number this large loaded in an unknown field, and saving the graph then failed.
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({**EXAMPLE, "note": [1.5]}).replace("1.5", "-1e400"))
    with pytest.raises(FormatError, match="huge.json: field 'note' must be finite, got -inf"):
        OpGraph.load(huge)
    # json keeps the last of two equal keys silently (another reader may keep the first).
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(EXAMPLE).replace('"compute_s": 0.0001', '"compute_s": 0.0001, "compute_s": -1'))
    with pytest.raises(
        FormatError, match="twice.json: field 'compute_s' appears twice in one object \\(the object with id 'relu1'\\)"
    ):
        OpGraph.load(twice)
    twice.write_text('{"format": "placer.graph/1", "nodes": [], "x": {"a": 1, "a": 2}}')
    with pytest.raises(FormatError, match="twice.json: field 'a' appears twice in one object$"):
        OpGraph.load(twice)
    with pytest.raises(FormatError, match="no such file"):
        OpGraph.load(tmp_path / "missing.json")
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "placer.graph/1", "x": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(FormatError, match="deep.json: invalid JSON: nested too deeply"):
        OpGraph.load(deep)


@pytest.mark.parametrize(
    "target, message",
    [
        ("adir", "cannot write plan file {dir}/adir: is a directory"),
        ("g.json/p.json", "cannot write plan file {dir}/g.json/p.json: {dir}/g.json is a file, not a folder"),
    ],
)
def test_unwritable_outputs_raise_placer_errors_naming_the_output(tmp_path, target, message):
    from placer.errors import PlacerError

    (tmp_path / "adir").mkdir()
    (tmp_path / "g.json").write_text("{}")
    plan = place(training_graph(layers=2, branches=1), load_cluster("2xV100-nvlink"), "single")
    with pytest.raises(PlacerError) as info:
        plan.save(tmp_path / target)
    assert str(info.value) == message.format(dir=tmp_path)
    assert isinstance(info.value, OSError)  # still what callers that catch OSError expect
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "g.json"] and not list((tmp_path / "adir").iterdir())


def test_presets_round_trip_and_are_connected():
    for name, make in PRESETS.items():
        c = make()
        assert c.name == name
        assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))).to_dict() == c.to_dict()
        assert c.unreachable_pairs() == []


def test_shared_channels_in_presets():
    pcie = load_cluster("4xGPU-pcie")
    assert len(pcie.channels) == 4 and len(set(pcie.channel_index[0, 1:].tolist())) == 1
    hosts = load_cluster("2x4xV100")
    cross = {int(hosts.channel_index[i, j]) for i in range(4) for j in range(4, 8)}
    assert len(cross) == 1


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["devices"][0].update(memory_bytes=0), "device 'gpu0': field 'memory_bytes' must be >= 1"),
        (lambda d: d["channels"][0].update(bandwidth_bytes_per_s=0), "field 'bandwidth_bytes_per_s' must be > 0"),
        # Figures that made a plan's simulated times inf (and its peak memory wrong), or speeds whose sum is inf
        # (metis divided by it), are refused at the door.
        (lambda d: d["devices"][0].update(speed=1e-320), "device 'gpu0': field 'speed' must be >= 1e-09, got 1e-320"),
        (lambda d: d["devices"][0].update(speed=1e308), "device 'gpu0': field 'speed' is too large"),
        (
            lambda d: d["channels"][0].update(bandwidth_bytes_per_s=1e-320),
            "channel 'gpu0->gpu1': field 'bandwidth_bytes_per_s' must be >= 1, got 1e-320",
        ),
        (lambda d: d["channels"][0].update(latency_s=1e308), "channel 'gpu0->gpu1': field 'latency_s' is too large"),
        (lambda d: d["channels"][0].update(pairs=[["gpu0", "gpu9"]]), "names unknown device 'gpu9'"),
        (lambda d: d["devices"].append(dict(d["devices"][0])), "duplicate device name 'gpu0'"),
        (lambda d: d["channels"][1].update(pairs=d["channels"][0]["pairs"]), "is listed by channels"),
        (lambda d: d.update(devices=[]), "at least one device"),
    ],
)
def test_cluster_errors(mutate, message):
    doc = load_cluster("2xV100-nvlink").to_dict()
    mutate(doc)
    with pytest.raises(FormatError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        Cluster.from_dict(doc, source="c.json")


def test_unknown_cluster_names_the_presets():
    with pytest.raises(FormatError, match="unknown cluster 'nope'.*4xV100-nvlink"):
        load_cluster("nope")


def test_plan_round_trip_and_binding(tmp_path):
    g = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xV100-nvlink")
    plan = place(g, cluster, "expert")
    plan.save(tmp_path / "p.json")
    again = Plan.load(tmp_path / "p.json")
    assert again.to_dict() == plan.to_dict()
    assert validate(again, g, cluster).makespan_s == plan.predicted["makespan_s"]


def test_plan_records_the_digest_of_its_cluster(tmp_path):
    g = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xV100-nvlink")
    plan = place(g, cluster, "expert")
    plan.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["cluster_digest"] == cluster.digest()
    assert Plan.load(tmp_path / "p.json").cluster_digest == cluster.digest()
    # Figures change the digest; names of the cluster and its channels and extra fields do not.
    doc = cluster.to_dict()
    doc.update(name="other", note="x")
    doc["channels"][0]["name"] = "renamed"
    assert Cluster.from_dict(doc).digest() == cluster.digest()
    doc["channels"][0]["bandwidth_bytes_per_s"] = 1e8
    assert Cluster.from_dict(doc).digest() != cluster.digest()


def test_a_plan_validated_on_a_cluster_with_other_figures_warns_and_is_checked_there():
    g = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xV100-nvlink")
    plan = place(g, cluster, "round_robin")
    doc = cluster.to_dict()
    doc["name"] = "renamed"
    renamed = Cluster.from_dict(doc)
    doc["channels"][0]["bandwidth_bytes_per_s"] = 1e8
    slow = Cluster.from_dict(doc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its own cluster, or the same figures renamed: silent
        assert validate(plan, g, cluster).makespan_s == validate(plan, g, renamed).makespan_s
    with pytest.warns(
        ClusterMismatchWarning,
        match="plan validated on cluster 'renamed', with other figures than "
        "the cluster '2xV100-nvlink' it was made for",
    ):
        assert validate(plan, g, slow).makespan_s > plan.predicted["makespan_s"]
    # A plan from before the digest was recorded is told by the cluster's name.
    plan.cluster_digest = None
    with pytest.warns(ClusterMismatchWarning, match="on cluster 'renamed', not the cluster '2xV100-nvlink'"):
        validate(plan, g, renamed)


def test_plan_splits_must_name_nodes_of_the_graph():
    g = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xV100-nvlink")
    doc = place(g, cluster, "single").to_dict()
    doc["splits"] = [{"node": "ghost", "dim": "batch", "parts": 2}]
    with pytest.raises(InvalidPlanError, match="splits\\[0\\] names unknown node 'ghost'"):
        bind_plan(Plan.from_dict(doc), g, cluster)


@pytest.mark.parametrize(
    "predicted, message",
    [
        ({"makespan_s": "soon"}, "plan p.json: predicted: field 'makespan_s' must be a number, got 'soon'"),
        ({"lower_bound_s": -1}, "plan p.json: predicted: field 'lower_bound_s' must be >= 0"),
        ({"peak_memory_bytes": [1]}, "plan p.json: predicted: field 'peak_memory_bytes' must be an object"),
        ({"peak_memory_bytes": {"gpu0": None}}, "field 'peak_memory_bytes.gpu0' must be a number, got None"),
    ],
)
def test_plan_predicted_figures_must_be_numbers(predicted, message):
    # A figure of another type loaded silently, and repr(plan) then failed formatting it.
    doc = place(training_graph(layers=1, branches=1), load_cluster("2xcpu"), "single").to_dict()
    doc["predicted"] = predicted
    with pytest.raises(FormatError) as info:
        Plan.from_dict(doc, source="p.json")
    assert message in str(info.value)


def test_plan_for_another_graph_is_refused():
    cluster = load_cluster("2xV100-nvlink")
    plan = place(training_graph(layers=2, branches=2, seed=0), cluster, "expert")
    other = training_graph(layers=3, branches=2, seed=0)
    with pytest.raises(InvalidPlanError, match="another graph") as info:
        plan.bind(other, cluster)
    assert "the same name" not in str(info.value)
    # Named alike (a plan made before the model or placer's capture changed): said so, with what to do.
    same_name = training_graph(layers=3, branches=2, seed=0, name=plan.graph_name)
    with pytest.raises(InvalidPlanError, match=r"\(the same name, other operations: .*plan again\)"):
        plan.bind(same_name, cluster)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p["placement"].pop("input"), "unplaced"),
        (lambda p: p["placement"].update(input="gpu7"), "node 'input' is placed on unknown device 'gpu7'"),
        (lambda p: p["placement"].update(ghost="gpu0"), "unknown node 'ghost'"),
        (lambda p: p["order"]["gpu0"].reverse(), "contradicts the dependencies"),
        (lambda p: p["order"]["gpu0"].pop(), "leaves out node"),
        (lambda p: p["order"]["gpu0"].append("ghost"), "the order of 'gpu0' names unknown node 'ghost'"),
        (lambda p: p["order"]["gpu0"].append(p["order"]["gpu0"][0]), "the order lists node 'input' twice"),
        (
            lambda p: p["order"].update(gpu1=[p["order"]["gpu0"][0]]),
            "the order of 'gpu1' lists 'input', which is placed on 'gpu0'",
        ),
        (lambda p: p["order"].update(gpu7=[]), "the order names unknown device 'gpu7'"),
    ],
)
def test_invalid_plans(mutate, message):
    g = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xV100-nvlink")
    doc = place(g, cluster, "single").to_dict()
    mutate(doc)
    with pytest.raises(InvalidPlanError, match=message):
        validate(Plan.from_dict(doc), g, cluster)


def test_colocation_and_kinds_are_enforced():
    g = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xV100-nvlink")
    doc = place(g, cluster, "single").to_dict()
    doc["placement"]["block0.b0.update"] = "gpu1"
    doc.pop("order")
    with pytest.raises(InvalidPlanError, match="colocation group 'block0.b0.param'"):
        validate(Plan.from_dict(doc), g, cluster)
    kinds = g.replace(device_kinds=[("A100",)] + [None] * (g.num_nodes - 1))
    with pytest.raises(InvalidPlanError, match="may run only on kinds"):
        Plan.from_dict(place(g, cluster, "single").to_dict()).bind(kinds.replace(name=g.name), cluster)


def test_memory_overflow_is_invalid():
    g = training_graph(layers=2, branches=2, param_mib=9000)
    cluster = load_cluster("2xV100-nvlink")
    placement = {i: "gpu0" for i in g.ids}
    with pytest.raises(InvalidPlanError, match="needs .* GiB at peak"):
        validate(Plan(placement, graph_name=g.name), g, cluster)
    # Sizes under 1 KiB read in bytes ("needs 0.1 KiB at peak but has 0.0 KiB" said nothing).
    tiny = Cluster("tiny", [Device("d0", "K", 5)], [])
    g = OpGraph(["a"], [1.0], [], [], [], output_bytes=[100])
    with pytest.raises(InvalidPlanError, match="'d0' needs 100 bytes at peak but has 5 bytes"):
        validate(Plan({"a": "d0"}, graph_name=g.name), g, tiny)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_mutated_graph_files_raise_only_placer_errors(data):
    """Fuzz: any mutation of a valid document either loads or raises FormatError."""
    doc = random_dag(6, seed=data.draw(st.integers(0, 100))).to_dict()
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from(["node", "edge", "top"]))
        junk = data.draw(
            st.one_of(
                st.none(),
                st.integers(-5, 5),
                st.floats(allow_nan=False),
                st.text(max_size=3),
                st.lists(st.integers(), max_size=2),
                st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
            )
        )
        if target == "top":
            key = data.draw(st.sampled_from(["format", "name", "nodes", "edges"]))
            doc[key] = junk
        elif target == "node" and isinstance(doc.get("nodes"), list) and doc["nodes"]:
            node = doc["nodes"][data.draw(st.integers(0, len(doc["nodes"]) - 1))]
            if isinstance(node, dict):
                node[
                    data.draw(
                        st.sampled_from(
                            [
                                "id",
                                "compute_s",
                                "output_bytes",
                                "device_kinds",
                                "splittable",
                                "compute_s_by_kind",
                                "colocation",
                            ]
                        )
                    )
                ] = junk
        elif target == "edge" and isinstance(doc.get("edges"), list) and doc["edges"]:
            edge = doc["edges"][data.draw(st.integers(0, len(doc["edges"]) - 1))]
            if isinstance(edge, dict):
                edge[data.draw(st.sampled_from(["src", "dst", "bytes", "tensor"]))] = junk
    try:
        g = OpGraph.from_dict(doc)
    except FormatError:
        return
    assert np.all(g.compute_s >= 0)


def test_huge_sizes_are_refused_not_overflowed():
    with pytest.raises(FormatError, match="node 'conv1': field 'output_bytes' is too large"):
        OpGraph.from_dict(bad(lambda d: d["nodes"][0].update(output_bytes=10**30)))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_mutated_cluster_files_raise_only_placer_errors(data):
    doc = load_cluster(data.draw(st.sampled_from(sorted(PRESETS)))).to_dict()
    junk = st.one_of(
        st.none(),
        st.integers(-3, 3),
        st.floats(),
        st.text(max_size=3),
        st.lists(st.text(max_size=3), max_size=3),
        st.lists(st.lists(st.text(max_size=5), max_size=3), max_size=2),
    )
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["top", "device", "channel"]))
        if where == "top":
            doc[data.draw(st.sampled_from(["format", "devices", "channels", "name"]))] = data.draw(junk)
        elif where == "device" and isinstance(doc.get("devices"), list) and doc["devices"]:
            device = doc["devices"][data.draw(st.integers(0, len(doc["devices"]) - 1))]
            if isinstance(device, dict):
                device[data.draw(st.sampled_from(["name", "kind", "memory_bytes", "speed"]))] = data.draw(junk)
        elif where == "channel" and isinstance(doc.get("channels"), list) and doc["channels"]:
            channel = doc["channels"][data.draw(st.integers(0, len(doc["channels"]) - 1))]
            if isinstance(channel, dict):
                channel[data.draw(st.sampled_from(["name", "bandwidth_bytes_per_s", "latency_s", "pairs"]))] = (
                    data.draw(junk)
                )
    try:
        Cluster.from_dict(doc)
    except FormatError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=12, max_size=12), min_size=0, max_size=3))
def test_joined_groups_are_the_smallest_groups_closed_under_shared_labels(labellings):
    from placer.graph import joined_groups

    n = 12
    group = joined_groups(n, *labellings).tolist()
    # By hand: merge any two groups that share a label, until none do.
    mine = list(range(n))
    changed = True
    while changed:
        changed = False
        for labels in labellings:
            for i in range(n):
                for j in range(n):
                    if labels[i] is not None and labels[i] == labels[j] and mine[i] != mine[j]:
                        old = mine[j]
                        mine = [mine[i] if g == old else g for g in mine]
                        changed = True
    assert all((group[i] == group[j]) == (mine[i] == mine[j]) for i in range(n) for j in range(n))
    assert group[0] == 0 and sorted(set(group)) == list(range(len(set(group))))


# ---------------------------------------------------------------- fuzzing all three files together
# Each example makes one or two changes to a valid graph, cluster and plan, writes the three files and
# loads them as the command line does. Loading raises FormatError naming the file, or binding and simulating the plan
# raises InvalidPlanError, or the plan simulates to finite figures and every document saves and reads back.

_HUGE = "__fuzz: the literal 1e400__"  # written to the file as 1e400 (a float Python reads as inf)
_EXTREME = st.sampled_from([0, -1, 0.5, 5e-324, 1e-300, 1e-12, 1e12, 1e308, 2**62, 2**63, 10**30, _HUGE])
_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    _EXTREME,
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.sampled_from(["", "x" * 5000, "gpu0", "\u00e9\u4e2d\U0001f600", "\ud800"]),
    st.lists(st.one_of(st.integers(-2, 2), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.one_of(st.integers(-2, 2), st.text(max_size=3)), max_size=2),
)


@functools.lru_cache(maxsize=1)
def _valid_documents() -> str:
    graph = training_graph(layers=2, branches=2)
    cluster = load_cluster("2xcpu")
    return json.dumps(
        {"graph": graph.to_dict(), "cluster": cluster.to_dict(), "plan": place(graph, cluster, "expert").to_dict()}
    )


_BY_ID = ("placement", "order", "peak_memory_bytes", "compute_s_by_kind")  # objects keyed by node, device, kind


def _slots(value, shape, out):
    """Every (container, key) inside ``value``, grouped by the path's shape (list indices and ids as ``*``)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        inner = f"{shape}.{'*' if isinstance(value, list) or shape.endswith(_BY_ID) else key}"
        out.setdefault(inner, []).append((value, key))
        _slots(item, inner, out)
    return out


def _strings(value):
    if isinstance(value, str):
        yield value
    for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        yield from _strings(item)


def _mutate(data, doc, others):
    """One mutation of ``doc`` at a field drawn from all its kinds of field alike (a device's speed as
    often as a node's id): delete, replace with junk, an extreme number or a string of the documents
    (an id, a device), add an unknown field, duplicate or empty a list, swap an edge's ends, or nest
    the graph document (as the plan's rewritten graph, say)."""
    slots = _slots(doc, "", {"": [({"doc": doc}, "doc")]})
    container, key = data.draw(st.sampled_from(slots[data.draw(st.sampled_from(sorted(slots)))]))
    value = container[key]
    ways = ["junk", "string"] + ["delete"] * (value is not doc)
    ways += ["extreme"] * 3 * (isinstance(value, (int, float)) and not isinstance(value, bool))
    ways += ["duplicate"] * (isinstance(value, list) and bool(value)) + ["empty"] * isinstance(value, (list, dict))
    ways += ["add", "graph"] * isinstance(value, dict) + ["swap"] * (isinstance(value, dict) and "src" in value)
    how = data.draw(st.sampled_from(ways))
    if how == "junk":
        container[key] = data.draw(_JUNK)
    elif how == "string":
        container[key] = data.draw(st.sampled_from(sorted({s for d in others for s in _strings(d)})))
    elif how == "delete":
        del container[key]
    elif how == "extreme":
        container[key] = data.draw(_EXTREME)
    elif how == "duplicate":
        value.insert(data.draw(st.integers(0, len(value))), copy.deepcopy(data.draw(st.sampled_from(value))))
    elif how == "empty":
        value.clear()
    elif how == "add":
        value[data.draw(st.sampled_from(["note", "x" * 300]))] = data.draw(_JUNK)
    elif how == "graph":
        container[key] = copy.deepcopy(others[0])
    else:
        value["src"], value["dst"] = value.get("dst"), value["src"]


def _check_round_trip(cls, obj, path):
    obj.save(path)
    assert cls.load(path).to_dict() == obj.to_dict()


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_mutated_files_raise_only_documented_errors_or_simulate_to_finite_figures(data, tmp_path_factory):
    from placer.sim import simulate_plan

    docs = json.loads(_valid_documents())
    for _ in range(data.draw(st.integers(1, 2))):
        name = data.draw(st.sampled_from(sorted(docs)))
        _mutate(data, docs[name], [docs["graph"], docs["cluster"], docs["plan"]])
    folder = tmp_path_factory.mktemp("fuzz")
    paths = {}
    for name, doc in docs.items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(doc).replace(json.dumps(_HUGE), "1e400"))
    try:
        graph = OpGraph.load(paths["graph"])
        cluster = Cluster.load(paths["cluster"])
        plan = Plan.load(paths["plan"])
    except FormatError as exc:
        assert any(str(p) in str(exc) for p in paths.values()), exc
        return
    repr(plan)
    for cls, obj in ((OpGraph, graph), (Cluster, cluster), (Plan, plan)):
        _check_round_trip(cls, obj, folder / f"again-{cls.__name__}.json")
    try:
        result = simulate_plan(plan, graph, cluster)
    except InvalidPlanError:
        return
    assert np.all(np.isfinite(result.finish)), f"makespan {result.makespan_s}"
    assert np.all(result.peak_memory_bytes >= 0), result.peak_memory_bytes
    assert np.isfinite(lower_bound(graph, cluster, splits=plan.rewrites_graph))


def test_a_long_bad_value_is_quoted_short(tmp_path):
    """A file's junk (here a list of 10,000 numbers where a time belongs) is quoted in one short line."""
    doc = training_graph(layers=2, branches=1).to_dict()
    doc["nodes"][0]["compute_s"] = list(range(10_000))
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as failed:
        OpGraph.load(path)
    message = str(failed.value)
    assert "compute_s" in message and "(58890 characters)" in message and len(message) < 300, message


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("speed", 1e-320, "field 'speed' must lie in"),
        ("speed", float("inf"), "field 'speed' must lie in"),
        ("bandwidth", 1e-320, "'bandwidth_bytes_per_s' must be >= 1"),
        ("latency", 1e308, r"'latency_s' must be <= 1e\+09"),
        # Accepted, then "ValueError: Out of range float values are not JSON compliant" on save.
        ("bandwidth", float("inf"), "'bandwidth_bytes_per_s' must be finite"),
        ("memory", float("inf"), "'memory_bytes' must be finite"),
    ],
)
def test_a_cluster_built_in_code_holds_the_ranges_a_file_does(field, value, message):
    from placer.cluster import Channel, Device

    speed, bandwidth, latency, memory = (
        value if field == f else default
        for f, default in (("speed", 1.0), ("bandwidth", 1e9), ("latency", 1e-5), ("memory", 1 << 30))
    )
    with pytest.raises(FormatError, match=message):
        Cluster(
            "c",
            [Device("a", "V100", memory, speed), Device("b", "V100", 1 << 30)],
            [Channel("a-b", bandwidth, latency, (("a", "b"), ("b", "a")))],
        )


@pytest.mark.parametrize(
    "fields, message",
    [
        # A negative per-kind time gave a negative step; NaN, a simulation that never ended.
        ({"compute_s_by_kind": [{"V100": -5.0}, None, None]}, r"node 'a': field 'compute_s_by_kind.V100' must be >= 0"),
        ({"compute_s_by_kind": [{"V100": float("nan")}, None, None]}, r"'compute_s_by_kind.V100' must be finite"),
        ({"compute_s_by_kind": [{"V100": "fast"}, None, None]}, r"'compute_s_by_kind.V100' must be a number"),
        ({"compute_s_by_kind": [[1.0], None, None]}, r"'compute_s_by_kind' must map kinds to seconds"),
        ({"device_kinds": ["V100", None, None]}, r"'device_kinds' must be a list of kind names, got 'V100'"),
        ({"splittable": ["batch", None, None]}, r"'splittable' must be a list of"),
        ({"splittable": [[{"dim": "batch", "size": -2}], None, None]}, r"'splittable' must be a list of"),
        ({"ids": [1, 2, 3]}, r"node #0: its id must be a non-empty string, got 1"),
        ({"output_bytes": [0, 1.7, 0]}, r"output_bytes must be whole numbers up to 2\*\*62, got 1.7"),
        ({"output_bytes": [0, float("nan"), 0]}, r"output_bytes must be whole numbers"),
        ({"param_bytes": [0, 2**70, 0]}, r"param_bytes must be whole numbers up to 2\*\*62"),
        ({"src": [0.6, 1]}, r"edge sources must be whole numbers"),
        ({"edge_bytes": [1.5, 1]}, r"edge bytes must be whole numbers"),
        ({"compute_s": [1, "x", 1]}, r"compute_s must be numbers"),
        ({"compute_s": ["1", "1", "1"]}, r"compute_s must be numbers"),
        ({"compute_s": [1, 1e300, 1]}, r"node 'b': field 'compute_s' must be a finite number >= 0 and at most 1e\+09"),
        ({"edge_extra": [{}]}, r"edge_extra has 1 entries for 2 edges"),
    ],
)
def test_a_graph_built_in_python_is_checked_as_a_file_is(fields, message):
    # OpGraph(...) checked less than OpGraph.load: what the loader refuses reached place and the simulator
    # (numpy cut 1.5 bytes to 1; NaN bytes raised numpy's ValueError).
    args = {
        "ids": ["a", "b", "c"],
        "compute_s": [1.0, 1.0, 1.0],
        "src": [0, 1],
        "dst": [1, 2],
        "edge_bytes": [10, 10],
        **fields,
    }
    with pytest.raises(FormatError, match=message):
        OpGraph(**args)
