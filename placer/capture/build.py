"""From the fx graph of a captured training step to an :class:`~placer.graph.OpGraph`.

Every fx node but the output becomes a graph node with the same id. A
``getitem`` that picks output ``k`` of a multi-output op is a node too,
colocated with the op, its edge from the op naming the output in its
``tensor`` field: each output of batch norm is held until its own readers
end (FORMATS.md, rule 6). Per node:

* ``op``: ``aten.<overload packet>`` (``aten.convolution``), ``_operator.<name>``
  for Python scalar arithmetic, ``placeholder`` / ``get_attr`` for the step's inputs;
* ``output_bytes``: the storages of its outputs that no earlier node holds
  (0 for views and in-place writes, also where the schema does not say so,
  as with ``unsafe_split``); a reader of a view gets a 0-byte edge from the
  holder of its storage and from every view between, which keeps it held;
  ``param_bytes``: the state a placeholder holds (parameters, buffers,
  optimizer state); a batch input counts as an output;
* ``flops``: :data:`torch.utils.flop_counter.flop_registry` on the fake
  arguments (0 for ops it does not count), but :func:`conv_backward_flops`
  for ``convolution_backward`` (torch's formula ignores groups in the
  weight gradient);
* ``splittable``: the batch rows of a matrix operation or convolution whose
  first operand leads with the batch, and the output channels of a forward
  convolution or of a product with a weight, with the arguments a channel
  split slices; the batch and the output channels of ``convolution_backward``
  and of a linear layer's weight gradient (``t(grad) @ x``), whose
  contributions over the sliced dimension are summed (:func:`_backward_splits`);
* ``node_extra``: ``bytes_accessed`` (input plus output bytes; 0 for a pick) and ``dtype``.

An edge's ``bytes`` are what the runtime copies when its consumer is on
another device (:mod:`placer.capture.layout`).

An in-place write of state (the final ``copy_`` of a new parameter or
optimizer state, batch norm's running statistics, any ``(a!)`` argument)
puts the writer in one colocation group with what it writes and adds 0-byte
ordering edges between the writer and every other reader of that tensor, in
program order, so that any plan keeps the step's meaning. Where a path
already orders them no edge is added, since an edge would make its target
hold its source's output until the target ends (FORMATS.md, rule 6).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable

import numpy as np
import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import conv_flop_count, flop_registry, shape_wrapper

from ..errors import FormatError
from ..graph import OpGraph
from .layout import sent_elements, views_compact

__all__ = ["build_graph", "value_bytes", "conv_backward_flops"]

_aten = torch.ops.aten

# Ops that write their running-statistics arguments (3 and 4) in training mode without
# saying so in their schema.
_HIDDEN_STAT_WRITERS = {
    _aten.native_batch_norm.default,
    _aten.cudnn_batch_norm.default,
    _aten.miopen_batch_norm.default,
}

# Ops whose first input's leading dimension may be cut into parts computed independently.
_BATCH_SPLITTABLE = {_aten.convolution, _aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm}

# Views that keep samples in contiguous blocks of the leading dimension when its size stays a
# multiple of the batch.
_VIEWS = {
    _aten.view,
    _aten._unsafe_view,
    _aten.reshape,
    _aten.expand,
    _aten.alias,
    _aten.unsqueeze,
    _aten.squeeze,
    _aten.flatten,
}

_REDUCTIONS = {
    _aten.sum,
    _aten.mean,
    _aten.amax,
    _aten.amin,
    _aten.max,
    _aten.min,
    _aten.prod,
    _aten.var,
    _aten.std,
    _aten.var_mean,
    _aten.std_mean,
    _aten.logsumexp,
    _aten.norm,
    _aten.linalg_vector_norm,
    _aten.any,
    _aten.all,
    _aten.argmax,
    _aten.argmin,
    _aten.cumsum,
    _aten.cumprod,
}

_SCALAR_BYTES = 8


def value_bytes(value: Any, compact: bool | None = None) -> int:
    """Bytes of a traced value: a tensor's elements, 8 for a scalar, summed over tuples.

    With ``compact`` given, a tensor counts what a copy of it to another device
    carries (:func:`~placer.capture.layout.sent_elements`): an ``expand`` its
    storage span, not its repeats.
    """
    if isinstance(value, torch.Tensor):
        if compact is None:
            return value.numel() * value.element_size()
        return sent_elements(value.shape, value.stride(), compact) * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(value_bytes(v, compact) for v in value)
    if isinstance(value, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _SCALAR_BYTES
    return 0


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _storages(value: Any) -> dict[StorageWeakRef, int]:
    """The storages a traced value's tensors use, each once, with their bytes (a view uses its base's)."""
    return {StorageWeakRef(t.untyped_storage()): t.untyped_storage().nbytes() for t in _tensors(value)}


def _picked(node: fx.Node) -> tuple[fx.Node, int] | None:
    """``(op, k)`` for a ``getitem`` that picks output ``k`` of multi-output op ``op``, else None."""
    if node.target is not operator.getitem or len(node.args) < 2:
        return None
    source = node.args[0]
    if isinstance(source, fx.Node) and isinstance(source.meta.get("val"), (tuple, list)):
        return source, int(node.args[1])
    return None


def _op_name(node: fx.Node) -> str:
    if node.op != "call_function":
        return node.op
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket)
    return f"{getattr(target, '__module__', None) or 'python'}.{getattr(target, '__name__', str(target))}"


def _aliases_input(node: fx.Node) -> bool:
    """Whether the op's outputs alias an input (views and in-place ops allocate nothing)."""
    target = node.target
    if node.op != "call_function":
        return False
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in target._schema.returns)
    return False


def _written_args(node: fx.Node) -> list[fx.Node]:
    """The input nodes ``node`` writes in place."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return []
    written = []
    for k, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
            written.append(value)
    if target in _HIDDEN_STAT_WRITERS and len(node.args) > 5 and node.args[5] is True:
        written += [node.args[3], node.args[4]]
    return [w for w in written if isinstance(w, fx.Node)]


def _alias_base(node: fx.Node) -> fx.Node:
    """Follow views back to the node that owns the storage."""
    while (
        _aliases_input(node) and node.target is not operator.getitem and node.args and isinstance(node.args[0], fx.Node)
    ):
        node = node.args[0]
    return node


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    seen: dict[fx.Node, None] = {}
    for a in node.all_input_nodes:
        seen.setdefault(a, None)
    return list(seen)


def _dtype(value: Any) -> str | None:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    if isinstance(value, (tuple, list)):
        for v in value:
            d = _dtype(v)
            if d is not None:
                return d
    return None


def conv_backward_flops(
    grad_out_shape,
    x_shape,
    w_shape,
    _bias,
    _stride,
    _padding,
    _dilation,
    transposed,
    _output_padding,
    _groups,
    output_mask,
    out_shape,
    **kwargs,
) -> int:
    """FLOPs of ``aten.convolution_backward``, from shapes (a flop formula for :class:`FlopCounterMode`).

    The input gradient is counted as torch counts it. The weight gradient does
    the forward convolution's multiply-adds; torch's formula counts it as a
    convolution over every input channel, ignoring groups, which overstates a
    depthwise convolution's (NASNet's separable convolutions) by its channel count.
    """
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        flops += conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
    return flops


_FLOP_FORMULAS = {**flop_registry, _aten.convolution_backward: shape_wrapper(conv_backward_flops)}


def _flops(node: fx.Node) -> float:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return 0.0
    count = _FLOP_FORMULAS.get(target.overloadpacket)
    if count is None:
        return 0.0
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
    return float(count(*args, **kwargs, out_val=node.meta.get("val")))


def _first_operand(node: fx.Node) -> Any:
    """The operand whose leading dimension a matrix op keeps (``addmm``'s is its second argument)."""
    packet = node.target.overloadpacket
    return node.args[1] if packet in (_aten.addmm, _aten.baddbmm) else node.args[0]


def _reduces_dim0(node: fx.Node) -> bool:
    """Whether a reduction sums over the leading dimension (or over everything)."""
    packet = node.target.overloadpacket
    if packet not in _REDUCTIONS:
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return True
    dims = [dims] if isinstance(dims, int) else list(dims)
    rank = max(node.args[0].meta["val"].dim(), 1)
    return any(d % rank == 0 for d in dims)


def _moves_dim0(node: fx.Node) -> bool:
    packet = node.target.overloadpacket
    if packet in (_aten.t, _aten.numpy_T, _aten.mT):
        return True
    if packet == _aten.transpose:
        rank = max(node.args[0].meta["val"].dim(), 1)
        return 0 in (node.args[1] % rank, node.args[2] % rank)
    if packet == _aten.permute:
        rank = max(node.args[0].meta["val"].dim(), 1)
        return node.args[1][0] % rank != 0
    return False


def batch_leading(nodes: Iterable[fx.Node], input_nodes: Iterable[fx.Node], batch: int) -> set[fx.Node]:
    """Nodes whose output holds the samples of the batch in contiguous blocks of its leading dimension.

    Forward dataflow from the batch inputs: an op's output is batch-leading when an input
    whose leading dimension it keeps is (a matrix op: its first operand; a view: any
    leading size that is a multiple of the batch, since samples stay contiguous row
    blocks); transposes moving dimension 0 and reductions over it end it. Weight
    gradients (``t(grad) @ x``) are therefore never batch-leading.
    """
    leading = {n for n in input_nodes if _leading_size(n) and _leading_size(n) % batch == 0}
    for node in nodes:
        if node.op != "call_function" or node in leading:
            continue
        size = _leading_size(node)
        if not size or size % batch:
            continue
        target = node.target
        if target is operator.getitem:
            if node.args[0] in leading and _leading_size(node.args[0]) == size:
                leading.add(node)
            continue
        if not isinstance(target, torch._ops.OpOverload) or _moves_dim0(node) or _reduces_dim0(node):
            continue
        packet = target.overloadpacket
        if packet in _BATCH_SPLITTABLE:
            first = _first_operand(node)
            if first in leading and _leading_size(first) == size:
                leading.add(node)
        elif packet in _VIEWS:
            if node.args[0] in leading:
                leading.add(node)
        elif any(a in leading and _leading_size(a) == size for a in node.all_input_nodes):
            leading.add(node)
    return leading


def _leading_size(node: Any) -> int:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if isinstance(val, (tuple, list)):
        val = next((v for v in val if isinstance(v, torch.Tensor)), None)
    return int(val.shape[0]) if isinstance(val, torch.Tensor) and val.dim() >= 1 else 0


def batch_dependent(nodes: Iterable[fx.Node], input_nodes: Iterable[fx.Node]) -> set[fx.Node]:
    """Nodes whose value derives from the step's inputs (what a split of an operation slices)."""
    dependent = set(input_nodes)
    for node in nodes:
        if node not in dependent and any(a in dependent for a in node.all_input_nodes):
            dependent.add(node)
    return dependent


def _splittable(
    node: fx.Node, batch: int | None, leading: set[fx.Node], dependent: set[fx.Node] | None = None
) -> list[dict] | None:
    """``[{"dim": "batch", "size": R}]`` for a matrix op whose first operand is batch-leading, R its rows.

    R is the first operand's leading size: the batch, or a multiple of it where
    samples are blocks of rows (a ``(batch, seq, features)`` activation viewed
    as ``(batch * seq, features)``); each row computes alone, so a split may
    cut the rows anywhere. A split slices every input that depends on the
    step's inputs (``dependent``), so those must all lead with the same R rows
    for a batched product (``bmm``), and be the first operand alone for the others
    (the weights of ``mm``, ``addmm`` and ``convolution`` go whole to every part).
    """
    target = node.target
    if batch is None or not isinstance(target, torch._ops.OpOverload) or target.overloadpacket not in _BATCH_SPLITTABLE:
        return None
    first = _first_operand(node)
    if node not in leading or first not in leading:
        return None
    rows = _leading_size(first)
    if not rows or _leading_size(node) != rows:
        return None
    if dependent is not None:
        others = [a for a in node.all_input_nodes if a is not first and a in dependent]
        if target.overloadpacket in (_aten.bmm, _aten.baddbmm):
            if any(a not in leading or _leading_size(a) != rows for a in others):
                return None
        elif others:
            return None
    return [{"dim": "batch", "size": int(rows)}]


def _channel_split(node: fx.Node, dependent: set[fx.Node]) -> dict | None:
    """``{"dim": "channel", "size": C, "axis": 1, "args": [[position, axis], ...]}`` for an operation whose
    ``C`` output channels (axis 1 of its output) may be computed apart, each from its slice of the weights.

    A forward ``convolution`` (not transposed, one group) of an input that depends on the step's inputs
    with a weight and bias that do not: ``args`` slices the weight (argument 1) and the bias (argument 2)
    along their dimension 0. ``mm(a, w)`` and ``addmm(bias, a, w)`` where ``a`` depends on the step's inputs
    and ``w`` (and the bias) does not: the columns of ``w`` (axis 1) and of the bias (its last dimension,
    not broadcast). A split slices what does not depend on the step's inputs and hands the activation whole
    to every part (:func:`~placer.transform.split.split_operation`); anything else is not declared.
    """
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    packet = target.overloadpacket
    out = node.meta.get("val")
    if packet not in (_aten.convolution, _aten.mm, _aten.addmm) or not isinstance(out, torch.Tensor) or out.dim() < 2:
        return None
    args = node.args

    def fixed(a: Any) -> torch.Tensor | None:
        """The value of ``a`` when it is a tensor that does not depend on the step's inputs."""
        value = a.meta.get("val") if isinstance(a, fx.Node) and a not in dependent else None
        return value if isinstance(value, torch.Tensor) else None

    if packet == _aten.convolution:
        if len(args) != 9 or node.kwargs or args[6] or args[8] != 1 or args[0] not in dependent:
            return None
        weight, bias = fixed(args[1]), args[2]
        if weight is None or weight.dim() < 2:
            return None
        size, sliced = int(weight.shape[0]), [[1, 0]]
        if bias is not None:
            value = fixed(bias)
            if value is None or tuple(value.shape) != (size,):
                return None
            sliced.append([2, 0])
    else:
        first = 1 if packet == _aten.addmm else 0
        if len(args) < first + 2 or args[first] not in dependent:
            return None
        weight = fixed(args[first + 1])
        if weight is None or weight.dim() != 2:
            return None
        size, sliced = int(weight.shape[1]), [[first + 1, 1]]
        if packet == _aten.addmm:
            value = fixed(args[0])
            if value is None or value.dim() not in (1, 2) or int(value.shape[-1]) != size:
                return None
            sliced.insert(0, [0, value.dim() - 1])
    if size < 2 or int(out.shape[1]) != size or len({args[p] for p, _ in sliced}) != len(sliced):
        return None
    return {"dim": "channel", "size": size, "axis": 1, "args": sliced}


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _backward_splits(node: fx.Node, batch: int | None, leading: set[fx.Node], dependent: set[fx.Node]) -> list[dict]:
    """The splits of a backward operation whose results over the sliced dimension are partial sums.

    Each entry names what a split slices and how the parts' results combine (``args``: ``[position,
    axis]`` of the captured operation's sliced arguments; ``inputs``: the producers of those arguments,
    ``[node id, 0]``; ``join``: per output, the axis its slices are concatenated along, or ``"sum"`` where
    every part computes a whole partial and the output is their sum; ``resize``: ``[position, index]`` of
    an argument's entry holding the extent, which a part replaces by its own):

    * ``convolution_backward(grad_out, input, weight, bias_sizes, ...)`` along the batch: ``grad_out`` and
      ``input`` by rows (both lead with the batch's ``B`` rows), the weight whole; ``grad_input`` is
      concatenated by rows, ``grad_weight`` and ``grad_bias`` are sums over the rows. Along its ``C``
      output channels (not transposed, one group, a weight that does not depend on the step's inputs):
      ``grad_out`` along axis 1 and the weight along axis 0, ``input`` whole; ``grad_input`` is the sum of
      every channel slice's contribution, ``grad_weight`` and ``grad_bias`` are concatenated along axis 0.
    * A linear layer's weight gradient ``mm(a, b)``, ``a = t(grad_out)`` of ``(O, R)`` and ``b = x`` of
      ``(R, I)``, both depending on the step's inputs and ``b`` leading with the batch's ``R`` rows:
      along the batch, ``a``'s columns and ``b``'s rows, the output the sum of the partial products;
      along the ``O`` output channels, ``a``'s rows, ``b`` whole, the output concatenated along axis 0.

    Empty for every other operation.
    """
    target = node.target
    if batch is None or not isinstance(target, torch._ops.OpOverload):
        return []
    packet, args = target.overloadpacket, node.args

    def tensor(a: Any) -> torch.Tensor | None:
        value = a.meta.get("val") if isinstance(a, fx.Node) else None
        return value if isinstance(value, torch.Tensor) else None

    entries: list[dict] = []
    if packet == _aten.convolution_backward and len(args) == 11 and not node.kwargs:
        grad_out, x, weight = (tensor(a) for a in args[:3])
        if grad_out is None or x is None or weight is None or len({args[0], args[1], args[2]}) != 3:
            return []
        mask = list(args[10])
        rows = int(grad_out.shape[0])
        if (
            args[0] in leading
            and args[1] in leading
            and _leading_size(args[0]) == rows == _leading_size(args[1])
            and rows >= 2
            and args[2] not in dependent
        ):
            entries.append(
                {
                    "dim": "batch",
                    "size": rows,
                    "args": [[0, 0], [1, 0]],
                    "inputs": [[args[0].name, 0], [args[1].name, 0]],
                    "join": [0, "sum", "sum"],
                }
            )
        channels = int(weight.shape[0])
        bias_sizes = args[3]
        if (
            not args[7]
            and args[9] == 1
            and args[2] not in dependent
            and args[0] in dependent
            and grad_out.dim() >= 2
            and int(grad_out.shape[1]) == channels >= 2
            and (bias_sizes is None or not mask[2] or list(bias_sizes) == [channels])
        ):
            entry = {
                "dim": "channel",
                "size": channels,
                "args": [[0, 1], [2, 0]],
                "inputs": [[args[0].name, 0], [args[2].name, 0]],
                "join": ["sum", 0, 0],
            }
            if bias_sizes is not None and mask[2]:
                entry["resize"] = [[3, 0]]
            entries.append(entry)
    elif packet == _aten.mm and len(args) == 2 and not node.kwargs:
        a, b = tensor(args[0]), tensor(args[1])
        if a is None or b is None or args[0] is args[1] or args[0] not in dependent or args[1] not in dependent:
            return []
        rows = int(b.shape[0])
        if args[1] in leading and _leading_size(args[1]) == rows >= 2 and rows % batch == 0:
            entries.append(
                {
                    "dim": "batch",
                    "size": rows,
                    "args": [[0, 1], [1, 0]],
                    "inputs": [[args[0].name, 0], [args[1].name, 0]],
                    "join": ["sum"],
                }
            )
            if int(a.shape[0]) >= 2:
                entries.append(
                    {
                        "dim": "channel",
                        "size": int(a.shape[0]),
                        "args": [[0, 0]],
                        "inputs": [[args[0].name, 0]],
                        "join": [0],
                    }
                )
    return entries


def build_graph(
    gm: fx.GraphModule,
    *,
    name: str,
    layers: dict[str, str | None],
    resident: Iterable[str],
    batch: int | None,
    batch_inputs: Iterable[str] = (),
) -> tuple[OpGraph, dict[str, str]]:
    """The OpGraph of ``gm`` and, for every fx node, the graph node that carries it.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        A traced step whose nodes carry ``meta["val"]`` (fake tensors or scalars).
    name : str
        The graph's name.
    layers : dict
        fx node name -> module path (``layer``), ``None`` where unknown.
    resident : iterable of str
        Placeholder names that hold state for the whole step (parameters, buffers,
        optimizer state): their bytes are ``param_bytes``.
    batch : int or None
        The batch size, for ``splittable`` and the graph's ``batch_size`` (data parallelism needs a sample
        per replica).
    batch_inputs : iterable of str
        Placeholders whose leading dimension is the batch.

    Returns
    -------
    (OpGraph, dict)
        The graph, and fx node name -> graph node id (each fx node is its own).
    """
    resident = set(resident)
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    for node in nodes:
        val = node.meta.get("val")
        for v in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape):
                raise FormatError(
                    f"node {node.name!r} ({_op_name(node)}) of the training step makes a tensor whose "
                    f"size depends on the data (as x[x > 0] does); placer needs every size known "
                    f"before the step runs"
                )
    batch_names = set(batch_inputs)
    leading = batch_leading(nodes, [n for n in nodes if n.name in batch_names], batch) if batch else set()
    dependent = batch_dependent(nodes, [n for n in nodes if n.op == "placeholder" and n.name not in resident])
    index = {node: i for i, node in enumerate(nodes)}
    # An edge carries what the runtime copies to a consumer elsewhere (capture.layout).
    compact = views_compact(nodes)
    ids = [node.name for node in nodes]
    n = len(ids)
    output_bytes = np.zeros(n, dtype=np.int64)
    param_bytes = np.zeros(n, dtype=np.int64)
    flops = np.zeros(n)
    ops: list[str] = []
    layer: list[str | None] = []
    splittable: list[list[dict] | None] = []
    extra: list[dict] = []
    edges: dict[tuple[int, int, int], int] = {}
    holder: dict[StorageWeakRef, int] = {}  # storage -> the graph node that holds it (FORMATS.md, rule 6)
    picks: list[tuple[int, int]] = []  # (pick, multi-output op)
    # Per view, the nodes it was taken through, back to its storage's holder.
    through: dict[fx.Node, tuple[int, ...]] = {}
    stored: dict[fx.Node, dict[StorageWeakRef, int]] = {}  # per node, the storages of its value
    for i, node in enumerate(nodes):
        val = node.meta.get("val")
        ops.append(_op_name(node))
        layer.append(layers.get(node.name))
        picked = _picked(node)
        storages = stored[node] = _storages(val)
        if node.op in ("placeholder", "get_attr") and (node.name in resident or node.op == "get_attr"):
            param_bytes[i] = sum(storages.values())
        flops[i] = _flops(node)
        entries = (
            (_splittable(node, batch, leading, dependent) or [])
            + [entry for entry in (_channel_split(node, dependent),) if entry]
            + _backward_splits(node, batch, leading, dependent)
        )
        splittable.append(entries or None)
        inputs = _arg_nodes(node)
        if picked:
            accessed = 0
        else:
            accessed = sum(value_bytes(a.meta.get("val")) for a in inputs) + (
                0 if _aliases_input(node) else value_bytes(val)
            )
        info: dict[str, Any] = {"bytes_accessed": int(accessed)}
        dtype = _dtype(val)
        if dtype is None:
            dtype = next((d for d in (_dtype(a.meta.get("val")) for a in inputs) if d), None)
        if dtype is not None:
            info["dtype"] = dtype
        extra.append(info)
        for a in inputs:
            src, read = index[a], a.meta.get("val")
            tensor = 0
            if picked and a is picked[0]:
                tensor = picked[1]
                read = read[tensor]
            key = (src, i, tensor)
            edges[key] = max(edges.get(key, 0), value_bytes(read, compact))
            for base in through.get(a, ()):
                # A view's reader holds what the view was taken from, its storage's holder and the views
                # between (one of them may be a copy received from another device): an edge (0 bytes) from
                # each keeps it held until this reader ends, as rule 6 of FORMATS.md counts a consumer's.
                if base != i:
                    edges.setdefault((base, i, 0), 0)
        # A node holds the storages no earlier node holds (none for a view or an in-place write); a pick of
        # a multi-output op's output holds that output from the op on, while the op holds all of its outputs
        # until its picks have run, so none of them goes uncounted in between.
        source = index[picked[0]] if picked else -1
        own = {s: b for s, b in storages.items() if holder.get(s, source) == source}
        if not param_bytes[i]:
            output_bytes[i] = sum(own.values())
        holder.update(dict.fromkeys(own, i))
        viewed = storages.keys() - own.keys()
        base = next((a for a in inputs if viewed & stored[a].keys()), None) if viewed else None
        if base is not None:
            # A multi-output op is never sent (its picks are), so it holds nothing for a reader elsewhere.
            taken = () if isinstance(base.meta.get("val"), (tuple, list)) else (index[base],)
            through[node] = through.get(base, ()) + taken
        if picked:
            picks.append((i, source))

    colocation = _state_writes(nodes, index, ids, edges, picks)
    src, dst, tensor = (np.array([k[j] for k in edges], dtype=np.int64) for j in range(3))
    graph = OpGraph(
        ids,
        np.zeros(n),
        src,
        dst,
        np.array(list(edges.values()), dtype=np.int64),
        tensor,
        output_bytes=output_bytes,
        param_bytes=param_bytes,
        flops=flops,
        op=ops,
        layer=layer,
        colocation=colocation,
        splittable=splittable,
        node_extra=extra,
        name=name,
        extra={"batch_size": batch} if batch else None,
    )
    return graph, {node.name: node.name for node in nodes}


def _state_writes(
    nodes: list[fx.Node],
    index: dict[fx.Node, int],
    ids: list[str],
    edges: dict[tuple[int, int, int], int],
    picks: list[tuple[int, int]],
) -> list[str | None]:
    """Colocate every in-place writer with what it writes, and every pick with its op; order writers.

    Readers of the written tensor (directly or through views of it) listed before the
    writer in the program get an edge reader -> writer, those after it writer -> reader:
    the program's own order, so the edges never form a cycle. A ``getitem`` picking an
    output of a multi-output op goes with the op, which holds that output until it has run.
    """
    groups = _UnionFind()
    for pick, op in picks:
        groups.union(pick, op)
    ordering: set[tuple[int, int, int]] = set()
    writes: set[int] = set()
    for writer in nodes:
        for target in _written_args(writer):
            w, b = index[writer], index[_alias_base(target)]
            groups.union(w, b)
            writes.add(w)
            for reader in _readers(nodes[b]):
                r = index[reader]
                if r in (w, b):
                    continue
                key = (r, w, 0) if r < w else (w, r, 0)
                if key not in edges:
                    edges[key] = 0
                    ordering.add(key)
    _drop_implied(edges, ordering, len(ids))
    _pull_forward(edges, ordering, len(ids))
    members: dict[int, list[int]] = {}
    for x in list(groups.parent):
        members.setdefault(groups.find(x), []).append(x)
    colocation: list[str | None] = [None] * len(ids)
    for root, group in members.items():
        label = f"{'state' if writes.intersection(group) else 'outputs'}:{ids[root]}"
        for x in group:
            colocation[x] = label
    return colocation


def _drop_implied(edges: dict[tuple[int, int, int], int], ordering: set[tuple[int, int, int]], n: int) -> None:
    """Remove the ordering edges ``(u, v)`` of ``edges`` that another path from ``u`` to ``v`` implies.

    Such an edge orders nothing more, but under the reference model it makes
    ``v`` a consumer of ``u``, so ``u``'s output would be held until ``v``
    ends (FORMATS.md, rule 6): a convolution's activation until its weight's
    update, at the end of the step. In a DAG, removing every edge that some
    other path implies keeps every path (a transitive reduction).
    """
    if not ordering:
        return
    successors, reach, bit = _reach(edges, {v for _, v, _ in ordering}, n)
    data = {(u, v) for u, v, t in edges if (u, v, t) not in ordering}
    for key in ordering:
        u, v, _ = key
        if (u, v) in data or any(reach[x] >> bit[v] & 1 for x in successors[u] if x != v):
            del edges[key]


def _pull_forward(edges: dict[tuple[int, int, int], int], ordering: set[tuple[int, int, int]], n: int) -> None:
    """Point each ordering edge ``(r, w)`` of ``edges`` at the first node after ``r`` (in program order) that
    leads to ``w``: it still orders ``r`` before ``w``, and holds ``r``'s output (FORMATS.md, rule 6) only
    until that node ends. A linear layer's input gradient reads the weight that the update writes at the end
    of the step; the node next to it is the weight's gradient, which leads to the update.

    Every edge goes from a lower index to a higher one, so the first node ``x > r`` that reaches ``w``
    keeps every path: the path from ``x`` to ``w`` uses only edges within ``(r, w]``, each replaced in
    turn by a shorter one that keeps its own (by induction on an edge's span).
    """
    kept = [key for key in ordering if key in edges and key[0] < key[1]]
    if not kept:
        return
    _, reach, bit = _reach(edges, {v for _, v, _ in kept}, n)
    for r, w, t in kept:
        x = next(x for x in range(r + 1, w + 1) if reach[x] >> bit[w] & 1)
        if x != w:
            del edges[(r, w, t)]
            edges.setdefault((r, x, t), 0)


def _reach(
    edges: dict[tuple[int, int, int], int], targets: set[int], n: int
) -> tuple[list[set[int]], list[int], dict[int, int]]:
    """Each node's successors, and the ``targets`` it reaches (itself included), a bit per target.

    Graph indices follow the program, so every edge goes from a lower index to a higher one, and a
    node's reach is the union of its successors'.
    """
    bit = {v: k for k, v in enumerate(sorted(targets))}
    successors: list[set[int]] = [set() for _ in range(n)]
    for u, v, _ in edges:
        successors[u].add(v)
    reach = [0] * n
    for u in range(n - 1, -1, -1):
        r = 1 << bit[u] if u in bit else 0
        for v in successors[u]:
            r |= reach[v]
        reach[u] = r
    return successors, reach, bit


def _readers(base: fx.Node) -> list[fx.Node]:
    """Every node that reads ``base``'s storage: its users, and users of views of it."""
    out: list[fx.Node] = []
    stack = [base]
    seen = {base}
    while stack:
        node = stack.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            out.append(user)
            if _aliases_input(user) and user.target is not operator.getitem and user.args and user.args[0] is node:
                stack.append(user)
    return out
