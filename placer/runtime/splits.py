"""Execute operations split by OS-DPOS as real split, parts and concat.

:func:`placer.transform.split.split_operation` rewrites one operation ``X``
of the graph into split nodes (``X@split<j>``: one input cut into batch
slices, or a weight or bias into slices of its channels), parts
(``X@part<k>``: ``X`` on rows ``[lo, hi)`` of every sliced input, or on
channels ``[lo, hi)`` of its weights, the other inputs whole) and concat
nodes (``X@concat0``: the parts' outputs joined along the batch, or along
the channel axis). :func:`split_step` makes the same rewrite
of the captured step's fx graph, so that every node of the rewritten graph
is an fx node the executors can place and run:

* a split node slices its input (views, no copy) and returns the slices: along
  dimension 0 in a batch split, in a channel split along the axis that the
  capture recorded for the argument it feeds (``node_extra["args"]``: a
  convolution's weight and bias along dimension 0, a matrix product's weight
  and ``addmm``'s bias along their last);
  ``getitem`` nodes pick them, carried by the split node like any
  multi-output op;
* a part runs ``X``'s own aten operation on its slices;
* a concat node joins the parts, along dimension 0 or the channel axis
  (``node_extra["axis"]``), into a tensor with ``X``'s output strides, so
  that everything downstream computes on exactly the layout it was captured
  with.

A backward operation's split (its nodes record the capture's ``"join"``)
slices the arguments the capture recorded along their own axes, for the batch
too (a weight gradient ``t(grad) @ x`` slices the columns of its first operand
and the rows of its second); a part's argument holding the extent (``"resize"``:
``convolution_backward``'s ``bias_sizes``) is set to the part's; a part of a
multi-output operation gives its outputs through ``getitem`` nodes it carries;
a *sum* node (:func:`sum_like`) adds the parts' whole partials of an output the
split computes as partial sums, a concat joins the others; and each ``getitem``
of the original operation takes its joined output instead (:func:`picked`; an
output the operation does not compute, as ``convolution_backward``'s masked
input gradient, stays None).

Only batch splits of aten operations whose sliced inputs lead with the batch,
and channel or backward splits of such operations whose sliced inputs are the
arguments the capture recorded, are executed; anything else is refused naming
the node.
"""

from __future__ import annotations

import copy
import operator
from typing import Sequence

import torch
import torch.fx as fx

from ..capture.layout import dense_strides
from ..errors import InvalidPlanError
from ..graph import OpGraph

__all__ = ["split_step", "batch_slices", "slices_along", "concat_like", "sum_like", "picked", "nothing"]

#: The dimensions :func:`split_step` executes.
RUNTIME_DIMS = ("batch", "channel")


def batch_slices(t: torch.Tensor, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...]:
    """``t`` cut along dimension 0 into the row ranges ``[lo, hi)`` (views)."""
    return slices_along(t, 0, rows)


def slices_along(t: torch.Tensor, dim: int, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...]:
    """``t`` cut along dimension ``dim`` into the ranges ``[lo, hi)`` (views).

    Examples
    --------
    >>> [tuple(s.shape) for s in slices_along(torch.zeros(3, 5), 1, [[0, 3], [3, 5]])]
    [(3, 3), (3, 2)]
    """
    return tuple(t.narrow(dim, lo, hi - lo) for lo, hi in rows)


def concat_like(
    parts: Sequence[torch.Tensor], size: Sequence[int], stride: Sequence[int], dim: int = 0
) -> torch.Tensor:
    """The parts joined along dimension ``dim`` into a new tensor of the given size and strides.

    Examples
    --------
    >>> t = concat_like([torch.ones(2, 1), torch.zeros(2, 2)], (2, 3), (1, 2), dim=1)
    >>> t.tolist(), t.stride()
    ([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], (1, 2))
    """
    out = torch.empty_strided(tuple(size), tuple(stride), dtype=parts[0].dtype, device=parts[0].device)
    return torch.cat(list(parts), dim, out=out)


def _spec(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> tuple:
    return ("tensor", tuple(int(s) for s in size), tuple(int(s) for s in stride), dtype)


def split_step(
    gm: fx.GraphModule, target: OpGraph, carrier: dict[str, str] | None, node_of: dict[str, fx.Node] | None = None
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
    node_of : dict, optional
        Graph node id -> fx node of ``gm``, where ``gm`` is a rewrite of the
        captured step made for this plan (its replicas,
        :func:`~placer.runtime.replicas.replicate_step`), which is then
        changed in place; default: the captured step's, node ids being fx
        node names, which is copied first.

    Returns
    -------
    (GraphModule, dict, dict)
        The step to run (``gm`` itself when nothing is split), graph node id ->
        its fx node, and the carrier of the returned step's fx nodes.

    Raises
    ------
    InvalidPlanError
        A split the runtime cannot execute (along neither the batch nor the
        channels, of a multi-output or non-aten operation, of an input that
        does not lead with the batch, or in a channel split is not an argument
        the capture recorded as sliced, a split of a split).
    """
    carrier = dict(carrier or {})
    groups: dict[str, list[int]] = {}
    for i, extra in enumerate(target.node_extra):
        if "split_of" in extra:
            groups.setdefault(extra["split_of"], []).append(i)
    if node_of is None:
        if not groups:
            return gm, {v.name: v for v in gm.graph.nodes if v.op != "output"}, carrier
        gm = copy.deepcopy(gm)
        node_of = {v.name: v for v in gm.graph.nodes if v.op != "output"}
    elif not groups:
        return gm, node_of, carrier
    node_of = dict(node_of)
    by_name = dict(node_of)
    for original, members in groups.items():
        x = by_name.get(original)
        if x is None or x.op != "call_function":
            raise InvalidPlanError(
                f"node {target.ids[members[0]]!r} splits {original!r}, which is not an "
                f"operation of the captured step (a split of a split is not executed)"
            )
        node_of.pop(original, None)
        _split_node(gm, x, target, members, node_of, carrier)
    gm.graph.lint()
    gm.recompile()
    return gm, node_of, carrier


def _split_node(
    gm: fx.GraphModule,
    x: fx.Node,
    target: OpGraph,
    members: list[int],
    node_of: dict[str, fx.Node],
    carrier: dict[str, str],
) -> None:
    extras = {target.ids[i]: target.node_extra[i] for i in members}
    dim = extras[target.ids[members[0]]].get("dim")
    bad = next((i for i, e in extras.items() if e.get("dim") not in RUNTIME_DIMS or e.get("dim") != dim), None)
    if bad is not None:
        raise InvalidPlanError(
            f"node {bad!r} splits {x.name!r} along {extras[bad].get('dim')!r}; the runtime "
            f"executes batch and channel splits only, each of one dimension"
        )
    value = x.meta.get("val")
    outs = list(value) if isinstance(value, (tuple, list)) else [value]
    multi = isinstance(value, (tuple, list))
    if (
        not isinstance(x.target, torch._ops.OpOverload)
        or not any(isinstance(o, torch.Tensor) for o in outs)
        or not all(o is None or isinstance(o, torch.Tensor) for o in outs)
        or multi
        and any(u.target is not operator.getitem for u in x.users)
    ):
        raise InvalidPlanError(
            f"split operation {x.name!r} ({x.target}) is not an aten operation of tensor "
            f"outputs (picked by getitem where it has several); the runtime cannot split it"
        )
    parts = sorted((e["part"], node_id, tuple(e["rows"])) for node_id, e in extras.items() if "part" in e)
    rows = [r for _, _, r in parts]
    extent = rows[-1][1]
    first = extras[parts[0][1]]
    join = first.get("join")
    splits = [(node_id, e) for node_id, e in extras.items() if e.get("role") == "split"]
    combines = {
        int(e.get("tensor", 0)): (node_id, e) for node_id, e in extras.items() if e.get("role") in ("concat", "sum")
    }
    used = sorted({int(u.args[1]) for u in x.users} if multi else {0})
    if sorted(combines) != used or len(combines) != sum(e.get("role") in ("concat", "sum") for e in extras.values()):
        raise InvalidPlanError(
            f"split of {x.name!r}: expected one concat or sum of each output it gives "
            f"({used}), got {sorted(node_id for node_id, _ in combines.values())}"
        )
    axes: dict[int, int | None] = {}  # output -> the axis its slices are joined along, None: summed
    for t, (node_id, e) in combines.items():
        out = outs[t] if t < len(outs) else None
        if out is None and multi:
            axes[t] = None  # an output not computed (convolution_backward's mask): None, joined from nothing
            continue
        if not isinstance(out, torch.Tensor):
            raise InvalidPlanError(f"node {node_id!r} joins output {t} of {x.name!r}, which it does not give")
        want = join[t] if join is not None and t < len(join) else None
        if e["role"] == "sum":
            if want != "sum":
                raise InvalidPlanError(
                    f"node {node_id!r} sums output {t} of {x.name!r}, which its split does not compute as partial sums"
                )
            axes[t] = None
            continue
        axis = 0 if dim == "batch" and join is None else int(e.get("axis", 1))
        if join is not None and want != axis or not 0 <= axis < out.dim() or out.shape[axis] != extent:
            raise InvalidPlanError(
                f"node {node_id!r} joins the {dim} slices of {x.name!r} along axis {axis}, "
                f"which does not have its {extent} rows (output {tuple(out.shape)})"
            )
        axes[t] = axis
    graph = gm.graph
    sliced: dict[fx.Node, list[fx.Node]] = {}
    declared: set[int] = set()
    recorded = join is not None or dim == "channel"  # the sliced arguments are the ones the capture recorded
    with graph.inserting_before(x):
        for node_id, e in splits:
            source = _input_for(x, e["source"], int(e.get("tensor", 0)), carrier)
            given = source.meta.get("val")
            if not recorded:
                along = 0
                if not isinstance(given, torch.Tensor) or given.dim() == 0 or given.shape[0] != extent:
                    raise InvalidPlanError(
                        f"split node {node_id!r}: input {source.name!r} of {x.name!r} does not "
                        f"lead with the batch ({extent} rows); the runtime cannot slice it"
                    )
            else:
                along, positions = _channel_axis(x, node_id, e, source)
                declared |= positions
                if not isinstance(given, torch.Tensor) or not 0 <= along < given.dim() or given.shape[along] != extent:
                    raise InvalidPlanError(
                        f"split node {node_id!r}: input {source.name!r} of {x.name!r} does not "
                        f"have its {extent} {dim} rows along axis {along}; the runtime cannot "
                        f"slice it"
                    )
            cut = graph.call_function(slices_along, (source, along, [list(r) for r in rows]))
            node_of[node_id] = cut
            carrier[cut.name] = node_id
            pieces = []
            for k, (lo, hi) in enumerate(rows):
                piece = graph.call_function(operator.getitem, (cut, k))
                shape = list(given.shape)
                shape[along] = hi - lo
                piece.meta["placer_spec"] = _spec(shape, given.stride(), given.dtype)
                carrier[piece.name] = node_id
                pieces.append(piece)
            sliced[source] = pieces
        if recorded:
            wanted = {int(p) for p, _ in (splits[0][1].get("args") or [])} if splits else set()
            if not splits or declared != wanted:
                raise InvalidPlanError(
                    f"{dim} split of {x.name!r}: its split nodes "
                    f"{[node_id for node_id, _ in splits]} slice arguments {sorted(declared)}, "
                    f"not the arguments {sorted(wanted)} its {dim} needs"
                )
        results: dict[int, list[fx.Node]] = {t: [] for t in combines}
        for k, node_id, (lo, hi) in parts:
            args, kwargs = fx.node.map_arg((x.args, x.kwargs), lambda a: sliced[a][k] if a in sliced else a)
            args = _resized(args, first.get("resize") or [], hi - lo)
            part = graph.call_function(x.target, args, kwargs)
            node_of[node_id] = part
            carrier[part.name] = node_id
            shapes = _part_outputs(x, args, kwargs, outs, axes, lo, hi, dim == "batch" and join is None)
            if not multi:
                part.meta["placer_spec"] = shapes[0]
                results[0].append(part)
                continue
            for t in combines:
                if outs[t] is None:
                    continue
                pick = graph.call_function(operator.getitem, (part, t))
                pick.meta["placer_spec"] = shapes[t]
                carrier[pick.name] = node_id
                results[t].append(pick)
        joined: dict[int, fx.Node] = {}
        for t, (node_id, _) in combines.items():
            out = outs[t]
            if out is None:
                node = graph.call_function(nothing, ())
            elif axes[t] is None:
                node = graph.call_function(sum_like, (results[t], list(out.shape), list(out.stride())))
            else:
                node = graph.call_function(concat_like, (results[t], list(out.shape), list(out.stride()), axes[t]))
            node.meta["val"] = out
            node_of[node_id] = node
            carrier[node.name] = node_id
            joined[t] = node
    if multi:
        # Each pick of an output takes the joined output instead (the same tensor, as a pick of a tuple is).
        for user in list(x.users):
            t = int(user.args[1])
            user.target, user.args = (picked, (joined[t],)) if outs[t] is not None else (nothing, ())
    else:
        x.replace_all_uses_with(joined[0])
    graph.erase_node(x)


def nothing() -> None:
    """None: an output the split operation does not compute, and each pick of it."""
    return None


def picked(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself: what a pick of a split operation's output gives, that output being joined already."""
    return t


def sum_like(parts: Sequence[torch.Tensor], size: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    """The sum of the parts' partials, in a new tensor of the given size and strides, added in part order.

    Examples
    --------
    >>> t = sum_like([torch.ones(2, 2), torch.full((2, 2), 2.0)], (2, 2), (1, 2))
    >>> t.tolist(), t.stride()
    ([[3.0, 3.0], [3.0, 3.0]], (1, 2))
    """
    out = torch.empty_strided(tuple(size), tuple(stride), dtype=parts[0].dtype, device=parts[0].device)
    out.copy_(parts[0])
    for p in parts[1:]:
        out.add_(p)
    return out


def _resized(args: tuple, resize: Sequence[Sequence[int]], extent: int) -> tuple:
    """``args`` with entry ``index`` of argument ``position`` set to a part's ``extent``, for every
    ``[position, index]`` of ``resize`` (``convolution_backward``'s ``bias_sizes``)."""
    if not resize:
        return args
    out = list(args)
    for position, index in resize:
        entries = list(out[position])
        entries[index] = extent
        out[position] = entries
    return tuple(out)


def _part_outputs(
    x: fx.Node, args: tuple, kwargs: dict, outs: list, axes: dict[int, int | None], lo: int, hi: int, keep_strides: bool
) -> list[tuple | None]:
    """The spec of each joined output of a part of ``x`` over rows ``[lo, hi)`` (None for the others): an
    output joined along an axis has ``hi - lo`` of it, a summed one is whole. Strides: with
    ``keep_strides`` (a batch split of a single output), ``x``'s output's own; else those of ``x``'s
    operation run on meta tensors of the part's arguments (the slices' own layouts), failing that ``x``'s
    output's for a whole partial and dense in the order of ``x``'s output's for a slice."""
    metas = None if keep_strides else _meta_run(x, args, kwargs)
    specs: list[tuple | None] = []
    for t, out in enumerate(outs):
        if t not in axes or not isinstance(out, torch.Tensor):
            specs.append(None)
            continue
        shape = list(out.shape)
        if axes[t] is not None:
            shape[axes[t]] = hi - lo
        result = metas[t] if metas is not None and t < len(metas) else None
        if keep_strides or axes[t] is None and not isinstance(result, torch.Tensor):
            stride = tuple(int(s) for s in out.stride())
        elif isinstance(result, torch.Tensor) and list(result.shape) == shape:
            stride = tuple(int(s) for s in result.stride())
        else:
            stride = dense_strides(shape, out.stride())
        specs.append(_spec(shape, stride, out.dtype))
    return specs


def _meta_run(x: fx.Node, args: tuple, kwargs: dict) -> list | None:
    """``x``'s operation run on meta tensors of ``args`` (its outputs as a list), or None where it cannot."""

    def meta(a: fx.Node) -> object:
        spec = a.meta.get("placer_spec")
        if spec is not None and spec[0] == "tensor":
            return torch.empty_strided(spec[1], spec[2], dtype=spec[3], device="meta")
        value = a.meta.get("val")
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
        return value

    try:
        margs, mkwargs = fx.node.map_arg((args, kwargs), meta)
        result = x.target(*margs, **mkwargs)
    except Exception:  # noqa: BLE001 - an operation without a meta kernel: dense strides instead
        return None
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _channel_axis(x: fx.Node, node_id: str, extra: dict, source: fx.Node) -> tuple[int, set[int]]:
    """The axis along which channel split node ``node_id`` slices ``source``, an argument of ``x``, as the
    capture recorded it (``extra["args"]``), and the argument positions it feeds."""
    recorded = {int(p): int(a) for p, a in extra.get("args") or []}
    positions = {p for p, a in enumerate(x.args) if a is source}
    axes = {recorded[p] for p in positions if p in recorded}
    if not recorded or not positions or positions - recorded.keys() or len(axes) != 1 or source in x.kwargs.values():
        raise InvalidPlanError(
            f"split node {node_id!r}: input {source.name!r} of {x.name!r} is not an argument "
            f"that the capture recorded as sliced along the channels "
            f"({sorted(recorded) or 'none recorded'}); the runtime cannot slice it"
        )
    return axes.pop(), positions


def _input_for(x: fx.Node, source: str, tensor: int, carrier: dict[str, str]) -> fx.Node:
    """The fx input of ``x`` that carries output ``tensor`` of graph node ``source``."""
    for a in x.all_input_nodes:
        owner = carrier.get(a.name, a.name)
        index = a.args[1] if a.target is operator.getitem and owner != a.name else 0
        if owner == source and index == tensor:
            return a
    raise InvalidPlanError(f"split of {x.name!r}: it has no input carrying output {tensor} of {source!r}")
