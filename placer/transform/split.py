"""Operation splitting (FastT Algorithm 2, SplitOperation): one op becomes n parts with split and concat nodes.

Splitting an operation into ``n`` parts lets the parts run on different
devices. Two dimensions may be split:

* ``"batch"`` (fine-grained data parallelism inside one operation): for
  every input that carries the batch, a *split* node cuts it into ``n``
  slices, one per part; inputs without the batch (weights) go whole to
  every part;
* ``"channel"`` (an operation's output channels: a convolution's output
  feature maps, the columns of a matrix product with a weight): every
  input that does not depend on the batch (the weight, the bias) is cut by
  a split node into ``n`` slices of its channels, and the activation goes
  whole to every part, each part computing its own channels.

For every output tensor a *concat* node joins the parts' slices for the
consumers, along the batch (axis 0) or along the channel axis that the
operation's ``splittable`` entry names (``"axis"``, 1 when it names none).

A backward operation's entry says more (capture's ``_backward_splits``):
``"inputs"`` names the producers of the arguments a split slices (so that a
``convolution_backward`` split along its output channels slices the output
gradient and the weight, not the input, though both of the first two depend
on the batch), and ``"join"`` says, per output, the axis its slices are
concatenated along or ``"sum"``: each part then computes a whole *partial*
of that output (a weight gradient over its rows of the batch, an input
gradient over its output channels) and a *sum* node adds them. A part holds
its whole partials and its share of the other outputs; it sends a sum node
its whole partial; the sum node reads every partial and writes one, an add
per element and partial but the first, on the roofline of each device kind
the op has a time for.

Costs come from the graph's own: a part of ``k`` rows (or channels) out of
``B`` takes ``k / B`` of the op's time (per device kind too), FLOPs, output
and workspace (and, split along the channels, of the parameters the op
holds itself, every part reading the whole activation: its
``bytes_accessed`` is that and its share of the rest); a slice of a contiguous tensor is a view, so a split node
costs nothing (the slices' transfers are the data movement), and a concat
node costs one copy of its output (read and write) on the analytic roofline
of each device kind the op has a time for.

Every rewritten node records where it came from in ``node_extra``:
parts ``{"split_of": id, "part": k, "parts": n, "dim": d, "rows": [lo, hi]}``,
split nodes ``{"split_of": id, "role": "split", "parts": n, "dim": d,
"source": producer id, "tensor": t}``, concat nodes ``{"split_of": id,
"role": "concat", "parts": n, "dim": d, "tensor": t}`` (sum nodes ``"role": "sum"``; under an
entry with ``"join"`` every node records it, its ``"resize"`` too, and a concat its ``"axis"``), so that the
runtime can execute them and :func:`original_ids` maps back; ``rows`` are
the part's channels in a channel split, every node of which also records
the output's channel ``"axis"``, and its split nodes the operation's
``"args"`` (``[[argument position, axis], ...]``: which of the captured
operation's arguments is sliced along which axis) where the entry has them.

Contract (``split`` through :func:`~placer.transform.base.apply_transform`,
:func:`split_transform`): with part ``k`` taking rows ``[lo_k, hi_k)`` of
the extent ``B``, ``sum_k (hi_k - lo_k) / B = 1``, so the parts' times on
every device sum to the operation's, and their outputs and workspaces (cut
into whole bytes ``total * hi_k // B - total * lo_k // B``, which telescope
to ``total``) sum to its, but for the whole partials of summed outputs, which
every part holds (the ``share_and_whole`` law); parameters are whole in every
part of a batch split and shared in a channel split. The split, concat and sum
nodes are what the transform adds; every other node is unchanged.

References
----------
Yi et al., FastT, CoNEXT 2020, Section 5.2 and Algorithm 2 (SplitOperation).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..cost.analytic import DEVICE_SPECS, node_time_s
from ..errors import OptionError
from ..graph import OpGraph
from .base import (
    SHARE_AND_WHOLE,
    SHARE_OR_WHOLE,
    SUM,
    Ensures,
    NodeMap,
    TransformResult,
    part_times,
    register_transform,
)

__all__ = [
    "split_operation",
    "batch_dependent",
    "batch_samples",
    "split_dims",
    "original_ids",
    "part_rows",
    "fresh_id",
    "split_transform",
]

#: The dimension names this transform knows how to split.
SUPPORTED_DIMS = ("batch", "channel")


def batch_dependent(graph: OpGraph) -> np.ndarray:
    """Boolean per node: does its output depend on the batch (reachable from a batch input)?

    Batch inputs are sources that hold no parameters and are placeholders
    (or have no op name, as in generated graphs), and nodes that declare a
    batch split (a hand-written graph's source may hold parameters and the
    batch). Parameters, optimizer state and constants are not batch-dependent,
    nor is what derives from them alone.

    Examples
    --------
    >>> g = OpGraph(["x", "w", "mm", "w.t"], [0.0, 0.0, 1.0, 1.0], [0, 1, 1], [2, 2, 3], [8, 8, 8],
    ...             op=["placeholder", "placeholder", "aten.mm", "aten.t"], param_bytes=[0, 8, 0, 0])
    >>> batch_dependent(g).tolist()
    [True, False, True, False]
    """
    n = graph.num_nodes
    indegree = np.bincount(graph.dst, minlength=n)
    is_input = np.array([op in (None, "placeholder") for op in graph.op], dtype=bool)
    declared = np.array(
        [any(item.get("dim") == "batch" for item in entries or ()) for entries in graph.splittable], dtype=bool
    )
    reached = ((indegree == 0) & (graph.param_bytes == 0) & is_input) | declared
    ptr, eids = graph.out_edges
    dst = graph.dst[eids].tolist()
    ptr = ptr.tolist()
    flag = reached.tolist()
    for u in graph.topological_order.tolist():
        if flag[u]:
            for k in range(ptr[u], ptr[u + 1]):
                flag[dst[k]] = True
    return np.asarray(flag, dtype=bool)


def batch_samples(graph: OpGraph) -> int | None:
    """The samples in the step's batch: the ``batch_size`` a capture records, else (a graph without it)
    the smallest ``batch`` extent any node's ``splittable`` declares, which may be a multiple of it
    (a capture declares the rows of a matrix operation's first operand: batch x heads for attention's
    ``bmm``); None where neither says (a generated graph).

    Examples
    --------
    >>> g = OpGraph(["x", "bmm"], [0.0, 1.0], [0], [1], [8], splittable=[None, [{"dim": "batch", "size": 48}]])
    >>> batch_samples(g), batch_samples(g.replace(extra={"batch_size": 4})), batch_samples(g.replace(splittable=None))
    (48, 4, None)
    """
    if graph.extra.get("batch_size") is not None:
        return int(graph.extra["batch_size"])
    sizes = [
        int(item["size"]) for entries in graph.splittable if entries for item in entries if item.get("dim") == "batch"
    ]
    return min(sizes, default=None)


def split_dims(graph: OpGraph, node: int) -> dict[str, int]:
    """The dimensions this transform can split ``node`` along, with their extents (>= 2).

    Examples
    --------
    >>> g = OpGraph(["conv"], [1.0], [], [], [], splittable=[[{"dim": "batch", "size": 8},
    ...                                                        {"dim": "channel", "size": 1}, {"dim": "seq", "size": 4}]])
    >>> split_dims(g, 0)
    {'batch': 8}
    """
    return {
        item["dim"]: int(item["size"])
        for item in graph.splittable[node] or []
        if item.get("dim") in SUPPORTED_DIMS and int(item.get("size", 0)) >= 2
    }


def part_rows(size: int, parts: int) -> list[tuple[int, int]]:
    """Rows ``[lo, hi)`` of each part when ``size`` rows are cut into ``parts`` nearly equal parts.

    Examples
    --------
    >>> part_rows(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    base, extra = divmod(size, parts)
    bounds = np.cumsum([0] + [base + (1 if k < extra else 0) for k in range(parts)]).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _copy_time(graph: OpGraph, node: int, nbytes: float) -> tuple[float, dict[str, float] | None]:
    """Roofline time of copying ``nbytes`` (read + write) on the reference kind and on the op's own kinds."""

    dtype = graph.node_extra[node].get("dtype", "float32")
    reference = float(node_time_s("V100", 0.0, 2.0 * nbytes, dtype))
    kinds = graph.compute_s_by_kind[node] or {}
    by_kind = {k: float(node_time_s(k, 0.0, 2.0 * nbytes, dtype)) for k in kinds if k in DEVICE_SPECS}
    return reference, by_kind or None


def _sum_time(graph: OpGraph, node: int, nbytes: float, parts: int) -> tuple[float, dict[str, float] | None]:
    """Roofline time of summing ``parts`` partials of ``nbytes`` each (read them all, write one; an add per
    element and partial but the first) on the reference kind and on the op's own kinds."""
    from ..cost.analytic import DEVICE_SPECS, node_time_s

    dtype = graph.node_extra[node].get("dtype", "float32")
    flops = (parts - 1) * nbytes / max(1, np.dtype(_NUMPY_DTYPES.get(dtype, "float32")).itemsize)
    moved = (parts + 1) * float(nbytes)
    reference = float(node_time_s("V100", flops, moved, dtype))
    kinds = graph.compute_s_by_kind[node] or {}
    by_kind = {k: float(node_time_s(k, flops, moved, dtype)) for k in kinds if k in DEVICE_SPECS}
    return reference, by_kind or None


#: Element types of the dtypes a capture records that numpy lacks, by their size.
_NUMPY_DTYPES = {"bfloat16": "float16", "tf32": "float32"}


#: What a data-parallel replica's (``r<k>/``) and a micro-batch's (``mb<k>/``) copy put before a node's id.
_COPY_PREFIX = re.compile(r"^(?:r\d+/)?(?:mb\d+/)?")


def _named_inputs(graph: OpGraph, x: int, entry: dict) -> set[tuple[int, int]] | None:
    """The inputs ``(producer, tensor)`` of node ``x`` that ``entry`` names (``inputs``), or None where it
    names none (the slicing follows the batch then).

    An entry names the producers of the captured step; in a rewritten graph a producer may stand as a data-
    parallel replica's or a micro-batch's copy (``r<k>/`` or ``mb<k>/`` before its id) or as the node joining
    a split of it (its ``split_of``).

    Raises
    ------
    OptionError
        If some named input is not an input of ``x``.
    """
    if "inputs" not in entry:
        return None
    own = graph.ids[x]
    wanted = {(str(name), int(t)) for name, t in entry["inputs"]}
    found: set[tuple[int, int]] = set()
    seen: set[tuple[str, int]] = set()
    for e in np.flatnonzero(graph.dst == x).tolist():
        u, t = int(graph.src[e]), int(graph.edge_tensor[e])
        producer = graph.node_extra[u]
        if producer.get("role") in ("concat", "sum"):
            name, t = producer["split_of"], int(producer.get("tensor", t))
        else:
            name = graph.ids[u]
        key = (_COPY_PREFIX.sub("", name), t)
        if key in wanted:
            found.add((u, t))
            seen.add(key)
    missing = sorted(wanted - seen)
    if missing:
        raise OptionError(f"node {own!r}: its split slices input {missing[0][0]!r}, which does not feed it")
    return found


def original_ids(graph: OpGraph) -> list[str]:
    """For every node of a rewritten graph, the id of the original node it comes from (by ``split_of``).

    Examples
    --------
    >>> g = OpGraph(["x", "conv"], [0.0, 4.0], [0], [1], [64], op=["placeholder", "aten.convolution"],
    ...             splittable=[None, [{"dim": "batch", "size": 8}]])
    >>> original_ids(split_operation(g, "conv", "batch", 2))
    ['x', 'conv', 'conv', 'conv']
    """
    return [extra.get("split_of", node_id) for node_id, extra in zip(graph.ids, graph.node_extra)]


def split_operation(graph: OpGraph, node: str, dim: str, parts: int) -> OpGraph:
    """FastT's SplitOperation: ``node`` becomes ``parts`` sub-operations with split and concat nodes.

    Parameters
    ----------
    graph : OpGraph
    node : str
        Id of the operation to split; its ``splittable`` must list ``dim``.
    dim : str
        The dimension to split along (``"batch"`` or ``"channel"``).
    parts : int
        Number of parts, 2 to the dimension's extent.

    Returns
    -------
    OpGraph
        The rewritten graph; the new nodes take the split node's place in the
        listing order (split nodes, parts, concat nodes).

    Raises
    ------
    OptionError
        If the node is unknown, ``dim`` is not one it may be split along, or
        ``parts`` is out of range.

    Examples
    --------
    >>> g = OpGraph(["x", "conv", "y"], [0.0, 4.0, 1.0], [0, 1], [1, 2], [64, 32],
    ...             op=["placeholder", "aten.convolution", "aten.relu"], output_bytes=[64, 32, 32],
    ...             splittable=[None, [{"dim": "batch", "size": 8}], None])
    >>> s = split_operation(g, "conv", "batch", 2)
    >>> s.ids
    ['x', 'conv@split0', 'conv@part0', 'conv@part1', 'conv@concat0', 'y']
    >>> s.compute_s[2:4].tolist(), s.edge_bytes.tolist()
    ([2.0, 2.0], [64, 32, 32, 16, 16, 32])

    Along the channels, the weight is sliced and the input goes whole to every part:

    >>> g = OpGraph(["x", "w", "conv", "y"], [0.0, 0.0, 4.0, 1.0], [0, 1, 2], [2, 2, 3], [64, 40, 32],
    ...             op=["placeholder", "placeholder", "aten.convolution", "aten.relu"], param_bytes=[0, 40, 0, 0],
    ...             output_bytes=[64, 0, 32, 32], splittable=[None, None, [{"dim": "channel", "size": 4}], None])
    >>> s = split_operation(g, "conv", "channel", 2)
    >>> s.ids
    ['x', 'w', 'conv@split1', 'conv@part0', 'conv@part1', 'conv@concat0', 'y']
    >>> edges = zip(s.src.tolist(), s.dst.tolist(), s.edge_bytes.tolist())
    >>> [(s.ids[a], s.ids[b], n) for a, b, n in edges]  # doctest: +NORMALIZE_WHITESPACE
    [('x', 'conv@part0', 64), ('x', 'conv@part1', 64), ('w', 'conv@split1', 40), ('conv@split1', 'conv@part0', 20),
     ('conv@split1', 'conv@part1', 20), ('conv@part0', 'conv@concat0', 16), ('conv@part1', 'conv@concat0', 16),
     ('conv@concat0', 'y', 32)]

    References
    ----------
    Yi et al., FastT, CoNEXT 2020, Section 5.2 and Algorithm 2, function SplitOperation.
    """
    x = graph.index.get(node)
    if x is None:
        raise OptionError(f"cannot split unknown node {node!r}")
    dims = split_dims(graph, x)
    if dim not in dims:
        raise OptionError(
            f"node {node!r} cannot be split along {dim!r}; it may be split along {sorted(dims) or 'nothing'}"
        )
    if not 2 <= parts <= dims[dim]:
        raise OptionError(f"node {node!r}: parts must be between 2 and {dims[dim]} (its {dim!r} extent), got {parts!r}")
    rows = part_rows(dims[dim], parts)
    extent = dims[dim]
    share = [(hi - lo) / extent for lo, hi in rows]

    def piece(total: int, k: int) -> int:
        """Part ``k``'s share of ``total`` bytes, in whole bytes that add up to ``total`` over the parts."""
        lo, hi = rows[k]
        return int(total) * hi // extent - int(total) * lo // extent

    entry = next(item for item in graph.splittable[x] if item.get("dim") == dim)
    named = _named_inputs(graph, x, entry)
    if named is None:
        # Along the batch, what depends on the batch is sliced; along the channels, what does not (weights, bias).
        sliced_node = batch_dependent(graph) if dim == "batch" else ~batch_dependent(graph)
    join = entry.get("join")

    # Inputs of x merged per (producer, tensor) at their largest bytes; outputs per tensor.
    in_edges = np.flatnonzero(graph.dst == x)
    out_edges = np.flatnonzero(graph.src == x)
    inputs: dict[tuple[int, int], int] = {}
    for e in in_edges.tolist():
        key = (int(graph.src[e]), int(graph.edge_tensor[e]))
        inputs[key] = max(inputs.get(key, 0), int(graph.edge_bytes[e]))
    outputs: dict[int, int] = {}
    for e in out_edges.tolist():
        t = int(graph.edge_tensor[e])
        outputs[t] = max(outputs.get(t, 0), int(graph.edge_bytes[e]))

    taken = set(graph.ids)

    base: dict[str, Any] = {"split_of": node, "parts": parts, "dim": dim}
    sliced_args: dict[str, Any] = {}
    if join is not None:
        base["join"] = list(join)
        if "resize" in entry:
            base["resize"] = [[int(a), int(b)] for a, b in entry["resize"]]
    elif dim == "channel":
        base["axis"] = int(entry.get("axis", 1))
    if "args" in entry and (dim == "channel" or join is not None):
        sliced_args["args"] = [[int(a), int(b)] for a, b in entry["args"]]

    def is_sliced(u: int, t: int, nbytes: int) -> bool:
        if named is not None:
            return (u, t) in named
        return bool(sliced_node[u]) and bool(nbytes)

    def summed(t: int) -> bool:
        return join is not None and t < len(join) and join[t] == "sum"

    new_nodes: list[dict[str, Any]] = []  # constructor fields of each new node
    new_edges: list[tuple[str, str, int, int]] = []
    part_ids = [fresh_id(f"{node}@part{k}", taken) for k in range(parts)]
    extra_x = graph.node_extra[x]
    for j, ((u, t), nbytes) in enumerate(sorted(inputs.items())):
        source = graph.ids[u]
        if not is_sliced(u, t, nbytes):
            # Inputs without the dimension (weights in a batch split, the activation in a channel split) go
            # whole to every part, as do edges that carry nothing (an order, or a view's base held while the
            # view is read).
            for pid in part_ids:
                new_edges.append((source, pid, nbytes, t))
            continue
        sid = fresh_id(f"{node}@split{j}", taken)
        new_nodes.append(
            dict(
                id=sid,
                compute_s=0.0,
                op="aten.split",
                layer=graph.layer[x],
                device_kinds=graph.device_kinds[x],
                node_extra={**base, "role": "split", "source": source, "tensor": t, **sliced_args},
            )
        )
        new_edges.append((source, sid, nbytes, t))
        for k, pid in enumerate(part_ids):  # one tensor per slice: each travels on its own
            new_edges.append((sid, pid, piece(nbytes, k), k))
    by_kind = graph.compute_s_by_kind[x]
    whole = (
        0
        if dim == "batch" and named is None
        else min(
            sum(nbytes for (u, t), nbytes in inputs.items() if not is_sliced(u, t, nbytes)),
            int(extra_x.get("bytes_accessed", 0)),
        )
    )
    # Every part computes a whole partial of a summed output, and its share of the others.
    partial = min(sum(nbytes for t, nbytes in outputs.items() if summed(t)), int(graph.output_bytes[x]))
    for k, pid in enumerate(part_ids):
        f = share[k]
        extra = {key: value for key, value in extra_x.items() if key != "bytes_accessed"}
        if "bytes_accessed" in extra_x:
            # Every part reads the inputs that go whole (along the channels, the activation) and its share of the
            # rest, and writes its whole partials.
            fixed = min(whole + partial, int(extra_x["bytes_accessed"]))
            extra["bytes_accessed"] = fixed + piece(int(extra_x["bytes_accessed"]) - fixed, k)
        extra.update({**base, "part": k, "rows": list(rows[k])})
        new_nodes.append(
            dict(
                id=pid,
                compute_s=float(graph.compute_s[x]) * f,
                op=graph.op[x],
                layer=graph.layer[x],
                output_bytes=partial + piece(int(graph.output_bytes[x]) - partial, k),
                temp_bytes=piece(graph.temp_bytes[x], k),
                # Split along the batch, every part needs the whole weights; along the channels, its own channels'.
                # The first keeps the op's colocation (its state's home).
                param_bytes=int(graph.param_bytes[x]) if dim == "batch" else piece(graph.param_bytes[x], k),
                colocation=graph.colocation[x] if k == 0 else None,
                device_kinds=graph.device_kinds[x],
                flops=float(graph.flops[x]) * f,
                compute_s_by_kind=part_times(by_kind, extra_x.get("fixed_s"), f),
                node_extra=extra,
            )
        )
    concat_of: dict[int, str] = {}
    for t, nbytes in sorted(outputs.items()):
        if summed(t):
            cid = fresh_id(f"{node}@sum{t}", taken)
            reference, kinds = _sum_time(graph, x, nbytes, parts)
            role: dict[str, Any] = {"role": "sum", "tensor": t}
        else:
            cid = fresh_id(f"{node}@concat{t}", taken)
            reference, kinds = _copy_time(graph, x, nbytes)
            role = {"role": "concat", "tensor": t}
            if join is not None:
                role["axis"] = int(join[t]) if t < len(join) else 0
        concat_of[t] = cid
        new_nodes.append(
            dict(
                id=cid,
                compute_s=reference,
                compute_s_by_kind=kinds,
                op="aten.add" if summed(t) else "aten.cat",
                layer=graph.layer[x],
                output_bytes=nbytes,
                device_kinds=graph.device_kinds[x],
                node_extra={**base, **role},
            )
        )
        for k, pid in enumerate(part_ids):
            new_edges.append((pid, cid, nbytes if summed(t) else piece(nbytes, k), t))
    for e in out_edges.tolist():
        new_edges.append(
            (concat_of[int(graph.edge_tensor[e])], graph.ids[int(graph.dst[e])], int(graph.edge_bytes[e]), 0)
        )
    return _rebuild(graph, x, new_nodes, new_edges)


#: What a node made by a rewrite holds where it says nothing (its compute time must be given).
NODE_DEFAULTS = dict(
    output_bytes=0,
    param_bytes=0,
    temp_bytes=0,
    flops=np.nan,
    op=None,
    layer=None,
    colocation=None,
    device_kinds=None,
    compute_s_by_kind=None,
    splittable=None,
    node_extra=None,
)
_NODE_ARRAYS = ("compute_s", "output_bytes", "param_bytes", "temp_bytes", "flops")
_NODE_LISTS = ("op", "layer", "colocation", "device_kinds", "compute_s_by_kind", "splittable", "node_extra")


def fresh_id(name: str, taken: set[str]) -> str:
    """``name``, or ``name~1``, ``name~2``, ... the first that ``taken`` lacks; adds it to ``taken``.

    Ids a transform generates never collide with the graph's own (a user may name a node ``conv@part0``).

    Examples
    --------
    >>> taken = {"a", "a~1"}
    >>> fresh_id("a", taken), fresh_id("b", taken), sorted(taken)
    ('a~2', 'b', ['a', 'a~1', 'a~2', 'b'])
    """
    candidate, k = name, 0
    while candidate in taken:
        k += 1
        candidate = f"{name}~{k}"
    taken.add(candidate)
    return candidate


def _rebuild(
    graph: OpGraph, removed: int, new_nodes: list[dict], new_edges: list[tuple[str, str, int, int]]
) -> OpGraph:
    """``graph`` without node ``removed`` and its edges, with ``new_nodes`` in its place and ``new_edges`` added."""
    keep = [i for i in range(graph.num_nodes) if i != removed]
    before, after = keep[:removed], keep[removed:]
    ids = [graph.ids[i] for i in before] + [nd["id"] for nd in new_nodes] + [graph.ids[i] for i in after]
    fields: dict[str, Any] = {}
    for name in _NODE_ARRAYS + _NODE_LISTS:
        old = getattr(graph, name)
        new = [nd.get(name, NODE_DEFAULTS.get(name)) for nd in new_nodes]
        fields[name] = [old[i] for i in before] + new + [old[i] for i in after]
    index = {node_id: i for i, node_id in enumerate(ids)}
    kept = np.flatnonzero((graph.src != removed) & (graph.dst != removed))
    src = [index[graph.ids[s]] for s in graph.src[kept].tolist()] + [index[e[0]] for e in new_edges]
    dst = [index[graph.ids[d]] for d in graph.dst[kept].tolist()] + [index[e[1]] for e in new_edges]
    nbytes = graph.edge_bytes[kept].tolist() + [e[2] for e in new_edges]
    tensor = graph.edge_tensor[kept].tolist() + [e[3] for e in new_edges]
    edge_extra = [graph.edge_extra[e] for e in kept.tolist()] + [{} for _ in new_edges]
    return OpGraph(
        ids,
        src=src,
        dst=dst,
        edge_bytes=nbytes,
        edge_tensor=tensor,
        edge_extra=edge_extra,
        name=graph.name,
        extra=graph.extra,
        **fields,
    )


def _split_trials(graph: OpGraph) -> list[dict]:
    """The first operation splittable along each dimension, and the first whose split sums partials of an
    output (a backward operation's), in up to 3 parts."""
    trials = []
    for dim in SUPPORTED_DIMS:
        for sums in (False, True):
            node = next(
                (
                    i
                    for i in range(graph.num_nodes)
                    if dim in split_dims(graph, i) and ("sum" in _entry(graph, i, dim).get("join", ())) == sums
                ),
                None,
            )
            if node is not None:
                trials.append({"node": graph.ids[node], "dim": dim, "parts": min(3, split_dims(graph, node)[dim])})
    return trials


def _entry(graph: OpGraph, node: int, dim: str) -> dict:
    """``node``'s ``splittable`` entry for ``dim``."""
    return next(item for item in graph.splittable[node] or () if item.get("dim") == dim)


@register_transform(
    "split",
    trials=_split_trials,
    requires="node names an operation whose splittable entry lists dim (batch or channel) with an extent of at "
    "least parts >= 2.",
    ensures=Ensures(
        compute=SHARE_AND_WHOLE,
        output_bytes=SHARE_AND_WHOLE,
        param_bytes=SHARE_OR_WHOLE,
        temp_bytes=SUM,
        transfers=None,
        note="The parts share the operation's time (each paying its fixed part whole, part_times), output "
        "and workspace by their rows; along the "
        "batch each part holds the whole parameters, along the channels its own. An output that "
        "the operation's splittable entry joins by a sum (a weight gradient split along the "
        "batch, an input gradient along the channels) is a whole partial in every part, the "
        "other outputs are shared; without such an output the parts' outputs sum to the "
        "operation's. Added: a split node per sliced input (no cost: a slice is a view), a "
        "concat node per concatenated output tensor (one copy of it) and a sum node per summed "
        "one (reading every partial, writing one). A sliced input goes once to its split node "
        "and in slices to the parts; any other input goes whole to every part; a part sends its "
        "slice of a concatenated output and its whole partial of a summed one.",
    ),
)
def split_transform(graph: OpGraph, cluster: Cluster | None, *, node: str, dim: str, parts: int) -> TransformResult:
    """FastT's SplitOperation (:func:`split_operation`): the parts, split and concat nodes stand for ``node``.

    Part ``k`` of ``n`` takes rows ``[lo_k, hi_k)`` of the extent ``B``
    (:func:`part_rows`), so ``sum_k (hi_k - lo_k) / B = 1``: the parts' times
    (on every device) sum to the operation's, and their outputs and
    workspaces, cut into whole bytes that add up, to its. Every other node is
    itself, and a part's outputs are its share but for the whole partials of
    summed outputs. The split, concat and sum nodes are added (``added``);
    part ``k`` is copy ``k``, and only part 0 keeps the operation's colocation
    group.

    Examples
    --------
    >>> g = OpGraph(["x", "conv", "y"], [0.0, 4.0, 1.0], [0, 1], [1, 2], [64, 32],
    ...             op=["placeholder", "aten.convolution", "aten.relu"], output_bytes=[64, 32, 32],
    ...             splittable=[None, [{"dim": "batch", "size": 8}], None])
    >>> r = split_transform(g, None, node="conv", dim="batch", parts=2)
    >>> r.graph.ids
    ['x', 'conv@split0', 'conv@part0', 'conv@part1', 'conv@concat0', 'y']
    >>> r.image[1].tolist(), r.added.tolist(), r.copy.tolist()
    ([1, 2, 3, 4], [False, True, False, False, True, False], [0, 0, 0, 1, 0, 0])
    """
    if not isinstance(node, str):
        raise OptionError(f"option node of transform 'split' must be a node id, got {node!r}")
    if not isinstance(dim, str):
        raise OptionError(f"option dim of transform 'split' must be one of {', '.join(SUPPORTED_DIMS)}, got {dim!r}")
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)):
        raise OptionError(f"option parts of transform 'split' must be an integer, got {parts!r}")
    new = split_operation(graph, node, dim, int(parts))
    x = graph.index[node]
    n_new = new.num_nodes - graph.num_nodes + 1  # the nodes that took x's place in the listing order
    # Each new node's original, by id (the new ids are fresh); each original's new nodes, by position.
    origin = NodeMap.function([graph.index.get(new_id, x) for new_id in new.ids], graph.num_nodes)
    shift = np.arange(graph.num_nodes) + np.where(np.arange(graph.num_nodes) > x, n_new - 1, 0)
    image = NodeMap.from_groups(
        [range(x, x + n_new) if u == x else [int(shift[u])] for u in range(graph.num_nodes)], new.num_nodes
    )
    rewritten = [extra.get("split_of") == node and u in range(x, x + n_new) for u, extra in enumerate(new.node_extra)]
    added = np.array(
        [r and new.node_extra[u].get("role") in ("split", "concat", "sum") for u, r in enumerate(rewritten)], dtype=bool
    )
    copy = np.array(
        [int(new.node_extra[u].get("part", 0)) if r else 0 for u, r in enumerate(rewritten)], dtype=np.int64
    )
    return TransformResult(new, graph, origin, image, added, copy)
