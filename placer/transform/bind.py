"""Bind a plan to its graph: make, or check, the graph its transforms make of it.

FORMATS.md: a plan's placement names the nodes of its rewritten graph when it
splits operations or replicates the step. A plan file may list only its
``splits`` (``"rewritten_graph": null``), or carry a rewritten graph that
must be checked against the graph it is given: :func:`target_graph` makes
the graph either way. :meth:`placer.plan.Plan.bind`, a record's method, does
not rewrite graphs; this module, in the transform layer, does it for it.
"""

from __future__ import annotations

from ..cluster import Cluster
from ..errors import InvalidPlanError, OptionError
from ..graph import OpGraph
from ..plan import BoundPlan, Plan
from .microbatch import microbatch_graph
from .replicate import BUCKET_BYTES, data_parallel_graph
from .split import split_operation

__all__ = ["target_graph", "bind_plan"]


def target_graph(plan: Plan, graph: OpGraph) -> OpGraph:
    """The graph ``plan`` places: what its transforms make of ``graph``, or ``graph`` where it has none.

    The transforms are the data-parallel step its rewritten graph records
    (:func:`placer.transform.replicate.data_parallel_graph`), then its splits
    in the order listed (:func:`placer.transform.split.split_operation`), so
    that node ids are the ones a plan file's placement names
    (``conv@part0``, ``r1/conv``, ...). A rewritten graph read from a file is
    made again from ``graph`` and must have the same nodes and edges: the
    graph made again, with ``graph``'s costs, is the one placed, as a plan
    without a rewritten graph is simulated on the costs of the graph it is
    given. A plan made here from ``graph`` keeps its own rewritten graph.

    Parameters
    ----------
    plan : Plan
    graph : OpGraph
        The graph the plan was made for.

    Returns
    -------
    OpGraph

    Raises
    ------
    InvalidPlanError
        A split the graph cannot make (an unknown node, a node split twice, a
        dimension it may not be split along, parts out of range), naming the
        split; or a rewritten graph that is not what the transforms make of
        ``graph`` (edited, cut, or of another graph).

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2)
    >>> target_graph(Plan({i: "d0" for i in g.ids}), g) is g
    True
    """
    if plan.rewritten_graph is None:
        return _split(plan, graph)
    known = plan.rebuilt_for(graph)
    if known is None:
        known = _rebuild(plan, graph)
        plan.remember_rebuilt(graph, known)
    return known


def _split(plan: Plan, graph: OpGraph) -> OpGraph:
    """``graph`` with the plan's splits made, in order."""
    rewritten = graph
    for k, split in enumerate(plan.splits):
        earlier = next((j for j in range(k) if plan.splits[j]["node"] == split["node"]), None)
        if earlier is not None:
            raise InvalidPlanError(f"splits[{k}] splits {split['node']!r} again (splits[{earlier}] did)")
        if split["node"] not in rewritten.index:
            raise InvalidPlanError(f"splits[{k}] names unknown node {split['node']!r}")
        try:
            rewritten = split_operation(rewritten, split["node"], split.get("dim", "batch"), split["parts"])
        except OptionError as exc:
            raise InvalidPlanError(f"splits[{k}]: {exc}") from None
    return rewritten


def _rebuild(plan: Plan, graph: OpGraph) -> OpGraph:
    """What the transforms the rewritten graph records make of ``graph`` (micro-batches, then the
    data-parallel step, then splits); InvalidPlanError unless it has the rewritten graph's nodes, edges
    and data-parallel settings."""
    kept = plan.rewritten_graph
    base, made = graph, "its splits"
    cut = kept.extra.get("microbatches")
    if isinstance(cut, dict) and graph.extra.get("microbatches") is None:
        try:
            base = microbatch_graph(graph, int(cut["count"]), int(cut.get("groups", 1))).graph
        except (KeyError, TypeError, ValueError, OptionError) as exc:
            raise InvalidPlanError(
                f"the plan's rewritten graph records micro-batches placer cannot make of graph {graph.name!r} "
                f"({type(exc).__name__}: {exc}); plan again"
            ) from None
        made = "its micro-batches and splits"
    info = kept.extra.get("data_parallel")
    if info is not None and info != base.extra.get("data_parallel"):
        try:
            collective = next(
                (
                    extra["allreduce"]["collective"]
                    for extra in kept.node_extra
                    if isinstance(extra, dict) and isinstance(extra.get("allreduce"), dict)
                ),
                "ring",
            )
            bucket_bytes = int(info.get("bucket_bytes") or BUCKET_BYTES)
            base = data_parallel_graph(
                base,
                int(info["replicas"]),
                bucket_bytes=bucket_bytes,
                shard_optimizer=bool(info["sharded_optimizer"]),
                collective=collective,
                hosts=info.get("hosts"),
                first_bucket_bytes=int(info.get("first_bucket_bytes") or bucket_bytes),
                collective_cost=info.get("collective_cost"),
            ).graph
        except (KeyError, TypeError, ValueError, AttributeError, OptionError) as exc:
            raise InvalidPlanError(
                f"the plan's rewritten graph records a data-parallel step placer cannot make "
                f"of graph {graph.name!r} ({type(exc).__name__}: {exc}); plan again"
            ) from None
        made = "its data-parallel step and splits"
    rebuilt = _split(plan, base)
    settings = rebuilt.extra.get("data_parallel") or {}
    if rebuilt.digest() != kept.digest() or any(settings.get(k) != v for k, v in (info or {}).items()):
        raise InvalidPlanError(
            f"the plan's rewritten graph ({kept.num_nodes} nodes, {kept.num_edges} edges) is not what {made} "
            f"make of graph {graph.name!r} ({rebuilt.num_nodes} nodes, {rebuilt.num_edges} edges): the plan was "
            f"edited, or made for another graph; plan again"
        )
    return rebuilt


def bind_plan(plan: Plan, graph: OpGraph, cluster: Cluster) -> BoundPlan:
    """:meth:`Plan.bind` on the graph :func:`target_graph` gives: any plan, any plan file, bound.

    Raises
    ------
    InvalidPlanError
        As :meth:`Plan.bind` and :func:`target_graph`.
    """
    return plan.bind(graph, cluster, target=lambda made_for: target_graph(plan, made_for))
