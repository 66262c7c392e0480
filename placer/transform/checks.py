"""The contract every registered transform must honour, as runnable checks.

As :mod:`placer.algorithms.checks` does for algorithms (and scikit-learn's
``check_estimator`` for estimators): :func:`check_transform` runs every check
in :data:`CHECKS` on one transform by name, over every graph of
:func:`transform_cases` and every set of options the transform's ``trials``
give for it, and the test suite runs them on every registered transform, so
a new transform is held to the contract the moment it is registered:

- its result is a valid OpGraph (it reads back from its file form) and is
  acyclic (checked by networkx, not by the graph's own check);
- its map is total (every original node has a new node), both directions
  agree, and every node it does not add stands for some original node;
- it conserves durations and memory by the laws its :class:`~placer.transform.base.Ensures`
  states, and transfers where it states a law for them;
- it keeps colocation and device kinds where it says so;
- it keeps every dependency between blocks;
- it leaves its input untouched and is deterministic;
- it refuses unknown, missing and mistyped options with OptionError.

Each check takes the transform's name and raises AssertionError naming the
case and options where the transform breaks its contract.

Examples
--------
>>> check_mapping("colocate_layers")     # passes quietly
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, NamedTuple

import networkx as nx
import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ..cluster import Cluster, load_cluster
from ..errors import OptionError
from ..generate import contract_cases, training_graph
from ..graph import OpGraph
from .base import (
    CUT,
    MAX,
    REQUIRED,
    SAME,
    SHARE_AND_WHOLE,
    SHARE_OR_WHOLE,
    SUM,
    Transform,
    TransformResult,
    get_transform,
)

__all__ = [
    "CHECKS",
    "check_transform",
    "transform_cases",
    "check_valid_graph",
    "check_mapping",
    "check_conservation",
    "check_transfers",
    "check_constraints",
    "check_dependencies",
    "check_input_untouched",
    "check_determinism",
    "check_option_validation",
]

#: Relative tolerance of float sums: the same numbers added in another order.
RTOL = 1e-9


class Run(NamedTuple):
    """One run of a transform: the case, the options, and what it returned."""

    label: str
    graph: OpGraph
    cluster: Cluster
    options: dict[str, Any]
    result: TransformResult

    def where(self, name: str) -> str:
        shown = {k: (f"<{len(v)} values>" if isinstance(v, np.ndarray) else v) for k, v in self.options.items()}
        return f"{name} on {self.label} with {shown}"


def _with_times_by_kind(graph: OpGraph) -> OpGraph:
    """Per-kind timings on every other node: A100 faster than the reference, V100 as measured."""
    times = [{"A100": float(t) / 1.7, "V100": float(t) * 1.1} if i % 2 else None for i, t in enumerate(graph.compute_s)]
    return graph.replace(compute_s_by_kind=times)


def _with_fixed_parts(graph: OpGraph) -> OpGraph:
    """V100 timings on every node, a third of each a fixed part that no share of the batch shrinks."""
    times = [{"V100": float(t) * 1.1} for t in graph.compute_s]
    extras = [
        {**(extra or {}), "fixed_s": {"V100": float(t) * 1.1 / 3}}
        for extra, t in zip(graph.node_extra, graph.compute_s)
    ]
    return graph.replace(compute_s_by_kind=times, node_extra=extras)


def _with_splits(graph: OpGraph) -> OpGraph:
    """Forward operations splittable along the batch (32 samples) and their 16 output channels."""
    entries = [
        [{"dim": "batch", "size": 32}, {"dim": "channel", "size": 16}] if x.endswith(".fwd") else None
        for x in graph.ids
    ]
    return graph.replace(splittable=entries)


@lru_cache(maxsize=1)
def _zoo_document() -> str:
    from ..capture import capture_spec  # deferred: imports torch

    return json.dumps(capture_spec("zoo:lenet", 4, optimizer="sgd").graph.to_dict())


def _zoo_step() -> OpGraph:
    """A captured training step: LeNet at batch 4 with SGD (its splittable operations declared by capture).

    Captured once per process, and read afresh for every caller: a transform that changed its input must
    not change what the next check is given.
    """
    return OpGraph.from_dict(json.loads(_zoo_document()))


def transform_cases() -> list[tuple[str, OpGraph, Cluster]]:
    """Graphs every transform must handle, with the cluster they are costed on: (label, graph, cluster).

    The algorithms' contract cases (:func:`placer.algorithms.checks.contract_cases`: layered and random
    graphs, colocation, device kinds, parallel edges, an empty graph, a graph that costs nothing), a graph
    with per-kind timings on mixed devices, a generated graph with splittable operations, and a captured
    zoo step, also with fixed parts in its timings (:func:`~placer.transform.base.part_times`).
    """
    mixed = next(c for label, _, c in contract_cases() if label == "kinds-mixed")
    return contract_cases() + [
        ("times-by-kind", _with_times_by_kind(training_graph(layers=3, branches=2, seed=7)), mixed),
        ("splittable", _with_splits(training_graph(layers=2, branches=2, seed=8)), load_cluster("4xV100-nvlink")),
        ("zoo-lenet", _zoo_step(), load_cluster("2xV100-nvlink")),
        ("zoo-lenet-fixed-parts", _with_fixed_parts(_zoo_step()), load_cluster("2xV100-nvlink")),
    ]


def _runs(name: str) -> Iterator[Run]:
    """Every case and every trial of the transform on it; AssertionError if no case gives it a trial."""
    transform = get_transform(name)
    count = 0
    for label, graph, cluster in transform_cases():
        for options in transform.trials(graph):
            count += 1
            yield Run(label, graph, cluster, options, transform(graph, cluster, **options))
    assert count, f"{name}: its trials give no options on any case, so nothing checks it"


def _equal(a: np.ndarray, b: np.ndarray, integer: bool) -> np.ndarray:
    return a == b if integer else np.isclose(a, b, rtol=RTOL, atol=1e-12)


def _blocks(result: TransformResult) -> tuple[np.ndarray, np.ndarray, int]:
    """Block of every original node and of every new node (-1 for added ones), and the number of blocks.

    The blocks are the connected pieces of the map between original nodes and the new nodes not added.
    """
    n_old, n_new = result.original.num_nodes, result.graph.num_nodes
    rows, cols = result.origin.sources, result.origin.index
    keep = ~result.added[rows]
    rows, cols = rows[keep], cols[keep]
    size = n_old + n_new
    adjacency = coo_matrix((np.ones(rows.size), (cols, n_old + rows)), shape=(size, size))
    count, label = connected_components(adjacency, directed=False)
    return label[:n_old], np.where(result.added, -1, label[n_old:]), int(count)


def _law_failure(law: str, before: np.ndarray, after: np.ndarray, result: TransformResult) -> str | None:
    """Where ``after`` (per new node) breaks ``law`` against ``before`` (per original node), or None."""
    integer = before.dtype.kind in "iu"
    block_old, block_new, count = _blocks(result)
    kept = np.flatnonzero(block_new >= 0)
    if law == SAME:
        single = result.origin.sizes[kept] == 1
        if not single.all():
            v = kept[~single][0]
            return f"new node {result.graph.ids[v]!r} stands for {int(result.origin.sizes[v])} nodes, not one"
        source = result.origin.index[result.origin.ptr[kept]]
        bad = np.flatnonzero(~_equal(after[kept], before[source], integer))
        if bad.size:
            v = kept[bad[0]]
            u = source[bad[0]]
            return f"new node {result.graph.ids[v]!r} has {after[v].item()!r}, its original {before[u].item()!r}"
        return None
    dtype = np.int64 if integer else np.float64
    sum_old, sum_new = np.zeros(count, dtype=dtype), np.zeros(count, dtype=dtype)
    np.add.at(sum_old, block_old, before)
    np.add.at(sum_new, block_new[kept], after[kept])
    if law == SUM:
        ok = _equal(sum_new, sum_old, integer)
        got, want = sum_new, sum_old
    elif law == MAX:
        low = np.iinfo(np.int64).min if integer else -np.inf
        max_old, max_new = np.full(count, low, dtype=dtype), np.full(count, low, dtype=dtype)
        np.maximum.at(max_old, block_old, before)
        np.maximum.at(max_new, block_new[kept], after[kept])
        ok = _equal(max_new, max_old, integer)
        got, want = max_new, max_old
    elif law == SHARE_OR_WHOLE:
        copies = np.bincount(block_new[kept], minlength=count)
        # Shares in whole bytes round by at most half a byte each.
        shared = 2 * np.abs(sum_new - sum_old) <= copies if integer else _equal(sum_new, sum_old, False)
        whole = np.ones(count, dtype=bool)
        np.logical_and.at(whole, block_new[kept], _equal(after[kept], sum_old[block_new[kept]], integer))
        ok = shared | whole
        got, want = sum_new, sum_old
    elif law == SHARE_AND_WHOLE:
        copies = np.bincount(block_new[kept], minlength=count)
        # Shares in whole bytes round by at most half a byte each.
        enough = sum_new >= sum_old - (copies / 2 if integer else np.abs(sum_old) * RTOL)
        within = np.ones(count, dtype=bool)
        top = sum_old[block_new[kept]]
        np.logical_and.at(
            within, block_new[kept], after[kept] <= (top if integer else top + np.abs(top) * RTOL + 1e-12)
        )
        ok = enough & within
        got, want = sum_new, sum_old
    else:
        raise ValueError(f"unknown law {law!r}")
    bad = np.flatnonzero(~ok)
    if not bad.size:
        return None
    b = int(bad[0])
    names = [result.original.ids[u] for u in np.flatnonzero(block_old == b)[:4].tolist()]
    return f"the new nodes standing for {names} have {got[b].item()!r} where the law wants {want[b].item()!r}"


def check_valid_graph(name: str) -> None:
    """The result is an OpGraph that reads back from its file form, and networkx finds it acyclic."""
    for run in _runs(name):
        graph = run.result.graph
        assert isinstance(graph, OpGraph), f"{run.where(name)}: the result holds a {type(graph).__name__}"
        assert run.result.original is run.graph, f"{run.where(name)}: the result's original is not its input"
        dag = nx.DiGraph()
        dag.add_nodes_from(range(graph.num_nodes))
        dag.add_edges_from(zip(graph.src.tolist(), graph.dst.tolist()))
        assert nx.is_directed_acyclic_graph(dag), f"{run.where(name)}: the new graph has a cycle"
        again = OpGraph.from_dict(json.loads(json.dumps(graph.to_dict(), allow_nan=False)))
        assert again.digest() == graph.digest(), f"{run.where(name)}: the new graph reads back differently"
        assert np.array_equal(again.compute_s, graph.compute_s), f"{run.where(name)}: times read back differently"


def check_mapping(name: str) -> None:
    """Every original node has a new node; origin and image agree; only added nodes stand for nothing."""
    for run in _runs(name):
        r = run.result
        where = run.where(name)
        missing = np.flatnonzero(r.image.sizes == 0)
        assert not missing.size, f"{where}: original node {r.original.ids[missing[0]]!r} has no new node"
        orphan = np.flatnonzero((r.origin.sizes == 0) & ~r.added)
        assert not orphan.size, f"{where}: new node {r.graph.ids[orphan[0]]!r} stands for no original node"
        forward = np.stack([r.image.sources, r.image.index])  # (original, new)
        back = np.stack([r.origin.index, r.origin.sources])  # (original, new)

        def pairs(p):
            return set(zip(*p.tolist()))

        only_image = pairs(forward) - pairs(back)
        only_origin = pairs(back) - pairs(forward)
        assert not only_image, (
            f"{where}: {len(only_image)} pairs in the image but not the origin, as "
            f"{[(r.original.ids[u], r.graph.ids[v]) for u, v in sorted(only_image)[:3]]}"
        )
        assert not only_origin, (
            f"{where}: {len(only_origin)} pairs in the origin but not the image, as "
            f"{[(r.original.ids[u], r.graph.ids[v]) for u, v in sorted(only_origin)[:3]]}"
        )
        assert np.all(r.copy >= 0), f"{where}: a negative copy number"
        if np.all(r.image.sizes == 1):  # a value per new node reads back on the original's nodes
            back_again = r.expand(np.arange(r.graph.num_nodes))
            assert all(u in r.origin[v] for u, v in enumerate(back_again.tolist())), f"{where}: expand disagrees"


def check_conservation(name: str) -> None:
    """Durations on every device of the case's cluster, and the memory fields, follow the stated laws."""
    ensures = get_transform(name).ensures
    for run in _runs(name):
        r = run.result
        before, after = r.original.durations(run.cluster), r.graph.durations(run.cluster)
        for j, device in enumerate(run.cluster.devices):
            failure = _law_failure(ensures.compute, before[:, j], after[:, j], r)
            assert failure is None, (
                f"{run.where(name)}: durations on {device.name} break '{ensures.compute}': {failure}"
            )
        for field in ("output_bytes", "param_bytes", "temp_bytes"):
            law = getattr(ensures, field)
            failure = _law_failure(law, getattr(r.original, field), getattr(r.graph, field), r)
            assert failure is None, f"{run.where(name)}: {field} breaks '{law}': {failure}"


def check_transfers(name: str) -> None:
    """Edges follow the stated transfer law: the same edges, or the original's transfers between blocks."""
    law = get_transform(name).ensures.transfers
    if law is None:
        return
    for run in _runs(name):
        r, where = run.result, run.where(name)
        old, new = r.original, r.graph
        if law == SAME:
            assert not r.added.any() and np.all(r.origin.sizes == 1), f"{where}: 'same' edges need a one-to-one map"
            source = r.origin.index
            got = sorted(
                zip(
                    source[new.src].tolist(),
                    source[new.dst].tolist(),
                    new.edge_bytes.tolist(),
                    new.edge_tensor.tolist(),
                )
            )
            want = sorted(zip(old.src.tolist(), old.dst.tolist(), old.edge_bytes.tolist(), old.edge_tensor.tolist()))
            assert got == want, f"{where}: the edges changed"
            continue
        assert law == CUT, law
        block_old, block_new, _ = _blocks(r)
        largest: dict[tuple[int, int, int], int] = {}  # (producer, tensor, consuming block) -> bytes
        for u, v, t, b in zip(old.src.tolist(), old.dst.tolist(), old.edge_tensor.tolist(), old.edge_bytes.tolist()):
            if block_old[u] != block_old[v]:
                key = (u, t, int(block_old[v]))
                largest[key] = max(largest.get(key, 0), b)
        want: dict[tuple[int, int], int] = {}
        for (u, _, bv), b in largest.items():
            want[(int(block_old[u]), bv)] = want.get((int(block_old[u]), bv), 0) + b
        got: dict[tuple[int, int], int] = {}
        for s, d, b in zip(block_new[new.src].tolist(), block_new[new.dst].tolist(), new.edge_bytes.tolist()):
            if s >= 0 and d >= 0 and s != d:
                got[(s, d)] = got.get((s, d), 0) + b
        assert got == want, (
            f"{where}: transfers between blocks differ from the original's in "
            f"{len(set(got.items()) ^ set(want.items()))} entries"
        )


def check_constraints(name: str) -> None:
    """New nodes may use only kinds their originals may; a colocation group stays together within each copy."""
    if not get_transform(name).ensures.constraints:
        return
    for run in _runs(name):
        r, where = run.result, run.where(name)
        old, new = r.original, r.graph
        for v in np.flatnonzero(~r.added).tolist():
            for u in r.origin[v].tolist():
                if old.device_kinds[u] is not None:
                    assert new.device_kinds[v] is not None and set(new.device_kinds[v]) <= set(old.device_kinds[u]), (
                        f"{where}: {new.ids[v]!r} may run on {new.device_kinds[v]}, its original {old.ids[u]!r} "
                        f"only on {old.device_kinds[u]}"
                    )
        for key, members in old.colocation_groups.items():
            images = np.unique(np.concatenate([r.image[u] for u in members.tolist()]))
            images = images[~r.added[images]]
            for c in np.unique(r.copy[images]).tolist():
                together = images[r.copy[images] == c]
                labels = {new.colocation[v] for v in together.tolist()}
                assert together.size < 2 or (len(labels) == 1 and None not in labels), (
                    f"{where}: colocation group {key!r} (copy {c}) is spread over labels {labels}"
                )


def _ancestors(graph: OpGraph) -> list[int]:
    """Every node's ancestors, as a bit set."""
    reach = [0] * graph.num_nodes
    ptr, eids = graph.in_edges
    src = graph.src.tolist()
    for v in graph.topological_order.tolist():
        bits = 0
        for e in eids[ptr[v] : ptr[v + 1]].tolist():
            bits |= reach[src[e]] | (1 << src[e])
        reach[v] = bits
    return reach


def check_dependencies(name: str) -> None:
    """For every original edge between blocks, each new node standing for its consumer is reachable from
    one standing for its producer."""
    for run in _runs(name):
        r, where = run.result, run.where(name)
        block_old, _, _ = _blocks(r)
        reach = _ancestors(r.graph)
        for u, v in set(zip(r.original.src.tolist(), r.original.dst.tolist())):
            if block_old[u] == block_old[v]:
                continue
            producers = 0
            for a in r.image[u].tolist():
                if not r.added[a]:
                    producers |= 1 << a
            for b in r.image[v].tolist():
                assert r.added[b] or reach[b] & producers, (
                    f"{where}: {r.graph.ids[b]!r} no longer depends on {r.original.ids[u]!r}"
                )


def _snapshot(graph: OpGraph) -> str:
    return json.dumps(graph.to_dict(), sort_keys=True, default=str)


def check_input_untouched(name: str) -> None:
    """The transform changes nothing of the graph it is given."""
    transform = get_transform(name)
    for label, graph, cluster in transform_cases():
        for options in transform.trials(graph):
            before = _snapshot(graph)
            transform(graph, cluster, **options)
            assert _snapshot(graph) == before, f"{name} on {label} with {options}: it changed its input"


def check_determinism(name: str) -> None:
    """The same graph and options give the same graph and map."""
    transform = get_transform(name)
    for run in _runs(name):
        again = transform(run.graph, run.cluster, **run.options)
        first, second = run.result, again
        assert _snapshot(first.graph) == _snapshot(second.graph), f"{run.where(name)}: the graph differs between runs"
        assert first.origin == second.origin and first.image == second.image, f"{run.where(name)}: the map differs"
        assert np.array_equal(first.added, second.added) and np.array_equal(first.copy, second.copy), (
            f"{run.where(name)}: added or copy differs between runs"
        )


def _mistyped(default: Any) -> Any:
    """A value of another type than ``default``'s (for the option types the registry checks)."""
    if isinstance(default, bool):
        return "yes"
    if isinstance(default, int):
        return 1.5
    if isinstance(default, float):
        return "x"
    if isinstance(default, str):
        return 3
    return None


def _refused(transform: Transform, graph: OpGraph, cluster: Cluster | None, options: dict) -> bool:
    """Whether the call raises OptionError (any other outcome, another error included, is no refusal)."""
    try:
        transform(graph, cluster, **options)
    except OptionError:
        return True
    except Exception:  # noqa: BLE001 - an error other than OptionError is no refusal
        return False
    return False


def check_option_validation(name: str) -> None:
    """An unknown option, a missing required one, a mistyped one and a missing cluster raise OptionError."""
    transform = get_transform(name)
    trial = next(((label, g, c, o) for label, g, c in transform_cases() for o in transform.trials(g)), None)
    assert trial is not None, f"{name}: its trials give no options on any case, so nothing checks it"
    label, graph, cluster, options = trial
    where = f"{name} on {label}"
    assert _refused(transform, graph, cluster, {**options, "no_such_option": 1}), (
        f"{where}: an unknown option was not refused with OptionError"
    )
    for key, default in transform.options.items():
        if default is REQUIRED:
            rest = {k: v for k, v in options.items() if k != key}
            assert _refused(transform, graph, cluster, rest), (
                f"{where}: no OptionError without its required option {key!r}"
            )
        elif _mistyped(default) is not None:
            bad = _mistyped(default)
            assert _refused(transform, graph, cluster, {**options, key: bad}), (
                f"{where}: no OptionError for option {key}={bad!r}"
            )
    if transform.needs_cluster:
        assert _refused(transform, graph, None, options), f"{where}: no OptionError without the cluster it needs"


CHECKS = (
    check_valid_graph,
    check_mapping,
    check_conservation,
    check_transfers,
    check_constraints,
    check_dependencies,
    check_input_untouched,
    check_determinism,
    check_option_validation,
)


def check_transform(name: str) -> None:
    """Run every contract check on the transform registered as ``name``; AssertionError on failure."""
    for check in CHECKS:
        check(name)
