"""Plans (``placer.plan/1``): where every operation runs, in what order, and which were split.

A :class:`Plan` is a record: it names nodes and devices by their ids, exactly
as the file does, so that it can be read without its graph. :meth:`Plan.bind`
resolves it against a graph and a cluster into index arrays, checking
FORMATS.md rule 8. What uses a plan lives in the layers above:
:func:`placer.validate` simulates it and checks memory, :func:`placer.describe`
reports it and :func:`placer.apply` trains with it; a plan file that lists
splits without its rewritten graph is bound by
:func:`placer.transform.bind.bind_plan`, which makes them.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Sequence

import networkx as nx
import numpy as np

from .cluster import Cluster
from .errors import FormatError, InvalidPlanError
from .graph import OpGraph, topological_sort
from .io import Field, check_finite, check_format, check_number, read_json, shown, write_json_atomic

__all__ = ["Plan", "BoundPlan", "PLAN_FORMAT"]

PLAN_FORMAT = "placer.plan/1"
_PLAN_FIELDS = {
    "format",
    "graph",
    "cluster",
    "algorithm",
    "placement",
    "order",
    "splits",
    "rewritten_graph",
    "predicted",
    "search_time_s",
    "graph_digest",
    "cluster_digest",
}


class BoundPlan:
    """A plan resolved against its graph and cluster.

    Attributes
    ----------
    graph : OpGraph
        The graph the plan places (the rewritten graph when ops were split).
    device_of : ndarray of int
        Device index of every node.
    order : list of ndarray, or None
        Per device, node indices in the order that device runs them.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, device_of: np.ndarray, order: list[np.ndarray] | None):
        self.graph = graph
        self.cluster = cluster
        self.device_of = device_of
        self.order = order

    def placed_durations(self) -> np.ndarray:
        """Each node's time on the device the plan puts it on (the graph's cost for that device)."""
        return self.graph.durations(self.cluster)[np.arange(self.graph.num_nodes), self.device_of]


class Plan:
    """Placement, per-device order, splits and predicted figures of one training step.

    Parameters
    ----------
    placement : dict of str to str
        Node id -> device name, for every node of the placed graph.
    order : dict of str to list of str, optional
        Device name -> node ids in the order that device runs them.
    graph_name, cluster_name, algorithm : str
    splits : list of dict, optional
        ``{"node", "dim", "parts"}`` per split operation.
    rewritten_graph : OpGraph, optional
        The graph after splits; placement and order then refer to it.
    predicted : dict, optional
        The simulator's figures for this plan.
    search_time_s : float, optional
    graph_digest : str, optional
        Fingerprint of the graph the plan was made for (:meth:`OpGraph.digest`).
    cluster_digest : str, optional
        Fingerprint of the cluster the plan was made for (:meth:`Cluster.digest`).
    """

    def __init__(
        self,
        placement: dict[str, str],
        order: dict[str, list[str]] | None = None,
        *,
        graph_name: str = "",
        cluster_name: str = "",
        algorithm: str = "",
        splits: list[dict] | None = None,
        rewritten_graph: OpGraph | None = None,
        predicted: dict | None = None,
        search_time_s: float | None = None,
        graph_digest: str | None = None,
        cluster_digest: str | None = None,
        extra: dict | None = None,
    ):
        self.placement = dict(placement)
        self.order = None if order is None else {d: list(v) for d, v in order.items()}
        self.graph_name = graph_name
        self.cluster_name = cluster_name
        self.algorithm = algorithm
        self.splits = list(splits or [])
        self.rewritten_graph = rewritten_graph
        self.predicted = dict(predicted or {})
        self.search_time_s = search_time_s
        self.graph_digest = graph_digest
        self.cluster_digest = cluster_digest
        self.extra = dict(extra or {})
        #: What the plan was made from (graph, cluster, captured model), when placer.plan() made it; not saved.
        self.context: dict[str, Any] = {}
        #: The graph whose transforms made ``rewritten_graph`` here (from_arrays), and the rewritten graph
        #: last rebuilt from a graph, each by weak reference: neither is saved, copied or pickled.
        self._rewritten_of: weakref.ref | None = None
        self._rebuilt: tuple[weakref.ref, OpGraph] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_rewritten_of"] = state["_rebuilt"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"_rewritten_of": None, "_rebuilt": None, **state})

    def __repr__(self) -> str:
        span = self.predicted.get("makespan_s")
        return (
            f"Plan(algorithm={self.algorithm!r}, graph={self.graph_name!r}, cluster={self.cluster_name!r}, "
            f"nodes={len(self.placement)}" + (f", makespan_s={span:.6g})" if span is not None else ")")
        )

    # --------------------------------------------------------- building
    @classmethod
    def from_arrays(
        cls,
        graph: OpGraph,
        cluster: Cluster,
        device_of: Sequence[int] | np.ndarray,
        order: Sequence[Sequence[int]] | None = None,
        *,
        algorithm: str = "",
        placed_graph: OpGraph | None = None,
        splits: list[dict] | None = None,
        **kwargs: Any,
    ) -> "Plan":
        """A plan from a device index per node and optional per-device node-index orders.

        ``placed_graph`` is the rewritten graph when the plan splits operations;
        ``device_of`` and ``order`` then index its nodes.
        """
        target = placed_graph if placed_graph is not None else graph
        names = [d.name for d in cluster.devices]
        ids = target.ids
        placement = {ids[i]: names[j] for i, j in enumerate(np.asarray(device_of).tolist())}
        order_doc = None
        if order is not None:
            order_doc = {names[j]: [ids[i] for i in np.asarray(seq).tolist()] for j, seq in enumerate(order)}
        plan = cls(
            placement,
            order_doc,
            graph_name=graph.name,
            cluster_name=cluster.name,
            algorithm=algorithm,
            splits=splits,
            rewritten_graph=placed_graph,
            graph_digest=graph.digest(),
            cluster_digest=cluster.digest(),
            **kwargs,
        )
        if placed_graph is not None:
            plan._rewritten_of = weakref.ref(graph)  # made here by the transforms: no rebuild for this graph
        return plan

    def rebuilt_for(self, graph: OpGraph) -> OpGraph | None:
        """The graph the plan's transforms made of ``graph`` when it was last checked, or its own rewritten
        graph where it was made here from ``graph`` (:meth:`from_arrays`); None where neither is known."""
        if self._rewritten_of is not None and self._rewritten_of() is graph:
            return self.rewritten_graph
        if self._rebuilt is not None and self._rebuilt[0]() is graph:
            return self._rebuilt[1]
        return None

    def remember_rebuilt(self, graph: OpGraph, rebuilt: OpGraph) -> None:
        """Keep ``rebuilt``, what the plan's transforms make of ``graph``, while ``graph`` lives."""
        self._rebuilt = (weakref.ref(graph), rebuilt)

    @property
    def rewrites_graph(self) -> bool:
        """Whether the plan splits operations or replicates the step (it places a rewritten graph)."""
        return bool(self.splits) or self.rewritten_graph is not None

    # -------------------------------------------------------- checking
    def check_made_for(self, graph: OpGraph) -> None:
        """Refuse ``graph`` unless it is the one the plan was made for (by digest, then by name).

        Raises
        ------
        InvalidPlanError
            Naming both graphs, and what differs: the operations, or only the name.
        """
        if self.graph_digest and self.graph_digest != graph.digest():
            same = (
                (
                    " (the same name, other operations: the model changed, or the plan predates a change to "
                    "placer's capture; plan again)"
                )
                if self.graph_name and self.graph_name == graph.name
                else ""
            )
            raise InvalidPlanError(
                f"the plan was made for another graph ({self.graph_name!r}, "
                f"digest {self.graph_digest}), not {graph.name!r} (digest {graph.digest()}){same}"
            )
        if self.graph_name and graph.name and self.graph_name != graph.name:
            raise InvalidPlanError(
                f"the plan was made for graph {self.graph_name!r}, not {graph.name!r} (the "
                f"same operations: another batch size or optimizer, or a --name at capture)"
            )

    def bind(self, graph: OpGraph, cluster: Cluster, target: Callable[[OpGraph], OpGraph] | None = None) -> BoundPlan:
        """Resolve ids to indices and check FORMATS.md rule 8 (memory is :func:`placer.validate`'s).

        Parameters
        ----------
        graph : OpGraph
            The graph the plan was made for (its digest and name are checked).
        cluster : Cluster
        target : callable, optional
            Makes the graph the placement names from ``graph``, called once
            ``graph`` has passed the checks that it is the plan's. By default
            that graph is the plan's rewritten graph, else ``graph``; a plan
            that lists splits but carries no rewritten graph needs the graph its
            splits make (:func:`placer.transform.bind.bind_plan` passes it).

        Raises
        ------
        InvalidPlanError
            The plan is for another graph, misses or invents nodes or devices,
            breaks device kinds or colocation, its order contradicts the
            dependencies, or it lists splits with no graph they make.
        """
        self.check_made_for(graph)
        if self.rewritten_graph is not None:
            _check_splits_made(self.splits, self.rewritten_graph)
        made_here = target is not None and self.rewritten_graph is None
        if target is not None:
            target = target(graph)
        else:
            if self.splits and self.rewritten_graph is None:
                raise InvalidPlanError(
                    "the plan lists splits but carries no rewritten graph: bind it with "
                    "placer.transform.bind.bind_plan, which makes them"
                )
            target = graph if self.rewritten_graph is None else self.rewritten_graph
        n = target.num_nodes
        device_of = np.full(n, -1, dtype=np.int64)
        # One pass per lookup, not per node: a data-parallel plan places 10^5 nodes or more.
        nodes = _indices(target.index, self.placement.keys(), lambda node_id: self._unknown(node_id, target, made_here))
        devices = _indices(
            cluster.device_index,
            self.placement.values(),
            lambda device: (
                f"node {next(k for k, v in self.placement.items() if v == device)!r} is placed on "
                f"unknown device {device!r}"
            ),
        )
        device_of[nodes] = devices
        missing = np.flatnonzero(device_of < 0)
        if missing.size:
            raise InvalidPlanError(f"the plan leaves {missing.size} node(s) unplaced, e.g. {target.ids[missing[0]]!r}")
        check_placement(target, cluster, device_of)
        order = None if self.order is None else self._bind_order(target, cluster, device_of)
        return BoundPlan(target, cluster, device_of, order)

    def _unknown(self, node_id: str, target: OpGraph, made_here: bool) -> str:
        """The message for a placement of ``node_id``, which ``target`` lacks; where the plan's splits were
        made for this binding, what they made instead (the placement names the rewritten graph's nodes)."""
        message = f"the plan places unknown node {node_id!r}"
        if not made_here:
            return message
        for k, split in enumerate(self.splits):
            if node_id == split["node"] or node_id.startswith(split["node"] + "@"):
                made = [i for i in target.ids if i.startswith(split["node"] + "@")]
                return (
                    f"{message}: splits[{k}] rewrites {split['node']!r} into "
                    f"{', '.join(map(repr, made))}, which the placement names instead"
                )
        return message

    def _bind_order(self, graph: OpGraph, cluster: Cluster, device_of: np.ndarray) -> list[np.ndarray]:
        order: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * cluster.num_devices
        listed = np.zeros(graph.num_nodes, dtype=bool)
        for device, seq in self.order.items():
            j = cluster.device_index.get(device)
            if j is None:
                raise InvalidPlanError(f"the order names unknown device {device!r}")
            idx = _indices(graph.index, seq, lambda node_id: f"the order of {device!r} names unknown node {node_id!r}")
            elsewhere = np.flatnonzero(device_of[idx] != j)
            if elsewhere.size:
                i = idx[elsewhere[0]]
                raise InvalidPlanError(
                    f"the order of {device!r} lists {graph.ids[i]!r}, which is placed on "
                    f"{cluster.devices[device_of[i]].name!r}"
                )
            counts = np.bincount(idx, minlength=1)
            if counts.max() > 1:
                raise InvalidPlanError(f"the order lists node {graph.ids[int(np.argmax(counts))]!r} twice")
            listed[idx] = True
            order[j] = idx
        unlisted = np.flatnonzero(~listed)
        if unlisted.size:
            i = unlisted[0]
            raise InvalidPlanError(
                f"the order of {cluster.devices[device_of[i]].name!r} leaves out node {graph.ids[i]!r}"
            )
        check_order_acyclic(graph, order, [d.name for d in cluster.devices])
        return order

    # ---------------------------------------------------------------- io
    def to_dict(self) -> dict:
        doc: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "graph": self.graph_name,
            "cluster": self.cluster_name,
            "algorithm": self.algorithm,
            "placement": self.placement,
        }
        if self.order is not None:
            doc["order"] = self.order
        doc["splits"] = self.splits
        doc["rewritten_graph"] = None if self.rewritten_graph is None else self.rewritten_graph.to_dict()
        doc["predicted"] = self.predicted
        doc["search_time_s"] = self.search_time_s
        if self.graph_digest:
            doc["graph_digest"] = self.graph_digest
        if self.cluster_digest:
            doc["cluster_digest"] = self.cluster_digest
        doc.update(self.extra)
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> "Plan":
        where = f"plan {source}" if source else "plan"
        check_format(doc, PLAN_FORMAT, where)
        f = Field(doc, where)
        placement = f.mapping("placement", required=True)
        for node_id, device in placement.items():
            if not isinstance(device, str):
                raise FormatError(f"{where}: placement of node {node_id!r} must be a device name, got {shown(device)}")
        order = f.mapping("order")
        if order is not None:
            for device, seq in order.items():
                if not (isinstance(seq, list) and all(isinstance(x, str) for x in seq)):
                    raise FormatError(f"{where}: order of device {device!r} must be a list of node ids")
        splits = f.array("splits") or []
        for k, item in enumerate(splits):
            sf = Field(item, f"{where}: splits[{k}]")
            sf.string("node", required=True)
            sf.integer("parts", required=True, minimum=2)
            check_finite(item, sf.where)
        rewritten = doc.get("rewritten_graph")
        rewritten_graph = (
            None if rewritten is None else OpGraph.from_dict(rewritten, source=f"{where} (rewritten_graph)")
        )
        predicted = f.mapping("predicted") or {}
        figures = Field(predicted, f"{where}: predicted")
        figures.number("makespan_s")
        figures.number("lower_bound_s")
        for device, peak in (figures.mapping("peak_memory_bytes") or {}).items():
            check_number(peak, f"{figures.where}: field 'peak_memory_bytes.{device}'")
        check_finite(predicted, figures.where)
        return cls(
            placement,
            order,
            graph_name=f.string("graph", default=""),
            cluster_name=f.string("cluster", default=""),
            algorithm=f.string("algorithm", default=""),
            splits=splits,
            rewritten_graph=rewritten_graph,
            predicted=predicted,
            search_time_s=f.number("search_time_s"),
            graph_digest=f.string("graph_digest"),
            cluster_digest=f.string("cluster_digest"),
            extra=f.extra(_PLAN_FIELDS),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        return cls.from_dict(read_json(path, "plan file"), source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        """Write the ``placer.plan/1`` file atomically, with the digests of its graph and cluster."""
        write_json_atomic(path, self.to_dict(), "plan file")


def _indices(index: dict, keys, unknown: Callable[[Any], str]) -> np.ndarray:
    """``index[key]`` for every key, as an array; InvalidPlanError with the message ``unknown(key)`` for the
    first key ``index`` lacks."""
    try:
        return np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))
    except KeyError as exc:
        raise InvalidPlanError(unknown(exc.args[0])) from None


def check_placement(graph: OpGraph, cluster: Cluster, device_of: np.ndarray) -> None:
    """Raise InvalidPlanError if a node sits on a device its kinds or colocation forbid."""
    allowed = graph.allowed(cluster)
    bad = np.flatnonzero(~allowed[np.arange(graph.num_nodes), device_of])
    if bad.size:
        i = bad[0]
        d = cluster.devices[device_of[i]]
        raise InvalidPlanError(
            f"node {graph.ids[i]!r} may run only on kinds {list(graph.device_kinds[i])}, "
            f"but is placed on {d.name!r} of kind {d.kind!r}"
        )
    for key, members in graph.colocation_groups.items():
        devices = np.unique(device_of[members])
        if devices.size > 1:
            names = [cluster.devices[j].name for j in devices[:3]]
            raise InvalidPlanError(f"colocation group {key!r} is split across devices {names}")


def _check_splits_made(splits: list[dict], rewritten: OpGraph) -> None:
    """Raise InvalidPlanError unless ``rewritten`` holds each split's parts (its ``dim``, ``parts`` of them)."""
    made: dict[str, list[dict]] = {}
    for extra in rewritten.node_extra:
        if "split_of" in extra and "part" in extra:
            made.setdefault(extra["split_of"], []).append(extra)
    for k, split in enumerate(splits):
        parts = made.get(split["node"], [])
        dims = {part.get("dim") for part in parts}
        if len(parts) != split["parts"] or split.get("dim", "batch") not in dims:
            raise InvalidPlanError(
                f"splits[{k}] ({split['node']!r} along {split.get('dim', 'batch')!r} into "
                f"{split['parts']} parts) is not what the plan's rewritten graph holds "
                f"({len(parts)} parts of it{f' along {sorted(dims)}' if parts else ''})"
            )


def check_order_acyclic(graph: OpGraph, order: Sequence[np.ndarray], device_names: Sequence[str] | None = None) -> None:
    """Raise InvalidPlanError if running each device's nodes in ``order`` contradicts the edges.

    The message walks one cycle of dependencies and order ("'a' feeds 'b'; 'b' comes before 'a' in the
    order of 'd0'"), ``device_names`` naming the devices (default: their indices).
    """
    chains = [(seq[:-1], seq[1:]) for seq in order if len(seq) > 1]
    src = np.concatenate([graph.src] + [a for a, _ in chains])
    dst = np.concatenate([graph.dst] + [b for _, b in chains])
    topo = topological_sort(graph.num_nodes, src, dst)
    if topo.size < graph.num_nodes:
        stuck = np.ones(graph.num_nodes, dtype=bool)
        stuck[topo] = False
        raise InvalidPlanError(
            "the order contradicts the dependencies (it would deadlock): "
            + _order_cycle(graph, order, stuck, device_names)
        )


def _order_cycle(
    graph: OpGraph, order: Sequence[np.ndarray], stuck: np.ndarray, device_names: Sequence[str] | None
) -> str:
    """One cycle among the ``stuck`` nodes, told as the dependencies and orders that make it."""

    links = nx.DiGraph()
    for j, seq in enumerate(order):
        a, b = seq[:-1], seq[1:]
        kept = stuck[a] & stuck[b]
        links.add_edges_from(zip(a[kept].tolist(), b[kept].tolist()), device=j)
    kept = stuck[graph.src] & stuck[graph.dst]
    links.add_edges_from(zip(graph.src[kept].tolist(), graph.dst[kept].tolist()), device=None)  # feeds wins
    steps = []
    for u, v in nx.find_cycle(links):
        device = links.edges[u, v]["device"]
        if device is not None and steps and steps[-1][2] == device:
            steps[-1][1] = v  # a run of one device's order reads as one "comes before"
        else:
            steps.append([u, v, device])
    name = (lambda j: repr(device_names[j])) if device_names is not None else str
    told = [
        f"{graph.ids[u]!r} feeds {graph.ids[v]!r}"
        if device is None
        else f"{graph.ids[u]!r} comes before {graph.ids[v]!r} in the order of {name(device)}"
        for u, v, device in steps
    ]
    return "; ".join(told[:6]) + ("; ..." if len(told) > 6 else "")
