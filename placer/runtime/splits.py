"""Execute operations split by OS-DPOS as real split, parts and concat.

:func:`placer.transform.split.split_operation` rewrites one operation ``X``
of the graph into split nodes (``X@split<j>``: one input cut into batch
slices), parts (``X@part<k>``: ``X`` on rows ``[lo, hi)`` of every sliced
input, the other inputs whole) and concat nodes (``X@concat0``: the parts'
outputs joined along the batch). :func:`split_step` makes the same rewrite
of the captured step's fx graph, so that every node of the rewritten graph
is an fx node the executors can place and run:

* a split node slices its input (views, no copy) and returns the slices;
  ``getitem`` nodes pick them, carried by the split node like any
  multi-output op;
* a part runs ``X``'s own aten operation on its slices;
* a concat node joins the parts into a tensor with ``X``'s output strides,
  so that everything downstream computes on exactly the layout it was
  captured with.

Only batch splits of single-output aten operations whose sliced inputs lead
with the batch are executed; anything else is refused naming the node.
"""

from __future__ import annotations

import copy
import operator
from typing import Sequence

import torch
import torch.fx as fx

from ..errors import InvalidPlanError
from ..graph import OpGraph
from ..transform.replicate import RUNNABLE_HOW, replicated_node

__all__ = ["split_step", "refuse_replicas", "batch_slices", "concat_like"]


def batch_slices(t: torch.Tensor, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...]:
    """``t`` cut along dimension 0 into the row ranges ``[lo, hi)`` (views)."""
    return tuple(t.narrow(0, lo, hi - lo) for lo, hi in rows)


def concat_like(parts: Sequence[torch.Tensor], size: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    """The parts joined along dimension 0 into a new tensor of the given size and strides."""
    out = torch.empty_strided(tuple(size), tuple(stride), dtype=parts[0].dtype, device=parts[0].device)
    return torch.cat(list(parts), 0, out=out)


def _spec(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> tuple:
    return ("tensor", tuple(int(s) for s in size), tuple(int(s) for s in stride), dtype)


def split_step(gm: fx.GraphModule, target: OpGraph, carrier: dict[str, str] | None
               ) -> tuple[fx.GraphModule, dict[str, fx.Node], dict[str, str]]:
    """The captured step with every split of ``target`` made in its fx graph.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The captured step (not modified).
    target : OpGraph
        The plan's rewritten graph.
    carrier : dict, optional
        fx node name -> graph node id, for the captured step.

    Returns
    -------
    (GraphModule, dict, dict)
        The step to run (``gm`` itself when nothing is split), graph node id ->
        its fx node, and the carrier of the returned step's fx nodes.

    Raises
    ------
    InvalidPlanError
        A split the runtime cannot execute (not along the batch, of a
        multi-output or non-aten operation, of an input that does not lead with
        the batch, a split of a split), or data-parallel replicas.
    """
    carrier = dict(carrier or {})
    refuse_replicas(target)
    groups: dict[str, list[int]] = {}
    for i, extra in enumerate(target.node_extra):
        if "split_of" in extra:
            groups.setdefault(extra["split_of"], []).append(i)
    if not groups:
        return gm, {v.name: v for v in gm.graph.nodes if v.op != "output"}, carrier
    gm = copy.deepcopy(gm)
    by_name = {v.name: v for v in gm.graph.nodes}
    node_of: dict[str, fx.Node] = {name: v for name, v in by_name.items() if v.op != "output"}
    for original, members in groups.items():
        x = by_name.get(original)
        if x is None or x.op != "call_function":
            raise InvalidPlanError(f"node {target.ids[members[0]]!r} splits {original!r}, which is not an "
                                   f"operation of the captured step (a split of a split is not executed)")
        node_of.pop(original, None)
        _split_node(gm, x, target, members, node_of, carrier)
    gm.graph.lint()
    gm.recompile()
    return gm, node_of, carrier


def refuse_replicas(target: OpGraph) -> None:
    """Raise InvalidPlanError where the graph a plan places holds data-parallel replicas (the runtime runs
    the captured step's own operations, split or not)."""
    i = replicated_node(target)
    if i is not None:
        raise InvalidPlanError(f"node {target.ids[i]!r} belongs to a data-parallel replica, which the runtime "
                               f"cannot run yet (it runs the captured step's own operations): {RUNNABLE_HOW}")


def _split_node(gm: fx.GraphModule, x: fx.Node, target: OpGraph, members: list[int],
                node_of: dict[str, fx.Node], carrier: dict[str, str]) -> None:
    extras = {target.ids[i]: target.node_extra[i] for i in members}
    bad = next((i for i, e in extras.items() if e.get("dim") != "batch"), None)
    if bad is not None:
        raise InvalidPlanError(f"node {bad!r} splits {x.name!r} along {extras[bad].get('dim')!r}; the runtime "
                               f"executes batch splits only")
    out = x.meta.get("val")
    if not isinstance(x.target, torch._ops.OpOverload) or not isinstance(out, torch.Tensor):
        raise InvalidPlanError(f"split operation {x.name!r} ({x.target}) is not a single-output aten operation; "
                               f"the runtime cannot split it")
    parts = sorted((e["part"], node_id, tuple(e["rows"])) for node_id, e in extras.items() if "part" in e)
    rows = [r for _, _, r in parts]
    extent = rows[-1][1]
    splits = [(node_id, e) for node_id, e in extras.items() if e.get("role") == "split"]
    concats = [(node_id, e) for node_id, e in extras.items() if e.get("role") == "concat"]
    if len(concats) != 1 or concats[0][1].get("tensor", 0) != 0:
        raise InvalidPlanError(f"split of {x.name!r}: expected one concat of output 0, got "
                               f"{[node_id for node_id, _ in concats]}")
    graph = gm.graph
    sliced: dict[fx.Node, list[fx.Node]] = {}
    with graph.inserting_before(x):
        for node_id, e in splits:
            source = _input_for(x, e["source"], int(e.get("tensor", 0)), carrier)
            value = source.meta.get("val")
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != extent:
                raise InvalidPlanError(f"split node {node_id!r}: input {source.name!r} of {x.name!r} does not lead "
                                       f"with the batch ({extent} rows); the runtime cannot slice it")
            cut = graph.call_function(batch_slices, (source, [list(r) for r in rows]))
            node_of[node_id] = cut
            carrier[cut.name] = node_id
            pieces = []
            for k, (lo, hi) in enumerate(rows):
                piece = graph.call_function(operator.getitem, (cut, k))
                piece.meta["placer_spec"] = _spec((hi - lo, *value.shape[1:]), value.stride(), value.dtype)
                carrier[piece.name] = node_id
                pieces.append(piece)
            sliced[source] = pieces
        part_nodes = []
        for k, node_id, (lo, hi) in parts:
            args, kwargs = fx.node.map_arg((x.args, x.kwargs), lambda a: sliced[a][k] if a in sliced else a)
            part = graph.call_function(x.target, args, kwargs)
            part.meta["placer_spec"] = _spec((hi - lo, *out.shape[1:]), out.stride(), out.dtype)
            node_of[node_id] = part
            carrier[part.name] = node_id
            part_nodes.append(part)
        concat_id = concats[0][0]
        joined = graph.call_function(concat_like, (part_nodes, list(out.shape), list(out.stride())))
        joined.meta["val"] = out
        node_of[concat_id] = joined
        carrier[joined.name] = concat_id
    x.replace_all_uses_with(joined)
    graph.erase_node(x)


def _input_for(x: fx.Node, source: str, tensor: int, carrier: dict[str, str]) -> fx.Node:
    """The fx input of ``x`` that carries output ``tensor`` of graph node ``source``."""
    for a in x.all_input_nodes:
        owner = carrier.get(a.name, a.name)
        index = a.args[1] if a.target is operator.getitem and owner != a.name else 0
        if owner == source and index == tensor:
            return a
    raise InvalidPlanError(f"split of {x.name!r}: it has no input carrying output {tensor} of {source!r}")
