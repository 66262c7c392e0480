"""Bind a plan to its graph, making the splits a plan file lists where it carries no rewritten graph.

FORMATS.md: a plan's placement names the nodes of its rewritten graph when it
splits operations. A plan made by an algorithm carries that graph; a plan file
may list only its ``splits`` (``"rewritten_graph": null``), and then the
graph they make is :func:`target_graph`'s. :meth:`placer.plan.Plan.bind`, a
record's method, does not rewrite graphs; this module, in the transform layer,
does it for it.
"""

from __future__ import annotations

from ..cluster import Cluster
from ..errors import InvalidPlanError, OptionError
from ..graph import OpGraph
from ..plan import BoundPlan, Plan
from .split import split_operation

__all__ = ["target_graph", "bind_plan"]


def target_graph(plan: Plan, graph: OpGraph) -> OpGraph:
    """The graph ``plan`` places: its rewritten graph if it has one, else ``graph`` with its splits made.

    The splits are made in the order the plan lists them, each by
    :func:`placer.transform.split.split_operation`, so that the node ids are
    the ones a plan file's placement names (``conv@part0``, ...).

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
        dimension it may not be split along, parts out of range), naming the split.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2)
    >>> target_graph(Plan({i: "d0" for i in g.ids}), g) is g
    True
    """
    if plan.rewritten_graph is not None:
        return plan.rewritten_graph
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


def bind_plan(plan: Plan, graph: OpGraph, cluster: Cluster) -> BoundPlan:
    """:meth:`Plan.bind` on the graph :func:`target_graph` gives: any plan, any plan file, bound.

    Raises
    ------
    InvalidPlanError
        As :meth:`Plan.bind` and :func:`target_graph`.
    """
    plan.check_made_for(graph)          # the other graph named, before any split is tried
    return plan.bind(graph, cluster, target=target_graph(plan, graph))
