"""How a traced tensor lies in its storage, and so what a copy of it to another device carries.

The runtime copies a dense tensor as its elements; a view that repeats
elements (``expand``, stride 0) as the storage it spans, so the copy keeps
its strides without the repeats; a view with gaps (a strided slice, an LSTM
gate, an attention head) as its elements alone, dense with its dimensions in
the order of its strides (:func:`dense_strides`), unless the step reads strides
(:data:`STRIDE_READERS`), where it sends the span. Capture counts an edge's
bytes by the same rule (:func:`sent_elements`), so the reference model's
transfers and received copies are what the runtime sends and holds.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
import torch.fx as fx

__all__ = [
    "dense_layout",
    "storage_span",
    "dense_strides",
    "STRIDE_READERS",
    "reads_strides",
    "views_compact",
    "sent_contiguous",
    "sent_elements",
]


def dense_layout(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a (size, stride) view fills one block of memory, each element once, in any dimension order
    (no gaps, no ``expand``)."""
    expected = 1
    for n, st in sorted(((n, st) for n, st in zip(size, stride) if n != 1), key=lambda p: p[1]):
        if st != expected:
            return False
        expected *= n
    return True


def storage_span(size: Sequence[int], stride: Sequence[int]) -> int:
    """Elements of storage a (size, stride) view reaches from its offset (0 when empty)."""
    if any(n == 0 for n in size):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(size, stride))


def dense_strides(size: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    """The strides of a dense tensor of ``size`` whose dimensions lie in memory in the order of ``stride``
    (the smallest innermost; ties: the later dimension innermost, as in a contiguous tensor).

    A compact copy of a view keeps its dimensions' order: operations that lay out their result after
    their input's (CPU attention, elementwise ops) then give the layout the step was traced with, which a
    later ``view`` may need.

    Examples
    --------
    >>> dense_strides((4, 2, 5, 8), (240, 8, 48, 1))    # heads of one (batch, token, 3 x head, dim) projection
    (80, 8, 16, 1)
    >>> dense_strides((4, 10), (40, 1))
    (10, 1)
    """
    strides = [0] * len(size)
    step = 1
    for k in sorted(range(len(size)), key=lambda k: (stride[k], -k)):
        strides[k] = step
        step *= max(int(size[k]), 1)
    return tuple(strides)


#: Operations whose result depends on the strides of an input, not only on its values.
STRIDE_READERS = frozenset(
    {
        torch.ops.aten.as_strided,
        torch.ops.aten.as_strided_,
        torch.ops.aten.as_strided_scatter,
        torch.ops.aten.as_strided_copy,
        torch.ops.aten._reshape_alias,
        torch.ops.aten._reshape_alias_copy,
        torch.ops.aten.set_,
    }
)


def reads_strides(v: fx.Node) -> bool:
    """Whether node ``v`` reads the strides of an input (:data:`STRIDE_READERS`)."""
    return getattr(v.target, "overloadpacket", None) in STRIDE_READERS


def views_compact(nodes: Iterable[fx.Node]) -> bool:
    """Whether a step of these nodes sends a view with gaps as its elements alone: none reads strides.

    Capture's edge bytes and the runtime's copies both take it from here, so they agree.
    """
    return not any(reads_strides(v) for v in nodes)


def sent_contiguous(size: Sequence[int], stride: Sequence[int], compact: bool) -> bool:
    """Whether a copy of a (size, stride) tensor to another device is its elements alone (laid out by
    :func:`dense_strides`): a view with gaps where views are ``compact``; any other tensor travels as the
    storage it spans."""
    return compact and storage_span(size, stride) > math.prod(size)


def sent_elements(size: Sequence[int], stride: Sequence[int], compact: bool) -> int:
    """Elements a copy of a (size, stride) tensor carries to another device.

    Its elements where it travels contiguous (:func:`sent_contiguous`); otherwise its storage span,
    which is smaller than its elements where it repeats them (``expand``).

    Examples
    --------
    >>> sent_elements((4, 1000), (0, 1), compact=True)    # expanded from one row
    1000
    >>> sent_elements((4, 10), (40, 1), compact=True)     # every fourth row of a larger tensor
    40
    >>> sent_elements((4, 10), (40, 1), compact=False)
    130
    """
    return math.prod(size) if sent_contiguous(size, stride, compact) else storage_span(size, stride)
