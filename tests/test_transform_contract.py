"""Every registered transform passes the common contract (placer.transform.checks), and the checks can fail."""

import numpy as np
import pytest

from placer.errors import OptionError
from placer.generate import training_graph
from placer.graph import OpGraph
from placer.transform import (
    TransformResult,
    apply_transform,
    available_transforms,
    checks,
    get_transform,
    register_transform,
)
from placer.transform import base as transform_base
from placer.transform.base import NodeMap
from placer.transform.checks import CHECKS
from placer.transform.coarsen import QUOTIENT_ENSURES
from placer.transform.colocate import COLOCATION_ENSURES
from placer.transform.replicate import data_parallel_graph


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("transform", available_transforms())
def test_contract(transform, check):
    check(transform)


# ----------------------------------------------------------------- the checks can fail
# Each transform below breaks one clause of the contract on purpose; the check of that clause must catch it.


def _coarsened(graph, cluster):
    return apply_transform("coarsen", graph, cluster, target=max(1, graph.num_nodes // 4))


def lost_cost(graph, cluster):
    """Coarsening that forgets the time of its first coarse node."""
    r = _coarsened(graph, cluster)
    if r.graph.num_nodes == 0 or r.graph.compute_s[0] == 0:
        return r
    times = r.graph.compute_s.copy()
    times[0] = 0.0
    return TransformResult.quotient(
        graph, r.graph.replace(compute_s=times, compute_s_by_kind=None), r.image.index, None
    )


def lost_memory(graph, cluster):
    """Coarsening that keeps the largest member's parameters instead of their sum."""
    r = _coarsened(graph, cluster)
    params = np.zeros(r.graph.num_nodes, dtype=np.int64)
    np.maximum.at(params, r.image.index, graph.param_bytes)
    return TransformResult.quotient(graph, r.graph.replace(param_bytes=params), r.image.index, None)


def doubled_transfer(graph, cluster):
    """Coarsening that sends one of its transfers twice."""
    r = _coarsened(graph, cluster)
    nbytes = r.graph.edge_bytes.copy()
    nbytes[:1] *= 2
    return TransformResult.quotient(graph, r.graph.replace(edge_bytes=nbytes), r.image.index, None)


def not_total(graph, cluster):
    """The identity that forgets to map the first node."""
    n = graph.num_nodes
    if n < 2:
        return TransformResult.identity(graph)
    origin = NodeMap.from_groups([[u] for u in range(n)], n)
    image = NodeMap.from_groups([[]] + [[u] for u in range(1, n)], n)
    return TransformResult(graph, graph, origin, image, np.zeros(n, bool), np.zeros(n, np.int64))


def inconsistent(graph, cluster):
    """A map whose two directions disagree: the origin swaps the first two nodes, the image does not."""
    n = graph.num_nodes
    if n < 2:
        return TransformResult.identity(graph)
    swapped = np.arange(n)
    swapped[[0, 1]] = [1, 0]
    return TransformResult(
        graph, graph, NodeMap.function(swapped, n), NodeMap.identity(n), np.zeros(n, bool), np.zeros(n, np.int64)
    )


def dropped_edge(graph, cluster):
    """The identity without the graph's first edge (a dependency lost, an edge changed)."""
    keep = slice(1, None)
    new = graph.replace(
        src=graph.src[keep],
        dst=graph.dst[keep],
        edge_bytes=graph.edge_bytes[keep],
        edge_tensor=graph.edge_tensor[keep],
        edge_extra=None,
    )
    return TransformResult.identity(graph, new)


def ungrouped(graph, cluster):
    """The identity that drops the colocation of the first member of every group."""
    coloc = list(graph.colocation)
    for members in graph.colocation_groups.values():
        coloc[members[0]] = None
    return TransformResult.identity(graph, graph.replace(colocation=coloc))


def cyclic(graph, cluster):
    """A result whose graph has an edge turned around after it was built (its constructor saw no cycle)."""
    new = graph.replace()
    if new.num_edges:
        # An edge back from the last node of a path to its first.
        u, v = int(new.src[0]), int(new.dst[0])
        later = new.dst[new.src == v]
        if later.size:
            new.src = np.append(new.src, later[0])
            new.dst = np.append(new.dst, u)
            new.edge_bytes = np.append(new.edge_bytes, 0)
            new.edge_tensor = np.append(new.edge_tensor, 0)
    return TransformResult.identity(graph, new)


def mutating(graph, cluster):
    """Colocation that writes its labels into the graph it was given."""
    for i in range(graph.num_nodes):
        graph.colocation[i] = graph.colocation[i] or "all"
    return TransformResult.identity(graph, graph.replace(colocation=list(graph.colocation)))


def noisy(graph, cluster):
    """Colocation whose labels depend on a fresh random draw."""
    label = f"g{np.random.default_rng().integers(1 << 40)}"
    return TransformResult.identity(graph, graph.replace(colocation=[label] * graph.num_nodes))


def shrunk_replicas(graph, cluster):
    """Data parallelism whose replicas each take 0.7 of every node's time: neither a share nor the whole."""
    dp = data_parallel_graph(graph, 2)
    new = dp.graph.replace(
        compute_s=dp.graph.compute_s * 0.7,
        compute_s_by_kind=[t and {k: s * 0.7 for k, s in t.items()} for t in dp.graph.compute_s_by_kind],
    )
    r = get_transform("replicate").func(graph, cluster, replicas=2)
    return TransformResult(new, graph, r.origin, r.image, r.added, r.copy)


BROKEN = [
    (lost_cost, QUOTIENT_ENSURES, checks.check_conservation),
    (lost_memory, QUOTIENT_ENSURES, checks.check_conservation),
    (doubled_transfer, QUOTIENT_ENSURES, checks.check_transfers),
    (not_total, COLOCATION_ENSURES, checks.check_mapping),
    (inconsistent, COLOCATION_ENSURES, checks.check_mapping),
    (dropped_edge, COLOCATION_ENSURES, checks.check_dependencies),
    (dropped_edge, COLOCATION_ENSURES, checks.check_transfers),
    (ungrouped, COLOCATION_ENSURES, checks.check_constraints),
    (cyclic, COLOCATION_ENSURES, checks.check_valid_graph),
    (mutating, COLOCATION_ENSURES, checks.check_input_untouched),
    (noisy, COLOCATION_ENSURES, checks.check_determinism),
    (shrunk_replicas, get_transform("replicate").ensures, checks.check_conservation),
]


@pytest.fixture
def registered():
    """Register a transform for one test, under a name of its own, and forget it afterwards."""
    names = []

    def register(func, ensures):
        name = f"broken-{func.__name__}"
        register_transform(name, requires="", ensures=ensures, trials=lambda graph: [{}])(func)
        names.append(name)
        return name

    yield register
    for name in names:
        transform_base._unregister(name)


@pytest.mark.parametrize("func, ensures, check", BROKEN, ids=lambda x: getattr(x, "__name__", ""))
def test_a_broken_transform_fails_its_check(registered, func, ensures, check):
    name = registered(func, ensures)
    with pytest.raises(AssertionError, match=name):
        check(name)
    with pytest.raises(AssertionError):
        checks.check_transform(name)


def test_a_registry_that_accepts_any_option_fails_option_validation(monkeypatch):
    """Options are checked at the door: without that, the option check fails."""
    monkeypatch.setattr(
        transform_base, "checked_transform_options", lambda transform, options: {**transform.options, **options}
    )
    with pytest.raises(AssertionError, match="option"):
        checks.check_option_validation("coarsen")


def test_trials_that_give_nothing_fail():
    """A transform no case gives options to is not checked by anything: that fails, not passes."""
    name = "broken-untried"
    register_transform(name, requires="", ensures=COLOCATION_ENSURES, trials=lambda graph: [])(
        lambda graph, cluster: TransformResult.identity(graph)
    )
    try:
        with pytest.raises(AssertionError, match="nothing checks it"):
            checks.check_mapping(name)
    finally:
        transform_base._unregister(name)


# ----------------------------------------------------------------- the contract's own rules


def test_unknown_transform_and_options_are_refused_by_name():
    g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8])
    with pytest.raises(OptionError, match="unknown transform 'nope'"):
        apply_transform("nope", g)
    with pytest.raises(OptionError, match="no option 'depth'"):
        apply_transform("coarsen", g, target=1, depth=2)
    with pytest.raises(OptionError, match="needs option 'target'"):
        apply_transform("coarsen", g)
    with pytest.raises(OptionError, match="must be an integer"):
        apply_transform("fuse", g, None, exploration_range=2.5)
    with pytest.raises(OptionError, match="needs a cluster"):
        apply_transform("fuse", g)
    with pytest.raises(OptionError, match="one integer per node"):
        apply_transform("contract", g, groups=[0])


def test_registering_a_name_twice_or_a_bad_signature_is_refused():
    with pytest.raises(TypeError, match="twice"):
        register_transform("coarsen", requires="", ensures=QUOTIENT_ENSURES, trials=lambda g: [])(
            lambda graph, cluster: None
        )
    with pytest.raises(TypeError, match="graph, cluster"):
        register_transform("broken-signature", requires="", ensures=QUOTIENT_ENSURES, trials=lambda g: [])(
            lambda graph: None
        )


def test_a_result_that_does_not_match_its_graphs_is_refused():
    g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8])
    with pytest.raises(ValueError, match="origin maps"):
        TransformResult(g, g, NodeMap.identity(1), NodeMap.identity(2), np.zeros(2, bool), np.zeros(2, np.int64))


def test_expand_reads_one_value_per_original_node_and_refuses_replicas():
    g = training_graph(layers=2, branches=1)
    position = np.empty(g.num_nodes, dtype=np.int64)
    position[g.topological_order] = np.arange(g.num_nodes)
    merged = apply_transform("contract", g, groups=position // 4)  # pieces of a topological order
    devices = np.array(["gpu0", "gpu1"])[np.arange(merged.graph.num_nodes) % 2]
    assert merged.expand(devices).tolist() == [devices[position[u] // 4] for u in range(g.num_nodes)]
    replicated = apply_transform("replicate", g, replicas=2)
    with pytest.raises(ValueError, match="has 2 new nodes"):
        replicated.expand(np.zeros(replicated.graph.num_nodes))


def test_node_map_inverse_is_its_transpose():
    m = NodeMap.from_groups([[2, 0], [], [1, 2]], size=3)
    inverse = m.inverse()
    assert [inverse[i].tolist() for i in range(3)] == [[0], [2], [0, 2]]
    assert inverse.inverse() == m
    with pytest.raises(ValueError, match="outside"):
        NodeMap.function([3], size=2)
